-- spec/overlap/common.lua — what the overlap rank scripts share: the world,
-- inputs every rank draws for every rank (Philox: the same numbers on every
-- device), the fp64 reference of spec/gemm_ref.lua and the bound each
-- schedule family must meet, ops made from option tables, and failing with
-- a line the spec reads.
local dl = require "distlab"

local K = {}

K.timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "30")
K.w = dl.comm.world { timeout = K.timeout }
K.d, K.me, K.dev = K.w.size, K.w.rank, K.w.device
K.R = dofile(dl.root .. "/spec/gemm_ref.lua")

function K.op(kind, opts)
  local o = { comm = K.w }
  for k, v in pairs(opts or {}) do o[k] = v end
  return kind == "ag" and dl.overlap.ag_gemm(o) or dl.overlap.gemm_rs(o)
end

-- One case of call `seed`: this rank's arguments (on the device) and the
-- reference of its result. ag: A [d * rows, k] gathered, b [k, n]; rs:
-- A [d * rows, d * kd], B [d * kd, n], rank r's a_shard the columns and
-- b_shard the rows r * kd .. of them; the result is rank r's rows of A @ B.
function K.case(kind, seed, shape, dtype)
  local rows, k, n, d, me = shape.rows, shape.k, shape.n, K.d, K.me
  local kk = kind == "ag" and k or d * k
  local A = dl.randn({ d * rows, kk }, { dtype = dtype, device = "cpu", seed = seed * 8 })
  local B = dl.randn({ kk, n }, { dtype = dtype, device = "cpu", seed = seed * 8 + 1 })
  local c = { kind = kind }
  if kind == "ag" then
    c.a = A:narrow(1, me * rows + 1, rows):contiguous():to(K.dev)
    c.b = B:to(K.dev)
    c.ref, c.abs = K.R.matmul(A, B)
  else
    c.a = A:narrow(2, me * k + 1, k):contiguous():to(K.dev)
    c.b = B:narrow(1, me * k + 1, k):contiguous():to(K.dev)
    c.ref, c.abs = K.R.matmul(A:narrow(1, me * rows + 1, rows), B)
  end
  c.k = kk
  return c
end

-- got against the case's reference: all-gather + GEMM rounds like one GEMM;
-- a reduce-scatter also rounds each rank's partial (p2p) or each hop's
-- running sum (ring, and NCCL's ring) to c's dtype: at most d more roundings
-- of values no larger than sum |a||b|.
function K.expect(got, case, what)
  local u = K.R.u[got.dtype]
  local u_abs = K.R.sum_bound(case.k, u) + (case.kind == "rs" and K.d * u * (1 + u) ^ K.d or 0)
  local msg = K.R.check(got, case.ref, case.abs, u, u_abs, what)
  if msg then error(msg, 0) end
end

-- The label of an option table: "ag p2p get sm x2" ("ag p2p put ce x2 merge 3").
function K.label(kind, v)
  return kind .. " " .. (v.transport and string.format("%s %s %s x%d", v.algo, v.transport, v.copy, v.streams) or v.algo)
    .. (v.merge and (" merge " .. tostring(v.merge)) or "")
end

-- Run fn; on error print "ERR: <message>" and exit 3.
-- fn's error message; an error of its own where fn did not fail
function K.message(fn)
  local ok, err = pcall(fn)
  if ok then error("expected an error", 0) end
  return tostring(err)
end

function K.report(fn)
  local ok, err = pcall(fn)
  if not ok then
    io.stdout:write("ERR: " .. tostring(err) .. "\n")
    io.stdout:flush()
    os.exit(3)
  end
end

return K
