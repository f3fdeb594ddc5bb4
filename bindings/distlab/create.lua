-- distlab.create — tensor factories: empty, zeros, ones, full, rand, randn,
-- arange, from_table and the *_like variants. All take the same trailing
-- options: a dtype name, a device name, or {dtype =, device =, seed =}.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"

local C, fail = core.C, core.fail
local T = tensor.methods
local M = {}

M.empty = tensor.empty

-- full({2, 3}, 7[, opts]) or full(2, 3, 7[, opts]): the value follows the shape.
function M.full(...)
  local argv = { ... }
  local n = select("#", ...)
  local vi
  if type(argv[1]) == "table" and (argv[1][1] ~= nil or next(argv[1]) == nil) then
    vi = 2
  else
    for i = 1, n do if type(argv[i]) == "number" then vi = i end end
  end
  local value = vi and argv[vi]
  if type(value) ~= "number" then fail("full: expected full(shape, value[, options])") end
  table.remove(argv, vi)
  return T.fill_(tensor.empty_as("full", nil, unpack(argv, 1, n - 1)), value)
end

function M.zeros(...) return T.fill_(tensor.empty_as("zeros", nil, ...), 0) end
function M.ones(...) return T.fill_(tensor.empty_as("ones", nil, ...), 1) end

local RANDN_KEYS = { "dtype", "device", "seed", "mean", "std" }
function M.randn(...)
  local _, opts = tensor.parse_args("randn", RANDN_KEYS, ...)
  return T.normal_(tensor.empty_as("randn", RANDN_KEYS, ...), opts.mean or 0, opts.std or 1, opts.seed)
end

local RAND_KEYS = { "dtype", "device", "seed", "low", "high" }
function M.rand(...)
  local _, opts = tensor.parse_args("rand", RAND_KEYS, ...)
  return T.uniform_(tensor.empty_as("rand", RAND_KEYS, ...), opts.low or 0, opts.high or 1, opts.seed)
end

function M.empty_like(t, opts) return tensor.empty_like(t, opts) end
function M.zeros_like(t, opts) return T.fill_(tensor.empty_like(t, opts), 0) end
function M.ones_like(t, opts) return T.fill_(tensor.empty_like(t, opts), 1) end
function M.full_like(t, v, opts) return T.fill_(tensor.empty_like(t, opts), v) end

-- arange(n), arange(start, stop[, step]): [start, stop), like torch. The
-- values go straight into a host buffer (no Lua table of them), so a huge n
-- is an allocation that succeeds or fails at once.
function M.arange(...)
  local nums, opts = {}, {}
  for i = 1, select("#", ...) do
    local a = select(i, ...)
    if type(a) == "number" then nums[#nums + 1] = a
    elseif type(a) == "table" then
      args.options(a, { "dtype", "device" }, "arange")
      for k, v in pairs(a) do opts[k] = v end
    elseif type(a) == "string" then
      if core.is_dtype(a) then opts.dtype = a
      elseif core.is_device(a) then opts.device = a
      else fail("arange: unknown argument %q (not a dtype or a device)", a) end
    elseif a ~= nil then
      fail("arange: bad argument #%d of type %s", i, type(a))
    end
  end
  local start, stop, step
  if #nums == 1 then start, stop, step = 0, nums[1], 1
  elseif #nums == 2 then start, stop, step = nums[1], nums[2], 1
  elseif #nums == 3 then start, stop, step = nums[1], nums[2], nums[3]
  else fail("arange: expected 1 to 3 numbers, got %d", #nums) end
  for _, x in ipairs { start, stop, step } do
    if x ~= x or x == math.huge or x == -math.huge then fail("arange: %s is not a finite number", tostring(x)) end
  end
  if step == 0 then fail("arange: step must not be 0") end
  local n = args.size(math.max(0, math.ceil((stop - start) / step)), "arange: the number of elements")
  local int = start == math.floor(start) and step == math.floor(step)
  local out = tensor.empty({ n }, { dtype = opts.dtype or (int and "i64" or "f32"), device = opts.device })
  if out.dev_type == C.DL_META or n == 0 then return out end
  local host = tensor.empty({ n }, { dtype = int and "i64" or "f64", device = "cpu" })
  local p = ffi.cast(int and "int64_t*" or "double*", T.data_ptr(host))
  for i = 0, n - 1 do p[i] = start + i * step end
  T.copy_(out, host)
  T.free(host)
  return out
end

-- from_table{{1, 2}, {3, 4}}: nested tables of numbers, rectangular; f32
-- unless a dtype is given (Torch7's default tensor type, not PyTorch's int64).
-- The numbers go straight into the tensor (f32, f64 on cpu) or into a host
-- buffer (f64, or i64 for the integer dtypes) converted in one copy: 1M
-- values in milliseconds, no table of them first.
function M.from_table(tbl, ...)
  if type(tbl) ~= "table" then fail("from_table: expected a (nested) table of numbers") end
  local _, opts = tensor.parse_args("from_table", nil, ...)
  local shape, d = {}, tbl
  while type(d) == "table" do
    shape[#shape + 1] = #d
    d = d[1]
  end
  local dtype = opts.dtype or "f32"
  local id = core.dtype_id(dtype)
  local int = id == C.DL_I32 or id == C.DL_I64 or id == C.DL_U8
  local out = tensor.empty(shape, { dtype = dtype, device = opts.device })
  -- f32 and f64 on cpu are written in place (C's conversion, to nearest);
  -- the rest through an f64 (i64) buffer and one converting copy
  local direct = out.dev_type == C.DL_CPU and (id == C.DL_F32 or id == C.DL_F64)
  local host = direct and out or tensor.empty(shape, { dtype = int and "i64" or "f64", device = "cpu" })
  local p = ffi.cast(id == C.DL_F32 and direct and "float*" or int and "int64_t*" or "double*", T.data_ptr(host))
  local nd, pos = #shape, 0
  -- where a value or a row went wrong, built only then
  local function where(path)
    local s = "table"
    for _, i in ipairs(path) do s = s .. "[" .. i .. "]" end
    return s
  end
  local function walk(x, depth, path)
    local n = shape[depth]
    if type(x) ~= "table" or #x ~= n then fail("from_table: ragged at %s (expected %d entries)", where(path), n) end
    if depth == nd then
      for i = 1, n do
        local v = x[i]
        if type(v) ~= "number" then
          path[depth] = i
          fail("from_table: %s is a %s, not a number", where(path), type(v))
        end
        p[pos] = v
        pos = pos + 1
      end
      return
    end
    for i = 1, n do
      path[depth] = i
      walk(x[i], depth + 1, path)
    end
    path[depth] = nil
  end
  walk(tbl, 1, {})
  if host ~= out then
    T.copy_(out, host)
    T.free(host)
  end
  return out
end

return M
