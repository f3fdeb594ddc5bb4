"""PyTorch anchors for experiments/overlap/ag_gemm_bench.lua, measured the same way
(experiments/torch_common.py: warm-up runs filling --ag-warm-ms, the count from
the slowest rank's estimate; per timed run a barrier, a CUDA event, the run,
an event; per run the slowest rank's time; the median over runs; TFLOP/s =
2 m n k / time):

  torch_fused        torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, group)
                     (symmetric memory, no multicast: TORCH_SYMM_MEM_DISABLE_MULTICAST=1)
  torch_nccl_matmul  dist.all_gather_into_tensor (NCCL, NVLS off) then torch.matmul
  torch_matmul       torch.matmul alone on the gathered A

With --ag-op gemm_rs, the mirror (GEMM + reduce-scatter; A [m, k] sharded by
columns, B [k, n] by rows, C [m/d, n]; TFLOP/s per GPU = 2 m n k / d / time):

  torch_fused        torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group)
  torch_matmul_nccl  torch.matmul then dist.reduce_scatter_tensor (NCCL)
  torch_matmul       torch.matmul alone on the local shards

A [m, k] is sharded by rows over the ranks, B [k, n] is the same on every rank.
Where ranks share a GPU (more ranks than GPUs: a smoke run) the process group is
gloo, NCCL refuses two ranks on one device, so torch_nccl_matmul is recorded as
skipped; the fused op needs no NCCL and is tried. An implementation that this
torch lacks or that fails is recorded with its error, and the rest goes on.
Data checked after timing: the gathered A equals every rank's shard, and rows
of C (first and last of each block) against an fp32 GEMM of the same rows
(normwise within 2^-7); the status column says "ok" or what failed.

  torchrun --nproc_per_node 8 experiments/overlap/ag_gemm_torch.py OUT.csv [--ag-m 8192,16384,32768]
      [--ag-k 16384] [--ag-n 8192] [--ag-dtype bf16] [--ag-iters 10] [--ag-warm-ms 300] [--ag-op gemm_rs]
      [--ag-impls torch_matmul,...] (the rows to run; default all)

The options carry an ag- prefix because torchrun parses the whole command
line with argparse, which takes any --x that is the start of one of its own
options (--m: --master-port, --max-restarts, ...; --n: --nnodes, ...) as
that option, or fails as ambiguous; no torchrun option starts with --ag.
OUT.csv (rank 0; Python's csv module; its torch column: the libraries) is what
ag_gemm_bench.lua's --torch reads (runs before and after ours: one CSV of
their means from `python3 experiments/torch_common.py mean OUT.csv A.csv B.csv
--key impl,m --runs ms`); OUT.md beside it, the same rows under the results
header (device, date, commit, command, libraries).
"""
import argparse
import os
import statistics
import sys
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def shard(m, k, rank, world, dtype):
    """Rank `rank`'s rows of A, the same numbers on every rank that draws them."""
    g = torch.Generator(device="cuda").manual_seed(m * 64 + rank)
    return torch.randn(m // world, k, device="cuda", dtype=dtype, generator=g)


def time_ms(fn, iters, cpu_group, warm_ms):
    """ag_gemm_bench.lua's method: 2 runs estimate a run, warm-up runs fill warm_ms (the count
    from the slowest rank's estimate, the same on every rank), then per timed run a barrier,
    an event, the run, an event; the slowest rank's time per run; the median."""
    def barrier():
        dist.barrier(group=cpu_group)

    def slowest(x):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu_group)
        return t.item()

    tc.warm(fn, warm_ms, 0, slowest, barrier)
    t = torch.tensor(tc.each(fn, iters, barrier), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=cpu_group)
    return statistics.median(t.tolist())


def check_rows(c, full, b, world):
    rows = full.shape[0] // world
    for p in range(world):
        for r in (p * rows, (p + 1) * rows - 1):
            ref = full[r:r + 1].float() @ b.float()
            err = ((c[r:r + 1].float() - ref).norm() / ref.norm()).item()
            if not err <= 2 ** -7:
                return f"row {r + 1}: normwise error {err:.3g}"
    return "ok"


def run_cases(cases, m, flops, args, world, rank, cpu_group, writer, out, about):
    """Each (impl, fn, skip, check) of an m: a first call on every rank, the timing (collective) only
    where all of them worked, then check(fn's result) -> status; every rank's status merged (the
    first that is not ok); one CSV row on rank 0."""
    for impl, fn, skip, check in cases:
        if args.impls and impl not in args.impls.split(","):
            continue
        ms, status = float("nan"), skip
        if not skip:
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:
                status = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            worked = torch.tensor([0 if status else 1], dtype=torch.int32)
            dist.all_reduce(worked, op=dist.ReduceOp.MIN, group=cpu_group)
            if worked.item():
                ms = time_ms(fn, args.iters, cpu_group, args.warm_ms)
                status = check(fn())
            elif not status:
                status = "failed on another rank"
        flags = torch.tensor([0 if status == "ok" or status.startswith("skipped") else 1], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=cpu_group)
        if flags.item() and status == "ok":
            status = "failed on another rank"
        tf = flops / (ms * 1e-3) / 1e12 if ms == ms else float("nan")
        if writer:
            writer.row([impl, m, args.k, args.n, world, f"{ms:.4f}", f"{tf:.2f}", status, about()])
            out.append([impl, m, args.k, args.n, world, f"{ms:.4f}", f"{tf:.2f}", status])
        if rank == 0:
            print(f"m={m:6d} {impl:<18} {ms:9.3f} ms {tf:8.1f} TFLOP/s {status}", flush=True)


def run_rs(m, args, rank, world, dtype, fused, fused_err, shared, group_name, cpu_group, writer, out, about):
    """GEMM + reduce-scatter at m rows: every rank draws the whole A and B (the same numbers),
    keeps its columns of A and rows of B; C is its m/d rows of A @ B."""
    kd, rows = args.k // world, m // world
    full = torch.cat([shard(m, args.k, p, world, dtype) for p in range(world)])  # [m, k], as ag draws it
    gb = torch.Generator(device="cuda").manual_seed(m * 64 + 63)
    bfull = torch.randn(args.k, args.n, device="cuda", dtype=dtype, generator=gb)
    a = full[:, rank * kd:(rank + 1) * kd].contiguous()
    b = bfull[rank * kd:(rank + 1) * kd].contiguous()
    partial = torch.empty(m, args.n, device="cuda", dtype=dtype)
    c = torch.empty(rows, args.n, device="cuda", dtype=dtype)
    flops = 2 * m * args.n * args.k / world

    def check(got):
        for r in (0, rows - 1):
            ref = full[rank * rows + r:rank * rows + r + 1].float() @ bfull.float()
            err = ((got[r:r + 1].float() - ref).norm() / ref.norm()).item()
            if not err <= 2 ** -7:
                return f"row {r + 1}: normwise error {err:.3g}"
        return "ok"

    def check_local(_):  # the local product alone: its first row against fp32
        ref = a[:1].float() @ b.float()
        err = ((partial[:1].float() - ref).norm() / ref.norm()).item()
        return "ok" if err <= 2 ** -7 else f"row 1: normwise error {err:.3g}"

    cases = [
        ("torch_matmul", lambda: torch.matmul(a, b, out=partial), "", check_local),
        ("torch_matmul_nccl", lambda: (torch.matmul(a, b, out=partial), dist.reduce_scatter_tensor(c, partial)),
         "skipped: ranks share a GPU (NCCL refuses two ranks on one device)" if shared else "", lambda _: check(c)),
        ("torch_fused", lambda: fused(a, b, "sum", 0, group_name), fused_err, check),
    ]
    run_cases(cases, m, flops, args, world, rank, cpu_group, writer, out, about)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ag-m", dest="m", default="8192,16384,32768")
    ap.add_argument("--ag-k", dest="k", type=int, default=16384)
    ap.add_argument("--ag-n", dest="n", type=int, default=8192)
    ap.add_argument("--ag-dtype", dest="dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--ag-iters", dest="iters", type=int, default=10)
    ap.add_argument("--ag-warm-ms", dest="warm_ms", type=float, default=300)
    ap.add_argument("--ag-op", dest="op", default="ag_gemm", choices=["ag_gemm", "gemm_rs"])
    ap.add_argument("--ag-impls", dest="impls", default="",
                    help="the rows to run, comma-separated (default: all; ag_gemm: torch_matmul, "
                         "torch_nccl_matmul, torch_fused; gemm_rs: torch_matmul, torch_matmul_nccl, torch_fused)")
    args = ap.parse_args()
    known = {"torch_matmul", "torch_nccl_matmul", "torch_fused", "torch_matmul_nccl"}
    unknown = [x for x in args.impls.split(",") if x and x not in known]
    if unknown:
        ap.error(f"--ag-impls: unknown rows {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    ngpu = torch.cuda.device_count()
    shared = world > ngpu
    torch.cuda.set_device(local % ngpu)
    limit = timedelta(seconds=600)
    dist.init_process_group("gloo" if shared else "nccl", timeout=limit)
    cpu_group = dist.new_group(backend="gloo", timeout=limit)
    group_name = dist.group.WORLD.group_name
    where = f"{torch.cuda.get_device_name()} x {world}" + (", ranks sharing GPUs (gloo group)" if shared else "")
    known_about = []

    def about():
        """The torch column: the libraries, read at the first row (after the first GEMM: cuBLASLt loads at it)."""
        if not known_about:
            known_about.append(f"{tc.libraries()}; {where}")
        return known_about[0]

    if rank == 0:
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {where}", flush=True)

    fused, fused_err = None, ""
    try:
        tc.symm_mem_for(group_name)
        fused = (torch.ops.symm_mem.fused_matmul_reduce_scatter if args.op == "gemm_rs"
                 else torch.ops.symm_mem.fused_all_gather_matmul)
    except Exception as e:
        fused_err = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:100]}"

    cols = ["impl", "m", "k", "n", "ranks", "ms", "tflops", "status", "torch"]
    writer = tc.Csv(args.out, cols) if rank == 0 else None
    out = []  # the rows, for OUT.md

    for m in [int(x) for x in args.m.split(",") if x]:
        if args.op == "gemm_rs":
            run_rs(m, args, rank, world, dtype, fused, fused_err, shared, group_name, cpu_group, writer, out, about)
            continue
        a = shard(m, args.k, rank, world, dtype)
        gb = torch.Generator(device="cuda").manual_seed(m * 64 + 63)
        b = torch.randn(args.k, args.n, device="cuda", dtype=dtype, generator=gb)
        full = torch.cat([shard(m, args.k, p, world, dtype) for p in range(world)])
        c = torch.empty(m, args.n, device="cuda", dtype=dtype)
        gathered = torch.empty_like(full)
        flops = 2 * m * args.n * args.k

        def check_fused(res):
            got_a, (got_c,) = res
            if not torch.equal(got_a, full):
                return "the gathered A differs from the shards"
            return check_rows(got_c, full, b, world)

        def check_nccl(_):
            if not torch.equal(gathered, full):
                return "the gathered A differs from the shards"
            return check_rows(c, full, b, world)

        cases = [
            ("torch_matmul", lambda: torch.matmul(full, b, out=c), "", lambda _: check_rows(c, full, b, world)),
            ("torch_nccl_matmul", lambda: (dist.all_gather_into_tensor(gathered, a), torch.matmul(gathered, b, out=c)),
             "skipped: ranks share a GPU (NCCL refuses two ranks on one device)" if shared else "", check_nccl),
            ("torch_fused", lambda: fused(a, [b], 0, group_name), fused_err, check_fused),
        ]
        run_cases(cases, m, flops, args, world, rank, cpu_group, writer, out, about)
        del a, b, full, c, gathered
        torch.cuda.empty_cache()
    if writer:
        writer.close()
        md = (args.out[:-4] if args.out.endswith(".csv") else args.out) + ".md"
        tc.write_markdown(md, f"PyTorch anchors of ag_gemm_bench.lua ({args.op})",
                          tc.run_info(tc.device_desc(world, "gloo" if shared else "nccl")), [
            f"method: warm-up runs filling {args.warm_ms:g} ms (the count from the slowest rank's estimate of 2 "
            f"runs), then {args.iters} runs each after a barrier between two CUDA events; per run the slowest "
            "rank's time, the median over runs; TFLOP/s = 2 m n k / time (gemm_rs: / ranks); "
            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 set by the script",
            f"k = {args.k}, n = {args.n}, {args.dtype}"],
            tc.table(cols[:-1], out, ["l"] + ["r"] * 6 + ["l"]))
        print(f"wrote {args.out} and {md}", flush=True)
    dist.barrier(group=cpu_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
