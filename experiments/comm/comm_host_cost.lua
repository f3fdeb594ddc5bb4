-- experiments/comm_host_cost.lua — the host cost of one collective call from
-- Lua through distlab's checks and dispatch, without any transport: on the
-- meta device every call is validated and accounted, nothing moves. What a
-- GPU call costs on top of this is the backend's (NCCL's enqueue).
--   ./distlab run --device meta --world 2 --rank 0 experiments/comm_host_cost.lua [calls]
local dl = require "distlab"

local now_us = dl.now_us

local w = dl.comm.world()
local calls = tonumber(arg[1] or "200000")
local n = 2 ^ 18
local s = dl.empty({ n }, { dtype = "f32" })
local out = dl.empty({ n * w.size }, { dtype = "f32" })
local rs = dl.empty({ n / w.size }, { dtype = "f32" })
print(string.format("# %s, world %d, %s backend, %d calls each, %s", w.device, w.size, w.backend, calls,
  os.date("!%Y-%m-%d %H:%M UTC")))
for _, case in ipairs {
  { "all_gather", function() w:all_gather(out, s) end },
  { "reduce_scatter", function() w:reduce_scatter(rs, s, "sum") end },
  { "all_reduce", function() w:all_reduce(s, "sum") end },
} do
  for _ = 1, 1000 do case[2]() end
  local t0 = now_us()
  for _ = 1, calls do case[2]() end
  print(string.format("%-15s %.3f us per call", case[1], (now_us() - t0) / calls))
end
