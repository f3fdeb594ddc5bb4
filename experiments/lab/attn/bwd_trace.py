"""The Hopper backward's steps, from the lab's sums (bwd_kernel.cuh's HP_BWD_TRACE).

Usage: bwd_trace.py FILE [FILE...]
FILE: what the library wrote for DISTLAB_ATTN_HOPPER_BWD_TRACE (attn_hopper.cu's bwd_trace_write): three int32
(the grid's CTAs, BQ, HP_BT_WORDS), then uint64 [2 warpgroups][HP_BT_WORDS]: each BWD_ORDER step's SM clock
cycles summed over every CTA's items (bwd_trace_t's order), the meeting's arrival gaps (|warpgroup 1's
arrival less warpgroup 0's|, summed) and how often warpgroup 1 arrived last (warpgroup 0's row), and the items.
Prints a markdown table a file: each step's mean cycles an item for each warpgroup, and the meeting's gap.
"""
import struct
import sys

STEPS = [
    ("head", "the loop's top (the item's head and block, what ptxas puts before the first wait)"),
    ("qwait", "Q's stage wait (its lse2 rows, warp 9's)"),
    ("stage", "dO's stage wait (its D rows, warp 11's)"),
    ("sdp", "S^T and dP^T issued"),
    ("soft", "P^T and dS^T (S^T's and dP^T's waits in it)"),
    ("arrive", "dV issued, dS^T stored and fenced"),
    ("meet", "the meeting (named barrier 1)"),
    ("issued", "dQ^T and dK issued"),
    ("wait1", "wait for dV and dQ^T"),
    ("dqe", "dq_empty's wait (the last item's reduction has read the tile)"),
    ("dq", "dQ's tile stored"),
    ("wait0", "wait for dK"),
    ("next", "the stages released, the next item's head"),
]
GAP, LATE1, ITEMS = 13, 14, 15


def summary(path):
    raw = open(path, "rb").read()
    ctas, bq, words = struct.unpack("3i", raw[:12])
    v = struct.unpack("%dQ" % (2 * words), raw[12:12 + 16 * words])
    row = [v[:words], v[words:]]
    items = row[0][ITEMS]
    if items == 0 or row[1][ITEMS] != items:
        sys.exit("bwd_trace: %s: items %d and %d (a kernel without the trace?)" % (path, items, row[1][ITEMS]))
    out = ["%s: %d CTAs, BQ %d, %d items (each warpgroup); SM clock cycles an item, mean over every item" %
           (path, ctas, bq, items), "", "| step | what | wg 0 | wg 1 |", "|---|---|---:|---:|"]
    tot = [0, 0]
    for i, (s, what) in enumerate(STEPS):
        a, b = row[0][i] / items, row[1][i] / items
        tot[0] += a
        tot[1] += b
        out.append("| %s | %s | %.0f | %.0f |" % (s, what, a, b))
    out.append("| item | all steps | %.0f | %.0f |" % tuple(tot))
    out.append("")
    out.append("The meeting: warpgroup 1 arrived last at %.1f%% of the items; the arrival gap %.0f cycles an item "
               "(mean |wg 1 - wg 0|), %.1f%% of an item" %
               (100 * row[0][LATE1] / items, row[0][GAP] / items, 100 * row[0][GAP] / items / (sum(tot) / 2)))
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(summary(p) for p in sys.argv[1:]))
