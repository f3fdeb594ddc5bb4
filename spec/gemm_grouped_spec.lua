-- Grouped GEMM (dl.gemm.grouped, grouped_dx, grouped_dw): the three expert
-- GEMMs of a MoE layer on cpu (the fp64 twin) and, tagged #gpu, on cuda
-- (cuBLAS's grouped GEMM and a cuBLASLt GEMM per expert, on one stream and
-- several), each expert against a plain fp64 loop in Lua (spec/gemm_ref.lua:
-- element-wise and normwise bounds from the output's rounding and the fp32
-- sum) on fresh random inputs with the outputs poisoned: expert-major and
-- packed rows, skewed counts with empty and full experts, counts as int32 and
-- int64 tensors and Lua lists, transposed weights, f32 out, accumulation
-- (into bf16 and f16 dw on exact inputs: rounded once, bit for bit), the
-- rows past the counts left alone; a planted 2% error (the whole result or
-- one element) that the check must catch; bad arguments named at the
-- caller's line; on meta the accounting.
local dl = require "distlab"
local H = require "helpers"
local R = require "gemm_ref"

local seed = (tonumber(os.getenv("DISTLAB_SEED")) or os.time()) % 100000 * 16 + 7

local function randn(shape, dtype, device)
  seed = seed + 1
  return dl.randn(shape, { dtype = dtype, device = device, seed = seed })
end

local function nan(shape, dtype, device) return dl.full(shape, 0 / 0, { dtype = dtype, device = device }) end

-- counts as the call takes them: a Lua list, or an int32/int64 tensor on a device
local function counts_as(list, kind, device)
  if kind == "list" then return list end
  return dl.from_table(list, { dtype = kind, device = device })
end

-- expert e's rows (1-based e) of a rows operand: x[e][1..c] or the packed rows after `first`
local function rows(t, e, first, c)
  if t:dim() == 3 then return t:select(1, e):narrow(1, 1, c) end
  return t:narrow(1, first + 1, c)
end

-- nil or the message of the first expert whose result breaks its bound
local function verdict(op, got, a, b, counts, opts)
  opts = opts or {}
  local first = 0
  for e, c in ipairs(counts) do
    local g, x, y, k
    if op == "fwd" then
      g, x, y, k = rows(got, e, first, c), rows(a, e, first, c), b:select(1, e), a:size(a:dim())
    elseif op == "dgrad" then
      g, x, y, k = rows(got, e, first, c), rows(a, e, first, c), b:select(1, e):transpose(1, 2), a:size(a:dim())
    else
      g, x, y, k = got:select(1, e), rows(a, e, first, c):transpose(1, 2), rows(b, e, first, c), c
    end
    if g:numel() > 0 then
      local ref, abs = R.matmul(x, y, opts.c and { beta = 1, c = opts.c:select(1, e) } or nil)
      local msg = R.check(g, ref, abs, R.u[got.dtype], R.sum_bound(k, R.u[got.dtype]),
        string.format("%s expert %d (%d rows)", op, e, c))
      if msg then return msg end
    end
    first = first + c
  end
end

local function expect(...)
  local msg = verdict(...)
  assert(msg == nil, msg)
end

-- every element of t is NaN (what the call must not have written)
local function all_nan(t)
  if t:numel() == 0 then return true end
  for _, x in ipairs(t:float():cpu():reshape(t:numel()):tolist()) do
    if x == x then return false end
  end
  return true
end

-- the rows past the counts (expert-major: of each expert; packed: after the sum) untouched
local function untouched(out, counts)
  if out:dim() == 3 then
    for e, c in ipairs(counts) do
      local r = out:size(2)
      if c < r and not all_nan(out:select(1, e):narrow(1, c + 1, r - c)) then return false end
    end
    return true
  end
  local sum = 0
  for _, c in ipairs(counts) do sum = sum + c end
  return sum == out:size(1) or all_nan(out:narrow(1, sum + 1, out:size(1) - sum))
end

local function refuses(fn, pattern)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.truthy(tostring(err):find(pattern), err)
  assert.truthy(tostring(err):find("gemm_grouped_spec.lua:%d+:"), "the error should point at the caller: " .. tostring(err))
end

-- E experts, up to R rows each (expert-major) or T = sum rows (packed), K in, N out
local E, RW, K, N = 5, 12, 40, 24
local SKEW = { 12, 0, 3, 9, 1 } -- a full expert, an empty one, the rest in between

-- x, w, dy for counts: expert-major [E, R, .] or packed [T + 2, .] (two spare rows)
local function operands(layout, dtype, device, counts)
  local sum = 0
  for _, c in ipairs(counts) do sum = sum + c end
  local lead = layout == "expert_major" and { #counts, RW } or { sum + 2 }
  local function shape(cols)
    local s = { unpack(lead) }
    s[#s + 1] = cols
    return s
  end
  return randn(shape(K), dtype, device), randn({ #counts, K, N }, dtype, device), randn(shape(N), dtype, device), shape
end

local BACKENDS = { cpu = { "auto" }, ["cuda:0"] = { "cublas", "loop", "loop4" } }

-- fn() (an f32 result on backend be); cuBLAS's grouped GEMM may lack f32 results from bf16
-- inputs: then the call says so, by name, and there is nothing to check
local function ran(be, fn)
  if be ~= "cublas" then
    fn()
    return true
  end
  local ok, err = pcall(fn)
  if not ok then assert.truthy(tostring(err):find("does not take bf16 x bf16 %-> f32"), err) end
  return ok
end
local function backend_opts(name)
  if name == "loop4" then return { backend = "loop", streams = 4 } end
  return { backend = name }
end

for _, dev in ipairs(H.devices) do
  local D = dev.name
  describe("dl.gemm.grouped on " .. D .. dev.tag, function()
    it("forward, dgrad and wgrad on expert-major and packed rows, skewed counts, against fp64", function()
      for _, layout in ipairs { "expert_major", "packed" } do
        for _, be in ipairs(BACKENDS[D]) do
          local o = backend_opts(be)
          local x, w, dy, shape = operands(layout, "bf16", D, SKEW)
          local what = layout .. " " .. be
          local y = nan(shape(N), "bf16", D)
          local got, backend = dl.gemm.grouped(x, w, SKEW, y, o)
          assert.equal(y, got)
          if D == "cpu" then assert.equal("cpu", backend) else assert.equal(o.backend, backend) end
          expect("fwd", y, x, w, SKEW)
          assert.is_true(untouched(y, SKEW), what .. ": fwd wrote rows past the counts")
          local dx = nan(shape(K), "bf16", D)
          dl.gemm.grouped_dx(dy, w, SKEW, dx, o)
          expect("dgrad", dx, dy, w, SKEW)
          assert.is_true(untouched(dx, SKEW), what .. ": dgrad wrote rows past the counts")
          local dw = nan({ E, K, N }, "bf16", D)
          dl.gemm.grouped_dw(x, dy, SKEW, dw, o)
          expect("wgrad", dw, x, dy, SKEW)
          assert.equal(0, dl.max_abs_diff(dw:select(1, 2), dl.zeros({ K, N }, "bf16", D)), "dw of the empty expert")
        end
      end
    end)

    it("counts as int32 and int64 tensors and Lua lists; f16; f32 out, given or allocated", function()
      local counts = { 7, 12, 0, 0, 2 }
      for _, kind in ipairs { "list", "i32", "i64" } do
        for _, dt in ipairs { "bf16", "f16" } do
          local x, w, dy = operands("expert_major", dt, D, counts)
          local c = counts_as(counts, kind, "cpu")
          local y = dl.gemm.grouped(x, w, c, { out_dtype = "f32" })
          assert.same({ E, RW, N }, y.shape)
          assert.equal("f32", y.dtype)
          expect("fwd", y, x, w, counts)
          local dx = dl.gemm.grouped_dx(dy, w, c)
          assert.equal(dt, dx.dtype)
          expect("dgrad", dx, dy, w, counts)
          local dw = nan({ E, K, N }, "f32", D)
          dl.gemm.grouped_dw(x, dy, c, dw)
          expect("wgrad", dw, x, dy, counts)
        end
      end
    end)

    it("every expert full, uniform (one strided batch), runs of one shape, one expert, none", function()
      for _, counts in ipairs { { RW, RW, RW, RW, RW }, { 7, 7, 7, 7, 7 }, { 4, 4, 0, 4, 9 }, { 6, 6, 6, 2, 2 },
        { 0, 0, 5, 0, 0 }, { 0, 0, 0, 0, 0 } } do
        for _, layout in ipairs { "expert_major", "packed" } do
          for _, be in ipairs(BACKENDS[D]) do
            local o = backend_opts(be)
            local x, w, dy, shape = operands(layout, "bf16", D, counts)
            local y = nan(shape(N), "bf16", D)
            dl.gemm.grouped(x, w, counts, y, o)
            expect("fwd", y, x, w, counts)
            assert.is_true(untouched(y, counts))
            local dx = nan(shape(K), "f32", D)
            if ran(be, function() dl.gemm.grouped_dx(dy, w, counts, dx, o) end) then
              expect("dgrad", dx, dy, w, counts)
            end
            local dw = nan({ E, K, N }, "f32", D)
            if ran(be, function() dl.gemm.grouped_dw(x, dy, counts, dw, o) end) then
              expect("wgrad", dw, x, dy, counts)
            end
          end
        end
      end
    end)

    it("weights as a transposed view of [E, N, K], and accumulating into dw", function()
      local x, _, dy = operands("expert_major", "bf16", D, SKEW)
      local wt = randn({ E, N, K }, "bf16", D)
      local w = wt:transpose(2, 3) -- [E, K, N], unit stride in K
      local y = nan({ E, RW, N }, "bf16", D)
      dl.gemm.grouped(x, w, SKEW, y)
      expect("fwd", y, x, w, SKEW)
      local dx = dl.gemm.grouped_dx(dy, w, SKEW)
      expect("dgrad", dx, dy, w, SKEW)
      local c = randn({ E, K, N }, "f32", D)
      local acc = c:clone()
      dl.gemm.grouped_dw(x, dy, SKEW, acc, { accumulate = true })
      expect("wgrad", acc, x, dy, SKEW, { c = c })
      assert.equal(0, dl.max_abs_diff(acc:select(1, 2), c:select(1, 2)), "an empty expert's accumulated dw changed")
    end)

    it("grouped_dw accumulated into bf16 and f16 dw rounds once (1024x768 per expert, k 512), the loop backends; backend cublas refuses it (it would round twice)", function()
      -- cuBLASLt 13.1 on an H200 rounded an accumulation into its own 16-bit c twice
      -- (core/ops/gemm/gemm_internal.h); on exact inputs (spec/gemm_ref.lua) one rounding is bit-exact
      local EK, KK, NK = 3, 1024, 768
      for _, counts in ipairs { { 512, 512, 512 }, { 512, 0, 300 } } do
        seed = seed + 4
        local refs, x, dy, c = {}, {}, {}, {}
        for _, dt in ipairs { "bf16", "f16" } do -- the same values in both dtypes
          x[dt] = R.exact_inputs({ EK, 512, KK }, dt, D, seed, "a")
          dy[dt] = R.exact_inputs({ EK, 512, NK }, dt, D, seed + 1, "b")
          c[dt] = R.exact_inputs({ EK, KK, NK }, dt, D, seed + 2, "c")
        end
        for e, n in ipairs(counts) do
          refs[e] = R.matmul(rows(x.bf16, e, 0, n):transpose(1, 2), rows(dy.bf16, e, 0, n),
            { beta = 1, c = c.bf16:select(1, e) })
        end
        for _, be in ipairs(BACKENDS[D]) do
          for _, dt in ipairs { "bf16", "f16" } do
            local acc, o = c[dt]:clone(), backend_opts(be)
            o.accumulate = true
            if be == "cublas" then -- it would round twice (measured): refused, by name
              local ok, err = pcall(dl.gemm.grouped_dw, x[dt], dy[dt], counts, acc, o)
              assert(not ok and tostring(err):find("backend cublas cannot accumulate into a " .. dt, 1, true),
                tostring(err))
            else
              dl.gemm.grouped_dw(x[dt], dy[dt], counts, acc, o)
            end
            for e in ipairs(be == "cublas" and {} or counts) do
              local msg = R.check_rounded_once(acc:select(1, e), refs[e],
                string.format("%s %s counts %s expert %d", be, dt, table.concat(counts, ","), e))
              assert(msg == nil, msg)
            end
          end
        end
      end
    end)

    it("takes ep:dispatch's recv table", function()
      local x, w, dy = operands("expert_major", "bf16", D, SKEW)
      local recv = { x = x, counts = counts_as(SKEW, "i32", "cpu") }
      local y = dl.gemm.grouped(recv, w)
      expect("fwd", y, x, w, SKEW)
      local dw = dl.gemm.grouped_dw(recv, dy, { out_dtype = "f32" })
      expect("wgrad", dw, x, dy, SKEW)
    end)

    it("the check catches a planted 2% error: the whole result, or one element", function()
      local counts = { 10, 4, 12, 0, 6 }
      local x, w = operands("expert_major", "bf16", D, counts)
      local y = dl.gemm.grouped(x, w, counts, { out_dtype = "f32" })
      expect("fwd", y, x, w, counts)
      assert.truthy(verdict("fwd", y:clone():mul_(1.02), x, w, counts), "a 2% scale passed the check")
      -- the element largest in magnitude among the rows computed, 2% off
      local one = y:cpu()
      local best, be, bi, bj = -1, 1, 1, 1
      for e, c in ipairs(counts) do
        if c > 0 then
          for i, row in ipairs(one:select(1, e):narrow(1, 1, c):tolist()) do
            for j, v in ipairs(row) do
              if math.abs(v) > best then best, be, bi, bj = math.abs(v), e, i, j end
            end
          end
        end
      end
      one:select(1, be):narrow(1, bi, 1):narrow(2, bj, 1):mul_(1.02)
      assert.truthy(verdict("fwd", one, x, w, counts), "one element 2% off passed the check")
      -- normwise: every element of one expert 2% off
      local part = y:cpu()
      part:select(1, 3):mul_(1.02)
      assert.truthy(verdict("fwd", part, x, w, counts), "one expert 2% off passed the check")
    end)

    it("bad arguments are errors that name the value, at the caller's line", function()
      local x, w, dy = operands("expert_major", "bf16", D, SKEW)
      refuses(function() dl.gemm.grouped(x, w, { 1, 2, 3 }) end, "the counts have 3 entries but w has 5 experts")
      refuses(function() dl.gemm.grouped(x, w, { 1, 2, 13, 0, 0 }) end,
        "the count of expert 3 of 5 %(1%-based%) is 13, more than the 12 rows per expert of x")
      refuses(function() dl.gemm.grouped(x, w, { 1, 2, -1, 0, 0 }) end, "counts%[3%] is %-1")
      refuses(function() dl.gemm.grouped(x, w, counts_as({ 1, 2, -1, 0, 0 }, "i32", "cpu")) end,
        "the count of expert 3 of 5 %(1%-based%) is %-1; counts must be >= 0")
      refuses(function() dl.gemm.grouped(x, w, { 1, 2, 2.5, 0, 0 }) end, "counts%[3%] is 2.5, not an integer")
      local px = randn({ 10, K }, "bf16", D)
      refuses(function() dl.gemm.grouped(px, w, { 4, 4, 4, 0, 0 }) end,
        "the counts sum to 12, more than the 10 rows of x %(packed")
      refuses(function() dl.gemm.grouped(x, w, dl.zeros({ 5 }, "f32", "cpu")) end, "counts must be int32 or int64")
      refuses(function() dl.gemm.grouped(x, w, "5") end, "counts must be a tensor")
      refuses(function() dl.gemm.grouped(x:select(1, 1):select(1, 1), w, SKEW) end, "x must be %[E, R, columns%]")
      refuses(function() dl.gemm.grouped(x, w:select(1, 1), SKEW) end, "w must be %[E, K, N%]")
      refuses(function() dl.gemm.grouped(x, w:narrow(2, 1, K - 1), SKEW) end,
        "x has 40 columns but w is %[5, 39, 24%] %(it must have 39: w's K%)")
      refuses(function() dl.gemm.grouped(x, w:float(), SKEW) end, "x and w must both be bf16 or both f16")
      refuses(function() dl.gemm.grouped(x:narrow(3, 1, 0), w:narrow(2, 1, 0), SKEW) end,
        "w is %[5, 0, 24%]: the sums over its K rows would be empty")
      assert.same({ E, RW, 0 }, dl.gemm.grouped(x, w:narrow(3, 1, 0), SKEW).shape) -- nothing to compute
      refuses(function() dl.gemm.grouped(x, w, SKEW, { out_dtype = "f16" }) end, "out_dtype f16 with bf16 inputs")
      refuses(function() dl.gemm.grouped(x, w, SKEW, dl.empty({ E, RW, N + 1 }, "bf16", D)) end,
        "out is %[5, 12, 25%] but must be %[5, 12, 24%]")
      refuses(function() dl.gemm.grouped(x, w, SKEW, { accumulate = true }) end, "accumulate adds into out: give out")
      refuses(function() dl.gemm.grouped(x, w, SKEW, { backend = "cutlass" }) end, "backend cutlass %(auto, cublas or loop%)")
      refuses(function() dl.gemm.grouped(x, w, SKEW, { streams = 9 }) end, "streams is 9, outside 0..8")
      refuses(function() dl.gemm.grouped(x, w, SKEW, { stream = 2 }) end, "unknown option stream")
      refuses(function() dl.gemm.grouped(x, 3, SKEW) end, "gemm.grouped: w must be a tensor")
      refuses(function() dl.gemm.grouped({ x = x }, w) end, "must be ep:dispatch's recv")
      refuses(function() dl.gemm.grouped_dx(dy, w:transpose(2, 3), SKEW) end, "dy has 24 columns but w is")
      refuses(function() dl.gemm.grouped_dw(x, dy:narrow(2, 1, 5), SKEW) end,
        "x is expert%-major with 12 rows per expert but dy is expert%-major with 5 rows per expert")
      refuses(function() dl.gemm.grouped_dw(x, dy, SKEW, dl.empty({ E, N, K }, "f32", D)) end,
        "out is %[5, 24, 40%] but must be %[5, 40, 24%]")
      local odd = dl.empty({ E, K, 2 * N }, "bf16", D):as_strided({ E, K, N }, { K * 2 * N, 2 * N, 2 }, 0)
      refuses(function() dl.gemm.grouped(x, odd, SKEW) end, "w has strides %(48, 2%)")
      refuses(function() dl.gemm.grouped(x, w, SKEW, x) end, "out is")
      local big = dl.empty({ E, RW, K + N }, "bf16", D)
      refuses(function() dl.gemm.grouped(big:narrow(3, 1, K), w, SKEW, big:narrow(3, 9, N)) end, "out overlaps x")
      refuses(function() dl.gemm.grouped(x, dl.empty({ E, K, N }, { dtype = "bf16", device = "meta" }), SKEW) end,
        "w is on meta")
      if D == "cpu" then
        refuses(function() dl.gemm.grouped(x, w, SKEW, { workspace = dl.empty({ 8 }, "u8") }) end,
          "a workspace is for cuda")
      end
    end)
  end)
end

describe("dl.gemm.grouped between ep's dispatch and combine", function()
  local function moe(n, device)
    local rc, out = H.distlab(string.format("run -n %d --device %s spec/gemm/ep_moe.lua", n, device))
    assert.equal(0, rc, out)
    for r = 0, n - 1 do assert.truthy(out:find("ep_moe ok (rank " .. r .. ")", 1, true), out) end
  end
  it("a MoE expert layer on 2 cpu ranks matches the layer in fp64", function() moe(2, "cpu") end)
  it("the same on cuda, ranks sharing the GPU where one is lent #gpu", function() moe(H.gpu_ranks, "cuda") end)
end)

describe("dl.gemm.grouped on meta", function()
  it("allocates the output and charges its workspace to gemm_workspace, running nothing", function()
    dl.mem.reset_peak("meta")
    local x = dl.empty({ 8, 4096, 7168 }, { dtype = "bf16", device = "meta" })
    local w = dl.empty({ 8, 7168, 2048 }, { dtype = "bf16", device = "meta" })
    local counts = dl.empty({ 8 }, { dtype = "i32", device = "meta" })
    local y, backend = dl.mem.tag("grouped_out_spec", function() return dl.gemm.grouped(x, w, counts) end)
    assert.equal("meta", backend)
    assert.same({ 8, 4096, 2048 }, y.shape)
    local st = dl.mem.stats("meta")
    assert.equal(dl.gemm.grouped_workspace_bytes(8), st.tags.gemm_workspace.peak)
    assert.is_true(dl.gemm.grouped_workspace_bytes(8) >= dl.gemm.workspace_bytes + 3 * 8 * 8)
    assert.equal(0, st.tags.gemm_workspace.current)
    assert.equal(8 * 4096 * 2048 * 2, st.tags.grouped_out_spec.current)
    local dw = dl.gemm.grouped_dw(x, y, counts, { out_dtype = "f32" })
    assert.same({ 8, 7168, 2048 }, dw.shape)
    assert.equal("f32", dw.dtype)
    -- packed rows and host counts: the same accounting
    local px = dl.empty({ 1000, 7168 }, { dtype = "bf16", device = "meta" })
    assert.same({ 1000, 7168 }, dl.gemm.grouped_dx(dl.gemm.grouped(px, w, { 100, 200, 0, 0, 0, 0, 0, 700 }), w,
      { 100, 200, 0, 0, 0, 0, 0, 700 }).shape)
  end)
end)

describe("dl.gemm.grouped accumulating on meta", function()
  it("charges the copy of c that the loop takes (all of a 16-bit dw: one batch), held with the workspace", function()
    local x = dl.empty({ 4, 512, 1024 }, { dtype = "bf16", device = "meta" })
    local dy = dl.empty({ 4, 512, 768 }, { dtype = "bf16", device = "meta" })
    local counts = dl.empty({ 4 }, { dtype = "i32", device = "meta" })
    local acc = dl.empty({ 4, 1024, 768 }, { dtype = "bf16", device = "meta" })
    dl.mem.reset_peak("meta")
    local base = dl.mem.stats("meta").allocated
    dl.gemm.grouped_dw(x, dy, counts, acc, { accumulate = true })
    local st = dl.mem.stats("meta")
    assert.equal(4 * 1024 * 768 * 2, st.tags.gemm_c_copy.peak)
    assert.equal(0, st.tags.gemm_c_copy.current)
    assert.equal(base + 4 * 1024 * 768 * 2 + dl.gemm.grouped_workspace_bytes(4), st.allocated_peak)
    dl.mem.reset_peak("meta")
    dl.gemm.grouped_dw(x, dy, counts, acc) -- no accumulation: no copy
    dl.gemm.grouped_dw(x, dy, counts, dl.empty({ 4, 1024, 768 }, { dtype = "f32", device = "meta" }),
      { accumulate = true }) -- f32: no copy
    dl.gemm.grouped_dw(x, dy, counts, dl.empty({ 4, 1024, 768 }, { dtype = "f32", device = "meta" }),
      { accumulate = true, backend = "cublas" }) -- C is D there, f32: no copy
    assert.is_nil(dl.mem.stats("meta").tags.gemm_c_copy)
  end)

  it("refuses backend cublas accumulating into a 16-bit out (it rounds twice), naming the way out", function()
    local x = dl.empty({ 2, 64, 32 }, { dtype = "bf16", device = "meta" })
    local dy = dl.empty({ 2, 64, 16 }, { dtype = "bf16", device = "meta" })
    for _, dt in ipairs { "bf16", "f16" } do
      local xd, dyd = x:to(dt), dy:to(dt)
      local ok, err = pcall(dl.gemm.grouped_dw, xd, dyd, { 64, 64 }, dl.empty({ 2, 32, 16 }, { dtype = dt, device = "meta" }),
        { accumulate = true, backend = "cublas" })
      assert.is_false(ok)
      assert.truthy(tostring(err):find("backend cublas cannot accumulate into a " .. dt .. " out", 1, true), tostring(err))
      assert.truthy(tostring(err):find("take backend loop", 1, true))
      assert.truthy(tostring(err):find("gemm_grouped_spec.lua", 1, true), "the error names the caller's line: " .. tostring(err))
    end
  end)
end)

describe("dl.gemm.grouped on cuda #gpu", function()
  local D = "cuda:0"

  it("counts on the device; both backends count their calls; auto runs one of them", function()
    local counts = { 64, 0, 200, 17, 128 }
    local x, w = randn({ E, 256, K }, "bf16", D), randn({ E, K, N }, "bf16", D)
    local c = counts_as(counts, "i32", D)
    local s0 = dl.gemm.stats()
    local y = dl.gemm.grouped(x, w, c, { backend = "cublas" })
    local s1 = dl.gemm.stats()
    assert.equal(s0.grouped_cublas + 1, s1.grouped_cublas)
    assert.is_true(s1.cublas_version >= 120500, "cuBLAS version " .. s1.cublas_version)
    expect("fwd", y, x, w, counts)
    y = dl.gemm.grouped(x, w, c, { backend = "loop", streams = 3 })
    assert.equal(s1.grouped_loop + 1, dl.gemm.stats().grouped_loop)
    expect("fwd", y, x, w, counts)
    local _, chosen = dl.gemm.grouped(x, w, c)
    assert.truthy(chosen == "cublas" or chosen == "loop", chosen)
    -- uniform counts: the loop is one strided-batched cuBLASLt call, and auto takes it
    local s2 = dl.gemm.stats()
    local _, ran = dl.gemm.grouped(x, w, { 200, 200, 200, 200, 200 }, y)
    assert.equal("loop", ran)
    assert.equal(s2.calls + 1, dl.gemm.stats().calls)
    expect("fwd", y, x, w, { 200, 200, 200, 200, 200 })
  end)

  it("a DeepSeek-like shape (H 7168, FFN 2048, 8 experts, skewed rows) with both backends", function()
    local counts = { 512, 3, 0, 130, 1024, 64, 257, 9 }
    local x = randn({ 8, 1024, 7168 }, "bf16", D)
    local w = randn({ 8, 7168, 2048 }, "bf16", D)
    for _, be in ipairs { "cublas", "loop" } do
      local y = nan({ 8, 1024, 2048 }, "bf16", D)
      dl.gemm.grouped(x, w, counts, y, { backend = be })
      -- a few rows of each expert against fp64 (the whole would take minutes in Lua)
      for e, c in ipairs(counts) do
        if c > 0 then
          local r = math.min(c, 2)
          local ref, abs = R.matmul(x:select(1, e):narrow(1, c - r + 1, r), w:select(1, e))
          local msg = R.check(y:select(1, e):narrow(1, c - r + 1, r), ref, abs, R.u.bf16, R.sum_bound(7168, R.u.bf16),
            be .. " expert " .. e)
          assert(msg == nil, msg)
        end
      end
      assert.is_true(untouched(y, counts))
    end
  end)

  it("is captured in a CUDA graph with host counts (device counts are refused there)", function()
    local counts = { 9, 0, 12, 4, 1 }
    local x, w = operands("expert_major", "bf16", D, counts)
    local y = dl.empty({ E, RW, N }, "bf16", D)
    local ws = dl.empty({ dl.gemm.grouped_workspace_bytes(E) }, "u8", D)
    for _, be in ipairs { "cublas", "loop" } do
      dl.gemm.grouped(x, w, counts, y, { backend = be, workspace = ws, streams = 2 }) -- the heuristics, before
      local g = dl.graph.capture(function()
        dl.gemm.grouped(x, w, counts, y, { backend = be, workspace = ws, streams = 2 })
      end, { device = D })
      for r = 1, 2 do
        x:copy_(randn({ E, RW, K }, "bf16", D))
        y:fill_(0 / 0)
        g:replay()
        dl.synchronize(D)
        expect("fwd", y, x, w, counts)
      end
      g:free()
    end
    local c = counts_as(counts, "i32", D)
    local ok, err = pcall(dl.graph.capture, function() dl.gemm.grouped(x, w, c, y, { workspace = ws }) end,
      { device = D })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("counts on cuda cannot be read inside a CUDA graph capture"), err)
  end)

  it("takes a workspace, or allocates one per call under gemm_workspace; too small is an error", function()
    local x, w = operands("expert_major", "bf16", D, SKEW)
    dl.mem.reset_peak(D)
    dl.gemm.grouped(x, w, SKEW)
    assert.is_true(dl.mem.stats(D).tags.gemm_workspace.peak >= dl.gemm.grouped_workspace_bytes(E))
    refuses(function() dl.gemm.grouped(x, w, SKEW, { workspace = dl.empty({ 1024 }, "u8", D) }) end,
      "the workspace holds 1024 bytes, 5 experts need")
  end)
end)
