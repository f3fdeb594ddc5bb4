"""The backward's (or forward's) consumer loop in phases, from Nsight Compute's SASS source page (FA4-GAP.md
sections 16 and 17).

Usage: phases.py LABEL.sass.csv CYCLES [SMS] [--all]
LABEL.sass.csv: scripts/gpu/attn_prof.sh's export (one row an instruction, in address order, with its warp-level
executions and stall samples); CYCLES: the kernel's gpc__cycles_elapsed.max from the same report (the summary's
table); SMS: 132 (an H200).
The loop: the instructions from the first to the last whose executions equal the HGMMAs' most common count (once
an item a consumer warp; the code between them, polls and masked paths included, is the loop's). Its phases start
at each wgmma fence or wait (WARPGROUP.ARRIVE, WARPGROUP.DEPBAR), named barrier (BAR.SYNC, BAR.ARV), mbarrier wait
(the first SYNCS.PHASECHK of a poll) and proxy fence; each phase's share of the loop's stall samples times an
item's cycles (CYCLES x SMS / items, items = that count / 8 consumer warps) is its time an item. Phases under 1%
of the loop are folded into the one before unless --all.
"""
import collections
import sys

from prof_sass import load, opcode


def starts_phase(op, prev):
    if op.startswith(("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "BAR.SYNC", "BAR.ARV", "FENCE.VIEW.ASYNC")):
        return True
    return op.startswith("SYNCS.PHASECHK") and not (prev or "").startswith("SYNCS.PHASECHK")


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    if len(args) < 2:
        sys.exit(__doc__)
    path, cycles = args[0], float(args[1])
    sms = int(args[2]) if len(args) > 2 else 132
    ins = [(src, e, s) for _, e, s, src in load(path)[1]]  # text, executions, stall samples
    counts = collections.Counter(e for s, e, _ in ins if "HGMMA" in s)
    per_item = counts.most_common(1)[0][0]
    at = [i for i, (_, e, _) in enumerate(ins) if e == per_item]
    lo, hi = at[0], at[-1]
    loop = ins[lo:hi + 1]
    total = sum(s for _, _, s in loop) or 1
    item_cycles = cycles * sms / (per_item / 8)
    phases = []  # [first instruction's text, index, samples, executions]
    prev = None
    for k, (src, e, s) in enumerate(loop):
        op = opcode(src)
        if not phases or starts_phase(op, prev):
            phases.append([src, lo + k, 0, 0])
        phases[-1][2] += s
        phases[-1][3] += e
        prev = op
    if "--all" not in argv:
        folded = []
        for p in phases:
            if folded and p[2] < 0.01 * total:
                folded[-1][2] += p[2]
                folded[-1][3] += p[3]
            else:
                folded.append(p)
        phases = folded
    print(f"{path}: loop [{lo}, {hi}], {per_item / 8:.0f} items, {item_cycles:.0f} cycles an item")
    print(f"{'from':>6} {'cycles':>7} {'share':>6} {'instr/item':>10}  first instruction")
    for src, k, s, e in phases:
        print(f"{k:6d} {item_cycles * s / total:7.0f} {100 * s / total:5.1f}% {e / per_item:10.1f}  {src[:70]}")


if __name__ == "__main__":
    main(sys.argv[1:])
