-- distlab REPL: `./distlab repl`. A LuaJIT prompt with distlab loaded as `dl`,
-- line editing and history (lua-readline, else rlwrap from the launcher),
-- pretty printing of results, and :commands (:help).
--
-- Each input is tried first as an expression (`return <line>`), then as a
-- statement; an incomplete chunk continues on the next line.
package.path = (os.getenv("DISTLAB_ROOT") or ".") .. "/bindings/?.lua;" .. package.path
local dl = require "distlab"
local pretty = require "distlab.pretty"

_G.dl = dl
_G.pp = pretty.print

local HISTORY = (os.getenv("HOME") or "/tmp") .. "/.distlab_history"

local ffi = require "ffi"
ffi.cdef "int isatty(int fd);"
local interactive = ffi.C.isatty(0) == 1

local readline_ok, RL = pcall(require, "readline")
local readline
if readline_ok and interactive and os.getenv("TERM") ~= "dumb" then
  pcall(RL.set_options, { histfile = HISTORY, keeplines = 1000, completion = false })
  readline = function(prompt) return RL.readline(prompt) end
else
  readline = function(prompt)
    if interactive then
      io.write(prompt)
      io.flush()
    end
    return io.read("*l")
  end
end

local HELP = [[
distlab REPL — `dl` is require "distlab"; results are pretty-printed.
  x = dl.randn(4, 8, {dtype = "bf16"})      tensors: dl.empty/zeros/ones/full/rand/randn/arange/from_table
  x:narrow(2, 1, 4):contiguous()            views are 1-based: narrow, select, view, transpose, permute
  dl.mem.report{unit = x:nbytes()}          memory by tag, in MiB and units
  dl.bench(function() x:fill_(1) end)       median/min/max ms with device events
  pp(value)                                 pretty-print anything
:help   this text        :mem   memory report of the default device
:device show the default device and CUDA devices      :quit  leave (also Ctrl-D)]]

local commands = {
  help = function() print(HELP) end,
  mem = function() print(dl.mem.report()) end,
  device = function()
    local n, why = dl.cuda_device_count()
    print("default device: " .. dl.default_device())
    if n == 0 then print("CUDA: " .. why) end
    for i = 0, n - 1 do print(string.format("cuda:%d  %s", i, dl.cuda_device_name(i))) end
  end,
}

local function incomplete(err) return err and (err:match("near '<eof>'$") or err:match("near <eof>$")) end

-- compiled?, message, is_runtime_error
local function run_chunk(src)
  -- `return (expr)` first: not a tail call, so errors point at stdin:1
  local fn, eerr = loadstring("return (" .. src .. ")", "=stdin")
  local err
  if not fn then fn, eerr = loadstring("return " .. src, "=stdin") end
  if not fn then fn, err = loadstring(src, "=stdin") end
  if not fn then
    if incomplete(err) or incomplete(eerr) then return false, "<eof>" end
    return false, err
  end
  local res = { pcall(fn) }
  if not res[1] then return true, res[2], true end
  if select("#", unpack(res)) > 1 then
    local out = {}
    for i = 2, table.maxn(res) do out[#out + 1] = pretty.format(res[i]) end
    print(table.concat(out, "\t"))
  end
  return true
end

if not os.getenv("DISTLAB_REPL_QUIET") then
  print("distlab REPL (" .. dl.build_info() .. "), device " .. dl.default_device() .. ". :help for help.")
end
local buffer = nil
while true do
  local line = readline(buffer and ">> " or "dl> ")
  if line == nil then io.write("\n") break end
  if not buffer and line:match("^%s*:") then
    local cmd = line:match("^%s*:(%a+)")
    if cmd == "quit" or cmd == "q" or cmd == "exit" then break end
    if commands[cmd] then
      local ok, err = pcall(commands[cmd])
      if not ok then print("error: " .. tostring(err)) end
    else
      print("unknown command :" .. tostring(cmd) .. " (:help)")
    end
  else
    if readline_ok and RL.add_history and line:match("%S") then pcall(RL.add_history, line) end
    local src = buffer and (buffer .. "\n" .. line) or line
    local compiled, err, runtime = run_chunk(src)
    if compiled then
      buffer = nil
      if err then print(runtime and ("error: " .. err) or err) end
    elseif err == "<eof>" then
      buffer = src
    else
      buffer = nil
      print("syntax error: " .. err)
    end
  end
end
if readline_ok and RL.save_history then pcall(RL.save_history) end
