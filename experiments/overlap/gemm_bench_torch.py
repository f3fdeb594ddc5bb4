"""torch.matmul on the shapes of experiments/overlap/gemm_bench.lua (m in {1k .. 32k},
k = 16k, n = 8k, bf16), timed as gemm_bench.lua times dl.gemm: each call
between two CUDA events, the median (of an even count: the mean of the middle
two), after warm-up calls filling --warm-ms and over at least --iters calls
filling --min-ms. The output is given (torch.matmul(a, b, out=c)), as the
Lua bench gives dl.gemm its out. PyTorch's defaults stay as they are (its cuBLAS
workspace, allow_bf16_reduced_precision_reduction); the CSV records them.
Data checked after timing: the result finite, and rows 1-2 and the last two
against an fp32 GEMM of the same rows (normwise within 2^-7); a failed check is
the row's status.

  python experiments/overlap/gemm_bench_torch.py OUT.csv [--m 1024,2048] [--k 16384] [--n 8192] [--iters 20] [--warm-ms 500] [--min-ms 1000]

OUT.csv (Python's csv module, RFC 4180) is what gemm_bench.lua's --torch reads.
"""
import argparse
import csv
import math
import statistics
import sys

import torch


def events_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


def median_ms(fn, iters, warm_ms, min_ms):
    """As gemm_bench.lua: a first estimate, then warm-up calls for warm_ms and at
    least iters calls filling min_ms, so the card's clocks settle on this GEMM."""
    est = events_ms(fn, 2, 3)
    return events_ms(fn, math.ceil(warm_ms / est), max(iters, math.ceil(min_ms / est)))


def check(a, b, c):
    if not torch.isfinite(c).all():
        return "non-finite result"
    m = a.shape[0]
    for first in (0, max(0, m - 2)):
        ref = a[first:first + 2].float() @ b.float()
        got = c[first:first + 2].float()
        err = ((got - ref).norm() / ref.norm()).item()
        if err > 2 ** -7:
            return f"rows {first + 1}..: normwise error {err:.3g}"
    return "ok"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--m", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--k", type=int, default=16384)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warm-ms", type=float, default=500)
    ap.add_argument("--min-ms", type=float, default=1000)
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    red = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    about = (f"torch {torch.__version__} (CUDA {torch.version.cuda}), {torch.cuda.get_device_name()}, "
             f"allow_bf16_reduced_precision_reduction={red}")
    print(about, flush=True)
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["impl", "m", "k", "n", "dtype", "ms", "tflops", "status", "torch"])
        for m in [int(x) for x in args.m.split(",") if x]:
            try:
                g = torch.Generator(device="cuda").manual_seed(m)
                a = torch.randn(m, args.k, device="cuda", dtype=dtype, generator=g)
                b = torch.randn(args.k, args.n, device="cuda", dtype=dtype, generator=g)
                c = torch.empty(m, args.n, device="cuda", dtype=dtype)
                ms = median_ms(lambda: torch.matmul(a, b, out=c), args.iters, args.warm_ms, args.min_ms)
                status = check(a, b, c)
                tf = 2 * m * args.n * args.k / (ms * 1e-3) / 1e12
                w.writerow(["torch_matmul", m, args.k, args.n, args.dtype, f"{ms:.4f}", f"{tf:.2f}", status, about])
                print(f"m={m:6d} {ms:9.3f} ms {tf:8.1f} TFLOP/s {status}", flush=True)
                del a, b, c
            except Exception as e:  # one size failing (memory) must not lose the others
                w.writerow(["torch_matmul", m, args.k, args.n, args.dtype, "nan", "nan",
                            f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}", about])
                print(f"m={m}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            f.flush()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
