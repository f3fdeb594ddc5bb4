-- world{new = true} on every rank: a fresh world under an agreed name after a
-- failed one, the old world aborted and its store keys gone, even where one
-- rank made more communicators than the others (as `:on 1 ...` in a REPL).
-- Prints "renew ok" on success; any check that fails raises.
local ffi = require "ffi"
local dl = require "distlab"
local C = dl.C

local w = dl.comm.world()
local me, n = w.rank, w.size
local t = dl.full({ 4 }, me + 1)
w:all_reduce(t)
assert(t:tolist()[1] == n * (n + 1) / 2, "first all_reduce")
local store = dl.comm.store()
local old_name = w.name
assert(store:check(old_name .. "/shm") or w.backend ~= "shm", "the old world's setup key")

-- rank 1 fails the world alone: a collective nobody else joins ends when
-- rank 0's world{new = true} aborts the world (or at the timeout)
if me == 1 then
  w:set_timeout(5)
  local ok, err = pcall(w.all_reduce, w, t)
  assert(not ok and tostring(err):find("replaced by dl.comm.world{new = true}", 1, true), tostring(err))
  -- and makes one more communicator than the others: the names would disagree
  local pp = ffi.new("dl_comm_t*[1]")
  dl.check(C.dl_comm_new(pp, C.DL_COMM_META, store.ptr, 0, 1, 0, 0))
  C.dl_comm_free(pp[0])
end

local nw = dl.comm.world { new = true }
assert(nw ~= w and dl.comm.world() == nw, "world() is the new world")
assert(nw.name ~= old_name, "a new name")
store:set("names/" .. me, nw.name)
for r = 0, n - 1 do assert(store:get("names/" .. r) == nw.name, "every rank has the same name") end
local ok, err = pcall(w.all_reduce, w, t)
assert(not ok, "the old world refuses work")
t:fill_(me + 1)
nw:all_reduce(t)
assert(t:tolist()[1] == n * (n + 1) / 2, "all_reduce on the new world")
nw:barrier()
if me == 0 then
  assert(not store:check(old_name .. "/shm"), "the old world's keys are deleted")
  assert(not store:check("distlab/world/new1/0"), "the name exchange's keys are deleted")
end
print(string.format("renew ok: rank %d, %s -> %s (%s)", me, old_name, nw.name, tostring(err):match("[^\n]*")))
