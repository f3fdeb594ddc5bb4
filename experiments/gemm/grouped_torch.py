"""torch's grouped GEMM paths on the cases of experiments/gemm/grouped_bench.lua (its --cases-out CSV:
the same experts, counts and shapes), timed as grouped_bench.lua times dl.gemm.grouped: each call
between two CUDA events, the median, after warm-up calls filling --warm-ms and over at least --iters
calls filling --min-ms (experiments/torch_common.py's events, distlab.bench.timing's). Per case and op
(fwd Y_e = X_e W_e, dgrad dX_e = dY_e W_e^T, wgrad dW_e = X_e^T dY_e), bf16, three paths:

  grouped_mm   torch._grouped_mm (torch.nn.functional.grouped_mm where it exists) on the packed rows
               [T, .] with int32 offsets (the cumulative counts): one CUTLASS kernel on sm_90;
               dgrad takes w as the transposed view, wgrad x's packed rows transposed
  matmul_loop  torch.matmul per expert, out= the expert's rows of the expert-major buffer [E, R, .]
  bmm_padded   torch.bmm over the padded expert-major buffer, all R rows of every expert (wgrad
               over the padding too: right only where it is zero; the same FLOPs as the others
               only where every count is R)

A path that raises (an older torch, an unsupported layout) is the row's status, not a failure of
the run. Data checked after timing: the result finite and, for the first and the largest expert,
two rows against an fp32 product of the same rows (normwise within 2^-7); a failed check is the
row's status.

  python experiments/gemm/grouped_torch.py OUT.csv --cases CASES.csv [--iters 10] [--warm-ms 50] [--min-ms 150]

OUT.csv (RFC 4180, one row per case and path) is what grouped_bench.lua's --torch reads (several
runs, comma-separated: the anchor is their mean); OUT.md beside it, the same rows under the results
header (device, date, commit, command, libraries).
"""
import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

COLUMNS = ["case", "E", "dist", "gemm", "op", "K", "N", "rows", "rmax", "path", "ms", "tflops", "status", "torch"]
PATHS = ["grouped_mm", "matmul_loop", "bmm_padded"]


def read_cases(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("E", "K", "N", "rows", "rmax"):
            r[k] = int(r[k])
        r["counts"] = [int(x) for x in r["counts"].split()]
    return rows


def grouped_mm_fn(torch):
    """torch's grouped GEMM entry: F.grouped_mm where it exists, else torch._grouped_mm, else None."""
    f = getattr(torch.nn.functional, "grouped_mm", None)
    if f is not None:
        return f, "torch.nn.functional.grouped_mm"
    f = getattr(torch, "_grouped_mm", None)
    return (f, "torch._grouped_mm") if f is not None else (None, "no grouped_mm in this torch")


def packed(buf, counts):
    """The rows of the expert-major buffer [E, R, c] packed [T, c] (expert after expert)."""
    import torch
    return torch.cat([buf[e, :n] for e, n in enumerate(counts)], 0).contiguous()


def make(case, torch, dev):
    """The operands of a case and a callable per path (None where the path cannot run)."""
    E, R, K, N, counts, op = case["E"], case["rmax"], case["K"], case["N"], case["counts"], case["op"]
    g = torch.Generator(device=dev).manual_seed(sum(counts) + E)
    bf = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, device=dev, dtype=bf, generator=g)

    offs = torch.tensor(counts, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    gmm, _ = grouped_mm_fn(torch)

    def zero_padding(*bufs):  # rows past the counts: zero, so the padded bmm's sums are right
        for buf in bufs:
            for e, n in enumerate(counts):
                buf[e, n:].zero_()
        return bufs
    if op == "fwd":
        (a,), b = zero_padding(randn(E, R, K)), randn(E, K, N)
        out = torch.empty(E, R, N, device=dev, dtype=bf)
        ap = packed(a, counts)
        gm = (ap, b, offs)
        paths = {
            "grouped_mm": gmm and (lambda: gmm(ap, b, offs=offs)),
            "matmul_loop": lambda: [torch.matmul(a[e, :n], b[e], out=out[e, :n]) for e, n in enumerate(counts) if n],
            "bmm_padded": lambda: torch.bmm(a, b, out=out),
        }
        ref = lambda e, rows: a[e, rows].float() @ b[e].float()  # noqa: E731
    elif op == "dgrad":
        (a,), b = zero_padding(randn(E, R, N)), randn(E, K, N)
        out = torch.empty(E, R, K, device=dev, dtype=bf)
        ap, bt = packed(a, counts), b.transpose(-2, -1)
        gm = (ap, bt, offs)
        paths = {
            "grouped_mm": gmm and (lambda: gmm(ap, bt, offs=offs)),
            "matmul_loop": lambda: [torch.matmul(a[e, :n], bt[e], out=out[e, :n]) for e, n in enumerate(counts) if n],
            "bmm_padded": lambda: torch.bmm(a, bt, out=out),
        }
        ref = lambda e, rows: a[e, rows].float() @ bt[e].float()  # noqa: E731
    else:
        a, b = zero_padding(randn(E, R, K), randn(E, R, N))
        out = torch.empty(E, K, N, device=dev, dtype=bf)
        at, bp = packed(a, counts).t(), packed(b, counts)
        gm = (at, bp, offs)
        paths = {
            "grouped_mm": gmm and (lambda: gmm(at, bp, offs=offs)),
            "matmul_loop": lambda: [torch.matmul(a[e, :n].t(), b[e, :n], out=out[e]) for e, n in enumerate(counts) if n],
            "bmm_padded": lambda: torch.bmm(a.transpose(1, 2), b, out=out),
        }
        ref = lambda e, rows: a[e, :counts[e]].t()[rows].float() @ b[e, :counts[e]].float()  # noqa: E731
    return paths, ref, out, gm


def other_layouts(gm, torch):
    """grouped_mm on the same values laid out otherwise, for a build that asks a layout of its operands:
    a row-major and/or b column-major (copies made here, outside the timing). The first that runs, and
    what it changed."""
    gmm, _ = grouped_mm_fn(torch)
    a, b, offs = gm
    row = a.contiguous()
    col = b.transpose(-2, -1).contiguous().transpose(-2, -1)
    err = None
    for x, y, what in ((a, col, "w column-major"), (row, b, "x row-major"), (row, col, "x row-major, w column-major")):
        try:
            gmm(x, y, offs=offs)
            return (lambda: gmm(x, y, offs=offs)), what
        except RuntimeError as e:  # noqa: PERF203 (a handful of tries)
            err = e
    raise err


def check(case, path, result, out, ref, torch):
    """Two rows of the first and the largest expert against fp32 (the padded bmm's rows past the counts aside)."""
    counts, op = case["counts"], case["op"]
    if path == "grouped_mm":
        # packed [T, .] for fwd/dgrad, [E, K, N] for wgrad
        if op != "wgrad":
            starts = [0]
            for n in counts:
                starts.append(starts[-1] + n)
            got = lambda e, rows: result[starts[e] + rows]  # noqa: E731
        else:
            got = lambda e, rows: result[e, rows]  # noqa: E731
    else:
        got = lambda e, rows: out[e, rows]  # noqa: E731
    big = max(range(len(counts)), key=lambda e: counts[e])
    for e in sorted({0, big}):
        n = counts[e] if op != "wgrad" else case["K"]
        if n == 0:
            continue
        rows = torch.tensor(sorted({0, n - 1}), device=out.device)
        want, have = ref(e, rows), got(e, rows).float()
        if not torch.isfinite(have).all():
            return f"non-finite rows of expert {e + 1}"
        err = ((have - want).norm() / want.norm()).item()
        if err > 2 ** -7:
            return f"expert {e + 1}: normwise error {err:.3g}"
    return "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--cases", required=True, help="grouped_bench.lua --cases-out's CSV")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warm-ms", type=float, default=50)
    ap.add_argument("--min-ms", type=float, default=150)
    args = ap.parse_args()
    import torch
    dev = "cuda"
    cases = read_cases(args.cases)
    _, gname = grouped_mm_fn(torch)
    red = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    about = None  # the torch column, read after the first GEMM (cuBLASLt loads at it)
    notes = set()

    def about_now():
        return (f"{tc.libraries()}; {tc.device_desc()}; grouped_mm: {gname}; "
                f"allow_bf16_reduced_precision_reduction={red}" + "".join("; " + n for n in sorted(notes)))

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {tc.device_desc()}, grouped_mm: {gname}", flush=True)
    w = tc.Csv(args.out, COLUMNS)
    rows = []
    want = [p for p in args.paths.split(",") if p]
    for case in cases:
        flops = 2 * case["rows"] * case["K"] * case["N"]
        try:
            paths, ref, out, gm = make(case, torch, dev)
        except Exception as e:  # noqa: BLE001 (memory: the other cases still run)
            paths, ref, out, gm = {p: None for p in PATHS}, None, None, None
            setup = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        else:
            setup = None
        for p in want:
            fn = paths.get(p)
            ms, status = None, setup
            if status is None and fn is None:
                status = "not run: " + gname
            if status is None:
                res = [None]
                try:
                    try:
                        fn()
                    except RuntimeError as e:
                        if p != "grouped_mm":
                            raise
                        # a build that asks a layout of its operands: the same values laid out so
                        fn, what = other_layouts(gm, torch)
                        notes.add(f"grouped_mm {case['op']}: {what} ({str(e).splitlines()[0][:80]})")

                    def call():
                        res[0] = fn()
                    ms = tc.events(call, warmup=0, iters=args.iters, warm_ms=args.warm_ms, min_ms=args.min_ms)["median"]
                    status = check(case, p, res[0], out, ref, torch)
                except Exception as e:  # noqa: BLE001 (a path this torch lacks is a status)
                    ms, status = None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            about = about_now() if (about is None or notes) else about
            tf = flops / (ms * 1e-3) / 1e12 if ms else None
            r = [case["case"], case["E"], case["dist"], case["gemm"], case["op"], case["K"], case["N"], case["rows"],
                 case["rmax"], p, f"{ms:.4f}" if ms else "nan", f"{tf:.2f}" if tf else "nan", status, about]
            print(f"{case['case']:24s} {p:12s} {ms or float('nan'):9.3f} ms {tf or float('nan'):8.1f} TFLOP/s {status}",
                  flush=True)
            w.row(r)
            rows.append(r)
        del paths, ref, out, gm
        torch.cuda.empty_cache()
    w.close()
    md = (args.out[:-4] if args.out.endswith(".csv") else args.out) + ".md"
    tc.write_markdown(md, "torch's grouped GEMM paths, the anchor of grouped_bench.lua", tc.run_info(), [
        f"method: per case and path, each call between two CUDA events, the median, after warm-up calls filling "
        f"{args.warm_ms:g} ms, at least {args.iters} calls filling {args.min_ms:g} ms; TFLOP/s = 2 (rows) K N / time "
        f"(rows: the sum of the counts); grouped_mm: {gname}; allow_bf16_reduced_precision_reduction={red}"],
        tc.table(["case", "path", "ms", "TFLOP/s", "status"], [[r[0], r[9], r[10], r[11], r[12]] for r in rows]))
    print(f"wrote {args.out} and {md}")


if __name__ == "__main__":
    main()
