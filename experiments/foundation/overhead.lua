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
-- after timing: fill_(1) then add_ of a ones tensor read back 2 on every
-- device. Prints the table; writes DIR/overhead-TAG.{md,csv} (default
-- experiments/results/foundation; TAG the GPU model, e.g. h200, or cpu).
-- experiments/foundation/overhead_torch.py measures PyTorch eager the same way.
local dl = require "distlab"
local bench = dl.bench

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
  return bench.timing.host(fn, { warmup = 2000, batch = batch, batches = batches, sync = sync }).median
end

local tbl = h:table({ { "device", "%-28s" }, { "op", "%-34s" }, { "us", "%8.3f", unit = "per call" } })
tbl:header(string.format("distlab op overhead, %s, %s", bench.markdown.date(), dl.build_info()))
local rows = {}
local function add(device, what, us)
  rows[#rows + 1] = { device, what, string.format("%.3f", us) }
  tbl:row({ device, what, us })
end

-- after timing: t = 1, then t + u with u = 1 reads back 2
local function check(t, u)
  return h:check(function()
    t:fill_(1)
    t:add_(u)
    return t:item() == 2 and 0 or 1
  end)
end

local noop = function() end
add("host", "FFI call dl_abi_version()", per_call(function() dl.C.dl_abi_version() end, noop, 10000, 50))

local c = dl.empty(1, { device = "cpu" })
add("cpu", "t:fill_(1), 1 element", per_call(function() c:fill_(1) end, noop, 10000, 50))
local cu = dl.ones(1, { device = "cpu" })
add("cpu", "t:add_(u), 1 element", per_call(function() c:add_(cu) end, noop, 10000, 50))
local wrong = check(c, cu)

for i = 0, n - 1 do
  local dev = "cuda:" .. i
  local name = dl.cuda_device_name(i)
  local g = dl.empty(1, { device = dev })
  local sync = function() dl.synchronize(dev) end
  add(dev .. " " .. name, "t:fill_(1), 1 element (kernel)", per_call(function() g:fill_(1) end, sync, 256, 200))
  add(dev .. " " .. name, "t:fill_(0), 1 element (memset)", per_call(function() g:fill_(0) end, sync, 256, 200))
  local u = dl.ones(1, { device = dev })
  add(dev .. " " .. name, "t:add_(u), 1 element", per_call(function() g:add_(u) end, sync, 256, 200))
  -- end-to-end rate when the GPU runs every launch: issue + execute
  local t0 = dl.now_us()
  for _ = 1, 10000 do g:fill_(1) end
  sync()
  add(dev .. " " .. name, "t:fill_(1) back to back (issue+run)", (dl.now_us() - t0) / 10000)
  wrong = wrong + check(g, u)
end

local csv = h:csv("overhead-" .. h.tag .. ".csv", { "device", "op", "us_per_call" }, rows)
local path = h:markdown("overhead-" .. h.tag .. ".md", "distlab op overhead: " .. h.tag,
  bench.markdown.table({ "device", "op", "us per call" }, rows, { "l", "l", "r" }), {
    "build: " .. dl.build_info(),
    "method: 2000 warm-up calls; batches of calls (10000 x 50 on the host and cpu, 256 x 200 on a GPU) with a " ..
      "synchronize between them, only the issue time counted; median over batches",
    "data checked after timing: " .. (wrong == 0 and "ok" or (wrong .. " devices wrong")) })
print("wrote " .. csv .. " and " .. path)
h:finish()
