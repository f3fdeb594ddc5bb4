"""Ours and FA4 under the power cap: each phase's time, SM clock and cycles (scripts/gpu/attn_clock.sh; issue 52).

Usage: clock_pair.py --smi SMI.csv LOG...
  LOG      one run of experiments/attn/attn_prof.lua or attn_prof_fa4.py with --stamp, each line led by its
           time ("%Y/%m/%d %H:%M:%S.%N"); its name's stem is the run's label (e.g. fa4-1, ours-1). A phase
           (fwd, bwd) runs from its "stamp X start" line to its "stamp X end" line; its time is the driver's own
           host clock between the two (the device synchronized at each), over the calls its header names
  SMI.csv  nvidia-smi's samples (timestamp, clocks.sm, power.draw, temperature, throttle reasons)
Prints a markdown table (each run's phases: ms a call, TFLOP/s, the mean SM clock and power over the phase's last
two thirds, Mcycles a call = ms x MHz) and ours over FA4 in time and in cycles, from the runs' means. Exit 1 when
a run has no phases, no samples fall in a phase, or a run's check is not ok.
"""
import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from merge_power import smi_samples, timed_lines  # noqa: E402  (the same nvidia-smi and line-time formats)


def read_run(path):
    """(shape dict, {phase: (wall start, wall end, ms a call)}, check verdict line or None)."""
    shape, marks, verdict = {}, {}, None
    for t, x in timed_lines(path):
        m = re.search(r"b=(\d+) h=(\d+) s=(\d+) d=(\d+) bf16 (\w+) mask (\w+) on .*, (\d+) calls of fwd then (\d+)", x)
        if m:
            shape = dict(b=int(m.group(1)), h=int(m.group(2)), s=int(m.group(3)), d=int(m.group(4)),
                         layout=m.group(5), mask=m.group(6), fwd=int(m.group(7)), bwd=int(m.group(8)))
        m = re.search(r"stamp (fwd|bwd) (start|end) \(host ([0-9.]+) ms\)", x)
        if m:
            marks[(m.group(1), m.group(2))] = (t, float(m.group(3)))
        m = re.search(r": (bshd|thd) (none|causal) s=\d+ d=\d+: (.*)$", x)
        if m:
            verdict = m.group(3).split()[0]  # "ok", or "WRONG (n)" / FA4's "NON-FINITE ..." first word
    phases = {}
    for ph in ("fwd", "bwd"):
        if (ph, "start") in marks and (ph, "end") in marks and shape:
            (w0, h0), (w1, h1) = marks[(ph, "start")], marks[(ph, "end")]
            phases[ph] = (w0, w1, (h1 - h0) / shape[ph])
    return shape, phases, verdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smi", required=True)
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    samples = smi_samples(a.smi)
    ok = True
    rows, by = [], {}
    for path in a.logs:
        label = os.path.splitext(os.path.basename(path))[0]
        impl = label.split("-")[0]
        shape, phases, verdict = read_run(path)
        if not phases:
            print("- %s: no stamped phases in %s" % (label, path))
            ok = False
            continue
        if verdict is None:
            verdict = "none (the run ended before its check)"
        if verdict != "ok":
            print("- %s: check %s" % (label, verdict))
            ok = False
        flops = 4.0 * shape["b"] * shape["h"] * shape["s"] ** 2 * shape["d"] * (0.5 if shape["mask"] == "causal" else 1)
        for ph, (w0, w1, ms) in phases.items():
            s = [r for r in samples if w0 + (w1 - w0) / 3 <= r[0] <= w1]
            if not s:
                print("- %s %s: no samples in the phase (%.2f s)" % (label, ph, w1 - w0))
                ok = False
                continue
            mhz, watt = statistics.mean(r[1] for r in s), statistics.mean(r[2] for r in s)
            f = flops * (2.5 if ph == "bwd" else 1.0)
            cyc = ms * 1e-3 * mhz * 1e6
            rows.append((label, ph, ms, f / (ms * 1e-3) / 1e12, mhz, watt, cyc / 1e6, len(s),
                         " ".join(sorted({r[3] for r in s})), verdict))
            by.setdefault((impl, ph), []).append((ms, mhz, cyc))
    if rows:
        sh = shape
        print("b %d, h %d, s %d, d %d, bf16, %s, mask %s, %d forward then %d backward calls; the clock and power: "
              "nvidia-smi's samples over each phase's last two thirds\n" % (sh["b"], sh["h"], sh["s"], sh["d"],
                                                                            sh["layout"], sh["mask"], sh["fwd"], sh["bwd"]))
        print("| run | phase | ms a call | TFLOP/s | SM clock MHz | power W | Mcycles a call | samples | throttle reasons | check |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
        for r in rows:
            print("| %s | %s | %.3f | %.1f | %.0f | %.0f | %.3f | %d | %s | %s |" % r)
        print()
    for ph in ("fwd", "bwd"):
        o, f = by.get(("ours", ph)), by.get(("fa4", ph))
        if not o or not f:
            continue
        mean = lambda xs, j: statistics.mean(x[j] for x in xs)
        print("- %s: ours over FA4, time %.3fx (ours %.3f ms, FA4 %.3f), SM clock %.3fx (%.0f against %.0f MHz), "
              "cycles %.3fx (%.3f against %.3f Mcycles a call); speed ratios (FA4 / ours): time %.3f, cycles %.3f" % (
                  ph, mean(o, 0) / mean(f, 0), mean(o, 0), mean(f, 0), mean(o, 1) / mean(f, 1), mean(o, 1), mean(f, 1),
                  mean(o, 2) / mean(f, 2), mean(o, 2) / 1e6, mean(f, 2) / 1e6, mean(f, 0) / mean(o, 0),
                  mean(f, 2) / mean(o, 2)))
    return 0 if ok and rows else 1


if __name__ == "__main__":
    sys.exit(main())
