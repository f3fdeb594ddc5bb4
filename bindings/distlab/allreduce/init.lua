-- distlab.allreduce — sum all-reduce with a choice of algorithm.
--
--   dl.allreduce.run(t, {algo = "auto", comm = world, out = nil, blocks = nil})
--       in place (or into out) on the current stream; returns the result tensor.
--       algo: one of dl.allreduce.algos ("nccl", the communicator's own, and
--       the kernels of kernels/allreduce/: "one_shot", "two_shot_push", ...), or
--       "auto": the dispatch table's choice for this device, world size and size
--       (for an input in ar:buffer's region, in place, the entry's zc_rows when it
--       has them: what was fastest measured on such an input).
--   dl.allreduce.algos   every algorithm's name, in the library's order (kernels/allreduce/algos.h)
--   dl.allreduce.table(comm) -> entry, file, device name   the table "auto" follows
--   dl.allreduce.choose(nbytes, comm, zc) -> algo, blocks   what "auto" would run
--       (zc: for an input in the zero-copy region, run in place)
--   dl.allreduce.tune{sizes = {bytes...}, comm =, file =, algos =, replays =}
--       measures every algorithm (and a few grid sizes) at each size, max over
--       ranks, CUDA graphs of 10 calls; writes the table that "auto" reads.
--   dl.allreduce.get(comm)   the communicator's all-reduce object (made on first use: collective)
--   dl.allreduce.new(comm, {max_bytes = 64 MiB on cuda, 8 MiB on cpu})
--     ar:run(t, opts)  ar:choose(t, out) -> algo, blocks (auto's pick)  ar:buffer(shape, dtype, offset)
--     ar:region_offset(t)  ar:check()  ar:info()  ar:free()
--
-- ar:buffer gives a view of this rank's zero-copy region: an input written
-- there (at the same offset on every rank) is read in place by one_shot (out
-- elsewhere) and two_shot (in place), with no copy into the staging buffer.
--
-- This file: the objects and running them. Where the tables come from and
-- how an entry is chosen: allreduce/table.lua; tuning: allreduce/tune.lua;
-- the shipped tables: allreduce/tables.lua.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"
local T = require "distlab.allreduce.table"
local U = require "distlab.allreduce.tune"

local C, check, fail = core.C, core.check, core.fail

local M = {}
-- The algorithms' names in the library's order (dl_allreduce_algo_name), and
-- each name's number, which dl_allreduce_run takes.
M.algos = {}
local ids = {}
for i = 0, math.huge do
  local name = C.dl_allreduce_algo_name(i)
  if name == nil then break end
  M.algos[i + 1] = ffi.string(name)
  ids[M.algos[i + 1]] = i
end

local AR = {}
AR.__index = AR
AR.__tostring = function(a)
  return string.format("allreduce(%s, rank %d of %d, %d MiB pieces)", a.device, a.rank, a.size,
    a.max_bytes / 2 ^ 20)
end

local owner = setmetatable({}, { __mode = "k" }) -- buffer view -> its all-reduce

local function live(a)
  if a.ptr == nil then fail("use of a freed all-reduce") end
  return a.ptr
end

local info = ffi.new("dl_allreduce_info_t")

function M.new(comm, opts)
  if type(comm) ~= "table" or comm.ptr == nil then fail("allreduce.new: the first argument must be a live communicator") end
  opts = args.options(opts, { "max_bytes" }, "allreduce.new")
  local max_bytes = opts.max_bytes and args.size(opts.max_bytes, "allreduce.new: max_bytes") or 0
  local pp = ffi.new("dl_allreduce_t*[1]")
  check(C.dl_allreduce_new(pp, comm.ptr, max_bytes))
  local a = setmetatable({ ptr = ffi.gc(pp[0], C.dl_allreduce_free), comm = comm, device = comm.device }, AR)
  check(C.dl_allreduce_info(a.ptr, info))
  a.rank, a.size, a.sms = info.rank, info.size, info.sms
  a.max_blocks, a.threads, a.unroll = info.max_blocks, info.threads, info.unroll
  a.max_bytes, a.lamport_bytes = tonumber(info.max_bytes), tonumber(info.lamport_bytes)
  return a
end

function AR:info()
  check(C.dl_allreduce_info(live(self), info))
  return { rank = info.rank, size = info.size, sms = info.sms, max_blocks = info.max_blocks, threads = info.threads,
    unroll = info.unroll, failed = info.failed ~= 0, max_bytes = tonumber(info.max_bytes), calls = tonumber(info.calls),
    lamport_bytes = tonumber(info.lamport_bytes) }
end

function AR:free()
  if self.ptr ~= nil then C.dl_allreduce_free(ffi.gc(self.ptr, nil)) end
  self.ptr = nil
end

function AR:check()
  check(C.dl_allreduce_check(live(self), core.stream))
  return self
end

-- A view of this rank's zero-copy region: shape (number or table), dtype,
-- byte offset (a multiple of 16, default 0).
function AR:buffer(shape, dtype, offset)
  if type(shape) == "number" then shape = { shape } end
  local dims = ffi.new("int64_t[8]")
  for i, v in ipairs(shape) do dims[i - 1] = v end
  local pp = ffi.new("dl_tensor_t*[1]")
  check(C.dl_allreduce_buffer(live(self), pp, offset or 0, core.dtype_id(dtype or "f32"), #shape, dims))
  local t = ffi.gc(pp[0], C.dl_tensor_free)
  owner[t] = self
  return t
end

local region_off = ffi.new("int64_t[1]")

-- The byte offset of t in this rank's zero-copy region (all of it there, at a
-- multiple of 16: the kernels read it in place), or nil.
function AR:region_offset(t)
  if not tensor.is_tensor(t) then fail("allreduce.region_offset: expected a tensor, got %s", type(t)) end
  check(C.dl_allreduce_region_offset(live(self), t, region_off))
  local off = tonumber(region_off[0])
  return off >= 0 and off or nil
end

-- ---- running ------------------------------------------------------------------------

local function tensor_bytes(t) return tonumber(C.dl_tensor_numel(t)) * C.dl_dtype_size(t.dtype_id) end

-- What algo = "auto" runs for t (into out, default t): algo, blocks. An
-- input in our region, in place, follows the table's zero-copy rows when it
-- has them (asking where t lies costs a C call, and a table without them
-- chooses as before). A zc input on one rank but not another stays the
-- mismatch it was: another algorithm, or zero copy against copy-in, which
-- the kernels' call check (and debug mode's) refuses.
function AR:choose(t, out)
  out = out or t
  local zc = T.has_zc(self.comm) and (out == t or out:data_ptr() == t:data_ptr()) and
    self:region_offset(t) ~= nil
  return M.choose(tensor_bytes(t), self.comm, zc)
end

local RUN_KEYS = { "algo", "blocks", "out", "comm" }
function AR:run(t, opts)
  if not tensor.is_tensor(t) then fail("allreduce.run: the first argument must be a tensor, got %s", type(t)) end
  opts = args.options(opts, RUN_KEYS, "allreduce.run")
  if opts.out ~= nil and not tensor.is_tensor(opts.out) then
    fail("allreduce.run: out must be a tensor, got %s", type(opts.out))
  end
  local algo = opts.algo or "auto"
  local blocks = opts.blocks ~= nil and args.int32(opts.blocks, "allreduce.run: blocks", 0) or 0
  local out = opts.out or t
  if algo == "auto" then
    local b
    algo, b = self:choose(t, out)
    if opts.blocks == nil then blocks = b end
  end
  local id = ids[algo]
  if not id then fail("unknown all-reduce algorithm %q (auto, %s)", tostring(algo), table.concat(M.algos, ", ")) end
  check(C.dl_allreduce_run(live(self), out, t, id, blocks, core.stream))
  return out
end

local by_comm = setmetatable({}, { __mode = "k" })

-- The all-reduce object of comm (made with opts on first use; collective).
function M.get(comm, opts)
  comm = comm or require("distlab.comm").world()
  local a = by_comm[comm]
  if not a or a.ptr == nil then
    a = M.new(comm, opts)
    by_comm[comm] = a
  end
  return a
end

function M.run(t, opts)
  if not tensor.is_tensor(t) then fail("allreduce.run: the first argument must be a tensor, got %s", type(t)) end
  opts = args.options(opts, RUN_KEYS, "allreduce.run")
  return M.get(opts.comm):run(t, opts)
end

-- ---- the dispatch table and tuning -------------------------------------------------

M.shipped_file, M.table, M.choose = T.shipped_file, T.table, T.choose
M.tune, M.time_call, M.fmt_bytes, M.serialize, M.default_sizes = U.tune, U.time_call, U.fmt_bytes, U.serialize,
  U.default_sizes

M.AR = AR
return M
