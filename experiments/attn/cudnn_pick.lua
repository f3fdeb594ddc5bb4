-- experiments/attn/cudnn_pick.lua — which libcudnn is this, and how fast is it
-- here: one causal bf16 forward + backward through dl.attn's "cudnn" backend
-- (b=2, h=16, d=128, s=8k, bshd), the median of 10 device-event timings
-- after 3 warm-up calls. Checked after timing: the timed call once more on
-- fresh inputs with out, lse, dq, dk, dv poisoned, against fp64 on the host
-- at sampled rows (distlab.bench.attn_rows: >= 1e5 elements of out and dq,
-- key rows for dk and dv; normwise 8e-3, lse 1e-5, bias 2^-10, TE's bf16 tolerance
-- element-wise); a library that fails it prints no pick line and exits 1.
-- scripts/gpu/cudnn.sh runs it once per candidate library (DISTLAB_CUDNN)
-- and keeps the fastest. Prints one line:
--   pick ms=<median> version=<cudnnGetVersion> path=<file> build_ms=<plan builds>
-- cuda only (elsewhere it says it checks nothing); --quick: s = 256;
-- --plant noop | scale=X must fail the check.
--   ./distlab run -n 1 --device cuda experiments/attn/cudnn_pick.lua [S]
local dl = require "distlab"
local rows_ref = require "distlab.bench.attn_rows"

local argv, S = {}, nil
for i, a in ipairs(arg or {}) do
  if i == 1 and tonumber(a) then S = tonumber(a) else argv[#argv + 1] = a end
end
local h = dl.bench.harness {
  name = "cudnn_pick", family = "attn", writes = false, argv = argv,
  usage = "./distlab run -n 1 --device cuda experiments/attn/cudnn_pick.lua [S] [--quick]",
  about = "one causal bf16 fwd + bwd on dl.attn's cudnn backend, timed and checked; see the file's header",
}
if not dl.default_device():match("^cuda") then
  h:unchecked("cuDNN runs on cuda only: nothing timed here")
  h:finish()
  return
end
local s = S or (h.quick and 256 or 8192)
local function input() return dl.rand({ 2, s, 16, 128 }, { dtype = "f32", device = "cuda", low = -1, high = 1 }):to("bf16") end
local q, k, v = input(), input(), input()
local o = { mask = "causal", backend = "cudnn" }
local out, lse = dl.attn.fwd(q, k, v, o)
local dout = input()
local dq, dk, dv = dl.attn.bwd(dout, q, k, v, out, lse, o)
local fo, bo = { mask = "causal", backend = "cudnn", out = out, lse = lse },
  { mask = "causal", backend = "cudnn", dq = dq, dk = dk, dv = dv }
local fwd = h:planted(function() dl.attn.fwd(q, k, v, fo) end, { writes = { out, lse } })
local bwd = h:planted(function() dl.attn.bwd(dout, q, k, v, out, lse, bo) end, { writes = { dq, dk, dv } })
local function fwdbwd()
  fwd()
  bwd()
end
local t = dl.bench.timing.events(fwdbwd, { warmup = 3, iters = 10 }).median
local wrong = h:verify {
  what = string.format("cudnn causal bf16 s=%d", s),
  fresh = function()
    for i, x in ipairs({ q, k, v, dout }) do
      x:copy_(dl.rand(x.shape, { dtype = "f32", device = "cuda", low = -1, high = 1, seed = 4242 + i }))
    end
  end,
  poison = { out, lse, dq, dk, dv },
  run = fwdbwd,
  check = function()
    local R = rows_ref.prepare { q = q, k = k, v = v, dout = dout, opts = { mask = "causal" }, seed = 5 }
    return R:check { out = out, lse = lse, dq = dq, dk = dk, dv = dv }
  end,
}
local i = dl.attn.cudnn_info()
if wrong == 0 then
  print(string.format("pick ms=%.3f version=%d path=%s build_ms=%.0f", t, i.version, i.path, i.build_ms))
end
h:finish()
