-- dl.attn: the attention step and the merges, on fresh clamp(randn, -1, 1)
-- inputs. On cpu the kernel is the fp64 twin, so it is checked against a
-- naive softmax(scale q k^T) v written here in plain Lua (and its analytic
-- gradients), on tiny shapes. On cuda (#gpu) the kernels are checked against
-- the cpu twin on the same inputs, plus shapes beyond one tile. Tolerances
-- are TransformerEngine's CP ones (atol = rtol): bf16 2.5e-2, fp16 5e-3.
-- thd inputs carry NaN in the rows between sequences, which must be neither
-- read nor written: outputs there are exactly 0 (lse -inf).
-- The merges are in spec/attn_merge_spec.lua; the reference in spec/attn_ref.lua.
-- Seed: DISTLAB_SEED, else the clock (shown in the describe names).
local dl = require "distlab"
local H = require "helpers"
local R = require "attn_ref"
local SEED = R.SEED
local NINF = R.NINF
local clamped = R.clamped
local i32 = R.i32
local build = R.build
local on = R.on
local opts = R.opts
local ref_fwd = R.ref_fwd
local check_case = R.check_case
local with = R.with
local describe_case = R.describe_case
local TINY = R.TINY
local cases = R.cases

-- ---- specs ------------------------------------------------------------------------

-- whether device D (cuda:N) is a Hopper GPU, where dl.attn runs kernels/attn/hopper/
local function is_hopper(D)
  local name = dl.cuda_device_name(tonumber(D:match("%d+")) or 0)
  return name:match("H100") or name:match("H200") or name:match("H800") or name:match("H20")
end

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
      -- the same cases at the Hopper kernels' shape (bf16, head dims 128/128: kernels/attn/hopper/
      -- on an sm_90 device, forward and backward; the portable kernels elsewhere)
      for _, c in ipairs(cases(true)) do
        if c.dtype == "bf16" and c.dqk == 64 then
          local h = with(c, { dqk = 128, dv = 128 })
          it("at d 128 bf16: " .. describe_case(h), function() check_case(h, D) end)
        end
      end
      it("DISTLAB_ATTN_HOPPER_FWD_GROUP_MB and ..._BWD_GROUP_MB (the masked schedules' groups of heads): 0 (the grid's order) and 1 MB give hopper_small's fp64-checked results; 12x stops the call with an error naming the knob (subprocesses: the knobs are read once)", function()
        if not is_hopper(D) then return end
        -- a subprocess on H.devices' cuda:0: run takes --device cpu, meta or cuda
        local script = "run -n 1 --device cuda experiments/attn/hopper_small.lua"
        for _, mb in ipairs { "0", "1" } do
          local rc, out = H.distlab(script, "DISTLAB_ATTN_HOPPER_FWD_GROUP_MB=" .. mb .. " DISTLAB_ATTN_HOPPER_BWD_GROUP_MB=" .. mb)
          assert.equal(0, rc, out)
          assert.truthy(out:find("hopper_small: all ok", 1, true), out)
        end
        for _, knob in ipairs { "DISTLAB_ATTN_HOPPER_FWD_GROUP_MB=12x", "DISTLAB_ATTN_HOPPER_BWD_GROUP_MB=12x" } do
          local rc, out = H.distlab(script .. " --quick", knob)
          assert.are_not.equal(0, rc, out)
          assert.truthy(out:find(knob .. ": the masked schedule's group in MB of L2", 1, true), out)
        end
      end)
      it("DISTLAB_ATTN_HOPPER_BWD_ROT (a key block's query blocks rotated): 2 and 1000 give hopper_small's fp64-checked results; 7x stops the call with an error naming the knob (subprocesses: the knob is read once)", function()
        if not is_hopper(D) then return end
        local script = "run -n 1 --device cuda experiments/attn/hopper_small.lua"
        for _, n in ipairs { "2", "1000" } do
          local rc, out = H.distlab(script, "DISTLAB_ATTN_HOPPER_BWD_ROT=" .. n)
          assert.equal(0, rc, out)
          assert.truthy(out:find("hopper_small: all ok", 1, true), out)
        end
        local rc, out = H.distlab(script .. " --quick", "DISTLAB_ATTN_HOPPER_BWD_ROT=7x")
        assert.are_not.equal(0, rc, out)
        assert.truthy(out:find("DISTLAB_ATTN_HOPPER_BWD_ROT=7x: the backward's rotation", 1, true), out)
      end)
      it("runs the Hopper forward at d 64 and 128 bf16 on an sm_90 device, the portable kernel elsewhere", function()
        local q = dl.randn({ 1, 64, 2, 128 }, { dtype = "bf16", device = D })
        local f16 = dl.randn({ 1, 64, 2, 128 }, { dtype = "f16", device = D })
        local b = dl.attn.backends(q, q, q, {})
        local hopper = is_hopper(D)
        assert.equal("ours", b.fwd)
        assert.truthy(b.fwd_why:find(hopper and "kernel: hopper forward" or "kernel: portable", 1, true), b.fwd_why)
        local q64 = dl.randn({ 1, 64, 2, 64 }, { dtype = "bf16", device = D })
        local w64 = dl.attn.backends(q64, q64, q64, {}).fwd_why
        assert.truthy(w64:find(hopper and "kernel: hopper forward (wgmma, TMA; bf16, d 64)" or "kernel: portable", 1, true), w64)
        -- the defaults: 192-row CTAs at d 64 (FWD_M192=0 off), the lazy rescale at d 128's PIPE 2 (FWD_LAZY=0 off)
        local m192 = hopper and os.getenv("DISTLAB_ATTN_HOPPER_FWD_M192") ~= "0"
        assert.equal(m192 and true or false, w64:find("192 query rows a CTA", 1, true) ~= nil, w64)
        local pipe = os.getenv("DISTLAB_ATTN_HOPPER_FWD_PIPE")
        local lazy = hopper and os.getenv("DISTLAB_ATTN_HOPPER_FWD_LAZY") ~= "0" and pipe ~= "0" and pipe ~= "1" and pipe ~= "3"
        assert.equal(lazy and true or false, b.fwd_why:find(", lazy rescale", 1, true) ~= nil, b.fwd_why)
        -- F3b: d 128's default loop (the lazy one) takes the four-chain softmax (FWD_TREE=0 off) and, writing out
        -- (not merging), the TMA store of O (FWD_TMA_O=0 off; =1 also outside the default loop but PIPE 1)
        local tree = lazy and os.getenv("DISTLAB_ATTN_HOPPER_FWD_TREE") ~= "0"
        local tma_knob = os.getenv("DISTLAB_ATTN_HOPPER_FWD_TMA_O")
        local tma = hopper and (tma_knob == "1" and pipe ~= "1" or lazy and tma_knob ~= "0")
        assert.equal(tree and true or false, b.fwd_why:find(", row max and sum in four chains", 1, true) ~= nil, b.fwd_why)
        assert.equal(tma and true or false, b.fwd_why:find(", O by TMA store", 1, true) ~= nil, b.fwd_why)
        -- d 64's default loop (192 rows, PIPE 1, no lazy rescale) takes the four-chain softmax, the TMA store of O
        -- and the elected arrive (each knob's 0 off); FWD_TREE=1 also its PIPE 2; d 128 arrives elected only with =1
        local tree_knob, elect_knob = os.getenv("DISTLAB_ATTN_HOPPER_FWD_TREE"), os.getenv("DISTLAB_ATTN_HOPPER_FWD_ELECT")
        local lazy64 = os.getenv("DISTLAB_ATTN_HOPPER_FWD_LAZY") == "1" and pipe ~= "2" and pipe ~= "3"
        local d64def = m192 and pipe ~= "2" and not lazy64
        local tree64 = d64def and tree_knob ~= "0" or m192 and not lazy64 and tree_knob == "1"
        local tma64 = hopper and (tma_knob == "1" or d64def and tma_knob ~= "0")
        assert.equal(tree64 and true or false, w64:find(", row max and sum in four chains", 1, true) ~= nil, w64)
        assert.equal(tma64 and true or false, w64:find(", O by TMA store", 1, true) ~= nil, w64)
        assert.equal(d64def and elect_knob ~= "0", w64:find(", stages freed by one arrival a warp", 1, true) ~= nil, w64)
        assert.equal(tree and elect_knob == "1", b.fwd_why:find(", stages freed by one arrival a warp", 1, true) ~= nil, b.fwd_why)
        local bl = dl.attn.backends(q, q, q, { return_max_logit = true }).fwd_why -- max_logit: no lazy base, none of them
        assert.is_nil(bl:find(", lazy rescale", 1, true), bl)
        assert.is_nil(bl:find(", row max and sum in four chains", 1, true), bl)
        assert.truthy(dl.attn.backends(f16, f16, f16, {}).fwd_why:find("kernel: portable (hopper forward: dtype is not bf16)", 1, true))
        -- MLA's 192/128: the Hopper forward (not with DISTLAB_ATTN_HOPPER_MLA=0), the portable backward
        local qm, vm = dl.randn({ 1, 64, 2, 192 }, { dtype = "bf16", device = D }), dl.randn({ 1, 64, 2, 128 }, { dtype = "bf16", device = D })
        local bm = dl.attn.backends(qm, qm, vm, {})
        local mla = hopper and os.getenv("DISTLAB_ATTN_HOPPER_MLA") ~= "0" and os.getenv("DISTLAB_ATTN_HOPPER") ~= "0"
        assert.truthy(bm.fwd_why:find(mla and "kernel: hopper forward (wgmma, TMA; bf16, d 192/128)" or "kernel: portable", 1, true), bm.fwd_why)
        assert.truthy(bm.bwd_why:find("kernel: portable", 1, true), bm.bwd_why)
        for _, adt in ipairs({ "f32", "bf16" }) do -- the fused merge into either accumulator (CP's is bf16)
          local acc = dl.attn.accumulator(q, q, { dtype = adt })
          local wa = dl.attn.backends(q, q, q, { accumulate = acc }).fwd_why
          assert.truthy(wa:find(hopper and "kernel: hopper forward (wgmma, TMA; bf16, d 128)" or "kernel: portable", 1, true), wa)
          -- the running rows in and out by TMA, in d 128's default loop (not with FWD_ELECT=1): a bf16 running
          -- out's default (FWD_TMA_M=0 turns it off), an fp32 one's with FWD_TMA_M=1
          local tmk = os.getenv("DISTLAB_ATTN_HOPPER_FWD_TMA_M")
          local tm = hopper and (tmk == "1" or (adt == "bf16" and tmk ~= "0")) and tree and elect_knob ~= "1"
          assert.equal(tm and true or false, wa:find(", running rows in and out by TMA", 1, true) ~= nil, wa)
        end
        assert.is_nil(b.fwd_why:find(", running rows in and out by TMA", 1, true), b.fwd_why) -- no merge, no rows
        local on = os.getenv("DISTLAB_ATTN_HOPPER") ~= "0"
        -- B3's 80 query rows an item at d 128 (under every mask unless BWD_M80=1), B6's 128 at d 64, unless turned off
        local m80 = os.getenv("DISTLAB_ATTN_HOPPER_BWD_M80") ~= "0" and os.getenv("DISTLAB_ATTN_HOPPER_BWD_ORDER") ~= "0"
        assert.truthy(b.bwd_why:find(hopper and on and ("kernel: hopper backward (wgmma, TMA; bf16, d 128; " ..
          (m80 and 80 or 64) .. " query rows an item)") or "kernel: portable (hopper backward: ", 1, true), b.bwd_why)
        local bc = dl.attn.backends(q, q, q, { mask = "causal" }).bwd_why
        local m80all = m80 and os.getenv("DISTLAB_ATTN_HOPPER_BWD_M80") ~= "1" -- 80 under every mask
        assert.truthy(bc:find(hopper and on and ("kernel: hopper backward (wgmma, TMA; bf16, d 128; " ..
          (m80all and 80 or 64) .. " query rows an item)") or "kernel: portable (hopper backward: ", 1, true), bc)
        local b64 = dl.attn.backends(q64, q64, q64, { mask = "causal" }).bwd_why
        local m128 = os.getenv("DISTLAB_ATTN_HOPPER_BWD_M128") ~= "0"
        assert.truthy(b64:find(hopper and on and ("kernel: hopper backward (wgmma, TMA; bf16, d 64; " ..
          (m128 and 128 or 64) .. " query rows an item)") or "kernel: portable (hopper backward: ", 1, true), b64)
        assert.truthy(dl.attn.backends(f16, f16, f16, {}).bwd_why:find("kernel: portable (hopper backward: ", 1, true))
      end)
    end

    it("detects a wrong mask (the check can fail)", function()
      local c = with(TINY.bshd, { dtype = "bf16", mask = "causal" })
      local x = build(c)
      local out = dl.attn.fwd(x.q:to(D), x.k:to(D), x.v:to(D), opts(x))
      local r = ref_fwd(with(x, { c = with(c, { mask = "causal_bottom_right" }) }), out, dl.zeros(2, 4, 5))
      assert.is_false(dl.allclose(out, r.out, { atol = 2.5e-2, rtol = 2.5e-2 }))
    end)

    it("fails the normwise check on a planted 2% error, passes it without", function()
      local c = with(TINY.bshd, { dtype = "bf16", sq = 64, skv = 64, mask = "causal" })
      local x = build(c)
      local out, lse = dl.attn.fwd(x.q:to(D), x.k:to(D), x.v:to(D), opts(x))
      local r = ref_fwd(x, out:cpu(), lse:cpu())
      assert.is_nil(R.norm_differs(r.out, out:cpu(), R.NORM.bf16, "out"))
      assert.is_not_nil(R.norm_differs(r.out, out:cpu():f32():mul_(1.02), R.NORM.bf16, "out"))
      assert.is_not_nil(R.norm_differs(r.lse, lse:cpu():clone():mul_(1.02), R.NORM.lse, "lse"))
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

    it("counts each step under the kernel that ran it (attn.runs), as backends says", function()
      local x = on(build(with(TINY.bshd, { dtype = "bf16", dqk = 64, dv = 64 })), D)
      for _, adt in ipairs({ "none", "f32", "bf16" }) do
        local o = adt == "none" and opts(x) or opts(x, { accumulate = dl.attn.accumulator(x.q, x.v, { dtype = adt }) })
        local b = dl.attn.backends(x.q, x.k, x.v, o)
        local kind = D == "cpu" and "cpu" or b.fwd_why:find("kernel: hopper", 1, true) and "hopper" or "portable"
        local r0 = dl.attn.runs()
        local out, lse = dl.attn.fwd(x.q, x.k, x.v, o)
        local r1 = dl.attn.runs()
        for _, k in ipairs({ "cpu", "portable", "hopper", "cudnn" }) do
          assert.equal(k == kind and 1 or 0, r1.fwd[k] - r0.fwd[k], adt .. " " .. k)
        end
        if adt == "none" then
          local bk = D == "cpu" and "cpu" or b.bwd_why:find("kernel: hopper", 1, true) and "hopper" or "portable"
          dl.attn.bwd(out, x.q, x.k, x.v, out, lse, opts(x))
          local r2 = dl.attn.runs()
          assert.equal(1, r2.bwd[bk] - r1.bwd[bk])
          assert.equal(0, r2.fwd.cpu + r2.fwd.portable + r2.fwd.hopper - r1.fwd.cpu - r1.fwd.portable - r1.fwd.hopper)
        end
      end
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

-- ---- f32 on the cpu: a reference in fp32 (issue 54) ----------------------------------

describe("attn in f32 on the cpu", function()
  it("forward equals the bf16 step's f32 out on the same values; backward keeps f32's digits", function()
    local q = dl.randn({ 2, 33, 4, 64 }, { dtype = "bf16", seed = 3 })
    local k = dl.randn({ 2, 33, 2, 64 }, { dtype = "bf16", seed = 4 })
    local v = dl.randn({ 2, 33, 2, 64 }, { dtype = "bf16", seed = 5 })
    local dout = dl.randn({ 2, 33, 4, 64 }, { dtype = "bf16", seed = 6 })
    local o16, l16 = dl.attn.fwd(q, k, v, { mask = "causal", out = dl.empty({ 2, 33, 4, 64 }, "f32") })
    local o32, l32 = dl.attn.fwd(q:f32(), k:f32(), v:f32(), { mask = "causal" })
    assert.equal("f32", o32.dtype)
    assert.is_true(dl.rel_err(o32, o16) <= 1e-6, tostring(dl.rel_err(o32, o16)))
    assert.is_true(dl.rel_err(l32, l16) <= 1e-6, tostring(dl.rel_err(l32, l16)))
    local dq32 = dl.attn.bwd(dout:f32(), q:f32(), k:f32(), v:f32(), o32, l32, { mask = "causal" })
    local dq16 = dl.attn.bwd(dout, q, k, v, o16:bf16(), l16, { mask = "causal" })
    assert.equal("f32", dq32.dtype)
    assert.is_true(dl.rel_err(dq16, dq32) <= 2 ^ -7, tostring(dl.rel_err(dq16, dq32)))
    -- f32's digits, not bf16's: dq32 differs from its own bf16 rounding
    assert.is_true(dl.rel_err(dq32:bf16(), dq32) > 0)
  end)

  it("is refused on cuda, saying f32 is for the cpu", function()
    if dl.cuda_device_count() == 0 then return end
    local q = dl.zeros({ 1, 4, 2, 64 }, { dtype = "f32", device = "cuda" })
    assert.error_matches(function() dl.attn.fwd(q, q, q) end, "q must be bf16 or f16 on cuda (f32 is for a reference on the cpu), got f32", 1, true)
  end)
end)

-- ---- bad input, meta ----------------------------------------------------------------

describe("attn refuses bad input", function()
  local function q(...) return dl.zeros({ ... }, "bf16") end
  local function fails(fn, msg) assert.error_matches(fn, msg, 1, true) end
  it("names the argument", function()
    local a, k = q(1, 4, 2, 8), q(1, 4, 2, 8)
    fails(function() dl.attn.fwd(a:f64(), k:f64(), k:f64()) end, "attn.fwd: q must be bf16 or f16 (or f32), got f64")
    fails(function() dl.attn.fwd(a:f32(), k, k) end, "attn.fwd: k is bf16 but q is f32")
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
    -- dq, dk, dv, plus the workspace: the fp32 dq accumulator, then row sums and the Hopper kernel's
    -- lse log2(e), each in rows padded to 64, plus 64 a batch (dl_attn_bwd_lse_rows)
    assert.equal(3 * unit + 2 * unit + 2 * (2 * 4096 + 2 * 64) * 16 * 4, tag.peak)
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
    assert.equal(3 * unit + 2 * unit + 2 * (1024 + 2 * 64) * 4 * 4, dl.mem.stats("meta").tags.attn_spec_thd.peak)
  end)
end)
