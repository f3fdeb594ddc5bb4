-- spec/comm/split.lua — split communicators: by color and key, by a function
-- of the rank (no exchange), color -1, nested splits, a second world.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local w = dl.comm.world { timeout = 20 }
local N, me = w.size, w.rank

local function check_group(c, members, what)
  assert(c, what .. ": no communicator")
  assert(c.size == #members, what .. ": size " .. c.size)
  local sum = 0
  for _, r in ipairs(members) do sum = sum + r end
  local t = U.make(3, "i64", function() return me end)
  c:all_reduce(t, "sum")
  U.expect(t, function() return sum end, what .. " all_reduce")
  local g = dl.empty({ c.size }, "i64")
  c:all_gather(g, U.make(1, "i64", function() return me end))
  U.expect(g, function(i) return members[i + 1] end, what .. " member order")
end

U.report(function()
  -- even/odd ranks, ordered by descending world rank
  local members = {}
  for r = N - 1, 0, -1 do if r % 2 == me % 2 then members[#members + 1] = r end end
  local by_color = w:split(me % 2, -me)
  check_group(by_color, members, "split(color, key)")
  assert(by_color.rank == (function() for i, r in ipairs(members) do if r == me then return i - 1 end end end)())

  local by_fn = w:split(function(r) return r % 2, -r end)
  check_group(by_fn, members, "split(function)")

  local none = w:split(me == 0 and -1 or 1)
  assert((none == nil) == (me == 0), "color -1 must give nil on rank 0 only")
  if none then
    local rest = {}
    for r = 1, N - 1 do rest[#rest + 1] = r end
    check_group(none, rest, "split without rank 0")
  end

  local nested = by_color:split(0, me)
  local sorted = {}
  for _, r in ipairs(members) do sorted[#sorted + 1] = r end
  table.sort(sorted)
  check_group(nested, sorted, "nested split")

  local w2 = dl.comm.new { timeout = 20 }
  local all = {}
  for r = 0, N - 1 do all[r + 1] = r end
  check_group(w2, all, "second world")
  check_group(w, all, "first world still works")
  w2:free()
  by_color:free()
  w:barrier()
  print(string.format("split ok: rank %d of %d (%s, %s)", me, N, tostring(by_color.name or "freed"), nested.name))
end)
