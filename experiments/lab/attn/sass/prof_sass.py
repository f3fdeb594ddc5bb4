"""Per-instruction counts of Nsight Compute's SASS source page, side by side (FA4-GAP.md section 14).

Usage: prof_sass.py A.sass.csv [B.sass.csv ...] [--top N]
Reads the exports scripts/gpu/attn_prof.sh writes for each report (`LABEL.sass.csv`: ncu --page source --csv,
one row an instruction with its warp-level executions and stall samples) and prints for each: the executed
warp instructions in all, by opcode (the most frequent first), and the N instructions with the most stall
samples (their share, executions and text), so that two kernels' dynamic instruction mixes and hot spots can
be set side by side.
"""
import collections
import csv
import re
import sys


def opcode(src):
    """An instruction's opcode with its modifiers (BAR.SYNC.DEFER_BLOCKING), its predicate taken off."""
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", src).split(" ")[0]


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    head = rows[1]  # rows[0] names the kernel
    ix = {h: i for i, h in enumerate(head)}
    out = []
    for r in rows[2:]:
        if len(r) < len(head):
            continue
        src = r[ix["Source"]].strip()
        op = opcode(src).split(".")[0]
        out.append((op, int(r[ix["Instructions Executed"]] or 0),
                    int(r[ix["Warp Stall Sampling (All Samples)"]] or 0), src))
    return rows[0][1] if len(rows[0]) > 1 else path, out


def main(argv):
    top = 20
    if "--top" in argv:
        i = argv.index("--top")
        top = int(argv[i + 1])
        del argv[i:i + 2]
    if not argv:
        sys.exit(__doc__)
    for path in argv:
        name, ins = load(path)
        total = sum(x[1] for x in ins)
        samples = sum(x[2] for x in ins) or 1
        byop = collections.Counter()
        for op, ex, _, _ in ins:
            byop[op] += ex
        print(f"== {path}: {name[:100]}")
        print(f"  {total / 1e6:.0f}M warp instructions executed, {samples} stall samples")
        print("  by opcode: " + ", ".join(f"{op} {n / 1e6:.0f}M" for op, n in byop.most_common(24)))
        print(f"  the {top} instructions with the most stall samples:")
        for op, ex, smp, src in sorted(ins, key=lambda x: -x[2])[:top]:
            print(f"    {100 * smp / samples:5.1f}%  {ex / 1e6:7.2f}M  {src[:80]}")


if __name__ == "__main__":
    main(sys.argv[1:])
