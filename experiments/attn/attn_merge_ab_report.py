"""The A/B report of scripts/gpu/attn_merge.sh's VARIANTS: every run's merge costs side by side.

Usage: attn_merge_ab_report.py DIR NAME [NAME ...] --rounds R [--made-by CMD]
Reads DIR/NAME-rR/attn-merge.csv and .md (attn_merge_bench.lua's results, one a variant and round) and writes to
stdout a markdown report: each run's header (date, commit, command, libraries, kernels: the bench's own lines),
the cost of each merge over the plain step in its own run (round 1; round 2; ...) by variant, shape and running-out
dtype, every run's check, and each variant's range by dtype and mask (the issue-52 target's row, 4k causal, first).
Exits 1 where a run is missing or a check is not ok.
"""
import argparse
import csv
import os
import sys


def load(out, name, r):
    base = os.path.join(out, "%s-r%d" % (name, r), "attn-merge")
    rows = list(csv.DictReader(open(base + ".csv")))
    head = []
    for l in open(base + ".md"):
        if l.startswith("|"):
            break
        if l.startswith(("- date", "- commit", "- command", "- libraries", "- kernels")):
            head.append(l.rstrip("\n"))
    return rows, head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("names", nargs="+")
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--made-by", default="")
    a = ap.parse_args()
    runs, bad = {}, []
    for n in a.names:
        for r in range(1, a.rounds + 1):
            try:
                runs[(n, r)] = load(a.out, n, r)
            except (OSError, csv.Error) as e:
                bad.append("%s round %d: %s" % (n, r, e))
    print("# The fused merge's cost by variant (scripts/gpu/attn_merge.sh VARIANTS)\n")
    if a.made_by:
        print("Made by: `%s`\n" % a.made_by)
    print("Each run's header (attn_merge_bench.lua's own results file, `<variant>-r<round>/attn-merge.md`):\n")
    for (n, r), (_, head) in sorted(runs.items(), key=lambda x: (a.names.index(x[0][0]), x[0][1])):
        print("- **%s, round %d**" % (n, r))
        for l in head:
            print("  " + l)
    if bad:
        print("\nMissing runs: " + "; ".join(bad))
    if not runs:
        return 1
    first = next(iter(runs.values()))[0]
    dts = [first[0][k] for k in sorted(k for k in first[0] if k.startswith("dtype"))]
    shapes = [(x["layout"], x["mask"], x["s"]) for x in first]
    names = [n for n in a.names if any((n, r) in runs for r in range(1, a.rounds + 1))]
    print("\nCost of each merge over the plain step in its own run (merge / plain - 1; rounds separated by ';'):\n")
    cols = ["%s %s" % (n, dt) for dt in dts for n in names]
    print("| layout | mask | s | " + " | ".join(cols) + " | checks |")
    print("|---|---|---:|" + "---:|" * len(cols) + "---|")
    ranges, checks_bad = {}, 0
    for sh in shapes:
        cells, ok = [], True
        for i, dt in enumerate(dts):
            for n in names:
                v = []
                for r in range(1, a.rounds + 1):
                    if (n, r) not in runs:
                        continue
                    row = next((x for x in runs[(n, r)][0] if (x["layout"], x["mask"], x["s"]) == sh), None)
                    if row is None:
                        ok = False
                        continue
                    c = float(row["cost%d" % (i + 1)])
                    v.append(c)
                    ok = ok and row["check"] == "ok"
                    key = (n, dt, sh[1], 4096 if sh[1] == "causal" and int(sh[2]) == 4096 else "")
                    lo, hi = ranges.get(key, (c, c))
                    ranges[key] = (min(lo, c), max(hi, c))
                cells.append("; ".join("%+.1f%%" % (100 * c) for c in v))
        checks_bad += not ok
        print("| %s | %s | %s | %s | %s |" % (sh[0], sh[1], sh[2], " | ".join(cells), "ok" if ok else "NOT OK"))
    print("\nRanges over every round (min to max of the costs above):\n")
    for n in names:
        parts = []
        for dt in dts:
            for mask, tag in (("causal", 4096), ("causal", ""), ("none", "")):
                k = (n, dt, mask, tag)
                if k in ranges:
                    lo, hi = ranges[k]
                    what = "4k causal" if tag else ("other causal" if mask == "causal" else "no mask")
                    parts.append("%s %s %+.1f to %+.1f%%" % (dt, what, 100 * lo, 100 * hi))
        print("- %s: %s" % (n, "; ".join(parts)))
    print("\nChecked against fp64 (the bench's check, every timed call of every run): %s" %
          ("all ok" if not checks_bad and not bad else "%d shapes NOT OK, %d runs missing" % (checks_bad, len(bad))))
    return 1 if bad or checks_bad else 0


if __name__ == "__main__":
    sys.exit(main())
