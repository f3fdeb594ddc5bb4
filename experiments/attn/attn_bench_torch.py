"""PyTorch's scaled_dot_product_attention with each backend (FLASH_ATTENTION and
CUDNN_ATTENTION, forced with torch.nn.attention.sdpa_kernel) on the shapes of
experiments/attn/attn_bench.lua: b=2, h=16, d=128, bf16, s in {4k, 8k, 16k, 32k},
causal and not. Inputs are bshd tensors seen as SDPA's [b, h, s, d] through a
transpose, as distlab's bshd are. Times are medians of CUDA events around each
call after warm-up, as dl.bench takes them; FLOPs as attn_bench.lua (fwd
4*b*h*s^2*d, halved when causal; bwd 2.5x; fwd+bwd 3.5x). The forward runs with
inputs that require grad (a training forward, saving what backward needs).
Data checked after timing: outputs finite, and each backend against the math
backend in fp32 at a small shape (s=333, h=2) within TransformerEngine's bf16
tolerance. SDPA has no packed variable-length (thd) path; attn_bench.lua sets
its bshd numbers beside our thd rows (the same work).
  python3 experiments/attn/attn_bench_torch.py [--s 4096,8192] [--iters 10] [--out DIR]
Writes DIR/attn-torch.{md,csv} (default experiments/results/attn): the markdown
headed by device, date, commit and command as distlab.bench.markdown heads its
files, the CSV through Python's csv module (RFC 4180), which attn_bench.lua's
--torch reads with distlab.bench.csv.
"""
import argparse
import csv
import os
import shlex
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, H, D = 2, 16, 128
BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def commit():
    """$DISTLAB_COMMIT, else `git describe --always --dirty` of the checkout (distlab.bench.markdown.commit)."""
    if os.environ.get("DISTLAB_COMMIT"):
        return os.environ["DISTLAB_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except OSError:
        pass
    return "unknown (no git checkout here; set DISTLAB_COMMIT=<hash> to record it)"


def bench(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(iters))


def inputs(s, h, device="cuda"):
    """q, k, v bases [b, s, h, d] (requiring grad) and their [b, h, s, d] views."""
    bases = [torch.empty(B, s, h, D, device=device, dtype=torch.bfloat16).uniform_(-1, 1).requires_grad_()
             for _ in range(3)]
    return bases, [t.transpose(1, 2) for t in bases]


def check_small(backend, causal):
    bases, (q, k, v) = inputs(333, 2)
    dout = torch.empty_like(q).uniform_(-1, 1)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, bases, dout)
    ref_bases = [t.detach().float().requires_grad_() for t in bases]
    rq, rk, rv = [t.transpose(1, 2) for t in ref_bases]
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, ref_bases, dout.float())
    bad = [name for name, a, b in zip(["out", "dq", "dk", "dv"], (out,) + grads, (ref,) + ref_grads)
           if not torch.allclose(a.float(), b, atol=2.5e-2, rtol=2.5e-2)]
    return "ok" if not bad else "WRONG " + ",".join(bad)


def run(backend, s, causal, iters):
    bases, (q, k, v) = inputs(s, H)
    dout = torch.empty_like(q).uniform_(-1, 1)
    with sdpa_kernel(backend):
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out = fwd()
        tf = bench(fwd, 3, iters)
        tb = bench(lambda: torch.autograd.grad(out, bases, dout, retain_graph=True), 3, iters)
        tfb = bench(lambda: torch.autograd.grad(fwd(), bases, dout), 3, iters)
        grads = torch.autograd.grad(out, bases, dout)
    finite = all(torch.isfinite(t).all().item() for t in (out,) + grads)
    return tf, tb, tfb, finite


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--s", default="4096,8192,16384,32768")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments/results/attn"), help="results folder")
    a = ap.parse_args()
    sizes = [int(x) for x in a.s.split(",")]
    gpu = torch.cuda.get_device_name(0)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python3 " + " ".join(shlex.quote(x) for x in sys.argv)
    print(f"PyTorch {torch.__version__} SDPA, {gpu}, {date}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'backend':<7} {'mask':<7} {'s':>6}  {'fwd ms':>9} {'bwd ms':>9} {'f+b ms':>9}  "
          f"{'fwd TF/s':>8} {'bwd TF/s':>8} {'f+b TF/s':>8}  check")
    rows = []
    for name, backend in BACKENDS:
        for causal in (False, True):
            mask = "causal" if causal else "none"
            try:
                checked = check_small(backend, causal)
            except RuntimeError as e:
                checked = "unsupported: " + str(e).splitlines()[0][:80]
            for s in sizes:
                flops = 4 * B * H * s * s * D * (0.5 if causal else 1)
                try:
                    tf, tb, tfb, finite = run(backend, s, causal, a.iters)
                    r = (name, mask, s, tf, tb, tfb, flops / tf / 1e9, 2.5 * flops / tb / 1e9,
                         3.5 * flops / tfb / 1e9, checked if finite else "NON-FINITE")
                except RuntimeError as e:
                    nan = float("nan")
                    r = (name, mask, s, nan, nan, nan, nan, nan, nan, "failed: " + str(e).splitlines()[0][:80])
                torch.cuda.empty_cache()
                rows.append(r)
                print(f"{r[0]:<7} {r[1]:<7} {r[2]:>6}  {r[3]:9.3f} {r[4]:9.3f} {r[5]:9.3f}  "
                      f"{r[6]:8.1f} {r[7]:8.1f} {r[8]:8.1f}  {r[9]}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "attn-torch.md"), "w") as f:
        f.write("# PyTorch scaled_dot_product_attention\n\n")
        f.write(f"- device: {gpu}\n- date: {date}\n- commit: `{commit()}`\n- command: `{command}`\n"
                f"- PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}\n")
        f.write(f"- b={B}, h={H}, d={D}, bf16, bshd inputs as [b, h, s, d] views; FLOPs fwd 4*b*h*s^2*d "
                f"(halved when causal), bwd 2.5x, fwd+bwd 3.5x; median of {a.iters} CUDA-event timings\n\n")
        f.write("| backend | mask | s | fwd ms | bwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | "
                "fwd+bwd TFLOP/s | check |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            check = r[9].replace("|", "\\|").replace("\n", " ")
            f.write(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.1f} | "
                    f"{r[7]:.1f} | {r[8]:.1f} | {check} |\n")
    with open(os.path.join(a.out, "attn-torch.csv"), "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["impl", "layout", "mask", "s", "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_tflops", "bwd_tflops",
                    "fwdbwd_tflops", "check"])
        for r in rows:
            w.writerow([r[0], "bshd", r[1], r[2], f"{r[3]:.4f}", f"{r[4]:.4f}", f"{r[5]:.4f}", f"{r[6]:.2f}",
                        f"{r[7]:.2f}", f"{r[8]:.2f}", r[9]])
    print(f"wrote {os.path.join(a.out, 'attn-torch.md')} and .csv")


if __name__ == "__main__":
    main()
