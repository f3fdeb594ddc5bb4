#!/usr/bin/env python3
"""hopper_report.py — the results file of one scripts/gpu/attn_hopper.sh run (issue 19): dl.attn's
forward and backward with each variant of the Hopper kernels (and the portable ones) beside PyTorch
SDPA's cuDNN and flash from the same call, the ratios issue 19 asks for (at least 0.80 of cuDNN at
s >= 8k, at least flash at s >= 4k, forward and backward), and the specs' and sanitizers' summaries.

  python3 experiments/attn/hopper_report.py <the run's $OUT folder> <out.md> [--commit C] [--date D]
      [--command TEXT]

The header is experiments/torch_common.py's (distlab.bench.markdown's): the device, the libraries
and the benches' own commands are read from the run's files (attn-torch.md and each variant's
attn-distlab.md); --commit and --date default to the run's (the first variant's header).
"""
import argparse
import csv
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_common as tc  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("out")
ap.add_argument("--commit", help="default: the run's (its first variant's header)")
ap.add_argument("--date", help="default: the run's (its first variant's header)")
ap.add_argument("--command", default="bash scripts/gpu/attn_hopper.sh",
                help="the device call's command (default: bash scripts/gpu/attn_hopper.sh)")
a = ap.parse_args()


def rows(path):
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []


def tail(path, pat):
    if not os.path.exists(path):
        return "not run"
    hits = [l.strip() for l in open(path, errors="replace") if re.search(pat, l)]
    return hits[-1] if hits else "no summary"


torch = {(r["impl"], r["layout"], r["mask"], int(r["s"])): r for r in rows(os.path.join(a.run, "attn-torch.csv"))}
variants = {}
for d in sorted(glob.glob(os.path.join(a.run, "*", "attn-distlab.csv"))):
    variants[os.path.basename(os.path.dirname(d))] = {(r["layout"], r["mask"], int(r["s"])): r for r in rows(d)}
order = [v for v in ("hopper", "hopper-oldorder", "hopper-red", "hopper-turns", "hopper-noturns", "portable") if v in variants]  # hopper-red, hopper-turns: runs before 2026-11-27 c
order += [v for v in variants if v not in order]
heads = {v: tc.read_header(os.path.join(a.run, v, "attn-distlab.md")) for v in order}
torch_head = tc.read_header(os.path.join(a.run, "attn-torch.md"))
first = next((heads[v] for v in order if heads[v]), {})
device = first.get("device", "")
checks = {v: sorted({r["check"] for r in variants[v].values()}) for v in order}

commit = a.commit or first.get("commit") or tc.commit()
date = a.date or first.get("date") or tc.date()
info = {"device": device or "see the bench logs", "date": date, "commit": commit,
        "command": f"{a.command} (one device call: build, the attn specs with the Hopper kernels on, "
                   "compute-sanitizer on experiments/attn/hopper_small.lua, experiments/attn/attn_bench_torch.py, "
                   "then experiments/attn/attn_bench.lua once a variant); this file: "
                   f"python3 experiments/attn/hopper_report.py <$OUT> <this file> --commit {commit} --date '{date}'",
        "libraries": "distlab: " + first.get("libraries", "not recorded (a run before the libraries line)")
                     + "; PyTorch: " + torch_head.get("libraries", "not recorded")}
o = tc.header("dl.attn on Hopper: the wgmma/TMA forward and backward against PyTorch SDPA (issue 19)", info)
o.append("- the benches' commands: " + "; ".join(
    [f"{v}: {tc.code(heads[v]['command'])}" for v in order if heads[v].get("command")]
    + ([f"torch: {tc.code(torch_head['command'])}"] if torch_head.get("command") else [])))
o.append("- variants: hopper (dQ by bulk reductions), hopper-red (dQ by vector reductions; removed 2026-11-27), hopper-turns "
         "(DISTLAB_ATTN_HOPPER_BWD_TURNS=1, d 64; the default since 2026-11-27), hopper-noturns (DISTLAB_ATTN_HOPPER_BWD_TURNS=0), "
         "hopper-oldorder (DISTLAB_ATTN_HOPPER_BWD_ORDER=0: the backward's GEMM order before FA4's, 2026-11-29), "
         "portable (DISTLAB_ATTN_HOPPER=0)")
o.append(f"- specs: {tail(os.path.join(a.run, 'attn-spec.log'), r'passed, .* failed')}")
for tool in ("memcheck", "racecheck"):
    summ = sorted({l.strip() for f in glob.glob(os.path.join(a.run, f"san-{tool}", "sanitizer-*.log"))
                   for l in open(f, errors="replace") if "SUMMARY" in l})
    run = tail(os.path.join(a.run, f"san-{tool}.log"), "hopper_small")
    o.append(f"- compute-sanitizer {tool}: " + ("not run" if not summ and run == "not run" else
                                                f"{'; '.join(summ) or 'no summary'} ({run})"))
o.append("- data checked after timing (attn_bench: s=333, h=2 against the cpu twin): "
         + "; ".join(f"{v}: {', '.join(checks[v])}" for v in order))
o.append("")

for direction in ("fwd", "bwd"):
    o.append(f"## {'Forward' if direction == 'fwd' else 'Backward'} (TFLOP/s)\n")
    o.append("| layout | mask | s | " + " | ".join(order) + " | cuDNN | flash | best Hopper / cuDNN | best Hopper / flash |")
    o.append("|" + "---|" * (5 + len(order) + 2))
    keys = sorted({k for v in order for k in variants[v]}, key=lambda k: (k[0], k[1], k[2]))
    for lay, mask, s in keys:
        vals = [variants[v].get((lay, mask, s)) for v in order]
        f = [None if r is None else float(r[f"{direction}_tflops"]) for r in vals]
        cd = torch.get(("cudnn", "bshd", mask, s))  # cuDNN has no thd figure (attn_bench_torch.py's header)
        fl = torch.get(("flash", lay, mask, s)) or torch.get(("flash", "bshd", mask, s))
        cdv = None if cd is None else float(cd[f"{direction}_tflops"])
        flv = None if fl is None else float(fl[f"{direction}_tflops"])
        hop = [x for v, x in zip(order, f) if v.startswith("hopper") and x is not None]
        best = max(hop) if hop else None
        g = lambda x: "-" if x is None else f"{x:.1f}"
        r = lambda x, y: "-" if x is None or not y else f"{x / y:.3f}"
        o.append(f"| {lay} | {mask} | {s} | " + " | ".join(g(x) for x in f) + f" | {g(cdv)} | {g(flv)} | "
                 f"{r(best, cdv)} | {r(best, flv)} |")
    o.append("")
o.append("FLOPs: forward 4 b h s^2 d, halved when causal; backward 2.5x. Ours: median of device-event timings "
         "after 300 ms of warm-up, at least 600 ms timed; PyTorch: its calls over the same budget. cuDNN's thd "
         "rate is its bshd rate at the same work (PyTorch 2.11's nested-tensor cuDNN path is wrong).")
open(a.out, "w").write("\n".join(o) + "\n")
print("\n".join(o))
