-- spec/repl/transcript.lua — a short REPL session typed through a terminal,
-- printed as the screen showed it (docs/repl.md's sessions come from here, and
-- spec/repl_spec.lua compares them with it):
--
--   luajit spec/repl/transcript.lua [device] [ranks]     (from the repo root)
--
-- One rank: a tensor, Tab completion, `?`, `_`, Ctrl-C stopping a loop that
-- also queues device work (on cuda: waited for, then stopped), `?` on a
-- function. Several ranks: an all-reduce, one typed on rank 1 only and
-- stopped with Ctrl-C twice, :reset, the all-reduce again, rank-prefixed
-- output. Exits non-zero when the session does not go as written.
package.path = "spec/?.lua;" .. package.path
local pty = require "repl.pty"

local device, ranks = arg[1] or "cpu", tonumber(arg[2] or "1")
local home = os.tmpname()
os.remove(home)
os.execute("mkdir -p " .. home)

local function session(args, prompt, steps)
  local P = pty.spawn(args, { env = { TERM = "xterm", HOME = home, INPUTRC = "/dev/null" }, timeout = 120 })
  P:expect(prompt)
  for _, s in ipairs(steps) do
    P:send(s[1])
    if s.pause then
      os.execute("sleep " .. s.pause)
      P:send(s.pause_keys)
    end
    if s.second then
      P:expect(s.second)
      P:send("\3")
    end
    P:expect(prompt)
  end
  P:send("\4")
  local done = P:wait(30)
  P:close()
  io.write(P:screen(), "\n")
  if not done then error("the session did not end at Ctrl-D") end
end

if ranks == 1 then
  session({ "./distlab", "repl", "--device", device }, "dl> ", {
    { 'q = dl.randn(2, 8, 4, 16, {dtype = "bf16"})\r' },
    { "q:trans\t2, 3):is_contiguous()\r" },
    { "?q\r" },
    { "q:numel() * 2\r" },
    { "_ / 1024\r" },
    { "n = 0; while true do n = n + 1; q:mul_(1) end\r", pause = 1, pause_keys = "\3" },
    { "n > 0\r" },
    { "?dl.mem.tag\r" },
  })
else
  local p = string.format("dl[%d]> ", ranks)
  session({ "./distlab", "repl", "-n", tostring(ranks), "--device", device }, p, {
    { "t = dl.full({4}, rank + 1)\r" },
    { "world:all_reduce(t)\r" },
    { ":on 1 world:all_reduce(t)\r", pause = 1, pause_keys = "\3", second = "Ctrl-C again" },
    { ":reset\r" },
    { "t:fill_(rank + 1) return world:all_reduce(t)\r" },
    { "rank * 10\r" },
  })
end
os.execute("rm -rf " .. home)
