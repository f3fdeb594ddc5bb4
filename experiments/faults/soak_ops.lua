-- experiments/faults/soak_ops.lua — the four kinds of op the soak mixes
-- (experiments/faults/soak.lua), each a table {name, variants, draw, run, label, shape}:
--   variants(ctx) -> list         every variant of the kind (an algorithm, a layout x output x
--                                 dtype x one launch or two, an overlap option table, a CP
--                                 preset x layout)
--   draw(rng, ctx, big[, v]) -> case   v (default: one drawn) with shapes drawn from the
--                                 soak's RNG (the same numbers on every rank); big: every
--                                 size at its largest (the first pass runs every variant so,
--                                 so that the high-water marks are reached before memory is
--                                 judged)
--   run(case, ctx) -> ops, wrong, elements, msg
--                                 the case made, run ctx.reps times on fresh data, every
--                                 result checked against an fp64 reference on the host,
--                                 everything it made freed (buffers, ops, tensors)
-- ctx: {w, N, me, dev, gpu, reps, plant = {[kind] = verify.parse_plant(...)}}.
-- Every reference is one the benches and specs use, computed from inputs that
-- every rank draws again from their seeds (none reads the op's own output):
--   allreduce  the fp64 sum of every rank's normal(0, 1) input, at windows spread over the
--              result (verify.normal_sum); spec/allreduce/common.lua's element bounds per
--              dtype, normwise 1e-2 (bf16) / 2e-3 (f16) / 1e-5 (f32), bias 2^-10
--   ep         distlab.bench.ep_ref: every row every expert (or source) received (counts
--              exact, bf16 rows bit-exact, fp8 within its bound), and the combine against
--              the fp64 sum of the experts' outputs (COMBINE_TOL)
--   overlap    fp64 rows of A @ B (verify.matmul_rows) at rows spread over the result,
--              with distlab.bench.gemm_check's bounds (tol; tol_rs and its per-element
--              allowances for the reduce-scatter); each rep scales A by a new power of two
--              (exact), so a result an earlier rep left behind is off by a factor
--   cp         distlab.bench.cp_check: fp64 single-rank attention at sampled rows (out, lse,
--              dq; dk and dv at key rows), the results gathered to whole sequences
-- Outputs are poisoned (NaN) before each run, or, where the op allocates them, after
-- their check (a block it hands back to the allocator then holds no right answer).
-- Tolerances: the references' own element-wise bounds; their normwise and bias bounds,
-- made for the benches' large shapes, widened for the soak's many small random ones
-- (SOAK_TOL: normwise x 1.5, bias at most 4e-3, from 1024 elements), where 2^-10 failed
-- on rounding's own noise (an fp8 combine of 1024 values: bias -1.01e-3; a CP dq at
-- S = 32: normwise 8.3e-3 against 8e-3). A 2% scale error still fails both. CP's rows
-- are the bias's samples (verify's tol.rows: the bound grows to 6 standard errors over
-- the rows where they are few and noisy); an all-reduce's normwise error is judged from
-- NORM_MIN elements (one f32 element that is a near-cancelling sum of 4 has a relative
-- error of 1.8e-5 against 1e-5, within its element-wise bound).
local ffi = require "ffi"
local dl = require "distlab"
local verify = require "distlab.bench.verify"
local ep_ref = require "distlab.bench.ep_ref"
local gemm_check = require "distlab.bench.gemm_check"
local cpc = require "distlab.bench.cp_check"
local presets = require "distlab.cp.presets"

local M = {}

-- ---- the RNG (Park-Miller: the same numbers on every rank and machine) ------------------------

local Rng = {}
Rng.__index = Rng

function M.rng(seed)
  local s = math.floor(seed) % 2147483647
  if s <= 0 then s = s + 2147483646 end
  return setmetatable({ s = s }, Rng)
end

function Rng:next()
  self.s = (self.s * 48271) % 2147483647
  return self.s
end
function Rng:int(lo, hi) return lo + self:next() % (hi - lo + 1) end
-- log-uniform in [lo, hi]: small and large sizes alike
function Rng:log_int(lo, hi)
  local u = (self:next() - 1) / 2147483646
  return math.max(lo, math.min(hi, math.floor(math.exp(math.log(lo) + u * (math.log(hi + 1) - math.log(lo))))))
end
function Rng:pick(list) return list[self:int(1, #list)] end
function Rng:chance(p) return (self:next() - 1) / 2147483646 < p end

-- ---- helpers ----------------------------------------------------------------------------------

local function planted(ctx, kind, fn, o) return verify.planted(fn, ctx.plant[kind], o) end

local SOAK_NORM, SOAK_BIAS, NORM_MIN = 1.5, 4e-3, 64
-- a bench's tolerance table, widened for the soak
local function soak_tol(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  if out.norm then out.norm = out.norm * SOAK_NORM end
  if out.bias then out.bias = math.max(out.bias, SOAK_BIAS) end
  return out
end
M.soak_tol = soak_tol

local function poisoned(shape, dtype, dev)
  return verify.poison(dl.empty(shape, { dtype = dtype, device = dev }))
end

-- at most 3 messages per step
local function note(msgs, m) if m and #msgs < 3 then msgs[#msgs + 1] = m end end

-- ---- all-reduce ---------------------------------------------------------------------------------

local AR_TOL = {
  bf16 = { rtol = 2 ^ -7, atol = 1e-2, norm = 1e-2 },
  f16 = { rtol = 2 ^ -10, atol = 2e-3, norm = 2e-3 },
  f32 = { rtol = 1e-5, atol = 1e-5, norm = 1e-5 },
}

M.allreduce = { name = "allreduce" }

function M.allreduce.variants()
  local out = {}
  for _, a in ipairs(dl.allreduce.algos) do out[#out + 1] = { algo = a } end
  return out
end

function M.allreduce.draw(rng, ctx, big, v)
  v = v or rng:pick(M.allreduce.variants(ctx))
  local maxn = ctx.gpu and 2 ^ 24 or 2 ^ 16
  return { algo = v.algo, dtype = big and "f32" or rng:pick { "bf16", "f16", "f32" },
    n = big and maxn or rng:log_int(1, maxn), out_of_place = rng:chance(0.5), seed = rng:int(1, 2 ^ 20) }
end

function M.allreduce.label(c) return c.algo end
function M.allreduce.shape(c) return string.format("%s n=%d%s", c.dtype, c.n, c.out_of_place and " out" or "") end

function M.allreduce.run(c, ctx)
  local N, me = ctx.N, ctx.me
  local t = AR_TOL[c.dtype]
  local tol = { rtol = t.rtol, atol = t.atol * N, norm = c.n >= NORM_MIN and t.norm or nil, bias = SOAK_BIAS }
  local checked, width = ctx.gpu and 16384 or 4096, ctx.gpu and 512 or 256
  local wrong, elements, msgs = 0, 0, {}
  for rep = 1, ctx.reps do
    local seeds = {}
    for r = 0, N - 1 do seeds[r + 1] = (c.seed * 16 + rep) * 64 + r end
    local x = dl.randn({ c.n }, { dtype = c.dtype, seed = seeds[me + 1], device = ctx.dev })
    local out = c.out_of_place and poisoned({ c.n }, c.dtype, ctx.dev) or x
    planted(ctx, "allreduce", function() dl.allreduce.run(x, { algo = c.algo, out = c.out_of_place and out or nil }) end,
      { writes = { out } })()
    local wins = verify.windows(c.n, checked, width, seeds[me + 1])
    local n, msg = verify.close(verify.take(out, wins), verify.normal_sum(c.dtype, seeds, wins), tol)
    wrong, elements = wrong + n, elements + math.min(c.n, checked)
    if n > 0 then note(msgs, string.format("rep %d: %s", rep, msg)) end
  end
  return ctx.reps, wrong, elements, table.concat(msgs, "; ")
end

-- ---- EP dispatch and combine --------------------------------------------------------------------

M.ep = { name = "ep" }

function M.ep.variants()
  local out = {}
  for _, layout in ipairs { "per_rank", "per_expert" } do
    for _, output in ipairs { "expert_major", "rank_major" } do
      for _, dtype in ipairs { "bf16", "fp8" } do
        for _, split in ipairs { false, true } do
          out[#out + 1] = { layout = layout, output = output, dtype = dtype, split = split }
        end
      end
    end
  end
  return out
end

function M.ep.draw(rng, ctx, big, v)
  v = v or rng:pick(M.ep.variants(ctx))
  local Hs = ctx.gpu and { 128, 256, 512, 1024, 2048, 4096 } or { 128, 256 }
  local Ls = ctx.gpu and { 1, 2, 4, 8 } or { 1, 2 }
  local L = big and Ls[#Ls] or rng:pick(Ls)
  local E = L * ctx.N
  local Bmax = ctx.gpu and 64 or 8
  return { layout = v.layout, output = v.output, dtype = v.dtype, split = v.split, H = big and Hs[#Hs] or rng:pick(Hs), E = E,
    K = big and math.min(8, E) or rng:int(1, math.min(8, E)), B = big and Bmax or rng:log_int(1, Bmax),
    seed = rng:int(1, 2 ^ 20), tokens = rng:int(1, 2 ^ 20) }
end

function M.ep.label(c) return string.format("%s %s %s%s", c.layout, c.output, c.dtype, c.split and " send/recv" or "") end
function M.ep.shape(c) return string.format("B=%d H=%d E=%d K=%d", c.B, c.H, c.E, c.K) end

-- Rank `rank`'s inputs of call `seed` on the host: x normal bf16, K distinct experts per
-- token uniformly among all E, weights f32 multiples of 1/997 (ep_bench's fresh inputs).
local function ep_inputs(c, T, seed, rank)
  local K, E = c.K, c.E
  local idx = dl.empty({ T, K }, { dtype = "i32", device = "cpu" })
  local p = ffi.cast("int32_t*", idx:data_ptr())
  local s = (seed * 7919 + rank * 104729 + 13) % 2147483647
  for t = 0, T - 1 do
    for k = 0, K - 1 do
      local e, dup
      repeat
        s = (s * 48271) % 2147483647
        e = s % E
        dup = false
        for j = 0, k - 1 do dup = dup or p[t * K + j] == e end
      until not dup
      p[t * K + k] = e
    end
  end
  local w = dl.empty({ T, K }, { dtype = "f32", device = "cpu" })
  local pw = ffi.cast("float*", w:data_ptr())
  for i = 0, T * K - 1 do
    s = (s * 48271) % 2147483647
    pw[i] = (s % 1000 + 1) / 997
  end
  local x = dl.randn({ T, c.H }, { dtype = "bf16", seed = seed * 131 + rank + 1, device = "cpu" })
  return { x = x, idx = idx, w = w, s = rank }
end
jit.off(ep_inputs)

function M.ep.run(c, ctx)
  local N, me, dev = ctx.N, ctx.me, ctx.dev
  local ep = dl.ep.buffer { comm = ctx.w, max_tokens = c.B, hidden = c.H, experts = c.E, topk = c.K, layout = c.layout,
    output = c.output, dtype = c.dtype }
  local o = { N = N, me = me, E = c.E, B = c.B, H = c.H, K = c.K, output = c.output, dtype = c.dtype }
  local wrong, elements, msgs = 0, 0, {}
  local trng = M.rng(c.tokens)
  for rep = 1, ctx.reps do
    -- every rank its own token count (1 .. B), known to all from the case's seed
    local counts = {}
    for r = 0, N - 1 do counts[r + 1] = trng:int(1, c.B) end
    local seed = c.seed * 16 + rep
    local all = {}
    for s = 0, N - 1 do all[s + 1] = ep_inputs(c, counts[s + 1], seed, s) end
    local mine = all[me + 1]
    local x, idx, wts = mine.x:to(dev), mine.idx:to(dev), mine.w:to(dev)
    for _, t in pairs(ep.tensors or {}) do verify.poison(t) end
    local recv, h
    if c.split then
      h = ep:dispatch_send(x, idx, wts)
      recv = ep:dispatch_recv(h)
    else
      recv, h = ep:dispatch(x, idx, wts)
    end
    local bad, msg, el = ep_ref.check_dispatch(o, recv, all)
    if bad > 0 then note(msgs, string.format("rep %d dispatch: %s", rep, msg)) end
    -- the experts' outputs, made on the host from what arrived
    local y = dl.zeros(recv.x:size(), { dtype = "bf16", device = dev })
    for slot, e in pairs(ep_ref.expert_outputs(o, recv)) do y:select(1, slot + 1):narrow(1, 1, e.rows):copy_(e.y) end
    local out = poisoned({ counts[me + 1], c.H }, "bf16", dev)
    planted(ctx, "ep", function()
      if c.split then
        ep:combine_send(y, h)
        ep:combine_recv(h, out)
      else
        ep:combine(y, h, { out = out })
      end
    end, { writes = { out } })()
    local nc, cmsg = verify.close(out, ep_ref.combine_ref(o, mine), soak_tol(ep_ref.COMBINE_TOL))
    if nc > 0 then note(msgs, string.format("rep %d combine: %s", rep, cmsg)) end
    wrong, elements = wrong + bad + nc, elements + el + out:numel()
  end
  ep:check()
  ep:free()
  return 2 * ctx.reps, wrong, elements, table.concat(msgs, "; ")
end

-- ---- all-gather + GEMM, GEMM + reduce-scatter -------------------------------------------------

M.overlap = { name = "overlap" }

function M.overlap.variants()
  local out = {}
  for _, kind in ipairs { "ag", "rs" } do
    for _, o in ipairs(dl.overlap.variants(kind, { 1, 2 })) do out[#out + 1] = { kind = kind, v = o } end
  end
  return out
end

function M.overlap.draw(rng, ctx, big, var)
  var = var or rng:pick(M.overlap.variants(ctx))
  local kind, v = var.kind, var.v
  local rmax, kmax, nmax = ctx.gpu and 512 or 16, ctx.gpu and 1024 or 64, ctx.gpu and 1024 or 64
  if kind == "rs" then kmax = math.max(8, kmax / ctx.N) end -- k per rank
  return { kind = kind, v = v, dtype = rng:chance(0.25) and "f16" or "bf16", rows = big and rmax or rng:log_int(1, rmax),
    k = big and kmax or rng:log_int(8, kmax), n = big and nmax or rng:log_int(8, nmax), seed = rng:int(1, 2 ^ 20) }
end

function M.overlap.label(c)
  local v = c.v
  return (c.kind == "ag" and "ag_gemm " or "gemm_rs ") ..
    (v.transport and string.format("%s %s %s x%d", v.algo, v.transport, v.copy, v.streams) or v.algo)
end
function M.overlap.shape(c) return string.format("%s rows=%d k=%d n=%d", c.dtype, c.rows, c.k, c.n) end

function M.overlap.run(c, ctx)
  local d, me, dev, rows, n = ctx.N, ctx.me, ctx.dev, c.rows, c.n
  local o = { comm = ctx.w }
  for key, val in pairs(c.v) do o[key] = val end
  local op = c.kind == "ag" and dl.overlap.ag_gemm(o) or dl.overlap.gemm_rs(o)
  -- the whole A [d rows, kk] and B [kk, n] on the host (every rank draws them all), this
  -- rank's operands on the device: ag a = its rows of A, b = B; rs a = its k columns of A,
  -- b = its k rows of B (spec/overlap/common.lua's cases)
  local kk = c.kind == "ag" and c.k or d * c.k
  local A = dl.randn({ d * rows, kk }, { dtype = c.dtype, device = "cpu", seed = c.seed * 8 })
  local B = dl.randn({ kk, n }, { dtype = c.dtype, device = "cpu", seed = c.seed * 8 + 1 })
  local a, b
  if c.kind == "ag" then
    a, b = A:narrow(1, me * rows + 1, rows):contiguous():to(dev), B:to(dev)
  else
    a = A:narrow(2, me * c.k + 1, c.k):contiguous():to(dev)
    b = B:narrow(1, me * c.k + 1, c.k):contiguous():to(dev)
  end
  -- the reference at rows spread over the result (ag: C [d rows, n]; rs: this rank's block)
  local out_rows = c.kind == "ag" and d * rows or rows
  local picked = verify.spread(out_rows, math.min(out_rows, 2 * d + 2), c.seed + me)
  local at, wins = {}, {}
  for i, x in ipairs(picked) do
    at[i] = (c.kind == "rs" and me * rows or 0) + x + 1
    wins[i] = { x * n, n }
  end
  local ref, allow, tol
  if c.kind == "ag" then
    ref, tol = verify.matmul_rows(A, B, at), soak_tol(gemm_check.tol(c.dtype))
  else
    local S, rms
    ref, S, rms = verify.matmul_rows(A, B, at, { parts = d })
    -- gemm_check's allowance: (2d - 1) u S + (k/d + 4) 2^-20 sum_p rms(P_p) per element
    allow = S:mul_((2 * d - 1) * gemm_check.U[c.dtype])
    for i = 1, #at do allow:narrow(1, i, 1):add_((c.k + 4) * 2 ^ -20 * rms[i]) end
    allow = allow:reshape(allow:numel())
    tol = soak_tol(gemm_check.tol_rs(c.dtype, d))
  end
  ref = ref:reshape(ref:numel())
  local wrong, elements, msgs, sc = 0, 0, {}, 1
  -- (under --plant noop the op never runs: an op that never ran has nothing to wait for or free,
  -- and overlap's free of one fails)
  local ran = false
  for rep = 1, ctx.reps do
    -- A times the next power of two (-1/2, 1, -2, 1/4, ...): exact, the result scales with it
    local next_sc = (rep % 2 == 1 and -1 or 1) * 2 ^ (rep % 4 - 2)
    a:mul_(next_sc / sc)
    sc = next_sc
    local out = poisoned({ out_rows, n }, c.dtype, dev)
    planted(ctx, "overlap", function()
      op:run(a, b, out)
      ran = true
    end, { writes = { out } })()
    if ran then op:check() end
    local tl = {}
    for key, val in pairs(tol) do tl[key] = val end
    if allow then tl.allow = allow:clone():mul_(math.abs(sc)) end
    local nw, msg = verify.close(verify.take(out, wins), ref:clone():mul_(sc), tl)
    if nw > 0 then note(msgs, string.format("rep %d: %s", rep, msg)) end
    wrong, elements = wrong + nw, elements + #at * n
  end
  if ran then op:free() end
  return ctx.reps, wrong, elements, table.concat(msgs, "; ")
end

-- ---- CP attention, forward and backward -------------------------------------------------------

M.cp = { name = "cp" }

function M.cp.variants()
  local out = {}
  for _, layout in ipairs { "bshd", "sbhd", "thd" } do
    for _, st in ipairs(presets.list) do
      if presets.applies(st, layout) then out[#out + 1] = { layout = layout, preset = st } end
    end
  end
  return out
end

function M.cp.draw(rng, ctx, big, v)
  v = v or rng:pick(M.cp.variants(ctx))
  -- every padded length a multiple of 2C (the dual-chunk split); heads a multiple of 2C
  -- (a2a with overlap: an even number of heads per rank)
  local chunks = ctx.gpu and { 16, 32, 64, 128, 256, 512 } or { 4, 8, 16 }
  return { preset = v.preset, layout = v.layout, B = big and 2 or rng:int(1, 2),
    S = 2 * ctx.N * (big and chunks[#chunks] or rng:pick(chunks)),
    H = 2 * ctx.N * ((not ctx.gpu and 1) or (big and 2) or rng:int(1, 2)),
    D = big and 128 or rng:pick { 64, 128 }, seed = rng:int(1, 2 ^ 20) }
end

function M.cp.label(c) return c.preset.name .. " (" .. c.layout .. ")" end
function M.cp.shape(c) return string.format("B=%d S=%d H=%d D=%d", c.B, c.S, c.H, c.D) end

-- attn_rows's tolerances (rows.TOL, which every check reads), widened in this process
local rows_tol = require("distlab.bench.attn_rows").TOL
for k, t in pairs(rows_tol) do rows_tol[k] = soak_tol(t) end

function M.cp.run(c, ctx)
  local x = cpc.inputs { layout = c.layout, B = c.B, S = c.S, H = c.H, D = c.D, seed = c.seed }
  -- rows of d elements: 128 query rows on cuda (32 a rank), 32 on cpu (8 a rank); the bias is
  -- judged over rows (attn_rows), and 8 a rank on cuda let rounding alone pass 4e-3 (4.6e-3)
  local check = cpc.new { inputs = x, comm = ctx.w, elements = ctx.gpu and 16384 or 4096, seed = c.seed }
  local o = presets.options(c.preset)
  o.comm, o.layout, o.mask = ctx.w, c.layout, "causal"
  local cp = dl.cp.attention(o)
  local s = check:shards(ctx.w)
  local run = planted(ctx, "cp", function()
    local out, lse = cp:forward(s.q, s.k, s.v, x.seq)
    local dq, dk, dv = cp:backward(s.dout)
    return out, lse, dq, dk, dv
  end, { returns = true })
  local wrong, elements, msgs = 0, 0, {}
  for rep = 1, ctx.reps do
    local res = { run() }
    local n, msg = check:check(ctx.w, unpack(res))
    if n > 0 then note(msgs, string.format("rep %d: %s", rep, msg)) end
    for _, t in ipairs(res) do verify.poison(t) end
    cp:release()
    wrong, elements = wrong + n, elements + check.ref.nq * (2 * c.D + 1)
  end
  return 2 * ctx.reps, wrong, elements, table.concat(msgs, "; ")
end

M.kinds = { "allreduce", "ep", "overlap", "cp" }

return M
