"""Per-instruction counts of Nsight Compute's SASS source page, side by side (FA4-GAP.md section 14).

Usage: prof_sass.py A.sass.csv [B.sass.csv ...] [--top N] [--loops N] [--reasons LO:HI]
Reads the exports scripts/gpu/attn_prof.sh writes for each report (`LABEL.sass.csv`: ncu --page source --csv,
one row an instruction with its warp-level executions and stall samples) and prints for each: the executed
warp instructions in all, by opcode (the most frequent first), and the N instructions with the most stall
samples (their share, executions and text), so that two kernels' dynamic instruction mixes and hot spots can
be set side by side.
--loops N: the N runs of consecutive instructions with one execution count (a loop body, a role's per-item
code) that executed the most, by offset from the kernel's first instruction: a wait's poll loop shows as a
short run executed many times an item (FA4-GAP.md section 28: 306M of the backward's 1311M).
--reasons LO:HI: the stall reasons' shares of the samples at offsets [LO, HI) (hex), e.g. the consumers'
loop, whose composition two kernels can be compared by.
"""
import collections
import csv
import re
import sys


def opcode(src):
    """An instruction's opcode with its modifiers (BAR.SYNC.DEFER_BLOCKING), its predicate taken off."""
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", src).split(" ")[0]


def load(path):
    """The kernel's name and a row an instruction: opcode, executions, stall samples, text, address, the threads
    a warp executed it with, the samples by stall reason."""
    rows = list(csv.reader(open(path, newline="")))
    head = rows[1]  # rows[0] names the kernel
    ix = {h: i for i, h in enumerate(head)}
    reasons = [h for h in head if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[2:]:
        if len(r) < len(head):
            continue
        src = r[ix["Source"]].strip()
        op = opcode(src).split(".")[0]
        out.append((op, int(r[ix["Instructions Executed"]] or 0), int(r[ix["Warp Stall Sampling (All Samples)"]] or 0), src,
                    int(r[ix["Address"]], 16), float(r[ix["Avg. Threads Executed"]] or 0),
                    {k[6:]: int(r[ix[k]] or 0) for k in reasons}))
    return rows[0][1] if len(rows[0]) > 1 else path, out


def loops(ins, n):
    """The n runs of consecutive instructions of one execution count that executed the most."""
    base, samples, runs = ins[0][4], sum(x[2] for x in ins) or 1, []
    for op, ex, smp, src, addr, thr, _ in ins:
        if runs and runs[-1]["ex"] == ex:
            runs[-1].update(n=runs[-1]["n"] + 1, smp=runs[-1]["smp"] + smp, last=addr)
        else:
            runs.append(dict(ex=ex, n=1, smp=smp, first=addr, last=addr, thr=thr, src=src))
    print(f"  the {n} runs of one execution count that executed the most (offsets from the kernel's start):")
    for r in sorted(runs, key=lambda r: -r["ex"] * r["n"])[:n]:
        print(f"    {r['first'] - base:#07x}-{r['last'] - base:#07x} {r['n']:4d} instructions x {r['ex'] / 1e6:6.2f}M = "
              f"{r['ex'] * r['n'] / 1e6:7.1f}M, {100 * r['smp'] / samples:4.1f}% of the samples, {r['thr']:.0f} threads: {r['src'][:50]}")


def reasons(ins, lo, hi):
    """The stall reasons' shares of the samples at offsets [lo, hi)."""
    base, tot = ins[0][4], collections.Counter()
    for x in ins:
        if lo <= x[4] - base < hi:
            tot.update(x[6])
    n = sum(tot.values()) or 1
    print(f"  stall reasons at offsets [{lo:#x}, {hi:#x}), {n} samples: " +
          ", ".join(f"{k} {100 * v / n:.1f}%" for k, v in tot.most_common() if v))


def main(argv):
    opts = {"--top": "20", "--loops": None, "--reasons": None}
    for k in opts:
        if k in argv:
            i = argv.index(k)
            opts[k] = argv[i + 1]
            del argv[i:i + 2]
    top = int(opts["--top"])
    if not argv:
        sys.exit(__doc__)
    for path in argv:
        name, ins = load(path)
        total = sum(x[1] for x in ins)
        samples = sum(x[2] for x in ins) or 1
        byop = collections.Counter()
        for op, ex, *_ in ins:
            byop[op] += ex
        print(f"== {path}: {name[:100]}")
        print(f"  {total / 1e6:.0f}M warp instructions executed, {samples} stall samples")
        print("  by opcode: " + ", ".join(f"{op} {n / 1e6:.0f}M" for op, n in byop.most_common(24)))
        print(f"  the {top} instructions with the most stall samples:")
        for op, ex, smp, src, *_ in sorted(ins, key=lambda x: -x[2])[:top]:
            print(f"    {100 * smp / samples:5.1f}%  {ex / 1e6:7.2f}M  {src[:80]}")
        if opts["--loops"]:
            loops(ins, int(opts["--loops"]))
        if opts["--reasons"]:
            lo, hi = (int(x, 16) for x in opts["--reasons"].split(":"))
            reasons(ins, lo, hi)


if __name__ == "__main__":
    main(sys.argv[1:])
