-- distlab.bench.busbw — bandwidth figures as nccl-tests defines them
-- (nccl-tests, doc/PERFORMANCE.md), defined here once for every benchmark.
--
-- algbw = size / time. busbw = algbw x a factor of the collective and the
-- rank count n, chosen so that busbw is what each rank's link must carry
-- and can be held against the hardware's peak whatever n is:
--
--   all_reduce                     2(n-1)/n  a reduce-scatter then an all-gather: every
--                                            rank sends and receives 2(n-1)/n of the data
--   all_gather, reduce_scatter     (n-1)/n   size = the whole gathered output (all_gather)
--                                            or the whole input (reduce_scatter); each rank
--                                            receives (or sends) the (n-1)/n it lacks
--   all_to_all                     (n-1)/n   each rank keeps 1/n of its data
--   broadcast, reduce              1         the root's data crosses each link once
--   send, recv, sendrecv           1         point to point: the data crosses one link
--
--   factor(op, n) -> number        (an error for an op not listed)
--   algbw(bytes, us) -> GB/s       (10^9 bytes, as nccl-tests)
--   busbw(op, n, bytes, us) -> GB/s
local core = require "distlab.core"

local fail = core.fail
local M = {}

local function ring(n) return (n - 1) / n end

M.factors = {
  all_reduce = function(n) return 2 * (n - 1) / n end,
  all_gather = ring,
  reduce_scatter = ring,
  all_to_all = ring,
  broadcast = function() return 1 end,
  reduce = function() return 1 end,
  send = function() return 1 end,
  recv = function() return 1 end,
  sendrecv = function() return 1 end,
}

function M.factor(op, n)
  local f = M.factors[op]
  if not f then
    local names = {}
    for k in pairs(M.factors) do names[#names + 1] = k end
    table.sort(names)
    fail("busbw: no nccl-tests factor for %s (known: %s)", tostring(op), table.concat(names, ", "))
  end
  if type(n) ~= "number" or n < 1 then fail("busbw: the rank count must be >= 1, got %s", tostring(n)) end
  return f(n)
end

function M.algbw(bytes, us) return bytes / us * 1e-3 end

function M.busbw(op, n, bytes, us) return M.algbw(bytes, us) * M.factor(op, n) end

return M
