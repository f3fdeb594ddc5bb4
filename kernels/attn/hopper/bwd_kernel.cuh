/*
 * bwd_kernel.cuh — dl.attn's backward on Hopper (sm_90a): wgmma and TMA,
 * warp-specialised, FA3's backward written out on the forward's machinery
 * (fwd_params.cuh: sizes, waits, masks; fwd_mainloop.cuh: descriptors and GEMMs;
 * ptx.cuh: the instructions).
 * experiments/lab/emu/attn/hopper_bwd.cpp runs it on the CPU with wgmma, TMA
 * and mbarriers emulated, against an fp64 reference.
 *
 * dl_attn_bwd_cuda (attn_bwd.cu) runs it on sm_90 after the portable
 * backward's prep (D = rowsum(dO * O), the fp32 dQ accumulator zeroed), on
 * that workspace (D [h][rows] and dQ [h][rows][DQK], row ws_row(sequence,
 * i)), then bwd_dq_kernel (dq = scale * accumulator; the accumulator's
 * columns are permuted within a row, bwd_dq_col). With BULK its own
 * bwd_prep_kernel replaces that prep (D and lse log2(e) in bwd_lse_row's
 * padded rows).
 *
 * bwd_kernel: CTA = BN = 128 keys of one kv head and batch, 384 threads;
 * grid (key blocks, kv heads, batches), or with the tail split (BQ 80 and 128
 * without a mask: tile_scheduler.cuh) a 1-D grid whose last blocks go in parts,
 * a CTA a part's items, their dK and dV added up in fp32 by the last part.
 *   warpgroup 2, producer (setmaxnreg 24): one thread TMA-loads K and V of
 *     the block once, then for every q head of the kv head's group and every
 *     query block of BQ rows (dl.attn's defaults: 80 at d 128 without a mask, 128 at
 *     d 64, else 64: M80 and M128 below) that sees the keys: Q and dO into two
 *     stages; another warp loads the rows' LSE (as lse log2(e), +inf for a
 *     row with no key) and D beside them. Full barriers carry the bytes and
 *     that warp's 32 arrivals, empty barriers (256 arrivals, or 8 with ELECT:
 *     bwd_releases) free a stage. With BULK (FA4-GAP.md B5), bwd_prep_kernel
 *     has prepared lse log2(e) and D in rows padded per sequence, and the TMA
 *     thread loads an item's rows of both with its Q and dO (cp.async.bulk):
 *     full barriers of one arrival and the bytes.
 *   warpgroups 0 and 1, consumers (setmaxnreg 240): 64 keys each; dK, dV in
 *     registers over all the items. Per item:
 *       S^T = K_c Q^T and dP^T = V_c dO^T (SS wgmma m64n64k16, K-major both:
 *         keys are rows, so P^T and dS^T come out in the A layout of the next
 *         GEMMs);
 *       P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - D), the mask
 *         (selects) only in blocks that need it;
 *       dV += P^T dO and dK += dS^T Q (RS wgmma m64nDk16, B MN-major: the
 *         forward's V descriptor);
 *       dS^T to shared memory (128-byte swizzle, two buffers), then both
 *         warpgroups meet (named barrier 1) and each computes dQ for its half
 *         of the head dims over all 128 keys: dQ = dS K (SS wgmma with A
 *         transposed, i.e. MN-major, read from dS^T; B = K MN-major), added to
 *         the fp32 accumulator FA3's way, through shared memory and one bulk
 *         reduction of the item's rows by a producer thread.
 *   dK (times the softmax scale) and dV are written once, in bf16.
 *   The loop (bwd_loop_t): BWD_ORDER (the default) issues an item's GEMMs in
 *   FA4's sm90 order: dV right after P^T, so that it runs under dS's
 *   arithmetic, then dQ before dK, so that the dQ tile goes to shared memory
 *   while dK runs. BWD_STEP is the order above (dV and dK in one group, then
 *   dQ, then all waited for). With BWD_TURNS (d 64), the warpgroups take turns
 *   at the tensor cores instead, dQ one item late (bwd_kernel's comment).
 * Rows past a sequence (keys of the last key block, queries of the last
 * query block) are zeroed in shared memory before a GEMM reads them, so that
 * another sequence's rows or NaN gaps (thd) never meet a zero of P or dS.
 * Every wait times out into *err (mbar_wait), as in the forward.
 * The variants tried and dropped, and their timings: experiments/lab/attn/NOTES.md.
 *
 * M80 (BQ = 80, FA4's sm90 tile for d 128 without a mask; FA4-GAP.md B3; dl.attn's default there,
 * DISTLAB_ATTN_HOPPER_BWD_M80=0 turns it off): S^T and dP^T are m64n80 (40 accumulators); dV and dK take K = 80 (5
 * k16 steps, P^T and dS^T from those accumulators); dQ cannot have M = 80 (wgmma's M is 64 a
 * warpgroup), so dQ^T = K^T dS^T (gemm_dqt): M = the warpgroup's 64 columns of d, N = 80 queries, K =
 * 128 keys, with dS stored query-major (stmatrix .trans: [key half][80][64 keys], a warpgroup's keys a
 * half) and dQ^T stored into the tile transposed (bwd_dq_col<80>). P^T and dS^T are both in fp32
 * before either is packed, dV is issued after dS^T and waited for before dQ^T, and warp 11 loads D while
 * warp 9 loads lse2: in BWD_ORDER's order ptxas spilled (registers). 224 KB of shared memory.
 *
 * M128 (BQ = 128 at d 64, FA4's sm90 tile there, under every mask; FA4-GAP.md B6; dl.attn's default
 * there, DISTLAB_ATTN_HOPPER_BWD_M128=0 turns it off): twice the rows an item halves the per-item fixed costs (barriers,
 * waits, stage handoffs, the dQ handoff) per FLOP. S^T and dP^T are m64n128 (64 accumulators each); dV
 * and dK take K = 128 (8 k16 steps); dQ = dS K in two halves of 64 queries, warpgroup c the queries
 * [64 c, 64 c + 64) and all 64 columns of d (gemm_dq<64>: m64n64, as d 128's), so dS^T is stored as two
 * [128 keys][64 queries] tiles, a query half each (stmatrix, 8 a warp), and the dQ tile and bwd_dq_col
 * keep BQ 64's layout.
 * In FA4's order as M80 runs it (P^T and dS^T in fp32, then both packed, then dV: in BWD_ORDER's own
 * order S^T, dP^T and P^T would be live with dK, dV at the dS^T step), but dQ issued without waiting for
 * dV (0 spills either way); warps 9 and 11 load lse2 and D; the dQ tile is stored by shared addresses
 * (16 generic ones a thread cost ptxas 68 bytes of spills), K's and V's bases and the stmatrix addresses
 * through hp_opaque (4 bytes of spills each without). 195 KB of shared memory.
 * Shared memory (d 128, BQ 64): K, V 32 KB each; Q, dO 2 x 16 KB each; dS^T 2 x 16 KB;
 * dQ 32 KB: 192 KB, one CTA an SM. Descriptors as in fwd_kernel.cuh; dS^T is [128 keys]
 * [64 queries] (a 128-byte row a key): as A of dQ = dS K it is MN-major (M =
 * queries contiguous), SBO = 1024 (8 keys), the k16 step (16 keys) at + 2048;
 * K as B of dQ is MN-major likewise, the warpgroup's columns of d at + c * BN
 * * 128 (d 128: a half each) or + c * 64 bytes (d 64: 32 columns each).
 */
#ifndef DISTLAB_HOPPER_BWD_KERNEL_CUH
#define DISTLAB_HOPPER_BWD_KERNEL_CUH

#include "fwd_mainloop.cuh"
#include "fwd_params.cuh"
#include "tile_scheduler.cuh"
#ifndef HOPPER_EMU
#include "common/pdl.cuh"
#endif

// BQ 128 (d 64) in BWD_ORDER: an item's dS^T goes to shared memory (stmatrix) before dV's wgmma is issued
// and is fenced for the async proxy after it, as FA4's sm90 backward orders them (0: after dV's issue, the
// fence right behind the stores). On an H200 +2.3-3.3% backward at d 64; at d 128 (BQ 80) 0.979-1.004x, so
// not there (experiments/results/attn/hopper-b22-ab-h200.md; FA4-GAP.md section 16)
#ifndef HP_BWD_DS_EARLY
#define HP_BWD_DS_EARLY 1
#endif

// HP_BWD_TRACE (a lab build flag, off in dl.attn: the default PTX has none of it): thread 0 of each
// consumer warpgroup sums the SM clock's cycles (32 bits) of BWD_ORDER's steps over the CTA's items in
// shared memory (one register held, the last step's clock: a clock written out at every step perturbed the
// kernel by 29%), and the meeting's arrival gap (warpgroup 1's arrival less warpgroup 0's: its absolute
// value, and how often it is positive); at the CTA's end they are added into p.trace, [2][HP_BT_WORDS]
// 64-bit sums (BT_ITEMS: the items). experiments/lab/attn/bwd_trace.py reads them: which warpgroup
// waits at the meeting before dQ^T, and after what.
#ifndef HP_BWD_TRACE
#define HP_BWD_TRACE 0
#endif
// the steps, each timed from the one before: the loop's top (what ptxas puts before the first wait), Q's
// stage in (its lse2 rows with it), dO's (its D rows), S^T and dP^T issued, P^T and dS^T in
// registers, dV issued and dS^T stored (the meeting's arrival), the meeting left, dQ^T and dK issued, dV
// and dQ^T in, dq_empty's wait (the last reduction has read the tile), dQ stored, dK in, the next item's top
enum bwd_trace_t { BT_HEAD, BT_QWAIT, BT_STAGE, BT_SDP, BT_SOFT, BT_ARRIVE, BT_MEET, BT_ISSUED, BT_WAIT1, BT_DQE, BT_DQ,
                   BT_WAIT0, BT_NEXT, BT_GAP, BT_LATE1, BT_ITEMS, HP_BT_WORDS = 16 };

// Query rows an item unless M80 or M128 (bwd_kernel's BQ; BN = 128 keys a CTA, THREADS = 384: fwd_params.cuh),
// and the rows a CTA of bwd_prep_kernel and bwd_dq_kernel, and BULK's padding unit, whatever BQ is.
constexpr int BWD_BQ = 64;

// BQ 64: ds holds dS^T, [key][query] (128 keys of 128 bytes); BQ 80: dS, [key half][query][64 keys] (two
// tiles of 80 rows of 128 bytes, a warpgroup's keys each; bwd_kernel's M80 notes); BQ 128 (d 64): dS^T,
// [query half][key][64 queries] (two tiles of 128 keys of 128 bytes, a warpgroup's dQ rows each; M128).
template <int DQK, int DV, int BQ = BWD_BQ> struct alignas(1024) bwd_smem_t {
  uint16_t k[DQK / 64][BN * 64];
  uint16_t v[DV / 64][BN * 64];
  uint16_t q[2][DQK / 64][BQ * 64];
  uint16_t dout[2][DV / 64][BQ * 64];
  uint16_t ds[2][BN * BQ];
  float dq[BQ * DQK];           // an item's dQ, [query][DQK] as the accumulator's rows hold it
  float lse2[2][BQ], delta[2][BQ];
  uint64_t kv_full, q_full[2], do_full[2], q_empty[2], do_empty[2], dq_full, dq_empty;
  uint64_t ds_ready[2], ds_free[2]; // BWD_TURNS: both warpgroups' halves of a dS^T buffer in; their dQ read it
  int fail;
  int ticket; // the tail split: this part's arrival (the last adds up the block's dK and dV)
#if HP_BWD_TRACE
  uint32_t bt[2][HP_BT_WORDS], bt_arr[2][2]; // the lab's sums (HP_BWD_TRACE) and the meeting's arrivals
#endif
};

// The accumulator's rows hold dQ's columns permuted: column c of a row i at c ^ (8 (i % 4)), so that
// the consumers' stores of a tile into shared memory (two columns a lane, eight rows a warp) hit
// distinct banks; bwd_dq_kernel undoes it. BQ 80 stores dQ^T (one column a lane, eight columns and four
// rows 2 apart a warp): c ^ (8 ((i / 2) % 4)). Items start at multiples of 8 rows, so i is the
// tile's row as well as the sequence's.
template <int BQ = BWD_BQ> HP_HD int bwd_dq_col(int c, int i) { return BQ == 80 ? c ^ (8 * ((i / 2) % 4)) : c ^ (8 * (i % 4)); }

// Addressing as params_t's (fwd_params.cuh): strides (position, head, batch) in elements.
struct bwd_params_t {
  int b, h, h_kv, s_q, s_kv; // thd: s_q, s_kv the longest lengths (the grid)
  int window_left, window_right, bottom_right; // params_t's mask
  float scale, scale_log2;   // softmax scale, and times log2(e)
  const int *cu_q, *cu_kv, *pad_q, *pad_kv; // thd when cu_q is set
  const float *lse;          // the forward's (possibly merged) LSE, natural log
  int64_t lse_st[3];
  uint16_t *dq, *dk, *dv;    // bf16 (dq: bwd_dq_kernel's)
  int64_t dq_st[3], dk_st[3], dv_st[3];
  int accumulate;            // add into dq, dk, dv instead of writing them
  const float *delta;        // the workspace: D [h][ws_rows], dQ [h][ws_rows][DQK] (fp32)
  float *dq_acc;
  int64_t ws_rows;           // thd: the packed rows of q; else b * s_q
  int *err;                  // optional: set to 1 when a wait timed out
  // BULK only (bwd_prep_kernel's inputs and output; kept last, so that the other kernels' parameters
  // stay where they were): out and dO (bf16), and lse log2(e) [h][lse_rows] in bwd_lse_row's rows
  // (delta then holds D in the same layout)
  const uint16_t *o, *dout;
  int64_t o_st[3], do_st[3];
  const float *lse2;
  int64_t lse_rows;
  int group_mb; // params_t's: the masked schedule's groups of kv heads in MB of L2, 0 the build's, -1 none
  // The tail split (hp_bwd_tile; split_parts 0 or 1: none): the 1-D grid's first split CTA, the parts a
  // split block's items go in, and the split blocks' fp32 dK (unscaled) and dV, [slot][BN keys][DQK + DV],
  // and their arrival counts [slot], both zeroed before the kernel
  int split_first, split_parts;
  float *split_acc;
  int *split_count;
  int next_ctas; // params_t's (HP_PREFETCH): the GPU's SMs, 0 off
  int rag_first; // params_t's: a masked call's short item first (hp_bwd_row_off); 0 off
#if HP_BWD_TRACE
  unsigned long long *trace; // lab only: [2][HP_BT_WORDS] sums over the CTAs (HP_BWD_TRACE above)
#endif
};

HP_DEV int64_t bwd_at(const int64_t (&st)[3], int first, int row, int head, int tb) {
  return ((int64_t)first + row) * st[0] + (int64_t)head * st[1] + (int64_t)tb * st[2];
}
// The rows a masked backward's items are shifted by (bwd_params_t.rag_first; the forward's hp_fwd_row_off):
// where a window bounds the keys on the right (causal), every key block's items run from its diagonal to the
// sequence's end, the short item among them (d 128: 4096 = 51 x 80 + 16); with item m at rows
// [m BQ - off, (m + 1) BQ - off) the short item holds the first rows, which only the first key blocks reach
// (4k causal: 883 -> 858 items a kv head). A multiple of 8, so that an item's rows keep bwd_dq_col's column
// order (period 8 in the row); BQ 80 and 128 only (BULK's rows are padded from the sequence's first row).
// Rows below 0: zeros in shared memory (Q, dO), lse2 +inf and D 0, so P = dS = 0; no dQ.
template <int BQ> HP_DEV int hp_bwd_row_off(const bwd_params_t &p, int len_q) {
  return BQ != 64 && p.rag_first && p.window_right >= 0 ? (BQ - len_q % BQ) % BQ / 8 * 8 : 0;
}

// The workspace row of row i of sequence bb (attn_bwd.cu's attn_ws_row).
HP_DEV int64_t bwd_ws_row(const bwd_params_t &p, const hp_seq_t &s, int bb, int i) {
  return p.cu_q ? (int64_t)s.first_q + i : (int64_t)bb * p.s_q + i;
}

// BULK: row i of sequence bb in the prepared rows of lse log2(e) and D. Each sequence starts at a
// multiple of BWD_BQ, so that an item's BWD_BQ rows are one 16-byte aligned bulk copy that stays inside its
// sequence's rows, the pad of the last item included (filled by bwd_prep_kernel: lse2 +inf, D 0, so
// P = dS = 0 there). Padding, rather than scalar loads for the clipped last item, because the
// unpadded rows of an item start at any row (thd offsets, b s_q), where a bulk copy is not aligned.
// The starts ((workspace row of the sequence + BWD_BQ bb) / BWD_BQ) BWD_BQ keep the sequences apart for
// non-decreasing offsets; dl_attn_bwd_workspace_bytes's round_up(rows, 64) + 64 b rows a head hold them.
HP_DEV int64_t bwd_lse_row(const bwd_params_t &p, const hp_seq_t &s, int bb, int i) {
  return (bwd_ws_row(p, s, bb, 0) + (int64_t)BWD_BQ * bb) / BWD_BQ * BWD_BQ + i;
}

// The prep where BULK does not run (BQ 80 and 128): D = rowsum(dO * out) in fp32 into delta [h][ws_rows]
// (the portable prep's layout, attn_bwd.cu) and the rows' fp32 dQ accumulator zeroed. Grid (blocks of 64
// rows, h, b), 256 threads; a row's 16-byte chunks of out and dO over DV / 8 lanes, each thread's loads all issued
// before their sums (the portable prep's 4-byte loads, a warp a row, ran at ~2.9 TB/s on an H200).
template <int DQK, int DV> __global__ void __launch_bounds__(256) bwd_prep_ws_kernel(const bwd_params_t p, float *delta) {
  dl_pdl_release(); // the main kernel may start (its readers of this kernel's rows wait for it: dl_pdl_wait)
  constexpr int L = DV / 8, RW = 32 / L, PASSES = 64 / (8 * RW); // lanes a row, rows a warp, passes of the 8 warps
  const int hh = blockIdx.y, bb = blockIdx.z, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const hp_seq_t sq = hp_seq(p, bb);
  const int r0 = blockIdx.x * 64;
  if (r0 >= sq.len_q) return;
  const int rows = min(64, sq.len_q - r0), c = (lane % L) * 8;
  uint4 o[PASSES], d[PASSES];
#pragma unroll
  for (int k = 0; k < PASSES; k++) {
    const int r = (k * 8 + warp) * RW + lane / L;
    o[k] = d[k] = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      o[k] = *reinterpret_cast<const uint4 *>(p.o + bwd_at(p.o_st, sq.first_q, r0 + r, hh, sq.tb) + c);
      d[k] = *reinterpret_cast<const uint4 *>(p.dout + bwd_at(p.do_st, sq.first_q, r0 + r, hh, sq.tb) + c);
    }
  }
#pragma unroll
  for (int k = 0; k < PASSES; k++) {
    const uint32_t x[4] = {o[k].x, o[k].y, o[k].z, o[k].w}, y[4] = {d[k].x, d[k].y, d[k].z, d[k].w};
    float acc = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; e++) acc += bf16_lo(x[e]) * bf16_lo(y[e]) + bf16_hi(x[e]) * bf16_hi(y[e]);
#pragma unroll
    for (int m = L / 2; m > 0; m >>= 1) acc += hp_shfl_xor(acc, m);
    const int r = (k * 8 + warp) * RW + lane / L;
    if (lane % L == 0 && r < rows) delta[hh * p.ws_rows + bwd_ws_row(p, sq, bb, r0 + r)] = acc;
  }
  // the rows' accumulator: rows x DQK floats, contiguous (a sequence's workspace rows are)
  float4 *acc = reinterpret_cast<float4 *>(p.dq_acc + (hh * p.ws_rows + bwd_ws_row(p, sq, bb, r0)) * DQK);
  for (int j = tid; j < rows * DQK / 4; j += 256) acc[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// BULK's prep (the portable prep's work, attn_bwd.cu, in the padded rows): grid (blocks of BWD_BQ rows, h,
// b), 128 threads, a warp a row. D = rowsum(dO * out) in fp32 and lse log2(e) (+inf for a row with no
// key) into bwd_lse_row's rows, the pad up to the sequence's next multiple of BWD_BQ 0 and +inf; the fp32
// dQ accumulator's rows zeroed.
template <int DQK, int DV> __global__ void __launch_bounds__(128) bwd_prep_kernel(const bwd_params_t p, float *delta, float *lse2) {
  dl_pdl_release(); // (as bwd_prep_ws_kernel)
  const int hh = blockIdx.y, bb = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const hp_seq_t sq = hp_seq(p, bb);
  for (int r = warp; r < BWD_BQ; r += 4) {
    const int i = blockIdx.x * BWD_BQ + r;
    if (i >= (sq.len_q + BWD_BQ - 1) / BWD_BQ * BWD_BQ) return;
    const int64_t at = hh * p.lse_rows + bwd_lse_row(p, sq, bb, i);
    if (i >= sq.len_q) {
      if (lane == 0) delta[at] = 0.0f, lse2[at] = INFINITY;
      continue;
    }
    const uint16_t *o = p.o + bwd_at(p.o_st, sq.first_q, i, hh, sq.tb), *d = p.dout + bwd_at(p.do_st, sq.first_q, i, hh, sq.tb);
    float acc = 0.0f;
    for (int c = 2 * lane; c < DV; c += 64) {
      const uint32_t x = *reinterpret_cast<const uint32_t *>(o + c), y = *reinterpret_cast<const uint32_t *>(d + c);
      acc += bf16_lo(x) * bf16_lo(y) + bf16_hi(x) * bf16_hi(y);
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += hp_shfl_xor(acc, m);
    if (lane == 0) {
      const float l = p.lse[bwd_at(p.lse_st, sq.first_q, i, hh, sq.tb)];
      delta[at] = acc, lse2[at] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
    }
    float *dq = p.dq_acc + (hh * p.ws_rows + bwd_ws_row(p, sq, bb, i)) * DQK;
    for (int c = lane; c < DQK; c += 32) dq[c] = 0.0f;
  }
}

// grid (blocks of BWD_BQ rows, h, b), 128 threads, a warp a row: dq = scale * accumulator (+ dq), the
// accumulator's columns as bwd_dq_col<BQ> placed them (attn_bwd.cu's attn_bwd_dq_kernel, for that layout); a
// lane's 4 (d 128) or 2 (d 64) adjacent columns, which bwd_dq_col keeps adjacent (it flips bits 3 and up).
template <int DQK, int BQ = BWD_BQ> __global__ void __launch_bounds__(128) bwd_dq_kernel(const bwd_params_t p) {
  dl_pdl_wait(); // (launched by PDL: the main kernel's reductions done and visible)
  constexpr int V = DQK / 32; // columns a lane
  const int hh = blockIdx.y, bb = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const hp_seq_t sq = hp_seq(p, bb);
  const int r0 = blockIdx.x * BWD_BQ;
  for (int r = warp; r < BWD_BQ; r += 4) {
    const int i = r0 + r;
    if (i >= sq.len_q) return;
    const float *acc = p.dq_acc + (hh * p.ws_rows + bwd_ws_row(p, sq, bb, i)) * DQK;
    uint16_t *dq = p.dq + bwd_at(p.dq_st, sq.first_q, i, hh, sq.tb);
    const int c = V * lane;
    float x[V];
    if constexpr (V == 4) {
      const float4 a = __ldcg(reinterpret_cast<const float4 *>(acc + bwd_dq_col<BQ>(c, i)));
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    } else {
      const float2 a = __ldcg(reinterpret_cast<const float2 *>(acc + bwd_dq_col<BQ>(c, i)));
      x[0] = a.x, x[1] = a.y;
    }
    uint32_t out[V / 2];
#pragma unroll
    for (int e = 0; e < V / 2; e++) {
      float u = x[2 * e] * p.scale, v = x[2 * e + 1] * p.scale;
      if (p.accumulate) {
        const uint32_t old = *reinterpret_cast<const uint32_t *>(dq + c + 2 * e);
        u += bf16_lo(old), v += bf16_hi(old);
      }
      out[e] = pack_bf16(u, v);
    }
    if constexpr (V == 4) *reinterpret_cast<uint2 *>(dq + c) = make_uint2(out[0], out[1]);
    else *reinterpret_cast<uint32_t *>(dq + c) = out[0];
  }
}

// Rows [valid, rows) and [0, front) of a [DH / 64][rows][64] tile set to 0 by the 128 threads of warpgroup 0
// (the caller then fences and meets the other warpgroup).
template <int DH> HP_DEV void zero_rows(uint32_t base, int rows, int valid, int tid, int front = 0) {
  for (int i = tid; i < (rows - valid) * 8 * (DH / 64); i += 128) {
    const int row = valid + i / (8 * (DH / 64)), half = (i / 8) % (DH / 64), chunk = i % 8;
    st_shared_zero16(base + half * rows * 128 + row * 128 + chunk * 16);
  }
  for (int i = tid; i < front * 8 * (DH / 64); i += 128) {
    const int row = i / (8 * (DH / 64)), half = (i / 8) % (DH / 64), chunk = i % 8;
    st_shared_zero16(base + half * rows * 128 + row * 128 + chunk * 16);
  }
}

// acc (64 keys x DH) += X^T (in registers, bf16: the A layout) B (the item's BQ rows x DH, MN-major).
template <int DH, int BQ> HP_DEV void gemm_acc(float (&acc)[DH / 2], const uint32_t (&xa)[BQ / 4], uint32_t b_base) {
  const uint64_t db = gmma_desc(b_base, BQ * 128, 1024);
#pragma unroll
  for (int kc = 0; kc < BQ / 16; kc++)
    wgmma_rs(acc, *reinterpret_cast<const uint32_t(*)[4]>(xa + 4 * kc), desc_at(db, kc * 16 * 128));
}

// dQ (64 queries x the warpgroup's NC columns of d: DQK / 2, or BQ 128's all 64) = dS K over the block's
// 128 keys: A = dS^T in shared memory read transposed (MN-major), B = K MN-major; one commit group.
template <int NC> HP_DEV void gemm_dq(float (&dq)[NC / 2], uint32_t ds_base, uint32_t k_cols) {
  const uint64_t da = gmma_desc(ds_base, BWD_BQ * 128, 1024), db = gmma_desc(k_cols, BN * 128, 1024);
  wg_fence();
#pragma unroll
  for (int kc = 0; kc < BN / 16; kc++) wgmma_ss_tt(dq, desc_at(da, kc * 16 * 128), desc_at(db, kc * 16 * 128), kc > 0);
  wg_commit();
}

// BQ 80 (d 128): dQ^T (the warpgroup's 64 columns of d x 80 queries) = K^T dS^T over the block's 128
// keys, FA4's dQ_swapAB (wgmma's M is 64 a warpgroup, so 80 queries cannot be M): A = K read
// transposed (MN-major: the warpgroup's half of d, k_cols), B = dS K-major (keys contiguous: half kc / 4
// of the two [80][64] tiles, 16 keys at + 32 bytes); m64n80k16, one commit group.
HP_DEV void gemm_dqt(float (&dq)[40], uint32_t ds_base, uint32_t k_cols) {
  const uint64_t da = gmma_desc(k_cols, BN * 128, 1024), db = gmma_desc(ds_base, 16, 1024);
  wg_fence();
#pragma unroll
  for (int kc = 0; kc < BN / 16; kc++)
    wgmma_ss_ta(dq, desc_at(da, kc * 16 * 128), desc_at(db, (kc / 4) * 80 * 128 + (kc % 4) * 32), kc > 0);
  wg_commit();
}

// The consumers' loop. BWD_STEP and BWD_ORDER: the warpgroups go in step, an item after the other;
// per item, BWD_STEP: S^T, dP^T; P^T, dS^T; dV + dK (one group); dS^T stored; dQ; wait for all.
// BWD_ORDER (FA4's sm90 backward, flash_bwd_sm90.py): S^T, dP^T; P^T; dV; dS^T (under dV); dS^T
// stored; dQ; dK; wait for dQ (and dV): dO's stage free, the dQ tile stored while dK runs; wait for dK:
// Q's stage free. BWD_TURNS: the warpgroups take turns at the tensor cores, dQ one item late. (At d 128
// the turns cost ptxas 420 bytes of spills and it serialises the wgmma, so dl.attn runs them at d 64
// only.) dl.attn takes BWD_ORDER unless DISTLAB_ATTN_HOPPER_BWD_ORDER=0 (attn_hopper.cu).
enum bwd_loop_t { BWD_STEP = 0, BWD_ORDER = 1, BWD_TURNS = 2 };

// The consumers' releases (q_empty, do_empty, dq_full, ds_ready, ds_free): every consumer thread
// arrives (counts 256), or with ELECT (FA4-GAP.md B2; DISTLAB_ATTN_HOPPER_BWD_ELECT=1) lane 0 of each
// consumer warp (counts 8). A release after a wgmma wait needs no more: the wait is warp-converged and
// the wgmma's shared-memory reads are done at it, and the threads' generic reads of the stage (lse2,
// delta) precede a named barrier of all of them (1, or a turn) before the release. A release after
// the warp's generic stores (the dQ tile, dS^T; each thread fences them for the async proxy) has the
// warp converge first (__syncwarp), so that lane 0's arrival follows all 32 lanes' stores.
constexpr uint32_t bwd_releases(bool elect) { return elect ? 8 : 256; }

// Each item's dQ goes to shared memory and a producer warp adds it to the accumulator with one bulk
// reduction (FA3's way). BULK (FA4-GAP.md B5; dl.attn's default where M80/M128 do not run): an item's
// lse2 and D rows come by cp.async.bulk from bwd_prep_kernel's rows (p.lse2, p.delta in bwd_lse_row's layout)
// with its Q and dO, on their full barriers (one arrival, the bytes); else warp 9 loads them with
// scalar loads from p.lse and D's workspace rows.
template <int DQK, int DV, int LOOP, bool ELECT, bool BULK = false, int BQ = BWD_BQ, bool RAG = false>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_kernel(const HP_GRID_CONST hp_tmap_t tq, const HP_GRID_CONST hp_tmap_t tk, const HP_GRID_CONST hp_tmap_t tv,
               const HP_GRID_CONST hp_tmap_t tdo, const bwd_params_t p) {
  static_assert(DQK == 64 || DQK == 128, "dQ's split of the head dims between the warpgroups");
  static_assert(LOOP == BWD_STEP || LOOP == BWD_ORDER || LOOP == BWD_TURNS, "bwd_loop_t");
  static_assert(BQ == 64 || BQ == 128 || (BQ == 80 && DQK == 128 && DV == 128 && LOOP == BWD_ORDER && !BULK),
                "80 query rows an item: d 128, FA4's order, lse2 and D by warp 9 (BULK pads to 64)");
  static_assert(BQ != 128 || (DQK == 64 && DV == 64 && LOOP == BWD_ORDER && !BULK),
                "128 query rows an item: d 64, FA4's order, lse2 and D by warps 9 and 11 (BULK pads to 64)");
  static_assert(!RAG || BQ != 64, "the short item first (hp_bwd_row_off): BQ 80 and 128");
  // a thread's dQ (BQ 80: of dQ^T; BQ 128: its warpgroup's 64 queries x all 64 columns of d)
  constexpr int NDQ = BQ == 80 ? 40 : BQ == 128 ? 32 : DQK / 4;
  bwd_smem_t<DQK, DV, BQ> &sm = *reinterpret_cast<bwd_smem_t<DQK, DV, BQ> *>(hp_smem_aligned());
  // PDL (launch_bwd): the conversion may be scheduled once every CTA of this grid has started; the prep's
  // rows (D, BULK's lse2, the zeroed dQ accumulator) are read only after dl_pdl_wait, in the producer's roles
  // that read them, so that the CTA's set-up and its K, V, Q and dO loads run under the prep's tail
  dl_pdl_release();
  const hp_bwd_tile_t tile = hp_bwd_tile<DQK, DV>(p);
  const int n_block = tile.n_block, hkv = tile.hkv, bb = tile.bb, group = p.h / p.h_kv;
  const int warp_id = hp_warp_uniform(threadIdx.x / 32), tid = threadIdx.x % 128;
  const hp_seq_t sq = hp_seq(p, bb);
  const int len_q = sq.len_q, len_kv = sq.len_kv;
  const int n0 = n_block * BN;
  if (n0 >= len_kv) return; // the whole CTA, before any barrier
  // query blocks [m_lo, m_hi): those holding a row that sees one of the keys [n0, n1]
  const int shift = p.bottom_right ? len_kv - len_q : 0, wl = p.window_left, wr = p.window_right;
  const int n1 = min(n0 + BN, len_kv) - 1;
  const int i_lo = wr >= 0 ? max(0, n0 - shift - wr) : 0, i_hi = wl >= 0 ? min(len_q, n1 - shift + wl + 1) : len_q;
  // RAG: items may start below row 0 (hp_bwd_row_off); its own kernels, launched for masked calls only, so that
  // the others keep their code (b56's run-time offset in every kernel cost 1.3-3% at d 128 16k without a mask)
  const int off = RAG ? hp_bwd_row_off<BQ>(p, len_q) : 0; // item m's rows: [m BQ - off, (m + 1) BQ - off)
  const int m_lo = (i_lo + off) / BQ, m_hi = i_hi > i_lo ? (i_hi + off + BQ - 1) / BQ : m_lo, nm = m_hi - m_lo;
  // the CTA's items: all group * nm of the block, or its part's (the tail split); item it of the block: q
  // head hkv * group + it / nm, query block m_lo + it % nm; the loops count it from 0, the item it + it_off
  // (built into dl.attn's loops at BQ 80 and 128 only: in BQ 64's ptxas spilled 20 bytes, and BULK's read
  // the workspace's lse2 rows, where the split slots are)
  constexpr bool SPLIT = BQ != 64;
  const int part = SPLIT ? tile.part : 0, parts = SPLIT ? tile.parts : 1;
  const int it_off = part * (group * nm) / parts;
  const int items = (part + 1) * (group * nm) / parts - it_off;
  const int hq0 = hkv * group + (nm > 0 ? it_off / nm : 0), m0 = m_lo + (nm > 0 ? it_off % nm : 0); // the first item's
  // The item's head and block (hq, m) counted in the loops, without a division an item (FA4-GAP.md B9),
  // except at BQ 80: its kernel ran 1.000-1.032x faster without a mask by the division
  // (experiments/results/attn/hopper-b9x-ab-h200.md), where the counters are dead code
  constexpr bool DIV = BQ == 80;
  auto item_hq = [&](int it, int hq) { return DIV ? hkv * group + (it + it_off) / nm : hq; };
  auto item_m = [&](int it, int m) { return DIV ? m_lo + (it + it_off) % nm : m; };

  if (threadIdx.x == 0) {
    sm.fail = 0;
    mbar_init(&sm.kv_full, 1);
    for (int i = 0; i < 2; i++) {
      mbar_init(&sm.q_full[i], BULK ? 1 : 1 + 32); // the TMA thread's expect_tx (and warp 9's rows of lse2)
      mbar_init(&sm.do_full[i], BULK ? 1 : 1 + 32); // (and of D)
      mbar_init(&sm.q_empty[i], bwd_releases(ELECT));
      mbar_init(&sm.do_empty[i], bwd_releases(ELECT));
    }
    mbar_init(&sm.dq_full, bwd_releases(ELECT)); // the consumers wrote an item's dQ
    mbar_init(&sm.dq_empty, 1);  // and the producer's reduction has read it
    for (int i = 0; i < 2; i++) {
      mbar_init(&sm.ds_ready[i], bwd_releases(ELECT));
      mbar_init(&sm.ds_free[i], bwd_releases(ELECT));
    }
    mbar_init_fence();
  }
  hp_sync();

  if (warp_id >= 8) { // producer
    reg_dealloc<24>();
    if (threadIdx.x == 256) {
      mbar_expect_tx(&sm.kv_full, tile_bytes_t<DQK>::value + tile_bytes_t<DV>::value);
      for (int half = 0; half < DQK / 64; half++) tma_load(sm.k[half], &tk, &sm.kv_full, 64 * half, hkv, sq.first_kv + n0, sq.tb);
      for (int half = 0; half < DV / 64; half++) tma_load(sm.v[half], &tv, &sm.kv_full, 64 * half, hkv, sq.first_kv + n0, sq.tb);
      int hq = hq0, m = m0; // item it's head and query block, counted (no division an item)
      for (int it = 0; it < items; it++, m = m + 1 == m_hi ? (hq++, m_lo) : m + 1) {
        const int st = it % 2;
        const uint32_t round = it / 2;
        if (BULK && it == 0) dl_pdl_wait(); // before item 0's loads: BULK's lse2 and D rows (bulk-loaded with Q and dO) are the prep's
        if (round > 0) mbar_wait(&sm.q_empty[st], (round - 1) & 1, &sm.fail, p.err);
        mbar_expect_tx(&sm.q_full[st], BQ * DQK * 2 + (BULK ? BQ * 4 : 0));
        for (int half = 0; half < DQK / 64; half++) tma_load(sm.q[st][half], &tq, &sm.q_full[st], 64 * half, item_hq(it, hq), sq.first_q + item_m(it, m) * BQ - off, sq.tb);
        if (BULK) bulk_load(sm.lse2[st], p.lse2 + item_hq(it, hq) * p.lse_rows + bwd_lse_row(p, sq, bb, item_m(it, m) * BQ), BQ * 4, &sm.q_full[st]);
        if (round > 0) mbar_wait(&sm.do_empty[st], (round - 1) & 1, &sm.fail, p.err);
        mbar_expect_tx(&sm.do_full[st], BQ * DV * 2 + (BULK ? BQ * 4 : 0));
        for (int half = 0; half < DV / 64; half++) tma_load(sm.dout[st][half], &tdo, &sm.do_full[st], 64 * half, item_hq(it, hq), sq.first_q + item_m(it, m) * BQ - off, sq.tb);
        if (BULK) bulk_load(sm.delta[st], p.delta + item_hq(it, hq) * p.lse_rows + bwd_lse_row(p, sq, bb, item_m(it, m) * BQ), BQ * 4, &sm.do_full[st]);
      }
      // HP_PREFETCH: K and V of the CTA that starts about when this one ends (hp_cta_lin), its first loads
      // and a key block's own (no other CTA reads them), into L2 while this CTA's last items run
      const int nxt = hp_cta_lin() + p.next_ctas;
      if (p.next_ctas > 0 && nxt < hp_grid_ctas()) {
        const hp_bwd_tile_t t = hp_bwd_tile<DQK, DV>(p, nxt);
        const hp_seq_t s = hp_seq(p, t.bb);
        if (t.n_block * BN < s.len_kv) {
          for (int half = 0; half < DQK / 64; half++) tma_prefetch_l2(&tk, 64 * half, t.hkv, s.first_kv + t.n_block * BN, s.tb);
          for (int half = 0; half < DV / 64; half++) tma_prefetch_l2(&tv, 64 * half, t.hkv, s.first_kv + t.n_block * BN, s.tb);
        }
      }
    } else if (!BULK && warp_id == 9) { // the rows' lse2 and D (rows past the sequence: +inf and 0, so P = dS = 0)
      const int lane = threadIdx.x % 32;
      if constexpr (BQ == 64) dl_pdl_wait(); // (D: the prep's; BQ 80 and 128 load lse alone here, the forward's)
      if constexpr (BQ != 64) { // the lse2 rows only (warp 11 loads D), the item's head and block counted: 24 registers
        // The item's rows loaded into registers before the wait for its stage, all in flight at once, so
        // that their latency runs under that wait, not one load after another after it (FA4-GAP section 18:
        // 0.988-1.032x backward at d 128, 0.997-1.018x at d 64, hopper-b27r-ab-h200.md)
        constexpr int NR = (BQ + 31) / 32;
        int hq = hq0, m = m0;
        for (int it = 0; it < items; it++) {
          const int st = it % 2;
          const uint32_t round = it / 2;
          float l[NR];
#pragma unroll
          for (int k = 0; k < NR; k++) {
            const int r = lane + 32 * k, i = item_m(it, m) * BQ - off + r;
            l[k] = r < BQ && (!RAG || i >= 0) && i < len_q ? p.lse[bwd_at(p.lse_st, sq.first_q, i, item_hq(it, hq), sq.tb)] : -INFINITY;
          }
          if (round > 0) mbar_wait(&sm.q_empty[st], (round - 1) & 1, &sm.fail, p.err);
#pragma unroll
          for (int k = 0; k < NR; k++)
            if (lane + 32 * k < BQ) sm.lse2[st][lane + 32 * k] = l[k] == -INFINITY ? INFINITY : l[k] * 1.4426950408889634f;
          mbar_arrive(&sm.q_full[st]);
          if (++m == m_hi) m = m_lo, hq++;
        }
      } else {
        int hq = hq0, m = m0;
        for (int it = 0; it < items; it++, m = m + 1 == m_hi ? (hq++, m_lo) : m + 1) {
          const int st = it % 2;
          const uint32_t round = it / 2;
          if (round > 0) mbar_wait(&sm.q_empty[st], (round - 1) & 1, &sm.fail, p.err);
          for (int r = lane; r < BQ; r += 32) {
            const int i = item_m(it, m) * BQ - off + r;
            const float l = (!RAG || i >= 0) && i < len_q ? p.lse[bwd_at(p.lse_st, sq.first_q, i, item_hq(it, hq), sq.tb)] : -INFINITY;
            sm.lse2[st][r] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
          }
          mbar_arrive(&sm.q_full[st]);
          if (round > 0) mbar_wait(&sm.do_empty[st], (round - 1) & 1, &sm.fail, p.err);
          for (int r = lane; r < BQ; r += 32) {
            const int i = item_m(it, m) * BQ - off + r;
            sm.delta[st][r] = (!RAG || i >= 0) && i < len_q ? p.delta[item_hq(it, hq) * p.ws_rows + bwd_ws_row(p, sq, bb, i)] : 0.0f;
          }
          mbar_arrive(&sm.do_full[st]);
        }
      }
    } else if (BQ != 64 && warp_id == 11) { // BQ 80, 128: the rows' D (warp 9's lse2 rows alone fill its registers)
      const int lane = threadIdx.x % 32;
      dl_pdl_wait(); // D is the prep's
      constexpr int NR = (BQ + 31) / 32;
      int hq = hq0, m = m0;
      for (int it = 0; it < items; it++) {
        const int st = it % 2;
        const uint32_t round = it / 2;
        float d[NR]; // loaded before the stage's wait, as warp 9's lse2 rows
#pragma unroll
        for (int k = 0; k < NR; k++) {
          const int r = lane + 32 * k, i = item_m(it, m) * BQ - off + r;
          d[k] = r < BQ && (!RAG || i >= 0) && i < len_q ? p.delta[item_hq(it, hq) * p.ws_rows + bwd_ws_row(p, sq, bb, i)] : 0.0f;
        }
        if (round > 0) mbar_wait(&sm.do_empty[st], (round - 1) & 1, &sm.fail, p.err);
#pragma unroll
        for (int k = 0; k < NR; k++)
          if (lane + 32 * k < BQ) sm.delta[st][lane + 32 * k] = d[k];
        mbar_arrive(&sm.do_full[st]);
        if (++m == m_hi) m = m_lo, hq++;
      }
    } else if (threadIdx.x == 320) { // each item's dQ from shared memory into the accumulator
      dl_pdl_wait(); // the accumulator's rows: zeroed by the prep
      int hq = hq0, m = m0;
      for (int it = 0; it < items; it++, m = m + 1 == m_hi ? (hq++, m_lo) : m + 1) {
        const int i0 = item_m(it, m) * BQ - off, lo = RAG ? max(i0, 0) : i0; // (rows below 0: none of the sequence's)
        mbar_wait(&sm.dq_full, (uint32_t)it & 1u, &sm.fail, p.err);
        const int rows = min(BQ, len_q - i0) - (lo - i0); // not into the next sequence's rows, nor the last's
        bulk_reduce_add(p.dq_acc + (item_hq(it, hq) * p.ws_rows + bwd_ws_row(p, sq, bb, lo)) * DQK, sm.dq + (lo - i0) * DQK,
                        (uint32_t)(rows * DQK * 4));
        bulk_commit();
        bulk_wait_read();
        mbar_arrive(&sm.dq_empty);
      }
      bulk_wait(); // the last reduction done before the CTA ends
    }
    return;
  }

  reg_alloc<240>();
  // consumers: warpgroup c owns keys [c * 64, c * 64 + 64) of the block; this thread keys kr and kr + 8
  const int c = warp_id / 4, warp = tid / 32, lane = tid % 32;
  const int kr = c * 64 + warp * 16 + lane / 4;
  // the consumers' arrivals on a barrier they release (bwd_releases): after a wgmma wait, and after
  // the warp's fenced generic stores into shared memory
  auto release = [&](uint64_t *bar) {
    if (!ELECT || lane == 0) mbar_arrive(bar);
  };
  auto release_stores = [&](uint64_t *bar) {
    if (ELECT) hp_syncwarp();
    release(bar);
  };
#if HP_BWD_TRACE
  uint32_t bt_prev = 0; // the last step's clock (thread 0 of the warpgroup)
  if (tid == 0) {
    for (int i = 0; i < HP_BT_WORDS; i++) sm.bt[c][i] = 0;
    bt_prev = (uint32_t)clock();
  }
#define HP_BT(it, step) \
  do { \
    if (tid == 0) { \
      const uint32_t now_ = (uint32_t)clock(); \
      sm.bt[c][step] += now_ - bt_prev; \
      bt_prev = now_; \
      if ((step) == BT_ARRIVE) sm.bt_arr[(it) % 2][c] = now_; \
      if ((step) == BT_MEET && c == 0) { /* both arrivals are in: the named barrier orders them */ \
        const int gap_ = (int)(sm.bt_arr[(it) % 2][1] - sm.bt_arr[(it) % 2][0]); \
        sm.bt[0][BT_GAP] += gap_ < 0 ? -gap_ : gap_, sm.bt[0][BT_LATE1] += gap_ > 0; \
      } \
    } \
  } while (0)
#else
#define HP_BT(it, step) ((void)0)
#endif
  float dk[DQK / 2], dv[DV / 2];
#pragma unroll
  for (int i = 0; i < DQK / 2; i++) dk[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < DV / 2; i++) dv[i] = 0.0f;
  const uint32_t k_all = hp_smem_u32(sm.k[0]), v_all = hp_smem_u32(sm.v[0]);
  const uint32_t k_c = k_all + c * 64 * 128, v_c = v_all + c * 64 * 128; // the warpgroup's keys (A rows)
  // B of dQ: the warpgroup's columns of d in K ([key][d], MN-major)
  const uint32_t k_cols = DQK == 128 ? k_all + c * BN * 128 : k_all + c * 64;
  mbar_wait(&sm.kv_full, 0, &sm.fail, p.err);
  if (n1 - n0 + 1 < BN) { // the keys past the sequence: zeros (K is dQ's B; V for dP's rows)
    if (c == 0) {
      zero_rows<DQK>(k_all, BN, n1 - n0 + 1, tid);
      zero_rows<DV>(v_all, BN, n1 - n0 + 1, tid);
    }
    fence_proxy_async();
    named_bar_sync(2, 256);
  }
  const int key_lo = n0 + c * 64, key_hi = key_lo + 63; // the warpgroup's keys
  // S^T and dP^T (s, dp: arrays of the loop's body, so that the compiler sees them dead between items),
  // P^T and dS^T in bf16 (pa, da: A of dV and dK, held until the wait that covers them)
  uint32_t pa[BQ / 4], da[BQ / 4];
  // the current item's query block, m_lo + it % nm, advanced at the end of each item (next_item): the
  // modulo cost an integer division an item (~35 instructions; FA4-GAP.md B9); BQ 80 divides (item_m)
  int mb = m0;
  auto next_item = [&] { mb = mb + 1 == m_hi ? m_lo : mb + 1; };
  // S^T = K_c Q^T and dP^T = V_c dO^T of item it issued (two commit groups), once its stage is in and
  // the query rows past the sequence are zeros (Q and dO are B of dK and dV)
  auto stage_in = [&](int it) {
    const int st = it % 2, i0 = item_m(it, mb) * BQ - off;
    const uint32_t ph = (uint32_t)(it / 2) & 1u;
    if (LOOP == BWD_ORDER) HP_BT(it, BT_HEAD);
    mbar_wait(&sm.q_full[st], ph, &sm.fail, p.err);
    if (LOOP == BWD_ORDER) HP_BT(it, BT_QWAIT);
    mbar_wait(&sm.do_full[st], ph, &sm.fail, p.err);
    if (len_q - i0 < BQ || (RAG && i0 < 0)) { // (i0 < 0: off's first item)
      if (c == 0) {
        zero_rows<DQK>(hp_smem_u32(sm.q[st][0]), BQ, len_q - i0, tid, RAG ? -i0 : 0);
        zero_rows<DV>(hp_smem_u32(sm.dout[st][0]), BQ, len_q - i0, tid, RAG ? -i0 : 0);
      }
      fence_proxy_async();
      named_bar_sync(2, 256);
    }
  };
  // BQ 80: the shared-memory bases of K and V through hp_opaque every item, so that ptxas derives their
  // descriptors in the loop rather than holding (and spilling) 24 of them over it
  auto in_loop = [](uint32_t x) {
    if constexpr (BQ != 64) return hp_opaque(x);
    else return x;
  };
  auto issue_sdp = [&](int it, float(&s)[BQ / 2], float(&dp)[BQ / 2]) {
    gemm_kmajor<DQK, BN, BQ>(s, in_loop(k_c), hp_smem_u32(sm.q[it % 2][0]));
    gemm_kmajor<DV, BN, BQ>(dp, in_loop(v_c), hp_smem_u32(sm.dout[it % 2][0]));
  };
  // This thread's queries are columns 8 j + 2 (lane % 4) + e % 2 of the item's 64, its keys rows
  // n0 + kr + 8 (e >> 1). P^T = exp2(S^T scale log2e - lse2), in place.
  // The two rows' values of a stage's lse2 or D this thread's columns j need (queries 8 j + 2 (lane % 4), + 1)
  // by one 8-byte load (were two 4-byte ones a j; attn-prof-h200.md, FA4-GAP.md B8b). Through the generic
  // pointer still: by ld.shared (asm, a memory clobber) ptxas spilled 16 bytes in the BULK kernels.
  auto rows2 = [&](const float *a, int j) { return *reinterpret_cast<const float2 *>(a + 8 * j + 2 * (lane % 4)); };
  // All of them into registers before the wait for the GEMM that needs them (B17, FA4's load_s2r of LSE and
  // dPsum): the loads' latency under the in-flight wgmmas, not after them (they are in: stage_in waited for
  // q_full and do_full, which lse2's and D's writers arrive on). Not at BQ 128: its 128 accumulators of S^T
  // and dP^T leave no room (ptxas spilled 32 bytes), so there after the waits as before.
  constexpr bool EARLY = BQ != 128;
  auto load_rows2 = [&](const float *a, float2(&v)[BQ / 8]) {
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) v[j] = rows2(a, j);
  };
  auto exp_p = [&](int st, const float2(&l2)[BQ / 8], float(&s)[BQ / 2]) {
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) {
      const float2 l = EARLY ? l2[j] : rows2(sm.lse2[st], j);
#pragma unroll
      for (int e = 0; e < 4; e++) s[4 * j + e] = hp_exp2(fmaf(s[4 * j + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
    }
  };
  auto visible = [&](int i0, int j, int e) {
    const int key = n0 + kr + 8 * (e >> 1), qi = i0 + 8 * j + 2 * (lane % 4) + (e & 1);
    return (key < len_kv) & (!RAG | (qi >= 0)) & (qi < len_q) & hp_visible(qi, key, shift, wl, wr);
  };
  auto pack_pa = [&](const float(&s)[BQ / 2]) {
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) pa[2 * j] = pack_bf16(s[4 * j], s[4 * j + 1]), pa[2 * j + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
  };
  // P^T once S^T is in, dS^T = P^T (dP^T - D) once dP^T is in (the two newest commit groups), the mask
  // where the block needs one; both packed to bf16 (pa, da)
  auto p_and_ds = [&](int it, float(&s)[BQ / 2], float(&dp)[BQ / 2]) {
    const int st = it % 2, i0 = item_m(it, mb) * BQ - off;
    float2 l2[BQ / 8], dd[BQ / 8]; // (unread where !EARLY: each loaded where it is used, after the wait)
    if constexpr (EARLY) load_rows2(sm.lse2[st], l2);
    wg_wait<1>(); // S^T and dP^T are the two newest commit groups
    exp_p(st, l2, s);
    if constexpr (EARLY) load_rows2(sm.delta[st], dd);
    const bool diag = key_hi >= len_kv || i0 + BQ - 1 >= len_q || (RAG && i0 < 0) || (wr >= 0 && key_hi - i0 > shift + wr) ||
                      (wl >= 0 && key_lo - (i0 + BQ - 1) < shift - wl);
    wg_wait<0>();
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) {
      const float2 d = EARLY ? dd[j] : rows2(sm.delta[st], j);
#pragma unroll
      for (int e = 0; e < 4; e++) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? d.y : d.x));
    }
    if (diag) {
#pragma unroll
      for (int j = 0; j < BQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const bool keep = visible(i0, j, e);
          s[4 * j + e] = keep ? s[4 * j + e] : 0.0f;
          dp[4 * j + e] = keep ? dp[4 * j + e] : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) {
      pa[2 * j] = pack_bf16(s[4 * j], s[4 * j + 1]), pa[2 * j + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
      da[2 * j] = pack_bf16(dp[4 * j], dp[4 * j + 1]), da[2 * j + 1] = pack_bf16(dp[4 * j + 2], dp[4 * j + 3]);
    }
  };
  auto issue_dkv = [&](int it) { // dV += P^T dO, dK += dS^T Q: one commit group
    wg_fence();
    gemm_acc<DV, BQ>(dv, pa, hp_smem_u32(sm.dout[it % 2][0]));
    gemm_acc<DQK, BQ>(dk, da, hp_smem_u32(sm.q[it % 2][0]));
    wg_commit();
  };
  // BWD_ORDER's halves of p_and_ds. P^T once S^T is in (dP^T the newest group), masked where the block
  // needs it, into pa. dP^T is not masked: a P^T of 0 makes dS^T 0, and dP^T is finite (the rows past a
  // sequence, of V and dO, are zeros in shared memory).
  auto p_only = [&](int it, float(&s)[BQ / 2]) {
    const int st = it % 2, i0 = item_m(it, mb) * BQ - off;
    float2 l2[BQ / 8];
    load_rows2(sm.lse2[st], l2); // (BQ 64: EARLY)
    wg_wait<1>();
    exp_p(st, l2, s);
    // written out as in p_and_ds: as one shared lambda, ptxas scheduled this kernel's prologue differently
    const bool diag = key_hi >= len_kv || i0 + BQ - 1 >= len_q || (RAG && i0 < 0) || (wr >= 0 && key_hi - i0 > shift + wr) ||
                      (wl >= 0 && key_lo - (i0 + BQ - 1) < shift - wl);
    if (diag) {
#pragma unroll
      for (int j = 0; j < BQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[4 * j + e] = visible(i0, j, e) ? s[4 * j + e] : 0.0f;
    }
    pack_pa(s);
  };
  // dS^T = P^T (dP^T - D) into da once dP^T is in (dV, issued after it, the newest group)
  auto ds_only = [&](int it, const float(&s)[BQ / 2], float(&dp)[BQ / 2]) {
    float2 dd[BQ / 8];
    load_rows2(sm.delta[it % 2], dd);
    wg_wait<1>();
#pragma unroll
    for (int j = 0; j < BQ / 8; j++) {
      const float2 d = dd[j];
#pragma unroll
      for (int e = 0; e < 4; e++) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? d.y : d.x));
      da[2 * j] = pack_bf16(dp[4 * j], dp[4 * j + 1]), da[2 * j + 1] = pack_bf16(dp[4 * j + 2], dp[4 * j + 3]);
    }
  };
  auto issue_dv = [&](int it) { // dV += P^T dO: a commit group
    wg_fence();
    gemm_acc<DV, BQ>(dv, pa, hp_smem_u32(sm.dout[it % 2][0]));
    wg_commit();
  };
  auto issue_dk = [&](int it) { // dK += dS^T Q: a commit group (da written before gemm_dq's fence)
    wg_fence();
    gemm_acc<DQK, BQ>(dk, da, hp_smem_u32(sm.q[it % 2][0]));
    wg_commit();
  };
  // dS^T (row = key, column = query) into buffer it % 2, rows of 128 bytes with the 128-byte swizzle,
  // then visible to the wgmma of either warpgroup. BQ 80: dS (row = query, the warpgroup's 64 keys a
  // row) into its tile of the buffer, the 8 x 8 blocks of da transposed by stmatrix: block (keys 16 warp
  // + 8 r, queries 8 j) is matrix 2 (j % 2) + r of the x4 of j / 2; lane 8 m + i gives row i of matrix
  // m's transpose, query 8 j + i, whose 16-byte chunk (2 warp + r) lies at chunk (2 warp + r) ^ i.
  // BQ 64 and 128: queries 8 j of tile j / 8 (query half at 128), by BQ / 16 stmatrix.x4 a warp rather
  // than BQ / 4 STS a thread (FA4-GAP.md B9): block (keys 16 warp + 8 r, queries 8 j), in the
  // accumulator's layout, is da[2 j + r], matrix 2 (j % 2) + r of the x4 of j / 2; lane 8 m + i gives row
  // (key) i of matrix m.
  auto store_ds_only = [&](int it) { // the stmatrix stores; store_ds adds the fence
    const uint32_t ds_base = hp_smem_u32(sm.ds[it % 2]);
    if constexpr (BQ == 128 || BQ == 64) {
      const int t = (int)in_loop((uint32_t)tid), m = (t % 32) / 8, i = t % 8; // t: the address in the loop (registers)
      const uint32_t at = ds_base + (c * 64 + 16 * (t / 32) + 8 * (m % 2) + i) * 128;
#pragma unroll
      for (int g = 0; g < BQ / 16; g++)
        stmatrix_x4(at + (g / 4) * BN * 128 + ((((2 * g) % 8 + m / 2) ^ i) << 4), da[4 * g], da[4 * g + 1], da[4 * g + 2],
                    da[4 * g + 3]);
    } else if constexpr (BQ == 80) {
      const int m = lane / 8, i = lane % 8, r = m % 2;
      const uint32_t at = ds_base + c * BQ * 128 + i * 128 + (((2 * warp + r) ^ i) << 4);
#pragma unroll
      for (int g = 0; g < BQ / 16; g++)
        stmatrix_x4_trans(at + (8 * (2 * g + m / 2)) * 128, da[4 * g], da[4 * g + 1], da[4 * g + 2], da[4 * g + 3]);
    }
  };
  auto store_ds = [&](int it) {
    store_ds_only(it);
    fence_proxy_async();
  };
  // dQ of item it (rows i0 + 16 warp + lane / 4 (+ 8), the warpgroup's columns, bwd_dq_col's order)
  // into the accumulator: into shared memory once the last item's reduction has read it, then the
  // producer's turn. n: the items stored so far.
  // BQ 80: dq holds dQ^T (row = the column 64 c + 16 warp + lane / 4 (+ 8) of d, column = query 8 j + 2
  // (lane % 4) (+ 1)); one 4-byte store a value, bwd_dq_col<80>'s order. BQ 128: rows 64 c + 16 warp +
  // lane / 4 (+ 8), all 64 columns.
  auto store_dq = [&](int n, const float(&dq)[NDQ]) {
    if (n > 0) mbar_wait(&sm.dq_empty, (uint32_t)(n - 1) & 1u, &sm.fail, p.err);
    if (LOOP == BWD_ORDER) HP_BT(n, BT_DQE);
    if constexpr (BQ == 80) {
      // value 4 j + e: column col0 + 8 (e / 2) of d, query row 8 j + 2 k + e % 2 (k = lane % 4), at
      // bwd_dq_col<80>'s column col ^ 8 ((row / 2) % 4) = col ^ 8 k, the thread's own for all its rows: so
      // two addresses, a0 and a1, and the 40 stores at constant offsets from them (no address arithmetic
      // a store: it was ~3 instructions each, 13% of the backward's, attn-prof-h200.md; FA4-GAP.md B8a;
      // the addresses checked equal to bwd_dq_col's for every thread, item row and value)
      const int k = lane % 4, col0 = c * 64 + warp * 16 + lane / 4; // col0's bit 3 is clear
      const uint32_t a = hp_smem_u32(sm.dq) + 4 * (2 * k) * DQK;
      const uint32_t a0 = a + 4 * (col0 ^ (8 * k)), a1 = a + 4 * ((col0 + 8) ^ (8 * k));
#pragma unroll
      for (int j = 0; j < BQ / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          st_shared_u32(((e >> 1) ? a1 : a0) + 4 * (8 * j + (e & 1)) * DQK, __float_as_uint(dq[4 * j + e]));
    } else if constexpr (BQ == 128) { // by shared addresses: 16 generic ones cost ptxas spills (registers)
      const uint32_t dq_base = hp_smem_u32(sm.dq);
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int row = c * 64 + warp * 16 + lane / 4 + 8 * r;
#pragma unroll
        for (int j = 0; j < DQK / 8; j++)
          st_shared_v2(dq_base + 4 * (row * DQK + bwd_dq_col(8 * j + 2 * (lane % 4), row)), __float_as_uint(dq[4 * j + 2 * r]),
                       __float_as_uint(dq[4 * j + 2 * r + 1]));
      }
    } else {
      // value pair (j, r): row warp 16 + lane / 4 + 8 r, column c DQK / 2 + 8 j + 2 (lane % 4), at bwd_dq_col's
      // column ^ 8 (row % 4) = ^ 8 k (k = (lane / 4) % 4, the same for both rows): 8 (j ^ k) over an address
      // whose bits 5-7 are clear (sm.dq 256-byte aligned, rows of 4 DQK bytes, halves of 2 DQK), i.e. the
      // address of j = B ^ 32 j. Shared stores from one address a thread (were 16 generic 8-byte stores with
      // their 64-bit addresses; FA4-GAP.md B8a; checked equal to bwd_dq_col's for every thread and value)
      using smem_t = bwd_smem_t<DQK, DV, BQ>;
      static_assert(offsetof(smem_t, dq) % 256 == 0, "B8a's addresses need sm.dq 256-byte aligned");
      const int k = (lane / 4) % 4;
      const uint32_t b = hp_smem_u32(sm.dq) + 4 * ((warp * 16 + lane / 4) * DQK + c * (DQK / 2) + 2 * (lane % 4)) + 32 * k;
#pragma unroll
      for (int r = 0; r < 2; r++)
#pragma unroll
        for (int j = 0; j < DQK / 16; j++)
          st_shared_v2((b ^ (32u * j)) + r * 8 * 4 * DQK, __float_as_uint(dq[4 * j + 2 * r]), __float_as_uint(dq[4 * j + 2 * r + 1]));
    }
    fence_proxy_async();
    release_stores(&sm.dq_full);
  };
  auto free_stage = [&](int it) {
    release(&sm.q_empty[it % 2]);
    release(&sm.do_empty[it % 2]);
  };

  if constexpr (LOOP == BWD_ORDER) { // in step, FA4's order (the enum's comment)
    for (int it = 0; it < items; it++) {
      float s[BQ / 2], dp[BQ / 2], dq[NDQ];
      stage_in(it);
      HP_BT(it, BT_STAGE);
      issue_sdp(it, s, dp);
      HP_BT(it, BT_SDP);
      if constexpr (BQ != 64) { // P^T and dS^T in fp32, then both packed: dV after dS, as FA4 (registers)
        p_and_ds(it, s, dp);
        HP_BT(it, BT_SOFT);
        if constexpr (HP_BWD_DS_EARLY && BQ == 128) { // dS^T's stores before dV's issue, the fence after it
          store_ds_only(it);
          issue_dv(it);
          fence_proxy_async();
        } else {
          issue_dv(it);
          store_ds(it);
        }
      } else {
        p_only(it, s);
        issue_dv(it);
        ds_only(it, s, dp);
        store_ds(it);
      }
      HP_BT(it, BT_ARRIVE);
      named_bar_sync(1, 256); // both warpgroups' dS^T are in (the other buffer is free: see the header)
      HP_BT(it, BT_MEET);
      if constexpr (BQ == 80) { // dQ^T under dV, as FA4's mma_dsk_fn (wg_wait=1): no wait for dV here (B15;
        // pa, dV's A, stays held until the wait that covers dV: ptxas keeps dq off it, 0 spills)
        gemm_dqt(dq, hp_smem_u32(sm.ds[it % 2]), in_loop(k_cols));
      } else if constexpr (BQ == 128) { // the warpgroup's 64 queries (its tile of dS^T) x all of d (no wait for dV: fits)
        gemm_dq<64>(dq, hp_smem_u32(sm.ds[it % 2]) + c * BN * 128, in_loop(k_all));
      } else gemm_dq<DQK / 2>(dq, hp_smem_u32(sm.ds[it % 2]), k_cols);
      issue_dk(it);
      HP_BT(it, BT_ISSUED);
      wg_wait<1>(); // dV and dQ are in (dK runs on): dO's stage is free, the dQ tile goes out
      HP_BT(it, BT_WAIT1);
      release(&sm.do_empty[it % 2]);
      store_dq(it, dq);
      HP_BT(it, BT_DQ);
      wg_wait<0>(); // dK is in: Q's stage is free
      HP_BT(it, BT_WAIT0);
      release(&sm.q_empty[it % 2]);
      next_item();
      HP_BT(it, BT_NEXT);
    }
  } else if constexpr (LOOP == BWD_STEP) { // both warpgroups in step: they meet at named barrier 1 every item (dS^T both halves)
    for (int it = 0; it < items; it++) {
      float s[BQ / 2], dp[BQ / 2], dq[NDQ];
      stage_in(it);
      issue_sdp(it, s, dp);
      p_and_ds(it, s, dp);
      issue_dkv(it);
      store_ds(it);
      named_bar_sync(1, 256); // both warpgroups' dS^T are in (the other buffer is free: see the header)
      gemm_dq<DQK / 2>(dq, hp_smem_u32(sm.ds[it % 2]), k_cols);
      wg_wait<0>(); // dV, dK and dQ are in: the stage is free
      free_stage(it);
      store_dq(it, dq);
      next_item();
    }
  } else { // BWD_TURNS: the warpgroups take turns at the tensor cores, dQ one item late
    // A turn (named barrier 4 + c, 256 threads: its own and the other's hand-over) to issue GEMMs, so
    // that one warpgroup's P and dS run under the other's GEMMs (fwd_kernel's scheduler). dQ of item
    // it - 1 is issued with dV and dK of item it, once both halves of its dS^T are in (ds_ready); a
    // dS^T buffer is written again once both warpgroups' dQ that read it are in (ds_free).
    auto take_turn = [&] { named_bar_sync(4 + c, 256); };
    auto hand_turn = [&] { named_bar_arrive(5 - c, 256); };
    auto parity = [](int it) { return (uint32_t)(it / 2) & 1u; };
    if (c == 0) named_bar_arrive(4, 256);
    for (int it = 0; it < items; it++) {
      float s[BQ / 2], dp[BQ / 2], dq[NDQ];
      stage_in(it);
      take_turn();
      issue_sdp(it, s, dp);
      hand_turn();
      p_and_ds(it, s, dp);
      if (it >= 2) mbar_wait(&sm.ds_free[it % 2], parity(it - 2), &sm.fail, p.err);
      store_ds(it);
      release_stores(&sm.ds_ready[it % 2]);
      take_turn();
      issue_dkv(it);
      if (it >= 1) {
        mbar_wait(&sm.ds_ready[(it - 1) % 2], parity(it - 1), &sm.fail, p.err);
        gemm_dq<DQK / 2>(dq, hp_smem_u32(sm.ds[(it - 1) % 2]), k_cols);
      }
      hand_turn();
      wg_wait<0>(); // dV, dK (and dQ of it - 1) are in
      free_stage(it);
      if (it >= 1) {
        release(&sm.ds_free[(it - 1) % 2]);
        store_dq(it - 1, dq);
      }
      next_item();
    }
    if (items > 0) { // the last item's dQ
      float dq[DQK / 4];
      take_turn();
      mbar_wait(&sm.ds_ready[(items - 1) % 2], parity(items - 1), &sm.fail, p.err);
      gemm_dq<DQK / 2>(dq, hp_smem_u32(sm.ds[(items - 1) % 2]), k_cols);
      hand_turn();
      wg_wait<0>();
      store_dq(items - 1, dq);
    }
  }

#if HP_BWD_TRACE
  if (tid == 0 && LOOP == BWD_ORDER) { // the lab's sums into p.trace (HP_BWD_TRACE)
    sm.bt[c][BT_ITEMS] = items;
    if (p.trace)
      for (int i = 0; i < HP_BT_WORDS; i++) atomicAdd(p.trace + c * HP_BT_WORDS + i, (unsigned long long)sm.bt[c][i]);
  }
#endif
  if (parts > 1) { // the tail split: this part's sums into the block's slot; the last part writes them
    float *acc = p.split_acc + (int64_t)tile.slot * BN * (DQK + DV);
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float *row = acc + (kr + 8 * r) * (DQK + DV) + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < DQK / 8; j++) atomicAdd(row + 8 * j, dk[4 * j + 2 * r]), atomicAdd(row + 8 * j + 1, dk[4 * j + 2 * r + 1]);
#pragma unroll
      for (int j = 0; j < DV / 8; j++)
        atomicAdd(row + DQK + 8 * j, dv[4 * j + 2 * r]), atomicAdd(row + DQK + 8 * j + 1, dv[4 * j + 2 * r + 1]);
    }
    __threadfence(); // this thread's adds before its part's arrival
    named_bar_sync(1, 256);
    if (threadIdx.x == 0) sm.ticket = atomicAdd(p.split_count + tile.slot, 1);
    named_bar_sync(1, 256);
    if (sm.ticket != parts - 1) return;
    __threadfence(); // every part's adds (each fenced before its arrival) before the reads
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float *row = acc + (kr + 8 * r) * (DQK + DV) + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < DQK / 8; j++) dk[4 * j + 2 * r] = __ldcg(row + 8 * j), dk[4 * j + 2 * r + 1] = __ldcg(row + 8 * j + 1);
#pragma unroll
      for (int j = 0; j < DV / 8; j++)
        dv[4 * j + 2 * r] = __ldcg(row + DQK + 8 * j), dv[4 * j + 2 * r + 1] = __ldcg(row + DQK + 8 * j + 1);
    }
  }
  // dK (times the scale) and dV of the keys in the sequence, bf16
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int key = n0 + kr + 8 * r;
    if (key >= len_kv) continue;
    uint16_t *gk = p.dk + bwd_at(p.dk_st, sq.first_kv, key, hkv, sq.tb) + 2 * (lane % 4);
    uint16_t *gv = p.dv + bwd_at(p.dv_st, sq.first_kv, key, hkv, sq.tb) + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < DQK / 8; j++) {
      float x = dk[4 * j + 2 * r] * p.scale, y = dk[4 * j + 2 * r + 1] * p.scale;
      uint32_t *dst = reinterpret_cast<uint32_t *>(gk + 8 * j);
      if (p.accumulate) x += bf16_lo(*dst), y += bf16_hi(*dst);
      *dst = pack_bf16(x, y);
    }
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
      float x = dv[4 * j + 2 * r], y = dv[4 * j + 2 * r + 1];
      uint32_t *dst = reinterpret_cast<uint32_t *>(gv + 8 * j);
      if (p.accumulate) x += bf16_lo(*dst), y += bf16_hi(*dst);
      *dst = pack_bf16(x, y);
    }
  }
}

#endif
