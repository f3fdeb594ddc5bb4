-- distlab multi-rank REPL: `./distlab repl -n 2 [--device D]`.
--
-- Every rank runs this script, each with its own session (repl/session.lua:
-- globals, `_`, `?x`, the :commands). Rank 0 reads an input (continuing
-- lines until it compiles; Tab completes from rank 0's objects) and hands it
-- through the job's store, with the ranks it is for, to every rank; those
-- ranks run it with print and io.write captured, and rank 0 shows what each
-- printed: once, unprefixed, where every rank printed the same, else
-- "[r] ..." per group of ranks that printed the same (only the lines that
-- differ, where most lines are alike). A rank whose input
-- fails shows its error; the others keep their state. The world
-- communicator (`world`) is made at the start, on every rank.
--
-- Rank 0 only: :quit (or Ctrl-D) ends every rank; :ranks 1,3 (or 0-2, all)
-- picks the ranks of the inputs that follow; :on 1 <code> runs one input
-- there. :reset (dl.comm.world{new = true}) always runs on every rank.
--
-- Ctrl-C reaches every rank (the launcher ignores it). A rank running Lua
-- stops at once (the session's hook); a rank inside C (a collective whose
-- peers never come) does not. A second Ctrl-C while an input still runs
-- aborts the world communicator on every idle rank, so that such waits end
-- with an error (:reset then makes a new world); a third ends the session.
--
-- Keys: repl/<n> holds input n ("<ranks>\n<code>", ranks "*" for all, or
-- "quit"); repl/<n>/out/<r> rank r's output. Rank 0 deletes them once it has
-- shown the outputs: a rank that still finds repl/<n> knows input n runs.
package.path = (os.getenv("DISTLAB_ROOT") or ".") .. "/bindings/?.lua;" .. package.path
local ffi = require "ffi"
local dl = require "distlab"
local session = require "distlab.repl.session"
local line = require "distlab.repl.line"

ffi.cdef "int usleep(unsigned int us);"
local C = dl.C
local env = dl.comm.env()
local store = dl.comm.store()
local rank, nranks = env.rank, env.world_size
local S = session.new { rank = rank, nranks = nranks }
local QUIT, SKIPPED = "quit", "\0skipped"
local HINT_AFTER = 1 -- s: a Ctrl-C that has not stopped every rank by then gets a hint

local function sleep_ms(ms) ffi.C.usleep(ms * 1000) end

local made, world_or_err = pcall(dl.comm.world)
if made then S.world = world_or_err end

-- ---- ranks ------------------------------------------------------------------

-- "1,3", "0-2" or "all" -> {[r] = true, ...} (nil: all ranks), or nil, why
local function parse_ranks(text)
  if text == "all" or text == "*" then return nil end
  local set, any = {}, false
  for item in text:gmatch("[^,%s]+") do
    local a, b = item:match("^(%d+)%-(%d+)$")
    a, b = tonumber(a or item:match("^%d+$")), tonumber(b or a or item:match("^%d+$"))
    if not a or a > b or b >= nranks then
      return nil, string.format("'%s' is not a rank or range of 0..%d (:ranks 1,3  :ranks 0-2  :ranks all)", item, nranks - 1)
    end
    for r = a, b do set[r] = true end
    any = true
  end
  if not any then return nil, "no ranks given (:ranks 1,3  :ranks 0-2  :ranks all)" end
  return set
end

local function ranks_text(set)
  if not set then return "*" end
  local l = {}
  for r = 0, nranks - 1 do if set[r] then l[#l + 1] = r end end
  return table.concat(l, ",")
end

local function decode(msg)
  local who, src = msg:match("^([^\n]*)\n(.*)$")
  if who == "*" then return nil, src end
  local set = {}
  for r in who:gmatch("%d+") do set[tonumber(r)] = true end
  return set, src
end

-- ---- running an input, output captured ---------------------------------------

local function run_captured(src)
  local out = {}
  local saved_print, saved_write = print, io.write
  -- a print (a result's too) after io.write's text without a newline starts a line of its own
  local function fresh_line() if #out > 0 and out[#out]:sub(-1) ~= "\n" then out[#out + 1] = "\n" end end
  _G.print = function(...)
    local parts = {}
    for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
    fresh_line()
    out[#out + 1] = table.concat(parts, "\t") .. "\n"
  end
  io.write = function(...)
    for i = 1, select("#", ...) do out[#out + 1] = tostring((select(i, ...))) end
    return io.stdout
  end
  local ok, err = pcall(S.execute, S, src)
  _G.print, io.write = saved_print, saved_write
  if not ok then
    fresh_line()
    out[#out + 1] = "error: " .. tostring(err) .. "\n"
  end
  fresh_line() -- the prompt starts a line of its own too
  return table.concat(out)
end

-- Ctrl-C while an input runs on other ranks and this one waits (see the
-- header); busy() names those ranks.
local function waiting_interrupts()
  local count, first, hinted, aborted = 0, nil, false, false
  return function(busy)
    count = count + C.dl_sigint_take()
    if count == 0 then return end
    first = first or os.time()
    local busy_ranks = busy()
    if count >= 3 then
      io.stderr:write(string.format("distlab repl: rank %d: a third Ctrl-C: ending the session\n", rank))
      os.exit(130)
    end
    if count >= 2 and not aborted and S.world and S.world.ptr ~= nil then
      aborted = true
      pcall(S.world.abort, S.world, string.format("Ctrl-C in the REPL while rank(s) %s still ran an input", busy_ranks))
      if rank == 0 then
        print(string.format("(the world communicator '%s' is aborted, so waits in it end; :reset makes a new one)",
          S.world.name))
      end
    end
    if rank == 0 and not hinted and os.time() - first >= HINT_AFTER then
      hinted = true
      print(string.format("(rank(s) %s still running, inside C (a collective waiting for its peers?): " ..
        "Ctrl-C again aborts the world communicator, a third time ends the session)", busy_ranks))
    end
  end
end

-- ---- rank 0: reading, handing out, showing --------------------------------------

local function prompt(set)
  if not set then return string.format("dl[%d]> ", nranks) end
  return string.format("dl[%s of %d]> ", ranks_text(set), nranks)
end

-- The next input and the ranks it is for; nil at :quit or the end of input.
local function read_input(ed, state)
  local src, on
  while true do
    local l = ed:read(src and ">> " or prompt(state.ranks))
    if l == nil then return nil end
    if l == false then
      src, on = nil, nil
    else
      if not src then
        local cmd, arg = l:match("^%s*:(%a+)%s*(.-)%s*$")
        if cmd == "quit" or cmd == "q" or cmd == "exit" then return nil end
        if cmd == "ranks" then
          if arg ~= "" then
            local set, err = parse_ranks(arg)
            if err then print(err) else state.ranks = set end
          end
          print("inputs run on rank(s) " .. (state.ranks and ranks_text(state.ranks) or "0-" .. nranks - 1))
          l = nil
        elseif cmd == "on" then
          local list, code = arg:match("^(%S+)%s*(.*)$")
          local set, err = parse_ranks(list or "")
          if err or code == "" then
            print(err or ":on needs ranks and code: :on 1 x = 2")
            l = nil
          else
            on, l = set, code
          end
        end
      end
      if l then
        src = src and (src .. "\n" .. l) or l
        if not session.incomplete(src) then
          if src:match("^%s*:reset") then return src, nil end -- collective: every rank
          if on ~= nil then return src, on end
          return src, state.ranks
        end
      end
    end
  end
end

local function lines_of(o)
  local ls = {}
  for l in o:gmatch("([^\n]*)\n") do ls[#ls + 1] = l end
  return ls
end

-- Every rank printed as many lines, most of them alike (?world: its rank
-- differs): the lines alike once, bare, each other line per group of ranks
-- ("[0] rank = 0"), in order. Else nil.
local function merged_lines(outs)
  local per, n = {}, nil
  for r = 0, nranks - 1 do
    if outs[r] == nil then return nil end
    per[r] = lines_of(outs[r])
    if n and #per[r] ~= n then return nil end
    n = #per[r]
  end
  local res, differ = {}, 0
  for i = 1, n do
    local groups, order = {}, {}
    for r = 0, nranks - 1 do
      local l = per[r][i]
      if not groups[l] then
        groups[l] = {}
        order[#order + 1] = l
      end
      table.insert(groups[l], r)
    end
    if #order == 1 then
      res[#res + 1] = order[1] .. "\n"
    else
      differ = differ + 1
      for _, l in ipairs(order) do res[#res + 1] = "[" .. table.concat(groups[l], ",") .. "] " .. l .. "\n" end
    end
  end
  if differ * 2 > n then return nil end
  return table.concat(res)
end

-- Ranks that printed the same text share one "[0,2] " prefix; all ranks
-- printing the same print it bare; where every rank printed mostly the same
-- lines, only the lines that differ carry ranks (merged_lines).
local function show(outs, set)
  local groups, order = {}, {}
  for r = 0, nranks - 1 do
    local o = outs[r]
    if o ~= nil then
      if not groups[o] then
        groups[o] = {}
        order[#order + 1] = o
      end
      table.insert(groups[o], r)
    end
  end
  if #order == 1 and not set then
    io.write(order[1])
    return
  end
  local merged = not set and #order > 1 and merged_lines(outs)
  if merged then
    io.write(merged)
    io.flush()
    return
  end
  for _, o in ipairs(order) do
    local prefix = "[" .. table.concat(groups[o], ",") .. "] "
    for l in o:gmatch("[^\n]*\n?") do
      if l ~= "" then io.write(prefix, l:sub(-1) == "\n" and l or l .. "\n") end
    end
  end
  io.flush()
end

local function key_exists(key)
  local ok, there = pcall(store.check, store, key)
  return ok and there
end

local function collect(n, set)
  local outs, left = {}, {}
  for r = 0, nranks - 1 do left[r] = true end
  local interrupts = waiting_interrupts()
  while next(left) do
    local busy = {}
    for r in pairs(left) do busy[#busy + 1] = r end
    table.sort(busy)
    busy = table.concat(busy, ",")
    for r in pairs(left) do
      local key = "repl/" .. n .. "/out/" .. r
      if key_exists(key) then
        local o = store:get(key)
        if o ~= SKIPPED then outs[r] = o end
        left[r] = nil
      end
    end
    -- also after the last output came: a second Ctrl-C that ended the input
    -- itself (a store wait it stopped) reached this rank at the same moment,
    -- so it is pending here by the time that rank's output is in the store
    interrupts(function() return busy end)
    if next(left) then sleep_ms(20) end
  end
  show(outs, set)
  for r = 0, nranks - 1 do store:delete("repl/" .. n .. "/out/" .. r) end
  store:delete("repl/" .. n)
end

local function serve()
  local ed = line.editor {
    history = (os.getenv("HOME") or "/tmp") .. "/.distlab_history",
    complete = function(word) return S:complete(word) end,
    prompt_piped = true,
  }
  print(string.format("distlab REPL on %d ranks (%s); rank, nranks, world and dl are set. :help for help, :quit to leave.",
    nranks, env.device))
  if not made then print("no world communicator yet (`world` tries again): " .. tostring(world_or_err)) end
  local state = {}
  local n = 0
  while true do
    n = n + 1
    local src, set = read_input(ed, state)
    if not src then
      io.write("\n")
      store:set("repl/" .. n, QUIT)
      -- rank 0 serves the store: it leaves last, once everyone has read QUIT
      for r = 1, nranks - 1 do store:wait("repl/" .. n .. "/bye/" .. r) end
      return
    end
    store:set("repl/" .. n, ranks_text(set) .. "\n" .. src)
    store:set("repl/" .. n .. "/out/0", (not set or set[0]) and run_captured(src) or SKIPPED)
    collect(n, set)
  end
end

-- ---- ranks 1..N-1 ---------------------------------------------------------------

local function follow()
  local n = 0
  while true do
    n = n + 1
    local key = "repl/" .. n
    local interrupts = waiting_interrupts()
    local running, seen = false, nil
    local function busy() -- the ranks input n-1 still runs on (or ran on, last seen)
      if not running then return seen or "?" end
      local l = {}
      for r = 0, nranks - 1 do
        if not key_exists("repl/" .. (n - 1) .. "/out/" .. r) then l[#l + 1] = r end
      end
      seen = table.concat(l, ",")
      return seen
    end
    while not key_exists(key) do
      -- input n-1 still runs somewhere while its key is there; the first look
      -- after it went counts too: a second Ctrl-C that ended the input itself
      -- (a store wait it stopped) is pending here by the time rank 0 has
      -- shown the outputs and deleted the key
      local was = running
      running = n > 1 and key_exists("repl/" .. (n - 1))
      if running or was then interrupts(busy) else C.dl_sigint_take() end
      sleep_ms(50)
    end
    local msg = store:get(key)
    if msg == QUIT then
      store:set(key .. "/bye/" .. rank, "")
      return
    end
    local set, src = decode(msg)
    store:set(key .. "/out/" .. rank, (not set or set[rank]) and run_captured(src) or SKIPPED)
  end
end

dl.check(C.dl_sigint_arm(1))
if rank == 0 then serve() else follow() end
