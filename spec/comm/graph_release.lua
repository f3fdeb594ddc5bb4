-- spec/comm/graph_release.lua — a CUDA graph that captured NCCL work of a
-- communicator, and that communicator freed while the graph lives:
-- ncclCommDestroy would wait for the graph forever, so distlab releases the
-- graph first. The graph then refuses to replay, saying why, and the process
-- ends (the exit used to hang). On cpu the recorded function meets the freed
-- communicator instead. Prints "graph_release ok" per rank.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local w = dl.comm.world { timeout = 20 }
local N, me = w.size, w.rank

U.report(function()
  local s = w:split(0, me) -- a communicator of its own, freed below
  local t = dl.empty({ 1000 }, "f32")
  local g = dl.graph.capture(function() s:all_reduce(t, "sum") end)
  for r = 1, 3 do
    t:fill_(me + 1)
    g:replay()
    s:synchronize()
    U.expect(t, function() return N * (N + 1) / 2 end, "replay " .. r)
  end
  s:free()
  local ok, err = pcall(function() g:replay() end)
  assert(not ok, "a graph whose communicator was freed replayed")
  -- cuda: the CUDA graph was released; cpu (a recorded function): it calls the freed communicator
  local want = w.backend == "nccl" and { "released", "was destroyed" } or { "use of a freed communicator" }
  for _, p in ipairs(want) do assert(tostring(err):find(p, 1, true), "unexpected error: " .. tostring(err)) end
  g:free()
  w:barrier()
  print(string.format("graph_release ok: rank %d", me))
end)
