-- distlab.bench.attn_rows (the benches' fp64 check of attention at sampled
-- rows) against spec/attn_ref.lua's naive reference: every tiny case (bshd,
-- sbhd, thd with gaps, masks, windows, alignments, GQA/MQA, MLA head dims)
-- checked in full agrees to fp64 rounding; sampled rows pick every slice;
-- ranks sharing the work check each slice once; a result scaled by 1.01, a
-- NaN row, a wrong lse handed to the backward and a non-zero gap row fail.
local dl = require "distlab"
local R = require "attn_ref"
local rows = require "distlab.bench.attn_rows"

-- inputs, the naive reference (out, lse, and the gradients from them) and the options
local function case(c)
  local x = R.build(c)
  local o = R.opts(x)
  local out, lse = dl.attn.fwd(x.q, x.k, x.v, o)
  local r = R.ref_fwd(x, out, lse)
  local dout = R.clamped(out.shape, c.dtype, x.qgaps)
  local dq, dk, dv = R.ref_bwd(x, dout, r.out, r.lse)
  return x, o, dout, { out = r.out, lse = r.lse, dq = dq, dk = dk, dv = dv }
end

local function copy(got)
  local t = {}
  for k, v in pairs(got) do t[k] = v:clone() end
  return t
end

describe("attn_rows: the fp64 rows reference", function()
  for _, c in ipairs(R.cases(false)) do
    it("agrees with the naive reference in full: " .. R.describe_case(c), function()
      local x, o, dout, ref = case(c)
      local chk = rows.prepare { q = x.q, k = x.k, v = x.v, dout = dout, opts = o, all = true }
      local n, msg, err = chk:check(ref)
      assert.equal(0, n, msg)
      for name, e in pairs(err) do assert.is_true(e < 1e-12, name .. " " .. e) end
    end)
  end

  it("samples query rows of every slice, key rows of 4, and ranks share them without overlap", function()
    local c = R.with(R.TINY.thd, { dtype = "bf16", mask = "causal" })
    local x, o, dout, ref = case(c)
    local full = rows.prepare { q = x.q, k = x.k, v = x.v, dout = dout, opts = o, elements = 16 * 6 }
    assert.equal(3 * 4, #full.qslices) -- sequences with rows (one is empty) x 4 heads
    for _, s in ipairs(full.qslices) do assert.is_true(#s.rows >= 1) end
    assert.equal(4, #full.kslices) -- key rows in 4 of the 8 (sequence, kv head) slices with keys
    local n0 = select(1, full:check(ref))
    assert.equal(0, n0)
    local a = rows.prepare { q = x.q, k = x.k, v = x.v, dout = dout, opts = o, elements = 16 * 6, part = { 0, 2 } }
    local b = rows.prepare { q = x.q, k = x.k, v = x.v, dout = dout, opts = o, elements = 16 * 6, part = { 1, 2 } }
    assert.equal(full.nq, a.nq + b.nq)
    assert.is_true(a.nq > 0 and b.nq > 0)
    assert.equal(0, (a:check(ref)))
    assert.equal(0, (b:check(ref)))
  end)

  it("fails a result scaled by 1.01, a NaN row, a wrong handed lse and a non-zero gap row", function()
    local c = R.with(R.TINY.thd, { dtype = "bf16", mask = "causal", q_lens = { 40, 0, 1, 60 },
      kv_lens = { 50, 2, 1, 40 } })
    local x, o, dout, ref = case(c)
    local chk = rows.prepare { q = x.q, k = x.k, v = x.v, dout = dout, opts = o, all = true }
    assert.equal(0, (chk:check(ref)))
    for _, name in ipairs { "out", "lse", "dq", "dk", "dv" } do
      local got = copy(ref)
      got[name]:mul_(1.01)
      local n, msg = chk:check(got)
      assert.is_true(n > 0, name)
      assert.truthy(msg:find(name .. ": ", 1, true), msg)
      assert.truthy(msg:find("normwise", 1, true), msg)
    end
    local got = copy(ref)
    got.dq:narrow(1, x.qs[1] + 5, 1):fill_(0 / 0)
    local n, msg = chk:check(got)
    assert.is_true(n >= c.hq * c.dqk, msg)
    got = copy(ref)
    got.lse:fill_(0 / 0)
    n, msg = chk:check { out = got.out, lse = got.lse, dk = got.dk, dv = got.dv }
    assert.truthy(msg:find("not finite", 1, true), msg)
    got = copy(ref)
    got.out:narrow(1, x.qgaps[1] + 1, 1):fill_(1)
    n, msg = chk:check(got)
    assert.equal(c.hq * c.dv, n, msg)
    assert.truthy(msg:find("outside the sequences", 1, true), msg)
  end)
end)
