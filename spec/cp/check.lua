-- spec/cp/check.lua — every context-parallel schedule against the
-- single-rank reference attention (dl.attn) on the unsharded input: out,
-- lse, dq, dk, dv (and max_logit), each rank comparing its own shard.
-- Tolerances as TransformerEngine's CP tests: bf16 2.5e-2 (GQA 3.5e-2),
-- fp16 5e-3, atol = rtol; no NaN/Inf; thd rows outside the sequences of
-- out, dq, dk, dv exactly zero. thd uses odd lengths, a 0-length sequence
-- and padding rows full of noise (a schedule that reads them fails).
-- Usage: check.lua p2p | all_gather | a2a | extras. Prints "cp check ok:
-- N configs" per rank, or "FAIL ..." lines and exits 1.
local dl = require "distlab"

local w = dl.comm.world { timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "60") }
local C, r = w.size, w.rank
local group = arg[1] or "p2p"

-- ---- inputs ------------------------------------------------------------------------

-- thd sequences for C ranks: {cu_seqlens, cu_seqlens_padded} of the full
-- input. Odd lengths, one of 1 token, one empty with 2C rows of padding and
-- one with no rows at all.
local function thd_seqs()
  local L = { 2 * C + 3, 0, 1, 0, 6 * C - 1 }
  local rows = { nil, 2 * C, nil, 0, nil }
  local cu, P = { 0 }, { 0 }
  for b, n in ipairs(L) do
    cu[b + 1] = cu[b] + n
    P[b + 1] = P[b] + (rows[b] or math.ceil(n / (2 * C)) * 2 * C)
  end
  return { cu_seqlens_q = cu, cu_seqlens_q_padded = P }
end

local function i32(t) return dl.from_table(t, { dtype = "i32" }) end

-- Full-sequence inputs of a case (same on every rank: fixed seeds).
local function inputs(cs)
  local S, B = 6 * C, 2
  local function shape(h, d)
    if cs.layout == "thd" then return { cs.seq.cu_seqlens_q_padded[#cs.seq.cu_seqlens_q_padded], h, d } end
    return cs.layout == "bshd" and { B, S, h, d } or { S, B, h, d }
  end
  local function rnd(shp, seed)
    return dl.randn(shp, { dtype = "f32", seed = seed }):to(cs.dtype)
  end
  return {
    q = rnd(shape(cs.h, cs.dqk), 11), k = rnd(shape(cs.hkv, cs.dqk), 12),
    v = rnd(shape(cs.hkv, cs.dv), 13), dout = rnd(shape(cs.h, cs.dv), 14),
  }
end

-- ---- the reference ------------------------------------------------------------------

local refs = {}
local function reference(cs)
  local key = table.concat({ cs.layout, cs.mask, cs.dtype, cs.h, cs.hkv, cs.dqk, cs.dv,
    cs.window and table.concat(cs.window, ",") or "-" }, "/")
  if refs[key] then return refs[key] end
  local x = inputs(cs)
  local o = { layout = cs.layout, mask = cs.mask, window = cs.window, return_max_logit = true }
  if cs.layout == "thd" then
    o.cu_seqlens_q, o.cu_seqlens_q_padded = i32(cs.seq.cu_seqlens_q), i32(cs.seq.cu_seqlens_q_padded)
    o.cu_seqlens_kv, o.cu_seqlens_kv_padded = o.cu_seqlens_q, o.cu_seqlens_q_padded
  end
  x.out, x.lse, x.max_logit = dl.attn.fwd(x.q, x.k, x.v, o)
  o.return_max_logit = nil
  x.dq, x.dk, x.dv = dl.attn.bwd(x.dout, x.q, x.k, x.v, x.out, x.lse, o)
  refs[key] = x
  return x
end

-- ---- one case ------------------------------------------------------------------------

local function shard(x, cs, dim)
  return dl.cp.shard(x, { comm = w, layout = cs.layout, cu_seqlens_padded = cs.seq and cs.seq.cu_seqlens_q_padded, dim = dim })
end

-- Rows of this rank's thd shard outside the sequences: {start, length} (1-based).
local function padding_rows(seq)
  local cu, P = seq.cu_seqlens_q, seq.cu_seqlens_q_padded
  local rows = {}
  for b = 1, #cu - 1 do
    local L, c = cu[b + 1] - cu[b], (P[b + 1] - P[b]) / (2 * C)
    local function valid(j) return math.max(0, math.min(c, L - j * c)) end
    local n = valid(r) + valid(2 * C - 1 - r)
    if 2 * c > n then rows[#rows + 1] = { P[b] / C + n + 1, 2 * c - n } end
  end
  return rows
end

local function describe_case(cs)
  local s = string.format("%s %s %s %s h=%d/%d d=%d/%d", cs.algo, cs.layout, cs.mask, cs.dtype, cs.h, cs.hkv, cs.dqk, cs.dv)
  if cs.algo == "p2p" then s = s .. string.format(" buffers=%s correction=%s dkv=%s", cs.comm_buffers, cs.correction, cs.dkv) end
  if cs.window then s = s .. string.format(" window={%d,%d}", cs.window[1], cs.window[2]) end
  if cs.overlap then s = s .. " overlap" end
  return s .. string.format(" C=%d rank=%d", C, r)
end

-- DISTLAB_CP_BACKEND: dl.attn's backend for every schedule (scripts/gpu/cudnn.sh: cudnn).
-- Under cudnn, the fused merges must be refused with a clear error, and a
-- configuration cuDNN itself refuses runs again on auto (listed, and counted).
local BACKEND = os.getenv("DISTLAB_CP_BACKEND") or "ours"
local refused = {}

local function run_case(cs, backend)
  backend = backend or BACKEND
  local ref = reference(cs)
  local tol = cs.dtype == "f16" and 5e-3 or (cs.h ~= cs.hkv and 3.5e-2 or 2.5e-2)
  local opts = { comm = w, algo = cs.algo, comm_buffers = cs.comm_buffers, correction = cs.correction, dkv = cs.dkv,
    layout = cs.layout, mask = cs.mask, window = cs.window, return_max_logit = true, overlap = cs.overlap,
    backend = backend }
  if backend == "cudnn" and ((cs.correction or "fused") == "fused" and cs.algo == "p2p" or cs.overlap and cs.algo == "all_gather") then
    local ok, err = pcall(dl.cp.attention, opts)
    if ok or not tostring(err):find("epilogue, which cuDNN", 1, true) then
      print("FAIL " .. describe_case(cs) .. ": backend cudnn with the fused merge gave " .. tostring(err))
      return false
    end
    return run_case(cs, "auto")
  end
  local cp = dl.cp.attention(opts)
  local q, k, v, dout = shard(ref.q, cs), shard(ref.k, cs), shard(ref.v, cs), shard(ref.dout, cs)
  local done, out, lse, ml = pcall(cp.forward, cp, q, k, v, cs.seq)
  local err, dq, dk, dv = out
  if done then
    done, dq, dk, dv = pcall(cp.backward, cp, dout)
    err = dq
  end
  if not done then
    if backend == "cudnn" and tostring(err):find("backend \"cudnn\" cannot run this call", 1, true) then
      refused[#refused + 1] = describe_case(cs) .. ": " .. tostring(err)
      return run_case(cs, "auto")
    end
    error(err, 0)
  end
  local bad = {}
  local function near(name, want, got, t)
    local rep = dl.mismatch_report(got, want, t, t, 4)
    if rep then bad[#bad + 1] = name .. ": " .. rep end
  end
  near("out", shard(ref.out, cs), out, tol)
  near("lse", shard(ref.lse, cs, cs.layout == "thd" and 2 or 3), lse, 1e-3)
  near("dq", shard(ref.dq, cs), dq, tol)
  near("dk", shard(ref.dk, cs), dk, tol)
  near("dv", shard(ref.dv, cs), dv, tol)
  near("max_logit", ref.max_logit, ml, 1e-3)
  -- and normwise, ||got - ref|| / ||ref|| in fp64, near the dtype's precision (lse: fp32)
  local function normwise(name, want, got, bound)
    local e = dl.rel_err(got, want)
    if not (e <= bound) then bad[#bad + 1] = string.format("%s: normwise error %.3g > %.3g", name, e, bound) end
  end
  local nb = cs.dtype == "f16" and 2e-3 or 1e-2
  normwise("out", shard(ref.out, cs), out, nb)
  normwise("lse", shard(ref.lse, cs, cs.layout == "thd" and 2 or 3), lse, 1e-5)
  normwise("dq", shard(ref.dq, cs), dq, nb)
  normwise("dk", shard(ref.dk, cs), dk, nb)
  normwise("dv", shard(ref.dv, cs), dv, nb)
  if cs.layout == "thd" then
    for name, t in pairs({ out = out, dq = dq, dk = dk, dv = dv }) do
      for _, pr in ipairs(padding_rows(cs.seq)) do
        local rows = t:narrow(1, pr[1], pr[2])
        local m = dl.max_abs_diff(rows, dl.zeros_like(rows))
        if m ~= 0 then bad[#bad + 1] = string.format("%s: padding rows %d..%d not zero (max %g)", name, pr[1], pr[1] + pr[2] - 1, m) end
      end
    end
  end
  if #bad > 0 then
    print("FAIL " .. describe_case(cs) .. "\n  " .. table.concat(bad, "\n  "))
    return false
  end
  return true
end

-- ---- the cases --------------------------------------------------------------------------

local function gcd(a, b) return b == 0 and a or gcd(b, a % b) end

local cases = {}
local function add(cs)
  cs.dtype, cs.h, cs.hkv = cs.dtype or "bf16", cs.h or 4, cs.hkv or cs.h or 4
  if cs.algo == "a2a" then
    -- all-to-all splits the heads over the ranks (its overlap, two head groups: an even count
    -- a rank): more ranks than the case's K/V heads take proportionally more heads of both
    -- (8 ranks sharing one GPU in scripts/gpu/suite.sh; unchanged up to 4 ranks)
    local need = cs.overlap and 2 * C or C
    local k = need / gcd(need, cs.hkv)
    cs.h, cs.hkv = cs.h * k, cs.hkv * k
  end
  cs.dqk, cs.dv = cs.dqk or 16, cs.dv or cs.dqk or 16
  if cs.layout == "thd" then cs.seq = thd_seqs() end
  cases[#cases + 1] = cs
end

local layouts, masks = { "bshd", "sbhd", "thd" }, { "causal", "none" }
if group == "p2p" then
  for _, cb in ipairs({ 2, "per_step" }) do
    for _, corr in ipairs(dl.cp.corrections.library) do
      for _, l in ipairs(layouts) do
        for _, m in ipairs(masks) do add { algo = "p2p", comm_buffers = cb, correction = corr, layout = l, mask = m } end
      end
    end
  end
  for _, l in ipairs(layouts) do
    for _, m in ipairs(masks) do add { algo = "p2p", dkv = "local", layout = l, mask = m } end
  end
elseif group == "all_gather" or group == "a2a" then
  for _, l in ipairs(layouts) do
    for _, m in ipairs(masks) do add { algo = group, layout = l, mask = m } end
  end
  -- sliding windows: the visible K/V range of a step clipped to the window
  add { algo = group, layout = "bshd", mask = "causal", window = { 4, 0 } }
  add { algo = group, layout = "sbhd", mask = "none", window = { 3, 5 } }
  add { algo = group, layout = "thd", mask = "causal", window = { 5, 0 } }
  if group == "a2a" then add { algo = group, layout = "thd", mask = "none", window = { 2, 3 } } end
  if group == "a2a" then -- two head groups in a pipeline
    for _, l in ipairs(layouts) do
      for _, m in ipairs(masks) do add { algo = group, layout = l, mask = m, overlap = true, h = 8, hkv = 8 } end
    end
    add { algo = group, layout = "sbhd", mask = "none", window = { 3, 5 }, overlap = true, h = 8, hkv = 8 }
    add { algo = group, layout = "bshd", mask = "causal", overlap = true, h = 16, hkv = 8, dqk = 24, dv = 16 }
  end
  if group == "all_gather" then -- the local K/V attended while the gathers run
    for _, l in ipairs({ "bshd", "sbhd" }) do
      for _, m in ipairs(masks) do add { algo = group, layout = l, mask = m, overlap = true } end
    end
    add { algo = group, layout = "bshd", mask = "causal", overlap = true, h = 8, hkv = 2, dqk = 24, dv = 16 }
  end
elseif group == "extras" then
  -- fp16, GQA and MLA head dims (d_v != d_qk) through every algorithm
  for _, a in ipairs({ "p2p", "all_gather", "a2a" }) do
    add { algo = a, layout = "bshd", mask = "causal", dtype = "f16" }
    add { algo = a, layout = "thd", mask = "causal", h = 8, hkv = 4 }
    add { algo = a, layout = "sbhd", mask = "none", h = 8, hkv = 4, dtype = "f16" }
    add { algo = a, layout = "bshd", mask = "causal", dqk = 24, dv = 16 }
  end
  add { algo = "p2p", correction = "incremental", layout = "thd", mask = "causal", h = 8, hkv = 2 }
  add { algo = "p2p", correction = "post_loop", comm_buffers = "per_step", layout = "sbhd", mask = "causal", h = 8, hkv = 2 }
else
  error("check.lua: unknown group " .. tostring(group))
end

-- dl.cp.shard agrees with dl.seq's dual-chunk split, and unshard inverts it
-- (also for an lse, whose sequence dim is not the layout's).
local function check_shard()
  local bad = {}
  local seq = thd_seqs()
  local P = seq.cu_seqlens_q_padded
  local x4 = dl.randn({ 2, 6 * C, 3, 8 }, { seed = 5 })
  local s4 = dl.randn({ 6 * C, 2, 3, 8 }, { seed = 8 })
  local xt = dl.randn({ P[#P], 3, 8 }, { seed = 6 })
  local lt = dl.randn({ 3, P[#P] }, { seed = 7 })
  local cases_ = {
    { x4, { layout = "bshd" }, dl.seq.dual_chunk(x4, r, C, "bshd") },
    { s4, { layout = "sbhd" }, dl.seq.dual_chunk(s4, r, C, "sbhd") },
    { xt, { layout = "thd", cu_seqlens_padded = P }, dl.seq.thd_dual_chunk(xt, i32(P), r, C) },
    { dl.randn({ 2, 3, 6 * C }, { seed = 9 }), { layout = "bshd", dim = 3 } },
    { lt, { layout = "thd", cu_seqlens_padded = P, dim = 2 } },
  }
  for i, c in ipairs(cases_) do
    c[2].comm = w
    local s = dl.cp.shard(c[1], c[2])
    if c[3] and dl.max_abs_diff(s, c[3]) ~= 0 then bad[#bad + 1] = "shard " .. i .. " differs from dl.seq's" end
    if dl.max_abs_diff(dl.cp.unshard(s, c[2]), c[1]) ~= 0 then bad[#bad + 1] = "unshard " .. i .. " is not the input" end
  end
  if #bad > 0 then print("FAIL shard/unshard C=" .. C .. " rank=" .. r .. ": " .. table.concat(bad, "; ")) end
  return #bad == 0
end

local ok, failed = 0, 0
if group == "extras" then
  if check_shard() then ok = ok + 1 else failed = failed + 1 end
end
for _, cs in ipairs(cases) do
  local good, err = pcall(run_case, cs)
  if not good then print("FAIL " .. describe_case(cs) .. "\n  error: " .. tostring(err)) end
  if good and err then ok = ok + 1 else failed = failed + 1 end
end
-- Nobody leaves before everyone is done (a peer's last receive may still be in flight).
w:barrier()
if failed > 0 then
  print(string.format("cp check failed: %d of %d configs (rank %d)", failed, ok + failed, r))
  os.exit(1)
end
for _, x in ipairs(refused) do print("refused by cudnn (ran on auto): " .. x) end
print(string.format("cp check ok: %d configs (rank %d of %d, %s, backend %s%s)", ok, r, C, group, BACKEND,
  #refused > 0 and string.format(", %d refused by cudnn", #refused) or ""))
