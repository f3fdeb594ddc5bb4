-- distlab.bench.gemm_check — the data checks of the GEMM benches
-- (experiments/overlap/ag_gemm_bench.lua: all-gather + GEMM, GEMM +
-- reduce-scatter and the GEMM alone; gemm_bench.lua takes its bounds).
--
-- After a row's timing, the row's timed callable once more, its output
-- poisoned (NaN), on inputs none of its timed runs saw: per m, A and B drawn
-- from new seeds (Philox, every rank drawing every rank's shard), each check
-- multiplying A by its own power of two (-1/2, 1, -2, 1/4, ...: exact, so
-- the exact result scales with it, and a result an earlier run left behind,
-- in the output or in a buffer the op reuses, is off by a factor). The
-- reference is the fp64 product on the host (verify.matmul_rows, not the
-- op under test), of max(2d, ceil(1e5 / n)) rows spread over C's m rows
-- (each rank its own rows, some in every rank's block; all of them where m
-- is smaller; gemm_rs: max(2, ceil(1e5 / (d n))) of each rank's m/d rows).
-- All-gather rows, the GEMM alone and its parts (one rounding to C's
-- dtype, u = 2^-8 for bf16, 2^-11 for f16): each element within 2u |ref|
-- + 2u rms(ref), normwise within 1.5u (the rounding's rms is below
-- u / sqrt(3); the fp32 sums add ~1e-5), and the bias <got - ref, ref> /
-- <ref, ref> within 2^-10 (rounding to nearest has none; a 1% scale error
-- is 1e-2).
-- Reduce-scatter: want = sum_p P_p, P_p = A[row, slice p] @ B[slice p, :]
-- the d partial rows (slice p: the k/d columns of A and rows of B that rank
-- p owns), S = sum_p |P_p|. An element is wrong beyond
--   |got - want| <= (2d - 1) u S + u |want| + (k/d + 4) 2^-20 sum_p rms(P_p)
-- (rms over the row). The result is d partials rounded to C's dtype and
-- summed by d - 1 additions, each rounded to C's dtype too (NCCL's ring and
-- ours; p2p rounds only the partials and the final fp32 sum), every rounded
-- value at most S to first order: d u S (1 + u)^d in all. The bound allows
-- twice that count, for a summation we did not foresee, which also covers
-- the fp32 epilogue and reduce additions (<= d 2^-23 S). The last term: the
-- kernel's fp32 partial and the exact P_p differ by k/d + 4 additions, each
-- off by at most 2^-23 of its running sum; for these zero-mean random
-- inputs a running sum is a random walk whose mean size along the way is
-- about rms(P_p) / 2, and the term allows 4 rms(P_p) with the errors of all
-- additions aligned, twice. Normwise: roundings to nearest err
-- independently, each with rms at most u |x| / sqrt(3), and with
-- independent partials the j-partial sums have norm ||want|| sqrt(j / d), so
-- the model's normwise error is u sqrt((1 + (d + 2)(d - 1) / (2d)) / 3):
-- 0.82u, 1.04u, 1.34u at d = 2, 4, 8 (p2p: 0.82u at any d); the bound is
-- 1.5 times that (4.8e-3 at d = 2, 7.8e-3 at d = 8 for bf16), the bias
-- within 2^-10 as above. --plant scale=0.01 (1%) breaks the normwise bound
-- and the bias at every d; --plant noop leaves the poison.
--
--   gemm_check.U[dtype]                     unit roundoff of C's dtype (bf16 2^-8, f16 2^-11)
--   gemm_check.tol(dtype)                   one rounding: {rtol = 2u, atol_rms = 2u, norm = 1.5u,
--                                           bias = 2^-10} (distlab.bench.verify.close)
--   gemm_check.tol_rs(dtype, d)             the reduce-scatter's: {rtol = u, norm, bias}, with
--                                           the per-element allowances apart (see above)
--   gemm_check.checker(h, {m, d, me, k, n, dtype, rs, full, bfull, a, b}) -> check
--       the checks of one m of a bench on harness h: full [m, k] and bfull [k, n] the
--       gathered inputs (every rank draws every rank's shard), a and b this rank's operands
--       (ag: a = full's rows of rank me, b = bfull; rs: a = its k/d columns, b = bfull's
--       k/d rows); check(what, run, out, kind) draws them all again (fresh), runs `run`
--       into out poisoned (h:verify) and compares at rows of out with the fp64 reference
--       of kind "ag" (out = C [m, n]: the all-gather + GEMM or the GEMM of full alone),
--       "rs" (out = this rank's block [m/d, n] of the reduce-scatter) or "local" (the
--       GEMM of a and b alone, [m, n]); it returns the wrong elements over all ranks
local verify = require "distlab.bench.verify"

local M = {}

M.U = { bf16 = 2 ^ -8, f16 = 2 ^ -11 }

function M.tol(dtype)
  local u = M.U[dtype]
  return { rtol = 2 * u, atol_rms = 2 * u, norm = 1.5 * u, bias = 2 ^ -10 }
end

function M.tol_rs(dtype, d)
  local u = M.U[dtype]
  return { rtol = u, norm = 1.5 * u * math.sqrt((1 + (d + 2) * (d - 1) / (2 * d)) / 3), bias = 2 ^ -10 }
end

function M.checker(h, o)
  local m, d, me, n, t = o.m, o.d, o.me, o.n, o
  local rows, kd, u = m / d, o.k / d, M.U[o.dtype]
  local tol, tol_rs = M.tol(o.dtype), M.tol_rs(o.dtype, d)
  local seed = 1000003 + 64 * m
  local count, sc = 0, 1
  local refs = {}
  -- the verification inputs again, times the next power of two
  local function fresh()
    count = count + 1
    sc = (count % 2 == 1 and -1 or 1) * 2 ^ (count % 4 - 2) -- -1/2, 1, -2, 1/4, -1/2, ...
    for p = 0, d - 1 do t.full:narrow(1, p * rows + 1, rows):normal_(0, 1, seed + p) end
    t.full:mul_(sc)
    t.bfull:normal_(0, 1, seed + 63)
    if o.rs then
      t.a:copy_(t.full:narrow(2, me * kd + 1, kd))
      t.b:copy_(t.bfull:narrow(1, me * kd + 1, kd))
    else
      t.a:copy_(t.full:narrow(1, me * rows + 1, rows))
    end
  end
  -- rows (0-based, of out) spread over out's rows; the reference of the checked rows for
  -- sc = 1, made at the kind's first check (its inputs then are sc times those)
  local function reference(kind)
    if refs[kind] then return refs[kind] end
    local r = {}
    local per = kind == "rs" and math.max(2, math.ceil(1e5 / (d * n))) or math.max(2 * d, math.ceil(1e5 / n))
    r.rows = verify.spread(kind == "rs" and rows or m, per, 31 * m + 7 * me + #kind)
    local at = {} -- the rows of the inputs' product
    r.wins = {}
    for i, x in ipairs(r.rows) do
      r.wins[i] = { x * n, n }
      at[i] = (kind == "rs" and me * rows or 0) + x + 1
    end
    if kind == "ag" then
      r.ref = verify.matmul_rows(t.full, t.bfull, at)
    elseif kind == "local" then
      r.ref = verify.matmul_rows(t.a, t.b, at)
    else
      local S, rms
      r.ref, S, rms = verify.matmul_rows(t.full, t.bfull, at, { parts = d })
      -- per element: (2d - 1) u S + (k/d + 4) 2^-20 sum_p rms(P_p) of its row (u |want|: rtol)
      r.allow = S:mul_((2 * d - 1) * u)
      for i = 1, #at do r.allow:narrow(1, i, 1):add_((kd + 4) * 2 ^ -20 * rms[i]) end
      r.allow:mul_(1 / math.abs(sc))
      r.allow = r.allow:reshape(r.allow:numel())
    end
    r.ref:mul_(1 / sc)
    r.ref = r.ref:reshape(r.ref:numel())
    refs[kind] = r
    return r
  end
  return function(what, run, out, kind)
    return h:verify { what = string.format("m = %d, %s", m, what), fresh = fresh, poison = { out }, run = run,
      check = function()
        local r = reference(kind)
        local ref = r.ref:clone():mul_(sc)
        if kind ~= "rs" then return verify.close(verify.take(out, r.wins), ref, tol) end
        local tl = {}
        for key, v in pairs(tol_rs) do tl[key] = v end
        tl.allow = r.allow:clone():mul_(math.abs(sc))
        return verify.close(verify.take(out, r.wins), ref, tl)
      end }
  end
end

return M
