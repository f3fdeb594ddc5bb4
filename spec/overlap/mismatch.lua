-- spec/overlap/mismatch.lua — ranks that make different ops: each first run
-- fails on every rank naming the fields that differ (prints "<case>: <message>"),
-- and the hint about m only where the shard rows differ.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")
local dl = require "distlab"

local message = K.message

local odd = K.me == K.d - 1
local cases = {
  { "ALGO", { algo = odd and "ring" or "p2p" }, "bf16" },
  { "TRANSPORT", { transport = odd and "put" or "get" }, "bf16" },
  { "DTYPE", {}, odd and "f16" or "bf16" },
  { "STREAMS_OUT", { streams = odd and 3 or 2, out_dtype = odd and "f32" or nil }, "bf16" },
}
K.report(function()
  for _, c in ipairs(cases) do
    local op = K.op("ag", c[2])
    local case = K.case("ag", 5, { rows = 2, k = 16, n = 8 }, c[3])
    print(c[1] .. ": " .. message(function() op:run(case.a, case.b) end))
    op:free()
  end
  K.w:barrier()
  print(string.format("mismatch ok: rank %d of %d on %s", K.me, K.d, K.dev))
end)
