-- spec/comm/self.lua — sends and receives to this rank: outside a group an
-- error at once (their other half could never be posted); paired in a
-- group, the bytes arrive; unpaired in a group (the last rank sends to
-- itself without receiving), an error on that rank naming it, and on the
-- others where their ring exchange still waited on it. Prints "SELF ..."
-- lines and "self ok".
local dl = require "distlab"
local w = dl.comm.world { timeout = 20 }
local t, r = dl.ones(4), dl.zeros(4)

local function say(what, ok, err) io.stdout:write(string.format("SELF %s %d %s\n", what, w.rank, ok and "ok" or tostring(err))) end
say("OUT_SEND", pcall(function() w:send(t, w.rank) end))
say("OUT_RECV", pcall(function() w:recv(r, w.rank) end))
w:barrier()
local ok, err = pcall(function() dl.comm.group(function() w:send(t, w.rank); w:recv(r, w.rank) end) end)
say("PAIRED", ok and r:tolist()[1] == 1, err)
w:barrier()
local t0 = dl.now_us()
ok, err = pcall(function()
  dl.comm.group(function()
    if w.rank == w.size - 1 then w:send(t, w.rank) end
    w:send(t, (w.rank + 1) % w.size)
    w:recv(r, (w.rank - 1) % w.size)
  end)
end)
say(string.format("UNPAIRED %.3f", (dl.now_us() - t0) / 1e6), ok, err)
print("self ok")
