-- spec/overlap/uneven.lua — m that does not split over the ranks: an
-- all-gather + GEMM whose ranks hold shards of different rows fails on
-- every rank, naming both sides (prints "AG: <message>"), and the same op
-- then runs on even shards; a GEMM + reduce-scatter of m rows, m not a
-- multiple of d, fails at once ("RS: <message>"); a run with new shapes on
-- an op set up for others is refused ("SHAPE: <message>").
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")
local dl = require "distlab"

local message = K.message

K.report(function()
  local op = K.op("ag", { algo = "ring", transport = "put" })
  local rows = K.me == 0 and 3 or 2 -- m = 2 d + 1
  local a = dl.randn({ rows, 16 }, { dtype = "bf16", device = K.dev, seed = K.me })
  local b = dl.randn({ 16, 8 }, { dtype = "bf16", device = K.dev, seed = 99 })
  print("AG: " .. message(function() op:run(a, b) end))
  local case = K.case("ag", 7, { rows = 2, k = 16, n = 8 }, "bf16")
  K.expect(op:run(case.a, case.b), case, "after the mismatch")
  op:check()
  print("SHAPE: " .. message(function() op:run(dl.randn({ 3, 16 }, { dtype = "bf16", device = K.dev }), case.b) end))

  local rs = K.op("rs", { algo = "p2p" })
  local m = 3 * K.d + 1
  print("RS: " .. message(function()
    rs:run(dl.randn({ m, 8 }, { dtype = "bf16", device = K.dev }), dl.randn({ 8, 8 }, { dtype = "bf16", device = K.dev }))
  end))
  K.w:barrier()
  print(string.format("uneven ok: rank %d of %d on %s", K.me, K.d, K.dev))
end)
