-- spec/allreduce/fail.lua <algo> — rank 1 skips an all-reduce: rank 0's call ends
-- within the timeout (on cuda the kernel ends by itself and ar:check()
-- reports it) with an error naming the op, the rank and the peer; the
-- all-reduce then refuses work, saying why. Prints "ERR: <message>" and
-- "AFTER: <message>" for the spec; rank 1 waits (through the store) until
-- rank 0 is done, and exits 0.
-- spec/allreduce/fail.lua mismatch — in the communicator's debug mode, ranks
-- calling different sizes get "mismatched all-reduce calls" (every rank
-- prints ERR: and exits 0).
-- spec/allreduce/fail.lua knob — making the all-reduce with the environment
-- the caller set (a bad DISTLAB_AR_* knob): prints ERR: with the error.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local A = dofile(dir .. "/common.lua")
local dl = require "distlab"

local w, me = A.w, A.me
local algo = arg[1] or "one_shot"
if algo == "knob" then
  local ok, err = pcall(dl.allreduce.new, w)
  print("ERR: " .. tostring(err))
  os.exit(ok and 1 or 0)
end
if algo == "mismatch" then
  w:set_debug(true)
  local ar = dl.allreduce.get(w)
  ar:run(dl.ones({ 100 }), { algo = "one_shot" })
  local ok, err = pcall(ar.run, ar, dl.ones({ 100 + me }), { algo = "two_shot" })
  print("ERR: " .. tostring(err))
  -- rank 0 serves the store: it stays until every rank has read its call
  -- (else a slower rank 1 sees "the store closed the connection" instead)
  w:barrier()
  os.exit(ok and 1 or 0)
end
local ar = dl.allreduce.get(w)
local x = dl.ones({ 1000 })
ar:run(x, { algo = algo })
ar:check()
w:barrier()
local store = dl.comm.store()
if me == 1 then
  store:set_timeout(A.timeout * 4 + 10)
  store:wait("allreduce-fail-done")
  store:set("allreduce-fail-ack", "")
  os.exit(0)
end
local ok, err = pcall(function()
  ar:run(x, { algo = algo })
  ar:check()
end)
print("ERR: " .. tostring(err))
local ok2, err2 = pcall(function() ar:run(x, { algo = algo }) end)
print("AFTER: " .. tostring(err2))
io.stdout:flush()
store:set("allreduce-fail-done", "")
store:wait("allreduce-fail-ack")
os.exit((not ok and not ok2) and 0 or 1)
