-- experiments/foundation/overhead.lua — host cost of one distlab op called
-- from Lua: t:fill_(v) on a 1-element tensor, on the cpu and on every GPU
-- present.
--   ./distlab run experiments/foundation/overhead.lua [--out DIR] [--tag NAME]
-- Method (dl.bench.timing.host): 2000 warm-up calls, then batches of calls
-- with a synchronize between batches (10000 x 50 on the host and cpu, 256 x
-- 200 on a GPU), and only the issue time of each batch counted, so the
-- figure is the host's cost per launch, not the GPU's queue draining; the
-- median over batches. The last GPU row is the end-to-end rate when the GPU
-- runs every launch (10000 back to back, then a synchronize). Data checked
-- after timing, op by op: the timed callable once more on a fresh value
-- (fill_: a new v, the tensor poisoned (NaN) first; add_: new t and u), read
-- back against the value computed on the host (exact: dyadic values whose
-- sums f32 holds). fill_(0) takes the memset path, so it is checked with 0,
-- where a scaled result is still right (--plant scale=X fails the others).
-- The FFI call row calls no op (nothing to check). --quick: fewer batches;
-- --plant noop|scale=X: an error in every timed op, which the check must
-- report (exit code 1). Prints the table; writes DIR/overhead-TAG.{md,csv}
-- (default experiments/results/foundation; TAG the GPU model, e.g. h200, or cpu).
-- experiments/foundation/overhead_torch.py measures PyTorch eager the same way.
local dl = require "distlab"
local bench = dl.bench
local verify = require "distlab.bench.verify"

local n = dl.cuda_device_count()
local h = bench.harness {
  name = "overhead", family = "foundation", tag = true,
  usage = "./distlab run experiments/foundation/overhead.lua [options]",
  about = "host cost of one distlab op called from Lua, on the cpu and every GPU present",
  options = {},
}
if not h.given.tag then h.tag = n > 0 and (dl.cuda_device_name(0):match("([AHBL]%d+)") or "gpu"):lower() or "cpu" end
h.device_desc = n > 0 and string.format("cpu and %d x %s", n, dl.cuda_device_name(0)) or "cpu"

local function per_call(fn, sync, batch, batches)
  if h.quick then batch, batches = math.min(batch, 256), 5 end
  return bench.timing.host(fn, { warmup = h.quick and 100 or 2000, batch = batch, batches = batches, sync = sync })
    .median
end

local tbl = h:table({ { "device", "%-28s" }, { "op", "%-34s" }, { "us", "%8.3f", unit = "per call" } })
tbl:header(string.format("distlab op overhead, %s, %s", bench.markdown.date(), dl.build_info()))
local rows = {}
local function add(device, what, us)
  rows[#rows + 1] = { device, what, string.format("%.3f", us) }
  tbl:row({ device, what, us })
end

-- after timing, the timed callables once more on fresh values: checks number c
-- draws dyadic values (k / 8, |k| <= 800: exact in f32, and so are their sums)
local checks, wrong = 0, 0
local function fresh_value()
  checks = checks + 1
  local v = ((checks * 7919) % 1601 - 800) / 8
  return v ~= 0 and v or 0.125 -- not 0: a scaled 0 is still right
end
local function exactly(t, want)
  return verify.close(t, dl.full({ 1 }, want, { dtype = "f64", device = "cpu" }), { atol = 0, rtol = 0 })
end
-- fill: the timed t:fill_(state.v) (state.v = 1 while timing); zero: fill_(0), the memset path
local function check_fill(what, fill, t, state, zero)
  wrong = wrong + h:verify { what = what,
    fresh = function() state.v = zero and 0 or fresh_value() end, poison = { t }, run = fill,
    check = function() return exactly(t, state.v) end }
  state.v = 1
end
-- add: the timed t:add_(u), in place (t is its input: not poisoned)
local function check_add(what, add, t, u)
  local a, b
  wrong = wrong + h:verify { what = what,
    fresh = function()
      a, b = fresh_value(), fresh_value()
      t:fill_(a)
      u:fill_(b)
    end, run = add,
    check = function() return exactly(t, a + b) end }
  u:fill_(1)
end

local noop = function() end
add("host", "FFI call dl_abi_version()", per_call(function() dl.C.dl_abi_version() end, noop, 10000, 50))

local c = dl.empty(1, { device = "cpu" })
local cs = { v = 1 }
local cfill = h:planted(function() c:fill_(cs.v) end, { writes = { c } })
add("cpu", "t:fill_(1), 1 element", per_call(cfill, noop, 10000, 50))
check_fill("cpu fill_", cfill, c, cs)
local cu = dl.ones(1, { device = "cpu" })
local cadd = h:planted(function() c:add_(cu) end, { writes = { c } })
add("cpu", "t:add_(u), 1 element", per_call(cadd, noop, 10000, 50))
check_add("cpu add_", cadd, c, cu)

for i = 0, n - 1 do
  local dev = "cuda:" .. i
  local name = dl.cuda_device_name(i)
  local g = dl.empty(1, { device = dev })
  local sync = function() dl.synchronize(dev) end
  local gs = { v = 1 }
  local gfill = h:planted(function() g:fill_(gs.v) end, { writes = { g } })
  add(dev .. " " .. name, "t:fill_(1), 1 element (kernel)", per_call(gfill, sync, 256, 200))
  check_fill(dev .. " fill_", gfill, g, gs)
  local gzero = h:planted(function() g:fill_(0) end, { writes = { g } })
  add(dev .. " " .. name, "t:fill_(0), 1 element (memset)", per_call(gzero, sync, 256, 200))
  check_fill(dev .. " fill_(0)", gzero, g, {}, true)
  local u = dl.ones(1, { device = dev })
  local gadd = h:planted(function() g:add_(u) end, { writes = { g } })
  add(dev .. " " .. name, "t:add_(u), 1 element", per_call(gadd, sync, 256, 200))
  check_add(dev .. " add_", gadd, g, u)
  -- end-to-end rate when the GPU runs every launch: issue + execute
  local calls = h.quick and 1000 or 10000
  local t0 = dl.now_us()
  for _ = 1, calls do gfill() end
  sync()
  add(dev .. " " .. name, "t:fill_(1) back to back (issue+run)", (dl.now_us() - t0) / calls)
  check_fill(dev .. " fill_, back to back", gfill, g, gs)
end

local csv = h:csv("overhead-" .. h.tag .. ".csv", { "device", "op", "us_per_call" }, rows)
local path = h:markdown("overhead-" .. h.tag .. ".md", "distlab op overhead: " .. h.tag,
  bench.markdown.table({ "device", "op", "us per call" }, rows, { "l", "l", "r" }), {
    "build: " .. dl.build_info(),
    "method: 2000 warm-up calls; batches of calls (10000 x 50 on the host and cpu, 256 x 200 on a GPU) with a " ..
      "synchronize between them, only the issue time counted; median over batches",
    "data checked after timing (each timed op once more on fresh values, exact): " ..
      (wrong == 0 and "ok" or (wrong .. " wrong")) })
print("wrote " .. csv .. " and " .. path)
h:finish()
