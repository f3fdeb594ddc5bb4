-- distlab.bench — one timing harness: warm-up, then each repetition between
-- two device events on the current stream (host time on cpu), reported as
-- median / min / max / mean milliseconds.
local core = require "distlab.core"
local stream = require "distlab.stream"

local fail = core.fail
local M = {}

local function stats(times)
  table.sort(times)
  local n, sum = #times, 0
  for _, t in ipairs(times) do sum = sum + t end
  local median = n % 2 == 1 and times[(n + 1) / 2] or (times[n / 2] + times[n / 2 + 1]) / 2
  return { median = median, min = times[1], max = times[n], mean = sum / n, iters = n, times = times }
end
M.stats = stats

-- dl.bench(fn, {warmup = 5, iters = 20, device = default}) -> {median, min, max, mean, iters}
function M.bench(fn, opts)
  if type(fn) ~= "function" then fail("bench: first argument must be a function") end
  opts = opts or {}
  local warmup, iters = opts.warmup or 5, opts.iters or 20
  if iters < 1 then fail("bench: iters must be at least 1") end
  local cur = stream.current_stream()
  local device = opts.device or (cur and cur.device) or core.default_device()
  for _ = 1, warmup do fn() end
  local evs = {}
  for i = 1, iters + 1 do evs[i] = stream.event(device) end
  evs[1]:record()
  for i = 1, iters do
    fn()
    evs[i + 1]:record()
  end
  local times = {}
  for i = 1, iters do times[i] = evs[i]:elapsed(evs[i + 1]) end
  return stats(times)
end

return M
