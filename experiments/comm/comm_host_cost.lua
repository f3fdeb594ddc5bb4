-- experiments/comm/comm_host_cost.lua — the host cost of one collective call
-- from Lua through distlab's checks and dispatch, without any transport: on
-- the meta device every call is validated and accounted, nothing moves. What
-- a GPU call costs on top of this is the backend's (NCCL's enqueue).
--   ./distlab run --device meta --world 2 --rank 0 experiments/comm/comm_host_cost.lua [--calls N]
-- Method: 1000 warm-up calls, then `calls` calls back to back, host clock
-- around them (dl.bench.timing.host, one batch); us per call. No data to
-- check: meta moves nothing. Writes DIR/comm-host-cost-TAG.{csv,md}
-- (default experiments/results/comm, TAG e.g. metax2).
local dl = require "distlab"
local bench = dl.bench

local w = dl.comm.world()
local h = bench.harness {
  name = "comm_host_cost", family = "comm", comm = w, tag = true,
  usage = "./distlab run --device meta --world 2 --rank 0 experiments/comm/comm_host_cost.lua [options]",
  about = "host cost of one collective call through distlab's checks and dispatch, no transport (meta)",
  options = { { "calls", "int", 200000, "timed calls per collective", meta = "N" } },
}
local calls = h.opt.calls
local n = 2 ^ 18
local s = dl.empty({ n }, { dtype = "f32" })
local out = dl.empty({ n * w.size }, { dtype = "f32" })
local rs = dl.empty({ n / w.size }, { dtype = "f32" })
local tbl = h:table({ { "op", "%-15s" }, { "time", "%10.3f", unit = "(us/call)" }, { "calls", "%9d" } })
tbl:header(string.format("%s, world %d, %s backend, %d calls each, %s", w.device, w.size, w.backend, calls,
  bench.markdown.date()))
local rows = {}
for _, case in ipairs {
  { "all_gather", function() w:all_gather(out, s) end },
  { "reduce_scatter", function() w:reduce_scatter(rs, s, "sum") end },
  { "all_reduce", function() w:all_reduce(s, "sum") end },
} do
  local us = bench.timing.host(case[2], { warmup = 1000, batch = calls, batches = 1 }).median
  tbl:row({ case[1], us, calls })
  rows[#rows + 1] = { case[1], string.format("%.3f", us), calls }
end
if h.rank0 then
  local csv = h:csv("comm-host-cost-" .. h.tag .. ".csv", { "op", "us_per_call", "calls" }, rows)
  local md = bench.markdown.table({ "op", "us per call", "calls" }, rows)
  local path = h:markdown("comm-host-cost-" .. h.tag .. ".md", "Host cost of a collective call: " .. h.tag, md, {
    "method: " .. w.backend .. " communicator, f32, 2^18 elements per rank; 1000 warm-up calls, then " .. calls ..
      " calls back to back between two host clock reads; us per call (no transport: no data to check)" })
  print("wrote " .. csv .. " and " .. path)
end
h:finish()
