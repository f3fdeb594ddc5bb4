-- distlab multi-rank REPL: `./distlab repl -n 2 [--device D]`.
--
-- Every rank runs this script. Rank 0 reads a chunk (continuing lines until
-- it compiles), hands it to every rank through the job's store, and every
-- rank runs it with print and io.write captured; rank 0 then shows each
-- rank's output: once, unprefixed, when all ranks printed the same, else
-- line by line as "[r] ...". An error on any rank is shown the same way and
-- the session goes on. Globals: dl, pp, rank, nranks, and world (the world
-- communicator, made on first use). :quit or Ctrl-D ends every rank.
package.path = (os.getenv("DISTLAB_ROOT") or ".") .. "/bindings/?.lua;" .. package.path
local ffi = require "ffi"
local dl = require "distlab"
local pretty = require "distlab.pretty"

local C = dl.C
local env = dl.comm.env()
local store = dl.comm.store()
local rank, nranks = env.rank, env.world_size

_G.dl, _G.pp, _G.rank, _G.nranks = dl, pretty.print, rank, nranks
setmetatable(_G, { __index = function(_, k) if k == "world" then return dl.comm.world() end end })

local QUIT = "\0quit"

-- Store get that waits as long as it takes (the REPL may idle for hours).
local len = ffi.new("int64_t[1]")
local function get(key, patient)
  while true do
    local rc = C.dl_store_get(store.ptr, key, nil, 0, len)
    if rc == 0 then
      local buf = ffi.new("char[?]", math.max(1, tonumber(len[0])))
      dl.check(C.dl_store_get(store.ptr, key, buf, len[0], len))
      return ffi.string(buf, len[0])
    end
    if rc ~= C.DL_ETIMEOUT or not patient then return nil, ffi.string(C.dl_last_error()) end
  end
end

-- Compile src as an expression if it is one, else as statements.
local function compile(src)
  local fn = loadstring("return (" .. src .. ")", "=stdin") or loadstring("return " .. src, "=stdin")
  if fn then return fn end
  return loadstring(src, "=stdin")
end

-- Run a chunk with output captured; returns the text.
local function run_captured(src)
  local out = {}
  local saved_print, saved_write = print, io.write
  _G.print = function(...)
    local parts = {}
    for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
    out[#out + 1] = table.concat(parts, "\t") .. "\n"
  end
  io.write = function(...)
    for i = 1, select("#", ...) do out[#out + 1] = tostring((select(i, ...))) end
  end
  local fn, err = compile(src)
  local res = fn and { pcall(fn) } or { false, err }
  _G.print, io.write = saved_print, saved_write
  if not res[1] then
    out[#out + 1] = "error: " .. tostring(res[2]) .. "\n"
  elseif table.maxn(res) > 1 then
    local vals = {}
    for i = 2, table.maxn(res) do vals[#vals + 1] = pretty.format(res[i]) end
    out[#out + 1] = table.concat(vals, "\t") .. "\n"
  end
  return table.concat(out)
end

local function show(outs)
  local same = true
  for r = 1, nranks - 1 do same = same and outs[r] == outs[0] end
  if same then
    io.write(outs[0])
    return
  end
  for r = 0, nranks - 1 do
    for line in outs[r]:gmatch("[^\n]*\n?") do
      if line ~= "" then io.write(string.format("[%d] %s", r, line:sub(-1) == "\n" and line or line .. "\n")) end
    end
  end
end

local function read_chunk()
  local src = nil
  while true do
    io.write(src and ">> " or string.format("dl[%d]> ", nranks))
    io.flush()
    local line = io.read("*l")
    if line == nil then return nil end
    if not src and line:match("^%s*:quit%s*$") then return nil end
    src = src and (src .. "\n" .. line) or line
    local _, err = compile(src)
    if not (err and err:match("<eof>")) then return src end
  end
end

if rank == 0 then
  print(string.format("distlab REPL on %d ranks (%s); rank, nranks, world and dl are set. :quit to leave.",
    nranks, env.device))
end
local n = 0
while true do
  n = n + 1
  local key = "repl/" .. n
  local src
  if rank == 0 then
    src = read_chunk()
    store:set(key, src or QUIT)
    if not src then io.write("\n") end
  else
    src = get(key, true)
  end
  if src == nil or src == QUIT then
    -- rank 0 serves the store: it leaves last, once everyone has read QUIT
    if rank ~= 0 then store:set(key .. "/bye/" .. rank, "") end
    for r = 1, rank == 0 and nranks - 1 or 0 do get(key .. "/bye/" .. r, false) end
    break
  end
  store:set(key .. "/out/" .. rank, run_captured(src))
  if rank == 0 then
    local outs = {}
    for r = 0, nranks - 1 do
      outs[r] = get(key .. "/out/" .. r, false) or string.format("(no answer within the store timeout)\n")
    end
    show(outs)
  end
end
