"""The attention anchors: PyTorch's scaled_dot_product_attention with each backend
(FLASH_ATTENTION, i.e. FlashAttention-2, and CUDNN_ATTENTION, forced with
torch.nn.attention.sdpa_kernel) and FlashAttention-4 (flash_attn.cute, PyPI
flash-attn-4, scripts/fetch-fa4.sh: flash_attn_func on bshd, flash_attn_varlen_func
with cu_seqlens on thd; --backends picks; fa4-nopack is FA4 with pack_gqa=False, a
labelled diagnostic that attn_bench.lua's tables do not read: FA4 packs a kv head's query heads
into one tile by default under GQA) on the shapes of
experiments/attn/attn_bench.lua: b=2, h=16, d=128, bf16, s in {4k, 8k, 16k, 32k},
causal and not, bshd and thd; --gqa G gives k and v h/G heads (GQA G:1: FA4 takes
them as they are, SDPA with enable_gqa=True; the checks repeat them). bshd inputs are [b, s, h, d] tensors seen as
SDPA's [b, h, s, d] through a transpose, as distlab's bshd are. thd inputs are
packed [b*s, h, d] tensors seen as nested jagged tensors (offsets 0, s, 2s;
torch.nested.nested_tensor_from_jagged), which SDPA runs on its variable-length
paths: flash's varlen kernels, and, with --cudnn-thd only, cuDNN's
ragged-offset graphs, which PyTorch gates behind
TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED=1. That path is off by default: on an
H200 (PyTorch 2.11.0+cu130, cuDNN 9.19, 2026-11-23) it returned a wrong dq at
s=333 (against the math backend), ran at 6-83 TFLOP/s at s 4k-16k, and hit an
illegal memory access at s=32k, which ends the process. Where a backend has
no thd row, attn_bench.lua sets its bshd figure (the same work), saying so.
Times: medians of CUDA events around each call, as dl.bench takes them
(experiments/torch_common.py's events), after warm-up calls filling --warm-ms
and at least --iters timed calls filling --min-ms (a few calls leave the
card's clocks where the previous case put them). FLOPs as attn_bench.lua (fwd 4*b*h*s^2*d, halved when causal; bwd
2.5x; fwd+bwd 3.5x). The forward runs with inputs that require grad (a
training forward, saving what backward needs). Data checked after timing:
outputs finite; every timed shape's forward output at 32 query rows of every
(sequence, head) slice, spread over it (the last row included), against fp64
on the GPU (normwise 8e-3, element-wise TransformerEngine's bf16 tolerance
2.5e-2, as attn_bench.lua checks ours); and each backend, forward and
backward, against the math backend in fp32 at a small shape (s=333, h=2)
within that tolerance (thd against the dense result of the same sequences).
  python3 experiments/attn/attn_bench_torch.py [--s 4096,8192] [--layouts bshd,thd] [--gqa 4]
      [--iters 10] [--warm-ms 300] [--min-ms 600] [--out DIR] [--name attn-torch]
Writes DIR/NAME.{md,csv} (default experiments/results/attn/attn-torch): the
markdown headed by device, date, commit, command and libraries as
distlab.bench.markdown heads its files, the CSV through Python's csv module
(RFC 4180; h_kv the kv heads, and its last column, torch, the libraries), which
attn_bench.lua's --torch reads with distlab.bench.csv (cudnn.sh runs this
before and after attn_bench.lua and the anchor is the mean of the two runs).
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

if "--cudnn-thd" in sys.argv:
    os.environ["TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, H, D = 2, 16, 128
G = 1  # query heads per kv head (--gqa)
SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
ALL = ["flash", "cudnn", "fa4", "fa4-nopack"]
_fa4 = None


def fa4():
    """FlashAttention-4's (flash_attn_func, flash_attn_varlen_func), imported once; raises where
    it is not installed (scripts/fetch-fa4.sh, scripts/gpu/steps.sh's fa4_site)."""
    global _fa4
    if _fa4 is None:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
        _fa4 = (flash_attn_func, flash_attn_varlen_func)
    return _fa4


def fa4_version():
    try:
        import importlib.metadata as md
        return md.version("flash-attn-4")
    except Exception:  # noqa: BLE001
        return None


def bench(fn, a):
    """dl.bench.timing.events with warm_ms/min_ms: a first estimate (2 + 3 calls),
    then warm-up calls filling warm_ms and at least iters timed calls filling min_ms."""
    return tc.events(fn, warmup=0, iters=a.iters, warm_ms=a.warm_ms, min_ms=a.min_ms)["median"]


def case(name, layout, s, h, causal, device="cuda"):
    """q, k, v bases requiring grad (bshd [b, s, h, d]; thd packed [b*s, h, d], b sequences of s)
    and fn() -> the output laid out as the bases. SDPA sees [b, h, s, d] views (thd: nested
    jagged tensors); FA4 takes the bases themselves (thd: its varlen call with cu_seqlens). k and v
    have h / G heads."""
    def shape(heads):
        return (B, s, heads, D) if layout == "bshd" else (B * s, heads, D)
    bases = [torch.empty(shape(n), device=device, dtype=torch.bfloat16).uniform_(-1, 1).requires_grad_()
             for n in (h, h // G, h // G)]
    q, k, v = bases
    if name.startswith("fa4"):
        dense, varlen = fa4()
        pack = False if name == "fa4-nopack" else None  # None: FA4's own choice (packed where h_kv < h)
        if layout == "bshd":
            return bases, lambda: dense(q, k, v, causal=causal, pack_gqa=pack)[0]
        cu = torch.arange(0, (B + 1) * s, s, device=device, dtype=torch.int32)
        return bases, lambda: varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s,
                                     causal=causal, pack_gqa=pack)[0]
    if layout == "bshd":
        views = [t.transpose(1, 2) for t in bases]
    else:
        offsets = torch.arange(0, (B + 1) * s, s, device=device, dtype=torch.int64)
        views = [torch.nested.nested_tensor_from_jagged(t, offsets, max_seqlen=s, min_seqlen=s).transpose(1, 2)
                 for t in bases]

    def fn():
        with sdpa_kernel(SDPA[name]):
            out = F.scaled_dot_product_attention(*views, is_causal=causal, enable_gqa=G > 1).transpose(1, 2)
        return out.values() if layout == "thd" else out
    return bases, fn


def check_small(name, layout, causal):
    bases, fn = case(name, layout, 333, 2 * G, causal)
    out = fn()
    dout = torch.empty_like(out).uniform_(-1, 1)
    try:
        grads, note = torch.autograd.grad(out, bases, dout), ""
    except Exception as e:  # noqa: BLE001 (forward only: the forward is still checked and timed)
        grads, note = (), " (forward only; backward failed: " + one_line(e) + ")"
    # the reference: the math backend in fp32 on dense [b, s, h, d] copies of the same data
    ref_bases = [t.detach().float().reshape(B, 333, -1, D).requires_grad_() for t in bases]
    rq, rk, rv = [t.transpose(1, 2) for t in ref_bases]
    with sdpa_kernel(SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=causal, enable_gqa=G > 1).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, ref_bases, dout.float().reshape(ref.shape))
    bad = [n for n, x, y in zip(["out", "dq", "dk", "dv"], (out,) + grads, (ref,) + ref_grads)
           if not torch.allclose(x.float().reshape(y.shape), y, atol=2.5e-2, rtol=2.5e-2)]
    return ("ok" if not bad else "WRONG " + ",".join(bad)) + note


def check_rows(out, bases, layout, s, causal, rows=32):
    """The forward output at `rows` query rows of every (sequence, head) slice, spread over it,
    against fp64: "ok" or what was off."""
    q, k, v = [t.detach().reshape(B, s, -1, D) for t in bases]
    k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)  # GQA: query head j reads kv head j // G
    got = out.detach().reshape(B, s, -1, D)
    idx = torch.linspace(0, s - 1, rows, device=q.device).round().long()
    qs = q[:, idx].double().transpose(1, 2)                     # [b, h, rows, d]
    kt, vt = k.double().transpose(1, 2), v.double().transpose(1, 2)  # [b, h, s, d]
    p = qs @ kt.transpose(-1, -2) / math.sqrt(D)                  # [b, h, rows, s]
    if causal:
        p = p.masked_fill(torch.arange(s, device=q.device)[None, :] > idx[:, None], float("-inf"))
    ref = torch.softmax(p, dim=-1) @ vt                           # [b, h, rows, d]
    g = got[:, idx].double().transpose(1, 2)
    if not torch.isfinite(g).all():
        return "WRONG out (non-finite at the sampled rows)"
    norm = ((g - ref).norm() / ref.norm()).item()
    elem = ((g - ref).abs() > 2.5e-2 + 2.5e-2 * ref.abs()).sum().item()
    if norm > 8e-3 or elem:
        return f"WRONG out (sampled rows: normwise {norm:.1e}, {elem} elements off)"
    return "ok"


def run(name, layout, s, causal, a):
    bases, fwd = case(name, layout, s, H, causal)
    out = fwd()
    dout = torch.empty_like(out).uniform_(-1, 1)
    tf = bench(fwd, a)
    try:  # a backend may run a layout forward only (cuDNN's nested path in some versions)
        tb = bench(lambda: torch.autograd.grad(out, bases, dout, retain_graph=True), a)
        tfb = bench(lambda: torch.autograd.grad(fwd(), bases, dout), a)
        grads = torch.autograd.grad(out, bases, dout)
        why = None
    except Exception as e:  # noqa: BLE001 (any refusal is recorded in the row)
        tb = tfb = float("nan")
        grads, why = (), "backward failed: " + one_line(e)
    finite = all(torch.isfinite(t).all().item() for t in (out,) + grads)
    with torch.no_grad():
        out = fwd()  # once more after timing, checked at sampled rows
    rows = check_rows(out, bases, layout, s, causal)
    return tf, tb, tfb, finite, why if rows == "ok" else rows + ("; " + why if why else "")


def libraries(names):
    """tc.libraries(), with FA4's and the CuTe DSL's versions where fa4 runs."""
    about = tc.libraries()
    if any(n.startswith("fa4") for n in names):
        import importlib.metadata as md
        vers = []
        for pkg in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels"):
            try:
                vers.append(f"{pkg} {md.version(pkg)}")
            except Exception:  # noqa: BLE001
                vers.append(f"{pkg} not installed")
        about += "; " + ", ".join(vers)
    return about


def one_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:100]


def main():
    global D, G
    ap = argparse.ArgumentParser()
    ap.add_argument("--s", default="4096,8192,16384,32768")
    ap.add_argument("--layouts", default="bshd,thd")
    ap.add_argument("--backends", default=",".join(ALL),
                    help="flash (SDPA's FlashAttention-2), cudnn (SDPA's cuDNN), fa4 (FlashAttention-4), "
                         "fa4-nopack (FA4 with pack_gqa=False: a diagnostic row under --gqa)")
    ap.add_argument("--d", type=int, default=D, help="head dim")
    ap.add_argument("--gqa", type=int, default=1, help="query heads per kv head (GQA G:1; 1: MHA)")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per case, at least")
    ap.add_argument("--warm-ms", type=float, default=300, help="warm-up work per case (ms)")
    ap.add_argument("--min-ms", type=float, default=600, help="timed work per case (ms)")
    ap.add_argument("--out", default=os.path.join(ROOT, "experiments/results/attn"), help="results folder")
    ap.add_argument("--name", default="attn-torch", help="file name (without .md/.csv)")
    ap.add_argument("--cudnn-thd", action="store_true",
                    help="also run cuDNN on thd (nested tensors; see the header: wrong and faulting in 2.11)")
    a = ap.parse_args()
    D = a.d
    G = a.gqa
    if G < 1 or H % G:
        sys.exit(f"attn_bench_torch.py: --gqa {G} must divide the {H} query heads")
    sizes = [int(x) for x in a.s.split(",")]
    layouts = [x for x in a.layouts.split(",") if x]
    gpu = torch.cuda.get_device_name(0)
    print(f"PyTorch {torch.__version__} SDPA, {gpu}, {tc.date()}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'backend':<7} {'layout':<6} {'mask':<7} {'s':>6}  {'fwd ms':>9} {'bwd ms':>9} {'f+b ms':>9}  "
          f"{'fwd TF/s':>8} {'bwd TF/s':>8} {'f+b TF/s':>8}  check")
    rows = []
    nan = float("nan")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, a.name)
    # the CSV row by row, so that rows made before a fault that ends the process (a CUDA error) are kept
    w = tc.Csv(path + ".csv", ["impl", "layout", "mask", "s", "fwd_ms", "bwd_ms", "fwdbwd_ms", "fwd_tflops",
                               "bwd_tflops", "fwdbwd_tflops", "check", "h_kv", "torch"])
    about = None  # the libraries, read after the first case has loaded them
    names = [x for x in a.backends.split(",") if x]
    for name in names:
        if name not in ALL:
            sys.exit(f"attn_bench_torch.py: unknown backend {name} (known: {', '.join(ALL)})")
    for name in names:
        for layout in layouts:
            if name == "cudnn" and layout == "thd" and not a.cudnn_thd:
                continue
            for causal in (False, True):
                mask = "causal" if causal else "none"
                try:
                    checked = check_small(name, layout, causal)
                except Exception as e:  # noqa: BLE001 (a backend that refuses a layout: recorded)
                    checked = "unsupported: " + one_line(e)
                for s in sizes:
                    flops = 4 * B * H * s * s * D * (0.5 if causal else 1)
                    if checked.startswith("unsupported"):
                        r = (name, layout, mask, s, nan, nan, nan, nan, nan, nan, checked)
                    else:
                        try:
                            tf, tb, tfb, finite, why = run(name, layout, s, causal, a)
                            verdict = "NON-FINITE" if not finite else why or checked
                            r = (name, layout, mask, s, tf, tb, tfb, flops / tf / 1e9, 2.5 * flops / tb / 1e9,
                                 3.5 * flops / tfb / 1e9, verdict)
                        except Exception as e:  # noqa: BLE001
                            r = (name, layout, mask, s, nan, nan, nan, nan, nan, nan, "failed: " + one_line(e))
                    torch.cuda.empty_cache()
                    rows.append(r)
                    about = about or libraries(names)
                    w.row([r[0], r[1], r[2], r[3], f"{r[4]:.4f}", f"{r[5]:.4f}", f"{r[6]:.4f}", f"{r[7]:.2f}",
                           f"{r[8]:.2f}", f"{r[9]:.2f}", r[10], H // G, about])
                    print(f"{r[0]:<7} {r[1]:<6} {r[2]:<7} {r[3]:>6}  {r[4]:9.3f} {r[5]:9.3f} {r[6]:9.3f}  "
                          f"{r[7]:8.1f} {r[8]:8.1f} {r[9]:8.1f}  {r[10]}", flush=True)
    w.close()
    table = [[r[0], r[1], r[2], r[3], f"{r[4]:.3f}", f"{r[5]:.3f}", f"{r[6]:.3f}", f"{r[7]:.1f}", f"{r[8]:.1f}",
              f"{r[9]:.1f}", r[10]] for r in rows]
    tc.write_markdown(path + ".md", "PyTorch SDPA (FlashAttention-2, cuDNN) and FlashAttention-4", tc.run_info(gpu), [
        f"TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED={os.environ.get('TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED')}",
        f"libraries: {about}",
        f"b={B}, h={H}, h_kv={H // G}, d={D}, bf16; SDPA: bshd inputs as [b, h, s, d] views, thd as nested jagged tensors; "
        f"FA4: flash_attn_func on [b, s, h, d], thd through flash_attn_varlen_func (cu_seqlens), pack_gqa its own "
        f"choice (fa4-nopack: False); "
        f"FLOPs fwd 4*b*h*s^2*d (halved when causal), bwd 2.5x, fwd+bwd 3.5x; median of CUDA-event "
        f"timings, warm-up filling {a.warm_ms:g} ms, at least {a.iters} calls filling {a.min_ms:g} ms"],
        tc.table(["backend", "layout", "mask", "s", "fwd ms", "bwd ms", "fwd+bwd ms", "fwd TFLOP/s", "bwd TFLOP/s",
                  "fwd+bwd TFLOP/s", "check"], table, ["l"] * 4 + ["r"] * 6 + ["l"]))
    print(f"wrote {path}.md and .csv")


if __name__ == "__main__":
    main()
