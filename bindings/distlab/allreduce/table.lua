-- distlab.allreduce.table — the dispatch table that algo = "auto" follows:
-- where tables are read from, which entry fits a device and world size, and
-- what it chooses for a size. dl.allreduce.table and dl.allreduce.choose are
-- these functions.
--
-- Tables: DISTLAB_AR_TABLE if set, else the tuned file
-- (~/.cache/distlab/allreduce_tables.lua, what dl.allreduce.tune writes by
-- default), else the tables shipped in distlab/allreduce/tables.lua; an
-- entry matches the GPU name (exactly, else its model, e.g. H200) and the
-- world size, else the shipped generic entry for the world size.
--
-- An entry's rows say what to run for sizes up to `upto` bytes on an
-- ordinary tensor (copied in, or pushed). Its zc_rows, where tune measured
-- them, say the same for an input already in the all-reduce's zero-copy
-- region (ar:buffer, the same offset on every rank), run in place: every
-- algorithm timed on such an input, so the zero-copy two-shots compete with
-- the ones that copy anyway. An entry without zc_rows (the shipped ones
-- but H200 at 2 and 4 ranks) chooses from rows for both.
local ffi = require "ffi"
local core = require "distlab.core"

local C, check, fail = core.C, core.check, core.fail

local T = {}

T.shipped_file = core.root .. "/bindings/distlab/allreduce/tables.lua"

-- Where dl.allreduce.tune writes when given no file.
function T.home_file()
  local home = os.getenv("XDG_CACHE_HOME") or ((os.getenv("HOME") or "/tmp") .. "/.cache")
  return home .. "/distlab/allreduce_tables.lua"
end

-- The entries of a table file, or nil when there is no such file.
function T.read_entries(path)
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
  list[#list + 1] = T.home_file()
  list[#list + 1] = T.shipped_file
  return list
end

local function model(name) return name:match("([AHBL]%d%d%d?)") end

-- The entry for a device name and world size, and the file it came from.
local function find_entry(device_name, world)
  local all = {}
  for _, path in ipairs(sources()) do
    for _, e in ipairs(T.read_entries(path) or {}) do all[#all + 1] = { e = e, path = path } end
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

-- The name entries are matched against: the GPU's, or the device itself.
function T.device_name(comm)
  local i = comm.device:match("^cuda:(%d+)$")
  if i then
    local buf = ffi.new("char[256]")
    check(C.dl_cuda_device_name(tonumber(i), buf, 256))
    return ffi.string(buf)
  end
  return comm.device
end

local tables = {} -- comm name .. device -> {entry, path, device_name}

-- Every rank reads the tables again on its next "auto" (after tune wrote one).
function T.forget() tables = {} end

-- The table "auto" uses for comm: entry (or nil), its file, the device name.
function T.table(comm)
  comm = comm or require("distlab.comm").world()
  local key = comm.name .. "@" .. comm.device .. "#" .. comm.size
  local t = tables[key]
  if not t then
    local name = T.device_name(comm)
    local e, path = find_entry(name, comm.size)
    t = { entry = e, path = path, device_name = name }
    tables[key] = t
  end
  return t.entry, t.path, t.device_name
end

local function has_zc(e) return e ~= nil and type(e.zc_rows) == "table" and #e.zc_rows > 0 end

-- Does the table "auto" uses for comm have rows for zero-copy inputs?
function T.has_zc(comm) return has_zc((T.table(comm))) end

local function pick(rows, nbytes)
  for _, r in ipairs(rows) do
    if not r.upto or nbytes <= r.upto then return r.algo, r.blocks or 0 end
  end
  local r = rows[#rows]
  return r.algo, r.blocks or 0
end

-- What "auto" runs for nbytes on comm: algo, blocks (0: the kernels' own
-- sizing); zc: for an input in the zero-copy region, run in place.
function T.choose(nbytes, comm, zc)
  local e = T.table(comm)
  if zc and has_zc(e) then return pick(e.zc_rows, nbytes) end
  if not e or not e.rows or #e.rows == 0 then
    if nbytes <= 2 ^ 20 then return "one_shot_push", 0 end
    return nbytes <= 16 * 2 ^ 20 and "two_shot" or "nccl", 0
  end
  return pick(e.rows, nbytes)
end

return T
