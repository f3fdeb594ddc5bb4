-- distlab.compare — how close two tensors are, computed in fp64 on the host:
-- rel_err = ||a - b|| / ||b||, max_abs_diff, allclose, and a report of the
-- first mismatches for spec failures.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods
local M = {}

local function host(t, what)
  if not tensor.is_tensor(t) then fail("%s: expected a tensor, got %s", what, type(t)) end
  check(C.dl_tensor_check(t))
  if t.dev_type == C.DL_META then fail("%s: meta tensors hold no values", what) end
  return T.to(t, "cpu")
end

-- dl.compare(a, b[, atol, rtol]) -> a table of Lua numbers, computed in fp64
-- on the host over every element (a and b: same shape, any dtypes, any devices
-- but meta): sum_sq_diff (sum of (a-b)^2 over the finite pairs), sum_sq_ref
-- (sum of b^2), max_abs_diff, n_nonfinite_a, n_nonfinite_b, n_not_close
-- (|a-b| > atol + rtol |b|, or a non-finite mismatch; atol and rtol default
-- 0) and first_not_close (its 0-based row-major position, -1 if none).
-- n_not_close is what a bench harness's data check returns.
local FIELDS = { "sum_sq_diff", "sum_sq_ref", "max_abs_diff", "n_nonfinite_a", "n_nonfinite_b", "n_not_close",
  "first_not_close" }
local result = ffi.typeof("dl_compare_t")

function M.compare(a, b, atol, rtol)
  local r = result()
  check(C.dl_tensor_compare(host(a, "compare"), host(b, "compare"), atol or 0, rtol or 0, r))
  local out = {}
  for _, k in ipairs(FIELDS) do out[k] = tonumber(r[k]) end
  return out
end

-- ||a - b|| / ||b|| in fp64; inf if a has NaN/Inf that b does not.
function M.rel_err(a, b)
  local r = M.compare(a, b)
  if r.n_nonfinite_a > r.n_nonfinite_b then return math.huge end
  if r.sum_sq_ref == 0 then return r.sum_sq_diff == 0 and 0 or math.huge end
  return math.sqrt(r.sum_sq_diff / r.sum_sq_ref)
end

function M.max_abs_diff(a, b)
  local r = M.compare(a, b)
  if r.n_nonfinite_a + r.n_nonfinite_b > 0 then return 0 / 0 end
  return r.max_abs_diff
end

-- |a - b| <= atol + rtol * |b| everywhere (torch's defaults).
function M.allclose(a, b, atol, rtol)
  if type(atol) == "table" then atol, rtol = atol.atol, atol.rtol end
  return M.compare(a, b, atol or 1e-8, rtol or 1e-5).n_not_close == 0
end

-- nil when close, else a message naming the mismatch count and the first ones.
function M.mismatch_report(a, b, atol, rtol, max_shown)
  local r = M.compare(a, b, atol, rtol)
  if r.n_not_close == 0 then return nil end
  local ah, bh = host(a, "report"):contiguous():f64(), host(b, "report"):contiguous():f64()
  local pa = ffi.cast("double*", T.data_ptr(ah))
  local pb = ffi.cast("double*", T.data_ptr(bh))
  local shape = T.size(a)
  local lines = { string.format("%d of %d elements differ beyond atol=%g rtol=%g (max |a-b| %g, rel err %g, non-finite %d/%d)",
    r.n_not_close, T.numel(a), atol or 0, rtol or 0, r.max_abs_diff,
    r.sum_sq_ref > 0 and math.sqrt(r.sum_sq_diff / r.sum_sq_ref) or 0, r.n_nonfinite_a, r.n_nonfinite_b) }
  local shown = 0
  for i = 0, T.numel(a) - 1 do
    local x, y = pa[i], pb[i]
    local close = (x == y) or (x ~= x and y ~= y) or math.abs(x - y) <= (atol or 0) + (rtol or 0) * math.abs(y)
    if not close then
      local idx, rem = {}, i
      for d = #shape, 1, -1 do
        idx[d] = rem % shape[d] + 1
        rem = math.floor(rem / shape[d])
      end
      lines[#lines + 1] = string.format("  at [%s]: got %.6g, expected %.6g", table.concat(idx, ", "), x, y)
      shown = shown + 1
      if shown >= (max_shown or 5) then break end
    end
  end
  -- pa/pb point into ah/bh (which may be a and b themselves): a call that
  -- uses them keeps the collector from freeing them before the reads are done
  C.dl_tensor_check(ah)
  C.dl_tensor_check(bh)
  return table.concat(lines, "\n")
end

-- host copies and raw data pointers across allocations: see the end of distlab.tensor
jit.off(M.compare)
jit.off(M.mismatch_report)

return M
