-- spec/comm/graph_release.lua — a CUDA graph that captured NCCL work of a
-- communicator, and that communicator freed while the graph lives:
-- ncclCommDestroy would wait for the graph forever, so distlab releases the
-- graph first. The graph then refuses to replay, saying why, and the process
-- ends (the exit used to hang). The same for a graph of all-reduce kernels
-- whose all-reduce object is freed (its symmetric buffers go with it). On cpu
-- the recorded functions meet the freed objects instead. Prints
-- "graph_release ok" per rank.
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
  -- an all-reduce object of its own, captured, then freed: its buffers are gone
  local ar = dl.allreduce.new(s)
  local x = dl.empty({ 4096 }, "bf16")
  local ga = dl.graph.capture(function() ar:run(x, { algo = "one_shot" }) end)
  x:fill_(1)
  ga:replay()
  s:synchronize()
  U.expect(x, function() return N end, "all-reduce graph replay")
  ar:free()
  local aok, aerr = pcall(function() ga:replay() end)
  assert(not aok, "a graph whose all-reduce object was freed replayed")
  local awant = w.device:match("^cuda") and "the all-reduce object" or "use of a freed all-reduce"
  assert(tostring(aerr):find(awant, 1, true), "unexpected error: " .. tostring(aerr))
  ga:free()
  s:free()
  local ok, err = pcall(function() g:replay() end)
  assert(not ok, "a graph whose communicator was freed replayed")
  -- cuda: the CUDA graph was released; cpu (a recorded function): it calls the freed communicator
  local want = w.device:match("^cuda") and { "released", "was destroyed" } or { "use of a freed communicator" }
  for _, p in ipairs(want) do assert(tostring(err):find(p, 1, true), "unexpected error: " .. tostring(err)) end
  g:free()
  w:barrier()
  print(string.format("graph_release ok: rank %d", me))
end)
