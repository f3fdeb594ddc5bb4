"""experiments/attn/attn_prof_fa4.py — FlashAttention-4's side of issue 52's item 0
(experiments/lab/attn/FA4-GAP.md, "0. Profile FA4 and ours side by side"), the counterpart of
experiments/attn/attn_prof.lua: one shape (b=2, h=16, bf16, --s, --d, --mask, --layout), FA4's
forward exactly --calls times, then its backward (torch.autograd.grad of the last output) exactly
--calls times, so that Nsight Compute's --kernel-name filter with --launch-skip picks a known call
(scripts/gpu/attn_prof.sh profiles the last of each). Inputs and FA4's calls are
experiments/attn/attn_bench_torch.py's (case("fa4", ...): flash_attn_func on [b, s, h, d], thd
through flash_attn_varlen_func); after the calls the last forward output is checked against fp64 at
sampled rows (its check_rows) and the gradients must be finite. Exit code 1 on a mismatch.

The launches, from flash_attn/cute/interface.py of flash-attn-4 4.0.0b36 on sm90 (no GQA, no split,
no sparsity; the first call of each kernel compiles it with the CuTe DSL, which launches nothing):
a forward call is one FlashAttentionForwardSm90 kernel; a backward call is FlashAttentionBackward-
Preprocess (dPsum, lse log2 e, dQ accumulator zeroed), FlashAttentionBackwardSm90, then
FlashAttentionBackwardPostprocess (dQ from its fp32 accumulator; dK and dV get their own only with
GQA). The CuTe DSL names a kernel "kernel_" + its mangled name + a counter, and the mangled name of a
method holds its object's repr with the punctuation dropped ("cutlass_kernel_flash_attncute
flash_fwd_sm90FlashAttentionForwardSm90_object_at_..."; nvidia-cutlass-dsl 4.8.1,
base_dsl/dsl.py's kernel_launcher and mangle_name), so "regex:FlashAttentionForwardSm90" and
"regex:FlashAttentionBackwardSm90" match the two main kernels and not the pre/postprocess. That
reading is checked, not assumed: --list-kernels runs the same calls under torch.profiler, prints
every kernel launched with its count, and prints the ncu filter and --launch-skip to use: the class
regex where the names hold it, else the exact name of the phase's longest kernel.
  /opt/torch/.venv/bin/python experiments/attn/attn_prof_fa4.py --s 8192 --d 128 \\
      --mask causal|none --layout bshd|thd [--calls 3] [--list-kernels] [--stamp]
--stamp (scripts/gpu/attn_clock.sh, not for ncu): one warm-up forward and backward first (the
compiles), then "stamp fwd start", "fwd end", "bwd start", "bwd end" lines, the device synchronized
before each.
"""
import argparse
import os
import re
import sys
import time

# kernel families per call: (phase, class name in the kernel's name, what it does)
FAMILIES = [
    ("fwd", "FlashAttentionForwardSm90", "the forward (main)"),
    ("bwd", "FlashAttentionBackwardPreprocess", "dPsum, lse log2(e), dQ accumulator zeroed"),
    ("bwd", "FlashAttentionBackwardSm90", "the backward (main)"),
    ("bwd", "FlashAttentionBackwardPostprocess", "dQ from the fp32 accumulator"),
]
MAIN = {"fwd": "FlashAttentionForwardSm90", "bwd": "FlashAttentionBackwardSm90"}


def ncu_filter(phase, launches, calls):
    """The --kernel-name filter and --launch-skip that pick the last main kernel of a phase from its
    launches [(kernel name, device us), ...] in order: the class regex where names hold the class,
    else the exact name of the phase's longest kernel (the CuTe DSL named it otherwise); with no
    launch seen (the profiler recorded none), the class regex and calls - 1."""
    cls = MAIN[phase]
    hits = [n for n, _ in launches if cls in n]
    if hits:
        return "regex:" + cls, len(hits) - 1, "class name"
    if not launches:
        return "regex:" + cls, calls - 1, "no launch seen by torch.profiler; the class name read from the source"
    longest = max(launches, key=lambda x: x[1])[0]
    n = sum(1 for x, _ in launches if x == longest)
    return "regex:" + re.escape(longest), n - 1, "the longest kernel's name (no name holds " + cls + ")"


def device_launches(prof):
    """[(name, us)] of the kernels a torch.profiler run recorded, in start order (copies and memsets
    left out)."""
    import torch
    out = []
    for e in prof.events():  # device events carry the kernel's own interval (us)
        if e.device_type != torch.autograd.DeviceType.CUDA or e.name.startswith(("Memcpy", "Memset")):
            continue
        out.append((e.time_range.start, e.name, float(e.time_range.elapsed_us())))
    out.sort(key=lambda x: x[0])
    return [(n, us) for _, n, us in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--s", type=int, default=8192, help="sequence length (every sequence)")
    ap.add_argument("--d", type=int, default=128, help="head dim")
    ap.add_argument("--mask", choices=["none", "causal"], default="causal")
    ap.add_argument("--layout", choices=["bshd", "thd"], default="bshd")
    ap.add_argument("--calls", type=int, default=3, help="forward calls, then backward calls")
    ap.add_argument("--list-kernels", action="store_true",
                    help="run under torch.profiler: every kernel launched, and the ncu filters (not under ncu)")
    ap.add_argument("--stamp", action="store_true",
                    help="a warm-up call of each first (the compiles), then a line at each phase's start and end, "
                         "the device synchronized there (scripts/gpu/attn_clock.sh; not for ncu: --calls + 1 launches)")
    ap.add_argument("--fwd-calls", type=int, default=0,
                    help="with --stamp: the forward phase's calls (0: --calls), so that each phase fills seconds")
    a = ap.parse_args()
    if a.fwd_calls and not a.stamp:
        sys.exit("attn_prof_fa4.py: --fwd-calls goes with --stamp")
    nf = a.fwd_calls or a.calls  # the forward's calls (--fwd-calls needs --stamp)
    if a.calls < 1:
        sys.exit("attn_prof_fa4.py: --calls must be at least 1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import attn_bench_torch as abt  # its case() and check_rows() read its module-level D
    abt.D = a.d
    causal = a.mask == "causal"
    tag = "attn_prof_fa4"
    print(f"{tag}: b={abt.B} h={abt.H} s={a.s} d={a.d} bf16 {a.layout} mask {a.mask} on "
          f"{torch.cuda.get_device_name(0)}, {nf} calls of fwd then {a.calls} of bwd")
    for phase, cls, what in FAMILIES:
        print(f"{tag}: expected {cls} launches: {a.calls} ({phase}, {what})")

    bases, fwd = abt.case("fa4", a.layout, a.s, abt.H, causal)
    dout = torch.empty_like(bases[0]).uniform_(-1, 1)  # before the calls: its kernel is no FA4 launch
    torch.cuda.synchronize()
    seen = {}

    def phase(name, fn):
        if not a.list_kernels:
            r = fn()
            torch.cuda.synchronize()
            return r
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            r = fn()
            torch.cuda.synchronize()
        seen[name] = device_launches(p)
        return r

    def fwd_calls():
        out = None
        for _ in range(nf):
            out = fwd()
        return out

    def stamp(msg):
        if a.stamp:
            torch.cuda.synchronize()
            print(f"{tag}: stamp {msg} (host {time.monotonic() * 1e3:.3f} ms)", flush=True)

    if a.stamp:  # the compiles, and a first call of each, outside the phases
        torch.autograd.grad(fwd(), bases, dout)
    stamp("fwd start")
    out = phase("fwd", fwd_calls)
    stamp("fwd end")
    stamp("bwd start")
    def bwd_calls():  # only the last call's gradients kept (a list of every call's ran out of memory at 1200 calls)
        g = None
        for _ in range(a.calls):
            g = torch.autograd.grad(out, bases, dout, retain_graph=True)
        return g

    grads = phase("bwd", bwd_calls)
    stamp("bwd end")
    for name in ("fwd", "bwd"):
        if name not in seen:
            continue
        counts = {}
        for n, us in seen[name]:
            c = counts.setdefault(n, [0, 0.0])
            c[0], c[1] = c[0] + 1, c[1] + us
        for n, (c, us) in counts.items():
            print(f"{tag}: seen {name}: {c} x {n} ({us / c:.1f} us each)")
        filt, skip, why = ncu_filter(name, seen[name], a.calls)
        print(f"{tag}: ncu {name}: --kernel-name {filt} --launch-skip {skip} --launch-count 1 ({why})")

    print(f"{tag}: libraries: {abt.libraries(['fa4'])}")  # after the calls: what they loaded
    rows = abt.check_rows(out, bases, a.layout, a.s, causal)
    finite = all(torch.isfinite(t).all().item() for t in grads)
    verdict = rows if finite else (rows + "; " if rows != "ok" else "") + "NON-FINITE gradients"
    what = f"{a.layout} {a.mask} s={a.s} d={a.d}"
    print(f"{tag}: {what}: {verdict} (forward at sampled rows against fp64; gradients finite: {finite})")
    sys.exit(0 if verdict == "ok" else 1)


if __name__ == "__main__":
    main()
