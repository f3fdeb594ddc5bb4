#!/usr/bin/env python3
"""report.py — the results file of one scripts/gpu/hopper_lab.sh run: the lab forward's rate
(both main loops, bshd and thd) beside PyTorch's cuDNN and flash SDPA from the same call, and the
fused merge's cost.

  python3 experiments/lab/attn/hopper/report.py <the run's $OUT folder> <out.md> --commit C --date D
"""
import argparse, csv, os, re

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("out")
ap.add_argument("--commit", required=True)
ap.add_argument("--date", required=True)
a = ap.parse_args()

ours = {}  # (layout, mask, s, pipe) -> (tflops, {acc dtype: merge %})
device = layout = None
dh = 128
for line in open(os.path.join(a.run, "fwd-bench.log")):
    m = re.match(r"device (.*?), sm_90; (\w+) bf16.* d=(\d+)", line)
    if m:
        device, layout, dh = m.group(1), m.group(2), int(m.group(3))
        continue
    m = re.match(r"s=\s*(\d+) window \((-?\d+),(-?\d+)\) pipe=(\d)\s+([\d.]+) us\s+(merged into (\w+) \(([-+\d.]+)%|([\d.]+) TFLOP/s)", line)
    if not m:
        continue
    s, wl, wr, pipe = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))
    mask = {(-1, -1): "none", (-1, 0): "causal"}[(wl, wr)]
    key = (layout, mask, s, pipe)
    t, mg = ours.get(key, (None, {}))
    if m.group(7) is not None:
        mg[m.group(7)] = float(m.group(8))
    else:
        t = float(m.group(9))
    ours[key] = (t, mg)
checks = open(os.path.join(a.run, "fwd-bench.log")).read().count("check: all ok")
failed = open(os.path.join(a.run, "fwd-bench.log")).read().count("check: FAILED")

torch = {}
for r in csv.DictReader(open(os.path.join(a.run, "attn-torch-hopper.csv"))):
    torch[(r["impl"], r["layout"], r["mask"], int(r["s"]))] = float(r["fwd_tflops"])
san = []
for tool in ("memcheck", "racecheck"):
    p = os.path.join(a.run, f"san-{tool}.log")
    if os.path.exists(p):
        last = [l.strip() for l in open(p) if "SUMMARY" in l]
        san.append(f"{tool}: {last[-1] if last else 'no summary'}")

o = []
o.append(f"# The Hopper forward (kernels/attn/hopper/) at head dim {dh} against PyTorch SDPA\n")
o.append(f"- device: {device}")
o.append(f"- date: {a.date}")
o.append(f"- commit: `{a.commit}`")
o.append("- command: `bash scripts/gpu/hopper_lab.sh` (one device call: build for sm_90a, the small checks, "
         "compute-sanitizer, `fwd --check --merge --s 4096,8192,16384,32768 --pipe 0,1` (bshd, b=2 h=16), "
         "`fwd --check --merge --h 16 --thd s,s` for each s, then `python3 experiments/attn/attn_bench_torch.py "
         f"--layouts bshd --d {dh}`){' with LAB_D=64' if dh == 64 else ''}; this file: `python3 experiments/lab/attn/hopper/report.py <$OUT> <this file> "
         f"--commit {a.commit} --date '{a.date}'`")
o.append(f"- d={dh}, bf16, h=16; bshd b=2 x s; thd two sequences of s (the same work). FLOPs 4 b h s^2 d, halved "
         "when causal. Ours: mean over at least 600 ms of launches after 300 ms of warm-up; PyTorch: the "
         "median of its calls over the same budget.")
o.append(f"- checked after timing, each case against the fp64 reference on sampled rows (normwise O error "
         f"~2.4e-3 dense, ~6e-4 causal; a planted 2% error fails): {checks} runs all ok, {failed} failed; "
         + "; ".join(san))
o.append("- cuDNN has no thd row here (PyTorch 2.11's nested-tensor cuDNN path is wrong and faults; "
         "experiments/attn/attn_bench_torch.py): thd is set against cuDNN's bshd rate at the same work.\n")
o.append("| layout | mask | s | ours pipe 0 | ours pipe 1 | cuDNN | flash | best / cuDNN | best / flash | "
         "merge f32 pipe 0 | merge f32 pipe 1 | merge bf16 pipe 0 | merge bf16 pipe 1 | merge f32, best vs best | "
         "merge bf16, best vs best |")
o.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for lay in ("bshd", "thd"):
    for mask in ("none", "causal"):
        for s in sorted({k[2] for k in ours if k[0] == lay}):
            p0 = ours.get((lay, mask, s, 0), (None, {}))
            p1 = ours.get((lay, mask, s, 1), (None, {}))
            best = max(x for x in (p0[0], p1[0]) if x is not None)
            cd = torch.get(("cudnn", "bshd", mask, s))
            fl = torch.get(("flash", "bshd", mask, s))
            f = lambda x: "-" if x is None else f"{x:.1f}"
            g = lambda x: "-" if x is None else f"{x:+.1f}%"

            def best_vs_best(dt):  # the faster merged loop against the faster plain loop (rates)
                mt = [t / (1 + m[dt] / 100) for t, m in (p0, p1) if t is not None and dt in m]
                return None if not mt else (best / max(mt) - 1) * 100
            o.append(f"| {lay} | {mask} | {s} | {f(p0[0])} | {f(p1[0])} | {f(cd)} | {f(fl)} | "
                     f"{'-' if not cd else f'{best / cd:.3f}'} | {'-' if not fl else f'{best / fl:.3f}'} | "
                     f"{g(p0[1].get('f32'))} | {g(p1[1].get('f32'))} | {g(p0[1].get('bf16'))} | {g(p1[1].get('bf16'))} | "
                     f"{g(best_vs_best('f32'))} | {g(best_vs_best('bf16'))} |")
o.append("\nRates in TFLOP/s. Merge cost: the fused-merge step (the step's (O, LSE) folded into a running "
         "(acc_out, acc_lse), acc_out fp32 or bf16 (CP's accumulator has q's dtype)) against the plain step, same "
         "loop, same call; best vs best: the fastest merged run against the faster plain loop.")
open(a.out, "w").write("\n".join(o) + "\n")
print("\n".join(o))
