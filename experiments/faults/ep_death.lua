-- experiments/faults/ep_death.lua <how> <seed> — one rank dies at a random
-- moment while every rank runs EP dispatch and combine in a loop (two
-- buffers: per_rank with expert_major output, per_expert with rank_major);
-- each survivor must end with an error naming the dead rank within a second
-- of the death, not at the communicator's timeout (30 s here). The victim is
-- the last rank, or rank 0 (which serves the store) for seeds divisible by 4.
--   kill9   another process sends the victim SIGKILL (exit code 137)
--   exit1   the victim calls os.exit(1) between two calls
-- Survivors ignore SIGTERM (the launcher's, once it saw the death), so what
-- they print is their own detection: "SURVIVOR <rank> <seconds after the
-- death> ERR: <message>"; the victim prints "VICTIM <rank> dies in <s>".
-- Run by experiments/faults/ep_deaths.sh (with and without the launcher)
-- and spec/ep_faults_spec.lua.
local ffi = require "ffi"
local dl = require "distlab"

ffi.cdef [[
void *signal(int sig, void *handler);
struct dl_epd_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct dl_epd_timespec *ts);
int getpid(void);
int poll(void *fds, unsigned long nfds, int timeout);
]]
local function now() -- CLOCK_MONOTONIC: the same clock in every process of the host
  local ts = ffi.new("struct dl_epd_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

ffi.C.signal(15, ffi.cast("void *", 1)) -- SIG_IGN
local how, seed = arg[1], tonumber(arg[2] or "1")
if how ~= "kill9" and how ~= "exit1" then error("usage: ep_death.lua kill9|exit1 <seed>", 0) end
local w = dl.comm.world { timeout = 30 } -- only a death may end the calls early
local N, me = w.size, w.rank
local victim = seed % 4 == 0 and 0 or N - 1

local B, H, K = 4, 128, 2
local eps = {
  dl.ep.buffer { comm = w, max_tokens = B, hidden = H, experts = 2 * N, topk = K },
  dl.ep.buffer { comm = w, max_tokens = B, hidden = H, experts = 2 * N, topk = K, layout = "per_expert",
    output = "rank_major" },
}
local x = dl.randn({ B, H }, { seed = me }):bf16()
local idx = dl.zeros({ B, K }, { dtype = "i32" })
for t = 1, B do
  for k = 1, K do idx:narrow(1, t, 1):narrow(2, k, 1):fill_(((t + k + me) * 3) % (2 * N)) end
  if idx:narrow(1, t, 1):narrow(2, 1, 1):item() == idx:narrow(1, t, 1):narrow(2, 2, 1):item() then
    idx:narrow(1, t, 1):narrow(2, 2, 1):fill_(-1)
  end
end
local wt = dl.ones({ B, K })
local function step(i)
  local ep = eps[i % #eps + 1]
  local recv, h = ep:dispatch(x, idx, wt)
  ep:combine(recv.x, h)
end
for i = 0, 3 do step(i) end
w:barrier()

local store = dl.comm.store()
if me == victim then
  local delay = 0.1 + (seed * 0.137) % 0.4
  local at = now() + delay
  store:set("epd/" .. seed, string.format("%.6f", at))
  print(string.format("VICTIM %d dies in %.3f s", me, delay))
  io.stdout:flush()
  if how == "kill9" then
    os.execute(string.format("(sleep %.3f; kill -9 %d) >/dev/null 2>&1 &", delay, ffi.C.getpid()))
  end
  for i = 1, math.huge do
    if how == "exit1" and now() >= at then os.exit(1) end
    step(i)
  end
end
local at = tonumber(store:get("epd/" .. seed))
local ok, err = pcall(function() for i = 1, math.huge do step(i) end end)
print(string.format("SURVIVOR %d %.3f %s", me, now() - at, ok and "NOERR" or "ERR: " .. tostring(err)))
io.stdout:flush()
-- a survivor that exited at once would be a second death, which a slower survivor could see
-- (and name) before the victim's: it stays past the others' second
ffi.C.poll(nil, 0, 1500)
os.exit(0)
