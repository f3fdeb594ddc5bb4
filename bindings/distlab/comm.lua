-- distlab.comm — communicators: `local world = dl.comm.world()`.
--
--   world.rank, world.size, world.backend ("shm" | "nccl" | "meta"), world.device
--   world:all_reduce(t, op)               in place; op "sum" (default), "avg", "max", "min"
--   world:all_reduce(t, op, out)          out of place
--   world:all_gather(out, t)              out holds size x t, rank order
--   world:reduce_scatter(out, t, op)      t holds size x out
--   world:all_to_all(out, t)              block j of t goes to rank j
--   world:all_to_allv(out, recv_counts, t, send_counts)   counts per rank, 1-based tables
--   world:broadcast(t, root)  world:send(t, peer)  world:recv(t, peer)
--   dl.comm.group(function() ... end)     point-to-point ops issued together
--   world:barrier()  world:synchronize()  world:split(color, key)  world:free()
--                                         (free: collective on nccl, every rank in one order; a
--                                         comm the collector takes is aborted there, locally)
--   world:agree(what, desc)               every rank made the same object (else an error on every rank)
--   world:info()                          rank, size, backend, seq, timeout, debug, failed,
--                                         name, native (nccl: the ncclComm_t, for calling
--                                         NCCL on it directly; nil on the other backends)
--   dl.comm.world{new = true, ...}        collective: a fresh world after a failed one (a
--                                         timeout, a peer that gave up). The current world
--                                         is aborted (peers still waiting in it return with
--                                         an error) and dropped, its finalizer runs unless
--                                         something still holds it (which then errors on
--                                         use), and once the new world is set up its store
--                                         keys and its splits' are deleted. Every rank must
--                                         call it, the same number of times; its new name
--                                         ("w2": numbers may be skipped) is agreed through
--                                         the store even where a rank made more
--                                         communicators than the others.
--                                         Other opts as dl.comm.new. Splits of the old world
--                                         are not aborted: split the new one.
--
-- Ops take the current stream (dl.current_stream()). Ranks are 0-based, as
-- the launchers number them. The world comes from the environment the
-- launcher sets: distlab's own DISTLAB_* variables, else torchrun's, Slurm's
-- or Open MPI's; ranks meet through the store on MASTER_ADDR:MASTER_PORT.
local ffi = require "ffi"
local core = require "distlab.core"
local tensor = require "distlab.tensor"
local args = require "distlab.args"

local C, check, fail = core.C, core.check, core.fail

local M = {}
local Comm = {}
Comm.__index = Comm

local backend_names = { [C.DL_COMM_SHM] = "shm", [C.DL_COMM_NCCL] = "nccl", [C.DL_COMM_META] = "meta",
  [C.DL_COMM_IPC] = "ipc" }
local backend_ids = { shm = C.DL_COMM_SHM, nccl = C.DL_COMM_NCCL, meta = C.DL_COMM_META, ipc = C.DL_COMM_IPC }
local reds = { sum = C.DL_RED_SUM, avg = C.DL_RED_AVG, max = C.DL_RED_MAX, min = C.DL_RED_MIN }

-- ---- the environment ----------------------------------------------------------

local function first_env(...)
  for i = 1, select("#", ...) do
    local v = os.getenv((select(i, ...)))
    if v and v ~= "" then return v end
  end
end

local function int_env(dflt, ...)
  local v = first_env(...)
  if v == nil then return dflt end
  local n = tonumber(v)
  if not n or n ~= math.floor(n) then fail("%s=%q is not an integer", table.concat({ ... }, "/"), v) end
  return n
end

-- What this process is in the job: rank, world_size, local_rank,
-- local_world_size, device ("cpu" | "meta" | "cuda"), job, master_addr, master_port.
function M.env()
  local e = {}
  e.rank = int_env(0, "DISTLAB_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
  e.world_size = int_env(1, "DISTLAB_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
  e.local_rank = int_env(e.rank, "DISTLAB_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK")
  e.local_world_size = int_env(e.world_size, "DISTLAB_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE")
  e.device = (first_env("DISTLAB_DEVICE") or "cpu"):match("^(%a+)")
  local slurm = os.getenv("SLURM_JOB_ID") and (os.getenv("SLURM_JOB_ID") .. "." .. (os.getenv("SLURM_STEP_ID") or "0"))
  e.job = first_env("DISTLAB_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid") or slurm or "job"
  e.master_addr = first_env("MASTER_ADDR") or "127.0.0.1"
  e.master_port = int_env(e.world_size == 1 and 0 or 29500, "MASTER_PORT")
  if e.world_size < 1 or e.rank < 0 or e.rank >= e.world_size then
    fail("rank %d is not in a world of size %d (check the launcher's variables)", e.rank, e.world_size)
  end
  return e
end

-- ---- the store ----------------------------------------------------------------

local Store = {}
Store.__index = Store

-- The job's store (made once): rank 0 serves it, everyone connects.
local the_store
function M.store(opts)
  if the_store then return the_store end
  local e = M.env()
  local pp = ffi.new("dl_store_t*[1]")
  check(C.dl_store_new(pp, e.master_addr, e.master_port, e.rank, e.world_size, e.job,
    opts and opts.timeout or 0))
  the_store = setmetatable({ ptr = ffi.gc(pp[0], C.dl_store_free) }, Store)
  return the_store
end

function Store:set(key, value)
  check(C.dl_store_set(self.ptr, key, value, #value))
end

-- Waits until key is set; returns its value as a string.
function Store:get(key)
  local len = ffi.new("int64_t[1]")
  check(C.dl_store_get(self.ptr, key, nil, 0, len))
  local buf = ffi.new("char[?]", math.max(1, tonumber(len[0])))
  check(C.dl_store_get(self.ptr, key, buf, len[0], len))
  return ffi.string(buf, len[0])
end

function Store:add(key, delta)
  local v = ffi.new("int64_t[1]")
  check(C.dl_store_add(self.ptr, key, delta or 1, v))
  return tonumber(v[0])
end

function Store:wait(key) check(C.dl_store_wait(self.ptr, key)) end
function Store:delete(key) check(C.dl_store_delete(self.ptr, key)) end
function Store:set_timeout(s) check(C.dl_store_set_timeout(self.ptr, s)) end
function Store:check(key)
  local e = ffi.new("int[1]")
  check(C.dl_store_check(self.ptr, key, e))
  return e[0] ~= 0
end

-- ---- communicators ------------------------------------------------------------

local info = ffi.new("dl_comm_info_t")

local function wrap(ptr, store)
  check(C.dl_comm_info(ptr, info))
  return setmetatable({
    ptr = ffi.gc(ptr, C.dl_comm_drop), -- collected: local (dl_comm_drop); :free() is collective
    rank = info.rank,
    size = info.size,
    backend = backend_names[info.backend],
    device = core.device_name(info.dev_type, info.dev_index),
    name = ffi.string(info.name),
    share = info.share,
    store = store,
  }, Comm)
end

Comm.__tostring = function(c)
  return string.format("comm '%s' (%s, rank %d of %d, %s)", c.name, c.backend, c.rank, c.size, c.device)
end

-- The backend of a cuda job: NCCL, unless ranks share a GPU (NCCL refuses
-- two ranks on one device): then the ipc backend (CUDA IPC, a correctness
-- mode). Every rank publishes which GPU it uses, once per process.
local gpu_backend
local function cuda_backend(e, store, dev_index)
  if gpu_backend then return gpu_backend end
  local buf = ffi.new("char[256]")
  check(C.dl_cuda_device_id(dev_index, buf, 256))
  local mine = ffi.string(buf)
  store:set("distlab/gpu/" .. e.rank, mine)
  local seen, shared = {}, false
  for r = 0, e.world_size - 1 do
    local id = store:get("distlab/gpu/" .. r)
    shared = shared or seen[id] ~= nil
    seen[id] = true
  end
  gpu_backend = shared and "ipc" or "nccl"
  return gpu_backend
end

-- A new communicator over the job. opts: backend ("shm" | "nccl" | "ipc" |
-- "meta"; by default DISTLAB_COMM_BACKEND, else from the device: on cuda
-- nccl, or ipc where ranks share a GPU), timeout (s), debug, and for meta
-- rank/size.
local NEW_KEYS = { "backend", "timeout", "debug", "rank", "size", "device", "new" }
local take_world_number
-- A rank that cannot make the communicator its peers are making tells them
-- (a failure key in the store, comm_internal.h), so that their waits end at
-- once naming it instead of at the timeout; then fails.
local function give_up(e, opts, fmt, ...)
  local msg = string.format(fmt, ...)
  if e.world_size > 1 then
    pcall(function()
      local store = M.store(opts)
      local n = take_world_number(store) -- the name dl_comm_new would have given it
      local name = n == 0 and "w" or "w" .. n
      local why = string.format("rank %d gave up creating communicator '%s': %s", e.rank, name, msg)
      for _, prefix in ipairs { name .. "/", "distlab/gpu/" } do store:set(prefix .. "!failed", why) end
    end)
  end
  fail("%s", msg)
end

function M.new(opts)
  opts = args.options(opts, NEW_KEYS, "comm.new")
  if opts.timeout ~= nil and (type(opts.timeout) ~= "number" or not (opts.timeout >= 0)) then
    fail("comm.new: timeout must be a number of seconds >= 0, got %s", tostring(opts.timeout))
  end
  local e = M.env()
  local backend = opts.backend or os.getenv("DISTLAB_COMM_BACKEND")
  if backend == "" then backend = nil end
  backend = backend or (e.device == "cuda" and "cuda" or e.device == "meta" and "meta" or "shm")
  if backend ~= "cuda" and not backend_ids[backend] then
    fail("unknown backend %q (expected shm, nccl, ipc or meta)", tostring(backend))
  end
  local rank = args.int32(opts.rank or e.rank, "comm.new: rank", 0)
  local size = args.int32(opts.size or e.world_size, "comm.new: size", 1)
  local dev_index = 0
  if backend == "nccl" or backend == "ipc" or backend == "cuda" then
    local d = opts.device or core.default_device()
    if not d:match("^cuda") then d = "cuda:" .. e.local_rank end
    dev_index = select(2, core.parse_device(d))
    -- before the rendezvous: a rank without the device tells its peers
    -- through the store (give_up), whose waits end at once naming it
    local n, why = core.cuda_count()
    if dev_index >= n then
      give_up(e, opts, "comm.new: the %s communicator needs cuda:%d, but %s", backend == "cuda" and "GPU" or backend,
        dev_index, n == 0 and why or string.format("this machine has %d GPU(s)", n))
    end
  end
  local store = backend ~= "meta" and M.store(opts) or nil
  if backend == "cuda" then backend = cuda_backend(e, store, dev_index) end
  local pp = ffi.new("dl_comm_t*[1]")
  check(C.dl_comm_new(pp, backend_ids[backend], store and store.ptr or nil, rank, size, dev_index,
    opts.timeout or 0))
  local c = wrap(pp[0], store)
  if opts.debug or os.getenv("DISTLAB_COMM_DEBUG") == "1" then c:set_debug(true) end
  return c
end

local the_world
local renewals = 0 -- world{new = true} calls so far: the same on every rank

-- The number in the name the next dl_comm_new on this store gives ("w" 0,
-- "w3" 3), found by making (and freeing) a meta communicator on the store:
-- no rendezvous, no memory, but it takes the name.
function take_world_number(store)
  local pp = ffi.new("dl_comm_t*[1]")
  check(C.dl_comm_new(pp, C.DL_COMM_META, store.ptr, 0, 1, 0, 0))
  local rc = C.dl_comm_info(pp[0], info)
  C.dl_comm_free(pp[0])
  check(rc)
  return tonumber(ffi.string(info.name):match("%d+$")) or 0
end

-- Every rank agrees on the new world's name. dl_comm_new names worlds by
-- how many this process made ("w", "w1", ...), so a rank that made one more
-- (a REPL line run on one rank) would wait under a name nobody else uses.
-- Each rank says how far it counted; all move to the largest count. Returns
-- the prefix of the keys this exchange left.
local function agree_on_name(store, e)
  renewals = renewals + 1
  local key = "distlab/world/new" .. renewals .. "/"
  local mine = take_world_number(store)
  store:set(key .. e.rank, tostring(mine))
  local top = mine
  for r = 0, e.world_size - 1 do top = math.max(top, tonumber(store:get(key .. r))) end
  while mine < top do mine = take_world_number(store) end
  return key
end

-- world{new = true}: see the header.
local function renew(opts)
  local old = the_world
  the_world = nil
  if old and old.ptr ~= nil then pcall(old.abort, old, "replaced by dl.comm.world{new = true}") end
  local e = M.env()
  local o = {}
  for k, v in pairs(opts) do if k ~= "new" then o[k] = v end end
  local backend = o.backend or os.getenv("DISTLAB_COMM_BACKEND")
  if backend == nil or backend == "" then backend = e.device end
  local store = backend ~= "meta" and M.store(o) or nil -- as M.new finds it
  local exchanged = store and agree_on_name(store, e)
  the_world = M.new(o)
  -- the new world's setup was a rendezvous: every rank is past the old
  -- world and the exchange, so their keys can go (the old world's splits
  -- are "<name>.s<k>c<color>")
  if store and e.rank == 0 then
    for _, prefix in ipairs { exchanged, old and old.name .. "/", old and old.name .. "." } do
      check(C.dl_store_delete_prefix(store.ptr, prefix, nil))
    end
  end
  old = nil
  collectgarbage() -- the old world's finalizer, unless something still holds it
  return the_world
end

-- The job's world communicator (made on first use; later opts are ignored),
-- or with opts.new a fresh one in place of the current.
function M.world(opts)
  args.options(opts, NEW_KEYS, "comm.world")
  if opts and opts.new then return renew(opts) end
  if not the_world or the_world.ptr == nil then the_world = M.new(opts) end
  return the_world
end

-- A meta world of `size` where this process is `rank` (no store, no peers).
function M.meta(size, rank, opts)
  opts = args.options(opts, { "timeout" }, "comm.meta")
  return M.new { backend = "meta", size = size, rank = rank or 0, timeout = opts.timeout }
end

function Comm:free()
  if self.ptr ~= nil then
    C.dl_comm_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
  end
  if the_world == self then the_world = nil end
end

local function live(c)
  if c.ptr == nil then fail("use of a freed communicator") end
  return c.ptr
end

function Comm:info()
  check(C.dl_comm_info(live(self), info))
  return { rank = info.rank, size = info.size, backend = backend_names[info.backend], seq = tonumber(info.seq),
    share = info.share,
    timeout = info.timeout_s, debug = info.debug ~= 0, failed = info.failed ~= 0, name = ffi.string(info.name),
    native = info.native ~= nil and info.native or nil }
end

function Comm:set_timeout(seconds)
  if type(seconds) ~= "number" or not (seconds >= 0) then
    fail("set_timeout: expected a number of seconds >= 0, got %s", tostring(seconds))
  end
  check(C.dl_comm_set_timeout(live(self), seconds))
  return self
end
function Comm:set_debug(on) check(C.dl_comm_set_debug(live(self), on and 1 or 0)) return self end
function Comm:abort(why) check(C.dl_comm_abort(live(self), why or "aborted from Lua")) end
-- Every rank describes an object it makes on this communicator ("key=value,
-- ..."); where two ranks differ, every rank fails naming what differs
-- (collective, through the store: for creation, not per call).
function Comm:agree(what, desc)
  if type(what) ~= "string" or type(desc) ~= "string" then fail("agree: expected two strings (what, desc)") end
  check(C.dl_comm_agree(live(self), what, desc))
end

-- split(color, key): collective; color < 0 (or nil) gives nil.
-- split(function(rank) return color, key end): every rank's color is known
-- locally, so nothing is exchanged; the only way on meta.
function Comm:split(color, key)
  local pp = ffi.new("dl_comm_t*[1]")
  if type(color) == "function" then
    local colors, keys = ffi.new("int32_t[?]", self.size), ffi.new("int32_t[?]", self.size)
    for r = 0, self.size - 1 do
      local cr, kr = color(r)
      colors[r] = args.int32(cr or -1, "split: the color of rank " .. r)
      keys[r] = args.int32(kr or r, "split: the key of rank " .. r)
    end
    check(C.dl_comm_split_table(pp, live(self), colors, keys))
  else
    check(C.dl_comm_split(pp, live(self), args.int32(color or -1, "split: color"),
      args.int32(key or self.rank, "split: key")))
  end
  if pp[0] == nil then return nil end
  return wrap(pp[0], self.store)
end

local function red(op)
  local r = reds[op or "sum"]
  if not r then fail("unknown reduction %q (expected sum, avg, max or min)", tostring(op)) end
  return r
end

local function stream() return core.stream end

-- tensors and ranks checked here, so that a wrong type is a message at the
-- caller's line rather than an FFI conversion error
local function tensor_arg(x, what)
  if not tensor.is_tensor(x) then fail("%s must be a tensor, got %s", what, type(x)) end
  return x
end


function Comm:all_reduce(t, op, out)
  tensor_arg(t, "all_reduce: the tensor")
  out = out or t
  check(C.dl_comm_all_reduce(live(self), tensor_arg(out, "all_reduce: out"), t, red(op), stream()))
  return out
end

function Comm:all_gather(out, t)
  check(C.dl_comm_all_gather(live(self), tensor_arg(out, "all_gather: out"), tensor_arg(t, "all_gather: the input"),
    stream()))
  return out
end

function Comm:reduce_scatter(out, t, op)
  check(C.dl_comm_reduce_scatter(live(self), tensor_arg(out, "reduce_scatter: out"),
    tensor_arg(t, "reduce_scatter: the input"), red(op), stream()))
  return out
end

function Comm:all_to_all(out, t)
  check(C.dl_comm_all_to_all(live(self), tensor_arg(out, "all_to_all: out"), tensor_arg(t, "all_to_all: the input"),
    stream()))
  return out
end

local function counts_arr(c, counts, what)
  if type(counts) ~= "table" or #counts ~= c.size then
    fail("%s must be a table of %d counts (one per rank)", what, c.size)
  end
  local a = ffi.new("int64_t[?]", c.size)
  for i = 1, c.size do a[i - 1] = args.size(counts[i], string.format("%s[%d]", what, i)) end
  return a
end

function Comm:all_to_allv(out, recv_counts, t, send_counts)
  check(C.dl_comm_all_to_allv(live(self), tensor_arg(out, "all_to_allv: out"),
    counts_arr(self, recv_counts, "recv_counts"), tensor_arg(t, "all_to_allv: the input"),
    counts_arr(self, send_counts, "send_counts"), stream()))
  return out
end

function Comm:broadcast(t, root)
  check(C.dl_comm_broadcast(live(self), tensor_arg(t, "broadcast: the tensor"),
    args.int32(root or 0, "broadcast: root"), stream()))
  return t
end

function Comm:send(t, peer)
  check(C.dl_comm_send(live(self), tensor_arg(t, "send: the tensor"), args.int32(peer, "send: peer"), stream()))
end

function Comm:recv(t, peer)
  check(C.dl_comm_recv(live(self), tensor_arg(t, "recv: the tensor"), args.int32(peer, "recv: peer"), stream()))
  return t
end

function Comm:barrier() check(C.dl_comm_barrier(live(self), stream())) end
function Comm:synchronize() check(C.dl_comm_synchronize(live(self), stream())) end

-- Issue the point-to-point ops of fn together (a ring exchange cannot
-- deadlock). fn's errors propagate after the group is closed.
function M.group(fn, ...)
  check(C.dl_comm_group_start())
  local ok, err = pcall(fn, ...)
  local rc = C.dl_comm_group_end()
  if not ok then error(err, 0) end
  check(rc)
end

M.Comm = Comm
return M
