-- distlab.symm — symmetric buffers: memory every rank of one host maps.
--
--   local buf = dl.symm.alloc(comm, {1024, 64}, "bf16")   collective
--   buf:peer(r)              tensor view of rank r's buffer (0-based rank)
--   buf:tensor()             this rank's own buffer
--   buf:view(r, offset, shape, dtype)   any view, offset in bytes
--   buf:set_flag(r, f, v)    flag f (0..63) of rank r's signal pad := v
--   buf:wait_flag(f, v)      until this rank's flag f reaches v (counts modulo 2^32)
--   buf:flag(r, f)           read a flag
--   buf:barrier()            all ranks meet; earlier writes are visible after it
--   buf:check()              wait for the stream; report device-side timeouts
--   buf:address(r), buf:pad(r)   raw addresses of r's buffer and pad, for kernels
--
-- Flags are counters: set them to a number that only grows (an iteration
-- count), never back to 0, and back-to-back rounds cannot be confused.
-- Ops take the current stream; on cuda they are kernels on it, so the host
-- does not wait (call buf:check() to see a timeout); on cpu they block.
local ffi = require "ffi"
local core = require "distlab.core"

local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail

local M = {}
local Buf = {}
Buf.__index = Buf

-- view -> buffer: a live view keeps its buffer (and so the mapping) alive.
local owner = setmetatable({}, { __mode = "k" })

local function shape_of(shape, fn)
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" then fail("%s: shape must be a number or a table of sizes", fn) end
  local n = 1
  for i, v in ipairs(shape) do n = n * args.size(v, fn .. ": size in dimension " .. i) end
  return shape, args.size(n, fn .. ": the number of elements")
end

-- a rank of the buffer's communicator, a flag, a flag value: checked
-- before the FFI converts them
local function rank_arg(r, fn) return args.int32(r, fn .. ": rank", 0) end
local function flag_arg(f, fn) return args.int32(f, fn .. ": flag", 0) end
local function value_arg(v, fn) return args.int(v, fn .. ": value", 0, 2 ^ 32 - 1) end

function M.alloc(comm, shape, dtype)
  if type(comm) ~= "table" or comm.ptr == nil then fail("symm.alloc: the first argument must be a live communicator") end
  local n
  shape, n = shape_of(shape, "symm.alloc")
  dtype = dtype or "f32"
  local id = core.dtype_id(dtype)
  local pp = ffi.new("dl_symm_t*[1]")
  -- every rank's dtype and shape are compared too, not only the bytes
  local desc = string.format("%s[%s]", core.dtype_names[id], table.concat(shape, ", "))
  check(C.dl_symm_alloc_desc(pp, comm.ptr, n * C.dl_dtype_size(id), desc))
  return setmetatable({
    ptr = ffi.gc(pp[0], C.dl_symm_free),
    comm = comm,
    rank = comm.rank,
    size = comm.size,
    shape = shape,
    dtype = core.dtype_names[id],
    nbytes = n * C.dl_dtype_size(id),
  }, Buf)
end

Buf.__tostring = function(b)
  return string.format("symm(%s, [%s], %s, rank %d of %d)", b.comm.device, table.concat(b.shape, ", "), b.dtype,
    b.rank, b.size)
end

local function live(b)
  if b.ptr == nil then fail("use of a freed symmetric buffer") end
  return b.ptr
end

function Buf:view(r, offset, shape, dtype)
  local id = core.dtype_id(dtype or self.dtype)
  shape = shape_of(shape or self.shape, "symm view")
  if #shape > 8 then fail("symm view: a tensor has at most 8 dimensions, got %d", #shape) end
  local dims = ffi.new("int64_t[8]")
  for i, v in ipairs(shape) do dims[i - 1] = v end
  local pp = ffi.new("dl_tensor_t*[1]")
  check(C.dl_symm_tensor(pp, live(self), rank_arg(r, "symm view"),
    args.size(offset or 0, "symm view: offset"), id, #shape, dims))
  local t = ffi.gc(pp[0], C.dl_tensor_free)
  owner[t] = self
  return t
end

function Buf:peer(r) return self:view(r) end
function Buf:tensor() return self:view(self.rank) end

function Buf:address(r)
  local p = ffi.new("void*[1]")
  check(C.dl_symm_peer_ptr(live(self), rank_arg(r or self.rank, "address"), p))
  return p[0]
end

function Buf:pad(r)
  local p = ffi.new("void*[1]")
  check(C.dl_symm_signal_pad(live(self), rank_arg(r or self.rank, "pad"), p))
  return p[0]
end

function Buf:set_flag(r, flag, value)
  check(C.dl_symm_flag_set(live(self), rank_arg(r, "set_flag"), flag_arg(flag, "set_flag"),
    value_arg(value, "set_flag"), core.stream))
end
function Buf:wait_flag(flag, value)
  check(C.dl_symm_flag_wait(live(self), flag_arg(flag, "wait_flag"), value_arg(value, "wait_flag"), core.stream))
end

function Buf:flag(r, flag)
  local v = ffi.new("uint32_t[1]")
  check(C.dl_symm_flag_get(live(self), rank_arg(r, "flag"), flag_arg(flag, "flag"), v))
  return tonumber(v[0])
end

function Buf:barrier() check(C.dl_symm_barrier(live(self), core.stream)) end
function Buf:check() check(C.dl_symm_check(live(self), core.stream)) end

function Buf:free()
  if self.ptr ~= nil then
    C.dl_symm_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
  end
end

M.Buf = Buf
return M
