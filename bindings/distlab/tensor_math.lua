-- distlab.tensor_math — the math a reference needs (a MoE router, an
-- attention written by hand), as tensor methods and dl.* functions, on cpu
-- (fp64 twins: the reference) and cuda, on the current stream
-- (core/mem/tensor_math.c; kernels/tensor/tensor_math.h).
--
-- Dimensions are 1-based and may count from the end (-1: the last), as
-- every distlab method. Index TENSORS hold 0-based positions, as numpy,
-- PyTorch and dl.ep's expert ids do (-1 there is "none"), i64 unless a
-- dtype is asked for (i32 also works wherever an index is read).
--
--   y = x:softmax([dim = -1][, {dtype =}])   softmax along dim; y has x's dtype or `dtype`
--   y = x:log_softmax([dim][, {dtype =}])
--       (fp32 sums on cuda, fp64 for f64; a row of only -inf gives NaN, as torch)
--   values, indices = x:topk(k[, {dim = -1, largest = true, dtype = "i64"}])
--       the k largest (smallest) along dim, in order; ties: the lower index first
--   values, indices = x:sort([{dim = -1, descending = false, dtype =}])   stable
--   indices = x:argsort([{dim = -1, descending = false, dtype =}])        stable
--       (NaN sorts above +inf; -0 and +0 are equal)
--   y = x:gather(dim, index)          torch.gather: y[i] = x[i with i[dim] = index[i]]
--   x:scatter_add_(dim, index, src)   torch.scatter_add_: x[i with i[dim] = index[i]] += src[i]
--   y = x:scatter_add(dim, index, src)   the same on a copy
--   y = x:index_select(dim, idx)      rows idx (1-D) of x along dim
--   x:index_add_(dim, idx, src)       x[.., idx[j], ..] += src[.., j, ..] (idx 1-D)
--       (scatter and index adds round each add to x's dtype; on cuda they are
--       atomics in no fixed order: accumulate in f32 for a reproducible sum)
--   y = x:expand(sizes...)            a view: size-1 dims repeated with stride
--                                     0, -1 keeps a size, new dims in front
--   y = dl.cat({a, b, ...}[, dim = 1])  one dtype and device; y new
--   counts = dl.bincount(x, bins[, {weights =, dtype =}])   (also x:bincount)
--       counts[v] of each value v of x in [0, bins) (others, as -1, skipped):
--       i64 counts, or the sums of `weights` (shaped like x) in f32 (dtype f64)
-- Out-of-range indices fail naming the first (on cuda after a wait for the
-- stream). dl.softmax(x, ...), dl.topk(x, ...), dl.argsort(x, ...),
-- dl.gather(x, ...) are the same functions.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods
local M = {}

local function want_tensor(fn, name, x)
  if not tensor.is_tensor(x) then fail("%s: %s must be a tensor, got %s", fn, name, type(x)) end
  check(C.dl_tensor_check(x))
  return x
end

-- A 1-based (or negative) dimension of t -> 0-based for C.
local function dim0(fn, t, d)
  if t.nd == 0 then fail("%s: a 0-dimensional tensor has no dimensions", fn) end
  d = args.int(d, fn .. ": dim")
  if d < 0 then d = t.nd + 1 + d end
  if d < 1 or d > t.nd then fail("%s: dimension %d out of range for a %d-dimensional tensor", fn, d, t.nd) end
  return d - 1
end

local function index_dtype(fn, dt)
  dt = dt or "i64"
  local id = core.dtype_id(dt)
  if id ~= C.DL_I64 and id ~= C.DL_I32 then fail("%s: indices are i64 or i32, not %s", fn, dt) end
  return id
end

local function empty_shaped(like, shape, dtype_id)
  local s = ffi.new("int64_t[8]")
  for i, v in ipairs(shape) do s[i - 1] = v end
  local pp = ffi.new("dl_tensor_t*[1]")
  check(C.dl_tensor_empty(pp, dtype_id, #shape, s, like.dev_type, like.dev_index, core.stream))
  return tensor.wrap(pp)
end

-- ---- softmax ------------------------------------------------------------------

local function softmax(fn, log, x, dim, opts)
  if type(dim) == "table" then dim, opts = nil, dim end
  want_tensor(fn, "x", x)
  opts = args.options(opts, { "dtype" }, fn)
  local d = dim0(fn, x, dim or -1)
  local out = empty_shaped(x, x.shape, opts.dtype and core.dtype_id(opts.dtype) or x.dtype_id)
  check(C.dl_tensor_softmax(out, x, d, log and 1 or 0, core.stream))
  return out
end
function T.softmax(x, dim, opts) return softmax("softmax", false, x, dim, opts) end
function T.log_softmax(x, dim, opts) return softmax("log_softmax", true, x, dim, opts) end

-- ---- sorting ----------------------------------------------------------------------

local SORT_KEYS = { "dim", "descending", "dtype" }

function T.argsort(x, opts)
  want_tensor("argsort", "x", x)
  opts = args.options(opts, SORT_KEYS, "argsort")
  local idx = empty_shaped(x, x.shape, index_dtype("argsort", opts.dtype))
  check(C.dl_tensor_argsort(idx, x, dim0("argsort", x, opts.dim or -1), opts.descending and 1 or 0, core.stream))
  return idx
end

function T.sort(x, opts)
  want_tensor("sort", "x", x)
  opts = args.options(opts, SORT_KEYS, "sort")
  local d = dim0("sort", x, opts.dim or -1)
  local idx = T.argsort(x, opts)
  local values = empty_shaped(x, x.shape, x.dtype_id)
  check(C.dl_tensor_gather(values, x, d, idx, core.stream))
  return values, idx
end

function T.topk(x, k, opts)
  want_tensor("topk", "x", x)
  opts = args.options(opts, { "dim", "largest", "dtype" }, "topk")
  local d = dim0("topk", x, opts.dim or -1)
  k = args.size(k, "topk: k")
  local shape = x.shape
  if k > shape[d + 1] then fail("topk: k = %d, but dimension %d has %d elements", k, d + 1, shape[d + 1]) end
  shape[d + 1] = k
  local values = empty_shaped(x, shape, x.dtype_id)
  local idx = empty_shaped(x, shape, index_dtype("topk", opts.dtype))
  check(C.dl_tensor_topk(values, idx, x, k, d, opts.largest == false and 0 or 1, core.stream))
  return values, idx
end

-- ---- gather and scatter -----------------------------------------------------------

function T.gather(x, dim, index)
  want_tensor("gather", "x", x)
  want_tensor("gather", "index", index)
  local out = empty_shaped(x, index.shape, x.dtype_id)
  check(C.dl_tensor_gather(out, x, dim0("gather", x, dim), index, core.stream))
  return out
end

function T.scatter_add_(x, dim, index, src)
  want_tensor("scatter_add_", "x", x)
  want_tensor("scatter_add_", "index", index)
  want_tensor("scatter_add_", "src", src)
  check(C.dl_tensor_scatter_add(x, dim0("scatter_add_", x, dim), index, src, core.stream))
  return x
end

function T.scatter_add(x, dim, index, src)
  return T.scatter_add_(T.clone(x), dim, index, src)
end

-- idx (1-D) as an index of `shape` along dim d (0-based): stride 0 elsewhere.
local function spread(fn, idx, shape, d)
  want_tensor(fn, "index", idx)
  if idx.nd ~= 1 then fail("%s: the index must be 1-dimensional, got %d dimensions", fn, idx.nd) end
  local strides = {}
  for i = 1, #shape do strides[i] = 0 end
  strides[d + 1] = tonumber(idx.st[0])
  return tensor.as_strided(idx, shape, strides, tonumber(idx.offset))
end

function T.index_select(x, dim, idx)
  want_tensor("index_select", "x", x)
  local d = dim0("index_select", x, dim)
  local shape = x.shape
  shape[d + 1] = tonumber(want_tensor("index_select", "index", idx).sz[0])
  local index = spread("index_select", idx, shape, d)
  local out = empty_shaped(x, shape, x.dtype_id)
  check(C.dl_tensor_gather(out, x, d, index, core.stream))
  T.free(index)
  return out
end

function T.index_add_(x, dim, idx, src)
  want_tensor("index_add_", "x", x)
  want_tensor("index_add_", "src", src)
  local d = dim0("index_add_", x, dim)
  want_tensor("index_add_", "index", idx)
  if src.nd ~= x.nd then fail("index_add_: src has %d dimensions but x %d", src.nd, x.nd) end
  if idx.nd ~= 1 or tonumber(src.sz[d]) ~= tonumber(idx.sz[0]) then
    fail("index_add_: src has %d elements along dimension %d but the index %s", tonumber(src.sz[d]), d + 1,
      idx.nd == 1 and tostring(tonumber(idx.sz[0])) or "is not 1-dimensional")
  end
  local index = spread("index_add_", idx, src.shape, d)
  check(C.dl_tensor_scatter_add(x, d, index, src, core.stream))
  T.free(index)
  return x
end

-- ---- views, cat, bincount -----------------------------------------------------------

function T.expand(x, ...)
  want_tensor("expand", "x", x)
  local sizes = type(...) == "table" and ... or { ... }
  local n, old, oldst = #sizes, x.shape, T.stride(x)
  if n < #old then fail("expand: %d sizes for a %d-dimensional tensor", n, #old) end
  local shape, strides = {}, {}
  for i = n, 1, -1 do
    local j = i - (n - #old) -- the matching dim of x, if any
    local s = args.int(sizes[i], "expand: size " .. i, -1)
    if j >= 1 then
      if s == -1 then s = old[j] end
      if old[j] == s then
        strides[i] = oldst[j]
      elseif old[j] == 1 then
        strides[i] = 0
      else
        fail("expand: dimension %d has size %d, which cannot become %d (only size 1 expands)", j, old[j], s)
      end
    else
      if s == -1 then fail("expand: size -1 for the new dimension %d", i) end
      strides[i] = 0
    end
    shape[i] = s
  end
  return tensor.as_strided(x, shape, strides, tonumber(x.offset))
end

function M.cat(list, dim)
  if type(list) ~= "table" or #list == 0 then fail("cat: expected a non-empty list of tensors") end
  local first = want_tensor("cat", "tensor 1", list[1])
  local d = dim0("cat", first, dim or 1)
  local shape, total = first.shape, 0
  for i, t in ipairs(list) do
    want_tensor("cat", "tensor " .. i, t)
    if t.dtype ~= first.dtype or t.device ~= first.device then
      fail("cat: tensor %d is %s on %s, tensor 1 %s on %s", i, t.dtype, t.device, first.dtype, first.device)
    end
    local s = t.shape
    if #s ~= #shape then fail("cat: tensor %d has %d dimensions, tensor 1 %d", i, #s, #shape) end
    for j = 1, #s do
      if j ~= d + 1 and s[j] ~= shape[j] then
        fail("cat: tensor %d has size %d in dimension %d, tensor 1 %d", i, s[j], j, shape[j])
      end
    end
    total = total + s[d + 1]
  end
  shape[d + 1] = total
  local out = empty_shaped(first, shape, first.dtype_id)
  local at = 1
  for _, t in ipairs(list) do
    local n = tonumber(t.sz[d])
    if n > 0 then
      local v = T.narrow(out, d + 1, at, n)
      T.copy_(v, t)
      T.free(v)
    end
    at = at + n
  end
  return out
end

function M.bincount(x, bins, opts)
  want_tensor("bincount", "x", x)
  bins = args.size(bins, "bincount: bins")
  opts = args.options(opts, { "weights", "dtype" }, "bincount")
  local w = opts.weights
  if w ~= nil then want_tensor("bincount", "weights", w) end
  local dt = opts.dtype and core.dtype_id(opts.dtype) or (w and C.DL_F32 or C.DL_I64)
  local out = empty_shaped(x, { bins }, dt)
  check(C.dl_tensor_fill(out, 0, core.stream))
  check(C.dl_tensor_bincount(out, x, w, core.stream))
  return out
end
function T.bincount(x, bins, opts) return M.bincount(x, bins, opts) end

M.softmax, M.log_softmax, M.topk, M.sort, M.argsort = T.softmax, T.log_softmax, T.topk, T.sort, T.argsort
M.gather, M.index_select = T.gather, T.index_select

-- shapes and strides read from tensors, then an allocation: see the end of distlab.tensor
for _, fn in ipairs { empty_shaped, softmax, T.argsort, T.sort, T.topk, T.gather, spread, T.index_select,
  T.index_add_, T.expand, M.cat, M.bincount } do
  jit.off(fn)
end

return M
