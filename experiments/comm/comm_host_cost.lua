-- experiments/comm/comm_host_cost.lua — the host cost of one collective call
-- from Lua through distlab's checks and dispatch, without any transport: on
-- the meta device every call is validated and accounted, nothing moves. What
-- a GPU call costs on top of this is the backend's (NCCL's enqueue).
--   ./distlab run --device meta --world 2 --rank 0 experiments/comm/comm_host_cost.lua [--calls N]
-- Method: 1000 warm-up calls, then `calls` calls back to back, host clock
-- around them (dl.bench.timing.host, one batch); us per call. On meta
-- there are no data to check (meta moves nothing: the run says so). On a
-- device that moves data (cpu, cuda: the transport's time is then in the
-- figure) each collective is checked after timing: the timed callable once
-- more on fresh inputs (normal, a new seed each check and rank), its output
-- poisoned (all_reduce: in place), against the fp64 reference drawn again
-- on the host from every rank's seed (copies exact; f32 sums within (n - 1)
-- 2^-24 7n + 2^-23 |ref|, normwise 2^-18), all of it up to 128K elements,
-- else 128 windows of 1024 over each rank's block. --quick: 2^10 elements,
-- 200 calls; --plant noop|scale=X: an error in every timed collective, which
-- the check must report (exit code 1). Writes DIR/comm-host-cost-TAG.{csv,md}
-- (default experiments/results/comm, TAG e.g. metax2).
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"

local w = dl.comm.world()
local h = bench.harness {
  name = "comm_host_cost", family = "comm", comm = w, tag = true,
  usage = "./distlab run --device meta --world 2 --rank 0 experiments/comm/comm_host_cost.lua [options]",
  about = "host cost of one collective call through distlab's checks and dispatch, no transport (meta)",
  options = { { "calls", "int", 200000, "timed calls per collective", meta = "N" } },
}
local calls = h.given.calls and h.opt.calls or (h.quick and 200 or h.opt.calls)
local n = h.quick and 2 ^ 10 or 2 ^ 18
local N, me = w.size, w.rank
local s = dl.empty({ n }, { dtype = "f32" })
local out = dl.empty({ n * w.size }, { dtype = "f32" })
local rs = dl.empty({ n / w.size }, { dtype = "f32" })
local moves = w.backend ~= "meta"
if not moves then h:unchecked("on meta the collectives are validated and counted, no data move") end
s:zero_()

-- after timing: the callable once more on fresh inputs (check number c, rank r:
-- Philox(seed(c, r), i)); each block of the output (block j: elements [j m, j m + m))
-- made of input elements [off, off + m) of ranks srcs(j), summed
local checks = 0
local function seed_of(c, r) return 3571 + 7919 * c * N + r end
local function check(what, fn, result, m, srcs, off, sum)
  checks = checks + 1
  local c = checks
  local tol = sum and { atol = (N - 1) * 2 ^ -24 * 7 * N, rtol = 2 ^ -23, norm = 2 ^ -18 } or { atol = 0, rtol = 0 }
  return h:verify { what = what,
    fresh = function() s:normal_(0, 1, seed_of(c, me)) end,
    poison = result ~= s and { result } or nil, run = fn,
    check = function()
      local bad, msg = 0, nil
      for j = 0, result:numel() / m - 1 do
        local wins = verify.windows(m, math.ceil(131072 / (result:numel() / m)), 1024, c * N + me + j + 1)
        local seeds = {}
        for k, r in ipairs(srcs(j)) do seeds[k] = seed_of(c, r) end
        local ref = verify.normal_sum("f32", seeds, (function()
          local shifted = {}
          for k, win in ipairs(wins) do shifted[k] = { win[1] + off, win[2] } end
          return shifted
        end)())
        local nb, mb = verify.close(verify.take(result:narrow(1, j * m + 1, m), wins), ref, tol)
        if nb > 0 then bad, msg = bad + nb, msg or string.format("block %d: %s", j, mb) end
      end
      return bad, msg
    end }
end
local ALL = {}
for r = 0, N - 1 do ALL[r + 1] = r end
local tbl = h:table({ { "op", "%-15s" }, { "time", "%10.3f", unit = "(us/call)" }, { "calls", "%9d" } })
tbl:header(string.format("%s, world %d, %s backend, %d calls each, %s", w.device, w.size, w.backend, calls,
  bench.markdown.date()))
local rows = {}
for _, case in ipairs {
  -- op, call, its output, the output's blocks: size, sources, input offset, summed
  { "all_gather", function() w:all_gather(out, s) end, out, n, function(j) return { j } end, 0, false },
  { "reduce_scatter", function() w:reduce_scatter(rs, s, "sum") end, rs, n / N, function() return ALL end, me * n / N,
    true },
  { "all_reduce", function() w:all_reduce(s, "sum") end, s, n, function() return ALL end, 0, true },
} do
  local fn = h:planted(case[2], { writes = { case[3] } })
  local us = bench.timing.host(fn, { warmup = h.quick and 10 or 1000, batch = calls, batches = 1 }).median
  if moves then
    check(case[1], fn, case[3], case[4], case[5], case[6], case[7])
    s:zero_() -- the timed all_reduce adds in place: keep its input finite
  end
  tbl:row({ case[1], us, calls })
  rows[#rows + 1] = { case[1], string.format("%.3f", us), calls }
end
if h.rank0 then
  local csv = h:csv("comm-host-cost-" .. h.tag .. ".csv", { "op", "us_per_call", "calls" }, rows)
  local md = bench.markdown.table({ "op", "us per call", "calls" }, rows)
  local path = h:markdown("comm-host-cost-" .. h.tag .. ".md", "Host cost of a collective call: " .. h.tag, md, {
    "method: " .. w.backend .. " communicator, f32, 2^18 elements per rank; 1000 warm-up calls, then " .. calls ..
      " calls back to back between two host clock reads; us per call" .. (moves and
      " (transport included; each collective's data checked after timing)" or " (no transport: no data to check)") })
  print("wrote " .. csv .. " and " .. path)
end
h:finish()
