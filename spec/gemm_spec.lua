-- GEMM (distlab.gemm): dl.gemm on cpu (the fp64 twin) and, tagged #gpu, on
-- cuda (cuBLASLt) against a plain fp64 triple loop in Lua on fresh random
-- inputs (spec/gemm_ref.lua: an element-wise bound from the output dtype's
-- rounding and the fp32 sum, and the normwise one it implies), outputs
-- poisoned with NaN before each call: every dtype pair, transposed and
-- strided views, odd and empty shapes, alpha/beta and a separate addend, in
-- place at beta 1 rounded once (exact inputs, bit for bit; twice must fail),
-- bad arguments, a planted 2% error that the check must catch; on meta the
-- accounting; on cuda the algorithm cache, graph capture, the workspace,
-- and a clear error where cuBLASLt cannot be loaded.
local dl = require "distlab"
local H = require "helpers"
local R = require "gemm_ref"

local seed = (tonumber(os.getenv("DISTLAB_SEED")) or os.time()) % 100000 * 16

local function inputs(m, k, n, dtype, device)
  seed = seed + 2
  return dl.randn({ m, k }, { dtype = dtype, device = device, seed = seed }),
    dl.randn({ k, n }, { dtype = dtype, device = device, seed = seed + 1 })
end

local function nan(shape, dtype, device) return dl.full(shape, 0 / 0, { dtype = dtype, device = device }) end

-- the message of a failed check, or nil
local function verdict(got, a, b, opts, what)
  local ref, abs = R.matmul(a, b, opts)
  return (R.check(got, ref, abs, R.u[got.dtype], R.sum_bound(a:size(2), R.u[got.dtype]), what))
end

local function expect(got, a, b, opts, what)
  local msg = verdict(got, a, b, opts, what)
  assert(msg == nil, msg)
end

-- the error of fn, which must name this file (the caller's line)
local function refuses(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.truthy(tostring(err):find(pattern), err)
  assert.truthy(tostring(err):find("gemm_spec.lua:%d+:"), "the error should point at the caller: " .. tostring(err))
end

for _, dev in ipairs(H.devices) do
  local D = dev.name
  describe("dl.gemm on " .. D .. dev.tag, function()
    it("bf16 and f16 in, their dtype or f32 out, given or allocated, against fp64", function()
      for _, din in ipairs { "bf16", "f16" } do
        for _, dout in ipairs { din, "f32" } do
          local a, b = inputs(37, 53, 29, din, D)
          local out = nan({ 37, 29 }, dout, D)
          assert.equal(out, dl.gemm(a, b, out))
          expect(out, a, b, nil, din .. " -> " .. dout)
          local made = dl.gemm(a, b, { out_dtype = dout })
          assert.same({ 37, 29 }, made.shape)
          assert.equal(dout, made.dtype)
          expect(made, a, b, nil, din .. " -> " .. dout .. " allocated")
        end
      end
    end)

    it("transposed views of a and b, and a column-major out, without copies", function()
      local m, k, n = 45, 70, 33
      local xa = dl.randn({ k, m }, { dtype = "bf16", device = D, seed = seed + 7 })
      local xb = dl.randn({ n, k }, { dtype = "bf16", device = D, seed = seed + 8 })
      local a, b = xa:transpose(1, 2), xb:transpose(1, 2)
      local ac, bc = a:contiguous(), b:contiguous()
      for _, case in ipairs { { a, bc }, { ac, b }, { a, b } } do
        local out = nan({ m, n }, "bf16", D)
        dl.gemm(case[1], case[2], out)
        expect(out, case[1], case[2], nil, "transposed")
        local cm = nan({ n, m }, "f32", D):transpose(1, 2) -- column-major [m, n]
        dl.gemm(case[1], case[2], cm)
        expect(cm, case[1], case[2], nil, "column-major out")
      end
    end)

    it("odd shapes, several tiles of the twin, m = 0 and k = 0", function()
      for _, s in ipairs { { 1, 1, 1 }, { 1, 7, 5 }, { 7, 1, 5 }, { 5, 3, 1 }, { 3, 1, 4 }, { 130, 300, 520 } } do
        local a, b = inputs(s[1], s[2], s[3], "bf16", D)
        local out = nan({ s[1], s[3] }, "bf16", D)
        dl.gemm(a, b, out)
        expect(out, a, b, nil, table.concat(s, "x"))
      end
      local a, b = inputs(4, 0, 6, "f16", D)
      local out = nan({ 4, 6 }, "f16", D)
      dl.gemm(a, b, out)
      assert.equal(0, dl.max_abs_diff(out, dl.zeros({ 4, 6 }, "f16", D)))
      local c = dl.randn({ 4, 6 }, { dtype = "f16", device = D, seed = seed + 9 })
      dl.gemm(a, b, out, { beta = 2, c = c })
      assert.equal(0, dl.max_abs_diff(out, c:clone():mul_(2)))
      local e, f = inputs(0, 5, 3, "bf16", D)
      assert.same({ 0, 3 }, dl.gemm(e, f).shape)
    end)

    it("alpha, beta, a separate addend, in place, and NaN in an addend that beta = 0 ignores", function()
      local a, b = inputs(19, 40, 23, "bf16", D)
      local c = dl.randn({ 19, 23 }, { dtype = "f32", device = D, seed = seed + 11 })
      local out = nan({ 19, 23 }, "f32", D)
      dl.gemm(a, b, out, { alpha = 0.5, beta = 2, c = c })
      expect(out, a, b, { alpha = 0.5, beta = 2, c = c }, "alpha 0.5, beta 2, c")
      local acc = c:clone()
      dl.gemm(a, b, acc, { beta = 1 })
      expect(acc, a, b, { beta = 1, c = c }, "in place, beta 1")
      local poisoned = nan({ 19, 23 }, "f32", D)
      dl.gemm(a, b, out, { c = poisoned })
      expect(out, a, b, nil, "beta 0 ignores c")
    end)

    it("bf16 and f16 accumulated in place (c is out, beta 1) round once; rounding twice fails the check", function()
      -- cuBLASLt 13.1 on an H200 rounded this call twice with c in place (core/ops/gemm/gemm_internal.h)
      local m, k, n = 1024, 512, 768
      for _, dt in ipairs { "bf16", "f16" } do
        seed = seed + 3
        local a = R.exact_inputs({ m, k }, dt, D, seed, "a")
        local b = R.exact_inputs({ k, n }, dt, D, seed + 1, "b")
        local c = R.exact_inputs({ m, n }, dt, D, seed + 2, "c")
        local ref = R.matmul(a, b, { beta = 1, c = c })
        local acc = c:clone()
        dl.gemm(a, b, acc, { beta = 1 })
        local msg = R.check_rounded_once(acc, ref, dt .. " in place, beta 1")
        assert(msg == nil, msg)
        local twice = dl.gemm(a, b):add_(c) -- rn(rn(a @ b) + c)
        assert.truthy(R.check_rounded_once(twice, ref), dt .. ": rounding twice passed the check")
      end
    end)

    it("strided views with a unit stride; other strides are refused", function()
      local big = dl.randn({ 21, 50 }, { dtype = "bf16", device = D, seed = seed + 13 })
      local a = big:narrow(2, 4, 40) -- row stride 50
      local bigb = dl.randn({ 44, 17 }, { dtype = "bf16", device = D, seed = seed + 14 })
      local b = bigb:narrow(1, 3, 40)
      local host = nan({ 21, 30 }, "bf16", D)
      local out = host:narrow(2, 5, 17) -- row stride 30
      dl.gemm(a, b, out)
      expect(out, a, b, nil, "strided")
      local left = host:narrow(2, 1, 4):float():tolist()
      assert.is_true(left[1][1] ~= left[1][1], "wrote outside the out view")
      local odd = big:as_strided({ 10, 20 }, { 100, 2 }, 0)
      refuses(function() dl.gemm(odd, bigb:narrow(1, 1, 20)) end, "unit stride")
    end)

    it("refuses an out that overlaps a or b, a c that overlaps out or is laid out otherwise", function()
      local a, b = inputs(8, 8, 8, "bf16", D)
      refuses(function() dl.gemm(a, b, a) end, "out overlaps a")
      local big = dl.zeros({ 8, 9 }, "bf16", D)
      refuses(function() dl.gemm(a, b, big:narrow(2, 1, 8), { beta = 1, c = big:narrow(2, 2, 8) }) end,
        "c overlaps out")
      local cm = dl.zeros({ 8, 8 }, "bf16", D):transpose(1, 2)
      refuses(function() dl.gemm(a, b, dl.empty({ 8, 8 }, "bf16", D), { beta = 1, c = cm }) end,
        "c and out must both be row%-major or both column%-major")
    end)

    it("bad arguments are errors at the caller's line", function()
      local a, b = inputs(4, 6, 5, "bf16", D)
      refuses(function() dl.gemm(a:view(24), b) end, "a must be 2%-D")
      refuses(function() dl.gemm(a, a) end, "a's columns must equal b's rows")
      refuses(function() dl.gemm(a:float(), b:float()) end, "both be bf16 or both f16")
      refuses(function() dl.gemm(a, b:half()) end, "both be bf16 or both f16")
      refuses(function() dl.gemm(a, b, { out_dtype = "f16" }) end, "out_dtype f16 with bf16 inputs")
      refuses(function() dl.gemm(a, b, dl.empty({ 4, 5 }, "f16", D)) end, "out is f16 with bf16 inputs")
      refuses(function() dl.gemm(a, b, dl.empty({ 5, 4 }, "bf16", D)) end, "out is %[5, 4%] but a @ b is %[4, 5%]")
      refuses(function() dl.gemm(a, b, { alpah = 2 }) end, "unknown option alpah")
      refuses(function() dl.gemm(a, 3) end, "b must be a tensor")
      refuses(function() dl.gemm(a, dl.empty({ 6, 5 }, { dtype = "bf16", device = "meta" })) end, "b is on meta")
      if D == "cpu" then
        refuses(function() dl.gemm(a, b, { workspace = dl.empty({ 8 }, "u8") }) end, "a workspace is for cuda")
      end
    end)

    it("the check catches a planted 2% error (the whole result, or one element) and bf16 partial sums", function()
      local a, b = inputs(24, 64, 20, "bf16", D)
      local out = dl.gemm(a, b, { out_dtype = "f32" })
      expect(out, a, b, nil, "clean")
      assert.truthy(verdict(out:clone():mul_(1.02), a, b, nil, "scaled"), "a 2% scale passed the check")
      -- the element largest in magnitude (|x| ~ 8 * 2.5 here), 2% off
      local one, best, bi, bj = out:to("cpu"), -1, 1, 1
      for i, row in ipairs(one:tolist()) do
        for j, x in ipairs(row) do
          if math.abs(x) > best then best, bi, bj = math.abs(x), i, j end
        end
      end
      one:narrow(1, bi, 1):narrow(2, bj, 1):mul_(1.02)
      assert.truthy(verdict(one, a, b, nil, "one element"), "one element 2% off passed the check")
      -- a split-K GEMM that adds its two K-halves rounded to bf16 (a reduction in the output
      -- type, which cuBLASLt may pick unless told not to): not fp32 accumulation, so it must fail
      local a2, b2 = inputs(48, 700, 40, "bf16", D)
      local lo = dl.gemm(a2:narrow(2, 1, 350), b2:narrow(1, 1, 350))
      local hi = dl.gemm(a2:narrow(2, 351, 350), b2:narrow(1, 351, 350))
      assert.truthy(verdict(lo:float():add_(hi:float()):bf16(), a2, b2, nil, "bf16 partials"),
        "partial sums rounded to bf16 passed the check")
      expect(dl.gemm(a2, b2), a2, b2, nil, "the same GEMM in one piece")
    end)
  end)
end

describe("dl.gemm on meta", function()
  it("allocates the output and charges its workspace to gemm_workspace, running nothing", function()
    dl.mem.reset_peak("meta")
    local a = dl.empty({ 4096, 1024 }, { dtype = "bf16", device = "meta" })
    local b = dl.empty({ 1024, 512 }, { dtype = "bf16", device = "meta" })
    local out = dl.mem.tag("gemm_out_spec", function() return dl.gemm(a, b, { out_dtype = "f32" }) end)
    assert.same({ 4096, 512 }, out.shape)
    local st = dl.mem.stats("meta")
    assert.equal(dl.gemm.workspace_bytes, st.tags.gemm_workspace.peak)
    assert.equal(0, st.tags.gemm_workspace.current)
    assert.equal(4096 * 512 * 4, st.tags.gemm_out_spec.current)
  end)

  it("charges a copy of c to gemm_c_copy, held with the workspace, where c is a 16-bit out with beta != 0", function()
    local a = dl.empty({ 512, 1024 }, { dtype = "bf16", device = "meta" })
    local b = dl.empty({ 1024, 256 }, { dtype = "bf16", device = "meta" })
    local acc = dl.empty({ 512, 256 }, { dtype = "bf16", device = "meta" })
    dl.mem.reset_peak("meta")
    local base = dl.mem.stats("meta").allocated
    dl.gemm(a, b, acc, { beta = 1 })
    local st = dl.mem.stats("meta")
    assert.equal(512 * 256 * 2, st.tags.gemm_c_copy.peak)
    assert.equal(0, st.tags.gemm_c_copy.current)
    assert.equal(base + 512 * 256 * 2 + dl.gemm.workspace_bytes, st.allocated_peak) -- both held at once
    dl.mem.reset_peak("meta")
    dl.gemm(a, b, acc) -- beta 0: no copy
    dl.gemm(a, b, dl.empty({ 512, 256 }, { dtype = "f32", device = "meta" }), { beta = 1 }) -- f32: no copy
    dl.gemm(a, b, acc, { beta = 1, c = dl.empty({ 512, 256 }, { dtype = "bf16", device = "meta" }) }) -- c apart
    assert.is_nil(dl.mem.stats("meta").tags.gemm_c_copy)
  end)
end)

describe("dl.gemm on cuda #gpu", function()
  local D = "cuda:0"

  it("a few hundred in each dimension, bf16 and f16, against fp64", function()
    for _, dt in ipairs { "bf16", "f16" } do
      local a, b = inputs(300, 700, 500, dt, D)
      local out = nan({ 300, 500 }, dt, D)
      dl.gemm(a, b, out)
      expect(out, a, b, nil, dt .. " 300x700x500")
    end
  end)

  it("asks cuBLASLt's heuristic once per configuration and reuses its choice", function()
    local a, b = inputs(128, 256, 192, "bf16", D)
    local out = dl.empty({ 128, 192 }, "bf16", D)
    dl.gemm(a, b, out)
    local s0 = dl.gemm.stats()
    assert.is_true(s0.version >= 120000, "cuBLASLt version " .. s0.version)
    dl.gemm(a, b, out)
    dl.gemm(a, b, out)
    local s1 = dl.gemm.stats()
    assert.equal(s0.heuristics, s1.heuristics)
    assert.equal(s0.calls + 2, s1.calls)
    local a2 = dl.empty({ 128, 257 }, "bf16", D):narrow(2, 2, 256) -- 2-byte aligned rows: another key
    a2:copy_(a)
    dl.gemm(a2, b, out)
    expect(out, a2, b, nil, "misaligned a")
    assert.equal(s1.heuristics + 1, dl.gemm.stats().heuristics)
  end)

  it("keeps a MoE step's configurations: 400 shapes asked again in turn ask no heuristic", function()
    -- a step of 64 experts' grouped GEMMs brings 6 x 64 shapes; cycled through a cache smaller than
    -- that, least recently used out, every call missed (block-h200x2.md: 8-15 ms of host time a call)
    local _, b = inputs(8, 64, 64, "bf16", D)
    local outs, as = {}, {}
    for m = 1, 400 do
      as[m] = dl.empty({ m, 64 }, "bf16", D):fill_(1)
      outs[m] = dl.empty({ m, 64 }, "bf16", D)
    end
    for m = 1, 400 do dl.gemm(as[m], b, outs[m]) end
    local s0 = dl.gemm.stats()
    for m = 1, 400 do dl.gemm(as[m], b, outs[m]) end
    assert.equal(s0.heuristics, dl.gemm.stats().heuristics)
    assert.is_true(dl.gemm.stats().cached >= 400)
  end)

  it("is captured in a CUDA graph and replays with new data", function()
    local a, b = inputs(96, 160, 64, "bf16", D)
    local out = dl.empty({ 96, 64 }, "f32", D)
    local ws = dl.empty({ dl.gemm.workspace_bytes }, "u8", D)
    -- on D's stream (the default device is cpu here, where capture only records the function);
    -- a configuration not met before, so the heuristic is asked inside the capture
    local g = dl.graph.capture(function() dl.gemm(a, b, out, { workspace = ws }) end, { device = D })
    assert.is_true(g:nodes() >= 1, "captured " .. g:nodes() .. " nodes")
    for r = 1, 3 do
      local na, nb = inputs(96, 160, 64, "bf16", D)
      a:copy_(na)
      b:copy_(nb)
      out:fill_(0 / 0)
      g:replay()
      dl.synchronize(D)
      expect(out, na, nb, nil, "replay " .. r)
    end
    g:free()
  end)

  it("takes a workspace, or allocates one per call under gemm_workspace; too small is an error", function()
    local a, b = inputs(64, 64, 64, "bf16", D)
    dl.mem.reset_peak(D)
    dl.gemm(a, b)
    local st = dl.mem.stats(D)
    assert.is_true(st.tags.gemm_workspace.peak >= dl.gemm.workspace_bytes)
    refuses(function() dl.gemm(a, b, { workspace = dl.empty({ 1024 }, "u8", D) }) end, "the workspace holds 1024 bytes")
  end)

  it("without cuBLASLt: a clear error naming it, and the rest of distlab still works", function()
    -- a on cpu by name: under --device cuda the default device is cuda:0
    local file = H.write(H.tmpname(".lua"), [[
      local dl = require "distlab"
      local a = dl.randn({ 8, 8 }, { dtype = "bf16", device = "cpu" })
      local ok, err = pcall(dl.gemm, a:cuda(0), a:cuda(0))
      print("ERR: " .. (ok and "none" or tostring(err)))
      print("CPU: " .. tostring(dl.gemm(a, a):numel()))
      local x = a:cuda(0):float():add_(1)
      print("CUDA: " .. tostring(dl.max_abs_diff(x:cpu(), a:float():add_(1))))
    ]])
    local rc, out = H.distlab("run -n 1 --device cuda " .. file, "DISTLAB_CUBLASLT=/nonexistent/libcublasLt.so.13")
    os.remove(file)
    assert.equal(0, rc, out)
    assert.truthy(out:find("ERR: [^\n]*cannot load cuBLASLt %(libcublasLt%)[^\n]*"), out)
    assert.truthy(out:find("/nonexistent/libcublasLt.so.13", 1, true), out)
    assert.truthy(out:find("CPU: 64", 1, true), out)
    assert.truthy(out:find("CUDA: 0\n", 1, true), out)
  end)
end)
