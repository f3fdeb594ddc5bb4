-- spec/comm/debug_keys.lua [cpu|cuda] — debug mode's point-to-point check leaves nothing in the
-- store: each send publishes its signature under "<comm>/dbg/p2p/<src>-<dst>/<n>", the matching
-- receive reads it and deletes it. After 40 sends each way between ranks 0 and 1 (and a few
-- collectives), rank 0 finds none of those keys. Prints "debug_keys ok".
local dl = require "distlab"
local w = dl.comm.world { timeout = 20, debug = true }
local n = 40
local t, r = dl.ones(8), dl.zeros(8)
for _ = 1, n do
  dl.comm.group(function()
    if w.rank == 0 then w:send(t, 1); w:recv(r, 1) elseif w.rank == 1 then w:recv(r, 0); w:send(t, 0) end
  end)
  w:all_reduce(dl.ones(4))
end
w:barrier()
if w.rank == 0 then
  local store, left = dl.comm.store(), {}
  for i = 1, n do
    for _, pair in ipairs { "0-1", "1-0" } do
      local key = string.format("%s/dbg/p2p/%s/%d", w.name, pair, i)
      if store:check(key) then left[#left + 1] = key end
    end
  end
  assert(#left == 0, #left .. " keys left in the store, e.g. " .. tostring(left[1]))
end
w:barrier()
print("debug_keys ok")
