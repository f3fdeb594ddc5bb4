"""The fused merge's cost in cycles and in clock (scripts/gpu/attn_merge_power.sh; issue 52 item 3).

Usage: merge_power.py [--ncu NCU.csv] [--lab LAB.log --smi SMI.csv]
  NCU.csv  ncu --csv --metrics gpu__time_duration.sum,sm__cycles_elapsed.max on attn_merge_bench.lua (clocks
           locked at base): per (layout, mask) the plain step's kernel (its own template: the TMA store of O)
           runs before and after the merges' kernel (the merge template), whose timed run holds the f32
           launches then the bf16 ones (the bench's --dtypes order); the medians of each set side by side
  LAB.log  the lab forward's output, each line led by its time ("%Y/%m/%d %H:%M:%S.%N"): the phases end at
           its plain line (TFLOP/s), its f32 line and its bf16 line, each starting at the line before it
  SMI.csv  nvidia-smi's samples (timestamp, clocks.sm, power.draw, temperature, throttle reasons)
Prints two markdown tables: the merge's cost at base clocks (cycles), and each lab phase's mean SM clock and
power (its last two thirds, past the warm-up's transition) beside the lab's own time and cost.
"""
import argparse
import csv
import datetime
import re
import statistics
import sys


def num(x):
    return float(x.replace(",", ""))


def ncu_runs(path):
    """[(kernel name, [(ns, cycles)])]: consecutive launches of one kernel template, in launch order."""
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.reader(lines))
    head = rows[0]
    ix = {h: i for i, h in enumerate(head)}
    by_id = {}
    for r in rows[1:]:
        if len(r) < len(head):
            continue
        k = by_id.setdefault(int(r[ix["ID"]]), {"name": r[ix["Kernel Name"]]})
        unit = r[ix["Metric Unit"]]
        v = num(r[ix["Metric Value"]])
        if r[ix["Metric Name"]] == "gpu__time_duration.sum":
            k["ns"] = v * {"ns": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "nsecond": 1}.get(unit, 1)
        elif r[ix["Metric Name"]] == "sm__cycles_elapsed.max":
            k["cyc"] = v
    runs = []
    for i in sorted(by_id):
        k = by_id[i]
        tmpl = re.sub(r"\(.*$", "", k["name"])
        if runs and runs[-1][0] == tmpl:
            runs[-1][1].append((k["ns"], k["cyc"]))
        else:
            runs.append((tmpl, [(k["ns"], k["cyc"])]))
    return runs


def ncu_table(path):
    runs = ncu_runs(path)
    if not runs:
        print("no fwd_kernel launches in", path)
        return False
    plain_t = runs[0][0]  # the bench's first call is the plain step
    cases = [("bshd", "none"), ("bshd", "causal"), ("thd", "none"), ("thd", "causal")]
    print("Merge cost at base clocks (Nsight Compute locks them, and flushes the caches before each launch; medians of")
    print("each set's launches):\n")
    print("| layout | mask | plain us | f32 us | f32 cost | bf16 us | bf16 cost | plain Mcycles | f32 Mcycles |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    n = 0
    for i, (t, ls) in enumerate(runs):
        if t == plain_t or len(ls) < 4:
            continue  # the plain step's launches, or a check's single merge launches
        k = len(ls) // 2
        before = runs[i - 1][1][1:] if i > 0 else []  # its first: the untimed first call or a check's
        after = runs[i + 1][1][:-1] if i + 1 < len(runs) else []
        plain = before + after
        med = lambda xs, j: statistics.median(x[j] for x in xs)
        p, f, b = med(plain, 0), med(ls[:k], 0), med(ls[k:], 0)
        lay, mask = cases[n] if n < len(cases) else ("?", "?")
        print("| %s | %s | %.1f | %.1f | %+.1f%% | %.1f | %+.1f%% | %.3f | %.3f |" % (
            lay, mask, p / 1e3, f / 1e3, 100 * (f / p - 1), b / 1e3, 100 * (b / p - 1), med(plain, 1) / 1e6,
            med(ls[:k], 1) / 1e6))
        n += 1
    print()
    return n > 0


def stamp(s):
    d, t = s.split()[:2]
    sec, frac = (t.split(".") + ["0"])[:2]
    return datetime.datetime.strptime(d + " " + sec, "%Y/%m/%d %H:%M:%S").timestamp() + float("0." + frac)


def timed_lines(path):
    """[(seconds, text)]: the lines of a log whose lines are led by their time ("%Y/%m/%d %H:%M:%S.%N")."""
    lines = []
    for l in open(path, errors="replace"):
        m = re.match(r"(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) (.*)", l.rstrip("\n"))
        if m:
            lines.append((stamp(m.group(1)), m.group(2)))
    return lines


def smi_samples(path):
    """[(seconds, SM MHz, W, throttle reasons)]: nvidia-smi's CSV samples (timestamp, clocks.sm, power.draw, ...)."""
    samples = []
    for l in open(path):
        p = [x.strip() for x in l.split(",")]
        if len(p) < 5 or "MHz" not in p[1]:
            continue
        samples.append((stamp(p[0]), num(p[1].split()[0]), num(p[2].split()[0]), p[4]))
    return samples


def lab_table(lab, smi):
    ends, lines = {}, timed_lines(lab)
    if not lines:
        print("no lab lines in", lab)
        return False
    # a phase: from the line before its own (the last thing the lab did before it: its start, a check) to its line
    for i, (t, x) in enumerate(lines):
        ph = "plain" if "TFLOP/s" in x else "f32" if "merged into f32" in x else "bf16" if "merged into bf16" in x else None
        if ph and i > 0:
            ends[ph] = (lines[i - 1][0], t, x)
    samples = smi_samples(smi)
    print("The lab forward at 4k causal (bshd, b 2, h 16, d 128, pipe 2), each phase timed by the lab and its SM")
    print("clock and power from nvidia-smi (mean of the phase's last two thirds):\n")
    print("| phase | lab time | clock MHz | power W | samples | throttle reasons seen |")
    print("|---|---|---:|---:|---:|---|")
    clk = {}
    for ph in ("plain", "f32", "bf16"):
        if ph not in ends:
            continue
        a, b, x = ends[ph]
        a += (b - a) / 3
        s = [r for r in samples if a <= r[0] <= b]
        if not s:
            continue
        clk[ph] = statistics.mean(r[1] for r in s)
        what = re.sub(r"^s=\s*\d+ window \S+ pipe=\d+\s+", "", x)
        print("| %s | %s | %.0f | %.0f | %d | %s |" % (ph, what, clk[ph], statistics.mean(r[2] for r in s), len(s),
                                                      " ".join(sorted({r[3] for r in s}))))
    print()
    for ph in ("f32", "bf16"):
        if ph in clk and "plain" in clk:
            print("- %s: the SM clock %+.1f%% against the plain step's" % (ph, 100 * (clk[ph] / clk["plain"] - 1)))
    print()
    return bool(clk)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu")
    ap.add_argument("--lab")
    ap.add_argument("--smi")
    a = ap.parse_args()
    if not a.ncu and not a.lab:
        ap.error("--ncu, or --lab with --smi, or both")
    if bool(a.lab) != bool(a.smi):
        ap.error("--lab and --smi go together")
    ok = ncu_table(a.ncu) if a.ncu else True
    ok = (lab_table(a.lab, a.smi) if a.lab else True) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
