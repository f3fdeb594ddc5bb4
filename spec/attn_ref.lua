-- spec/attn_ref.lua — what spec/attn_spec.lua and spec/attn_merge_spec.lua
-- share: fresh clamp(randn, -1, 1) inputs, thd layouts with NaN between the
-- sequences, the naive fp64 reference (softmax(scale q k^T) v and its analytic
-- gradients, in plain Lua, for tiny shapes) and the case tables. Not a spec
-- itself (busted runs *_spec.lua only).
local ffi = require "ffi"
local assert = require "luassert"
local dl = require "distlab"
local H = require "helpers"

local SEED = tonumber(os.getenv("DISTLAB_SEED")) or os.time()
local TOL = { bf16 = 2.5e-2, f16 = 5e-3 }
-- normwise bounds, ||got - ref|| / ||ref|| in fp64, on top of TOL's element-wise ones: near the
-- dtype's precision (the LSE and max logit are fp32)
local NORM = { bf16 = 1e-2, f16 = 2e-3, lse = 1e-5 }

-- nil, or what failed of the normwise check
local function norm_differs(ref, got, bound, what)
  local e = dl.rel_err(got, ref)
  if not (e <= bound) then return string.format("%s: normwise error %.3g > %.3g", what, e, bound) end
end
local NINF = -math.huge

-- ---- inputs -------------------------------------------------------------------

local n_drawn = 0
-- clamp(randn, -1, 1) as `dtype` on cpu; rows (dim 1) listed in nan_rows are NaN.
local function clamped(shape, dtype, nan_rows)
  n_drawn = n_drawn + 1
  local t = dl.randn(shape, { dtype = "f64", seed = SEED * 4096 + n_drawn })
  local p, n = ffi.cast("double*", t:data_ptr()), t:numel()
  for i = 0, n - 1 do p[i] = math.max(-1, math.min(1, p[i])) end
  local row = shape[1] > 0 and n / shape[1] or 0
  for _, r in ipairs(nan_rows or {}) do
    for i = r * row, (r + 1) * row - 1 do p[i] = 0 / 0 end
  end
  return t:to(dtype)
end

local function prefix(lens)
  local cu = { 0 }
  for i, l in ipairs(lens) do cu[i + 1] = cu[i] + l end
  return cu
end

-- Starts of sequences laid out after `first` rows with `gap` rows after
-- each; the rows between them (the gaps) and the total.
local function rows_of(lens, first, gap)
  local starts, gaps, r = {}, {}, 0
  for _ = 1, first do gaps[#gaps + 1] = r; r = r + 1 end
  for i, l in ipairs(lens) do
    starts[i] = r
    r = r + l
    for _ = 1, gap do gaps[#gaps + 1] = r; r = r + 1 end
  end
  return starts, gaps, r
end

local function i32(values) return dl.from_table(values, { dtype = "i32" }) end

-- A case c -> inputs on cpu. c: layout, dtype, hq, hkv, dqk, dv, mask,
-- window, align, scale; bshd/sbhd: b, sq, skv; thd: q_lens, kv_lens, first
-- (rows before the first sequence) and gap (rows after each).
local function build(c)
  local x = { c = c, layout = c.layout, ql = {}, kl = {}, qs = {}, ks = {} }
  local qsh, ksh, vsh
  if c.layout == "thd" then
    x.ql, x.kl, x.b = c.q_lens, c.kv_lens, #c.q_lens
    local tq, tk
    x.qs, x.qgaps, tq = rows_of(c.q_lens, c.first or 0, c.gap or 0)
    x.ks, x.kgaps, tk = rows_of(c.kv_lens, c.first or 0, c.gap or 0)
    qsh, ksh, vsh = { tq, c.hq, c.dqk }, { tk, c.hkv, c.dqk }, { tk, c.hkv, c.dv }
    local qp, kp = { unpack(x.qs) }, { unpack(x.ks) }
    qp[#qp + 1], kp[#kp + 1] = tq, tk
    x.cu = { cu_seqlens_q = i32(prefix(c.q_lens)), cu_seqlens_kv = i32(prefix(c.kv_lens)),
      cu_seqlens_q_padded = i32(qp), cu_seqlens_kv_padded = i32(kp) }
  else
    x.b = c.b
    for i = 1, c.b do x.ql[i], x.kl[i], x.qs[i], x.ks[i] = c.sq, c.skv, 0, 0 end
    local function sh(s, h, d) return c.layout == "bshd" and { c.b, s, h, d } or { s, c.b, h, d } end
    qsh, ksh, vsh = sh(c.sq, c.hq, c.dqk), sh(c.skv, c.hkv, c.dqk), sh(c.skv, c.hkv, c.dv)
    x.cu = {}
  end
  x.q = clamped(qsh, c.dtype, x.qgaps)
  x.k = clamped(ksh, c.dtype, x.kgaps)
  x.v = clamped(vsh, c.dtype, x.kgaps)
  return x
end

-- The same inputs on device D.
local function on(x, D)
  local y = setmetatable({ q = x.q:to(D), k = x.k:to(D), v = x.v:to(D), cu = {} }, { __index = x })
  for k, t in pairs(x.cu) do y.cu[k] = t:to(D) end
  return y
end

local function opts(x, extra)
  local c = x.c
  local o = { layout = c.layout, mask = c.mask, window = c.window, align = c.align, scale = c.scale }
  for k, t in pairs(x.cu) do o[k] = t end
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- ---- the naive reference --------------------------------------------------------

local function visible_fn(c)
  local wl, wr = -1, -1
  if c.window then wl, wr = c.window[1], c.window[2] end
  local br = c.align == "bottom_right"
  if c.mask == "causal" then wr, br = 0, false end
  if c.mask == "causal_bottom_right" then wr, br = 0, true end
  return function(i, j, ql, kl)
    local sh = br and kl - ql or 0
    return j < kl and (wl < 0 or j >= i + sh - wl) and (wr < 0 or j <= i + sh + wr)
  end
end

-- A host f64 copy of t and element offsets (0-based sequence, position, head).
local function view(t, layout, starts)
  local h = t:to({ dtype = "f64", device = "cpu" }):contiguous()
  local st = h:stride()
  local off
  if layout == "bshd" then off = function(b, i, hh) return b * st[1] + i * st[2] + hh * st[3] end
  elseif layout == "sbhd" then off = function(b, i, hh) return i * st[1] + b * st[2] + hh * st[3] end
  else off = function(b, i, hh) return (starts[b + 1] + i) * st[1] + hh * st[2] end end
  return { t = h, p = ffi.cast("double*", h:data_ptr()), off = off }
end

local function lse_view(t, thd, starts)
  local h = t:to({ dtype = "f64", device = "cpu" }):contiguous()
  local st = h:stride()
  local off = thd and function(b, i, hh) return hh * st[1] + (starts[b + 1] + i) * st[2] end
    or function(b, i, hh) return b * st[1] + hh * st[2] + i * st[3] end
  return { t = h, p = ffi.cast("double*", h:data_ptr()), off = off }
end

local function dot(a, ao, b, bo, n)
  local s = 0
  for c = 0, n - 1 do s = s + a.p[ao + c] * b.p[bo + c] end
  return s
end

-- Visits every (sequence, q head, row, visible key) with the scaled logit.
local function each_logit(x, fn_row, fn_key)
  local c = x.c
  local vis, scale = visible_fn(c), c.scale or 1 / math.sqrt(c.dqk)
  local Q, K = view(x.q, x.layout, x.qs), view(x.k, x.layout, x.ks)
  for b = 0, x.b - 1 do
    local ql, kl = x.ql[b + 1], x.kl[b + 1]
    for hq = 0, c.hq - 1 do
      local hk = math.floor(hq / (c.hq / c.hkv))
      for i = 0, ql - 1 do
        local s = {}
        for j = 0, kl - 1 do
          if vis(i, j, ql, kl) then s[j] = scale * dot(Q, Q.off(b, i, hq), K, K.off(b, j, hk), c.dqk) end
        end
        fn_row(b, hq, hk, i, s, scale)
      end
    end
  end
end

-- out, lse, max_logit of softmax(scale q k^T) v, in the kernel's shapes.
local function ref_fwd(x, out_like, lse_like)
  local c = x.c
  local O = view(dl.zeros(out_like.shape, "f64"), x.layout, x.qs)
  local L = lse_view(dl.full(lse_like.shape, NINF, "f64"), x.layout == "thd", x.qs)
  local M = dl.full({ c.hq }, NINF, "f64")
  local mp = ffi.cast("double*", M:data_ptr())
  local V = view(x.v, x.layout, x.ks)
  each_logit(x, function(b, hq, hk, i, s)
    local m = NINF
    for _, v in pairs(s) do m = math.max(m, v) end
    if m == NINF then return end
    local l = 0
    for _, v in pairs(s) do l = l + math.exp(v - m) end
    local lse, oo = m + math.log(l), O.off(b, i, hq)
    L.p[L.off(b, i, hq)] = lse
    mp[hq] = math.max(mp[hq], m)
    for j, v in pairs(s) do
      local w, vo = math.exp(v - lse), V.off(b, j, hk)
      for cc = 0, c.dv - 1 do O.p[oo + cc] = O.p[oo + cc] + w * V.p[vo + cc] end
    end
  end)
  return { out = O.t, lse = L.t, max_logit = M }
end

-- dq, dk, dv of sum(dout * out), given the out and lse the kernel is handed.
local function ref_bwd(x, dout, out, lse)
  local c = x.c
  local dO, Ov = view(dout, x.layout, x.qs), view(out, x.layout, x.qs)
  local Lv = lse_view(lse, x.layout == "thd", x.qs)
  local Q, K, V = view(x.q, x.layout, x.qs), view(x.k, x.layout, x.ks), view(x.v, x.layout, x.ks)
  local dQ = view(dl.zeros(x.q.shape, "f64"), x.layout, x.qs)
  local dK = view(dl.zeros(x.k.shape, "f64"), x.layout, x.ks)
  local dV = view(dl.zeros(x.v.shape, "f64"), x.layout, x.ks)
  each_logit(x, function(b, hq, hk, i, s, scale)
    local L = Lv.p[Lv.off(b, i, hq)]
    if L == NINF then return end
    local qo, oo = Q.off(b, i, hq), dO.off(b, i, hq)
    local D = dot(dO, oo, Ov, Ov.off(b, i, hq), c.dv)
    for j, v in pairs(s) do
      local P, ko, vo = math.exp(v - L), K.off(b, j, hk), V.off(b, j, hk)
      local dS = P * (dot(dO, oo, V, vo, c.dv) - D)
      for cc = 0, c.dqk - 1 do
        dQ.p[qo + cc] = dQ.p[qo + cc] + scale * dS * K.p[ko + cc]
        dK.p[ko + cc] = dK.p[ko + cc] + scale * dS * Q.p[qo + cc]
      end
      for cc = 0, c.dv - 1 do dV.p[vo + cc] = dV.p[vo + cc] + P * dO.p[oo + cc] end
    end
  end)
  return dQ.t, dK.t, dV.t
end

-- ---- running and checking one case ------------------------------------------------

local function assert_rows_zero(t, rows, what)
  for _, r in ipairs(rows or {}) do
    local row = t:narrow(1, r + 1, 1)
    assert.tensor_near(dl.zeros(row.shape, "f64"), row, 0, 0)
  end
end

-- fwd + bwd on D, against the Lua reference (cpu) or the cpu twin (cuda).
local function check_case(c, D)
  local x = build(c)
  local y = on(x, D)
  local out, lse, ml = dl.attn.fwd(y.q, y.k, y.v, opts(y, { return_max_logit = true }))
  local dout = clamped(out.shape, c.dtype, x.qgaps)
  local dq, dk, dv = dl.attn.bwd(dout:to(D), y.q, y.k, y.v, out, lse, opts(y))
  local r, rdq, rdk, rdv
  if D == "cpu" then
    r = ref_fwd(x, out, lse)
    rdq, rdk, rdv = ref_bwd(x, dout, out, lse)
  else
    local o, l, m = dl.attn.fwd(x.q, x.k, x.v, opts(x, { return_max_logit = true }))
    r = { out = o, lse = l, max_logit = m }
    rdq, rdk, rdv = dl.attn.bwd(dout, x.q, x.k, x.v, out:cpu(), lse:cpu(), opts(x))
  end
  local tol = TOL[c.dtype]
  assert.tensor_near(r.out, out, tol, tol)
  assert.tensor_near(r.lse, lse, tol, tol)
  assert.tensor_near(r.max_logit, ml, tol, tol)
  assert.tensor_near(rdq, dq, tol, tol)
  assert.tensor_near(rdk, dk, tol, tol)
  assert.tensor_near(rdv, dv, tol, tol)
  local norm = NORM[c.dtype]
  local bad = norm_differs(r.out, out, norm, "out") or norm_differs(r.lse, lse, NORM.lse, "lse") or
    norm_differs(r.max_logit, ml, NORM.lse, "max_logit") or norm_differs(rdq, dq, norm, "dq") or
    norm_differs(rdk, dk, norm, "dk") or norm_differs(rdv, dv, norm, "dv")
  assert(not bad, bad)
  assert_rows_zero(out, x.qgaps)
  assert_rows_zero(dq, x.qgaps)
  assert_rows_zero(dk, x.kgaps)
  assert_rows_zero(dv, x.kgaps)
  return x, y, out, lse
end

local function with(base, over)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(over) do c[k] = v end
  return c
end

local function describe_case(c)
  local s = string.format("%s %s hq=%d hkv=%d d=%d/%d", c.layout, c.dtype, c.hq, c.hkv, c.dqk, c.dv)
  if c.layout == "thd" then
    s = s .. string.format(" q_lens={%s} kv_lens={%s} first=%d gap=%d", table.concat(c.q_lens, ","),
      table.concat(c.kv_lens, ","), c.first or 0, c.gap or 0)
  else
    s = s .. string.format(" b=%d sq=%d skv=%d", c.b, c.sq, c.skv)
  end
  s = s .. " mask=" .. (c.mask or "none")
  if c.window then s = s .. string.format(" window={%d,%d}", c.window[1], c.window[2]) end
  if c.align then s = s .. " align=" .. c.align end
  if c.scale then s = s .. " scale=" .. c.scale end
  return s
end

-- Tiny shapes for the Lua reference; lengths 0 and 1, q != kv lengths so
-- the two alignments differ, padded offsets not at 0.
local TINY = {
  bshd = { layout = "bshd", b = 2, sq = 5, skv = 7, hq = 4, hkv = 2, dqk = 16, dv = 16 },
  thd = { layout = "thd", q_lens = { 3, 0, 1, 6 }, kv_lens = { 5, 2, 1, 4 }, first = 3, gap = 2,
    hq = 4, hkv = 2, dqk = 16, dv = 16 },
}
TINY.sbhd = with(TINY.bshd, { layout = "sbhd" })

local function cases(big)
  local list = {}
  local function add(c) list[#list + 1] = c end
  local shapes = big and {
    bshd = { layout = "bshd", b = 2, sq = 200, skv = 333, hq = 4, hkv = 2, dqk = 64, dv = 64 },
    thd = { layout = "thd", q_lens = { 0, 1, 127, 129, 300 }, kv_lens = { 64, 1, 130, 127, 300 },
      first = 5, gap = 3, hq = 4, hkv = 2, dqk = 64, dv = 64 },
  } or TINY
  shapes.sbhd = with(shapes.bshd, { layout = "sbhd" })
  for _, layout in ipairs({ "bshd", "sbhd", "thd" }) do
    for _, dtype in ipairs({ "bf16", "f16" }) do
      for _, mask in ipairs({ "none", "causal", "causal_bottom_right" }) do
        add(with(shapes[layout], { dtype = dtype, mask = mask }))
      end
    end
    local s = with(shapes[layout], { dtype = "bf16" })
    add(with(s, { window = { 2, 1 } }))
    add(with(s, { window = { 2, 1 }, align = "bottom_right" }))
    add(with(s, { window = { 3, 0 }, mask = "causal" }))
    add(with(s, { window = { 3, 0 }, mask = "causal_bottom_right" }))
    add(with(s, { window = { -1, 2 } }))
    add(with(s, { hkv = 1, mask = "causal" }))                 -- MQA
    add(with(s, { hkv = 4, scale = 0.3 }))                     -- MHA, explicit scale
    add(with(s, { dqk = 192, dv = 128, mask = "causal" }))     -- MLA
  end
  -- no keys at all: out 0, lse -inf, dq 0 (k, v have no rows)
  add(with(shapes.bshd, { dtype = "bf16", skv = 0, mask = "causal_bottom_right" }))
  local none = {}
  for i = 1, #shapes.thd.q_lens do none[i] = 0 end
  add(with(shapes.thd, { dtype = "f16", kv_lens = none, first = 0, gap = 0 }))
  if big then
    for _, d in ipairs({ 128, 256 }) do
      add(with(shapes.bshd, { dtype = "bf16", dqk = d, dv = d, mask = "causal" }))
      add(with(shapes.thd, { dtype = "f16", dqk = d, dv = d, mask = "causal_bottom_right" }))
    end
  end
  return list
end

return {
  SEED = SEED,
  TOL = TOL,
  NORM = NORM,
  norm_differs = norm_differs,
  NINF = NINF,
  n_drawn = n_drawn,
  clamped = clamped,
  prefix = prefix,
  rows_of = rows_of,
  i32 = i32,
  build = build,
  on = on,
  opts = opts,
  visible_fn = visible_fn,
  view = view,
  lse_view = lse_view,
  dot = dot,
  each_logit = each_logit,
  ref_fwd = ref_fwd,
  ref_bwd = ref_bwd,
  assert_rows_zero = assert_rows_zero,
  check_case = check_case,
  with = with,
  describe_case = describe_case,
  TINY = TINY,
  cases = cases,
}
