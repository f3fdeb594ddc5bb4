-- spec/overlap/backtoback.lua [runs] — 200 runs (default) issued back to
-- back with fresh data each, alternating get and put (and cycling through
-- all-gather + GEMM and GEMM + reduce-scatter, p2p and ring, ce and sm, one
-- to three streams, and ag p2p with merge): nothing waits for the GPU between runs, so runs of the
-- same op and of the others queue behind one another; then every result is
-- checked against its own fp64 reference, and every op's buffer is where
-- its first run put it.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")

local runs = tonumber(arg[1] or "200")
local shapes = { ag = { rows = 4, k = 24, n = 16 }, rs = { rows = 2, k = 8, n = 12 } }

K.report(function()
  local ops = {}
  for _, kind in ipairs { "ag", "rs" } do
    for _, algo in ipairs { "p2p", "ring" } do
      for j, transport in ipairs { "get", "put" } do
        local v = { algo = algo, transport = transport, copy = j == 1 and "ce" or "sm", streams = #ops % 3 + 1 }
        ops[#ops + 1] = { kind = kind, op = K.op(kind, v), label = K.label(kind, v) }
      end
    end
  end
  for j, transport in ipairs { "get", "put" } do -- p2p with the local shard's GEMM split (merge)
    local v = { algo = "p2p", transport = transport, copy = "ce", streams = j + 1, merge = j }
    ops[#ops + 1] = { kind = "ag", op = K.op("ag", v), label = K.label("ag", v) }
  end
  local pending = {}
  for i = 1, runs do
    local o = ops[(i - 1) % #ops + 1] -- odd runs get, even runs put
    local case = K.case(o.kind, 1000 + i, shapes[o.kind], "bf16")
    case.got = o.op:run(case.a, case.b)
    if not o.base then o.base = o.op:info().base end
    case.label = string.format("run %d (%s)", i, o.label)
    pending[i] = case
  end
  for _, o in ipairs(ops) do o.op:check() end
  for _, case in ipairs(pending) do K.expect(case.got, case, case.label) end
  for _, o in ipairs(ops) do
    local info = o.op:info()
    if info.base ~= o.base then error(o.label .. ": the buffer moved", 0) end
    if info.failed then error(o.label .. ": the op failed", 0) end
  end
  K.w:barrier()
  print(string.format("backtoback ok: rank %d of %d on %s, %d runs over %d ops", K.me, K.d, K.dev, runs, #ops))
end)
