-- distlab.allreduce — sum all-reduce with a choice of algorithm.
--
--   dl.allreduce.run(t, {algo = "auto", comm = world, out = nil, blocks = nil})
--       in place (or into out) on the current stream; returns the result tensor.
--       algo: "nccl" (the communicator's own), "one_shot", "one_shot_push",
--       "two_shot", "two_shot_push", "two_shot_write", "one_shot_lamport", "one_shot_push_flat",
--       "two_shot_lamport" (kernels/allreduce/allreduce.cu),
--       or "auto": the
--       dispatch table's choice for this device, world size and size.
--   dl.allreduce.tune{sizes = {bytes...}, comm =, file =, algos =, replays =}
--       measures every algorithm (and a few grid sizes) at each size, max over
--       ranks, CUDA graphs of 10 calls; writes the table that "auto" reads.
--   dl.allreduce.choose(nbytes, comm) -> algo, blocks   what "auto" would run
--   dl.allreduce.get(comm)   the communicator's all-reduce object (made on first use: collective)
--   dl.allreduce.new(comm, {max_bytes = 64 MiB on cuda, 8 MiB on cpu})
--     ar:run(t, opts)  ar:buffer(shape, dtype, offset)  ar:check()  ar:info()  ar:free()
--
-- ar:buffer gives a view of this rank's zero-copy region: an input written
-- there (at the same offset on every rank) is read in place by one_shot (out
-- elsewhere) and two_shot (in place), with no copy into the staging buffer.
-- Tables: DISTLAB_AR_TABLE if set, else the tuned file
-- (~/.cache/distlab/allreduce_tables.lua, what tune writes by default), else
-- the table shipped in distlab/allreduce/tables.lua; an entry matches the GPU
-- name (exactly, else its model, e.g. H200) and the world size, else the
-- shipped generic entry for the world size.
local ffi = require "ffi"
local core = require "distlab.core"
local graph = require "distlab.graph"

local C, check, fail = core.C, core.check, core.fail

local M = {}
M.algos = { "nccl", "one_shot", "one_shot_push", "two_shot", "two_shot_push", "two_shot_write", "one_shot_lamport",
  "one_shot_push_flat", "two_shot_lamport" }
local ids = { nccl = C.DL_AR_NCCL, one_shot = C.DL_AR_ONE_SHOT, one_shot_push = C.DL_AR_ONE_SHOT_PUSH,
  two_shot = C.DL_AR_TWO_SHOT, two_shot_push = C.DL_AR_TWO_SHOT_PUSH, two_shot_write = C.DL_AR_TWO_SHOT_WRITE,
  one_shot_lamport = C.DL_AR_ONE_SHOT_LAMPORT, one_shot_push_flat = C.DL_AR_ONE_SHOT_PUSH_FLAT,
  two_shot_lamport = C.DL_AR_TWO_SHOT_LAMPORT }

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
  opts = opts or {}
  local pp = ffi.new("dl_allreduce_t*[1]")
  check(C.dl_allreduce_new(pp, comm.ptr, opts.max_bytes or 0))
  local a = setmetatable({ ptr = ffi.gc(pp[0], C.dl_allreduce_free), comm = comm, device = comm.device }, AR)
  check(C.dl_allreduce_info(a.ptr, info))
  a.rank, a.size, a.sms = info.rank, info.size, info.sms
  a.max_blocks, a.threads, a.unroll = info.max_blocks, info.threads, info.unroll
  a.max_bytes = tonumber(info.max_bytes)
  return a
end

function AR:info()
  check(C.dl_allreduce_info(live(self), info))
  return { rank = info.rank, size = info.size, sms = info.sms, max_blocks = info.max_blocks, threads = info.threads,
    unroll = info.unroll, failed = info.failed ~= 0, max_bytes = tonumber(info.max_bytes), calls = tonumber(info.calls) }
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

-- ---- the dispatch table -------------------------------------------------------

local function home_file()
  local home = os.getenv("XDG_CACHE_HOME") or ((os.getenv("HOME") or "/tmp") .. "/.cache")
  return home .. "/distlab/allreduce_tables.lua"
end
M.shipped_file = core.root .. "/bindings/distlab/allreduce/tables.lua"

local function read_entries(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local src = f:read("*a")
  f:close()
  local chunk, err = loadstring(src, "@" .. path)
  if not chunk then fail("all-reduce table %s: %s", path, err) end
  setfenv(chunk, {})
  local ok, t = pcall(chunk)
  if not ok or type(t) ~= "table" then fail("all-reduce table %s: %s", path, ok and "does not return a table" or t) end
  return t
end

local function sources()
  local list = {}
  local env = os.getenv("DISTLAB_AR_TABLE")
  if env and env ~= "" then list[#list + 1] = env end
  list[#list + 1] = home_file()
  list[#list + 1] = M.shipped_file
  return list
end

local function model(name) return name:match("([AHBL]%d%d%d?)") end

-- The entry for a device name and world size, and the file it came from.
local function find_entry(device_name, world)
  local all = {}
  for _, path in ipairs(sources()) do
    for _, e in ipairs(read_entries(path) or {}) do all[#all + 1] = { e = e, path = path } end
  end
  local function first(pred)
    for _, x in ipairs(all) do if pred(x.e) then return x.e, x.path end end
  end
  local m = model(device_name)
  local e, path = first(function(e) return e.device == device_name and e.world == world end)
  if not e and m then e, path = first(function(e) return e.device ~= "*" and model(e.device) == m and e.world == world end) end
  if not e then e, path = first(function(e) return e.device == "*" and e.world == world end) end
  if not e then -- the generic entry of the next larger world size
    local best
    for _, x in ipairs(all) do
      if x.e.device == "*" and x.e.world >= world and (not best or x.e.world < best.e.world) then best = x end
    end
    if best then e, path = best.e, best.path end
  end
  return e, path
end

local function device_name(comm)
  local i = comm.device:match("^cuda:(%d+)$")
  if i then
    local buf = ffi.new("char[256]")
    check(C.dl_cuda_device_name(tonumber(i), buf, 256))
    return ffi.string(buf)
  end
  return comm.device
end

local tables = {} -- comm name .. device -> {entry, path, device_name}

-- The table "auto" uses for comm: entry (or nil), its file, the device name.
function M.table(comm)
  comm = comm or require("distlab.comm").world()
  local key = comm.name .. "@" .. comm.device .. "#" .. comm.size
  local t = tables[key]
  if not t then
    local name = device_name(comm)
    local e, path = find_entry(name, comm.size)
    t = { entry = e, path = path, device_name = name }
    tables[key] = t
  end
  return t.entry, t.path, t.device_name
end

-- What "auto" runs for nbytes on comm: algo, blocks (0: the kernels' own sizing).
function M.choose(nbytes, comm)
  local e = M.table(comm)
  if not e or not e.rows or #e.rows == 0 then
    if nbytes <= 2 ^ 20 then return "one_shot_push", 0 end
    return nbytes <= 16 * 2 ^ 20 and "two_shot" or "nccl", 0
  end
  for _, r in ipairs(e.rows) do
    if not r.upto or nbytes <= r.upto then return r.algo, r.blocks or 0 end
  end
  local r = e.rows[#e.rows]
  return r.algo, r.blocks or 0
end

-- ---- running ------------------------------------------------------------------------

local function tensor_bytes(t) return tonumber(C.dl_tensor_numel(t)) * C.dl_dtype_size(t.dtype_id) end

function AR:run(t, opts)
  opts = opts or {}
  local algo, blocks = opts.algo or "auto", opts.blocks or 0
  if algo == "auto" then
    local b
    algo, b = M.choose(tensor_bytes(t), self.comm)
    if opts.blocks == nil then blocks = b end
  end
  local id = ids[algo]
  if not id then fail("unknown all-reduce algorithm %q (auto, %s)", tostring(algo), table.concat(M.algos, ", ")) end
  local out = opts.out or t
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
  opts = opts or {}
  return M.get(opts.comm):run(t, opts)
end

-- ---- tuning ------------------------------------------------------------------------

-- Default sizes: the sweep's (experiments/allreduce_sweep.lua), 8 KiB .. 1 GiB.
M.default_sizes = {}
for _, kb in ipairs { 8, 16, 32, 64, 128, 256 } do M.default_sizes[#M.default_sizes + 1] = kb * 1024 end
for _, rows in ipairs { 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 3062, 4096 } do
  M.default_sizes[#M.default_sizes + 1] = rows * 8192 * 2
end
for _, mb in ipairs { 128, 256, 512, 1024 } do M.default_sizes[#M.default_sizes + 1] = mb * 2 ^ 20 end

-- Grids worth trying for an algorithm at a size: the kernels' own sizing and
-- a few fixed ones, none with blocks that would get less than 128 vectors
-- (2 KiB; the core spreads the vectors evenly over the blocks, so a block
-- may cover less than one step of its threads).
local function grid_choices(a, algo, nbytes)
  if algo == "nccl" then return { 0 } end
  local vecs = math.ceil(nbytes / 16)
  if algo:match("^two_shot") then vecs = math.ceil(vecs / a.size) end
  local most = math.min(a.max_blocks, math.max(1, math.ceil(vecs / 128)))
  local sms = a.sms > 0 and a.sms or 4
  local tries = nbytes > 16 * 2 ^ 20 and { 2 * sms } or { 8, 16, 32, 64, sms, 2 * sms }
  local out, seen = { 0 }, {}
  for _, g in ipairs(tries) do
    if g <= most and not seen[g] then
      seen[g] = true
      out[#out + 1] = g
    end
  end
  return out
end

-- Median time (us) of one call, max over the ranks of comm.
local function time_call(a, fn, replays)
  local comm = a.comm
  local st = graph.bench(fn, { ops = 10, warmup = 3, replays = replays, before = function() comm:barrier() end })
  a:check()
  local dl = require "distlab"
  local v = dl.full({ 1 }, st.median * 1e3, { dtype = "f64", device = comm.device })
  comm:all_reduce(v, "max")
  return v:item()
end
M.time_call = time_call

-- Does algo (with grid g) sum right at n elements? rank + 1 everywhere, the
-- first, middle and last elements read back; every rank learns if any saw
-- a wrong one, so all leave the same cases out.
local function probe(a, algo, g, n, dtype)
  local dl = require "distlab"
  local comm = a.comm
  local t = dl.full({ n }, comm.rank + 1, { dtype = dtype, device = comm.device })
  a:run(t, { algo = algo, blocks = g })
  a:check()
  local want, bad = comm.size * (comm.size + 1) / 2, 0
  for _, i in ipairs { 1, math.floor((n + 1) / 2), n } do
    if t:narrow(1, i, 1):item() ~= want then bad = 1 end
  end
  local v = dl.full({ 1 }, bad, { dtype = "f64", device = comm.device })
  comm:all_reduce(v, "max")
  t:free()
  return v:item() == 0
end

local function fmt_bytes(b)
  if b >= 2 ^ 30 and b % 2 ^ 30 == 0 then return (b / 2 ^ 30) .. " GiB" end
  if b >= 2 ^ 20 then return string.format("%.4g MiB", b / 2 ^ 20) end
  return string.format("%.4g KiB", b / 1024)
end
M.fmt_bytes = fmt_bytes

local function serialize(entries)
  local out = { "-- all-reduce dispatch tables (distlab.allreduce): one entry per device and world size.",
    "-- rows: the algorithm (and grid, 0 = the kernels' own) for sizes up to `upto` bytes;",
    "-- the last row has no upto and covers everything larger.", "return {" }
  for _, e in ipairs(entries) do
    out[#out + 1] = "  {"
    for _, k in ipairs { "device", "world", "dtype", "date", "source", "provisional" } do
      if e[k] ~= nil then out[#out + 1] = string.format("    %s = %s,", k, type(e[k]) == "string" and string.format("%q", e[k]) or tostring(e[k])) end
    end
    out[#out + 1] = "    rows = {"
    for _, r in ipairs(e.rows) do
      out[#out + 1] = string.format("      { %salgo = %q, blocks = %d%s },", r.upto and ("upto = " .. r.upto .. ", ") or "",
        r.algo, r.blocks or 0, r.us and string.format(", us = %.2f, at = %d", r.us, r.at) or "")
    end
    out[#out + 1] = "    },"
    out[#out + 1] = "  },"
  end
  out[#out + 1] = "}"
  return table.concat(out, "\n") .. "\n"
end
M.serialize = serialize

-- dl.allreduce.tune{sizes = {...}, comm =, file =, algos =, replays = 30, dtype = "bf16", log = print,
--                   rematch = 2}
-- -> entry (rows, and every measurement in entry.measured), file
-- Candidates within 5% of the best at a size are timed `rematch` more times,
-- in turns, each keeping its fastest: one timing's noise does not pick the row.
function M.tune(opts)
  opts = opts or {}
  local dl = require "distlab"
  local comm = opts.comm or dl.comm.world()
  local a = M.get(comm)
  local sizes = opts.sizes or M.default_sizes
  local algos = opts.algos or M.algos
  local dtype = opts.dtype or "bf16"
  local es = C.dl_dtype_size(core.dtype_id(dtype))
  local log = opts.log or (comm.rank == 0 and print or function() end)
  local measured, rows = {}, {}
  table.sort(sizes)
  for _, bytes in ipairs(sizes) do
    local n = math.max(1, math.floor(bytes / es))
    local x = dl.zeros({ n }, { dtype = dtype, device = comm.device })
    local best
    local replays = opts.replays or 30
    replays = math.max(5, math.min(replays, math.floor(replays * 8 * 2 ^ 20 / (n * es))))
    local here = {} -- this size's measurements
    for _, algo in ipairs(algos) do
      for _, g in ipairs(grid_choices(a, algo, n * es)) do
        if not probe(a, algo, g, n, dtype) then
          log(string.format("tune %10s: %s blocks %d gives wrong sums; left out", fmt_bytes(n * es), algo, g))
          goto next
        end
        local us = time_call(a, function() a:run(x, { algo = algo, blocks = g }) end, replays)
        here[#here + 1] = { bytes = n * es, algo = algo, blocks = g, us = us, timings = 1 }
        measured[#measured + 1] = here[#here]
        if not best or us < best.us then best = { algo = algo, blocks = g, us = us, at = n * es } end
        ::next::
      end
    end
    if not best then fail("tune: no algorithm gave right sums at %s", fmt_bytes(n * es)) end
    -- near-ties again, in turns (times are the max over ranks: every rank sees the same list)
    local close = {}
    for _, m in ipairs(here) do if m.us <= best.us * 1.05 then close[#close + 1] = m end end
    if #close > 1 then
      for _ = 1, opts.rematch or 2 do
        for _, m in ipairs(close) do
          local us = time_call(a, function() a:run(x, { algo = m.algo, blocks = m.blocks }) end, replays)
          m.us, m.timings = math.min(m.us, us), m.timings + 1
        end
      end
      best = nil
      for _, m in ipairs(close) do
        if not best or m.us < best.us then best = { algo = m.algo, blocks = m.blocks, us = m.us, at = n * es } end
      end
    end
    log(string.format("tune %10s: %-14s blocks %3d  %9.2f us", fmt_bytes(n * es), best.algo, best.blocks, best.us))
    rows[#rows + 1] = best
    x:free()
  end
  -- each measured size rules up to the geometric middle of it and the next
  for i, r in ipairs(rows) do
    if rows[i + 1] then r.upto = math.floor(math.sqrt(r.at * rows[i + 1].at) / 16) * 16 end
  end
  -- neighbours with the same choice merge
  local merged = {}
  for _, r in ipairs(rows) do
    local last = merged[#merged]
    if last and last.algo == r.algo and last.blocks == r.blocks then
      last.upto = r.upto
    else
      merged[#merged + 1] = r
    end
  end
  local name = device_name(comm)
  local entry = { device = name, world = comm.size, dtype = dtype, date = os.date("!%Y-%m-%d %H:%M UTC"),
    source = "dl.allreduce.tune", rows = merged, measured = measured }
  local file = opts.file or os.getenv("DISTLAB_AR_TABLE") or home_file()
  if comm.rank == 0 then
    local entries = {}
    for _, e in ipairs(read_entries(file) or {}) do
      if not (e.device == name and e.world == comm.size) then entries[#entries + 1] = e end
    end
    table.insert(entries, 1, entry)
    os.execute("mkdir -p '" .. file:match("^(.*)/[^/]*$") .. "'")
    local f = assert(io.open(file .. ".tmp", "w"))
    f:write(serialize(entries))
    f:close()
    assert(os.rename(file .. ".tmp", file))
  end
  comm:barrier()
  tables = {} -- every rank reads the new table on its next "auto"
  return entry, file
end

M.AR = AR
return M
