-- spec/overlap/fail.lua KIND ALGO TRANSPORT — a peer that never runs: rank
-- 0 runs the op (kind ag or rs) and rank 1 does not. Rank 0's wait ends
-- after the timeout (SPEC_TIMEOUT): on cpu the run itself fails, on cuda
-- the run returns and the watchdog fails the op, which check() reports;
-- rank 0 prints "ERR: <message>", then "AFTER: <message>" of the next run,
-- which the failed op refuses, then frees the op, which on cuda waits for
-- the device: every wait of the stuck run must have ended (the watchdog
-- sets the flags), and "FREED" says they did. Rank 1 stays until then
-- (rank 0's released copies read its buffer).
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local K = dofile(dir .. "/common.lua")
local ffi = require "ffi"
local dl = require "distlab"

ffi.cdef "int usleep(unsigned int usec);"
local kind, algo, transport = arg[1] or "ag", arg[2] or "p2p", arg[3] or "get"

-- polls (the store's own waits end after the short SPEC_TIMEOUT)
local function wait_key(store, key)
  local t0 = dl.now_us()
  while not store:check(key) do
    if dl.now_us() - t0 > 4 * K.timeout * 1e6 + 30e6 then error("no " .. key .. " from the other rank", 0) end
    ffi.C.usleep(20000)
  end
end

K.report(function()
  local op = K.op(kind, { algo = algo, transport = transport, copy = "ce", streams = 2 })
  local case = K.case(kind, 3, { rows = 4, k = 8, n = 8 }, "bf16")
  local store = K.w.store
  if K.me == 0 then
    -- the first run sets the op up (collective): rank 1 takes part in that, and only that
    op:run(case.a, case.b)
    op:check()
    store:set("fail/first", "1")
    local ok, err = pcall(function()
      op:run(case.a, case.b)
      op:check()
    end)
    print("ERR: " .. (ok and "none" or tostring(err)))
    local ok2, err2 = pcall(op.run, op, case.a, case.b)
    print("AFTER: " .. (ok2 and "none" or tostring(err2)))
    io.stdout:flush()
    op:free()
    print("FREED")
    io.stdout:flush()
    store:set("fail/done", "1")
    wait_key(store, "fail/bye") -- rank 0 serves the store: it leaves last
  else
    op:run(case.a, case.b)
    op:check()
    wait_key(store, "fail/first")
    wait_key(store, "fail/done")
    store:set("fail/bye", "1")
  end
  print(string.format("fail ok: rank %d", K.me))
end)
