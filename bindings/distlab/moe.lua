-- distlab.moe — the math of a MoE layer that no one kernel does, written
-- with the ops distlab has (tensor_math, dl.gemm), on cpu (fp64 twins) and
-- cuda alike: SwiGLU and its gradient, the router's softmax + top-k and its
-- gradient, row dot products, and the bookkeeping of the rows an expert
-- gets (which token and which of its k selections each row is).
--
--   s = moe.sigmoid(x)              f32, shaped like x: softmax over [0, x]
--                                   (distlab has no sigmoid kernel; exact in fp64)
--   a = moe.swiglu(h[, out])        h [M, 2F] (gate | up columns) -> silu(gate) * up,
--                                   [M, F] in h's dtype (f32 inside)
--   dh = moe.swiglu_bwd(da, h[, out])   the gradient for h, [M, 2F] in h's dtype
--   p, w, ids = moe.route(logits, k | ids)   logits f32 [T, E]: p = softmax(logits),
--                                   ids i64 [T, K] the top-k of p (or the ids given:
--                                   a routing read from a file or drawn from a
--                                   distribution), w = p at ids (f32, not renormalised)
--   dlogits = moe.route_bwd(p, w, ids, dw)   f32 [T, E] from dw = dLoss/dw [T, K]:
--                                   dp = dw scattered to ids, dlogits = p (dp - <w, dw>)
--   d = moe.rowdot(a, b)            f32 [M, 1]: sum_j a[i, j] b[i, j], products in f32
--                                   summed by a GEMM with ones (hi + lo bf16 halves:
--                                   about 16 bits of each product kept)
--   pl = moe.plan(ids, weights, {experts =, first =, count =})
--       the rows experts first .. first + count - 1 get from tokens routed by
--       ids (i64/i32 [N, K], -1: no expert) with weights (f32 [N, K]), in the
--       order dl.ep's expert-major output has them (by expert, then token:
--       a stable sort of the flat ids): pl.M rows, pl.counts (a Lua list, one
--       per expert of the range), pl.offsets (0-based first row of each),
--       pl.sel (i64 [M]: the flat position token * K + k of each row),
--       pl.token (i64 [M]), pl.weight (f32 [M]); pl.all (rows per expert of
--       all E, a Lua list). ids of every rank (all-gathered) give this rank's
--       rows before the dispatch has run: nothing after it waits for counts.
--   xp = moe.pack(x_em, counts[, out])   x_em [L, R, H] expert-major (rows
--       r < counts[e] of x_em[e], as ep:dispatch leaves them) -> [sum counts, H]
--   moe.unpack(xp, counts, out_em)       the inverse, into out_em's leading rows
--       (rows past the counts untouched: ep:combine does not read them)
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local create = require "distlab.create"
local tmath = require "distlab.tensor_math"
local gemm = require "distlab.gemm"
local args = require "distlab.args"

local fail = core.fail
local M = {}

local function f32(x)
  if x.dtype == "f32" or x.dtype == "f64" then return x:contiguous() end
  return x:f32()
end

-- the wider of f32 and x's float dtype (f64 stays f64: the cpu references)
local function acc_dtype(x) return x.dtype == "f64" and "f64" or "f32" end

function M.sigmoid(x)
  local dt = acc_dtype(x)
  local z = create.zeros({ x:numel(), 2 }, { dtype = dt, device = x.device })
  z:select(2, 2):copy_(x:reshape(x:numel()))
  local s = tmath.softmax(z, -1):select(2, 2):contiguous()
  return s:view(unpack(x.shape))
end

local function halves(h, fn)
  if h.nd ~= 2 or h.shape[2] % 2 ~= 0 then
    fail("%s: h must be [M, 2F] (gate | up), got [%s]", fn, table.concat(h.shape, ", "))
  end
  local F = h.shape[2] / 2
  local dt = acc_dtype(h)
  local g = h:narrow(2, 1, F):to(dt):contiguous()
  local u = h:narrow(2, F + 1, F):to(dt):contiguous()
  return g, u, F
end

function M.swiglu(h, out)
  local g, u, F = halves(h, "moe.swiglu")
  local a = M.sigmoid(g):mul_(g):mul_(u) -- silu(g) * u
  out = out or tensor.empty({ h.shape[1], F }, { dtype = h.dtype, device = h.device })
  return out:copy_(a)
end

-- d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g)
function M.swiglu_bwd(da, h, out)
  local g, u, F = halves(h, "moe.swiglu_bwd")
  local dt = g.dtype
  local s = M.sigmoid(g)
  local d = da:to(dt):contiguous()
  out = out or tensor.empty({ h.shape[1], 2 * F }, { dtype = h.dtype, device = h.device })
  local du = s:clone():mul_(g):mul_(d)                               -- da * silu(g)
  out:narrow(2, F + 1, F):copy_(du)
  local one_minus = s:clone():mul_(-1):add_(1)
  local dsilu = one_minus:mul_(g):add_(1):mul_(s)                    -- s (1 + g (1 - s))
  out:narrow(2, 1, F):copy_(dsilu:mul_(u):mul_(d))
  return out
end

-- ---- the router ---------------------------------------------------------------------

function M.route(logits, k)
  local p = tmath.softmax(logits, -1)
  if type(k) == "number" then
    local w, ids = tmath.topk(p, k)
    return p, w, ids
  end
  if not tensor.is_tensor(k) then fail("moe.route: k must be a number or a tensor of expert ids") end
  local ids = k.dtype == "i64" and k or k:i64()
  return p, tmath.gather(p, 2, ids), ids
end

function M.route_bwd(p, w, ids, dw)
  local T, E = p.shape[1], p.shape[2]
  local dt = p.dtype
  local dp = create.zeros({ T, E }, { dtype = dt, device = p.device }):scatter_add_(2, ids, dw)
  local wd = w:clone():mul_(dw)
  local zero = create.zeros({ T, w.shape[2] }, { dtype = "i64", device = p.device })
  local s = create.zeros({ T, 1 }, { dtype = dt, device = p.device }):scatter_add_(2, zero, wd)
  return dp:sub_(s:expand(T, E)):mul_(p)
end

-- ---- row dot products ----------------------------------------------------------------

local ones_cache = {}
local function ones(n, device)
  local key = device .. "/" .. n
  if not ones_cache[key] then ones_cache[key] = create.ones({ n, 1 }, { dtype = "bf16", device = device }) end
  return ones_cache[key]
end

function M.rowdot(a, b)
  local m, n = a.shape[1], a.shape[2]
  local prod = f32(a):clone():mul_(b)
  local hi = tensor.empty({ m, n }, { dtype = "bf16", device = a.device }):copy_(prod)
  local lo = tensor.empty({ m, n }, { dtype = "bf16", device = a.device }):copy_(prod:sub_(hi))
  local one = ones(n, a.device)
  local out = gemm.run(hi, one, { out_dtype = "f32" })
  return gemm.run(lo, one, out, { beta = 1 })
end

-- ---- which rows an expert gets ---------------------------------------------------------

local PLAN_KEYS = { experts = true, first = true, count = true }

function M.plan(ids, weights, o)
  o = args.options(o, PLAN_KEYS, "moe.plan")
  local N, K = ids.shape[1], ids.shape[2]
  local E = args.int(o.experts, "moe.plan: experts", 1)
  local first = args.int(o.first or 0, "moe.plan: first", 0, E - 1)
  local count = args.int(o.count or E - first, "moe.plan: count", 0, E - first)
  local flat = ids:contiguous():view(N * K)
  local all = tmath.bincount(flat, E):tolist()
  local valid = 0
  for e = 1, E do valid = valid + all[e] end
  local lo = N * K - valid -- the -1 entries sort first
  for e = 1, first do lo = lo + all[e] end
  local pl = { counts = {}, offsets = {}, all = all, M = 0, first = first, count = count, K = K }
  for e = 1, count do
    pl.offsets[e] = pl.M
    pl.counts[e] = all[first + e]
    pl.M = pl.M + all[first + e]
  end
  local order = tmath.argsort(flat)
  pl.sel = order:narrow(1, lo + 1, pl.M):contiguous()
  local token = create.arange(N, { device = ids.device }):view(N, 1):expand(N, K):contiguous():view(N * K)
  pl.token = tmath.index_select(token, 1, pl.sel)
  pl.weight = tmath.index_select(weights:contiguous():view(N * K), 1, pl.sel)
  return pl
end

-- ---- expert-major rows <-> packed rows ---------------------------------------------------

function M.pack(x_em, counts, out)
  local total = 0
  for _, c in ipairs(counts) do total = total + c end
  out = out or tensor.empty({ total, x_em.shape[3] }, { dtype = x_em.dtype, device = x_em.device })
  local at = 0
  for e, c in ipairs(counts) do
    if c > 0 then out:narrow(1, at + 1, c):copy_(x_em:select(1, e):narrow(1, 1, c)) end
    at = at + c
  end
  return out
end

function M.unpack(xp, counts, out_em)
  local at = 0
  for e, c in ipairs(counts) do
    if c > 0 then out_em:select(1, e):narrow(1, 1, c):copy_(xp:narrow(1, at + 1, c)) end
    at = at + c
  end
  return out_em
end

return M
