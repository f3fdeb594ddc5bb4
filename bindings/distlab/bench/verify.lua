-- distlab.bench.verify — a bench checks what it timed. After timing, the
-- timed callable runs once more on fresh random inputs with its outputs
-- poisoned (NaN; integer outputs a sentinel), and what it wrote is compared
-- with an independent reference, normwise and element-wise. `--plant` (every
-- bench has it, through the harness) puts a known error into the timed
-- callable, so a run shows that the check sees it:
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
--
--   verify.poison(t)                     NaN for floats, 0xFF bytes for uint8 (fp8's NaN),
--                                        the most negative value for integers
--   verify.close(got, ref, tol) -> n, msg  n wrong: elements outside atol + rtol |ref|, non-finite
--                                        elements, plus one when ||got - ref|| / ||ref|| > norm
--   verify.spread(n, k, seed) -> list     k distinct 0-based indices spread over [0, n)
--                                        (all of them when k >= n): one in each of k strata
--   verify.parse_plant(text) -> plant    {kind = "noop"} | {kind = "scale", x = X} | nil
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local compare = require "distlab.compare"

local fail = core.fail
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

function M.close(got, ref, tol)
  tol = tol or {}
  local atol, rtol = tol.atol or 0, tol.rtol or 0
  local r = compare.compare(got, ref, atol, rtol)
  local n = tonumber(r.n_not_close)
  local nonfinite = tonumber(r.n_nonfinite_a) - tonumber(r.n_nonfinite_b)
  if nonfinite > 0 and n < nonfinite then n = nonfinite end
  local rel
  if r.sum_sq_ref > 0 then rel = math.sqrt(r.sum_sq_diff / r.sum_sq_ref)
  else rel = r.sum_sq_diff == 0 and 0 or math.huge end
  if nonfinite > 0 then rel = math.huge end
  local norm_bad = tol.norm and not (rel <= tol.norm)
  if norm_bad then n = n + 1 end
  if n == 0 then return 0 end
  return n, string.format("%d of %d elements outside atol %g + rtol %g |ref| (max |got - ref| %g), "
    .. "%d non-finite, normwise %.3g%s", tonumber(r.n_not_close), T.numel(ref), atol, rtol, r.max_abs_diff,
    math.max(nonfinite, 0), rel, tol.norm and string.format(" (bound %g)", tol.norm) or "")
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

-- One verification run: the harness calls this through h:verify and sums
-- the count over ranks.
function M.run(spec, sync)
  for _, key in ipairs { "fresh", "run", "check" } do
    if type(spec[key]) ~= "function" then fail("bench.verify: %s must be a function", key) end
  end
  spec.fresh()
  for _, t in ipairs(list_of(spec.poison)) do M.poison(t) end
  if sync then sync() end
  local res = { spec.run() }
  if sync then sync() end
  local n, msg = spec.check(unpack(res))
  if type(n) ~= "number" then
    fail("bench.verify %s: check must return a count of wrong elements (and a message), got %s",
      tostring(spec.what), tostring(n))
  end
  return n, msg
end

return M
