-- distlab REPL: `./distlab repl` (one rank; `-n N` runs repl_multi.lua). A
-- LuaJIT prompt with distlab loaded as `dl`: line editing, history and Tab
-- completion (repl/line.lua), Ctrl-C that clears the line or stops the
-- running input, `?x` help, `_`, :commands (repl/session.lua; :help).
package.path = (os.getenv("DISTLAB_ROOT") or ".") .. "/bindings/?.lua;" .. package.path
local dl = require "distlab"
local session = require "distlab.repl.session"
local line = require "distlab.repl.line"

local S = session.new { rank = 0, nranks = 1 }
local ed = line.editor {
  history = (os.getenv("HOME") or "/tmp") .. "/.distlab_history",
  complete = function(word) return S:complete(word) end,
}
dl.check(dl.C.dl_sigint_arm(1))

if not os.getenv("DISTLAB_REPL_QUIET") then
  print("distlab REPL (" .. dl.build_info() .. "), device " .. dl.default_device() .. ". :help for help.")
end
local src
while true do
  local l = ed:read(src and ">> " or "dl> ")
  if l == nil then
    io.write("\n")
    break
  end
  if l == false then -- Ctrl-C: the line, and an unfinished chunk with it, are dropped
    src = nil
  else
    src = src and (src .. "\n" .. l) or l
    local cmd = src:match("^%s*:(%a+)%s*$")
    if cmd == "quit" or cmd == "q" or cmd == "exit" then break end
    if not session.incomplete(src) then
      S:execute(src)
      src = nil
    end
  end
end
