-- experiments/attn/cudnn_pick.lua — which libcudnn is this, and how fast is it
-- here: one causal bf16 forward + backward through dl.attn's "cudnn" backend
-- (b=2, h=16, d=128, s=8k, bshd), the median of 10 device-event timings
-- after 3 warm-up calls, checked against our kernel (TE's bf16 tolerance).
-- scripts/gpu/cudnn.sh runs it once per candidate library (DISTLAB_CUDNN)
-- and keeps the fastest. Prints one line:
--   pick ms=<median> version=<cudnnGetVersion> path=<file> build_ms=<plan builds>
local dl = require "distlab"
local s = tonumber(arg and arg[1]) or 8192
local function input() return dl.rand({ 2, s, 16, 128 }, { dtype = "f32", device = "cuda", low = -1, high = 1 }):to("bf16") end
local q, k, v = input(), input(), input()
local o = { mask = "causal", backend = "cudnn" }
local out, lse = dl.attn.fwd(q, k, v, o)
local dout = input()
local dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, o)
local fo, bo = { mask = "causal", backend = "cudnn", out = out, lse = lse },
  { mask = "causal", backend = "cudnn", dq = dq, dk = dk, dv = dv }
local t = dl.bench.timing.events(function()
  dl.attn.fwd(q, k, v, fo)
  dl.attn.bwd(dout, q, k, v, out, lse, bo)
end, { warmup = 3, iters = 10 }).median
local ro, rl = dl.attn.fwd(q, k, v, { mask = "causal" })
local bad = dl.mismatch_report(out, ro, 2.5e-2, 2.5e-2, 3) or dl.mismatch_report(lse, rl, 2.5e-2, 2.5e-2, 3)
if bad then dl.fail("cudnn_pick: cuDNN's result differs from ours: %s", bad) end
local i = dl.attn.cudnn_info()
print(string.format("pick ms=%.3f version=%d path=%s build_ms=%.0f", t, i.version, i.path, i.build_ms))
