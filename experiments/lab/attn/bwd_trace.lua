-- experiments/lab/attn/bwd_trace.lua — the Hopper backward's per-warpgroup clock trace, on a library built
-- with HP_BWD_TRACE 1 (bwd_kernel.cuh; a lab build, never dl.attn's): b 2, h 16, s (--s), d (--d), bf16,
-- bshd, --mask none or causal. The backward timed by events (dl.bench.timing.events); then, where
-- DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE is set, three calls instead, the last one's sums in FILE
-- (experiments/lab/attn/bwd_trace.py reads it). Run it without the variable on dl.attn's library and on
-- the traced build (which sums its steps either way): the two times say how much the trace perturbs.
-- Nothing here is checked against a reference (a lab tool; attn_bench checks the same kernels).
--   ./distlab run -n 1 --device cuda experiments/lab/attn/bwd_trace.lua [--s 16384] [--d 128] [--mask none]
local dl = require "distlab"
local bench = dl.bench

local A = { s = 16384, d = 128, mask = "none" }
local i = 1
while i <= #arg do
  local k, v = arg[i]:match("^%-%-(%a+)$"), arg[i + 1]
  if not k or A[k] == nil or v == nil then dl.fail("bwd_trace: options --s N, --d N, --mask none|causal; got %s", arg[i]) end
  A[k] = type(A[k]) == "number" and tonumber(v) or v
  if A[k] == nil then dl.fail("bwd_trace: --%s wants a number, got %s", k, v) end
  i = i + 2
end
if A.mask ~= "none" and A.mask ~= "causal" then dl.fail("bwd_trace: --mask none or causal, got %s", A.mask) end

local dev = dl.default_device()
local function input(shape)
  return dl.rand(shape, { dtype = "f32", device = dev, low = -1, high = 1 }):to("bf16")
end
local shape = { 2, A.s, 16, A.d }
local q, k, v = input(shape), input(shape), input(shape)
local o = { layout = "bshd", mask = A.mask, backend = "ours" }
local out, lse = dl.attn.fwd(q, k, v, o)
local dout = input(out.shape)
local dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, o)
local bo = { layout = "bshd", mask = A.mask, backend = "ours", dq = dq, dk = dk, dv = dv }
local tracing = os.getenv("DISTLAB_ATTN_HOPPER_BWD_TRACE")
if not tracing then
  local st = bench.timing.events(function() dl.attn.bwd(dout, q, k, v, out, lse, bo) end,
    { warm_ms = 300, min_ms = 600, iters = 10 })
  print(string.format("bwd_trace: s %d, d %d, %s, %s: bwd %s", A.s, A.d, A.mask, dl.build_info(), tostring(st)))
else
  for _ = 1, 3 do dl.attn.bwd(dout, q, k, v, out, lse, bo) end
  dl.synchronize()
  print(string.format("bwd_trace: s %d, d %d, %s, %s: the last of 3 calls' sums in %s", A.s, A.d, A.mask,
    dl.build_info(), tracing))
end
