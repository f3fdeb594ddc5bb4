-- dl.cp.register_correction: a correction defined outside the library
-- (spec/cp/custom_correction.lua, written as a user's script) runs in the
-- p2p schedule on 2 and 4 cpu ranks and matches single-rank attention,
-- forward and backward; its peak formula equals what meta measures for
-- every layout, mask and C; the library's experiments/cp example runs; and
-- the registry refuses what it should, naming what it knows.
local dl = require "distlab"
local H = require "helpers"

local function count(out, pat)
  local _, k = out:gsub(pat, "")
  return k
end

describe("a correction of one's own in the p2p schedule", function()
  for _, n in ipairs { 2, 4 } do
    it(n .. " cpu ranks: out, lse, dq, dk, dv against single-rank attention", function()
      local rc, out = H.distlab(string.format("run -n %d --device cpu spec/cp/custom_correction.lua run", n))
      assert.equal(0, rc, out)
      assert.equal(n, count(out, "custom correction ok"), out)
    end)
  end

  it("the example in experiments/cp runs on 4 cpu ranks and beats the bf16 running outputs", function()
    local rc, out = H.distlab("run -n 4 --device cpu experiments/cp/f32_partials.lua")
    assert.equal(0, rc, out)
    assert.truthy(out:find("f32_partials ok", 1, true), out)
  end)
end)

describe("a correction of one's own on GPUs #multigpu", function()
  it(H.gpu_ranks .. " ranks: the spec's correction and the experiments/cp example", function()
    local rc, out = H.distlab(string.format("run -n %d --device cuda spec/cp/custom_correction.lua run", H.gpu_ranks))
    assert.equal(0, rc, out)
    assert.equal(H.gpu_ranks, count(out, "custom correction ok"), out)
    -- ranks sharing a GPU write no results where they belong: a folder of the spec's own
    local dir = H.tmpname("-f32p")
    rc, out = H.distlab(string.format("run -n %d --device cuda experiments/cp/f32_partials.lua --out %s", H.gpu_ranks, dir))
    os.execute("rm -rf " .. dir)
    assert.equal(0, rc, out)
    assert.truthy(out:find("f32_partials ok", 1, true), out)
  end)
end)

local shapes = H.cp_shapes

describe("a registered correction's peak formula on meta", function()
  local spec = dofile(H.root .. "/spec/cp/custom_correction.lua")

  it("equals the measured peak for C = 1..64, every layout and mask, MHA and GQA, both buffer counts", function()
    local bad = {}
    for _, C in ipairs { 1, 2, 3, 4, 8, 64 } do
      for _, r in ipairs(C <= 2 and { 0, C - 1 } or { 0, math.floor(C / 2), C - 1 }) do
        local comm = dl.comm.meta(C, r)
        for _, layout in ipairs { "bshd", "sbhd", "thd" } do
          for _, mask in ipairs { "causal", "none" } do
            for _, heads in ipairs { { 2 * C, 2 * C }, { 2 * C, C } } do
              for _, cb in ipairs { 2, "per_step" } do
                for _, how in ipairs { "post_loop_f32", spec } do
                  local cp = dl.cp.attention { comm = comm, layout = layout, mask = mask, comm_buffers = cb,
                    correction = how }
                  local qs, kvs, seq = shapes(layout, C, heads[1], heads[2])
                  local m = cp:memory(qs, kvs, kvs, { seq = seq })
                  for _, what in ipairs { "fwd", "bwd" } do
                    if m[what].peak ~= m.formula[what] then
                      bad[#bad + 1] = string.format("C=%d r=%d %s %s h=%d/%d buffers=%s %s: measured %d, formula %d",
                        C, r, layout, mask, heads[1], heads[2], cb, what, m[what].peak, m.formula[what])
                    end
                  end
                end
              end
            end
          end
        end
        comm:free()
      end
    end
    assert.equal(0, #bad, table.concat(bad, "\n"))
  end)

  it("charges the per-step partials in fp32: twice the bf16 post_loop's", function()
    local comm = dl.comm.meta(4, 3)
    local function parts(corr)
      local m = dl.cp.attention { comm = comm, correction = corr }:memory({ 2, 64, 8, 64 }, { 2, 64, 8, 64 },
        { 2, 64, 8, 64 })
      return m.fwd.rows
    end
    local function tag(rows, name)
      for _, row in ipairs(rows) do if row.tag == name then return row.peak end end
      return 0
    end
    local f32, bf16 = parts("post_loop_f32"), parts("post_loop")
    assert.equal(2 * tag(bf16, "out_per_step"), tag(f32, "out_per_step"))
    assert.equal(tag(bf16, "lse_per_step"), tag(f32, "lse_per_step"))
    comm:free()
  end)
end)

describe("the correction registry", function()
  local comm = dl.comm.meta(4, 1)
  local function err(fn)
    local ok, e = pcall(fn)
    assert.is_false(ok)
    return tostring(e)
  end
  local good = { start = function() end, step = function() end, finish = function() end, peak = function() return 0 end }

  it("lists the registered names, the library's and one's own, live", function()
    dl.cp.register_correction("spec_noop", good)
    local names = table.concat(dl.cp.corrections.names(), ",")
    assert.truthy(names:find("fused", 1, true) and names:find("spec_noop", 1, true), names)
    assert.same({ "fused", "incremental", "post_loop" }, dl.cp.corrections.library)
    local e = err(function() dl.cp.attention { comm = comm, correction = "nope" } end)
    assert.truthy(e:find("correction = nope is not one of", 1, true) and e:find("spec_noop", 1, true), e)
    assert.equal("spec_noop", dl.cp.attention { comm = comm, correction = "spec_noop" }.correction)
    -- the specs share one process: the schedules' sweeps over the registry must not meet it
    dl.cp.unregister_correction("spec_noop")
    assert.falsy(table.concat(dl.cp.corrections.names(), ","):find("spec_noop", 1, true))
    assert.matches("no correction spec_noop is registered", err(function() dl.cp.unregister_correction("spec_noop") end))
    assert.matches("fused is the library's own", err(function() dl.cp.unregister_correction("fused") end))
  end)

  it("refuses bad names, the library's names, and specs with missing or unknown keys", function()
    assert.matches("name must be letters, digits and _", err(function() dl.cp.register_correction("a b", good) end))
    assert.matches("fused is the library's own correction",
      err(function() dl.cp.register_correction("fused", good) end))
    assert.matches("the correction has no peak", err(function()
      dl.cp.register_correction("spec_bad", { start = good.start, step = good.step, finish = good.finish })
    end))
    local e = err(function() dl.cp.attention { comm = comm, correction = { start = good.start, stpe = good.step } } end)
    assert.truthy(e:find("unknown key stpe", 1, true) and e:find("known: doc, finish, name, peak, start, step", 1, true), e)
    assert.matches("finish must be a function", err(function()
      dl.cp.register_correction("spec_bad", { start = good.start, step = good.step, finish = 1, peak = good.peak })
    end))
  end)

  it("gives the geometry the element size and head dims a formula needs", function()
    local cp = dl.cp.attention { comm = comm }
    local q = dl.empty({ 2, 8, 4, 32 }, { dtype = "bf16", device = "meta" })
    local k = dl.empty({ 2, 8, 2, 32 }, { dtype = "bf16", device = "meta" })
    local v = dl.empty({ 2, 8, 2, 16 }, { dtype = "bf16", device = "meta" })
    local g = cp:geometry(q, k, v)
    assert.same({ 2, 4, 2, 32, 16 }, { g.e, g.hq, g.hkv, g.dqk, g.dv })
    assert.equal(g.rows * g.hq * g.dv * g.e, g.Uo)
  end)
end)

describe("dl.attn.fwd with an f32 out (the partials a correction keeps in fp32)", function()
  local function rnd(shape, seed) return dl.randn(shape, { seed = seed }):bf16() end

  it("writes the step's result unrounded: rounded to bf16 it is the bf16 out, bit for bit; lse the same", function()
    local q, k, v = rnd({ 2, 12, 4, 16 }, 1), rnd({ 2, 12, 2, 16 }, 2), rnd({ 2, 12, 2, 16 }, 3)
    for _, mask in ipairs { "none", "causal" } do
      local o16, l16 = dl.attn.fwd(q, k, v, { mask = mask })
      local o32, l32 = dl.attn.fwd(q, k, v, { mask = mask, out = dl.empty({ 2, 12, 4, 16 }, "f32") })
      assert.equal("f32", o32.dtype)
      assert.equal(o16:bytes(), o32:bf16():bytes())
      assert.equal(l16:bytes(), l32:bytes())
      assert.is_true(dl.rel_err(o16:f32(), o32) > 0) -- it kept more than bf16 holds
    end
  end)

  it("thd: rows outside the sequences come out 0 and lse -inf; a view of rows works", function()
    local cu = dl.from_table({ 0, 3, 3, 8 }, "i32")
    local pad = dl.from_table({ 0, 4, 6, 14 }, "i32")
    local q, k, v = rnd({ 14, 2, 8 }, 4), rnd({ 14, 2, 8 }, 5), rnd({ 14, 2, 8 }, 6)
    local o = { layout = "thd", cu_seqlens_q = cu, cu_seqlens_kv = cu, cu_seqlens_q_padded = pad,
      cu_seqlens_kv_padded = pad, mask = "causal" }
    local o16, l16 = dl.attn.fwd(q, k, v, o)
    o.out = dl.full({ 14, 2, 8 }, 7, "f32")
    o.lse = dl.full({ 2, 14 }, 7, "f32")
    local o32, l32 = dl.attn.fwd(q, k, v, o)
    assert.equal(o16:bytes(), o32:bf16():bytes())
    assert.equal(l16:bytes(), l32:bytes())
    assert.equal(0, dl.max_abs_diff(o32:narrow(1, 4, 1), dl.zeros(1, 2, 8)))
    assert.equal(0, dl.max_abs_diff(o32:narrow(1, 14, 1), dl.zeros(1, 2, 8)))
    assert.equal(-math.huge, l32:narrow(2, 4, 1):narrow(1, 1, 1):item())
  end)

  it("refuses an out of another dtype, naming it", function()
    local q = rnd({ 1, 4, 2, 8 }, 7)
    local ok, e = pcall(dl.attn.fwd, q, q, q, { out = dl.empty({ 1, 4, 2, 8 }, "f16") })
    assert.is_false(ok)
    assert.truthy(tostring(e):find("out must be bf16, got f16", 1, true), tostring(e))
  end)
end)
