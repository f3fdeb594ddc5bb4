-- spec/trace/ranks.lua — run by spec/trace_spec.lua under `distlab run -n N`:
-- every rank traces a few steps on two streams (spans of its own, a hook's
-- begin/finish, wrapped ops: a GEMM, a grouped GEMM, collectives) and rank 0
-- writes the merged trace to arg[1] (and arg[2], the PNG, where gnuplot exists).
local dl = require "distlab"
local world = dl.comm.world()
local path, png = arg[1], arg[2]
local side = dl.stream(world.device)
dl.trace.start { comm = world }
local x = dl.randn({ 32, 48 }, { dtype = "bf16", seed = world.rank + 1 })
local w = dl.randn({ 48, 16 }, { dtype = "bf16", seed = 100 })
for step = 1, 3 do
  dl.trace.span("step.compute", function() dl.gemm(x, w) end, { step = step, rank = world.rank })
  dl.with_stream(side, function()
    dl.trace.span("step.comm", function() world:all_reduce(dl.ones({ 1024 }, "f32")) end, { step = step, bytes = 4096 })
  end)
end
local t = dl.trace.begin("hook.step", { note = "a schedule's step \"quoted\"" })
dl.gemm.grouped(dl.randn({ 3, 8, 48 }, { dtype = "bf16", seed = 7 }), dl.randn({ 3, 48, 16 }, { dtype = "bf16", seed = 8 }),
  { 8, 0, 5 })
world:barrier()
dl.trace.finish(t)
dl.trace.mark("done", { rank = world.rank })
local p, spans, drawn = dl.trace.stop { path = path, png = png or false }
print(string.format("RANK %d path=%s spans=%d png=%s", world.rank, tostring(p), #spans, tostring(drawn)))
