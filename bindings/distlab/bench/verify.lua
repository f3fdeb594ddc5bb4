-- distlab.bench.verify — a bench checks what it timed. After timing, the
-- timed callable runs once more on fresh random inputs with its outputs
-- poisoned (NaN; integer outputs a sentinel), and what it wrote is compared
-- with an independent reference (fp64 on the host, not the op under test),
-- normwise and element-wise. `--plant` (every bench has it, through the
-- harness) puts a known error into the timed callable, so a run shows that
-- the check sees it:
--   noop        the op returns without writing (outputs it returns hold NaN)
--   scale=X     every output the op writes is multiplied by 1 + X (X = 0.01: 1%)
--
--   local run = h:planted(fn, { writes = { out } })      fn writes into out
--   local run = h:planted(fn, { returns = true })        fn returns its outputs
--   ... time run ...
--   h:verify { what = "1M f32 one_shot",                 names the case in messages
--     fresh = function() x:normal_(0, 1, seed + 1) end,   new inputs (a new seed)
--     poison = { out },                                  filled before the run
--     run = run,                                         the callable timed
--     check = function(...) return verify.close(out, ref, { atol =, rtol =, norm = }) end }
--   -> wrong elements summed over ranks (counted for the exit code, as h:check)
-- Between the poisoning and the run, and between the run and the check, the
-- harness waits for the device and (several ranks) for every rank, so a
-- peer cannot write into this rank's output before it is poisoned, and what
-- peers write has landed when it is read.
--
-- Outputs an op allocates itself ({returns = true}) cannot be poisoned before
-- the run, and the caching allocator may hand it a block holding an earlier
-- call's result. Two things keep such a result from passing: `fresh`, inputs
-- no earlier call saw, so no earlier result is right for them (a new seed
-- each check, or the same new draw scaled by a different power of two each
-- check, which scales the exact result with it); and, where checks share
-- their inputs, the run's returned tensors are poisoned once checked (unless
-- the spec says keep = true), so a block they leave to the allocator holds
-- NaN, not a right answer for the next check.
--
--   verify.poison(t)                     NaN for floats, 0xFF bytes for uint8 (fp8's NaN),
--                                        the most negative value for integers
--   verify.close(got, ref, tol) -> n, msg, stats  n wrong: elements outside atol + rtol |ref|
--                                        (+ atol_rms rms(ref), + allow[i]: an f64 cpu tensor of
--                                        per-element allowances), non-finite elements, plus one
--                                        when ||got - ref|| / ||ref|| > norm, plus one when the
--                                        bias <got - ref, ref> / <ref, ref> is beyond +-bias
--                                        (a scale error is all bias; rounding has none; from
--                                        BIAS_MIN = 1024 elements up; tol.rows = w: the
--                                        elements are rows of w whose errors go together, and
--                                        the bound is at least BIAS_Z standard errors of the
--                                        bias over those rows, judged from BIAS_MIN_ROWS rows);
--                                        msg says what was found (also when n is 0), stats
--                                        {numel, norm, bias, bias_bound, max_abs, outside}
--   verify.spread(n, k, seed) -> list     k distinct 0-based indices spread over [0, n)
--                                        (all of them when k >= n): one in each of k strata
--   verify.windows(n, total, width, seed) -> {{start, len}, ...}  0-based windows of width
--                                        elements, one in each of total / width strata of
--                                        [0, n) (one window, all of it, when n <= total)
--   verify.take(t, wins) -> f64 cpu tensor  t's elements (row-major) in those windows
--   verify.normal(dtype, seed, offset, n) -> f64 cpu tensor  what x:normal_(0, 1, seed) puts
--                                        at elements offset .. offset + n - 1 of a dtype tensor
--   verify.normal_sum(dtype, seeds, wins) -> f64 cpu tensor  the fp64 sum over the seeds of
--                                        what normal_ puts in the windows wins (an all-reduce's
--                                        reference: every rank's input drawn again on the host)
--   verify.matmul_rows(a, b, rows, {parts = P}) -> ref[, S, rms]  rows (1-based) of a @ b
--                                        in fp64 on the host, f64 cpu [#rows, n]; with parts,
--                                        k in P equal slices: S = sum over slices of |a_p b_p|
--                                        (f64 [#rows, n]) and rms[i] = sum over slices of
--                                        rms(row i of a_p b_p)
--   verify.parse_plant(text) -> plant    {kind = "noop"} | {kind = "scale", x = X} | nil
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local compare = require "distlab.compare"

local C, fail = core.C, core.fail
local T = tensor.methods
local M = {}

M.PLANT_HELP = "plant an error into the timed op, to show the data check sees it: noop (the op "
  .. "returns without writing) or scale=X (its outputs times 1 + X)"

function M.parse_plant(text)
  if text == nil or text == "" or text == "none" then return nil end
  if text == "noop" then return { kind = "noop", text = text } end
  local x = text:match("^scale=(.+)$")
  x = x and tonumber(x)
  if x and x ~= 0 and x == x and x > -1 then return { kind = "scale", x = x, text = text } end
  fail("--plant: expected noop or scale=X (X a number > -1, not 0), got %q", tostring(text))
end

-- dtype names as tensors give them (distlab.core.dtypes)
local POISON = { u8 = 255, i32 = -2147483648, i64 = -2147483648 }
local FLOAT = { f32 = true, f16 = true, bf16 = true, f64 = true }

function M.poison(t) return T.fill_(t, POISON[t.dtype] or 0 / 0) end

local function is_float(t) return FLOAT[t.dtype] == true end

-- A count of wrong elements as a Lua number: a 64-bit integer from C (0LL, what a count
-- read from a C struct is) is one too; anything else is nil.
function M.as_count(n)
  if type(n) == "number" then return n end
  if type(n) == "cdata" and (ffi.istype("int64_t", n) or ffi.istype("uint64_t", n)) then return tonumber(n) end
  return nil
end

local function list_of(x)
  if x == nil then return {} end
  if type(x) == "function" then x = x() end
  if tensor.is_tensor(x) then return { x } end
  return x
end

-- fn planted as `plant` says; o.writes: the tensors fn writes (a list, or a
-- function giving it), o.returns: fn returns its outputs (the tensors among
-- its results), o.scale(t, factor): how to scale an output that is not a
-- float tensor (an fp8 payload, say); without it such an output is an error.
function M.planted(fn, plant, o)
  o = o or {}
  if type(fn) ~= "function" then fail("bench.planted: expected a function, got %s", type(fn)) end
  if not plant then return fn end
  if not o.writes and not o.returns then
    fail("bench.planted: say which outputs the op writes ({writes = {...}} or {returns = true})")
  end
  local function scale(t, factor)
    if is_float(t) then return T.mul_(t, factor) end
    if o.scale then return o.scale(t, factor) end
    fail("--plant %s: the output (%s) is not a float tensor and the bench gave no scale function",
      plant.text, tostring(t.dtype))
  end
  if plant.kind == "noop" then
    if o.returns then
      -- the outputs it hands back hold nothing it computed
      return function(...)
        local r = { fn(...) }
        for _, v in ipairs(r) do if tensor.is_tensor(v) then M.poison(v) end end
        return unpack(r)
      end
    end
    return function() end
  end
  local factor = 1 + plant.x
  return function(...)
    local r = { fn(...) }
    for _, t in ipairs(list_of(o.writes)) do scale(t, factor) end
    if o.returns then for _, v in ipairs(r) do if tensor.is_tensor(v) then scale(v, factor) end end end
    return unpack(r)
  end
end

-- a contiguous host copy of t, and its element i (0-based, row-major) as a number
local function host(t)
  if T.is_contiguous(t) and t.dev_type == C.DL_CPU then return t end
  return T.contiguous(T.to(t, "cpu"))
end
local function at(t, i)
  local n = T.numel(t)
  if i < 0 or i >= n then return 0 / 0 end
  return T.item(T.narrow(T.reshape(t, n), 1, i + 1, 1))
end

-- The bias is checked from this many elements up: rounding's own bias over
-- n elements has a standard deviation near sqrt(3 / n) times a rounding's
-- relative error (0.41 u for round to nearest), so a bound of 2^-10 is more
-- than 10 of them for bf16 from 1024 elements (fewer: reported, not checked).
M.BIAS_MIN = 1024

-- Where the elements come in rows whose errors are not independent (tol.rows = w: w
-- consecutive elements a row; an attention row's gradient shares its softmax, so a row's
-- error can lie along the row), the rows are the samples, not the elements: 8 rows of 128
-- can show a bias of 4.6e-3 from rounding alone (a CP dq, normwise 7e-3). The bias is then
-- sum_g <e_g, r_g> / sum_g |r_g|^2 over rows g, and its standard error from the rows'
-- scatter around it is se = sqrt(sum_g (<e_g, r_g> - bias |r_g|^2)^2) / sum_g |r_g|^2. The
-- bound is max(tol.bias, BIAS_Z se): wider only while the sample is too small to tell
-- tol.bias from the rows' noise, tol.bias itself once se is small (a large sample). A
-- scale error moves every row alike, adds no scatter, and fails as before. With fewer than
-- BIAS_MIN_ROWS rows the scatter says too little: reported, not checked.
M.BIAS_Z = 6
M.BIAS_MIN_ROWS = 8

-- se of the bias over rows of w elements (got and ref: f64 host data, n elements)
local function row_bias_se(pg, pr, n, w, bias)
  local num, den = 0, 0
  for g = 0, n / w - 1 do
    local c, q = 0, 0
    for i = g * w, g * w + w - 1 do
      c = c + (pg[i] - pr[i]) * pr[i]
      q = q + pr[i] * pr[i]
    end
    local d = c - bias * q
    num, den = num + d * d, den + q
  end
  return den > 0 and math.sqrt(num) / den or 0
end
local function bias_se(hg, hr, w, bias)
  local g, r = T.f64(T.contiguous(hg)), T.f64(T.contiguous(hr))
  local se = row_bias_se(ffi.cast("double*", T.data_ptr(g)), ffi.cast("double*", T.data_ptr(r)), T.numel(hr), w, bias)
  C.dl_tensor_check(g) -- the raw pointers above point into these: keep them alive until here
  C.dl_tensor_check(r)
  return se
end
jit.off(bias_se)

-- elements of got (host) outside atol + rtol |ref| + allow[i], and the first of them
local function outside(pg, pr, pw, n, atol, rtol)
  local bad, first = 0, -1
  for i = 0, n - 1 do
    local g, w = pg[i], pr[i]
    if not (math.abs(g - w) <= atol + rtol * math.abs(w) + pw[i]) and not (g ~= g and w ~= w) then
      bad = bad + 1
      if first < 0 then first = i end
    end
  end
  return bad, first
end
local function count_allowed(hg, hr, atol, rtol, allow)
  local n = T.numel(hr)
  if T.numel(allow) ~= n then fail("verify.close: allow has %d elements, ref %d", T.numel(allow), n) end
  local g, w, a = T.f64(T.contiguous(hg)), T.f64(T.contiguous(hr)), T.f64(T.contiguous(T.to(allow, "cpu")))
  local bad, first = outside(ffi.cast("double*", T.data_ptr(g)), ffi.cast("double*", T.data_ptr(w)),
    ffi.cast("double*", T.data_ptr(a)), n, atol, rtol)
  C.dl_tensor_check(g) -- the raw pointers above point into these: keep them alive until here
  C.dl_tensor_check(w)
  C.dl_tensor_check(a)
  return bad, first
end
jit.off(count_allowed)

function M.close(got, ref, tol)
  tol = tol or {}
  local hg, hr = host(got), host(ref)
  local atol, rtol = tol.atol or 0, tol.rtol or 0
  local r0 = compare.compare(hr, hr)
  local ref2 = r0.sum_sq_ref
  if tol.atol_rms then atol = atol + tol.atol_rms * math.sqrt(ref2 / math.max(T.numel(hr), 1)) end
  local r = compare.compare(hg, hr, atol, rtol)
  if tol.allow then r.n_not_close, r.first_not_close = count_allowed(hg, hr, atol, rtol, tol.allow) end
  local n = tonumber(r.n_not_close)
  local nonfinite = tonumber(r.n_nonfinite_a) - tonumber(r.n_nonfinite_b)
  if nonfinite > 0 and n < nonfinite then n = nonfinite end
  local rel
  if ref2 > 0 then rel = math.sqrt(r.sum_sq_diff / ref2)
  else rel = r.sum_sq_diff == 0 and 0 or math.huge end
  if nonfinite > 0 then rel = math.huge end
  local norm_bad = tol.norm and not (rel <= tol.norm)
  if norm_bad then n = n + 1 end
  -- <g - r, r> = (|g|^2 - |r|^2 - |g - r|^2) / 2, all finite here
  local bias = 0
  if tol.bias and nonfinite <= 0 then
    local got2 = compare.compare(hg, hg).sum_sq_ref
    bias = ref2 > 0 and (got2 - ref2 - r.sum_sq_diff) / (2 * ref2) or (got2 > 0 and math.huge or 0)
  elseif tol.bias then
    bias = math.huge
  end
  local bias_bound, judged = tol.bias, tol.bias and T.numel(hr) >= M.BIAS_MIN
  local bias_what = ""
  if tol.bias and tol.rows then
    local w, nr = tol.rows, T.numel(hr) / tol.rows
    if w < 1 or nr ~= math.floor(nr) then fail("verify.close: %d elements are not rows of %s", T.numel(hr), tostring(w)) end
    judged = judged and nr >= M.BIAS_MIN_ROWS
    if nonfinite <= 0 and ref2 > 0 then
      local se = bias_se(hg, hr, w, bias)
      bias_bound = math.max(tol.bias, M.BIAS_Z * se)
      bias_what = string.format(" = max(%.3g, %g se over %d rows)", tol.bias, M.BIAS_Z, nr)
    end
    if not judged then bias_what = bias_what .. string.format(", not judged: %d rows", nr) end
  end
  local bias_bad = judged and not (math.abs(bias) <= bias_bound)
  if bias_bad then n = n + 1 end
  local stats = { numel = T.numel(hr), norm = rel, bias = bias, bias_bound = bias_bound, max_abs = r.max_abs_diff,
    outside = tonumber(r.n_not_close) }
  if n == 0 then
    return 0, string.format("%d elements, max |got - ref| %.3g, normwise %.3g%s%s", stats.numel, r.max_abs_diff, rel,
      tol.norm and string.format(" (bound %.3g)", tol.norm) or "",
      tol.bias and string.format(", bias %.3g (bound %.3g%s)", bias, bias_bound, bias_what) or ""), stats
  end
  local first = tonumber(r.first_not_close)
  local where = ""
  if first >= 0 then
    where = string.format(", first at element %d: got %.6g, want %.6g", first, at(hg, first), at(hr, first))
  end
  return n, string.format("%d of %d elements outside atol %.3g + rtol %g |ref| (max |got - ref| %g%s), "
    .. "%d non-finite, normwise %.3g%s%s", tonumber(r.n_not_close), T.numel(hr), atol, rtol, r.max_abs_diff,
    where, math.max(nonfinite, 0), rel, tol.norm and string.format(" (bound %.3g)", tol.norm) or "",
    tol.bias and string.format(", bias %.3g (bound %.3g%s)", bias, bias_bound, bias_what) or ""), stats
end

function M.spread(n, k, seed)
  local out = {}
  if k >= n then
    for i = 1, n do out[i] = i - 1 end
    return out
  end
  -- one index in each of k strata, at a position drawn from a small LCG
  local s = (seed or 1) % 2147483647
  if s <= 0 then s = s + 2147483646 end
  for i = 0, k - 1 do
    local lo, hi = math.floor(i * n / k), math.floor((i + 1) * n / k)
    s = (s * 48271) % 2147483647
    out[i + 1] = lo + s % (hi - lo)
  end
  return out
end

function M.windows(n, total, width, seed)
  if n <= total then return { { 0, n } } end
  width = math.max(1, math.min(width, total))
  local k = math.ceil(total / width)
  local s = (seed or 1) % 2147483647
  if s <= 0 then s = s + 2147483646 end
  local out = {}
  for i = 0, k - 1 do
    local lo, hi = math.floor(i * n / k), math.floor((i + 1) * n / k)
    local len = math.min(width, hi - lo)
    s = (s * 48271) % 2147483647
    out[i + 1] = { lo + s % (hi - lo - len + 1), len }
  end
  return out
end

function M.take(t, wins)
  local total = 0
  for _, w in ipairs(wins) do total = total + w[2] end
  local flat = T.reshape(t, T.numel(t))
  local out = tensor.empty({ total }, { dtype = "f64", device = "cpu" })
  local at0 = 0
  for _, w in ipairs(wins) do
    T.copy_(T.narrow(out, 1, at0 + 1, w[2]), T.narrow(flat, 1, w[1] + 1, w[2]))
    at0 = at0 + w[2]
  end
  return out
end

function M.normal(dtype, seed, offset, n)
  local x = tensor.empty({ n }, { dtype = dtype, device = "cpu" })
  core.check(C.dl_tensor_random(x, C.DL_RAND_NORMAL, ffi.cast("uint64_t", seed), offset, 0, 1, nil))
  return T.f64(x)
end

function M.normal_sum(dtype, seeds, wins)
  local total = 0
  for _, w in ipairs(wins) do total = total + w[2] end
  local ref = T.fill_(tensor.empty({ total }, { dtype = "f64", device = "cpu" }), 0)
  for _, seed in ipairs(seeds) do
    local at0 = 0
    for _, w in ipairs(wins) do
      T.add_(T.narrow(ref, 1, at0 + 1, w[2]), M.normal(dtype, seed, w[1], w[2]))
      at0 = at0 + w[2]
    end
  end
  return ref
end

-- The fp64 rows of a @ b: each row of a times b's rows, a chunk of b at a
-- time on the host (so b is never all there in fp64). Products of bf16 or
-- f16 values are exact in fp64 and k <= 2^20 of them sum with a relative
-- error below 2^-32: exact for any check of a bf16, f16 or f32 result.
-- The loops take raw pointers and allocate nothing (compiled); the function
-- around them allocates and runs interpreted (see the end of distlab.tensor).
local CHUNK = 256

-- acc[i, :] += a[i, l0 + l] * b[l, :] for the len rows l of a chunk of b
local function axpy_rows(pa, k, l0, len, pb, n, pacc, R)
  for l = 0, len - 1 do
    local brow = pb + l * n
    for i = 0, R - 1 do
      local x = pa[i * k + l0 + l]
      if x ~= 0 then
        local dst = pacc + i * n
        for j = 0, n - 1 do dst[j] = dst[j] + x * brow[j] end
      end
    end
  end
end

-- ref += acc, S += |acc|, acc = 0; rms[i + 1] += rms(acc row i)
local function fold(pacc, pref, pS, R, n, rms)
  for i = 0, R - 1 do
    local sq = 0
    for j = i * n, i * n + n - 1 do
      local v = pacc[j]
      pref[j], pS[j], pacc[j] = pref[j] + v, pS[j] + math.abs(v), 0
      sq = sq + v * v
    end
    rms[i + 1] = rms[i + 1] + math.sqrt(sq / n)
  end
end

local function zeros(shape) return T.fill_(tensor.empty(shape, { dtype = "f64", device = "cpu" }), 0) end

function M.matmul_rows(a, b, rows, o)
  o = o or {}
  local k, n, R = T.size(a, 2), T.size(b, 2), #rows
  if T.size(b, 1) ~= k then fail("matmul_rows: a is [%d, %d] but b has %d rows", T.size(a, 1), k, T.size(b, 1)) end
  local P = o.parts or 1
  if k % P ~= 0 then fail("matmul_rows: k = %d does not split in %d parts", k, P) end
  local kp = k / P
  local ha = tensor.empty({ R, k }, { dtype = "f64", device = "cpu" })
  for i, r in ipairs(rows) do T.copy_(T.narrow(ha, 1, i, 1), T.narrow(a, 1, r, 1)) end
  local ref = zeros({ R, n })
  local part = P > 1 and zeros({ R, n }) or ref
  local S = P > 1 and zeros({ R, n }) or nil
  local rms = {}
  for i = 1, R do rms[i] = 0 end
  local hb = tensor.empty({ math.min(CHUNK, kp), n }, { dtype = "f64", device = "cpu" })
  local pa = ffi.cast("double*", T.data_ptr(ha))
  local pacc = ffi.cast("double*", T.data_ptr(part))
  local pb = ffi.cast("double*", T.data_ptr(hb))
  for p = 0, P - 1 do
    local l0 = p * kp
    while l0 < (p + 1) * kp do
      local len = math.min(CHUNK, (p + 1) * kp - l0)
      T.copy_(T.narrow(hb, 1, 1, len), T.narrow(b, 1, l0 + 1, len))
      axpy_rows(pa, k, l0, len, pb, n, pacc, R)
      l0 = l0 + len
    end
    if P > 1 then
      fold(pacc, ffi.cast("double*", T.data_ptr(ref)), ffi.cast("double*", T.data_ptr(S)), R, n, rms)
    end
  end
  C.dl_tensor_check(ha) -- the raw pointers above point into these: keep them alive until here
  C.dl_tensor_check(hb)
  C.dl_tensor_check(part)
  if P > 1 then return ref, S, rms end
  return ref
end
jit.off(M.matmul_rows)
-- raw data pointers across allocations: see the end of distlab.tensor
jit.off(M.close)

-- One verification run: the harness calls this through h:verify and sums
-- the count over ranks. settle() waits for the device and the other ranks.
function M.run(spec, settle)
  for _, key in ipairs { "fresh", "run", "check" } do
    if type(spec[key]) ~= "function" then fail("bench.verify: %s must be a function", key) end
  end
  spec.fresh()
  for _, t in ipairs(list_of(spec.poison)) do M.poison(t) end
  if settle then settle() end
  local res = { spec.run() }
  if settle then settle() end
  local got, msg = spec.check(unpack(res))
  local n = M.as_count(got)
  if not n then
    fail("bench.verify %s: check must return a count of wrong elements (and a message), got %s",
      tostring(spec.what), tostring(got))
  end
  if not spec.keep then
    for _, v in ipairs(res) do if tensor.is_tensor(v) then M.poison(v) end end
  end
  return n, msg
end

return M
