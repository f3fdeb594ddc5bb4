-- spec/ep/graph.lua [replays] — dispatch and combine captured in graphs
-- (dl.graph.capture: a CUDA graph on cuda, a recorded function on cpu) and
-- replayed with new data every time: the inputs are copied into the tensors
-- the graph reads before each replay (new routing and values; T is the
-- captured one), the dispatch graph's outputs checked, the experts' outputs
-- copied in, the combine graph replayed and checked. Eager calls with other
-- token counts run between replays, so a replay finds the epochs moved on.
-- Prints "graph ok" per rank.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local X = dofile(dir .. "/common.lua")
local dl = require "distlab"

local N, me = X.N, X.me
local replays = tonumber(arg[1] or "12")
local kinds = {
  { layout = "per_rank", output = "expert_major", dtype = "bf16" },
  { layout = "per_expert", output = "rank_major", dtype = "fp8" },
}

X.report(function()
  local call = 5000
  for _, k in ipairs(kinds) do
    local o = { B = 8, H = 256, E = 2 * N, K = 3, layout = k.layout, output = k.output, dtype = k.dtype }
    local ep = X.buffer(o)
    local what = string.format("%s/%s/%s", o.layout, o.output, o.dtype)
    -- what the graphs read: this rank's inputs (T fixed: 6 on even ranks, 3 on odd) and y
    local T = me % 2 == 0 and 6 or 3
    local first = X.inputs(o, call, me, "random", T)
    local xs, is, ws = X.tensors(first, o)
    local ys = dl.zeros(ep.tensors.x:size(), { dtype = "bf16", device = X.w.device })
    local cur = {}
    local gd = dl.graph.capture(function() cur.recv, cur.h = ep:dispatch(xs, is, ws) end)
    local gc = dl.graph.capture(function() cur.out = ep:combine(ys, cur.h) end)
    for r = 1, replays do
      call = call + 1
      local all = {}
      for s = 0, N - 1 do all[s + 1] = X.inputs(o, call, s, r % 4 == 0 and "one_rank" or "random", s % 2 == 0 and 6 or 3) end
      local x, idx, w = X.tensors(all[me + 1], o)
      xs:copy_(x)
      is:copy_(idx)
      ws:copy_(w)
      X.poison(ep)
      gd:replay()
      ep:check()
      local err = X.check_dispatch(o, cur.recv, all)
      if err then error(string.format("%s replay %d dispatch: %s", what, r, err), 0) end
      ys:copy_(X.expert_outputs(o, cur.recv))
      gc:replay()
      ep:check()
      err = X.check_combine(o, cur.out, all[me + 1])
      if err then error(string.format("%s replay %d combine: %s", what, r, err), 0) end
      -- eager calls in between, other token counts: the epochs move on
      for e = 1, r % 3 do
        call = call + 1
        local ea = {}
        for s = 0, N - 1 do ea[s + 1] = X.inputs(o, call, s, "random") end
        local ex, ei, ew = X.tensors(ea[me + 1], o)
        local recv, h = ep:dispatch(ex, ei, ew)
        local out = ep:combine(X.expert_outputs(o, recv), h)
        err = X.check_combine(o, out, ea[me + 1])
        if err then error(string.format("%s eager call %d after replay %d: %s", what, e, r, err), 0) end
      end
    end
    gd:free()
    gc:free()
    ep:free()
  end
  X.w:barrier()
  print(string.format("graph ok: rank %d of %d on %s, %d replays each of %d buffers", me, N, X.w.device, replays, #kinds))
end)
