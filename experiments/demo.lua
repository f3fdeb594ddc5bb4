-- A short tour of distlab: `./distlab demo`. Runs on the GPU when there is
-- one, else on the cpu device; prints what it measured and where.
local dl = require "distlab"

local dev = dl.default_device()
local n, why = dl.cuda_device_count()
print(string.format("distlab demo on %s — %s", dev, dl.build_info()))
if n == 0 then print("  (no GPU: " .. why .. "; running on the cpu device)") end
if dev:match("^cuda") then print("  GPU: " .. dl.cuda_device_name(tonumber(dev:match("%d+")))) end

-- tensors, views, dtypes
local x = dl.randn(4, 6, { seed = 1, device = dev })
print("\nx = dl.randn(4, 6) on " .. dev .. ":")
print(x)
print("x:narrow(2, 2, 3):transpose(1, 2) — a view, no copy:")
print(x:narrow(2, 2, 3):transpose(1, 2))
local xb = x:to("bf16")
print(string.format("bf16 round trip: rel err %.2e (bf16 keeps 8 bits)", dl.rel_err(xb:to("f32"), x)))

-- memory accounting by tag, in units of one tensor
local B, S, H, D = 2, 4096, 16, 128
local unit = B * S * H * D * 2
dl.mem.reset_peak(dev)
local kept = {}
dl.mem.tag("inputs", function()
  for i = 1, 3 do kept[i] = dl.empty(B, S, H, D, { dtype = "bf16", device = dev }) end
end)
dl.mem.tag("comm_buffers", function()
  for i = 1, 2 do kept[#kept + 1] = dl.empty(2, B, S, H, D, { dtype = "bf16", device = dev }) end
end)
dl.mem.tag("workspace", function()
  local tmp = dl.empty(B, S, H, D, { dtype = "f32", device = dev })
  tmp:free()
end)
print("\nmemory by tag (unit = one [B, S, H, D] bf16 tensor = " .. unit / 1048576 .. " MiB):")
print(dl.mem.report { device = dev, unit = unit })
for _, t in ipairs(kept) do t:free() end

-- the same schedule's memory at a size this machine could never hold
local big = dl.empty(2, 262144, 16, 128, { dtype = "bf16", device = "meta" })
print(string.format("\nmeta device: a [2, 262144, 16, 128] bf16 tensor is accounted (%.0f MiB) and never allocated",
  big:nbytes() / 1048576))

-- timing with device events
local y = dl.empty(16777216, { device = dev })
local r = dl.bench(function() y:fill_(1) end, { warmup = 3, iters = 20, device = dev })
print(string.format("\nfill of %d MiB on %s: median %.3f ms (min %.3f, max %.3f) = %.1f GB/s, measured %s",
  y:nbytes() / 1048576, dev, r.median, r.min, r.max, y:nbytes() / r.median / 1e6, os.date("!%Y-%m-%d %H:%M UTC")))
