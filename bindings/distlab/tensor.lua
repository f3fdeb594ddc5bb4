-- distlab.tensor — tensors as FFI objects (struct dl_tensor with a metatype),
-- freed by the garbage collector through ffi.gc, or at once with t:free().
--
-- Torch7 conventions: dimensions and indices are 1-based. Views (narrow,
-- select, view/reshape, transpose, permute) share storage with their base;
-- the C storage is reference counted, so a view keeps its base's memory alive.
local ffi = require "ffi"
local core = require "distlab.core"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail

local M = {}
local T = {}      -- methods
local props = {}  -- computed fields: t.shape, t.dtype, t.device, t.ndim

local i64arr = ffi.typeof("int64_t[8]")
local tensor_pp = ffi.typeof("dl_tensor_t*[1]")

-- ---- construction helpers ----------------------------------------------------

local function wrap(pp)
  return ffi.gc(pp[0], C.dl_tensor_free)
end
M.wrap = wrap

local function is_tensor(x)
  return type(x) == "cdata" and ffi.istype("dl_tensor_t*", x)
end
M.is_tensor = is_tensor

-- Device memory is invisible to Lua's GC: on DL_ENOMEM collect once, retry.
local function empty_raw(dtype, ndim, shape_arr, dev_type, dev_index)
  local pp = tensor_pp()
  local rc = C.dl_tensor_empty(pp, dtype, ndim, shape_arr, dev_type, dev_index, core.stream)
  if rc == C.DL_ENOMEM then
    collectgarbage("collect")
    collectgarbage("collect")
    rc = C.dl_tensor_empty(pp, dtype, ndim, shape_arr, dev_type, dev_index, core.stream)
  end
  check(rc)
  return wrap(pp)
end

-- Parses (shape..., opts) in the forms dl.empty(2, 3), dl.empty({2, 3}),
-- dl.empty({2, 3}, "bf16"), dl.empty({2, 3}, {dtype = "bf16", device = "cuda"}).
-- fn names the factory in messages; known lists its option keys (default:
-- dtype and device). Sizes go through distlab.args (integers that fit an
-- int64_t); a dtype or a device given twice, a second options table, sizes
-- after the options and unknown option keys are errors.
local BASE_KEYS = { "dtype", "device" }
local function parse_args(fn, known, ...)
  local shape, opts, seen = {}, {}, {}
  local n = select("#", ...)
  local function once(key, v)
    if seen[key] then fail("%s: %s given twice (%s and %s)", fn, key, tostring(seen[key]), tostring(v)) end
    seen[key] = v
    opts[key] = v
  end
  for i = 1, n do
    local a = select(i, ...)
    if type(a) == "number" or (type(a) == "table" and (a[1] ~= nil or next(a) == nil and #shape == 0 and i == 1)) then
      if next(seen) then fail("%s: sizes after the options (argument #%d)", fn, i) end
      if type(a) == "number" then
        shape[#shape + 1] = a
      else
        if #shape > 0 then fail("%s: a shape table after sizes (argument #%d)", fn, i) end
        for k in pairs(a) do
          if type(k) ~= "number" or k < 1 or k > #a or k ~= math.floor(k) then
            fail("%s: a shape table holds sizes only, not key %s", fn, tostring(k))
          end
        end
        for _, v in ipairs(a) do shape[#shape + 1] = v end
      end
    elseif type(a) == "table" then
      args.options(a, known or BASE_KEYS, fn)
      for k, v in pairs(a) do once(k, v) end
    elseif type(a) == "string" then
      if core.is_dtype(a) then once("dtype", a)
      elseif core.is_device(a) then once("device", a)
      else fail("%s: unknown argument %q (not a dtype or a device)", fn, a) end
    elseif a ~= nil then
      fail("%s: bad argument #%d of type %s (expected sizes, a shape table or options)", fn, i, type(a))
    end
  end
  for i, v in ipairs(shape) do shape[i] = args.size(v, fn .. ": size in dimension " .. i) end
  if #shape > 8 then fail("%s: a tensor has at most 8 dimensions, got %d", fn, #shape) end
  return shape, opts
end
M.parse_args = parse_args

local function shape_arr(shape)
  local a = i64arr()
  for i, v in ipairs(shape) do a[i - 1] = v end
  return a
end

-- empty_as(fn, known, ...): dl.empty's arguments, messages naming fn.
function M.empty_as(fn, known, ...)
  local shape, opts = parse_args(fn, known, ...)
  local dt, di = core.parse_device(opts.device)
  return empty_raw(core.dtype_id(opts.dtype or "f32"), #shape, shape_arr(shape), dt, di)
end

function M.empty(...) return M.empty_as("empty", nil, ...) end

-- ---- fields ------------------------------------------------------------------

function props.shape(t)
  local s = {}
  for i = 0, t.nd - 1 do s[i + 1] = tonumber(t.sz[i]) end
  return s
end
function props.dtype(t) return core.dtype_names[t.dtype_id] end
function props.device(t) return core.device_name(t.dev_type, t.dev_index) end
function props.ndim(t) return t.nd end

local function dim_arg(t, d, what)
  if type(d) ~= "number" or d ~= math.floor(d) then
    fail("%s: dimension must be an integer, got %s", what, tostring(d))
  end
  if d < 0 then d = t.nd + 1 + d end
  if d < 1 or d > t.nd then
    fail("%s: dimension %d out of range for a %d-dimensional tensor", what, d, t.nd)
  end
  return d
end

-- A freed tensor (t:free()) answers nothing, not even its shape.
local function live(t)
  if t.storage == nil then check(C.dl_tensor_check(t)) end
  return t
end

function T.dim(t) return live(t).nd end
function T.numel(t) check(C.dl_tensor_check(t)) return tonumber(C.dl_tensor_numel(t)) end
function T.nbytes(t) return T.numel(t) * C.dl_dtype_size(t.dtype_id) end
function T.element_size(t) return C.dl_dtype_size(live(t).dtype_id) end
function T.size(t, d)
  live(t)
  if d == nil then return props.shape(t) end
  return tonumber(t.sz[dim_arg(t, d, "size") - 1])
end
function T.stride(t, d)
  live(t)
  if d == nil then
    local s = {}
    for i = 0, t.nd - 1 do s[i + 1] = tonumber(t.st[i]) end
    return s
  end
  return tonumber(t.st[dim_arg(t, d, "stride") - 1])
end
function T.storage_offset(t) return tonumber(live(t).offset) end
function T.is_contiguous(t) check(C.dl_tensor_check(t)) return C.dl_tensor_is_contiguous(t) == 1 end
function T.data_ptr(t)
  local p = ffi.new("void*[1]")
  check(C.dl_tensor_data_ptr(t, p))
  return p[0]
end
function T.is_cuda(t) return live(t).dev_type == C.DL_CUDA end

-- Frees the storage now (if no view shares it); later use is an error.
function T.free(t)
  check(C.dl_tensor_release(t))
end

function T.record_stream(t, s)
  -- a stream object (distlab.stream), or nil for the default stream
  if s ~= nil and not (type(s) == "table" and type(s.ptr) == "cdata" and ffi.istype("dl_stream_t*", s.ptr)) then
    fail("record_stream: expected a stream (dl.stream()) or nil, got %s", type(s) == "string" and
      string.format("%q", s) or type(s))
  end
  check(C.dl_tensor_record_stream(t, s and s.ptr or nil))
  return t
end

-- ---- views -------------------------------------------------------------------

local function as_strided(t, shape, strides, offset)
  local pp = tensor_pp()
  local n = #shape
  local sa, st = i64arr(), i64arr()
  for i = 1, n do
    sa[i - 1] = shape[i]
    st[i - 1] = strides[i]
  end
  check(C.dl_tensor_as_strided(pp, t, n, sa, st, offset))
  return wrap(pp)
end
M.as_strided = as_strided
T.as_strided = function(t, shape, strides, offset)
  return as_strided(t, shape, strides, offset or tonumber(t.offset))
end

function T.narrow(t, d, start, len)
  check(C.dl_tensor_check(t))
  d = dim_arg(t, d, "narrow")
  local size = tonumber(t.sz[d - 1])
  if type(start) ~= "number" or type(len) ~= "number" or start ~= math.floor(start) or
     len ~= math.floor(len) then
    fail("narrow: start and length must be integers")
  end
  if start < 1 or len < 0 or start + len - 1 > size then
    fail("narrow: elements %d..%d out of range for dimension %d of size %d", start,
      start + len - 1, d, size)
  end
  local shape, strides = props.shape(t), T.stride(t)
  shape[d] = len
  return as_strided(t, shape, strides, tonumber(t.offset) + (start - 1) * strides[d])
end

function T.select(t, d, index)
  check(C.dl_tensor_check(t))
  d = dim_arg(t, d, "select")
  local size = tonumber(t.sz[d - 1])
  if type(index) ~= "number" or index ~= math.floor(index) then fail("select: index must be an integer") end
  if index < 0 then index = size + 1 + index end
  if index < 1 or index > size then
    fail("select: index %d out of range for dimension %d of size %d", index, d, size)
  end
  local shape, strides = props.shape(t), T.stride(t)
  local off = tonumber(t.offset) + (index - 1) * strides[d]
  table.remove(shape, d)
  table.remove(strides, d)
  return as_strided(t, shape, strides, off)
end

function T.transpose(t, d1, d2)
  check(C.dl_tensor_check(t))
  d1, d2 = dim_arg(t, d1, "transpose"), dim_arg(t, d2, "transpose")
  local shape, strides = props.shape(t), T.stride(t)
  shape[d1], shape[d2] = shape[d2], shape[d1]
  strides[d1], strides[d2] = strides[d2], strides[d1]
  return as_strided(t, shape, strides, tonumber(t.offset))
end

function T.permute(t, ...)
  check(C.dl_tensor_check(t))
  local order = type(...) == "table" and ... or { ... }
  if #order ~= t.nd then fail("permute: %d dimensions given for a %d-dimensional tensor", #order, t.nd) end
  local shape, strides, seen = {}, {}, {}
  local s0, st0 = props.shape(t), T.stride(t)
  for i, d in ipairs(order) do
    d = dim_arg(t, d, "permute")
    if seen[d] then fail("permute: dimension %d repeated", d) end
    seen[d] = true
    shape[i], strides[i] = s0[d], st0[d]
  end
  return as_strided(t, shape, strides, tonumber(t.offset))
end

-- New shape with at most one -1; nil if the strides cannot express it
-- without a copy (the algorithm of Torch's computeStride).
local function view_strides(t, shape)
  local old, oldst = props.shape(t), T.stride(t)
  local numel = 1
  for _, v in ipairs(old) do numel = numel * v end
  local strides = {}
  if numel == 0 then
    local s = 1
    for i = #shape, 1, -1 do strides[i] = s; s = s * math.max(shape[i], 1) end
    return strides
  end
  local view_d = #shape
  local chunk_base = oldst[#old] or 1
  local tensor_numel, view_numel = 1, 1
  for d = #old, 1, -1 do
    tensor_numel = tensor_numel * old[d]
    if d == 1 or (old[d - 1] ~= 1 and oldst[d - 1] ~= tensor_numel * chunk_base) then
      while view_d >= 1 and (view_numel < tensor_numel or shape[view_d] == 1) do
        strides[view_d] = view_numel * chunk_base
        view_numel = view_numel * shape[view_d]
        view_d = view_d - 1
      end
      if view_numel ~= tensor_numel then return nil end
      if d > 1 then
        chunk_base = oldst[d - 1]
        tensor_numel, view_numel = 1, 1
      end
    end
  end
  if view_d ~= 0 then return nil end
  return strides
end

-- Sizes for view/reshape: integers >= 0 and at most one -1, inferred.
local function view_shape(t, ...)
  local a = ...
  local sizes = type(a) == "table" and a or { ... }
  local shape, known, infer = {}, 1, nil
  for i, v in ipairs(sizes) do
    if type(v) ~= "number" or v ~= math.floor(v) or v < -1 then
      fail("view: size %s in dimension %d is not an integer >= -1", tostring(v), i)
    end
    if v == -1 then
      if infer then fail("view: only one dimension can be -1") end
      infer = i
    else
      known = known * v
    end
    shape[i] = v
  end
  if #shape > 8 then fail("view: a tensor has at most 8 dimensions, got %d", #shape) end
  local total = T.numel(t)
  if infer then
    if known == 0 or total % known ~= 0 then
      fail("view: cannot infer dimension %d: %d elements do not divide into %d", infer, total, known)
    end
    shape[infer] = math.floor(total / known)
  elseif known ~= total then
    fail("view: shape [%s] has %d elements but the tensor has %d", table.concat(shape, ", "),
      known, total)
  end
  return shape
end

function T.view(t, ...)
  check(C.dl_tensor_check(t))
  local shape = view_shape(t, ...)
  local strides = view_strides(t, shape)
  if not strides then
    fail("view: the tensor's strides cannot express shape [%s] without a copy; use reshape",
      table.concat(shape, ", "))
  end
  return as_strided(t, shape, strides, tonumber(t.offset))
end

function T.reshape(t, ...)
  check(C.dl_tensor_check(t))
  local ok, v = pcall(T.view, t, ...)
  if ok then return v end
  return T.view(T.contiguous(t), ...)
end

-- ---- data movement -----------------------------------------------------------

function T.copy_(t, src)
  if not is_tensor(src) then fail("copy_: source is a %s, not a tensor", type(src)) end
  check(C.dl_tensor_copy(t, src, core.stream))
  return t
end

local function empty_like(t, dtype, dev_type, dev_index)
  return empty_raw(dtype or t.dtype_id, t.nd, t.sz, dev_type or t.dev_type, dev_index or t.dev_index)
end
M.empty_like = function(t, opts)
  opts = args.options(opts, BASE_KEYS, "empty_like")
  local dt, di = t.dev_type, t.dev_index
  if opts.device then dt, di = core.parse_device(opts.device) end
  return empty_like(t, opts.dtype and core.dtype_id(opts.dtype), dt, di)
end

function T.clone(t)
  check(C.dl_tensor_check(t))
  return T.copy_(empty_like(t), t)
end

function T.contiguous(t)
  if T.is_contiguous(t) then return t end
  return T.clone(t)
end

-- t:to("bf16"), t:to("cuda:0"), t:to{device = "cpu", dtype = "f32"}; returns t
-- itself when nothing changes.
function T.to(t, a, b)
  check(C.dl_tensor_check(t))
  local dtype, device
  for _, x in ipairs({ a, b }) do
    if type(x) == "table" then
      args.options(x, BASE_KEYS, "to")
      dtype, device = x.dtype or dtype, x.device or device
    elseif core.is_dtype(x) then dtype = x
    elseif core.is_device(x) then device = x
    elseif x ~= nil then fail("to: %s is neither a dtype nor a device", tostring(x)) end
  end
  local did = dtype and core.dtype_id(dtype) or t.dtype_id
  local dt, di = t.dev_type, t.dev_index
  if device then dt, di = core.parse_device(device) end
  if did == t.dtype_id and dt == t.dev_type and di == t.dev_index then return t end
  return T.copy_(empty_like(t, did, dt, di), t)
end
for _, name in ipairs({ "f32", "f16", "bf16", "f64", "i32", "i64", "u8" }) do
  T[name] = function(t) return T.to(t, name) end
end
T.float, T.half, T.double, T.long, T.int = T.f32, T.f16, T.f64, T.i64, T.i32
function T.cpu(t) return T.to(t, "cpu") end
function T.cuda(t, i) return T.to(t, i and ("cuda:" .. i) or "cuda") end

-- ---- element-wise --------------------------------------------------------------

function T.fill_(t, v)
  if type(v) ~= "number" then fail("fill_: value must be a number, got %s", type(v)) end
  check(C.dl_tensor_fill(t, v, core.stream))
  return t
end
function T.zero_(t) return T.fill_(t, 0) end

-- t += alpha * x (x a tensor of the same shape, or a number)
function T.add_(t, x, alpha)
  if type(x) == "number" then
    check(C.dl_tensor_scale_shift(t, 1, x * (alpha == nil and 1 or args.number(alpha, "add_: alpha")), core.stream))
  elseif is_tensor(x) then
    check(C.dl_tensor_axpby(t, 1, x, alpha == nil and 1 or args.number(alpha, "add_: alpha"), core.stream))
  else
    fail("add_: expected a tensor or a number, got %s", type(x))
  end
  return t
end

function T.sub_(t, x, alpha) return T.add_(t, x, -(alpha == nil and 1 or args.number(alpha, "sub_: alpha"))) end

function T.mul_(t, x)
  if type(x) == "number" then
    check(C.dl_tensor_scale_shift(t, x, 0, core.stream))
  elseif is_tensor(x) then
    check(C.dl_tensor_mul(t, x, core.stream))
  else
    fail("mul_: expected a tensor or a number, got %s", type(x))
  end
  return t
end

-- ---- random --------------------------------------------------------------------

local gen = { seed = 0x2545F4914F6CDD1D, offset = 0 }

function M.manual_seed(seed)
  if type(seed) ~= "number" then fail("manual_seed: seed must be a number") end
  gen.seed, gen.offset = seed, 0
end

-- (seed, offset) for a draw of n values: opts.seed gives a fixed stream.
local function draw(n, seed)
  if seed then return seed, 0 end
  local s, o = gen.seed, gen.offset
  gen.offset = gen.offset + n
  return s, o
end

-- fn, an, bn name the draw and its two numbers in messages
local function random_(t, dist, a, b, seed, fn, an, bn)
  a, b = args.number(a, fn .. ": " .. an), args.number(b, fn .. ": " .. bn)
  if seed ~= nil then seed = args.int(seed, fn .. ": seed") end
  local s, o = draw(T.numel(t), seed)
  check(C.dl_tensor_random(t, dist, ffi.cast("uint64_t", s), o, a, b, core.stream))
  return t
end
function T.normal_(t, mean, std, seed)
  return random_(t, C.DL_RAND_NORMAL, mean or 0, std or 1, seed, "normal_", "mean", "std")
end
function T.uniform_(t, lo, hi, seed)
  return random_(t, C.DL_RAND_UNIFORM, lo or 0, hi or 1, seed, "uniform_", "low", "high")
end

-- ---- reading back ------------------------------------------------------------

local function host_f64(t)
  local int = t.dtype_id == C.DL_I32 or t.dtype_id == C.DL_I64 or t.dtype_id == C.DL_U8
  local h = empty_like(t, int and C.DL_I64 or C.DL_F64, C.DL_CPU, 0)
  check(C.dl_tensor_copy(h, t, core.stream))
  local ptr = ffi.cast(int and "int64_t*" or "double*", T.data_ptr(h))
  return h, ptr
end

function T.tolist(t)
  check(C.dl_tensor_check(t))
  if t.dev_type == C.DL_META then fail("tolist: a meta tensor holds no values") end
  local h, p = host_f64(t)
  local shape = props.shape(t)
  if #shape == 0 then return tonumber(p[0]) end
  local pos = 0
  local function build(d)
    local out = {}
    for i = 1, shape[d] do
      if d == #shape then
        out[i] = tonumber(p[pos])
        pos = pos + 1
      else
        out[i] = build(d + 1)
      end
    end
    return out
  end
  local r = build(1)
  T.free(h)
  return r
end

function T.item(t)
  local n = T.numel(t)
  if n ~= 1 then fail("item: tensor has %d elements, not 1", n) end
  if t.dev_type == C.DL_META then fail("item: a meta tensor holds no values") end
  local h, p = host_f64(t)
  local v = tonumber(p[0])
  T.free(h)
  return v
end

-- ---- printing ------------------------------------------------------------------

local function fmt_num(v, int)
  if int then return string.format("%d", v) end
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  return string.format("%.4f", v)
end

local function tostring_tensor(t)
  if t.magic ~= 0x54544c44 then return "tensor(<ill-formed>)" end
  if t.storage == nil then return "tensor(<freed>)" end
  local shape = props.shape(t)
  local tail = string.format("shape=[%s], dtype=%s, device=%s", table.concat(shape, ", "),
    props.dtype(t), props.device(t))
  if t.dev_type == C.DL_META then return "tensor(<meta>, " .. tail .. ")" end
  local int = t.dtype_id == C.DL_I32 or t.dtype_id == C.DL_I64 or t.dtype_id == C.DL_U8
  local numel = T.numel(t)
  local edge = numel > 1000 and 3 or math.huge
  local h, p = host_f64(t)
  local strides = T.stride(h)
  local width = 0
  local function cell(v)
    local txt = fmt_num(v, int)
    if #txt > width then width = #txt end
    return string.rep(" ", width - #txt) .. txt
  end
  local function rec(d, off, indent)
    if #shape == 0 then return cell(tonumber(p[0])) end
    local n, parts = shape[d], {}
    local i = 1
    while i <= n do
      if n > 2 * edge and i == edge + 1 then
        parts[#parts + 1] = "..."
        i = n - edge + 1
      end
      local o = off + (i - 1) * strides[d]
      parts[#parts + 1] = d == #shape and cell(tonumber(p[o])) or rec(d + 1, o, indent .. " ")
      i = i + 1
    end
    local sep = d == #shape and ", " or ("," .. string.rep("\n", #shape - d) .. indent .. " ")
    return "[" .. table.concat(parts, sep) .. "]"
  end
  rec(1, 0, "       ") -- first pass: the widest cell
  local body = rec(1, 0, "       ")
  T.free(h)
  return "tensor(" .. body .. ", " .. tail .. ")"
end

-- ---- metatype ------------------------------------------------------------------

local mt = {
  __index = function(t, k)
    local m = T[k]
    if m ~= nil then return m end
    local p = props[k]
    if p then return p(live(t)) end
    return nil
  end,
  __tostring = tostring_tensor,
  __len = function(t) return T.numel(t) end,
}
ffi.metatype("struct dl_tensor", mt)

-- Interpreted, not compiled: these functions take a raw pointer out of a
-- tensor (its struct, its shape array, its data) and then allocate before the
-- C call that uses it. In compiled code LuaJIT keeps only the pointer and may
-- let the tensor's box die; a garbage-collector step at that allocation then
-- runs the box's finalizer and frees the struct (or a host staging buffer)
-- under the pointer: wrong values, seen as `t:narrow(1, i, 1):item()` reading
-- garbage in hot loops. In the interpreter every argument stays on the Lua
-- stack, alive, until the function returns. The hot element-wise paths
-- (fill_, add_, mul_, copy_, random) allocate nothing and stay compiled.
for _, fn in ipairs({ empty_like, as_strided, host_f64, tostring_tensor, T.item, T.tolist, T.narrow,
  T.select, T.transpose, T.permute, T.view, T.reshape, T.clone, T.contiguous, T.to, T.data_ptr,
  T.size, T.stride }) do
  jit.off(fn)
end

M.methods = T
return M
