-- spec/comm/kill.lua <op> <seed> — one rank dies at a random moment (its own
-- SIGALRM, whose default action ends the process wherever it is) while every
-- rank runs `op` in a loop; each survivor must end with a clear error within
-- a second of the death, whatever it was waiting on. The victim is the last
-- rank, or rank 0 (which serves the store) for seeds divisible by 4.
--   collectives  all_reduce, all_gather, reduce_scatter, all_to_all, a ring of
--                send/recv, broadcast, barrier
--   allreduce    dl.allreduce.run cycling through every algorithm (kernels, nccl)
--   cp           context-parallel forward and backward, cycling through p2p
--                (fused), all_gather and a2a
--   debug        the collectives in the communicator's debug mode (store checks)
--   symm         a ring of flags and the barrier of a symmetric buffer
--   overlap      dl.overlap ag_gemm and gemm_rs, cycling through the nccl
--                baselines and p2p / ring with get and put
-- Survivors ignore SIGTERM (the launcher's, once it saw the death), so what
-- they print is their own detection: "SURVIVOR <rank> <seconds after the
-- death> ERR: <message>"; the victim prints "VICTIM <rank> dies in <s>".
-- Runs on the device DISTLAB_DEVICE gives (cuda: ranks sharing a GPU too);
-- on cuda every iteration ends with a synchronize, so what a survivor waits
-- on is the device's wait for its peer.
-- KILL_STOP_RANK0=<s>: the victim (not rank 0) stops rank 0 (SIGSTOP) just
-- before it dies and has it continued <s> seconds later, so rank 0's
-- watchdog finds two ranks dead at its first look: the victim and a
-- survivor that gave up and exited meanwhile.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local ffi = require "ffi"
local dl = require "distlab"

ffi.cdef [[
unsigned ualarm(unsigned usecs, unsigned interval);
void *signal(int sig, void *handler);
struct dl_kill_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct dl_kill_timespec *ts);
int getpid(void);
int kill(int pid, int sig);
]]
local function now() -- CLOCK_MONOTONIC: the same clock in every process of the host
  local ts = ffi.new("struct dl_kill_timespec")
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- SIG_IGN: the launcher's TERM, once it saw the death, must not end a
-- survivor before its own error does (a hung one is killed 5 s later)
ffi.C.signal(15, ffi.cast("void *", 1))
local op, seed = arg[1], tonumber(arg[2] or "1")
local w = dl.comm.world { timeout = 30 } -- only a death may end the ops early
local N, me = w.size, w.rank
local victim = seed % 4 == 0 and 0 or N - 1
local cuda = w.device:match("^cuda") ~= nil

-- one iteration of each op, and what it needs made beforehand
local x, g, y = dl.ones(4096), dl.empty(4096 * N), dl.empty(4096)
local xs = dl.ones(4096 * N)
local ops, setup = {}, {}
function ops.collectives(i)
  w:all_reduce(x)
  w:all_gather(g, x)
  w:reduce_scatter(y, xs)
  w:all_to_all(g, xs)
  dl.comm.group(function()
    w:send(x, (me + 1) % N)
    w:recv(y, (me - 1 + N) % N)
  end)
  w:broadcast(x, i % N)
  w:barrier()
end
ops.debug = ops.collectives
function setup.debug() w:set_debug(true) end

local algos = dl.allreduce.algos
function ops.allreduce(i) dl.allreduce.run(x, { algo = algos[i % #algos + 1] }) end

local cps, q, k, v = {}
function setup.cp()
  cps = {
    dl.cp.attention { comm = w, algo = "p2p", mask = "causal" },
    dl.cp.attention { comm = w, algo = "all_gather", mask = "causal" },
    dl.cp.attention { comm = w, algo = "a2a" },
  }
  -- a2a splits the heads among the ranks: N of them
  local function shard(s) return dl.cp.shard(dl.randn({ 1, 16 * N, N, 16 }, { seed = s }):bf16(), { comm = w }) end
  q, k, v = shard(1), shard(2), shard(3)
end
function ops.cp(i)
  local cp = cps[i % #cps + 1]
  cp:backward(cp:forward(q, k, v))
end

local buf
function setup.symm() buf = dl.symm.alloc(w, { 64 }) end
function ops.symm(i)
  buf:set_flag((me + 1) % N, 0, i)
  buf:wait_flag(0, i)
  buf:barrier()
  buf:check() -- cuda: waits for the device's waits and reports how they ended
end

local ovs, cases = {}, {}
function setup.overlap()
  local K = dofile(dir .. "/../overlap/common.lua") -- its world is ours (made above)
  for _, kind in ipairs { "ag", "rs" } do
    for _, o in ipairs { { algo = kind == "ag" and "nccl_then_gemm" or "gemm_then_nccl" },
      { algo = "p2p", transport = "get", copy = "ce", streams = 2 },
      { algo = "ring", transport = "put", copy = "ce", streams = 1 } } do
      ovs[#ovs + 1] = K.op(kind, o)
      cases[#ovs] = K.case(kind, #ovs, { rows = 4, k = 8, n = 8 }, "bf16")
    end
  end
end
function ops.overlap(i)
  local j = i % #ovs + 1
  ovs[j]:run(cases[j].a, cases[j].b)
  ovs[j]:check()
end

if not ops[op] then error("unknown op " .. tostring(op), 0) end
if setup[op] then setup[op]() end
local function step(i)
  ops[op](i)
  if cuda then w:synchronize() end
end
-- every variant once (overlap ops and all-reduce objects set up at their first run)
for i = 0, 5 do step(i) end
w:barrier()

-- the victim picks its moment and tells the others when it will be
local store = dl.comm.store()
local stop0 = tonumber(os.getenv("KILL_STOP_RANK0") or "")
if stop0 and me == 0 then store:set("kill/pid0", tostring(ffi.C.getpid())) end
if me == victim then
  local delay = 0.1 + (seed * 0.137) % 0.4
  local at = now() + delay
  store:set("kill/" .. seed, string.format("%.6f", at))
  print(string.format("VICTIM %d dies in %.3f s", me, delay))
  io.stdout:flush()
  local pid0 = stop0 and me ~= 0 and tonumber(store:get("kill/pid0"))
  if pid0 then os.execute(string.format("(sleep %g; kill -CONT %d) >/dev/null 2>&1 &", delay + stop0, pid0)) end
  ffi.C.ualarm(math.floor((at - now()) * 1e6), 0)
  for i = 1, math.huge do
    if pid0 and now() > at - 0.01 then
      ffi.C.kill(pid0, 19) -- SIGSTOP
      pid0 = nil
    end
    step(i)
  end
end
local at = tonumber(store:get("kill/" .. seed))
local ok, err = pcall(function() for i = 1, math.huge do step(i) end end)
print(string.format("SURVIVOR %d %.3f %s", me, now() - at, ok and "NOERR" or "ERR: " .. tostring(err)))
io.stdout:flush()
os.exit(0)
