-- A bench on the harness whose data check fails on every rank: the harness
-- must sum the wrong elements over the ranks and end with exit code 1.
-- --int64 returns the count as a 64-bit integer, as a count read from C is.
--   ./distlab run -n 2 --device cpu spec/bench/wrong.lua --out DIR [--wrong N] [--int64]
local ffi = require "ffi"
local dl = require "distlab"

local w = dl.comm.world()
local h = dl.bench.harness { name = "wrong_bench", family = "spec", comm = w,
  options = { { "wrong", "int", 1, "wrong elements per rank" },
    { "int64", "flag", nil, "return the count as an int64_t" } } }
local t = dl.zeros({ 4 })
local st = dl.bench.timing.events(function() t:add_(1) end, { warmup = 1, iters = 3 })
local total = h:check(function() return h.opt.int64 and ffi.new("int64_t", h.opt.wrong) or h.opt.wrong end)
h:print("checked: %d wrong over %d ranks, median %.3f ms", total, w.size, h:max(st.median))
h:finish()
print("not reached when data are wrong")
