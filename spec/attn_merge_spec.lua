-- dl.attn merges: attention over parts of the keys, merged (lse merge,
-- incremental and post-loop output merges, the fused merge, half-sequence
-- variants for bshd/sbhd and thd, gradient corrections), must equal attention
-- over all keys. Same inputs, reference and tolerances as spec/attn_spec.lua
-- (spec/attn_ref.lua). Seed: DISTLAB_SEED, else the clock.
local dl = require "distlab"
local H = require "helpers"
local R = require "attn_ref"
local SEED = R.SEED
local clamped = R.clamped
local prefix = R.prefix
local i32 = R.i32
local build = R.build
local on = R.on
local assert_rows_zero = R.assert_rows_zero

-- element-wise within tol (TransformerEngine's) and, where tol > 0, normwise within 0.4 tol
-- (1e-2 for bf16's 2.5e-2): ||got - want|| / ||want|| in fp64, which a 2% scale fails
local function near(got, want, tol)
  assert.tensor_near(got, want, tol, tol)
  if tol > 0 then
    local bad = R.norm_differs(want, got, 0.4 * tol, "merge")
    assert(not bad, bad)
  end
end
local with = R.with

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
        near(u[2], dl.attn.merge_lse(L, p2[2], { layout = layout }), 2.5e-2)
        for _, dt in ipairs({ "f32", "bf16" }) do
          local acc = dl.attn.accumulator(x.q, x.v, { layout = layout, dtype = dt })
          dl.attn.merge_out(acc.out, acc.lse, p1[1], p1[2], { layout = layout })
          dl.attn.merge_out(acc.out, acc.lse, p2[1], p2[2], { layout = layout })
          near(u[1], acc.out, 2.5e-2)
          near(u[2], acc.lse, 2.5e-2)
        end
        local o, l = dl.attn.merge({ p1[1], p2[1] }, { p1[2], p2[2] }, { layout = layout, dtype = "f32" })
        near(u[1], o, 2.5e-2)
        near(u[2], l, 2.5e-2)
        local acc = dl.attn.accumulator(x.q, x.v, { layout = layout })
        dl.attn.fwd(x.q, kv[1], kv[2], { layout = layout, accumulate = acc })
        local ao, al = dl.attn.fwd(x.q, kv[3], kv[4], { layout = layout, accumulate = acc })
        assert.equal(acc.out, ao)
        near(u[1], acc.out, 2.5e-2)
        near(u[2], al, 2.5e-2)
      end)

      -- the fused merge at the Hopper forward's shapes (bf16, head dims 64, 128 and MLA's 192/128:
      -- kernels/attn/hopper/ on an sm_90 device), beyond a tile: keys
      -- in two parts of 150 and 183, merged into an f32 or a bf16 (CP's) accumulator, against the step over
      -- all 333 keys (and max_logit across the parts)
      for _, dd in ipairs({ { 64, 64 }, { 128, 128 }, { 192, 128 } }) do
        local d = dd[1] .. (dd[1] == dd[2] and "" or "/" .. dd[2])
        for _, adt in ipairs({ "f32", "bf16" }) do
        it(layout .. ": fused merge at d " .. d .. " bf16 into " .. adt .. " over two key parts, beyond a tile", function()
          local c = { layout = layout, dtype = "bf16", b = 2, sq = 200, skv = 333, hq = 4, hkv = 2, dqk = dd[1], dv = dd[2] }
          local x = on(build(c), D)
          local o = { layout = layout }
          local ou, lu, mu = dl.attn.fwd(x.q, x.k, x.v, with(o, { return_max_logit = true }))
          local acc = dl.attn.accumulator(x.q, x.v, { layout = layout, dtype = adt })
          local ml = dl.full({ 4 }, -math.huge, { dtype = "f32", device = D })
          dl.attn.fwd(x.q, x.k:narrow(sd, 1, 150), x.v:narrow(sd, 1, 150), with(o, { accumulate = acc, max_logit = ml }))
          dl.attn.fwd(x.q, x.k:narrow(sd, 151, 183), x.v:narrow(sd, 151, 183), with(o, { accumulate = acc, max_logit = ml }))
          near(ou, acc.out, 2.5e-2)
          near(lu, acc.lse, 2.5e-2)
          assert.tensor_near(ml, mu, 1e-5, 1e-5)
        end)
        end
      end

      it(layout .. ": causal union from a causal part and a bottom-right part with empty rows", function()
        local _, u, p1, p2 = parts("causal", "causal_bottom_right", 10)
        local o, l = dl.attn.merge({ p1[1], p2[1] }, { p1[2], p2[2] }, { layout = layout, dtype = "f32" })
        near(u[1], o, 2.5e-2)
        near(u[2], l, 2.5e-2)
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
            near(u[1]:narrow(sd, lo, 3), o:narrow(sd, lo, 3), 2.5e-2)
            near(u[2]:narrow(3, lo, 3), l:narrow(3, lo, 3), 2.5e-2)
            near(p1[1]:narrow(sd, other, 3), o:narrow(sd, other, 3), 2.5e-2)
            near(p1[2]:narrow(3, other, 3), l:narrow(3, other, 3), 0)
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
        near(dq, dl.attn.correct_grad(q, g[2][1], with(o, { first = "add", second = "add" })), 2.5e-2)
        local K, V = dl.full(dk.shape, 9, { device = D }), dl.zeros(dv.shape, { device = D })
        dl.attn.correct_grad(K, g[1][2], with(o, { first = "copy" }))
        dl.attn.correct_grad(K, g[2][2], with(o, { second = "copy" }))
        dl.attn.correct_grad(V, g[1][3], with(o, { first = "add", second = "none" }))
        dl.attn.correct_grad(V, g[2][3], with(o, { first = "none", second = "add" }))
        near(dk, K, 2.5e-2)
        near(dv, V, 2.5e-2)
        local a, b = g[1][2], g[2][2]
        local M = cat_rows(a, b, sd):f32()
        dl.attn.correct_grad(M, cat_rows(b, a, sd), with(o, { first = "copy", second = "add" }))
        near(cat_rows(b, b:f32():add_(a), sd), M, 2.5e-2)
        dl.attn.correct_grad(M, cat_rows(a, a, sd), with(o, { first = "none", second = "copy" }))
        near(cat_rows(b, a, sd), M, 0)
      end)
    end

    -- thd: sequences padded to even lengths; keys of each sequence split into
    -- the two halves of its padded extent; q's second halves packed.
    -- d 128 bf16: the Hopper forward on an sm_90 device (thd offsets, halves and the fused merge on it)
    for _, d in ipairs({ 16, 128 }) do
      it("thd (d " .. d .. "): merges and corrections over padded halves, offsets not at 0", function()
        local lens, plen, first = { 5, 0, 8, 1 }, { 6, 2, 8, 2 }, 4
        local p, r = {}, first
        for i = 1, #plen do p[i] = r; r = r + plen[i] end
        p[#p + 1] = r
        local rows, hq = r + 1, 4
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
        near(ou, acc.out, 2.5e-2)
        near(lu, acc.lse, 2.5e-2)
        local mo = { layout = "thd", cu_seqlens_padded = cup, skip_zero_rows = true }
        local O, L = o1:f32(), l1:clone()
        dl.attn.merge_out(O, L, o2, l2, mo)
        near(ou, O, 2.5e-2)
        near(lu, L, 2.5e-2)
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
            near(o1:narrow(1, p[i] + 1, h), O2:narrow(1, p[i] + 1, h), 2.5e-2)
            near(ou:narrow(1, p[i] + h + 1, h), O2:narrow(1, p[i] + h + 1, h), 2.5e-2)
            near(lu:narrow(2, p[i] + h + 1, h), L2:narrow(2, p[i] + h + 1, h), 2.5e-2)
          end
        end
        -- gradients: dq from the two key halves added, dk/dv halves copied
        local dout = clamped(ou.shape, "bf16", gaps):to(D)
        local dq, dk, dv = dl.attn.bwd(dout, q, k, v, ou, lu, o)
        local g1 = { dl.attn.bwd(dout, q, k, v, ou, lu, with(o, { cu_seqlens_kv = i32(prefix(k1l)):to(D) })) }
        local g2 = { dl.attn.bwd(dout, q, k, v, ou, lu, o2o) }
        local go = { layout = "thd", cu_seqlens_padded = cup }
        near(dq, dl.attn.correct_grad(g1[1]:clone(), g2[1], with(go, { first = "add", second = "add" })), 2.5e-2)
        local K = dl.zeros(dk.shape, { dtype = "bf16", device = D })
        dl.attn.correct_grad(K, g1[2], with(go, { first = "copy", second = "none" }))
        dl.attn.correct_grad(K, g2[2], with(go, { first = "none", second = "add" }))
        near(dk, K, 2.5e-2)
        local V = g1[3]:clone()
        dl.attn.correct_grad(V, g2[3], with(go, { first = "add", second = "copy" }))
        near(dv, V, 2.5e-2)
        assert_rows_zero(dq, gaps)
        assert_rows_zero(K, gaps)
      end)
    end

    it("skip_zero_rows keeps a part row of zeros out of the merge", function()
      local O = dl.full({ 1, 2, 1, 8 }, 0.5, { device = D })
      local L = dl.zeros({ 1, 1, 2 }, { device = D })
      local P = dl.zeros({ 1, 2, 1, 8 }, { device = D })
      local PL = dl.zeros({ 1, 1, 2 }, { device = D })
      dl.attn.merge_out(O, L, P, PL, { skip_zero_rows = true })
      near(dl.full({ 1, 2, 1, 8 }, 0.5), O, 0)
      near(dl.zeros({ 1, 1, 2 }), L, 0)
      dl.attn.merge_out(O, L, P, PL)
      assert.tensor_near(dl.full({ 1, 2, 1, 8 }, 0.25), O, 1e-6, 0)
      assert.tensor_near(dl.full({ 1, 1, 2 }, math.log(2)), L, 1e-6, 0)
    end)
  end)
end
