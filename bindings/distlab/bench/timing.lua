-- distlab.bench.timing — how the benchmarks take their times. Each method
-- warms up first and returns the times of its repetitions, so the numbers
-- of two benches that use the same method compare.
--
--   stats(times[, method])          median (mean of the middle two when even),
--                                   min, max, mean, iters; times sorted; method: what
--                                   a time is (print(st) shows it)
--   events(fn, opts) -> stats, ms   each call of fn between two device events
--                                   (dl.bench's method; host time on cpu and meta);
--                                   warm_ms / min_ms: counts filled to that much work
--   graph(fn, opts) -> stats, ms    per call: a CUDA graph of `ops` back-to-back
--                                   calls, each replay between two events / ops
--   isolated(fn, opts) -> stats, ms one call alone: a graph of one call, each replay
--                                   after an L2 flush, a sync and before() (a barrier)
--   loop_once(fn, iters, opts)      one repetition of [before(), event, `iters`
--                                   calls, event] -> device us, host us per call
--   host(fn, opts) -> stats, us     the host's time to issue one call, batches
--                                   with a sync between them (not counted)
--   over_ranks(comm, v, op)         v (a number or a list of numbers) reduced
--                                   over the ranks of comm: "max" (default), "sum", "min"
--   anchor(runs, better) -> v, wide an anchor's figure from its runs in one call (before
--                                   and after ours): their mean, so a drift of the clocks
--                                   cancels; their best (better: "high" for a rate, "low"
--                                   for a time) where the runs are more than ANCHOR_WIDE
--                                   apart, wide = true, so an erratic run cannot flatter ours
local core = require "distlab.core"
local stream = require "distlab.stream"
local args = require "distlab.args"

local fail = core.fail
local M = {}

local Stats = {}
Stats.__index = Stats
function Stats:__tostring()
  return string.format("median %.4g ms (min %.4g, max %.4g) over %d%s", self.median, self.min, self.max, self.iters,
    self.method and ", " .. self.method or "")
end

-- stats(times[, method]): method says what a time is, for the reader (events and
-- graph fill it: on cpu and meta the host's time, not a device's)
function M.stats(times, method)
  table.sort(times)
  local n, sum = #times, 0
  if n == 0 then fail("bench: no times to summarise") end
  for _, t in ipairs(times) do sum = sum + t end
  local median = n % 2 == 1 and times[(n + 1) / 2] or (times[n / 2] + times[n / 2 + 1]) / 2
  return setmetatable({ median = median, min = times[1], max = times[n], mean = sum / n, iters = n, times = times,
    method = method }, Stats)
end

-- anchor(runs, better): runs a list of numbers (nil entries: runs without the figure, skipped); nil when none
M.ANCHOR_WIDE = 1.05
function M.anchor(runs, better)
  if better ~= "high" and better ~= "low" then fail("bench.anchor: better must be \"high\" or \"low\", not %s", tostring(better)) end
  local sum, n, lo, hi = 0, 0, nil, nil
  for i = 1, table.maxn(runs) do
    local v = runs[i]
    if v then sum, n, lo, hi = sum + v, n + 1, math.min(lo or v, v), math.max(hi or v, v) end
  end
  if n == 0 then return nil, false end
  if lo > 0 and hi > M.ANCHOR_WIDE * lo then return better == "high" and hi or lo, true end
  return sum / n, false
end

-- What a time of events() or graph() is on a device: cpu and meta have no
-- device events, so a call's time is the host's, the call's whole work done
-- by the host before it returns (and by all ranks on the host's cores).
local function method_of(device, what)
  if tostring(device):match("^cuda") then return what end
  return "host time per call on " .. tostring(device) .. " (no device events: the work runs in the call)"
end

local function device_of(opts)
  local cur = stream.current_stream()
  return opts.device or (cur and cur.device) or core.default_device()
end

local function count(opts, key, dflt, least)
  local v = opts[key] == nil and dflt or opts[key]
  if type(v) ~= "number" or v ~= math.floor(v) or v < least then
    fail("bench: %s must be an integer >= %d, got %s", key, least, tostring(v))
  end
  return v
end

local function ms_opt(opts, key)
  local v = opts[key]
  if v ~= nil and (type(v) ~= "number" or v < 0) then fail("bench: %s must be a number >= 0, got %s", key, tostring(v)) end
  return v
end

-- events(fn, {warmup = 5, iters = 20, warm_ms =, min_ms =, device = current}) -> stats (ms per call)
-- With warm_ms or min_ms, a first estimate (2 + 3 calls) sets the counts: at
-- least `warmup` calls and enough to fill warm_ms, at least `iters` timed calls
-- and enough to fill min_ms. A few calls of a short kernel leave the card's
-- clocks where the previous case put them (the same GEMM moved 10% between
-- two H200 runs at 5 + 20 calls); half a second of it settles them.
function M.events(fn, opts)
  if type(fn) ~= "function" then fail("bench: first argument must be a function") end
  opts = args.options(opts, { "device", "iters", "warmup", "min_ms", "warm_ms", "before" }, "bench")
  local warmup, iters = count(opts, "warmup", 5, 0), count(opts, "iters", 20, 1)
  local warm_ms, min_ms = ms_opt(opts, "warm_ms"), ms_opt(opts, "min_ms")
  local device = device_of(opts)
  if warm_ms or min_ms then
    local est = math.max(M.events(fn, { warmup = 2, iters = 3, device = device }).median, 1e-3)
    warmup = math.max(warmup, math.ceil((warm_ms or 0) / est))
    iters = math.max(iters, math.ceil((min_ms or 0) / est))
  end
  for _ = 1, warmup do fn() end
  local evs = {}
  for i = 1, iters + 1 do evs[i] = stream.event(device) end
  evs[1]:record()
  for i = 1, iters do
    fn()
    evs[i + 1]:record()
  end
  local times = {}
  for i = 1, iters do times[i] = evs[i]:elapsed(evs[i + 1]) end
  return M.stats(times, method_of(device, "device events, one call each"))
end

-- graph(fn, {ops = 10, warmup = 5, replays = 50, before =, device =}) -> stats (ms per call)
-- vLLM's method for its all-reduce benchmark: a graph of `ops` back-to-back
-- calls of fn, `warmup` replays, then `replays` replays each between two
-- events on the current stream; one call = a replay / ops. opts.before runs
-- before the timed replays (a barrier, so the ranks start together). On cpu
-- and meta there are no graphs: a replay calls the ops again (host time).
function M.graph(fn, opts)
  if type(fn) ~= "function" then fail("bench: first argument must be a function") end
  opts = args.options(opts, { "device", "ops", "warmup", "replays", "before" }, "bench.graph")
  local ops, warmup = count(opts, "ops", 10, 1), count(opts, "warmup", 5, 0)
  local replays = count(opts, "replays", 50, 1)
  local g = require("distlab.graph").capture(function()
    for _ = 1, ops do fn() end
  end, { device = opts.device })
  for _ = 1, warmup do g:replay() end
  if opts.before then opts.before() end
  local device = device_of(opts)
  local evs = {}
  for i = 1, replays + 1 do evs[i] = stream.event(device) end
  evs[1]:record()
  for i = 1, replays do
    g:replay()
    evs[i + 1]:record()
  end
  local times = {}
  for i = 1, replays do times[i] = evs[i]:elapsed(evs[i + 1]) / ops end
  g:free()
  return M.stats(times, method_of(device, string.format("a CUDA graph of %d calls a replay", ops)))
end

-- isolated(fn, {replays = 30, warmup = 3, before =, device =}) -> stats (ms per call)
-- DeepEP's and ep_bench_torch.py's isolated latency: a graph of one call of fn,
-- `warmup` replays, then each of `replays` replays alone: the L2 flushed (a
-- 256 MB buffer zeroed, made once a device: the call finds nothing of the one
-- before in the H200's 50 MB), the device synchronised, opts.before (a
-- barrier: the ranks start together), then the replay between two events,
-- waited for. On cpu and meta: host time, as graph().
local flush_buf = {} -- device -> the 256 MB buffer
function M.isolated(fn, opts)
  if type(fn) ~= "function" then fail("bench: first argument must be a function") end
  opts = args.options(opts, { "device", "warmup", "replays", "before" }, "bench.isolated")
  local warmup, replays = count(opts, "warmup", 3, 0), count(opts, "replays", 30, 1)
  local device = device_of(opts)
  local on_gpu = tostring(device):match("^cuda") ~= nil
  if on_gpu and not flush_buf[device] then
    flush_buf[device] = require("distlab").empty({ 64 * 2 ^ 20 }, { dtype = "i32", device = device })
  end
  local g = require("distlab.graph").capture(fn, { device = opts.device })
  for _ = 1, warmup do g:replay() end
  local e0, e1 = stream.event(device), stream.event(device)
  local times = {}
  for i = 1, replays do
    if on_gpu then flush_buf[device]:zero_() end
    stream.synchronize(device)
    if opts.before then opts.before() end
    e0:record()
    g:replay()
    e1:record()
    stream.synchronize(device) -- (polled within DISTLAB_TIMEOUT: a stuck peer ends in an error)
    times[i] = e0:elapsed(e1)
  end
  g:free()
  return M.stats(times, method_of(device, "one call alone: a graph of one call, after an L2 flush, a sync and a barrier"))
end

local pair = {} -- device -> two events, made once: event creation stays out of the timings
local now_us = core.C.dl_now_us

-- loop_once(fn, iters, {before =, device =, timeout = s}) -> device us, host us per call
-- nccl-tests' and nccl_loop.c's repetition: `before` (a barrier), an event,
-- `iters` calls back to back, an event, wait for it. Host us = the host's
-- time to issue one call: where it nears the device time, the loop is
-- host-bound.
function M.loop_once(fn, iters, opts)
  opts = args.options(opts, { "device", "before", "timeout" }, "bench.loop_once")
  local device = device_of(opts)
  local ev = pair[device]
  if not ev then
    ev = { stream.event(device), stream.event(device) }
    pair[device] = ev
  end
  if opts.before then opts.before() end
  ev[1]:record()
  local h0 = now_us()
  for _ = 1, iters do fn() end
  local host = (now_us() - h0) / iters
  ev[2]:record()
  ev[2]:synchronize(opts.timeout)
  return ev[1]:elapsed(ev[2]) * 1e3 / iters, host
end

-- host(fn, {warmup = 2000, batch = 256, batches = 200, sync = fn}) -> stats (us per call)
-- Calls issued in batches with sync() between them; only the issue time of
-- each batch counts, so the figure is the host's cost per call, not the
-- device's queue draining.
function M.host(fn, opts)
  opts = args.options(opts, { "warmup", "batch", "batches", "sync" }, "bench.host")
  local warmup, batch = count(opts, "warmup", 2000, 0), count(opts, "batch", 256, 1)
  local batches, sync = count(opts, "batches", 200, 1), opts.sync or function() end
  for _ = 1, warmup do fn() end
  sync()
  local samples = {}
  for b = 1, batches do
    local t0 = now_us()
    for _ = 1, batch do fn() end
    samples[b] = (now_us() - t0) / batch
    sync()
  end
  return M.stats(samples)
end

-- over_ranks(comm, v, op): v (a number or a list) reduced element-wise over
-- the ranks of comm, through comm itself (an f64 all_reduce on its device).
-- Without a communicator, with one rank, or on meta (where nothing moves)
-- v comes back as it is.
function M.over_ranks(comm, v, op)
  local list = type(v) == "table"
  if not comm or comm.size == 1 or comm.backend == "meta" then return v end
  local vals = list and v or { v }
  local t = require("distlab").from_table(vals, { dtype = "f64", device = comm.device })
  comm:all_reduce(t, op or "max")
  local out = t:tolist()
  if not list then return out[1] end
  return out
end

return M
