-- Host cost of one distlab op called from Lua: t:fill_(v) on a 1-element
-- tensor, on the cpu and on every GPU present. Usage:
--   ./distlab run experiments/overhead.lua [out.md]
-- On a GPU the calls are issued in batches of 256 with a synchronize between
-- batches, and only the issue time of each batch is counted, so the figure is
-- the host's cost per launch, not the GPU's queue draining. Prints a table;
-- with an argument, also writes it as markdown.
local dl = require "distlab"

local now_us = dl.now_us

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

-- median over batches of the per-call issue time, in microseconds
local function per_call(fn, sync, batch, batches)
  for _ = 1, 2000 do fn() end -- warm up: JIT traces, CUDA module load
  sync()
  local samples = {}
  for b = 1, batches do
    local t0 = now_us()
    for _ = 1, batch do fn() end
    samples[b] = (now_us() - t0) / batch
    sync()
  end
  return median(samples)
end

local rows = {}
local function add(device, what, us)
  rows[#rows + 1] = { device = device, what = what, us = us }
  print(string.format("%-28s %-34s %8.3f us", device, what, us))
end

print(string.format("distlab op overhead, %s, %s", os.date("!%Y-%m-%d %H:%M UTC"), dl.build_info()))
local noop = function() end
add("host", "FFI call dl_abi_version()", per_call(function() dl.C.dl_abi_version() end, noop, 10000, 50))

local c = dl.empty(1, { device = "cpu" })
add("cpu", "t:fill_(1), 1 element", per_call(function() c:fill_(1) end, noop, 10000, 50))
local cu = dl.empty(1, { device = "cpu" })
add("cpu", "t:add_(u), 1 element", per_call(function() c:add_(cu) end, noop, 10000, 50))

local n = dl.cuda_device_count()
for i = 0, n - 1 do
  local dev = "cuda:" .. i
  local name = dl.cuda_device_name(i)
  local g = dl.empty(1, { device = dev })
  local sync = function() dl.synchronize(dev) end
  add(dev .. " " .. name, "t:fill_(1), 1 element (kernel)", per_call(function() g:fill_(1) end, sync, 256, 200))
  add(dev .. " " .. name, "t:fill_(0), 1 element (memset)", per_call(function() g:fill_(0) end, sync, 256, 200))
  local h = dl.empty(1, { device = dev })
  add(dev .. " " .. name, "t:add_(u), 1 element", per_call(function() g:add_(h) end, sync, 256, 200))
  -- end-to-end rate when the GPU runs every launch: issue + execute
  local t0 = now_us()
  for _ = 1, 10000 do g:fill_(1) end
  sync()
  add(dev .. " " .. name, "t:fill_(1) back to back (issue+run)", (now_us() - t0) / 10000)
end

local out = arg and arg[1]
if out then
  local f = assert(io.open(out, "w"))
  f:write("| device | op | us per call |\n|---|---|---|\n")
  for _, r in ipairs(rows) do f:write(string.format("| %s | %s | %.3f |\n", r.device, r.what, r.us)) end
  f:close()
end
