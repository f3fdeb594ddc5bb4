-- spec/overlap/graph.lua [replays] — runs captured in a graph (a CUDA graph
-- on cuda: the stream memory operations, copies and GEMMs of every step on
-- the op's streams; a recorded Lua function on cpu) and replayed with fresh
-- inputs copied into the captured ones, eager runs of the same ops on other
-- data in between: every replay's result matches its reference. The
-- set-and-clear flags are what lets a replay write the values it captured.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")
local dl = require "distlab"

local replays = tonumber(arg[1] or "6")
local variants = {
  { "ag", { algo = "p2p", transport = "get", copy = "ce", streams = 2 } },
  { "ag", { algo = "ring", transport = "put", copy = "sm", streams = 3 } },
  { "ag", { algo = "nccl_then_gemm" } },
  { "ag", { algo = "p2p", transport = "get", copy = "sm", streams = 2, merge = 1 } },
  { "ag", { algo = "p2p", transport = "put", copy = "ce", streams = 3, merge = true } },
  { "rs", { algo = "p2p", transport = "put", copy = "sm", streams = 2 } },
  { "rs", { algo = "ring", transport = "get", copy = "ce", streams = 1 } },
}
local shapes = { ag = { rows = 4, k = 32, n = 16 }, rs = { rows = 2, k = 16, n = 24 } }

K.report(function()
  local cases = {}
  for i, v in ipairs(variants) do
    local kind = v[1]
    local op = K.op(kind, v[2])
    local first = K.case(kind, 500 + i, shapes[kind], "bf16")
    -- eager first: the run that sets the op up (collective, host work) stays out of the graph
    local c = op:run(first.a, first.b)
    op:check()
    K.expect(c, first, K.label(kind, v[2]) .. " eager")
    cases[i] = { kind = kind, op = op, a = first.a:clone(), b = first.b:clone(), c = c,
      label = K.label(kind, v[2]) }
  end
  local g = dl.graph.capture(function()
    for _, x in ipairs(cases) do x.op:run(x.a, x.b, x.c) end
  end)
  local nodes = g:nodes()
  if K.dev:match("^cuda") and nodes < #cases then error("the graph captured " .. nodes .. " nodes", 0) end
  for r = 1, replays do
    local want = {}
    for i, x in ipairs(cases) do
      want[i] = K.case(x.kind, 600 + 10 * r + i, shapes[x.kind], "bf16")
      x.a:copy_(want[i].a)
      x.b:copy_(want[i].b)
    end
    g:replay()
    for i, x in ipairs(cases) do
      x.op:check()
      K.expect(x.c, want[i], string.format("%s replay %d", x.label, r))
    end
    for i, x in ipairs(cases) do -- eager runs in between, on other data
      local e = K.case(x.kind, 900 + 10 * r + i, shapes[x.kind], "bf16")
      K.expect(x.op:run(e.a, e.b), e, string.format("%s eager after replay %d", x.label, r))
    end
  end
  for _, x in ipairs(cases) do x.op:check() end
  K.w:barrier()
  print(string.format("graph ok: rank %d of %d on %s, %d replays of %d nodes", K.me, K.d, K.dev, replays, nodes))
end)
