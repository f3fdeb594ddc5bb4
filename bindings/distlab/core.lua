-- distlab.core — loads libdistlab through the FFI and holds what every other
-- module needs: the C namespace, check(rc), device names, dtypes.
--
-- The cdefs come from core/include/distlab.h itself (preprocessor lines,
-- comments and the C++ guard removed), so Lua can never drift from the C ABI;
-- the library's ABI version must equal the header's.
local ffi = require "ffi"

local M = {}

local function script_dir()
  local src = debug.getinfo(1, "S").source
  return (src:sub(1, 1) == "@" and src:sub(2) or src):match("^(.*)/[^/]*$") or "."
end

M.root = os.getenv("DISTLAB_ROOT") or (script_dir() .. "/../..")

local function read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- The header as ffi.cdef accepts it.
function M.cdef_text(header)
  local s = header:gsub("/%*.-%*/", ""):gsub("//[^\n]*", "")
  s = s:gsub("#ifdef __cplusplus.-#endif", "")
  s = s:gsub("\n%s*#[^\n]*", "\n"):gsub("^%s*#[^\n]*", "")
  return s
end

local header_path = M.root .. "/core/include/distlab.h"
local header = read(header_path)
if not header then
  error("distlab: cannot read " .. header_path .. " (set DISTLAB_ROOT to the distlab checkout)", 0)
end
ffi.cdef(M.cdef_text(header))

local function load_lib()
  local candidates = {}
  if os.getenv("DISTLAB_LIB") then candidates[#candidates + 1] = os.getenv("DISTLAB_LIB") end
  candidates[#candidates + 1] = M.root .. "/build/lib/libdistlab.so"
  local errs = {}
  for _, p in ipairs(candidates) do
    local ok, lib = pcall(ffi.load, p)
    if ok then return lib, p end
    errs[#errs + 1] = "  " .. p .. ": " .. tostring(lib)
  end
  error("distlab: could not load libdistlab.so; build it with `./distlab build`.\n" ..
        table.concat(errs, "\n"), 0)
end

local C, libpath = load_lib()
M.C = C
M.libpath = libpath
if C.dl_abi_version() ~= C.DL_ABI_VERSION then
  error(string.format("distlab: %s has ABI %d but the header says %d; rebuild with `./distlab build`",
    libpath, C.dl_abi_version(), C.DL_ABI_VERSION), 0)
end

-- ---- errors ------------------------------------------------------------------

-- The stack level of the first function outside the bindings, so that a
-- message points at the user's line however deep inside distlab it arose.
local function user_level()
  for level = 3, 60 do
    local info = debug.getinfo(level, "S")
    if not info then return 2 end
    local src = info.source
    if info.what ~= "C" and not src:find("bindings/distlab/", 1, true) then return level - 1 end
  end
  return 2
end

function M.fail(fmt, ...)
  local msg = select("#", ...) > 0 and string.format(fmt, ...) or fmt
  error(msg, user_level())
end

function M.check(rc)
  if rc < 0 then
    error(ffi.string(C.dl_last_error()), user_level())
  end
  return rc
end

-- For expected failures: nil, message instead of an error.
function M.try(rc)
  if rc < 0 then return nil, ffi.string(C.dl_last_error()) end
  return true
end

-- ---- dtypes ------------------------------------------------------------------

M.dtypes = { f32 = C.DL_F32, f16 = C.DL_F16, bf16 = C.DL_BF16, i32 = C.DL_I32, i64 = C.DL_I64,
  u8 = C.DL_U8, f64 = C.DL_F64 }
local aliases = { float32 = "f32", float = "f32", float16 = "f16", half = "f16", fp16 = "f16",
  bfloat16 = "bf16", int32 = "i32", int = "i32", int64 = "i64", long = "i64", uint8 = "u8",
  float64 = "f64", double = "f64", fp32 = "f32", fp64 = "f64" }
M.dtype_names = {}
for k, v in pairs(M.dtypes) do M.dtype_names[v] = k end

function M.is_dtype(name)
  return type(name) == "string" and (M.dtypes[name] ~= nil or aliases[name] ~= nil)
end

function M.dtype_id(name)
  local id = M.dtypes[name] or M.dtypes[aliases[name] or ""]
  if not id then
    M.fail("unknown dtype %s (expected one of bf16, f16, f32, f64, i32, i64, u8)", tostring(name))
  end
  return id
end

-- ---- devices -----------------------------------------------------------------

local devtype_names = { [C.DL_CPU] = "cpu", [C.DL_CUDA] = "cuda", [C.DL_META] = "meta" }

function M.cuda_count()
  local n, why = ffi.new("int[1]"), ffi.new("const char*[1]")
  C.dl_cuda_device_count(n, why)
  return n[0], ffi.string(why[0])
end

local default_device
function M.default_device()
  if not default_device then
    local env = os.getenv("DISTLAB_DEVICE") or "cpu"
    if env == "cuda" then
      env = "cuda:" .. (os.getenv("DISTLAB_LOCAL_RANK") or os.getenv("LOCAL_RANK") or "0")
    end
    default_device = env
  end
  return default_device
end

function M.set_default_device(d)
  M.parse_device(d)
  default_device = d
end

function M.is_device(s)
  return type(s) == "string" and (s == "cpu" or s == "meta" or s == "cuda" or s:match("^cuda:%d+$") ~= nil)
end

-- "cpu" | "meta" | "cuda" | "cuda:N"  ->  dev_type, dev_index
function M.parse_device(d)
  d = d or M.default_device()
  if d == "cpu" then return C.DL_CPU, 0 end
  if d == "meta" then return C.DL_META, 0 end
  if d == "cuda" then
    local def = M.default_device()
    local i = def:match("^cuda:(%d+)$")
    return C.DL_CUDA, tonumber(i or 0)
  end
  local i = type(d) == "string" and d:match("^cuda:(%d+)$")
  if i then return C.DL_CUDA, tonumber(i) end
  M.fail("unknown device %s (expected cpu, meta, cuda or cuda:N)", tostring(d))
end

function M.device_name(dev_type, dev_index)
  local n = devtype_names[dev_type] or "?"
  if dev_type == C.DL_CUDA then return n .. ":" .. dev_index end
  return n
end

-- ---- the current stream --------------------------------------------------------
-- Every op runs on M.stream (a dl_stream_t* or nil for the device's default
-- stream); distlab.stream changes it, the ops read it.
M.stream = nil
M.stream_obj = nil

return M
