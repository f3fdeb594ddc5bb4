-- TFLOP/s of dl.attn.fwd, bwd and fwd+bwd: b=2, h=16, d=128, bf16, s in
-- {4k, 8k, 16k, 32k}, causal and not, bshd and thd (thd: b sequences of s
-- tokens packed, max_seqlen given so nothing syncs). Times are medians of
-- device events around each call (dl.bench). FLOPs: fwd 4*b*h*s^2*d, halved
-- when causal; bwd 2.5x fwd; fwd+bwd 3.5x fwd.
-- Data checked after timing: every result finite, and the same call at a
-- small shape (s=333, h=2, beyond one tile) equal to the cpu twin within
-- TransformerEngine's bf16 tolerance. Runs on any device (--device cpu with
-- small --s for a smoke test of the script).
--   ./distlab run -n 1 --device cuda experiments/attn_bench.lua [--s 4096,8192]
--       [--iters 10] [--out md] [--csv csv] [--torch torch.csv --combined md]
-- --torch reads experiments/attn_bench_torch.py's CSV and writes --combined:
-- one table with PyTorch SDPA's flash and cuDNN backends beside ours.
local dl = require "distlab"

local B, NH, D = 2, 16, 128

local function args_of(list)
  local a = { s = "4096,8192,16384,32768", iters = "10", out = "experiments/results/attn-distlab.md",
    csv = "experiments/results/attn-distlab.csv" }
  local i = 1
  while i <= #list do
    local k = list[i]:match("^%-%-([%w_]+)$")
    if not k or list[i + 1] == nil then dl.fail("attn_bench: bad argument %s", list[i]) end
    a[k] = list[i + 1]
    i = i + 2
  end
  a.sizes = {}
  for n in a.s:gmatch("%d+") do a.sizes[#a.sizes + 1] = tonumber(n) end
  a.iters = tonumber(a.iters)
  return a
end

local A = args_of(arg or {})
local dev = dl.default_device()
local command = string.format("./distlab run -n 1 --device %s experiments/attn_bench.lua %s",
  dev:match("^cuda") and "cuda" or dev, table.concat(arg or {}, " "))
local gpu = dev:match("^cuda") and dl.cuda_device_name(tonumber(dev:match("%d+")) or 0) or dev

-- uniform(-1, 1) inputs, made on the device they are used on
local function input(shape, device)
  return dl.rand(shape, { dtype = "f32", device = device, low = -1, high = 1 }):to("bf16")
end

-- Inputs and options of one configuration.
local function setup(layout, s, causal, h, device)
  local shape = layout == "thd" and { B * s, h, D } or { B, s, h, D }
  local x = { q = input(shape, device), k = input(shape, device), v = input(shape, device) }
  x.opts = { layout = layout, mask = causal and "causal" or "none" }
  if layout == "thd" then
    local cu = dl.from_table({ 0, s, 2 * s }, { dtype = "i32", device = device })
    x.opts.cu_seqlens_q, x.opts.cu_seqlens_kv = cu, cu
    x.opts.max_seqlen_q, x.opts.max_seqlen_kv = s, s
  end
  return x
end

local function with(t, extra)
  local r = {}
  for k, v in pairs(t) do r[k] = v end
  for k, v in pairs(extra) do r[k] = v end
  return r
end

local function finite(t)
  local r = dl.compare(t, t)
  return r.n_nonfinite_a == 0
end

-- The same call on the GPU and the cpu twin at a small shape.
local function check_small(layout, causal)
  local x = setup(layout, 333, causal, 2, "cpu")
  local g = { q = x.q:to(dev), k = x.k:to(dev), v = x.v:to(dev), opts = with(x.opts, {}) }
  for _, k in ipairs({ "cu_seqlens_q", "cu_seqlens_kv" }) do
    if x.opts[k] then g.opts[k] = x.opts[k]:to(dev) end
  end
  g.opts.max_seqlen_q, g.opts.max_seqlen_kv = x.opts.max_seqlen_q, x.opts.max_seqlen_kv
  local o, l = dl.attn.fwd(g.q, g.k, g.v, g.opts)
  local dout = input(o.shape, "cpu")
  local dq, dk, dv = dl.attn.bwd(dout:to(dev), g.q, g.k, g.v, o, l, g.opts)
  local ro, rl = dl.attn.fwd(x.q, x.k, x.v, x.opts)
  local rq, rk, rv = dl.attn.bwd(dout, x.q, x.k, x.v, o:cpu(), l:cpu(), x.opts)
  local bad = {}
  for name, pair in pairs({ out = { ro, o }, lse = { rl, l }, dq = { rq, dq }, dk = { rk, dk }, dv = { rv, dv } }) do
    local rep = dl.mismatch_report(pair[2], pair[1], 2.5e-2, 2.5e-2, 2)
    if rep then bad[#bad + 1] = name .. ": " .. rep end
  end
  return #bad == 0 and "ok" or ("WRONG " .. table.concat(bad, "; "))
end

local rows = {}
print(string.format("distlab attention, %s, %s, %s", gpu, os.date("!%Y-%m-%d %H:%M UTC"), dl.build_info()))
print(string.format("%-6s %-7s %6s  %9s %9s %9s  %8s %8s %8s  %s", "layout", "mask", "s", "fwd ms", "bwd ms",
  "f+b ms", "fwd TF/s", "bwd TF/s", "f+b TF/s", "check"))
for _, layout in ipairs({ "bshd", "thd" }) do
  for _, causal in ipairs({ false, true }) do
    local checked = check_small(layout, causal)
    for _, s in ipairs(A.sizes) do
      local x = setup(layout, s, causal, NH, dev)
      local o = x.opts
      local out, lse = dl.attn.fwd(x.q, x.k, x.v, o)
      local dout = input(out.shape, dev)
      local dq, dk, dv = dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, o)
      local fo, bo = with(o, { out = out, lse = lse }), with(o, { dq = dq, dk = dk, dv = dv })
      local bench = { warmup = 3, iters = A.iters }
      local tf = dl.bench(function() dl.attn.fwd(x.q, x.k, x.v, fo) end, bench).median
      local tb = dl.bench(function() dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, bo) end, bench).median
      local tfb = dl.bench(function()
        dl.attn.fwd(x.q, x.k, x.v, fo)
        dl.attn.bwd(dout, x.q, x.k, x.v, out, lse, bo)
      end, bench).median
      local ok = checked
      for _, t in ipairs({ out, lse, dq, dk, dv }) do
        if not finite(t) then ok = "NON-FINITE" end
      end
      local flops = 4 * B * NH * s * s * D * (causal and 0.5 or 1)
      local r = { layout = layout, mask = causal and "causal" or "none", s = s, fwd_ms = tf, bwd_ms = tb,
        fwdbwd_ms = tfb, fwd = flops / tf / 1e9, bwd = 2.5 * flops / tb / 1e9, fwdbwd = 3.5 * flops / tfb / 1e9,
        check = ok }
      rows[#rows + 1] = r
      print(string.format("%-6s %-7s %6d  %9.3f %9.3f %9.3f  %8.1f %8.1f %8.1f  %s", r.layout, r.mask, s, tf, tb,
        tfb, r.fwd, r.bwd, r.fwdbwd, ok))
      x, out, lse, dout, dq, dk, dv, fo, bo = nil
      collectgarbage("collect")
    end
  end
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local header = string.format("Device: %s. Date: %s. Build: %s.\nCommand: `%s`\n\n" ..
  "b=%d, h=%d, d=%d, bf16; FLOPs fwd 4*b*h*s^2*d (halved when causal), bwd 2.5x, fwd+bwd 3.5x; " ..
  "median of %d device-event timings after 3 warm-up calls.\n\n", gpu, os.date("!%Y-%m-%d %H:%M UTC"),
  dl.build_info(), command, B, NH, D, A.iters)

local md = { "# distlab attention (dl.attn)\n\n", header,
  "| layout | mask | s | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s | check |\n",
  "|---|---|---|---|---|---|---|---|---|---|\n" }
local csv = { "impl,layout,mask,s,fwd_ms,bwd_ms,fwdbwd_ms,fwd_tflops,bwd_tflops,fwdbwd_tflops\n" }
for _, r in ipairs(rows) do
  md[#md + 1] = string.format("| %s | %s | %d | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f | %s |\n", r.layout, r.mask,
    r.s, r.fwd_ms, r.bwd_ms, r.fwdbwd_ms, r.fwd, r.bwd, r.fwdbwd, r.check)
  csv[#csv + 1] = string.format("distlab,%s,%s,%d,%.4f,%.4f,%.4f,%.2f,%.2f,%.2f\n", r.layout, r.mask, r.s,
    r.fwd_ms, r.bwd_ms, r.fwdbwd_ms, r.fwd, r.bwd, r.fwdbwd)
end
write(A.out, table.concat(md))
write(A.csv, table.concat(csv))

-- ---- the combined table -------------------------------------------------------------

if not A.torch then return end
local torch = {}
local f = io.open(A.torch)
if not f then dl.fail("attn_bench: cannot read %s", A.torch) end
local torch_head = f:read("*l")
for line in f:lines() do
  local impl, layout, mask, s, _, _, _, tf, tb, tfb = line:match(("([^,]*),"):rep(9) .. "([^,]*)")
  local function num(x) local v = tonumber(x) return v and v == v and v or nil end -- "nan": did not run
  if impl then torch[impl .. "/" .. layout .. "/" .. mask .. "/" .. s] = { num(tf), num(tb), num(tfb) } end
end
f:close()
assert(torch_head and torch_head:match("^impl,"), "attn_bench: " .. A.torch .. " is not attn_bench_torch.py's CSV")

local function cell(v) return v and string.format("%.0f", v) or "—" end
local out = { "# Attention: distlab vs PyTorch SDPA (flash, cuDNN)\n\n", header,
  "PyTorch numbers from `experiments/attn_bench_torch.py` in the same run (SDPA on [b, h, s, d] views of ",
  "bshd tensors; SDPA has no thd path, so thd rows show its bshd numbers: the same work, b sequences of s). ",
  "TFLOP/s; target (issue 4): ours >= flash forward and backward at every s >= 8k.\n\n",
  "| layout | mask | s | ours fwd | ours bwd | ours f+b | flash fwd | flash bwd | flash f+b | cuDNN fwd | cuDNN bwd | cuDNN f+b | vs flash f+b | target |\n",
  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n" }
local short = {}
for _, r in ipairs(rows) do
  local fl = torch["flash/bshd/" .. r.mask .. "/" .. r.s] or {}
  local cu = torch["cudnn/bshd/" .. r.mask .. "/" .. r.s] or {}
  local target = "—"
  if r.s >= 8192 and fl[1] and fl[2] then target = (r.fwd >= fl[1] and r.bwd >= fl[2]) and "met" or "below" end
  local ratio = fl[3] and string.format("%.2fx", r.fwdbwd / fl[3]) or "—"
  out[#out + 1] = string.format("| %s | %s | %d | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n",
    r.layout, r.mask, r.s, r.fwd, r.bwd, r.fwdbwd, cell(fl[1]), cell(fl[2]), cell(fl[3]), cell(cu[1]), cell(cu[2]),
    cell(cu[3]), ratio, target)
  short[#short + 1] = string.format("%-4s %-6s %6d  ours %4.0f/%4.0f  flash %4s/%4s  cudnn %4s/%4s  %s",
    r.layout, r.mask, r.s, r.fwd, r.bwd, cell(fl[1]), cell(fl[2]), cell(cu[1]), cell(cu[2]), target)
end
out[#out + 1] = "\nGap to cuDNN and the plan to close it: experiments/lab/attn/NOTES.md.\n"
write(A.combined or "experiments/results/attn-combined.md", table.concat(out))
print("\nTFLOP/s fwd/bwd (target: ours >= flash at s >= 8k)")
for _, l in ipairs(short) do print(l) end
