-- distlab.io — tensors in and out: .npy and .safetensors files, raw bytes.
--
--   t = dl.load("x.npy"[, {device =, dtype =}])            a tensor
--   ts, meta = dl.load("w.safetensors"[, {device =, dtype =}])
--                     {name = tensor}, and the file's __metadata__ ({} if none)
--   dl.save("x.npy", t)
--   dl.save("w.safetensors", {name = t, ...}[, {metadata = {key = "text"}}])
--   t = dl.from_bytes(s, shape, dtype[, device])   s: a Lua string (or a cdata
--                     pointer with opts.nbytes): the tensor's bytes, row-major,
--                     little-endian; also dl.from_bytes(s, {shape =, dtype =, device =})
--   s = t:bytes()     the same bytes of t (any device but meta) as a Lua string
--
-- The format comes from the file's first bytes (the .npy magic; else
-- safetensors' 8-byte header length and its '{'), not from the name. Data
-- goes from the file straight into the tensor's storage on cpu (one read,
-- no per-element Lua: 1M f32 in about 2 ms), and through pinned host
-- buffers on cuda; on meta only the headers are read, so a checkpoint's
-- shapes and bytes can be had on a laptop. device defaults to
-- dl.default_device(); dtype converts after loading.
--
-- .npy (format versions 1, 2 and 3): dtypes f2 f4 f8 i4 i8 u1 as f16 f32
-- f64 i32 i64 u8, either byte order (big-endian is swapped on reading);
-- b1 (bool) loads as u8 (0/1); V2 as bf16: numpy has no bfloat16, and
-- np.save of an ml_dtypes.bfloat16 array writes descr '<V2' (read it back
-- with np.load(f).view(ml_dtypes.bfloat16)); dl.save writes bf16 so. Any
-- other dtype (i1, i2, u2, u4, u8, complex, strings, structured, objects)
-- is an error that names it. C and Fortran order (Fortran is made
-- row-major), any rank, 0-d included. dl.save writes version 1.0 (2.0 for a
-- header past 64 KiB), C order, little-endian, the header padded to 64
-- bytes as numpy does.
-- .safetensors: BF16 F16 F32 F64 I32 I64 U8, and BOOL as u8; other dtypes
-- (F8_*, I8, I16, U16, U32, U64) are errors that name them. Every tensor's
-- data_offsets are checked: inside the data, of its shape's size, no two
-- overlapping. dl.save writes the names sorted, each tensor's data 8-byte
-- aligned after a header padded with spaces to a multiple of 8 (the spec's
-- rule), "__metadata__" when given (string values).
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"
local json = require "distlab.json"

local C, check, fail = core.C, core.check, core.fail
local T = tensor.methods
local M = {}

local function read_head(path, n)
  local f, err = io.open(path, "rb")
  if not f then fail("load: cannot open %s (%s)", path, tostring(err)) end
  local s = f:read(n) or ""
  local size = f:seek("end")
  f:close()
  return s, size
end

-- A tensor of dtype/shape on `device` with the file's bytes from `offset`.
local function read_tensor(path, offset, dtype, shape, device, swap)
  local t = tensor.empty(shape, { dtype = dtype, device = device })
  check(C.dl_tensor_read_file(t, path, offset, swap and 1 or 0, core.stream))
  return t
end

local function le_u32(s, i)
  local a, b, c, d = s:byte(i, i + 3)
  return a + b * 256 + c * 65536 + d * 16777216
end

-- ---- .npy -------------------------------------------------------------------------

local NPY_MAGIC = "\147NUMPY"
-- descr type code and size -> distlab dtype
local NPY_TYPES = { f2 = "f16", f4 = "f32", f8 = "f64", i4 = "i32", i8 = "i64", u1 = "u8", b1 = "u8", V2 = "bf16" }
local NPY_NAMES = { i1 = "int8", i2 = "int16", u2 = "uint16", u4 = "uint32", u8 = "uint64", c8 = "complex64",
  c16 = "complex128", f16 = "float128", f12 = "float96", O8 = "object", M8 = "datetime64", m8 = "timedelta64" }
local NPY_DESCR = { f16 = "<f2", f32 = "<f4", f64 = "<f8", i32 = "<i4", i64 = "<i8", u8 = "|u1", bf16 = "<V2" }

local function npy_header(path)
  local head, size = read_head(path, 12)
  if head:sub(1, 6) ~= NPY_MAGIC then return nil end
  local major = head:byte(7)
  local hlen, start
  if major == 1 then
    hlen, start = head:byte(9) + 256 * head:byte(10), 10
  elseif major == 2 or major == 3 then
    hlen, start = le_u32(head, 9), 12
  else
    fail("load: %s is .npy format version %d.%d, which distlab does not read (1, 2 and 3 it does)", path, major,
      head:byte(8))
  end
  local f = io.open(path, "rb")
  f:seek("set", start)
  local text = f:read(hlen) or ""
  f:close()
  if #text ~= hlen then fail("load: %s: the .npy header is cut short (%d of %d bytes)", path, #text, hlen) end
  local descr = text:match("'descr'%s*:%s*'([^']*)'")
  local order = text:match("'fortran_order'%s*:%s*(%a+)")
  local shape_s = text:match("'shape'%s*:%s*(%b())")
  if not (descr and order and shape_s) then
    fail("load: %s: cannot read the .npy header %s (a structured dtype?)", path, text:gsub("%s+$", ""))
  end
  local shape = {}
  for n in shape_s:gmatch("%d+") do shape[#shape + 1] = tonumber(n) end
  return { descr = descr, fortran = order == "True", shape = shape, offset = start + hlen, size = size }
end

local function npy_dtype(path, descr)
  local order, code = descr:match("^([<>|=]?)(%a%d+)$")
  local dt = code and NPY_TYPES[code]
  if not dt then
    local name = code and NPY_NAMES[code] and " (" .. NPY_NAMES[code] .. ")" or ""
    fail("load: %s holds numpy dtype '%s'%s, which has no distlab dtype (distlab reads f2 f4 f8 i4 i8 u1 b1, " ..
      "and V2 as bf16)", path, descr, name)
  end
  return dt, order == ">" and core.dtypes[dt] ~= C.DL_U8
end

local function load_npy(path, h, o)
  local dt, swap = npy_dtype(path, h.descr)
  if not h.fortran or #h.shape < 2 then
    return read_tensor(path, h.offset, dt, h.shape, o.device, swap)
  end
  -- Fortran order: the bytes are the row-major tensor of the reversed shape, transposed
  local rev, perm = {}, {}
  for i = #h.shape, 1, -1 do rev[#rev + 1], perm[#perm + 1] = h.shape[i], i end
  local t = read_tensor(path, h.offset, dt, rev, o.device, swap)
  local v = T.permute(t, perm)
  local out = T.clone(v)
  T.free(v)
  T.free(t)
  return out
end

local function shape_tuple(shape)
  if #shape == 0 then return "()" end
  if #shape == 1 then return "(" .. shape[1] .. ",)" end
  return "(" .. table.concat(shape, ", ") .. ")"
end

local function save_npy(path, t)
  local dict = string.format("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", NPY_DESCR[t.dtype],
    shape_tuple(t.shape))
  -- magic, version, header length, dict, spaces and "\n": a multiple of 64 bytes
  local pre = #dict + 1 + 10 < 65536 and 10 or 12
  local pad = (64 - (pre + #dict + 1) % 64) % 64
  local hlen = #dict + pad + 1
  local head
  if pre == 10 then
    head = NPY_MAGIC .. "\1\0" .. string.char(hlen % 256, math.floor(hlen / 256))
  else
    head = NPY_MAGIC .. "\2\0" .. string.char(hlen % 256, math.floor(hlen / 256) % 256,
      math.floor(hlen / 65536) % 256, math.floor(hlen / 16777216))
  end
  return head .. dict .. string.rep(" ", pad) .. "\n"
end

-- ---- .safetensors -------------------------------------------------------------------

local ST_TYPES = { BF16 = "bf16", F16 = "f16", F32 = "f32", F64 = "f64", I32 = "i32", I64 = "i64", U8 = "u8",
  BOOL = "u8" }
local ST_NAMES = { bf16 = "BF16", f16 = "F16", f32 = "F32", f64 = "F64", i32 = "I32", i64 = "I64", u8 = "U8" }

local function safetensors_header(path)
  local head, size = read_head(path, 9)
  if #head < 9 or head:sub(9, 9) ~= "{" then return nil end
  local n = le_u32(head, 1) + le_u32(head, 5) * 4294967296
  if n > size - 8 then
    fail("load: %s: the safetensors header says %d bytes, but the file has %d after the length", path, n, size - 8)
  end
  local f = io.open(path, "rb")
  f:seek("set", 8)
  local text = f:read(n)
  f:close()
  local ok, h = pcall(json.decode, text, path .. ": safetensors header")
  if not ok then fail("load: %s", h) end
  if type(h) ~= "table" then fail("load: %s: the safetensors header is not a JSON object", path) end
  return { entries = h, data = 8 + n, size = size }
end

local function load_safetensors(path, h, o)
  local meta = h.entries.__metadata__ or {}
  local list, data_bytes = {}, h.size - h.data
  for name, e in pairs(h.entries) do
    if name ~= "__metadata__" then
      local where = string.format("load: %s: tensor %q", path, name)
      if type(e) ~= "table" or type(e.dtype) ~= "string" or type(e.shape) ~= "table" or type(e.data_offsets) ~= "table" then
        fail("%s: an entry needs dtype, shape and data_offsets", where)
      end
      local dt = ST_TYPES[e.dtype]
      if not dt then
        fail("%s has dtype %s, which has no distlab dtype (distlab reads BF16 F16 F32 F64 I32 I64 U8, BOOL as u8)",
          where, e.dtype)
      end
      local numel = 1
      for i, n in ipairs(e.shape) do numel = numel * args.size(n, where .. ": shape[" .. i .. "]") end
      local b, en = e.data_offsets[1], e.data_offsets[2]
      args.size(b, where .. ": data_offsets[1]")
      args.size(en, where .. ": data_offsets[2]")
      local want = numel * tonumber(C.dl_dtype_size(core.dtypes[dt]))
      if en < b or en - b ~= want then
        fail("%s: data_offsets [%d, %d) hold %d bytes, but %s %s needs %d", where, b, en, en - b, e.dtype,
          "[" .. table.concat(e.shape, ", ") .. "]", want)
      end
      if en > data_bytes then
        fail("%s: data_offsets [%d, %d) reach past the data's %d bytes", where, b, en, data_bytes)
      end
      list[#list + 1] = { name = name, dtype = dt, shape = e.shape, b = b, e = en }
    end
  end
  table.sort(list, function(x, y) return x.b < y.b or (x.b == y.b and x.e < y.e) end)
  local last -- the non-empty tensor that ends last so far
  for _, e in ipairs(list) do
    if e.e > e.b then
      if last and e.b < last.e then
        fail("load: %s: tensors %q and %q overlap (bytes %d..%d and %d..%d)", path, last.name, e.name, last.b,
          last.e - 1, e.b, e.e - 1)
      end
      if not last or e.e > last.e then last = e end
    end
  end
  local out = {}
  for _, e in ipairs(list) do out[e.name] = read_tensor(path, h.data + e.b, e.dtype, e.shape, o.device) end
  return out, meta
end

local function save_safetensors(path, tensors, metadata)
  local names = {}
  for name, t in pairs(tensors) do
    if type(name) ~= "string" then fail("save: tensor names must be strings, got %s", tostring(name)) end
    if name == "__metadata__" then fail("save: __metadata__ is the format's own key; pass {metadata = ...}") end
    if not tensor.is_tensor(t) then fail("save: %q is a %s, not a tensor", name, type(t)) end
    names[#names + 1] = name
  end
  table.sort(names)
  local header, off = {}, 0
  for _, name in ipairs(names) do
    local t = tensors[name]
    local shape = t.shape
    header[name] = { dtype = ST_NAMES[t.dtype], shape = setmetatable(shape, json.array),
      data_offsets = { off, off + T.nbytes(t) } }
    off = off + T.nbytes(t)
  end
  if metadata ~= nil then
    if type(metadata) ~= "table" then fail("save: metadata must be a table of strings") end
    for k, v in pairs(metadata) do
      if type(k) ~= "string" or type(v) ~= "string" then
        fail("save: metadata holds strings only (%s = %s)", tostring(k), tostring(v))
      end
    end
    header.__metadata__ = metadata
  end
  local text = json.encode(header)
  text = text .. string.rep(" ", (8 - #text % 8) % 8)
  local n = #text
  local len = string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 16777216) % 256, 0, 0, 0, 0)
  return len .. text, names
end

-- ---- load and save ----------------------------------------------------------------------

local LOAD_KEYS = { "device", "dtype" }

function M.load(path, opts)
  if type(path) ~= "string" then fail("load: path must be a string, got %s", type(path)) end
  local o = args.options(opts, LOAD_KEYS, "load")
  if o.dtype ~= nil then core.dtype_id(o.dtype) end
  if o.device ~= nil then core.parse_device(o.device) end
  local function convert(t)
    if o.dtype == nil then return t end
    local c = T.to(t, o.dtype)
    if c ~= t then T.free(t) end
    return c
  end
  local h = npy_header(path)
  if h then return convert(load_npy(path, h, o)) end
  h = safetensors_header(path)
  if h then
    local ts, meta = load_safetensors(path, h, o)
    for name, t in pairs(ts) do ts[name] = convert(t) end
    return ts, meta
  end
  fail("load: %s is neither .npy (no \\x93NUMPY magic) nor .safetensors (no 8-byte length then '{')", path)
end

local SAVE_KEYS = { "metadata" }

local function write_text(path, text)
  local f, err = io.open(path, "wb")
  if not f then fail("save: cannot open %s (%s)", path, tostring(err)) end
  f:write(text)
  f:close()
end

local function append(path, t)
  local c = T.contiguous(t)
  check(C.dl_tensor_append_file(c, path, core.stream))
  if c ~= t then T.free(c) end
end

-- dl.save(path, t) writes .npy; dl.save(path, {name = t}) writes .safetensors.
function M.save(path, x, opts)
  if type(path) ~= "string" then fail("save: path must be a string, got %s", type(path)) end
  local o = args.options(opts, SAVE_KEYS, "save")
  if tensor.is_tensor(x) then
    if o.metadata ~= nil then fail("save: metadata is for .safetensors (a table of tensors), not .npy") end
    check(C.dl_tensor_check(x))
    if x.device == "meta" then fail("save: a meta tensor holds no values") end
    write_text(path, save_npy(path, x))
    append(path, x)
    return
  end
  if type(x) ~= "table" then fail("save: expected a tensor (.npy) or a table of name = tensor (.safetensors), got %s", type(x)) end
  for _, t in pairs(x) do
    if tensor.is_tensor(t) then
      check(C.dl_tensor_check(t))
      if t.device == "meta" then fail("save: a meta tensor holds no values") end
    end
  end
  local head, names = save_safetensors(path, x, o.metadata)
  write_text(path, head)
  for _, name in ipairs(names) do append(path, x[name]) end
end

-- ---- bytes --------------------------------------------------------------------------

local BYTES_KEYS = { "shape", "dtype", "device", "nbytes" }

function M.from_bytes(s, shape, dtype, device)
  local o
  if type(shape) == "table" and shape[1] == nil and next(shape) ~= nil then
    o = args.options(shape, BYTES_KEYS, "from_bytes")
    if dtype ~= nil or device ~= nil then fail("from_bytes: nothing after the options table") end
  else
    o = { shape = shape, dtype = dtype, device = device }
  end
  if type(o.shape) ~= "table" then fail("from_bytes: shape must be a table of sizes") end
  local n
  if type(s) == "string" then
    n = #s
  elseif type(s) == "cdata" then
    n = args.size(o.nbytes, "from_bytes: nbytes (the size of the memory a pointer gives)")
  else
    fail("from_bytes: expected a string or a cdata pointer, got %s", type(s))
  end
  local t = tensor.empty(o.shape, { dtype = o.dtype or "f32", device = o.device })
  local want = T.nbytes(t)
  if n ~= want then
    local dt = t.dtype -- read before the free: a freed tensor answers nothing
    T.free(t)
    fail("from_bytes: %d bytes given, but %s [%s] takes %d", n, dt, table.concat(o.shape, ", "), want)
  end
  check(C.dl_tensor_from_host(t, s, n, core.stream))
  return t
end

function T.bytes(t)
  check(C.dl_tensor_check(t))
  if t.dev_type == C.DL_META then fail("bytes: a meta tensor holds no bytes") end
  local c = T.contiguous(t)
  local n = T.nbytes(c)
  local s
  if n == 0 then
    s = ""
  elseif c.dev_type == C.DL_CPU then
    s = ffi.string(T.data_ptr(c), n)
  else
    local buf = ffi.new("uint8_t[?]", math.max(n, 1))
    check(C.dl_tensor_to_host(c, buf, n, core.stream))
    s = ffi.string(buf, n)
  end
  if c ~= t then T.free(c) end
  return s
end

-- a raw data pointer across an allocation: see the end of distlab.tensor
jit.off(T.bytes)

return M
