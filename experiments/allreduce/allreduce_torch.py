"""PyTorch anchors for experiments/allreduce/allreduce_sweep.lua, measured the same way
(experiments/torch_common.py's graph, distlab.bench.timing.graph: a CUDA graph
of 10 back-to-back all-reduces, warm-up replays (at least 5, and enough to fill
--warm-ms, the same count on every rank), a barrier, then each replay timed
with CUDA events; the median per all-reduce (of an even count: the mean of
the middle two), max over ranks):

  nccl            torch.distributed.all_reduce, in place (NCCL, NVLS off)
  torch_one_shot  torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group),
                  input already in a symmetric-memory buffer, out of place
  torch_two_shot  torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group),
                  in place in the symmetric-memory buffer

No multicast: TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 are
set before torch loads. An op that this torch lacks, or that fails at a size
(or cannot be captured in a graph: then it is timed eagerly, 10 calls between
events, and the method column says so), is recorded as such and the rest goes
on. Data are checked after timing (bf16 inputs 1..8 per rank, exact sums).
OUT.csv is written through Python's csv module (RFC 4180: a method or an
error message holding a comma is quoted), which allreduce_sweep.lua's --torch
reads with distlab.bench.csv (runs before and after the sweep: one CSV of
their means from `python3 experiments/torch_common.py mean OUT.csv A.csv B.csv
--key impl,bytes --runs time_us`); OUT.md beside it, the same rows under the
results header (device, date, commit, command, libraries).

  torchrun --nproc_per_node 2 experiments/allreduce/allreduce_torch.py OUT.csv [--sizes 8192,65536,...]
      [--replays 50] [--warm-ms 200]
"""
import argparse
import os
import sys
import traceback

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SMALL = [8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10]
ROWS = [32, 64, 96, 128, 192, 256, 512, 1024, 2048, 3062, 4096]  # seed 002's rows, and 512
LARGE = [128 << 20, 256 << 20, 512 << 20, 1 << 30]
DEFAULT_SIZES = SMALL + [r * 8192 * 2 for r in ROWS] + LARGE


def log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def max_over_ranks(x):
    t = torch.tensor([x], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def time_graph(fn, replays, warm_ms):
    """Per-call ms of fn (a graph of 10 calls, or eager if capture fails), max over ranks, and the method."""
    st, method = tc.graph(fn, ops=10, warmup=5, replays=replays, warm_ms=warm_ms, before=dist.barrier,
                          agree=max_over_ranks)
    return max_over_ranks(st["median"]), method


def check(result, n, world):
    """Inputs were (rank + i) % 8 + 1: the sum is known exactly."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    want = torch.zeros(n, device="cuda", dtype=torch.float64)
    for r in range(world):
        want += ((r + i) % 8 + 1).double()
    return int((result.double() != want).sum().item())


def fill(t, rank):
    n = t.numel()
    i = torch.arange(n, device=t.device, dtype=torch.int64)
    t.copy_(((rank + i) % 8 + 1).to(t.dtype))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--warm-ms", type=float, default=200, help="warm-up replays per case filling this (ms)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s] or DEFAULT_SIZES

    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    world = dist.get_world_size()
    group = dist.group.WORLD
    group_name = group.group_name
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()} x {world}, NCCL {torch.cuda.nccl.version()}")

    # symmetric memory: a buffer as large as the largest size
    symm, symm_err = None, ""
    try:
        symm_mem = tc.symm_mem_for(group_name)
        symm = symm_mem.empty(max(sizes) // 2, dtype=torch.bfloat16, device="cuda")
        try:
            symm_mem.rendezvous(symm, group_name)
        except TypeError:
            symm_mem.rendezvous(symm, group=group_name)
    except Exception as e:
        symm_err = f"symmetric memory unavailable: {type(e).__name__}: {e}"
        log(symm_err)
        symm = None

    ops = getattr(torch.ops, "symm_mem", None)
    one_shot = getattr(ops, "one_shot_all_reduce", None) if ops is not None else None
    two_shot = getattr(ops, "two_shot_all_reduce_", None) if ops is not None else None

    out = tc.Csv(args.out, ["impl", "bytes", "time_us", "method", "wrong"]) if rank == 0 else None
    rows = []

    def row(impl, nbytes, us, method, wrong):
        """One line of the CSV, written at once (a later crash keeps it)."""
        if out:
            out.row([impl, nbytes, f"{us:.3f}", method, wrong])
            rows.append([impl, nbytes, f"{us:.3f}", method, wrong])

    log(f"{'bytes':>12} {'impl':<16} {'us':>10}  method")
    for nbytes in sizes:
        n = nbytes // 2
        replays = max(5, min(args.replays, int(args.replays * (64 << 20) / nbytes)))
        x = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        cases = [("nccl", lambda: dist.all_reduce(x))]
        if symm is not None and one_shot is not None:
            buf = symm[:n]
            cases.append(("torch_one_shot", lambda: one_shot(buf, "sum", group_name)))
        if symm is not None and two_shot is not None:
            buf2 = symm[:n]
            cases.append(("torch_two_shot", lambda: two_shot(buf2, "sum", group_name)))
        for impl, fn in cases:
            try:
                x.zero_()
                if symm is not None:
                    symm[:n].zero_()
                us, method = time_graph(fn, replays, args.warm_ms)
                us *= 1e3
                # data after timing: one call on known inputs
                if impl == "nccl":
                    fill(x, rank)
                    dist.all_reduce(x)
                    wrong = check(x, n, world)
                elif impl == "torch_one_shot":
                    fill(symm[:n], rank)
                    dist.barrier()
                    wrong = check(one_shot(symm[:n], "sum", group_name), n, world)
                else:
                    fill(symm[:n], rank)
                    dist.barrier()
                    two_shot(symm[:n], "sum", group_name)
                    wrong = check(symm[:n], n, world)
                torch.cuda.synchronize()
                dist.barrier()
            except Exception as e:
                us, method, wrong = float("nan"), f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}", -1
                if rank == 0:
                    traceback.print_exc()
                torch.cuda.synchronize()
                dist.barrier()
            row(impl, nbytes, us, method, wrong)
            log(f"{nbytes:>12} {impl:<16} {us:>10.2f}  {method}{'' if wrong == 0 else f'  WRONG {wrong}'}")
        x = None
    for missing, op in (("torch_one_shot", one_shot), ("torch_two_shot", two_shot)):
        if op is None or symm is None:
            why = symm_err or f"torch.ops.symm_mem has no {missing[6:]} op in torch {torch.__version__}"
            for nbytes in sizes:
                row(missing, nbytes, float("nan"), "absent: " + why, -1)
    if out:
        out.close()
        md = (args.out[:-4] if args.out.endswith(".csv") else args.out) + ".md"
        tc.write_markdown(md, "PyTorch all-reduce anchors of allreduce_sweep.lua", tc.run_info(tc.device_desc(
            world, "nccl")), [
            "method: bf16, a CUDA graph of 10 back-to-back all-reduces (eager where capture failed: the method "
            f"says so), at least 5 warm-up replays filling {args.warm_ms:g} ms, a barrier, then up to "
            f"{args.replays} replays each between two CUDA events; per call the median replay / 10, max over "
            "ranks; data checked after timing (inputs 1..8, exact sums; #wrong)",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 set by the script (no multicast)"],
            tc.table(["impl", "bytes", "us", "method", "#wrong"], rows))
        print(f"wrote {args.out} and {md} ({tc.date()})")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
