"""PyTorch baseline for experiments/ep/ep_bench.lua: the dispatch and combine of
a plain MoE layer on torch.distributed.all_to_all_single, measured on the same
machine with the same sizes and routing rule (each token picks K distinct
experts uniformly; T = B tokens a rank; weights 2^-ceil(log2 K)).

  dispatch  sort the (token, k) selections by expert (so by rank), count rows
            per rank, all_to_all_single of the counts, read them on the host
            (the sync every such layer has), index_select the rows, and
            all_to_all_single them with those splits
  combine   all_to_all_single the expert outputs back, then index_add_ them,
            weighted, into the tokens (fp32, then bf16)

Timed eagerly (the host read of the counts cannot be captured), with
experiments/torch_common.py: warm-up calls (at least --warmup, and enough to
fill --warm-ms, the same count on every rank), then --iters calls each after
a barrier between two CUDA events (host clock on cpu); the median on each
rank, the max over ranks. Bandwidth as DeepEP counts it:
selections x 2H bytes / time. Data are checked after timing with the identity
expert: out = x * K * w. With one rank a GPU the backend is NCCL
(NCCL_NVLS_ENABLE=0); where ranks share a GPU (NCCL refuses that) or there is
no GPU, gloo, with the all-to-alls through host memory: a smoke run, its
times mean nothing (the method column says which). Rank 0 writes OUT.csv
(Python's csv module, RFC 4180; row by row), which ep_bench.lua --torch reads
(runs before and after ep_bench: one CSV of their means from `python3
experiments/torch_common.py mean OUT.csv A.csv B.csv --key B,E --runs
both_us`), and OUT.md beside it: the same rows under the results header
(device, date, commit, command, libraries).

  torchrun --nproc_per_node 8 experiments/ep/ep_bench_torch.py OUT.csv [--B 1,32,128,512] [--experts 16,256]
      [--hidden 7168] [--topk 8] [--warmup 5] [--warm-ms 500] [--iters 30]
"""
import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def ints(s):
    return [int(v) for v in s.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--B", default="1,32,128,512")
    ap.add_argument("--experts", default="16,256")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=5, help="warm-up calls per case, at least")
    ap.add_argument("--warm-ms", type=float, default=500, help="warm-up calls per case filling this (ms)")
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    ngpu = torch.cuda.device_count()
    shared = ngpu == 0 or world > ngpu
    backend = "gloo" if shared else "nccl"
    device = torch.device("cuda", local % ngpu) if ngpu else torch.device("cpu")
    if ngpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, N = dist.get_rank(), dist.get_world_size()
    comm_dev = device if backend == "nccl" else torch.device("cpu")
    method = "eager, nccl" if backend == "nccl" else "eager, gloo through host memory (smoke)"
    H, K = a.hidden, a.topk
    wk = 2.0 ** -math.ceil(math.log2(K))

    def a2a(out, inp, out_splits=None, in_splits=None):
        """all_to_all_single on the communicator's device (host memory for gloo)."""
        if comm_dev == out.device:
            dist.all_to_all_single(out, inp, out_splits, in_splits)
            return out
        o, i = out.to(comm_dev), inp.to(comm_dev)
        dist.all_to_all_single(o, i, out_splits, in_splits)
        out.copy_(o)
        return out

    def dispatch(x, idx, L):
        T = x.shape[0]
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        send_counts = torch.bincount(flat[order] // L, minlength=N)
        recv_counts = torch.empty_like(send_counts)
        a2a(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        send = x.index_select(0, order // K)
        recv = torch.empty(sum(rc), H, dtype=x.dtype, device=x.device)
        a2a(recv, send, rc, sc)
        return recv, (order, sc, rc, T)

    def combine(y, state, w):
        order, sc, rc, T = state
        back = torch.empty(sum(sc), H, dtype=y.dtype, device=y.device)
        a2a(back, y, sc, rc)
        out = torch.zeros(T, H, dtype=torch.float32, device=y.device)
        out.index_add_(0, order // K, back.float() * w.reshape(-1)[order].unsqueeze(1))
        return out.to(torch.bfloat16)

    def max_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device=comm_dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def timed(fn):
        """us per call: the median over --iters calls (each after a barrier) on each rank, max over ranks."""
        tc.warm(fn, a.warm_ms, a.warmup, max_over_ranks)
        return max_over_ranks(statistics.median(tc.each(fn, a.iters, dist.barrier)) * 1e3)

    cols = ["B", "E", "H", "K", "dtype", "method", "dispatch_us", "combine_us", "both_us", "dispatch_GBps",
            "combine_GBps", "wrong", "torch"]
    sink = tc.Csv(a.out, cols) if rank == 0 else None
    about = None  # the libraries, read after the first case loaded them
    rows = []
    for E in ints(a.experts):
        if E % N or E < K:
            continue
        L = E // N
        for B in ints(a.B):
            g = torch.Generator(device="cpu").manual_seed(B * 1000 + E + 7919 * rank)
            idx = torch.rand(B, E, generator=g).argsort(dim=1)[:, :K].to(device)
            x = torch.randn(B, H, generator=g).to(torch.bfloat16).to(device)
            w = torch.full((B, K), wk, dtype=torch.float32, device=device)
            recv, state = dispatch(x, idx, L)
            y = recv.clone()
            d_us = timed(lambda: dispatch(x, idx, L))
            c_us = timed(lambda: combine(y, state, w))
            def both():
                r, st = dispatch(x, idx, L)
                return combine(r, st, w)

            b_us = timed(both)
            # the identity expert: out = x * K * w, up to bf16 rounding
            recv, state = dispatch(x, idx, L)
            out = combine(recv, state, w).float()
            want = x.float() * (K * wk)
            bad = ((out - want).abs() > 2.0 ** -8 * want.abs() + 1e-6).sum().to(comm_dev)
            dist.all_reduce(bad)
            nbytes = B * K * 2 * H
            about = about or tc.libraries()
            rows.append([B, E, H, K, "bf16", method, f"{d_us:.2f}", f"{c_us:.2f}", f"{b_us:.2f}",
                         f"{nbytes / (d_us * 1e3):.2f}", f"{nbytes / (c_us * 1e3):.2f}", int(bad.item()), about])
            if sink:
                sink.row(rows[-1])
            if rank == 0:
                print(f"torch B={B:4d} E={E:4d}: dispatch {d_us:9.1f} us  combine {c_us:9.1f} us  "
                      f"both {b_us:9.1f} us  #wrong {int(bad.item())}", flush=True)
    if sink:
        sink.close()
        md = (a.out[:-4] if a.out.endswith(".csv") else a.out) + ".md"
        tc.write_markdown(md, "PyTorch EP anchor of ep_bench.lua: all_to_all_single dispatch and combine",
                          tc.run_info(tc.device_desc(N, backend)), [
            f"method: {method}; at least {a.warmup} warm-up calls filling {a.warm_ms:g} ms (the same count on every "
            f"rank), then {a.iters} calls each after a barrier between two CUDA events; the median on each rank, "
            f"the max over ranks; GB/s = B K 2H / time; data checked after timing with the identity expert "
            f"(out = x K w; #wrong)", f"H = {H}, K = {K}, bf16, tokens a rank T = B"],
            tc.table(cols[:-1], [r[:-1] for r in rows]))
        print(f"wrote {a.out} and {md}", flush=True)
    wrong = sum(r[11] for r in rows)
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
