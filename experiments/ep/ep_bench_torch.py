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

Timed eagerly (the host read of the counts cannot be captured): `warmup`
calls, then `iters` calls each between two CUDA events (host clock on cpu);
the median on each rank, the max over ranks. Bandwidth as DeepEP counts it:
selections x 2H bytes / time. Data are checked after timing with the identity
expert: out = x * K * w. With one rank a GPU the backend is NCCL
(NCCL_NVLS_ENABLE=0); where ranks share a GPU (NCCL refuses that) or there is
no GPU, gloo, with the all-to-alls through host memory: a smoke run, its
times mean nothing (the method column says which). Rank 0 writes OUT.csv
(Python's csv module, RFC 4180), which ep_bench.lua --torch reads.

  torchrun --nproc_per_node 8 experiments/ep/ep_bench_torch.py OUT.csv [--B 1,32,128,512] [--experts 16,256]
"""
import argparse
import csv
import math
import os
import statistics
import time

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
    ap.add_argument("--warmup", type=int, default=5)
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

    def timed(fn):
        for _ in range(a.warmup):
            fn()
        times = []
        for _ in range(a.iters):
            dist.barrier()
            if device.type == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=comm_dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

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
            rows.append([B, E, H, K, "bf16", method, f"{d_us:.2f}", f"{c_us:.2f}", f"{b_us:.2f}",
                         f"{nbytes / (d_us * 1e3):.2f}", f"{nbytes / (c_us * 1e3):.2f}", int(bad.item())])
            if rank == 0:
                print(f"torch B={B:4d} E={E:4d}: dispatch {d_us:9.1f} us  combine {c_us:9.1f} us  "
                      f"both {b_us:9.1f} us  #wrong {int(bad.item())}", flush=True)
    if rank == 0:
        with open(a.out, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["B", "E", "H", "K", "dtype", "method", "dispatch_us", "combine_us", "both_us",
                          "dispatch_GBps", "combine_GBps", "wrong"])
            out.writerows(rows)
        print(f"wrote {a.out}", flush=True)
    wrong = sum(r[-1] for r in rows)
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
