-- spec/comm/debug_keys.lua [cpu|cuda] — debug mode's checks leave nothing in the store but each
-- rank's last collective's key. Each send publishes its signature under
-- "<comm>/dbg/p2p/<src>-<dst>/<n>", the matching receive reads it and deletes it; each collective
-- publishes "<comm>/dbg/<k>/<rank>" and deletes its rank's key of the collective before, so the k
-- are counted by collectives only (a p2p op in between must not leave the last one's key). After
-- 40 rounds of a send each way between ranks 0 and 1 then an all-reduce, rank 0 finds none of the
-- p2p keys and at most two collective keys a rank (the last barrier's, the next one's of a rank
-- already past it). Then rank 0 alone sends to itself: the next all-reduce's keys still have the
-- same number on both ranks (numbered by every op, rank 0 waited for a key rank 1 never set).
-- Prints "debug_keys ok".
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
  local kept = {} -- collective keys, numbered up to every op's count (p2p ones too)
  for k = 0, 4 * n + 10 do
    for q = 0, w.size - 1 do
      local key = string.format("%s/dbg/%d/%d", w.name, k, q)
      if store:check(key) then kept[#kept + 1] = key end
    end
  end
  assert(#kept <= 2 * w.size, #kept .. " collective keys left in the store (at most " .. 2 * w.size ..
    "): " .. table.concat(kept, " ", 1, math.min(#kept, 6)))
end
w:barrier()
if w.rank == 0 then dl.comm.group(function() w:send(t, 0); w:recv(r, 0) end) end
w:all_reduce(dl.ones(4))
print("debug_keys ok")
