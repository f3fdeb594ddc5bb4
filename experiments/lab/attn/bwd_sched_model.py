"""A model of the Hopper backward's schedule under a causal mask: how long the grid takes on the GPU's SMs
for a group size of kv heads (tile_scheduler.cuh's hp_bwd_tile and hp_grouped, B10), against the ideal.

The block scheduler is taken as one CTA an SM, each CTA started on the first SM to come free, in the grid's
linear order; a CTA costs its items (query blocks of its key block, over the kv head's query heads) plus OV
items of its own (K and V in, the pipeline's fill, dK and dV out). Causal (top-left, s_q = s_kv): key block n
(BN = 128 keys) takes the query blocks from floor(128 n / BQ) on. Within a group of g kv heads, key block 0 of
every head first, then block 1, ... (heaviest first); groups one after another. No L2, no clock: the model says
where the SMs idle at the grid's end, not what a larger group costs in L2 (FA4-GAP.md section 34: one group of
all 8 kv heads measured 1.05x at GQA 4:1 8k where 2-head groups measured 1.09x).

  python3 experiments/lab/attn/bwd_sched_model.py            # the table for b 2, h 16, d 64 and 128, MHA and GQA
  python3 experiments/lab/attn/bwd_sched_model.py --check    # the measured A/B points (hopper-gqa-ab-h200.md)

The groups b54 picks (attn_hopper.cu's bwd_group_mb): max(the L2 budget's, round(SMs / key blocks)) kv heads.
"""
import argparse
import heapq
import sys

BN, MB, SMS, OV = 128, 1 << 20, 132, 2.0


def items_per_block(s, bq, group):
    """The items of each key block of one kv head (causal, top-left)."""
    nm = (s + bq - 1) // bq
    return [group * (nm - (n * BN) // bq) for n in range((s + BN - 1) // BN)]


def order(nb, nhb, g):
    """(block, head) of each CTA in the grid's linear order (hp_grouped)."""
    out = []
    for first in range(0, nhb, g):
        gg = min(g, nhb - first)
        for within in range(gg * nb):
            out.append((within // gg, first + within % gg))
    return out


def makespan(s, d, hq, hkv, b, g, sms=SMS, ov=OV):
    bq = 80 if d == 128 else 128
    per = items_per_block(s, bq, hq // hkv)
    nb, nhb = len(per), hkv * b
    free = [0.0] * sms
    heapq.heapify(free)
    end = 0.0
    for blk, _ in order(nb, nhb, g):
        t = heapq.heappop(free) + per[blk] + ov
        end = max(end, t)
        heapq.heappush(free, t)
    ideal = (sum(per) + ov * nb) * nhb / sms
    return end, ideal


def head_bytes(s, d, hq, hkv):
    return (hq // hkv) * s * ((d + d) * 2 + d * 4)


def g_l2(s, d, hq, hkv, b, mb=16):
    return max(1, min(hkv * b, mb * MB // head_bytes(s, d, hq, hkv)))


def g_b54(s, d, hq, hkv, b, sms=SMS):
    """attn_hopper.cu's bwd_group_mb on branch b54, as the kernel then reads the MB it passes."""
    nb, nhb = (s + BN - 1) // BN, hkv * b
    wave = max(1, (sms + nb // 2) // nb)
    need = (min(nhb, wave) * head_bytes(s, d, hq, hkv) + MB - 1) >> 20
    return g_l2(s, d, hq, hkv, b, need if need > 16 else 16)


def g_ceil(s, d, hq, hkv, b, sms=SMS):
    """e7b50bf's rule (a ceiling), reverted."""
    nb, nhb = (s + BN - 1) // BN, hkv * b
    need = (min(nhb, (sms + nb - 1) // nb) * head_bytes(s, d, hq, hkv) + MB - 1) >> 20
    return g_l2(s, d, hq, hkv, b, need if need > 16 else 16)


def check():
    """The model's speed-ups over the 16 MB groups beside the measured ones (GQA 4:1, d 128, causal backward,
    hopper-gqa-ab-h200.md: the knob's 64 MB and 4096 MB on one library, e7b50bf's ceiling on another)."""
    measured = {(4096, "g64"): (1.240, 1.252), (4096, "all"): (1.226, 1.240), (4096, "ceil"): (1.072, 1.093),
                (8192, "g64"): (1.081, 1.092), (8192, "all"): (1.045, 1.055), (8192, "ceil"): (1.021, 1.032)}
    print("GQA 4:1, d 128, b 2, h 16, causal backward: the model's speed-up over 16 MB groups against the A/B's")
    print(f"{'s':>6} {'variant':>7} {'g':>3} {'model':>7} {'measured':>13}")
    bad = 0
    for s in (4096, 8192):
        base, _ = makespan(s, 128, 16, 4, 2, g_l2(s, 128, 16, 4, 2))
        speedup = {}
        for name, g in (("g64", g_l2(s, 128, 16, 4, 2, 64)), ("all", 8), ("ceil", g_ceil(s, 128, 16, 4, 2))):
            speedup[name] = base / makespan(s, 128, 16, 4, 2, g)[0]
            lo, hi = measured[(s, name)]
            print(f"{s:>6} {name:>7} {g:>3} {speedup[name]:7.3f} {lo:6.3f}-{hi:.3f}")
        # the order the A/B found (g64 >= all > ceil at 4k; g64 > ceil at 8k) is the model's too, but for L2
        bad += speedup["g64"] <= speedup["ceil"]
    return bad


def table():
    print("causal backward, b 2, h 16, 132 SMs, OV 2 items a CTA: makespan over the ideal (1.000 = no idle SM)")
    print(f"{'d':>4} {'h_kv':>4} {'s':>6} {'g 16MB':>6} {'over':>6} {'g b54':>6} {'over':>6}")
    for d in (128, 64):
        for hkv in (16, 8, 4, 2):
            for s in (4096, 8192, 16384, 32768):
                g0, g1 = g_l2(s, d, 16, hkv, 2), g_b54(s, d, 16, hkv, 2)
                m0, ideal = makespan(s, d, 16, hkv, 2, g0)
                m1, _ = makespan(s, d, 16, hkv, 2, g1)
                print(f"{d:>4} {hkv:>4} {s:>6} {g0:>6} {m0 / ideal:6.3f} {g1:>6} {m1 / ideal:6.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="the model against the A/B's measured points")
    a = ap.parse_args()
    if a.check:
        sys.exit(1 if check() else 0)
    table()


if __name__ == "__main__":
    main()
