-- experiments/lab/attn/bwd_trace.lua — the driver of the Hopper backward's per-warpgroup trace, on a
-- library built with the lab flag HP_BWD_TRACE 1 (bwd_kernel.cuh; never dl.attn's own build): b 2, h 16,
-- s (--s), d (--d), bf16, bshd, --mask none or causal; four backward calls, the last one's sums in FILE
-- (DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE; experiments/lab/attn/bwd_trace.py reads it). It times nothing and
-- checks nothing: what the trace costs, attn_bench says with its data check (scripts/gpu/attn_ab.sh with the
-- traced build as a variant against dl.attn's library).
--   DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE ./distlab run -n 1 --device cuda experiments/lab/attn/bwd_trace.lua [--s 16384] [--d 128] [--mask none]
local dl = require "distlab"

local options = require "distlab.bench.options"
local parser = options.new({
  { "s", "int", 16384, "sequence length" },
  { "d", "int", 128, "head dim" },
  { "mask", "choice", "none", "the mask", values = { "none", "causal" } },
}, { program = "bwd_trace", usage = "DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE ./distlab run -n 1 --device cuda "
  .. "experiments/lab/attn/bwd_trace.lua [--s 16384] [--d 128] [--mask none]",
  about = "the Hopper backward's per-warpgroup trace sums (a library built with HP_BWD_TRACE 1); see the file's header" })
local A = parser:parse(arg)
if A.help then return print(parser:help()) end
local file = os.getenv("DISTLAB_ATTN_HOPPER_BWD_TRACE")
if not file then dl.fail("bwd_trace: set DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE (and load a library built with HP_BWD_TRACE 1)") end

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
for _ = 1, 3 do dl.attn.bwd(dout, q, k, v, out, lse, bo) end
dl.synchronize()
print(string.format("bwd_trace: s %d, d %d, %s, %s: the last of 4 backward calls' sums in %s (where the library was built with HP_BWD_TRACE 1)",
  A.s, A.d, A.mask, dl.build_info(), file))
