/*
 * tile_scheduler.cuh — the tile a CTA of the Hopper forward computes (and, below, the key block of the backward):
 * m-block m_block (of BM query rows) of head hh, sequence bb. CTAs start in
 * grid order (m-blocks, heads, sequences; x fastest). Unmasked calls keep
 * it: each head's m-blocks last to first, head after head; their tiles are
 * of one length, so there is no tail to win back, and fewer heads' K and V
 * share L2 at once. Masked calls (causal, windows) take heads in groups
 * whose K and V fit in p.group_mb MB of L2 (0: HP_FWD_GROUP_BYTES; -1 or
 * HP_FWD_GROUP=0: the grid's order, as unmasked calls), and within a group
 * the tiles by m-block, heaviest first over all of the group's heads, so
 * that the last heavy tiles do not start near the grid's
 * end. Timings: experiments/lab/attn/NOTES.md.
 */
#ifndef DISTLAB_HOPPER_TILE_SCHEDULER_CUH
#define DISTLAB_HOPPER_TILE_SCHEDULER_CUH

#include "fwd_params.cuh"

#ifndef HP_FWD_GROUP
#define HP_FWD_GROUP 1
#endif
#ifndef HP_FWD_GROUP_BYTES // the L2 a group's K and V may take (a smaller one in the emulator: partial groups)
#define HP_FWD_GROUP_BYTES (16 << 20)
#endif
struct hp_tile_t {
  int m_block, hh, bb;
};
// The grouped order of both schedules: of a grid of nb blocks x (gridDim.y x gridDim.z) heads, the CTA
// blockIdx takes block `block` (0 first) of head hb (y + gridDim.y z), the heads in groups of as many as fit
// in group_mb MB (0: build_bytes) at head_bytes each, block 0 of every head of a group, then block 1, ...
struct hp_grouped_t {
  int block, hb;
};
// A CTA's linear index in the grid, x fastest: the order in which the block scheduler starts CTAs, so that
// CTA lin + (the SMs) is about the one that starts when CTA lin ends (one CTA an SM; HP_PREFETCH).
HP_DEV int hp_cta_lin() { return (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)); }
HP_DEV int hp_grid_ctas() { return (int)(gridDim.x * gridDim.y * gridDim.z); }
// (of the CTA at linear index lin)
HP_DEV hp_grouped_t hp_grouped(int nb, int64_t head_bytes, int group_mb, int64_t build_bytes, int lin) {
  const int nhb = gridDim.y * gridDim.z;
  const int64_t bytes = group_mb > 0 ? (int64_t)group_mb << 20 : build_bytes;
  const int g_max = (int)max((int64_t)1, min((int64_t)nhb, bytes / max(head_bytes, (int64_t)1)));
  const int group = lin / (g_max * nb), first = group * g_max, g = min(g_max, nhb - first);
  const int within = lin - group * g_max * nb;
  return hp_grouped_t{within / g, first + within % g};
}

// (the tile of the CTA at linear index lin; hp_fwd_tile(p): this CTA's)
template <int DQK, int DV> HP_DEV hp_tile_t hp_fwd_tile(const params_t &p, int lin) {
  const int nm = gridDim.x, x = lin % nm, yz = lin / nm;
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  if (!HP_FWD_GROUP || p.group_mb < 0 || !masked) return hp_tile_t{nm - 1 - x, yz % (int)gridDim.y, yz / (int)gridDim.y};
  const int64_t kv_head = (int64_t)p.s_kv * (DQK + DV) * 2; // a head's K and V bytes (bshd; thd: the longest)
  const hp_grouped_t t = hp_grouped(nm, kv_head, p.group_mb, (int64_t)(HP_FWD_GROUP_BYTES), lin);
  return hp_tile_t{nm - 1 - t.block, t.hb % (int)gridDim.y, t.hb / (int)gridDim.y};
}
template <int DQK, int DV> HP_DEV hp_tile_t hp_fwd_tile(const params_t &p) { return hp_fwd_tile<DQK, DV>(p, hp_cta_lin()); }

/* The key block a CTA of the Hopper backward computes: block n_block of kv head hkv, sequence bb. Unmasked
 * calls keep the grid's order (key blocks of one head, head after head: every block has the same items).
 * Masked calls take the kv heads in groups whose Q, dO and dQ accumulator fit in p.group_mb MB of L2 (0:
 * HP_BWD_GROUP_BYTES; -1: the grid's order), and within a group the key blocks in order
 * over all of the group's heads: block 0 (the most items, causal) of every head first, so that the grid
 * ends on light blocks rather than on the last head's heaviest (at 4k causal, in a model of the block
 * scheduler, 13% over the ideal makespan head after head, 0.2% in groups of 4 heads;
 * experiments/results/attn/hopper-lpt-ab-h200.md). */
#ifndef HP_BWD_GROUP_BYTES
#define HP_BWD_GROUP_BYTES (16 << 20)
#endif
struct hp_bwd_tile_t {
  int n_block, hkv, bb;
  int part, parts, slot; // the CTA's share of its block's items (part of parts), and its split slot (-1: none)
};
/* The tail split (p.split_parts > 1; unmasked bshd, sbhd or thd of equal lengths, where every key block has
 * the same items): the grid is 1-D, the blocks in the grid's order (key blocks of a head, head after head,
 * batch after batch); blocks [0, split_first) whole, then each block after them in split_parts parts of its
 * items, one CTA a part, so that the last wave's few blocks spread over every SM rather than leaving most of
 * them idle (the parts add their dK and dV into split slot block - split_first; the last to finish writes
 * them). */
// The masked backward's bytes of a kv head in L2: its group's query heads' Q and dO (bf16) and dQ accumulator
// (fp32) over s_q rows (bshd; thd: the longest); hp_bwd_tile's groups and the host's hp_bwd_group_mb count them so.
HP_HD int64_t hp_bwd_head_bytes(int group, int s_q, int dqk, int dv) {
  return (int64_t)group * s_q * ((dqk + dv) * 2 + dqk * 4);
}
// (the CTA at linear index lin; hp_bwd_tile(p): this CTA)
template <int DQK, int DV, class P> HP_DEV hp_bwd_tile_t hp_bwd_tile(const P &p, int lin) {
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  if (p.split_parts > 1) { // (a 1-D grid)
    const int nb = (p.s_kv + BN - 1) / BN;
    const int piece = lin - p.split_first, blk = piece < 0 ? lin : p.split_first + piece / p.split_parts;
    const int hb = blk / nb;
    return hp_bwd_tile_t{blk % nb, hb % p.h_kv, hb / p.h_kv, piece < 0 ? 0 : piece % p.split_parts, piece < 0 ? 1 : p.split_parts,
                         piece < 0 ? -1 : blk - p.split_first};
  }
  const int x = lin % (int)gridDim.x, yz = lin / (int)gridDim.x;
  if (p.group_mb < 0 || !masked) return hp_bwd_tile_t{x, yz % (int)gridDim.y, yz / (int)gridDim.y, 0, 1, -1};
  const int64_t head = hp_bwd_head_bytes(p.h / p.h_kv, p.s_q, DQK, DV);
  const hp_grouped_t t = hp_grouped(gridDim.x, head, p.group_mb, (int64_t)(HP_BWD_GROUP_BYTES), lin);
  return hp_bwd_tile_t{t.block, t.hb % (int)gridDim.y, t.hb / (int)gridDim.y, 0, 1, -1};
}
template <int DQK, int DV, class P> HP_DEV hp_bwd_tile_t hp_bwd_tile(const P &p) { return hp_bwd_tile<DQK, DV>(p, hp_cta_lin()); }

/* The tail split's plan (host): of nblocks key blocks of `items` items each on `sms` SMs (one CTA an SM),
 * the last nblocks % sms (the tail wave's) are split when that shortens the grid. Each in k parts runs as
 * ceil(tail k / sms) rounds of ceil(items / k) items and `ov` items' worth of a part's own cost (K and V in,
 * the pipeline's fill, the fp32 adds of dK and dV), against one block's items unsplit; the best k (2-64)
 * is taken where it saves at least min_gain of the grid's time, where the tail is at most max_tail of the
 * SMs and fits max_slots split slots. Returns the parts (0: no split) and sets *first, the first split
 * block. (On an H200 at d 128, b 2, h 16: a tail of 4 blocks in 30 parts, s 16k, 1.011-1.028x backward; a
 * tail of 68 in 7 parts, s 8k, 0.975-0.994x: a wave half full runs its blocks faster than a full one, so
 * the model's gain is not there; hence max_tail. hopper-b22-ab-h200.md.) */
static inline int hp_bwd_split_plan(int64_t nblocks, int items, int sms, int max_slots, double max_tail, double ov,
                                    double min_gain, int *first) {
  const int64_t tail = sms > 0 ? nblocks % sms : 0, waves = sms > 0 ? (nblocks + sms - 1) / sms : 0;
  if (tail == 0 || tail > max_slots || tail > max_tail * sms || items < 2) return 0;
  int best = 0;
  double best_t = items;
  for (int k = 2; k <= 64 && k <= items; k++) {
    const double t = (double)((tail * k + sms - 1) / sms) * ((items + k - 1) / k + ov);
    if (t < best_t) best_t = t, best = k;
  }
  if (best == 0 || items - best_t < min_gain * (double)waves * items) return 0;
  *first = (int)(nblocks - tail);
  return best;
}

/* The masked backward's group (bwd_params_t.group_mb, MB of L2) for nb key blocks of nhb kv heads of head_bytes
 * each (as hp_bwd_tile counts them) on sms SMs, from the knob's mb: -1 (the grid's order) or N kept; 0 (unset):
 * the build's HP_BWD_GROUP_BYTES, or the MB that hold round(sms / nb) kv heads where that is more, so that a
 * group holds about a wave of key blocks for its heaviest-first order to balance (attn_hopper.cu's
 * bwd_group_mb says why; the emulator's unit_group_mb checks the groups hp_grouped then makes). */
static inline int hp_bwd_group_mb(int64_t nb, int64_t nhb, int64_t head_bytes, int sms, int mb) {
  if (mb != 0 || nb <= 0 || nhb <= 0 || head_bytes <= 0) return mb;
  const int64_t wave = (sms + nb / 2) / nb > 1 ? (sms + nb / 2) / nb : 1; // round(sms / nb), at least 1
  const int64_t heads = nhb < wave ? nhb : wave, budget = (int64_t)(HP_BWD_GROUP_BYTES) / head_bytes;
  if ((budget > 1 ? budget : 1) >= heads) return 0; // the build's budget holds them: left unset
  const int64_t need = (heads * head_bytes + (1 << 20) - 1) >> 20;
  return (int)(need < 4096 ? need : 4096);
}

#endif
