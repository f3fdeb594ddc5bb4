-- spec/comm/symm.lua — symmetric buffers: peer reads and writes, flags as
-- counters in a back-to-back ring (with acknowledgements), the barrier making
-- earlier writes visible, counts that wrap past 2^32, views, and no
-- /dev/shm leftovers. Runs on cpu and on cuda (one GPU per rank).
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local U = dofile(dir .. "/util.lua")
local dl = require "distlab"

local w = dl.comm.world { timeout = tonumber(os.getenv("SPEC_TIMEOUT") or "20") }
local N, me = w.size, w.rank
local nxt, prv = (me + 1) % N, (me - 1 + N) % N
local n = 1000

local function val(r, i, it) return (r * 31 + i * 7 + (it or 0) * 3) % 97 end

U.report(function()
  for _, dtype in ipairs { "f32", "bf16", "i64", "u8" } do
    local buf = dl.symm.alloc(w, { N, n }, dtype)
    -- each rank fills its own buffer, everyone reads everyone's
    buf:tensor():copy_(U.make(N * n, dtype, function(i) return val(me, i) end):view(N, n))
    buf:barrier()
    for r = 0, N - 1 do
      U.expect(buf:peer(r), function(i) return val(r, i) end, "read of rank " .. r .. "'s buffer " .. dtype)
    end
    buf:barrier()
    -- put: row `me` of every peer's buffer
    local row = U.make(n, dtype, function(i) return val(me, i, 1) end)
    for r = 0, N - 1 do buf:peer(r):select(1, me + 1):copy_(row) end
    buf:barrier()
    U.expect(buf:tensor(), function(i) return val(math.floor(i / n), i % n, 1) end, "puts into rank " .. me .. " " .. dtype)
    buf:check()
    buf:free()
  end

  -- a ring, back to back: data to the next rank, flag 0 = round; the next rank
  -- acknowledges on our flag 1 before we overwrite
  local buf = dl.symm.alloc(w, { n }, "f32")
  local rounds = tonumber(os.getenv("SPEC_ROUNDS") or "300")
  for it = 1, rounds do
    if it > 1 then buf:wait_flag(1, it - 1) end
    buf:peer(nxt):copy_(U.make(n, "f32", function(i) return val(me, i, it) end))
    buf:set_flag(nxt, 0, it)
    buf:wait_flag(0, it)
    if it % 50 == 0 or it == rounds then
      U.expect(buf:tensor(), function(i) return val(prv, i, it) end, "ring round " .. it)
    end
    buf:set_flag(prv, 1, it)
  end
  buf:wait_flag(1, rounds)
  -- barrier: what each rank wrote before it, every rank sees after it
  for it = 1, 100 do
    buf:tensor():fill_(me * 1000 + it)
    buf:barrier()
    if it % 25 == 0 then
      for r = 0, N - 1 do U.expect(buf:peer(r), function() return r * 1000 + it end, "barrier " .. it) end
    end
    buf:barrier()
  end
  -- counts wrap modulo 2^32
  buf:set_flag(nxt, 2, 0xfffffffe)
  buf:wait_flag(2, 0xfffffffd)
  buf:barrier()
  buf:set_flag(nxt, 2, 1)
  buf:wait_flag(2, 0xffffffff)
  assert(buf:flag(me, 2) == 1, "flag 2 should read 1, is " .. buf:flag(me, 2))
  buf:check()
  local ok, err = pcall(buf.view, buf, 0, 4 * n - 8, { 4 }, "f32")
  assert(not ok and err:find("does not fit the buffer", 1, true), tostring(err))
  buf:free()
  local job = os.getenv("DISTLAB_JOB_ID") or ""
  local p = io.popen("ls /dev/shm 2>/dev/null | grep -c -- " .. job)
  local left = tonumber(p:read("*a")) or 0
  p:close()
  assert(left == 0, left .. " shared-memory names of this job are still in /dev/shm")
  w:barrier()
  print(string.format("symm ok: rank %d of %d on %s", me, N, w.device))
end)
