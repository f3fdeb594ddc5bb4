-- spec/overlap/correct.lua — every variant of both families (the baselines,
-- and p2p and ring x get and put x ce and sm x 1, 2 and 3 streams) against
-- the fp64 reference of the gathered (or reduced) GEMM, at odd shapes (rows
-- that no copy vector divides), twice per op (the second run finds the
-- flags back where they started) with c allocated and then given; f16 in
-- and f32 out for a few; ag p2p with merge (heads of 0, 2 and all rows);
-- and the buffers where the first run put them.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")
local dl = require "distlab"

local shapes = { ag = { rows = 5, k = 37, n = 23 }, rs = { rows = 3, k = 11, n = 19 } }
local checks, seed = 0, 100

local function one(kind, v, dtype, out_dtype)
  local o = {}
  for key, val in pairs(v) do o[key] = val end
  o.out_dtype = out_dtype
  local op = K.op(kind, o)
  local what = K.label(kind, v) .. " " .. dtype .. (out_dtype and (" -> " .. out_dtype) or "")
  local base
  for call = 1, 2 do
    seed = seed + 1
    local case = K.case(kind, seed, shapes[kind], dtype)
    local c = nil
    if call == 2 then
      c = dl.full(case.ref.shape, 0 / 0, { dtype = out_dtype or dtype, device = K.dev })
    end
    local got = op:run(case.a, case.b, c)
    op:check()
    if c and got ~= c then error(what .. ": run did not return the c it was given", 0) end
    K.expect(got, case, what .. " call " .. call)
    local info = op:info()
    if call == 1 then base = info.base elseif info.base ~= base then
      error(what .. ": the buffer moved between runs", 0)
    end
    checks = checks + 1
  end
  op:free()
end

K.report(function()
  for _, kind in ipairs { "ag", "rs" } do
    for _, v in ipairs(dl.overlap.variants(kind, { 1, 2, 3 })) do one(kind, v, "bf16") end
    one(kind, { algo = "p2p", transport = "get", copy = "sm", streams = 2 }, "f16", "f32")
    one(kind, { algo = "ring", transport = "put", copy = "ce", streams = 3 }, "f16")
    one(kind, { algo = dl.overlap.algos[kind][1] }, "bf16", "f32")
  end
  -- ag p2p with the local shard's GEMM split (merge): auto (the whole shard at these rows),
  -- no head, a head of 2 rows, the whole shard as the head
  for _, merge in ipairs { true, 0, 2, shapes.ag.rows } do
    for _, transport in ipairs { "get", "put" } do
      for s = 1, 3 do
        one("ag", { algo = "p2p", transport = transport, copy = s == 2 and "sm" or "ce", streams = s, merge = merge },
          "bf16")
      end
    end
  end
  one("ag", { algo = "p2p", transport = "put", copy = "ce", streams = 2, merge = 3 }, "f16", "f32")
  K.w:barrier()
  print(string.format("correct ok: rank %d of %d on %s, %d checks", K.me, K.d, K.dev, checks))
end)
