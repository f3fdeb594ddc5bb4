-- dl.attn: the attention step and the merges, on fresh clamp(randn, -1, 1)
-- inputs. On cpu the kernel is the fp64 twin, so it is checked against a
-- naive softmax(scale q k^T) v written here in plain Lua (and its analytic
-- gradients), on tiny shapes. On cuda (#gpu) the kernels are checked against
-- the cpu twin on the same inputs, plus shapes beyond one tile. Tolerances
-- are TransformerEngine's CP ones (atol = rtol): bf16 2.5e-2, fp16 5e-3.
-- thd inputs carry NaN in the rows between sequences, which must be neither
-- read nor written: outputs there are exactly 0 (lse -inf).
-- Merges are checked to reproduce attention over the union of their parts.
-- Seed: DISTLAB_SEED, else the clock (shown in the describe names).
local ffi = require "ffi"
local dl = require "distlab"
local H = require "helpers"

local SEED = tonumber(os.getenv("DISTLAB_SEED")) or os.time()
local TOL = { bf16 = 2.5e-2, f16 = 5e-3 }
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

-- ---- specs ------------------------------------------------------------------------

for _, dev in ipairs(H.devices) do
  local D = dev.name
  describe(string.format("attn step on %s (seed %d)%s", D, SEED, dev.tag), function()
    for _, c in ipairs(cases(false)) do
      it(describe_case(c), function() check_case(c, D) end)
    end
    if D ~= "cpu" then
      for _, c in ipairs(cases(true)) do
        it("beyond a tile: " .. describe_case(c), function() check_case(c, D) end)
      end
    end

    it("detects a wrong mask (the check can fail)", function()
      local c = with(TINY.bshd, { dtype = "bf16", mask = "causal" })
      local x = build(c)
      local out = dl.attn.fwd(x.q:to(D), x.k:to(D), x.v:to(D), opts(x))
      local r = ref_fwd(with(x, { c = with(c, { mask = "causal_bottom_right" }) }), out, dl.zeros(2, 4, 5))
      assert.is_false(dl.allclose(out, r.out, { atol = 2.5e-2, rtol = 2.5e-2 }))
    end)

    it("takes strided views and writes preallocated out/lse, leaving other rows alone", function()
      local c = with(TINY.thd, { dtype = "bf16", mask = "causal" })
      local x = on(build(c), D)
      local qv = dl.zeros(x.q.shape[1], 2 * c.hq, c.dqk, { dtype = "bf16", device = D }):narrow(2, 3, c.hq)
      qv:copy_(x.q)
      local rows = x.q.shape[1]
      local out = dl.full({ rows, c.hq, c.dv }, 7, { dtype = "bf16", device = D })
      local lse = dl.full({ c.hq, rows }, 7, { dtype = "f32", device = D })
      local o2, l2 = dl.attn.fwd(qv, x.k, x.v, opts(x, { out = out, lse = lse }))
      assert.equal(out, o2)
      assert.equal(lse, l2)
      local r = ref_fwd(x, out, lse)
      for _, g in ipairs(x.qgaps) do
        assert.tensor_near(dl.full({ 1, c.hq, c.dv }, 7), out:narrow(1, g + 1, 1), 0, 0)
        assert.tensor_near(dl.full({ c.hq, 1 }, 7), lse:narrow(2, g + 1, 1), 0, 0)
      end
      for b = 1, x.b do
        if x.ql[b] > 0 then
          assert.tensor_near(r.out:narrow(1, x.qs[b] + 1, x.ql[b]), out:narrow(1, x.qs[b] + 1, x.ql[b]), 2.5e-2, 2.5e-2)
        end
      end
    end)

    -- All-gather CP over thd: the whole local q goes to every step, per-step
    -- padded offsets pick each sequence's chunk (step 2's start at 4, not 0),
    -- results land in one full out/lse and dq; dk, dv accumulate over steps.
    it("runs all-gather CP steps on one full q through per-step padded offsets", function()
      local x = on(build({ layout = "thd", dtype = "bf16", q_lens = { 8, 8 }, kv_lens = { 8, 7 }, hq = 2, hkv = 1,
        dqk = 16, dv = 16 }), D)
      local function cu(t) return i32(t):to(D) end
      local steps = {
        { q = { 0, 4, 8 }, qp = { 0, 8, 16 }, kv = { 0, 4, 8 }, rows = { 0, 8 } },
        { q = { 0, 4, 7 }, qp = { 4, 12, 16 }, kv = { 0, 8, 15 }, rows = { 4, 12 } },
      }
      local out = dl.zeros({ 16, 2, 16 }, { dtype = "bf16", device = D })
      local lse = dl.full({ 2, 16 }, NINF, { device = D })
      local dout = clamped({ 16, 2, 16 }, "bf16"):to(D)
      local dq, dk, dv = dl.zeros(x.q.shape, { dtype = "bf16", device = D }), dl.zeros(x.k.shape, { dtype = "bf16", device = D }),
        dl.zeros(x.v.shape, { dtype = "bf16", device = D })
      local sum_dk, sum_dv = dl.zeros(x.k.shape, "f64"), dl.zeros(x.v.shape, "f64")
      for _, st in ipairs(steps) do
        local o = { layout = "thd", mask = "causal_bottom_right", cu_seqlens_q = cu(st.q), cu_seqlens_q_padded = cu(st.qp),
          cu_seqlens_kv = cu(st.kv), cu_seqlens_kv_padded = cu({ 0, 8, 16 }) }
        dl.attn.fwd(x.q, x.k, x.v, with(o, { out = out, lse = lse }))
        dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, with(o, { dq = dq, dk = dk, dv = dv, accumulate_grads = true }))
        -- the same step on compact tensors holding only its q rows
        local function compact(t, dim)
          local c = dl.empty(dim == 1 and { 8, 2, 16 } or { 2, 8 }, { dtype = t.dtype, device = D })
          for i, r in ipairs(st.rows) do c:narrow(dim, 4 * i - 3, 4):copy_(t:narrow(dim, r + 1, 4)) end
          return c
        end
        local co = with(o, { cu_seqlens_q_padded = cu({ 0, 4, 8 }) })
        local qc, oc, lc = compact(x.q, 1), compact(out, 1), compact(lse, 2)
        local ro, rl = dl.attn.fwd(qc, x.k, x.v, co)
        assert.tensor_near(ro, oc, 2.5e-2, 2.5e-2)
        assert.tensor_near(rl, lc, 2.5e-2, 2.5e-2)
        local rq, rk, rv = dl.attn.bwd(compact(dout, 1), qc, x.k, x.v, ro, rl, co)
        assert.tensor_near(rq, compact(dq, 1), 2.5e-2, 2.5e-2)
        sum_dk:add_(rk:cpu())
        sum_dv:add_(rv:cpu())
      end
      assert.tensor_near(sum_dk, dk, 2.5e-2, 2.5e-2)
      assert.tensor_near(sum_dv, dv, 2.5e-2, 2.5e-2)
    end)

    it("accumulates gradients into given dq, dk, dv", function()
      local c = with(TINY.bshd, { dtype = "f16", mask = "causal" })
      local x = on(build(c), D)
      local out, lse = dl.attn.fwd(x.q, x.k, x.v, opts(x))
      local dout = clamped(out.shape, "f16"):to(D)
      local dq, dk, dv = dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, opts(x))
      local aq, ak, av = dl.full(x.q.shape, 0.5, { dtype = "f16", device = D }),
        dl.full(x.k.shape, -0.25, { dtype = "f16", device = D }), dl.full(x.v.shape, 1, { dtype = "f16", device = D })
      dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, opts(x, { dq = aq, dk = ak, dv = av, accumulate_grads = true }))
      assert.tensor_near(dq:f64():add_(0.5), aq, 5e-3, 5e-3)
      assert.tensor_near(dk:f64():add_(-0.25), ak, 5e-3, 5e-3)
      assert.tensor_near(dv:f64():add_(1), av, 5e-3, 5e-3)
    end)

    it("reads max_seqlen from opts and refuses one below the data", function()
      local c = with(TINY.thd, { dtype = "bf16" })
      local x = on(build(c), D)
      local o1 = dl.attn.fwd(x.q, x.k, x.v, opts(x, { max_seqlen_q = 6, max_seqlen_kv = 5 }))
      local o2 = dl.attn.fwd(x.q, x.k, x.v, opts(x))
      assert.tensor_near(o2, o1, 0, 0)
      if D == "cpu" then
        assert.error_matches(function() dl.attn.fwd(x.q, x.k, x.v, opts(x, { max_seqlen_q = 5 })) end,
          "max_seqlen_q=5 is below the longest q sequence (6)", 1, true)
      end
    end)
  end)
end

-- ---- merges: parts of the keys, merged, equal attention over all keys ------------------

local function cat_rows(a, b, dim)
  local shape = a.shape
  shape[dim] = a.shape[dim] + b.shape[dim]
  local t = dl.empty(shape, { dtype = a.dtype, device = a.device })
  t:narrow(dim, 1, a.shape[dim]):copy_(a)
  t:narrow(dim, a.shape[dim] + 1, b.shape[dim]):copy_(b)
  return t
end

for _, dev in ipairs(H.devices) do
  local D = dev.name
  describe(string.format("attn merges on %s (seed %d)%s", D, SEED, dev.tag), function()
    for _, layout in ipairs({ "bshd", "sbhd" }) do
      local sd = layout == "bshd" and 2 or 1
      -- q [.., sq, ..] (6 unless given), keys 0..4 and 5..9.
      local function parts(mask1, mask2, sq)
        local c = { layout = layout, dtype = "bf16", b = 2, sq = sq or 6, skv = 10, hq = 4, hkv = 2, dqk = 16, dv = 8 }
        local x = on(build(c), D)
        local k1, k2 = x.k:narrow(sd, 1, 5), x.k:narrow(sd, 6, 5)
        local v1, v2 = x.v:narrow(sd, 1, 5), x.v:narrow(sd, 6, 5)
        local o = { layout = layout }
        local ou, lu = dl.attn.fwd(x.q, x.k, x.v, with(o, { mask = mask1 and "causal" or "none" }))
        local o1, l1 = dl.attn.fwd(x.q, k1, v1, with(o, { mask = mask1 }))
        local o2, l2 = dl.attn.fwd(x.q, k2, v2, with(o, { mask = mask2 }))
        return x, { ou, lu }, { o1, l1 }, { o2, l2 }, { k1, v1, k2, v2 }
      end

      it(layout .. ": lse merge, incremental (f32 and bf16), post-loop and fused merges", function()
        local x, u, p1, p2, kv = parts()
        local L = p1[2]:clone()
        assert.tensor_near(u[2], dl.attn.merge_lse(L, p2[2], { layout = layout }), 2.5e-2, 2.5e-2)
        for _, dt in ipairs({ "f32", "bf16" }) do
          local acc = dl.attn.accumulator(x.q, x.v, { layout = layout, dtype = dt })
          dl.attn.merge_out(acc.out, acc.lse, p1[1], p1[2], { layout = layout })
          dl.attn.merge_out(acc.out, acc.lse, p2[1], p2[2], { layout = layout })
          assert.tensor_near(u[1], acc.out, 2.5e-2, 2.5e-2)
          assert.tensor_near(u[2], acc.lse, 2.5e-2, 2.5e-2)
        end
        local o, l = dl.attn.merge({ p1[1], p2[1] }, { p1[2], p2[2] }, { layout = layout, dtype = "f32" })
        assert.tensor_near(u[1], o, 2.5e-2, 2.5e-2)
        assert.tensor_near(u[2], l, 2.5e-2, 2.5e-2)
        local acc = dl.attn.accumulator(x.q, x.v, { layout = layout })
        dl.attn.fwd(x.q, kv[1], kv[2], { layout = layout, accumulate = acc })
        local ao, al = dl.attn.fwd(x.q, kv[3], kv[4], { layout = layout, accumulate = acc })
        assert.equal(acc.out, ao)
        assert.tensor_near(u[1], acc.out, 2.5e-2, 2.5e-2)
        assert.tensor_near(u[2], al, 2.5e-2, 2.5e-2)
      end)

      it(layout .. ": causal union from a causal part and a bottom-right part with empty rows", function()
        local _, u, p1, p2 = parts("causal", "causal_bottom_right", 10)
        local o, l = dl.attn.merge({ p1[1], p2[1] }, { p1[2], p2[2] }, { layout = layout, dtype = "f32" })
        assert.tensor_near(u[1], o, 2.5e-2, 2.5e-2)
        assert.tensor_near(u[2], l, 2.5e-2, 2.5e-2)
      end)

      for _, half in ipairs({ "first", "second" }) do
        it(layout .. ": " .. half .. "-half merges with full and packed parts", function()
          local x, u, p1, _, kv = parts()
          local lo = half == "first" and 1 or 4
          local qh = x.q:narrow(sd, lo, 3)
          local ph, lh = dl.attn.fwd(qh, kv[3], kv[4], { layout = layout })
          local p2o, p2l = dl.attn.fwd(x.q, kv[3], kv[4], { layout = layout })
          local other = half == "first" and 4 or 1
          local function expect(o, l)
            assert.tensor_near(u[1]:narrow(sd, lo, 3), o:narrow(sd, lo, 3), 2.5e-2, 2.5e-2)
            assert.tensor_near(u[2]:narrow(3, lo, 3), l:narrow(3, lo, 3), 2.5e-2, 2.5e-2)
            assert.tensor_near(p1[1]:narrow(sd, other, 3), o:narrow(sd, other, 3), 2.5e-2, 2.5e-2)
            assert.tensor_near(p1[2]:narrow(3, other, 3), l:narrow(3, other, 3), 0, 0)
          end
          for _, part in ipairs({ { ph, lh }, { p2o, p2l } }) do
            local mo = { layout = layout, half = half }
            local O, L = p1[1]:f32(), p1[2]:clone()
            expect(dl.attn.merge_out(O, L, part[1], part[2], mo))
            local L2 = dl.attn.merge_lse(p1[2]:clone(), part[2], mo)
            local O2 = p1[1]:f32()
            dl.attn.merge_out(O2, L2, p1[1], p1[2], { layout = layout, mode = "init" })
            expect(dl.attn.merge_out(O2, L2, part[1], part[2], with(mo, { mode = "add" })), L2)
          end
        end)
      end

      it(layout .. ": gradient corrections rebuild the union's gradients", function()
        local x, u = parts()
        local o = { layout = layout }
        local dout = clamped(u[1].shape, "bf16"):to(D)
        local dq, dk, dv = dl.attn.bwd(dout, x.q, x.k, x.v, u[1], u[2], o)
        local kh = { { x.k:narrow(sd, 1, 5), x.v:narrow(sd, 1, 5) }, { x.k:narrow(sd, 6, 5), x.v:narrow(sd, 6, 5) } }
        local g = {}
        for i = 1, 2 do g[i] = { dl.attn.bwd(dout, x.q, kh[i][1], kh[i][2], u[1], u[2], o) } end
        local q = g[1][1]:f32()
        assert.tensor_near(dq, dl.attn.correct_grad(q, g[2][1], with(o, { first = "add", second = "add" })), 2.5e-2, 2.5e-2)
        local K, V = dl.full(dk.shape, 9, { device = D }), dl.zeros(dv.shape, { device = D })
        dl.attn.correct_grad(K, g[1][2], with(o, { first = "copy" }))
        dl.attn.correct_grad(K, g[2][2], with(o, { second = "copy" }))
        dl.attn.correct_grad(V, g[1][3], with(o, { first = "add", second = "none" }))
        dl.attn.correct_grad(V, g[2][3], with(o, { first = "none", second = "add" }))
        assert.tensor_near(dk, K, 2.5e-2, 2.5e-2)
        assert.tensor_near(dv, V, 2.5e-2, 2.5e-2)
        local a, b = g[1][2], g[2][2]
        local M = cat_rows(a, b, sd):f32()
        dl.attn.correct_grad(M, cat_rows(b, a, sd), with(o, { first = "copy", second = "add" }))
        assert.tensor_near(cat_rows(b, b:f32():add_(a), sd), M, 2.5e-2, 2.5e-2)
        dl.attn.correct_grad(M, cat_rows(a, a, sd), with(o, { first = "none", second = "copy" }))
        assert.tensor_near(cat_rows(b, a, sd), M, 0, 0)
      end)
    end

    -- thd: sequences padded to even lengths; keys of each sequence split into
    -- the two halves of its padded extent; q's second halves packed.
    it("thd: merges and corrections over padded halves, offsets not at 0", function()
      local lens, plen, first = { 5, 0, 8, 1 }, { 6, 2, 8, 2 }, 4
      local p, r = {}, first
      for i = 1, #plen do p[i] = r; r = r + plen[i] end
      p[#p + 1] = r
      local rows, hq, d = r + 1, 4, 16
      local nan = {}
      for row = 0, rows - 1 do nan[row + 1] = row end
      local keep = {}
      for i, l in ipairs(lens) do for j = 0, l - 1 do keep[p[i] + j] = true end end
      local gaps = {}
      for _, row in ipairs(nan) do if not keep[row] then gaps[#gaps + 1] = row end end
      local q = clamped({ rows, hq, d }, "bf16", gaps):to(D)
      local k = clamped({ rows, 2, d }, "bf16", gaps):to(D)
      local v = clamped({ rows, 2, d }, "bf16", gaps):to(D)
      local cu, cup = i32(prefix(lens)):to(D), i32(p):to(D)
      local half_lens, half_p, k1l, k2l = {}, {}, {}, {}
      for i, l in ipairs(lens) do
        local h = plen[i] / 2
        half_lens[i] = math.max(0, l - h)
        half_p[i] = (p[i] - p[1]) / 2
        k1l[i], k2l[i] = math.min(l, h), math.max(0, l - h)
      end
      half_p[#lens + 1] = (p[#p] - p[1]) / 2
      local k2p = {}
      for i = 1, #lens do k2p[i] = p[i] + plen[i] / 2 end
      k2p[#lens + 1] = p[#p]
      local o = { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = cup,
        cu_seqlens_kv_padded = cup }
      local ou, lu = dl.attn.fwd(q, k, v, o)
      local o1, l1 = dl.attn.fwd(q, k, v, with(o, { cu_seqlens_kv = i32(prefix(k1l)):to(D) }))
      local o2o = with(o, { cu_seqlens_kv = i32(prefix(k2l)):to(D), cu_seqlens_kv_padded = i32(k2p):to(D) })
      local o2, l2 = dl.attn.fwd(q, k, v, o2o)
      -- fused merge and incremental merge over the two key halves
      local acc = dl.attn.accumulator(q, v, { layout = "thd" })
      dl.attn.fwd(q, k, v, with(o, { cu_seqlens_kv = i32(prefix(k1l)):to(D), accumulate = acc }))
      dl.attn.fwd(q, k, v, with(o2o, { accumulate = acc }))
      assert.tensor_near(ou, acc.out, 2.5e-2, 2.5e-2)
      assert.tensor_near(lu, acc.lse, 2.5e-2, 2.5e-2)
      local mo = { layout = "thd", cu_seqlens_padded = cup, skip_zero_rows = true }
      local O, L = o1:f32(), l1:clone()
      dl.attn.merge_out(O, L, o2, l2, mo)
      assert.tensor_near(ou, O, 2.5e-2, 2.5e-2)
      assert.tensor_near(lu, L, 2.5e-2, 2.5e-2)
      -- second halves of q, packed, attending to all keys: second-half merges
      local qh = dl.zeros({ half_p[#half_p], hq, d }, { dtype = "bf16", device = D })
      for i = 1, #lens do
        local h = plen[i] / 2
        if h > 0 then qh:narrow(1, half_p[i] + 1, h):copy_(q:narrow(1, p[i] + h + 1, h)) end
      end
      local hcu, hcup = i32(prefix(half_lens)):to(D), i32(half_p):to(D)
      local ho = { layout = "thd", cu_seqlens_q = hcu, cu_seqlens_kv = cu, cu_seqlens_q_padded = hcup,
        cu_seqlens_kv_padded = cup }
      local ph, lh = dl.attn.fwd(qh, k, v, with(ho, { cu_seqlens_kv = i32(prefix(k2l)):to(D), cu_seqlens_kv_padded = i32(k2p):to(D) }))
      local sm = with(mo, { half = "second" })
      local O2, L2 = o1:f32(), l1:clone()
      dl.attn.merge_out(O2, L2, ph, lh, sm)
      local L3 = dl.attn.merge_lse(l1:clone(), lh, { layout = "thd", cu_seqlens_padded = cup, half = "second" })
      assert.tensor_near(L2, L3, 1e-6, 1e-6)
      for i = 1, #lens do
        local h = plen[i] / 2
        if h > 0 then
          assert.tensor_near(o1:narrow(1, p[i] + 1, h), O2:narrow(1, p[i] + 1, h), 2.5e-2, 2.5e-2)
          assert.tensor_near(ou:narrow(1, p[i] + h + 1, h), O2:narrow(1, p[i] + h + 1, h), 2.5e-2, 2.5e-2)
          assert.tensor_near(lu:narrow(2, p[i] + h + 1, h), L2:narrow(2, p[i] + h + 1, h), 2.5e-2, 2.5e-2)
        end
      end
      -- gradients: dq from the two key halves added, dk/dv halves copied
      local dout = clamped(ou.shape, "bf16", gaps):to(D)
      local dq, dk, dv = dl.attn.bwd(dout, q, k, v, ou, lu, o)
      local g1 = { dl.attn.bwd(dout, q, k, v, ou, lu, with(o, { cu_seqlens_kv = i32(prefix(k1l)):to(D) })) }
      local g2 = { dl.attn.bwd(dout, q, k, v, ou, lu, o2o) }
      local go = { layout = "thd", cu_seqlens_padded = cup }
      assert.tensor_near(dq, dl.attn.correct_grad(g1[1]:clone(), g2[1], with(go, { first = "add", second = "add" })), 2.5e-2, 2.5e-2)
      local K = dl.zeros(dk.shape, { dtype = "bf16", device = D })
      dl.attn.correct_grad(K, g1[2], with(go, { first = "copy", second = "none" }))
      dl.attn.correct_grad(K, g2[2], with(go, { first = "none", second = "add" }))
      assert.tensor_near(dk, K, 2.5e-2, 2.5e-2)
      local V = g1[3]:clone()
      dl.attn.correct_grad(V, g2[3], with(go, { first = "add", second = "copy" }))
      assert.tensor_near(dv, V, 2.5e-2, 2.5e-2)
      assert_rows_zero(dq, gaps)
      assert_rows_zero(K, gaps)
    end)

    it("skip_zero_rows keeps a part row of zeros out of the merge", function()
      local O = dl.full({ 1, 2, 1, 8 }, 0.5, { device = D })
      local L = dl.zeros({ 1, 1, 2 }, { device = D })
      local P = dl.zeros({ 1, 2, 1, 8 }, { device = D })
      local PL = dl.zeros({ 1, 1, 2 }, { device = D })
      dl.attn.merge_out(O, L, P, PL, { skip_zero_rows = true })
      assert.tensor_near(dl.full({ 1, 2, 1, 8 }, 0.5), O, 0, 0)
      assert.tensor_near(dl.zeros({ 1, 1, 2 }), L, 0, 0)
      dl.attn.merge_out(O, L, P, PL)
      assert.tensor_near(dl.full({ 1, 2, 1, 8 }, 0.25), O, 1e-6, 0)
      assert.tensor_near(dl.full({ 1, 1, 2 }, math.log(2)), L, 1e-6, 0)
    end)
  end)
end

-- ---- bad input, meta ----------------------------------------------------------------

describe("attn refuses bad input", function()
  local function q(...) return dl.zeros({ ... }, "bf16") end
  local function fails(fn, msg) assert.error_matches(fn, msg, 1, true) end
  it("names the argument", function()
    local a, k = q(1, 4, 2, 8), q(1, 4, 2, 8)
    fails(function() dl.attn.fwd(a:f32(), k, k) end, "attn.fwd: q must be bf16 or f16, got f32")
    fails(function() dl.attn.fwd(a, k:f16(), k) end, "attn.fwd: k is f16 but q is bf16")
    fails(function() dl.attn.fwd(q(1, 4, 4, 8), q(1, 4, 3, 8), q(1, 4, 3, 8)) end, "k's 3 heads must divide q's 4 heads")
    fails(function() dl.attn.fwd(a, q(1, 4, 2, 16), k) end, "head dims of q (8) and k (16) differ")
    fails(function() dl.attn.fwd(q(1, 4, 2, 12), q(1, 4, 2, 12), k) end, "head dim 12 of q and k is unsupported")
    fails(function() dl.attn.fwd(a, k, q(1, 5, 2, 8)) end, "k has 4 positions but v has 5")
    fails(function() dl.attn.fwd(a, k, q(2, 4, 2, 8)) end, "batch sizes differ")
    fails(function() dl.attn.fwd(q(1, 4, 8, 2):transpose(3, 4), k, k) end, "the last dim of q must be contiguous")
    fails(function() dl.attn.fwd(q(4, 2, 8), k, k) end, "q must have 4 dims [b, s, h, d] for layout bshd, got 3")
    fails(function() dl.attn.fwd(a, k, k, { out = q(1, 4, 2, 16) }) end, "out has shape [1, 4, 2, 16], expected [1, 4, 2, 8]")
    fails(function() dl.attn.fwd(a, k, k, { lse = dl.zeros(1, 2, 4, "f16") }) end, "lse must be f32, got f16")
    fails(function() dl.attn.fwd(a, k, 3) end, "attn.fwd: v must be a tensor, got number")
    fails(function() dl.attn.fwd(a, k, k, { masks = "causal" }) end, "unknown option masks")
    fails(function() dl.attn.fwd(a, k, k, { mask = "upper" }) end, "mask upper is not none, causal")
    fails(function() dl.attn.fwd(a, k, k, { mask = "causal", window = { 4, 2 } }) end, "window right bound 2 contradicts mask causal")
    fails(function() dl.attn.fwd(a, k, k, { scale = -1 }) end, "scale must be a finite number > 0")
    fails(function() dl.attn.fwd(a, k, k, { cu_seqlens_q = dl.zeros(2, "i32") }) end, "cu_seqlens_q is for layout thd only")
    local acc = dl.attn.accumulator(a, k)
    fails(function() dl.attn.fwd(a, k, k, { accumulate = acc, out = q(1, 4, 2, 8) }) end, "exclude each other")
    fails(function() dl.attn.bwd(a, a, k, k, a, dl.zeros(1, 2, 4), { accumulate_grads = true }) end, "accumulate_grads needs dq, dk and dv")
    fails(function() dl.attn.bwd(a, a, k, k, a, dl.zeros(1, 4, 2)) end, "lse has shape [1, 4, 2], expected [1, 2, 4]")
  end)

  it("checks thd sequence metadata", function()
    local t = q(10, 2, 8)
    local function o(cu, cukv, extra)
      return with({ layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cukv or cu }, extra or {})
    end
    fails(function() dl.attn.fwd(t, t, t, { layout = "thd" }) end, "layout thd needs cu_seqlens_q and cu_seqlens_kv")
    fails(function() dl.attn.fwd(t, t, t, o(dl.zeros(3))) end, "cu_seqlens_q must be i32, got f32")
    fails(function() dl.attn.fwd(t, t, t, o(i32({ 0, 4 }), i32({ 0, 4, 6 }))) end, "cu_seqlens_kv must be 1-D with the same number")
    fails(function() dl.attn.fwd(t, t, t, o(i32({ 0, 4, 3 }))) end, "cu_seqlens_q decreases at entry 2 (3 after 4)")
    fails(function() dl.attn.fwd(t, t, t, o(i32({ 0, 4 }), nil, { cu_seqlens_q_padded = i32({ 8, 12 }) })) end,
      "sequence 0 (rows 8..11 by cu_seqlens_q_padded) lies outside the 10 rows of q")
  end)

  it("checks merge operands", function()
    local O, L = dl.zeros(1, 4, 2, 8), dl.zeros(1, 2, 4)
    fails(function() dl.attn.merge_out(O, L, dl.zeros(1, 2, 2, 8), dl.zeros(1, 2, 2)) end, "a shorter part needs rows = first or second half")
    fails(function() dl.attn.merge_out(O, L, O, dl.zeros(1, 2, 2), { half = "second" }) end, "part and part_lse disagree")
    fails(function() dl.attn.merge_lse(L, dl.zeros(1, 2, 4, "bf16")) end, "part_lse must be f32")
    fails(function() dl.attn.merge_out(O, L, O, L, { mode = "sum" }) end, "mode sum is not incremental, init or add")
    fails(function() dl.attn.merge_lse(dl.zeros(2, 8), dl.zeros(2, 8), { layout = "thd" }) end, "cu_seqlens_padded is missing")
    fails(function() dl.attn.merge_lse(dl.zeros(2, 8), dl.zeros(2, 8), { layout = "thd", half = "first", cu_seqlens_padded = i32({ 0, 3, 8 }) }) end,
      "sequence 0 has odd length 3")
    fails(function() dl.attn.correct_grad(O, dl.zeros(1, 2, 2, 8), { first = "copy", second = "add" }) end, "only one of first/second")
    fails(function() dl.attn.correct_grad(O, O, { first = "move" }) end, "move is not copy, add or none")
  end)
end)

describe("attn on meta", function()
  it("allocates outputs and the workspace under the current tag, runs nothing", function()
    local q = dl.empty({ 2, 4096, 16, 128 }, { dtype = "bf16", device = "meta" })
    local out, lse, ml = dl.attn.fwd(q, q, q, { mask = "causal", return_max_logit = true })
    assert.same({ 2, 4096, 16, 128 }, out.shape)
    assert.same({ 2, 16, 4096 }, lse.shape)
    assert.same({ 16 }, ml.shape)
    dl.mem.reset_peak("meta")
    local dq = dl.mem.tag("attn_spec_bwd", function() return (dl.attn.bwd(out, q, q, q, out, lse)) end)
    assert.same(q.shape, dq.shape)
    local tag = dl.mem.stats("meta").tags.attn_spec_bwd
    local unit = 2 * 4096 * 16 * 128 * 2
    -- dq, dk, dv, plus the fp32 dq accumulator and row sums of the workspace
    assert.equal(3 * unit + 2 * unit + 2 * 4096 * 16 * 4, tag.peak)
  end)

  it("sizes the thd workspace by the rows of q, as on cuda", function()
    local q = dl.empty({ 1000, 4, 64 }, { dtype = "bf16", device = "meta" })
    local cu = dl.empty({ 3 }, { dtype = "i32", device = "meta" })
    local o = { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, max_seqlen_q = 300, max_seqlen_kv = 300 }
    local out, lse = dl.attn.fwd(q, q, q, o)
    assert.same({ 4, 1000 }, lse.shape)
    dl.mem.reset_peak("meta")
    dl.mem.tag("attn_spec_thd", function() dl.attn.bwd(out, q, q, q, out, lse, o) end)
    local unit = 1000 * 4 * 64 * 2
    assert.equal(3 * unit + 2 * unit + 1000 * 4 * 4, dl.mem.stats("meta").tags.attn_spec_thd.peak)
  end)
end)
