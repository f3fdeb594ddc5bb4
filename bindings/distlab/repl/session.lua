-- distlab.repl.session — what one rank does with one input of the REPL, the
-- same with one rank (repl.lua) and with several (repl_multi.lua).
--
--   local S = session.new{rank = r, nranks = n}   sets the globals dl, pp, rank, nranks, world
--   session.incomplete(src)   true while src is Lua that needs more lines
--   S:execute(src)            Lua, `?x` (`?docs`: the pages of docs/,
--                             repl/docs.lua), or a :command; output through the
--                             globals print and io.write (repl_multi captures them)
--   S:complete(word)          Tab candidates from this rank's objects
--
-- Lua input is tried as an expression first; its values are pretty-printed
-- and the first (when not nil) is kept in the global `_`. Errors are shown
-- and the session goes on; where the world communicator has failed, the
-- message says that :reset makes a new one.
--
-- Ctrl-C: input runs under a count hook that polls dl_sigint_take every
-- HOOK_EVERY instructions, and in LuaJIT's interpreter (jit.off on each chunk
-- and the functions it defines), because compiled loops never call hooks:
-- `for i = 1, 1e12 do end` could not be stopped. `:jit on` compiles input
-- again, for speed, at that price. On an interrupt the work queued on the
-- default device is waited for (a GPU finishes or reports what it ran), then
-- an error is raised at the interrupted line: globals keep their values.
local dl = require "distlab"
local pretty = require "distlab.pretty"
local help = require "distlab.repl.help"
local complete = require "distlab.repl.complete"
local docs = require "distlab.repl.docs"

local C = dl.C
local M = {}
local Session = {}
Session.__index = Session

local HOOK_EVERY = 1000

local HELP = [[
distlab REPL — `dl` is require "distlab"; results are pretty-printed and the last one is `_`.
  x = dl.randn(4, 8, {dtype = "bf16"})      tensors: dl.empty/zeros/ones/full/rand/randn/arange/from_table
  x:narrow(2, 1, 4):contiguous()            views are 1-based: narrow, select, view, transpose, permute
  dl.mem.report{unit = x:nbytes()}          memory by tag, in MiB and units
  dl.bench(function() x:fill_(1) end)       median/min/max ms with device events
  pp(value)                                 pretty-print anything
?x  :help x   what x is: a function's or module's documentation (dl.attn, dl.cp.attention),
              a tensor's shape/dtype/device/strides, an object's configuration (world, a CP, an all-reduce)
?docs         the pages of docs/; ?docs.knobs or :help knobs shows one, ?DISTLAB_TIMEOUT a knob
:mem     memory report of the default device     :device  the default device and the CUDA devices
:reset   a new world communicator in place of a failed one (every rank)
:jit on  compile input (faster loops, but Ctrl-C cannot stop a compiled loop); :jit off again
:quit    leave (also Ctrl-D)
Keys: Tab completes names, fields and methods (dl.at<Tab>, x:nar<Tab>); Ctrl-C clears the line,
or stops the input that runs (values kept); history in ~/.distlab_history.
Ranks (distlab repl -n N): input runs on every rank, each rank's output is shown, "[1] ..." where
ranks differ; :ranks 1,3 (or all) picks the ranks of what follows, :on 1 <code> runs one input there.
The globals rank, nranks and world (the world communicator) are set.]]

local function pack(...) return { n = select("#", ...), ... } end

local function incomplete_error(err) return err and (err:match("<eof>'?$") ~= nil) end

-- Lua that needs more lines: it does not compile, and as an expression or as
-- statements it ends too early.
function M.incomplete(src)
  if src:match("^%s*[:?]") then return false end
  local f1, e1 = loadstring("return " .. src, "=stdin")
  local f2, e2 = loadstring(src, "=stdin")
  if f1 or f2 then return false end
  return incomplete_error(e1) or incomplete_error(e2)
end

-- An expression compiles to a chunk that packs all its values (a call as an
-- argument is not a tail call, so an error inside it still names stdin:1;
-- "\n)" survives a trailing -- comment); else the statements.
local function compile(src)
  local fn = loadstring("local __dl_pack = ... return __dl_pack(" .. src .. "\n)", "=stdin")
  if fn then return fn, true end
  local err
  fn, err = loadstring(src, "=stdin")
  return fn, false, err
end

-- The input's line that runs (the innermost frame of typed code), as
-- "stdin:N: ", though the hook may fire inside a library function.
local function typed_line()
  for level = 3, 200 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.source == "=stdin" then return "stdin:" .. info.currentline .. ": " end
  end
  return ""
end

local function on_hook()
  if C.dl_sigint_take() > 0 then
    local why = typed_line() .. "interrupted (Ctrl-C)"
    local ok, err = pcall(dl.synchronize)
    if not ok then why = why .. "; waiting for the device then failed: " .. tostring(err) end
    error(why, 0)
  end
end

function M.new(opts)
  local self = setmetatable({ rank = opts.rank or 0, nranks = opts.nranks or 1, jit = false }, Session)
  _G.dl, _G.pp, _G.rank, _G.nranks = dl, pretty.print, self.rank, self.nranks
  -- world: the world communicator, made on first use (a collective)
  setmetatable(_G, { __index = function(_, k)
    if k == "world" then
      self.world = dl.comm.world()
      return self.world
    end
  end })
  self.extra = { names = { "world" }, get = function(name) if name == "world" then return self.world end end }
  return self
end

-- Runs chunk(...) under the interrupt hook; returns pcall's results, packed.
function Session:protected(chunk, ...)
  if not self.jit then jit.off(chunk, true) end
  C.dl_sigint_take() -- a Ctrl-C from before the input does not stop it
  debug.sethook(on_hook, "", HOOK_EVERY)
  local res = pack(pcall(chunk, ...))
  debug.sethook()
  return res
end

function Session:show_error(err)
  print("error: " .. tostring(err))
  local w = self.world
  if w and w.ptr ~= nil then
    local ok, info = pcall(w.info, w)
    if ok and info.failed then
      print(string.format("(the world communicator '%s' has failed: :reset makes a new one on every rank)", w.name))
    end
  end
end

local function show_values(res, first)
  local out = {}
  for i = first, res.n do out[#out + 1] = pretty.format(res[i]) end
  print(table.concat(out, "\t"))
end

function Session:run(src)
  local fn, expr, err = compile(src)
  if not fn then
    print("syntax error: " .. err)
    return
  end
  local res = expr and self:protected(fn, pack) or self:protected(fn)
  if not res[1] then return self:show_error(res[2]) end
  if expr then res = res[2] else res = pack(unpack(res, 2, res.n)) end
  if res.n == 0 then return end
  if res[1] ~= nil then _G._ = res[1] end
  local ok, e = pcall(show_values, res, 1)
  if not ok then self:show_error(e) end
end

-- ?x: a page of docs/ or a knob where x names one (repl/docs.lua), else
-- evaluates x and describes it.
function Session:help(expr)
  local page = docs.lookup(expr, function(name) return rawget(_G, name) ~= nil or name == "world" end)
  if page then
    print(page)
    return
  end
  local value = expr:gsub(":([%a_][%w_]*)$", ".%1") -- ?t:narrow is t.narrow
  local fn, err = loadstring("return " .. value, "=stdin")
  if not fn then
    print("syntax error: " .. err)
    return
  end
  local res = self:protected(fn)
  if not res[1] then return self:show_error(res[2]) end
  local ok, text = pcall(help.describe, res[2], expr)
  print(ok and text or ("error: " .. tostring(text)))
end

local commands = {}

function commands.help(S, arg)
  if arg == "" then print(HELP) else S:help(arg) end
end

function commands.mem() print(dl.mem.report()) end

function commands.device()
  local n, why = dl.cuda_device_count()
  print("default device: " .. dl.default_device())
  if n == 0 then print("CUDA: " .. why) end
  for i = 0, n - 1 do print(string.format("cuda:%d  %s", i, dl.cuda_device_name(i))) end
end

function commands.reset(S)
  local res = S:protected(function() return dl.comm.world { new = true } end)
  if not res[1] then return S:show_error(res[2]) end
  local w = res[2]
  S.world = w
  print(string.format("a new world: comm '%s' (%s, %d rank%s, %s)", w.name, w.backend, w.size,
    w.size == 1 and "" or "s", w.device:match("^%a+")))
end

function commands.jit(S, arg)
  if arg == "on" or arg == "off" then S.jit = arg == "on" end
  print("input is " .. (S.jit and "compiled (Ctrl-C cannot stop a compiled loop)" or
    "interpreted (Ctrl-C stops any loop)") .. "; :jit on|off")
end

-- with several ranks repl_multi.lua takes these before they get here
local function only_ranks() print("only with several ranks (distlab repl -n N)") end
commands.ranks, commands.on = only_ranks, only_ranks

function Session:execute(src)
  local cmd, arg = src:match("^%s*:(%a*)%s*(.-)%s*$")
  if cmd then
    local f = commands[cmd]
    if not f then
      print("unknown command :" .. cmd .. " (:help)")
      return
    end
    local ok, err = pcall(f, self, arg)
    if not ok then self:show_error(err) end
    return
  end
  local q = src:match("^%s*%?%s*(.-)%s*$")
  if q then return commands.help(self, q) end
  self:run(src)
end

function Session:complete(word)
  return complete.candidates(word, _G, self.extra)
end

return M
