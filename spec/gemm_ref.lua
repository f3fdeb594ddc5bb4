-- spec/gemm_ref.lua — the independent reference of spec/gemm_spec.lua and of
-- the overlap rank scripts (spec/overlap/): a plain fp64 triple loop in Lua
-- over host copies of the inputs, which also sums |alpha a_il b_lj| + |beta c_ij|
-- per element, and the check made of it. Not a spec itself; rank scripts
-- load it with dofile, specs with require.
--
-- The check is a bound, not a guess, from this error model of a GEMM with
-- fp32 accumulation (cuBLASLt with CUBLAS_COMPUTE_32F, the fp64 CPU twin
-- being better):
--   * each product a_il b_lj of bf16 or f16 inputs is exact in fp32 (8 + 8
--     or 11 + 11 significant bits <= 24);
--   * the k products are summed in fp32 in any order and grouping (tiles,
--     tensor-core blocks, split-K slices whose partials stay fp32), each
--     addition with a relative error below 2^-23: tensor cores truncate the
--     aligned significands instead of rounding to nearest (Fasi, Higham,
--     Mikaitis, Pranesh, "Numerical behavior of NVIDIA tensor cores", 2021),
--     twice fp32's 2^-24; so the sum is off by at most (k - 1) 2^-23 sum |a b|
--     (first order);
--   * the epilogue alpha s + beta c in fp32 adds three more such errors;
--   * rounding to the output dtype (to nearest, unit roundoff u) adds
--     u |ref| and u times the error so far.
-- Hence |got - ref| <= u |ref| + g abs with g = (1 + u) (k + 4) 2^-23 and
-- abs = sum |alpha a b| + |beta c| (R.sum_bound(k, u)), and normwise
-- ||got - ref|| <= u ||ref|| + g ||abs||. Partial sums rounded to bf16 (a
-- split-K reduction in the output type) break it, as they should: that is
-- not fp32 accumulation. A 2% error breaks it too: u <= 2^-8 (0.4%), and
-- g ||abs|| / ||ref|| stays below 0.2% up to k = 700, the largest k of the
-- specs (||abs|| / ||ref|| grows like sqrt(k) for random data). Callers
-- whose schedules round more (partial sums carried in bf16) widen the
-- second term.
local ffi = require "ffi"
local dl = require "distlab"

local R = {}

-- unit roundoff of each result dtype
R.u = { bf16 = 2 ^ -8, f16 = 2 ^ -11, f32 = 2 ^ -24 }

-- g of the model above: the fp32 sum of k products, the epilogue, and the
-- rounding of both to an output of unit roundoff u
function R.sum_bound(k, u) return (1 + u) * (k + 4) * 2 ^ -23 end

local function host(t)
  local h = t:to("cpu"):f64():contiguous()
  return h, ffi.cast("double*", h:data_ptr())
end

-- ref, abs (cpu f64 [m, n]) of alpha * a @ b + beta * c for tensors of any
-- dtype, device and strides (c: nil, or [m, n]).
function R.matmul(a, b, opts)
  opts = opts or {}
  local alpha, beta = opts.alpha or 1, opts.beta or 0
  local m, k, n = a:size(1), a:size(2), b:size(2)
  local ha, pa = host(a)
  local hb, pb = host(b)
  local hc, pc
  if beta ~= 0 then hc, pc = host(opts.c) end
  local ref = dl.empty({ m, n }, { dtype = "f64", device = "cpu" })
  local abs = dl.empty({ m, n }, { dtype = "f64", device = "cpu" })
  local pr, ps = ffi.cast("double*", ref:data_ptr()), ffi.cast("double*", abs:data_ptr())
  for i = 0, m - 1 do
    for j = 0, n - 1 do
      local s, t = 0, 0
      for l = 0, k - 1 do
        local x = pa[i * k + l] * pb[l * n + j]
        s = s + x
        t = t + math.abs(x)
      end
      s, t = alpha * s, math.abs(alpha) * t
      if beta ~= 0 then
        s = s + beta * pc[i * n + j]
        t = t + math.abs(beta * pc[i * n + j])
      end
      pr[i * n + j], ps[i * n + j] = s, t
    end
  end
  dl.C.dl_tensor_check(ha) -- the raw pointers above point into these: keep them alive until here
  dl.C.dl_tensor_check(hb)
  if hc then dl.C.dl_tensor_check(hc) end
  return ref, abs
end

-- nil when got is within u_rel |ref| + u_abs abs everywhere and normwise,
-- else a message: the normwise error and its bound, how many elements broke
-- theirs, and the first few. got: any device and dtype.
function R.check(got, ref, abs, u_rel, u_abs, what)
  local hg, pg = host(got)
  local pr, ps = ffi.cast("double*", ref:data_ptr()), ffi.cast("double*", abs:data_ptr())
  local n = ref:numel()
  local diff2, ref2, abs2, bad, shown = 0, 0, 0, 0, {}
  local cols = ref:size(2)
  for i = 0, n - 1 do
    local g, r, s = pg[i], pr[i], ps[i]
    local e = math.abs(g - r)
    if g ~= g then e = math.huge end
    diff2, ref2, abs2 = diff2 + e * e, ref2 + r * r, abs2 + s * s
    if not (e <= u_rel * math.abs(r) + u_abs * s) then
      bad = bad + 1
      if #shown < 4 then
        shown[#shown + 1] = string.format("[%d, %d] got %.6g want %.6g (bound %.3g)", math.floor(i / cols) + 1,
          i % cols + 1, g, r, u_rel * math.abs(r) + u_abs * s)
      end
    end
  end
  dl.C.dl_tensor_check(hg)
  local norm = ref2 > 0 and math.sqrt(diff2 / ref2) or math.sqrt(diff2)
  local bound = u_rel + (ref2 > 0 and u_abs * math.sqrt(abs2 / ref2) or 0)
  if bad == 0 and norm <= bound then return nil, norm end
  return string.format("%s: normwise error %.3g (bound %.3g), %d of %d elements beyond their bound%s%s", what or "result",
    norm, bound, bad, n, #shown > 0 and ": " or "", table.concat(shown, "; ")), norm
end

-- Rounded once or twice. The bound of R.check cannot tell d = rn(a @ b + c) from
-- d = rn(rn(a @ b) + c) (two roundings: an error of up to an ulp where one gives half):
-- it allows u |ref| (half an ulp to one) and the fp32 sum's error on top. On R.exact_inputs
-- the fp32 sum and epilogue are exact whatever the order, tiles or split-K (every partial
-- sum is a multiple of 2^-8 below 2^14: 22 bits), so a GEMM that rounds once returns
-- exactly ref rounded to its dtype, on every run.

-- a tensor of `shape` on device: operands ("a", "b": multiples of 1/16 in [-2, 2]) or the
-- addend ("c": multiples of 1/64 in [-4, 4]), exact in bf16 and f16; seed picks them
function R.exact_inputs(shape, dtype, device, seed, role)
  local h = dl.empty(shape, { dtype = "f64", device = "cpu" })
  local p, x = ffi.cast("double*", h:data_ptr()), (seed % 2147483646) + 1
  local span, unit = 32, 16
  if role == "c" then span, unit = 255, 64 end
  for i = 0, h:numel() - 1 do
    x = x * 16807 % 2147483647 -- Park-Miller
    p[i] = (x % (2 * span + 1) - span) / unit
  end
  dl.C.dl_tensor_check(h)
  return h:to(dtype):to(device)
end

-- nil when every element of got is ref rounded once to got's dtype (ref: R.matmul of
-- R.exact_inputs, exact in fp32, so its conversion is the one rounding), else a message:
-- how many elements differ and the first few
function R.check_rounded_once(got, ref, what)
  local once = ref:to(got.dtype):f64()
  local hg, pg = host(got)
  local po, pr = ffi.cast("double*", once:data_ptr()), ffi.cast("double*", ref:data_ptr())
  local f, cols, bad, shown = ffi.new("float[1]"), ref:size(2), 0, {}
  for i = 0, ref:numel() - 1 do
    f[0] = pr[i]
    assert(f[0] == pr[i], "check_rounded_once: ref is not exact in fp32 (inputs not from R.exact_inputs?)")
    if pg[i] ~= po[i] then
      bad = bad + 1
      if #shown < 4 then
        shown[#shown + 1] = string.format("[%d, %d] got %.8g want %.8g (exact %.8g)", math.floor(i / cols) + 1,
          i % cols + 1, pg[i], po[i], pr[i])
      end
    end
  end
  dl.C.dl_tensor_check(hg)
  dl.C.dl_tensor_check(once)
  if bad == 0 then return nil end
  return string.format("%s: %d of %d elements are not the exact result rounded once to %s: %s", what or "result",
    bad, ref:numel(), got.dtype, table.concat(shown, "; "))
end

return R
