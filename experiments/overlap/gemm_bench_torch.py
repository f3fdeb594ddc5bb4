"""torch.matmul on the shapes of experiments/overlap/gemm_bench.lua (m in {1k .. 32k},
k = 16k, n = 8k, bf16), timed as gemm_bench.lua times dl.gemm: each call
between two CUDA events, the median (of an even count: the mean of the middle
two), after warm-up calls filling --warm-ms and over at least --iters calls
filling --min-ms (experiments/torch_common.py's events, distlab.bench.timing's).
The output is given (torch.matmul(a, b, out=c)), as the Lua bench gives dl.gemm
its out. PyTorch's defaults stay as they are (its cuBLAS workspace,
allow_bf16_reduced_precision_reduction); the CSV records them. Data checked
after timing: the result finite, and rows 1-2 and the last two against an fp32
GEMM of the same rows (normwise within 2^-7); a failed check is the row's status.

  python experiments/overlap/gemm_bench_torch.py OUT.csv [--m 1024,2048] [--k 16384] [--n 8192] [--iters 20] [--warm-ms 500] [--min-ms 1000]

OUT.csv (Python's csv module, RFC 4180) is what gemm_bench.lua's --torch reads (several
runs, comma-separated: the anchor is their mean); OUT.md beside it, the same rows under
the results header (device, date, commit, command, libraries).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

import torch  # noqa: E402

COLUMNS = ["impl", "m", "k", "n", "dtype", "ms", "tflops", "status", "torch"]


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    about = None  # the torch column, read after the first GEMM (cuBLASLt loads at it)

    def about_now():
        return f"{tc.libraries()}; {tc.device_desc()}, allow_bf16_reduced_precision_reduction={red}"

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {tc.device_desc()}, "
          f"allow_bf16_reduced_precision_reduction={red}", flush=True)
    w = tc.Csv(args.out, COLUMNS)
    rows = []
    for m in [int(x) for x in args.m.split(",") if x]:
        try:
            g = torch.Generator(device="cuda").manual_seed(m)
            a = torch.randn(m, args.k, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(args.k, args.n, device="cuda", dtype=dtype, generator=g)
            c = torch.empty(m, args.n, device="cuda", dtype=dtype)
            ms = tc.events(lambda: torch.matmul(a, b, out=c), warmup=0, iters=args.iters, warm_ms=args.warm_ms,
                           min_ms=args.min_ms)["median"]
            status = check(a, b, c)
            tf = 2 * m * args.n * args.k / (ms * 1e-3) / 1e12
            about = about or about_now()
            r = ["torch_matmul", m, args.k, args.n, args.dtype, f"{ms:.4f}", f"{tf:.2f}", status, about]
            print(f"m={m:6d} {ms:9.3f} ms {tf:8.1f} TFLOP/s {status}", flush=True)
            del a, b, c
        except Exception as e:  # one size failing (memory) must not lose the others
            about = about or about_now()
            r = ["torch_matmul", m, args.k, args.n, args.dtype, "nan", "nan",
                 f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}", about]
            print(f"m={m}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        w.row(r)
        rows.append(r)
        torch.cuda.empty_cache()
    w.close()
    md = (args.out[:-4] if args.out.endswith(".csv") else args.out) + ".md"
    tc.write_markdown(md, f"torch.matmul ({args.dtype}), the anchor of gemm_bench.lua", tc.run_info(), [
        f"method: torch.matmul(a, b, out=c), a [m, k], b [k, n] randn; each call between two CUDA events, the "
        f"median, after warm-up calls filling {args.warm_ms:g} ms, at least {args.iters} calls filling "
        f"{args.min_ms:g} ms; TFLOP/s = 2 m n k / time; allow_bf16_reduced_precision_reduction={red}"],
        tc.table(["m", "k", "n", "ms", "TFLOP/s", "status"], [[r[1], r[2], r[3], r[5], r[6], r[7]] for r in rows]))
    print(f"wrote {args.out} and {md}")


if __name__ == "__main__":
    main()
