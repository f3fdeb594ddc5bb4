"""PyTorch anchor of experiments/ep/ep_bench.lua: the dispatch and combine of a MoE layer on
torch.distributed.all_to_all_single, on the same machine, sizes and routing rule (each token picks K
distinct experts uniformly; T = B tokens a rank; the same routing and x in both modes).

--mode graph (the anchor: a layer that plans its layout ahead, as a fair baseline must)
  The plan, made once per (B, H, K, E, N) outside every timed region: the (token, k) selections
  sorted by expert (so by rank), the rows per (rank, expert) exchanged (an all_to_all of counts),
  hence the split sizes, the rows' send order and the receive side's permutation into expert-major
  order (expert l's rows from every source together, sources in rank order, tokens in order: the
  order of ours' expert_major output, packed: expert l's rows from its offset, where ours pads each
  expert to N B rows). Then, captured in CUDA graphs (torch.cuda.CUDAGraph, made once per case):
    dispatch  index_select of x into send order, all_to_all_single with the fixed splits,
              index_select of the received rows into expert-major order
    combine   index_select of the experts' rows back into receive order, all_to_all_single back,
              index_add_ of them weighted (the weights gathered in send order) into the tokens
              (fp32, then bf16)
  Timed two ways, per op (dispatch, combine, dispatch then combine):
    latency     one replay of a graph of one call between two CUDA events, each after an L2 flush
                (torch_common.l2_flush: 256 MB zeroed, as DeepEP's bench), a sync and a barrier;
                --iters replays; the median on each rank, the max over ranks (columns *_lat_us)
    throughput  torch_common.graph: a graph of --ops back-to-back calls, --replays replays each
                between two events, per call = replay / ops (dl.bench.timing.graph, as ours are
                timed); the median on each rank, the max over ranks (columns *_us)
  Data: after timing, the timed latency graph of dispatch then combine replayed once more with new
  x and random weights (the routing is the plan's: the splits are in the graph) and its outputs
  poisoned (NaN) first. Dispatch: a spread sample of the expert-major rows (up to 512) against the
  rows an independent host reference (a loop over every rank's routing, redrawn from its seed) says
  each expert receives there, bit-exact; combine: the experts' rows are coef(e) x (coef distinct per
  expert, set on the host from that reference), and a spread sample of tokens (up to 512) against the
  fp64 sum over k of w coef(e) x, within 2^-8 relative.
--mode eager (kept as a labelled extra row: "eager (host-read counts)")
  dispatch  sort the selections by expert, count rows per rank, all_to_all_single of the counts,
            read them on the host (.tolist(): a sync, so this cannot be captured), index_select
            the rows, all_to_all_single them with those splits
  combine   all_to_all_single back, index_add_ weighted into the tokens (fp32, then bf16)
  Timed eagerly: each call after a barrier between two CUDA events (no L2 flush), the median on
  each rank, the max over ranks (columns *_us; no *_lat_us). Data: the identity expert after timing,
  out = x K w within 2^-8 relative (NaN counts as wrong).

Warm-up in both: at least --warmup calls, enough to fill --warm-ms, the same count on every rank.
Bandwidth as DeepEP counts it: selections x 2H bytes / time (B K 2H, bf16 both ways), from the
throughput (*_GBps) and from the latency (*_lat_GBps). --plant noop | scale=X puts an error into
every timed call (torch_common.planted; graph mode: captured into the graphs), which the data check
must catch: "data check failed" and exit code 1. --quick: B 2, E 4, K 2, H 128, few calls.
With one rank a GPU the backend is NCCL (NCCL_NVLS_ENABLE=0: the GPU hosts forbid NVLink
multicast); where ranks share a GPU (NCCL refuses that) or there is no GPU, gloo, the all-to-alls
through host memory, nothing captured ("graph capture needs CUDA" / "... NCCL"): a smoke run, its
times mean nothing (the method column says so). Rank 0 writes OUT.csv (Python's csv module, row by
row; columns B, E, ..., mode, method, ...), which ep_bench.lua --torch reads (graph rows: the PyTorch
anchor; eager rows: a labelled extra row), and OUT.md beside it under the results header.
Anchors before and after ours (scripts/gpu/multi.sh): `python3 experiments/torch_common.py mean OUT.csv
A.csv B.csv --key B,E,mode --runs both_us`.

On 2 H200s (nvidia-h200-x2), the whole table:
  NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 experiments/ep/ep_bench_torch.py ep-torch.csv \\
      --mode graph,eager --B 1,32,128,512 --experts 16,256
  (or STEPS=ep EP_SPLIT=0 scripts/gpu/multi.sh: graph and eager before ep_bench.lua, graph after, their
  mean merged into ep_bench.lua's report)

  torchrun --nproc_per_node N experiments/ep/ep_bench_torch.py OUT.csv [--mode graph,eager]
      [--B 1,32,128,512] [--experts 16,256] [--hidden 7168] [--topk 8] [--warmup 5] [--warm-ms 500]
      [--iters 30] [--ops 10] [--replays 30] [--plant noop|scale=X] [--quick]
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

SAMPLE = 512  # rows / tokens checked a case, spread over all of them
# NCCL's calls inside the capture: PyTorch's NCCL watchdog thread queries the events of earlier
# collectives while this thread captures, which the global mode forbids (pytorch#104487); nccl-tests
# captures in this mode too
CAPTURE = "thread_local"


def ints(s):
    return [int(v) for v in s.split(",") if v]


def route(B, E, K, H, rank):
    """Rank `rank`'s routing [B, K] (K distinct experts a token) and x [B, H] bf16, on the host: one
    draw per (B, E, rank), the same in both modes and on every rank that redraws it."""
    g = torch.Generator(device="cpu").manual_seed(B * 1000 + E + 7919 * rank)
    idx = torch.rand(B, E, generator=g).argsort(dim=1)[:, :K]
    x = torch.randn(B, H, generator=g).to(torch.bfloat16)
    return idx, x


def fresh(B, E, K, H, rank, seed):
    """Rank `rank`'s inputs of a data check: a new x (bf16) and random weights (f32 multiples of 1/997)."""
    g = torch.Generator(device="cpu").manual_seed(seed * 131 + rank + 1)
    x = torch.randn(B, H, generator=g).to(torch.bfloat16)
    w = (torch.randint(1, 1001, (B, K), generator=g).to(torch.float32) / 997)
    return x, w


def coef(E):
    """The experts' own factor: distinct per expert, exact in bf16 (k / 64, 0.5 <= c < 1.5)."""
    return 0.5 + (torch.arange(E, dtype=torch.float64) % 64) / 64


def spread(n, k):
    """Up to k indices spread over 0..n-1, the first and the last among them."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def expected(idxs, N, me, L):
    """The host reference of what rank `me` receives, from every rank's routing idxs[s] [B, K], by a plain
    loop: [(local expert, source, token, k)] in expert-major order (sources in order, tokens in order)."""
    per = [[] for _ in range(L)]
    for s in range(N):
        for t, row in enumerate(idxs[s].tolist()):
            for k, e in enumerate(row):
                if e // L == me:
                    per[e % L].append((s, t, k))
    return [(l, s, t, k) for l in range(L) for (s, t, k) in per[l]]


class Plan:
    """The layout a MoE layer plans ahead (see the header), made with the counts of every rank.
    sc / rc: rows sent to / received from each rank; send_tok, order [S]: the token and the selection
    (t K + k) of each row in send order; perm [R]: for each expert-major row, its row in the receive
    buffer; inv: perm's inverse; offsets [L + 1]: expert l's rows in expert-major order."""

    def __init__(self, idx, N, me, L, exchange):
        K = idx.shape[1]
        flat = idx.reshape(-1)
        self.order = torch.argsort(flat, stable=True)
        self.send_tok = self.order // K
        cnt = torch.bincount(flat, minlength=N * L).view(N, L)
        got = exchange(cnt.reshape(-1).clone()).view(N, L).tolist()  # [source][local expert]
        self.sc, self.rc = cnt.sum(1).tolist(), [sum(r) for r in got]
        start, at = [], 0
        for s in range(N):
            start.append([])
            for l in range(L):
                start[s].append(at)
                at += got[s][l]
        perm, self.offsets = [], [0]
        for l in range(L):
            for s in range(N):
                perm.extend(range(start[s][l], start[s][l] + got[s][l]))
            self.offsets.append(len(perm))
        self.perm = torch.tensor(perm, dtype=torch.int64)
        self.inv = torch.empty_like(self.perm)
        self.inv[self.perm] = torch.arange(len(perm), dtype=torch.int64)
        self.S, self.R = int(flat.numel()), len(perm)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--mode", default="graph,eager", help="graph (the anchor), eager (host-read counts), or both")
    ap.add_argument("--B", default="1,32,128,512")
    ap.add_argument("--experts", default="16,256")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=5, help="warm-up calls per case, at least")
    ap.add_argument("--warm-ms", type=float, default=500, help="warm-up calls per case filling this (ms)")
    ap.add_argument("--iters", type=int, default=30, help="timed calls (latency; eager: every time)")
    ap.add_argument("--ops", type=int, default=10, help="calls per graph of the throughput")
    ap.add_argument("--replays", type=int, default=30, help="timed replays of the throughput's graph")
    ap.add_argument("--plant", default=None, help=tc.PLANT_HELP)
    ap.add_argument("--quick", action="store_true", help="B 2, E 4, K 2, H 128, few calls (a smoke run)")
    a = ap.parse_args()
    modes = [m for m in a.mode.split(",") if m]
    if not modes or any(m not in ("graph", "eager") for m in modes):
        ap.error(f"--mode: graph, eager or graph,eager, got {a.mode!r}")
    plant = tc.parse_plant(a.plant)
    if a.quick:
        a.B, a.experts, a.topk, a.hidden = "2", "4", 2, 128
        a.warmup, a.warm_ms, a.iters, a.ops, a.replays = 1, 0, 3, 2, 2

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
    smoke = "" if backend == "nccl" else ", gloo through host memory (smoke)"
    # a graph captures NCCL's all-to-all; gloo's goes through the host
    no_graph = None if backend == "nccl" else ("graph capture needs CUDA" if ngpu == 0 else
                                              "graph capture needs NCCL (ranks share a GPU: gloo)")
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

    def exchange(cnt):
        """Counts to every rank (cnt: N equal parts, part q to rank q) -> the parts every rank sent here."""
        out = torch.empty_like(cnt).to(comm_dev)
        dist.all_to_all_single(out, cnt.to(comm_dev))
        return out.cpu()

    def max_over_ranks(x):
        t = torch.tensor([x], dtype=torch.float64, device=comm_dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def sum_over_ranks(n):
        t = torch.tensor([n], dtype=torch.int64, device=comm_dev)
        dist.all_reduce(t)
        return int(t.item())

    def isolated(fn):
        """us per call: --iters calls each alone (an L2 flush, a sync, a barrier, then one call between
        two events); the median on each rank, the max over ranks."""
        def before():
            tc.l2_flush()
            dist.barrier()
            tc._sync()
        tc.warm(fn, a.warm_ms, a.warmup, max_over_ranks)
        return max_over_ranks(statistics.median(tc.each(fn, a.iters, before)) * 1e3)

    def eager_timed(fn):
        """us per call: the median over --iters calls (each after a barrier) on each rank, max over ranks."""
        tc.warm(fn, a.warm_ms, a.warmup, max_over_ranks)
        return max_over_ranks(statistics.median(tc.each(fn, a.iters, dist.barrier)) * 1e3)

    def throughput(fn):
        """us per call of a graph of --ops calls (torch_common.graph), max over ranks; and its method."""
        if no_graph:
            st = tc.events(fn, a.warmup, a.replays, a.warm_ms, None, max_over_ranks)
            return max_over_ranks(st["median"] * 1e3), "eager"
        st, how = tc.graph(fn, a.ops, a.warmup, a.replays, a.warm_ms, dist.barrier, max_over_ranks, CAPTURE)
        return max_over_ranks(st["median"] * 1e3), how

    def failed(what, n, msg):
        print(f"ep_bench_torch: rank {rank}: data check failed: {what}: {n} wrong: {msg}", file=sys.stderr, flush=True)

    # ---- graph mode ------------------------------------------------------------------------------

    def run_graph(B, E):
        L = E // N
        idx_h, x_h = route(B, E, K, H, rank)
        p = Plan(idx_h, N, rank, L, exchange)
        dv = device
        x = x_h.to(dv)
        w = torch.full((B, K), wk, dtype=torch.float32, device=dv)
        send_tok, order, perm, inv = p.send_tok.to(dv), p.order.to(dv), p.perm.to(dv), p.inv.to(dv)
        send = torch.empty(p.S, H, dtype=torch.bfloat16, device=dv)
        recv = torch.empty(p.R, H, dtype=torch.bfloat16, device=dv)
        recv_em = torch.empty(p.R, H, dtype=torch.bfloat16, device=dv)  # dispatch's output
        y_em = torch.randn(p.R, H, device=dv).to(torch.bfloat16)  # the experts' output, combine's input
        back_src = torch.empty(p.R, H, dtype=torch.bfloat16, device=dv)
        back = torch.empty(p.S, H, dtype=torch.bfloat16, device=dv)
        out32 = torch.empty(B, H, dtype=torch.float32, device=dv)
        out = torch.empty(B, H, dtype=torch.bfloat16, device=dv)  # combine's output

        def dispatch():
            torch.index_select(x, 0, send_tok, out=send)
            a2a(recv, send, p.rc, p.sc)
            torch.index_select(recv, 0, perm, out=recv_em)

        def combine():
            torch.index_select(y_em, 0, inv, out=back_src)
            a2a(back, back_src, p.sc, p.rc)
            out32.zero_()
            out32.index_add_(0, send_tok, back.float() * w.view(-1).index_select(0, order).unsqueeze(1))
            out.copy_(out32)

        pd = tc.planted(dispatch, plant, writes=[recv_em])
        pc = tc.planted(combine, plant, writes=[out])

        def both():
            pd()
            pc()

        # one graph of one call per op, made once: timed alone, and the one the data check replays
        graphs, how = {}, "graph"
        for name, fn in (("dispatch", pd), ("combine", pc), ("both", both)):
            if no_graph:
                graphs[name] = fn
                continue
            try:
                graphs[name] = tc.capture(fn, 1, CAPTURE).replay
            except Exception as e:  # noqa: BLE001 (said in the method column, timed uncaptured)
                tc._sync()
                how = f"not captured ({type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''})"
                graphs[name] = fn
        lat = {k: isolated(graphs[k]) for k in ("dispatch", "combine", "both")}
        tput, hows = {}, set()
        for name, fn in (("dispatch", pd), ("combine", pc), ("both", both)):
            tput[name], h = throughput(fn)
            hows.add(h)
        if no_graph:
            method = f"fixed splits, {no_graph}: uncaptured{smoke}"
        else:
            method = (f"fixed splits, {how}" + ("" if hows == {"graph"} else f"; throughput {'/'.join(sorted(hows))}")
                      + ", nccl")
        # Data: the latency graph of both once more, new x and weights, outputs poisoned
        seed = B * 1000 + E + 500
        xs = [fresh(B, E, K, H, s, seed)[0] for s in range(N)]
        w_h = fresh(B, E, K, H, rank, seed)[1]
        idxs = [route(B, E, K, H, s)[0] for s in range(N)]
        rows = expected(idxs, N, rank, L)
        c = coef(E)
        src = torch.tensor([r[1] for r in rows], dtype=torch.int64)
        tok = torch.tensor([r[2] for r in rows], dtype=torch.int64)
        ex = torch.tensor([rank * L + r[0] for r in rows], dtype=torch.int64)
        xall = torch.stack(xs) if xs else torch.empty(0, B, H, dtype=torch.bfloat16)
        want_rows = xall[src, tok]  # [R, H] bf16: what each expert-major row must be
        y_h = (want_rows.double() * c[ex].unsqueeze(1)).to(torch.bfloat16)
        x.copy_(xs[rank])
        w.copy_(w_h)
        if len(rows) == p.R:
            y_em.copy_(y_h)
        recv_em.fill_(float("nan"))
        out.fill_(float("nan"))
        tc._sync()
        dist.barrier()
        graphs["both"]()
        tc._sync()
        dist.barrier()
        bad, msgs = 0, []
        offsets = [0] * (L + 1)
        for r in rows:
            offsets[r[0] + 1] += 1
        for l in range(L):
            offsets[l + 1] += offsets[l]
        if offsets != p.offsets:
            bad += max(1, abs(len(rows) - p.R))
            msgs.append(f"dispatch: {p.R} rows at expert offsets {p.offsets[:9]}, the reference {len(rows)} at "
                        f"{offsets[:9]}")
        else:
            pick = spread(p.R, SAMPLE)
            diff = recv_em.cpu()[pick].double() != want_rows[pick].double()  # NaN differs
            n = int(diff.sum())
            if n:
                bad += n
                r0 = pick[int(diff.any(1).nonzero()[0])]
                msgs.append(f"dispatch: {n} of {len(pick) * H} elements of {len(pick)} rows differ (first row {r0}: "
                            f"expert {rows[r0][0]}, source {rows[r0][1]}, token {rows[r0][2]})")
        # the combine's reference in fp64: this rank's selections, each expert's y as set above
        toks = spread(B, SAMPLE)
        ref = torch.zeros(len(toks), H, dtype=torch.float64)
        xm = xs[rank].double()
        for j, t in enumerate(toks):
            for k in range(K):
                e = int(idxs[rank][t, k])
                ref[j] += float(w_h[t, k]) * (xm[t] * c[e]).to(torch.bfloat16).double()
        got = out.cpu()[toks].double()
        ok = (got - ref).abs() <= 2.0 ** -8 * ref.abs() + 1e-6
        n = int((~ok).sum())
        if n:
            bad += n
            j = int((~ok).reshape(-1).nonzero()[0])
            msgs.append(f"combine: {n} of {ok.numel()} elements of {len(toks)} tokens off by more than 2^-8 relative "
                        f"(first token {toks[j // H]}, element {j % H}: got {float(got.reshape(-1)[j]):.6g}, want "
                        f"{float(ref.reshape(-1)[j]):.6g})")
        if bad:
            failed(f"graph B={B} E={E}", bad, "; ".join(msgs))
        return lat, tput, method, sum_over_ranks(bad)

    # ---- eager mode (host-read counts) -------------------------------------------------------------

    def run_eager(B, E):
        L = E // N

        def dispatch(x, idx):
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

        pd = tc.planted(dispatch, plant, returns=True)
        pc = tc.planted(combine, plant, returns=True)
        idx_h, x_h = route(B, E, K, H, rank)
        idx, x = idx_h.to(device), x_h.to(device)
        w = torch.full((B, K), wk, dtype=torch.float32, device=device)
        recv, state = pd(x, idx)
        y = recv.clone()
        d_us = eager_timed(lambda: pd(x, idx))
        c_us = eager_timed(lambda: pc(y, state, w))

        def both():
            r, st = pd(x, idx)
            return pc(r, st, w)

        b_us = eager_timed(both)
        # the identity expert: out = x * K * w, up to bf16 rounding; NaN is wrong
        out = both().float()
        want = x.float() * (K * wk)
        bad = int((~((out - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6)).sum())
        if bad:
            failed(f"eager B={B} E={E}", bad, "identity expert: out != x K w within 2^-8 relative")
        return d_us, c_us, b_us, sum_over_ranks(bad)

    # ---- running -------------------------------------------------------------------------------------

    cols = ["B", "E", "H", "K", "dtype", "mode", "method", "dispatch_us", "combine_us", "both_us", "dispatch_lat_us",
            "combine_lat_us", "both_lat_us", "dispatch_GBps", "combine_GBps", "dispatch_lat_GBps", "combine_lat_GBps",
            "wrong", "torch"]
    sink = tc.Csv(a.out, cols) if rank == 0 else None
    about = None  # the libraries, read after the first case loaded them
    rows = []

    def f2(v):
        return None if v is None else f"{v:.2f}"

    if rank == 0 and no_graph and "graph" in modes:
        print(f"ep_bench_torch: {no_graph}: the graph mode's calls run uncaptured here (a smoke run)", flush=True)
    for E in ints(a.experts):
        if E % N or E < K:
            continue
        for B in ints(a.B):
            nbytes = B * K * 2 * H
            for mode in modes:
                if mode == "graph":
                    lat, tput, method, bad = run_graph(B, E)
                    us = (tput["dispatch"], tput["combine"], tput["both"])
                    lus = (lat["dispatch"], lat["combine"], lat["both"])
                else:
                    d, c, b, bad = run_eager(B, E)
                    us, lus = (d, c, b), (None, None, None)
                    method = "eager (host-read counts), " + ("nccl" if backend == "nccl" else smoke[2:])
                about = about or tc.libraries()
                gb = [f2(nbytes / (v * 1e3)) if v else None for v in (us[0], us[1], lus[0], lus[1])]
                rows.append([B, E, H, K, "bf16", mode, method] + [f2(v) for v in us + lus] + gb + [bad, about])
                if sink:
                    sink.row(rows[-1])
                if rank == 0:
                    lat_s = "" if lus[0] is None else \
                        f"  latency {lus[0]:8.1f} {lus[1]:8.1f} {lus[2]:8.1f} us"
                    print(f"torch {mode:5s} B={B:4d} E={E:4d}: dispatch {us[0]:8.1f} combine {us[1]:8.1f} "
                          f"both {us[2]:8.1f} us{lat_s}  #wrong {bad}  ({method})", flush=True)
    if sink:
        sink.close()
        md = (a.out[:-4] if a.out.endswith(".csv") else a.out) + ".md"
        tc.write_markdown(md, "PyTorch EP anchor of ep_bench.lua: all_to_all_single dispatch and combine",
                          tc.run_info(tc.device_desc(N, backend)), [
            "graph: the layout planned ahead (splits, send order, expert-major permutation: untimed), dispatch "
            "and combine captured in CUDA graphs; us = throughput, a graph of %d calls, median of %d replays / %d; "
            "lat_us = latency, one replay of a one-call graph between two events after an L2 flush (256 MB), a "
            "sync and a barrier, median of %d" % (a.ops, a.replays, a.ops, a.iters)
            + (f" (HERE NOTHING CAPTURED: {no_graph}; the same calls timed uncaptured)" if no_graph else ""),
            "eager (host-read counts): argsort, bincount, an all-to-all of the counts read on the host, "
            "index_select, all_to_all_single, index_add_, all timed; each call after a barrier between two events, "
            "median of %d" % a.iters,
            f"every time the max over ranks; at least {a.warmup} warm-up calls filling {a.warm_ms:g} ms; GB/s = B K "
            f"2H / time; data checked after timing (graph: sampled expert-major rows bit-exact and the fp64 combine "
            f"within 2^-8, outputs poisoned first; eager: the identity expert; #wrong)"
            + (f"; PLANTED ERROR: --plant {a.plant}" if plant else ""),
            f"H = {H}, K = {K}, bf16, tokens a rank T = B"],
            tc.table(cols[:-1], [r[:-1] for r in rows]))
        print(f"wrote {a.out} and {md}", flush=True)
    wrong = sum(r[-2] for r in rows)  # each already summed over the ranks
    if rank == 0 and wrong:
        print(f"ep_bench_torch: data check failed: {wrong} wrong elements over all ranks (each rank's message on "
              "stderr)", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
