-- experiments/attn/attn_prof.lua — the profile driver of our attention kernels for issue 52's
-- item 0 (experiments/lab/attn/FA4-GAP.md, "0. Profile FA4 and ours side by side"): one shape
-- (b=2, h=16, bf16, --s, --d, --mask, --layout), dl.attn.fwd exactly --calls times, then
-- dl.attn.bwd exactly --calls times, so that Nsight Compute's --kernel-name filter with
-- --launch-skip (which counts only the launches that match) picks a known call:
-- scripts/gpu/attn_prof.sh profiles the last fwd_kernel and the last bwd_kernel
-- (--launch-skip CALLS-1 --launch-count 1). It prints what dl.attn.backends says runs and the
-- launches each call makes: on an sm_90 device the forward is one fwd_kernel
-- (kernels/attn/hopper/attn_hopper.cu), the backward a prep kernel (bwd_prep_kernel where
-- dl_attn_bwd_hopper_preps takes the Hopper prep, else attn_bwd_prep_kernel: kernels/attn/
-- attn_bwd.cu), then bwd_kernel, then bwd_dq_kernel. Outputs are preallocated and handed in
-- (no fills of fresh thd outputs) and thd's max_seqlen given (no read of cu_seqlens), so
-- dl.attn launches nothing else. Inputs are drawn (uniform(-1, 1), on the device) and every
-- output poisoned (NaN) before the first call, kernels of other names; after the last call,
-- out, lse, dq, dk, dv are checked against fp64 on the host at sampled rows
-- (distlab.bench.attn_rows, as attn_bench.lua checks: --check-elements). --plant noop |
-- scale=X goes into every call and must fail the check. Exit code 1 on a mismatch. Runs on any device
-- (--device cpu with a small --s: the fp64 twin, no kernels; --quick: s 64, h 2). --stamp (for
-- scripts/gpu/attn_clock.sh, not for ncu): one warm-up call of each first, then "stamp fwd start",
-- "fwd end", "bwd start", "bwd end" lines, each after the device is synchronized.
--   ./distlab run -n 1 --device cuda experiments/attn/attn_prof.lua --s 8192 --d 128 \
--       --mask causal|none --layout bshd|thd [--calls 3]
local dl = require "distlab"
local rows_ref = require "distlab.bench.attn_rows"
local markdown = require "distlab.bench.markdown"

local h = dl.bench.harness {
  name = "attn_prof", family = "attn", writes = false,
  usage = "./distlab run -n 1 --device cuda experiments/attn/attn_prof.lua [options]",
  about = "dl.attn fwd then bwd, --calls times each, for Nsight Compute; checked against fp64 after",
  options = {
    { "s", "int", 8192, "sequence length (every sequence)" },
    { "d", "int", 128, "head dim (q, k, v)" },
    { "mask", "choice", "causal", "attention mask", values = { "none", "causal" } },
    { "layout", "choice", "bshd", "bshd ([b, s, h, d]) or thd (b sequences of s packed)", values = { "bshd", "thd" } },
    { "calls", "int", 3, "calls of dl.attn.fwd, then of dl.attn.bwd" },
    { "check-elements", "int", 100000, "elements of out (and of dq) the fp64 check covers (attn_rows)", meta = "N" },
    { "fwd-calls", "int", 0, "with --stamp: the forward phase's calls (0: --calls), so that each phase " ..
      "fills seconds (the power cap's steady state)", meta = "N" },
    { "stamp", "flag", false, "a warm-up call of each first, then a line at each phase's start and end, the " ..
      "device synchronized there (a clock sampler's phases: scripts/gpu/attn_clock.sh; not for ncu: " ..
      "the launch counts are --calls + 1)" },
  },
}
local A = h.opt
-- --quick (the plant spec's run on the cpu): s 64 and 2 heads unless given
local B, NH, S, D, N = 2, h.quick and 2 or 16, (h.quick and not h.given.s) and 64 or A.s, A.d, A.calls
if N < 1 then dl.fail("attn_prof: --calls must be at least 1") end
local NF = A.fwd_calls > 0 and A.fwd_calls or N -- the forward's calls (--fwd-calls needs --stamp)
if A.fwd_calls ~= 0 and not A.stamp then dl.fail("attn_prof: --fwd-calls goes with --stamp") end
local dev = dl.default_device()
local cuda = tostring(dev):match("^cuda") ~= nil

-- inputs, and the outputs every call writes into (thd: b sequences of s tokens packed)
local qshape = A.layout == "thd" and { B * S, NH, D } or { B, S, NH, D }
local lshape = A.layout == "thd" and { NH, B * S } or { B, NH, S }
local function empty(shape, dtype) return dl.empty(shape, { dtype = dtype, device = dev }) end
local q, k, v, dout = empty(qshape, "bf16"), empty(qshape, "bf16"), empty(qshape, "bf16"), empty(qshape, "bf16")
local out, lse = empty(qshape, "bf16"), empty(lshape, "f32")
local dq, dk, dv = empty(qshape, "bf16"), empty(qshape, "bf16"), empty(qshape, "bf16")
local o = { layout = A.layout, mask = A.mask }
if A.layout == "thd" then
  local cu = dl.from_table({ 0, S, 2 * S }, { dtype = "i32", device = dev })
  o.cu_seqlens_q, o.cu_seqlens_kv, o.max_seqlen_q, o.max_seqlen_kv = cu, cu, S, S
end
local function with(extra)
  local r = {}
  for key, val in pairs(o) do r[key] = val end
  for key, val in pairs(extra) do r[key] = val end
  return r
end
local fo, bo = with { out = out, lse = lse }, with { dq = dq, dk = dk, dv = dv }

-- what runs, and the launches dl.attn makes per call
local b = dl.attn.backends(q, k, v, o)
print("attn_prof: build: " .. dl.build_info())
print("attn_prof: libraries: " .. markdown.libraries())
print(string.format("attn_prof: b=%d h=%d s=%d d=%d bf16 %s mask %s on %s, %d calls of fwd then %d of bwd",
  B, NH, S, D, A.layout, A.mask, tostring(dev), NF, N))
print("attn_prof: fwd_why: " .. b.fwd_why)
print("attn_prof: bwd_why: " .. b.bwd_why)
local hopper_fwd = b.fwd_why:match("kernel: hopper forward") ~= nil
local hopper_bwd = b.bwd_why:match("kernel: hopper backward") ~= nil
local fwd_k, prep_k, bwd_k, dq_k
if not cuda then
  print("attn_prof: no kernel launches on " .. tostring(dev) .. " (dl.attn's fp64 cpu twin)")
else
  fwd_k = hopper_fwd and "fwd_kernel" or "attn_fwd_kernel"
  if hopper_bwd then
    -- the prep: the Hopper backward's own (bwd_prep_kernel) or attn_bwd.cu's (attn_bwd_prep_kernel), as
    -- dl_attn_bwd_hopper_preps decides; neither is profiled
    prep_k, bwd_k, dq_k = "bwd_prep_kernel or attn_bwd_prep_kernel", "bwd_kernel", "bwd_dq_kernel"
  else
    prep_k, bwd_k, dq_k = "attn_bwd_prep_kernel", "attn_bwd_kernel", "attn_bwd_dq_kernel"
  end
  print(string.format("attn_prof: dl.attn's launches, in order: %s x%d (one a fwd call), then %d times %s, %s, %s " ..
    "(one each a bwd call)", fwd_k, N, N, prep_k, bwd_k, dq_k))
  print(string.format("attn_prof: %s launches: %d; %s launches: %d; %s launches: %d; %s launches: %d",
    fwd_k, N, prep_k, N, bwd_k, N, dq_k, N))
  print("attn_prof: other kernels of this run (the inputs' draws and bf16 conversions, the outputs' " ..
    "poisoning) come before the first call; the check runs on the host")
end

-- the calls, run once through h:verify: inputs drawn, outputs poisoned, fwd N times, bwd N times,
-- then the last call's outputs checked
local fwd = h:planted(function() dl.attn.fwd(q, k, v, fo) end, { writes = { out, lse } })
local bwd = h:planted(function() dl.attn.bwd(dout, q, k, v, out, lse, bo) end, { writes = { dq, dk, dv } })
local seed = 4000 + S + (A.mask == "causal" and 7 or 0) + (A.layout == "thd" and 13 or 0)
local before = dl.attn.runs()
local t0 = dl.now_us()
local what = string.format("%s %s s=%d d=%d", A.layout, A.mask, S, D)
local wrong = h:verify {
  what = what,
  fresh = function()
    for i, t in ipairs({ q, k, v, dout }) do
      t:copy_(dl.rand(t.shape, { dtype = "f32", device = dev, low = -1, high = 1, seed = seed * 8 + i }))
    end
  end,
  poison = { out, lse, dq, dk, dv },
  run = function()
    -- --stamp: a warm-up call of each, then each phase between two synchronized lines (the wrapper times them)
    local function stamp(msg)
      if not A.stamp then return end
      dl.synchronize(dev.name)
      print(string.format("attn_prof: stamp %s (host %.3f ms)", msg, dl.now_us() / 1e3))
      io.stdout:flush()
    end
    if A.stamp then
      fwd()
      bwd()
    end
    stamp("fwd start")
    for _ = 1, NF do fwd() end
    stamp("fwd end")
    stamp("bwd start")
    for _ = 1, N do bwd() end
    stamp("bwd end")
  end,
  check = function()
    local t1 = dl.now_us()
    print(string.format("attn_prof: %d fwd and %d bwd calls took %.1f ms (host, with the device's work)", N, N,
      (t1 - t0) / 1e3))
    local R = rows_ref.prepare { q = q, k = k, v = v, dout = dout, opts = o, elements = A.check_elements,
      seed = seed }
    local n, msg, e = R:check { out = out, lse = lse, dq = dq, dk = dk, dv = dv }
    print(string.format("attn_prof: checked %s in %.1f s: normwise out %.1e, lse %.1e, dq %.1e, dk %.1e, dv %.1e",
      R:describe(), (dl.now_us() - t1) / 1e6, e.out or 0 / 0, e.lse or 0 / 0, e.dq or 0 / 0, e.dk or 0 / 0,
      e.dv or 0 / 0))
    return n, msg
  end,
}
-- which of our kernels the calls took (dl_attn_runs counts steps per kind)
local after = dl.attn.runs()
local function took(dir)
  local parts = {}
  for _, kind in ipairs({ "cpu", "portable", "hopper", "cudnn" }) do
    local n = after[dir][kind] - before[dir][kind]
    if n > 0 then parts[#parts + 1] = string.format("%s %d", kind, n) end
  end
  return #parts > 0 and table.concat(parts, ", ") or "none"
end
print(string.format("attn_prof: steps run (dl.attn.runs): fwd %s; bwd %s", took("fwd"), took("bwd")))
print(string.format("attn_prof: %s: %s", what, wrong == 0 and "ok" or string.format("WRONG (%d)", wrong)))
h:finish()
