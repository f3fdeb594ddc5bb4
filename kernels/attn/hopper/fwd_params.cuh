/*
 * fwd_params.cuh — what the Hopper forward's kernel (fwd_kernel.cuh), its
 * launchers and the backward (bwd_kernel.cuh) share: the tile sizes, the
 * shared memory layout, params_t and its addressing, the masks' visibility
 * test, the waits that time out, and the lab's trace.
 */
#ifndef DISTLAB_HOPPER_FWD_PARAMS_CUH
#define DISTLAB_HOPPER_FWD_PARAMS_CUH

#include <math.h>
#include <stdint.h>

#ifndef HOPPER_EMU
#include "ptx.cuh"
#endif

// 2 consumer warpgroups (warps 0-7) and a producer warpgroup (8-11); head dims DQK (q, k) and DV (v, o),
// multiples of 64, in halves of 64 columns (a TMA box each). The forward's M192 variant (fwd_kernel's
// HP_FWD_OPT_M192) has 3 consumer warpgroups (warps 0-11), the producer's warps 12-15 and BM = 192 rows
// a CTA: fwd_rows/fwd_threads below; BM and THREADS stay the default kernels' and the backward's.
constexpr int BM = 128, BN = 128, STAGES = 2, THREADS = 384;
template <int DH> struct tile_bytes_t { static constexpr uint32_t value = 128 * DH * 2; }; // a [128][DH] bf16 tile

// ROWS: the query rows of a CTA (BM, or 192 with HP_FWD_OPT_M192)
template <int DQK, int DV, int ROWS = BM> struct alignas(1024) smem_t {
  uint16_t q[DQK / 64][ROWS * 64];
  uint16_t k[STAGES][DQK / 64][BN * 64];
  uint16_t v[STAGES][DV / 64][BN * 64];
  uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
  uint64_t acc_go, acc_full; // the running rows staged (acc_stage_t): go (the producer's thread), landed
  int fail; // a wait of this CTA timed out (mbar_wait)
};

// The fused merge's running rows in shared memory right past smem_t: the block's ROWS rows of acc_out
// (DV values, fp32 or bf16) as TMA's 128-byte swizzle lays out boxes of 128 bytes x ROWS rows, one a
// 128 bytes of a row (a row's 16-byte chunk c in box c / 8 at chunk (c % 8) ^ (row % 8), so that the
// epilogue's reads of eight rows at once fall in different banks and a TMA copy can fill or store
// them: HP_FWD_OPT_TMA_M), then ROWS fp32 LSEs. Staged where the tiles
// leave room (227 KB an SM: head dims 64 and 128); HP_FWD_STAGE_ACC=0 (a build flag, for A/B
// timings) turns it off.
#ifndef HP_FWD_STAGE_ACC
#define HP_FWD_STAGE_ACC 1
#endif
// The forward's A/B variants (experiments/lab/attn/FA4-GAP.md, items F2 and F3), bits of fwd_kernel's
// template parameter OPT, off in the default build:
//   HP_FWD_OPT_ELECT: a K or V stage is released by one arrival a warp (lane 0, after the warp's
//     wgmma.wait_group), on empty barriers of count 8, instead of one a consumer thread (256);
//   HP_FWD_OPT_TREE: the softmax's row max over 4 independent accumulators then a tree, and the row
//     sum as 4 partial sums carried over the key blocks and added in the epilogue (dependent chains of
//     8 + 2, not 32).
//   HP_FWD_OPT_TMA_O (FA4-GAP.md F4): the plain epilogue (no merge) writes a warpgroup's O in bf16 over
//     its own rows of Q in shared memory and stores them with one TMA store a half of d (the kernel's
//     fifth tensor map, boxes of 64 rows); thd keeps the per-thread stores for a warpgroup whose 64 rows
//     reach past its sequence (the map would write the next sequence's rows).
//   HP_FWD_OPT_M192 (FA4-GAP.md F6, FA4's sm90 tile at d 64): 192 query rows a CTA, three consumer
//     warpgroups of 64 rows taking the tensor-core turn in rotation, 512 threads, setmaxnreg 160 for
//     the consumers and 32 for the producer (3 x 128 x 160 + 128 x 32 = 64K registers).
//   HP_FWD_OPT_LAZY (FA4-GAP.md section 9): a row's running max, the base of its exps, moves only where a
//     block raises it by more than HP_FWD_LAZY_LOG2 (2^8: P up to 256, exact in the end since O, the sums
//     and the LSE share the stale base), and O's rescale is skipped where no row of the warp moved (a vote):
//     the 32 or 64 FMULs a thread a block, on the path between P V(it - 1) and P V(it). Not with max_logit
//     (the stale base is not the max; attn_hopper.cu keeps the knob off there).
// The build flags HP_FWD_ELECT=1, HP_FWD_TREE=1 and HP_FWD_TMA_O=1 set them in OPT's default (the lab's
// fwd.cu, the emulator); dl.attn's launcher also takes them at run time (DISTLAB_ATTN_HOPPER_FWD_ELECT,
// DISTLAB_ATTN_HOPPER_FWD_TREE at d 128; DISTLAB_ATTN_HOPPER_FWD_TMA_O: attn_hopper.cu).
//   HP_FWD_OPT_TMA_M (FA4-GAP.md section 14): the fused merge's running rows (staged, acc_stage_t) come in
//     by TMA boxes of the fifth tensor map (to: the running out's, fp32 or bf16, boxes of 128 bytes x 64
//     rows) where the producer's three copy warps issued a cp.async a 16 bytes, and the merged rows go
//     back from shared memory by TMA stores (thd: a warpgroup whose rows reach past its sequence keeps
//     its stores); the LSEs as before. attn_hopper.cu sets it where dl.attn asks for it (a knob).
enum {
  HP_FWD_OPT_ELECT = 1,
  HP_FWD_OPT_TREE = 2,
  HP_FWD_OPT_TMA_O = 4,
  HP_FWD_OPT_M192 = 8,
  HP_FWD_OPT_LAZY = 16,
  HP_FWD_OPT_TMA_M = 32
};
constexpr float HP_FWD_LAZY_LOG2 = 8.0f; // HP_FWD_OPT_LAZY's slack, in log2 units (FA4's sm100 rescale threshold)
// A forward kernel's consumer warpgroups, query rows and threads for its OPT bits.
constexpr HP_HD int fwd_wgs(int opt) { return opt & HP_FWD_OPT_M192 ? 3 : 2; }
constexpr HP_HD int fwd_rows(int opt) { return 64 * fwd_wgs(opt); }
constexpr HP_HD int fwd_threads(int opt) { return 128 * (fwd_wgs(opt) + 1); }
#ifndef HP_FWD_ELECT
#define HP_FWD_ELECT 0
#endif
#ifndef HP_FWD_TREE
#define HP_FWD_TREE 0
#endif
#ifndef HP_FWD_TMA_O
#define HP_FWD_TMA_O 0
#endif
constexpr int HP_FWD_OPT = (HP_FWD_ELECT ? HP_FWD_OPT_ELECT : 0) | (HP_FWD_TREE ? HP_FWD_OPT_TREE : 0) |
                           (HP_FWD_TMA_O ? HP_FWD_OPT_TMA_O : 0);
#ifndef HP_FWD_TRACE // the lab's timeline of each CTA (hp_trace)
#define HP_FWD_TRACE 0
#endif

template <int DQK, int DV, int ROWS = BM> struct acc_stage_t {
  static constexpr uint32_t o_bytes = ROWS * DV * 4, bytes = o_bytes + ROWS * 4;
  static constexpr bool on = HP_FWD_STAGE_ACC && sizeof(smem_t<DQK, DV, ROWS>) + 1024 + bytes <= 227 * 1024;
  // the copies: each of the 96 copying threads keeps one 16-byte chunk of a row (fwd_kernel)
  static_assert(!on || 96 % (DV * 4 / 16) == 0, "a staged row's 16-byte chunks must divide 96 threads");
};
// Where byte `byte` of staged row `row` of ROWS lies (acc_stage_t's boxes and swizzle).
template <int ROWS> HP_DEV uint32_t acc_stage_at(uint32_t stage, int row, int byte) {
  return stage + (byte >> 7) * (ROWS * 128) + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15);
}
// The dynamic shared memory of a launch (+ 1024: the slack of aligning smem_t to 1024 bytes).
template <int DQK, int DV, int ROWS = BM> HP_HD size_t fwd_smem_bytes(bool merge) {
  using ST = acc_stage_t<DQK, DV, ROWS>;
  return sizeof(smem_t<DQK, DV, ROWS>) + 1024 + (merge && ST::on ? ST::bytes : 0);
}

// Addressing as kernels/attn/attn.h's: row i of sequence bb, head hh, of an operand with strides st
// (elements: position, head, batch) is at base + i st[0] + hh st[1], base = bb st[2] (bshd, sbhd) or
// start(bb) st[0] (thd: start = pad[bb], or cu[bb] where pad is NULL); d contiguous.
struct params_t {
  int b, h, h_kv;      // q heads, K/V heads (GQA/MQA: h a multiple of h_kv; q head hh reads hh / (h / h_kv))
  int s_q, s_kv;       // bshd/sbhd: every sequence's lengths; thd: the longest query length (the grid)
  // the mask: query i sees key j where i + shift - window_left <= j <= i + shift + window_right (-1:
  // no bound), shift = len_kv - len_q (bottom_right) or 0; causal = (-1, 0); none = (-1, -1)
  int window_left, window_right, bottom_right;
  float scale_log2;    // softmax scale * log2(e)
  uint16_t *o;         // bf16
  int64_t o_st[3];
  float *lse;          // natural log
  int64_t lse_st[3];
  // thd when cu_q is set: sequence bb has cu[bb + 1] - cu[bb] rows (tensor maps: batch extent 1)
  const int *cu_q, *cu_kv, *pad_q, *pad_kv;
  // fused merge (dl.attn's accumulate): where acc_out is set, the step's (O, LSE) is merged into the
  // running (acc_out, acc_lse) and out/lse are not written; acc_out is fp32, or bf16 where acc_bf16
  void *acc_out;
  float *acc_lse;
  int64_t acc_st[3], acc_lse_st[3];
  int acc_bf16;
  int acc_vec;      // the bytes of one cp.async of acc_out's rows: 16, 8 or 4 (what its base and strides allow)
  float *max_logit; // optional [h]: the largest scaled logit a row sees (the caller fills -inf)
  int *err;         // optional: set to 1 when a wait timed out (the results are then garbage)
  int group_mb;     // the masked schedule's groups of heads (tile_scheduler.cuh): MB of L2, 0 the build's, -1 none
  int next_ctas;    // HP_PREFETCH: the GPU's SMs, so that CTA lin + next_ctas starts about when CTA lin ends; 0 off
  int rag_first;    // a masked call's short m-block first (hp_fwd_row_off); 0 off
#if HP_FWD_TRACE
  unsigned long long *trace; // lab only (HP_FWD_TRACE): HP_TRACE_SLOTS clocks a CTA (hp_trace below)
#endif
};

// params_t.acc_vec: the largest of 16, 8 and 4 bytes that divides acc_out's base and its strides (es
// bytes an element), for the hosts.
HP_HD int hp_acc_vec(const void *acc, const int64_t (&st)[3], int es) {
  const uint64_t a = (uint64_t)(uintptr_t)acc | (uint64_t)(st[0] * es) | (uint64_t)(st[1] * es) | (uint64_t)(st[2] * es);
  return a % 16 == 0 ? 16 : a % 8 == 0 ? 8 : 4;
}

// The two bf16 halves of a 32-bit word (lo: the low half), exactly, as floats.
HP_DEV float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
HP_DEV float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }
HP_DEV float2 unpack_bf16(uint32_t x) { return make_float2(bf16_lo(x), bf16_hi(x)); }

// Strides in elements (position, head, batch) of a [b, s, heads, d] (bshd) or [s, b, heads, d]
// (sbhd) tensor, for the hosts (tensor maps, references, params_t).
HP_HD void hp_strides(bool sbhd, int b, int s, int heads, int d, int64_t st[3]) {
  st[0] = (int64_t)heads * d * (sbhd ? b : 1);
  st[1] = d;
  st[2] = (int64_t)heads * d * (sbhd ? 1 : s);
}

// LSE strides (position, head, batch) of [b, h, s] (bshd, sbhd) or [h, rows] (thd), for the hosts.
HP_HD void hp_lse_strides(bool thd, int h, int s_or_rows, int64_t st[3]) {
  st[0] = 1;
  st[1] = s_or_rows;
  st[2] = thd ? 0 : (int64_t)h * s_or_rows;
}

// The rows a sequence's m-blocks are shifted by (params_t.rag_first): where a window bounds the keys on the
// right (causal) and there is no merge, m-block m takes rows [m ROWS - off, (m + 1) ROWS - off), off the rows
// the last block would lack, so that the short block is the first (the fewest keys) and not the last (the most):
// at d 64's 192-row CTAs, 4k causal, a 64-row CTA over 32 key blocks (its other warpgroups' rows computed and
// dropped) becomes one over 1. Rows below 0: TMA's zeros (bshd, sbhd) or another sequence's rows (thd),
// computed, never stored.
HP_HD int hp_fwd_row_off(const params_t &p, int len_q, int rows) {
  return p.rag_first && p.window_right >= 0 && !p.acc_out ? (rows - len_q % rows) % rows : 0;
}

// Whether query i sees key j (params_t's mask; shift = len_kv - len_q with bottom_right, else 0).
HP_HD bool hp_visible(int i, int j, int shift, int window_left, int window_right) { // bitwise: no branches
  return (window_left < 0 | j >= i + shift - window_left) & (window_right < 0 | j <= i + shift + window_right);
}

// Sequence bb of a call (params_t or bwd_params_t: s_q, s_kv, cu_q, cu_kv, pad_q, pad_kv): its lengths,
// the rows its position 0 is at (thd: pad, else cu; 0 for bshd/sbhd) and the batch index the tensors
// address it by (thd: 0).
struct hp_seq_t {
  int len_q, len_kv, first_q, first_kv, tb;
};
template <class P> HP_DEV hp_seq_t hp_seq(const P &p, int bb) {
  hp_seq_t s{p.s_q, p.s_kv, 0, 0, bb};
  if (p.cu_q) {
    s.len_q = p.cu_q[bb + 1] - p.cu_q[bb], s.len_kv = p.cu_kv[bb + 1] - p.cu_kv[bb];
    s.first_q = p.pad_q ? p.pad_q[bb] : p.cu_q[bb], s.first_kv = p.pad_kv ? p.pad_kv[bb] : p.cu_kv[bb], s.tb = 0;
  }
  return s;
}

// Every wait ends: a phase still open after 2^26 polls, or once another thread of the CTA gave up
// (*fail), sets *err (params_t.err, which the host reads) and returns, so that the CTA runs to its end
// on whatever shared memory holds and no barrier hangs. (A trap there made ptxas spill P in PIPE 1.)
// The poll count is an int (a long cost a 64-bit compare a poll); *fail stays a generic volatile read:
// read by ld.shared, or every 16th poll only, ptxas spilled 8-24 bytes in 1 to 9 of the kernels.
HP_DEV void mbar_wait(uint64_t *b, uint32_t parity, volatile int *fail, int *err) {
  for (int n = 0; !mbar_try(b, parity); n++)
    if (n > (1 << 26) || *fail) {
      *fail = 1;
      if (err) *err = 1;
      return;
    }
}

// HP_FWD_TRACE (a lab build flag, off in dl.attn: the default PTX has none of it): where p.trace is
// set, a CTA writes the SM clock (%clock64) at its events into HP_TRACE_SLOTS words of its own
// (blockIdx linear): 0 the SM's id, 1 the start, 2 %globaltimer at the start, 3 the running rows
// landed (warp 9), 4 the producer's last load issued, 5 Q landed (warp 0), 8 + w consumer warp w's
// main loop done, 16 + w its epilogue's stores issued (24 + w: then %globaltimer). experiments/lab/attn/hopper/fwd.cu --trace
// reads them: where a CTA's time goes, and the gaps between CTAs on an SM.
constexpr int HP_TRACE_SLOTS = 32;
#if HP_FWD_TRACE
enum { HP_TRACE_CLOCK, HP_TRACE_GLOBAL, HP_TRACE_SMID };
HP_DEV void hp_trace(const params_t &p, int slot, int what = HP_TRACE_CLOCK) {
  if (!p.trace) return;
  unsigned long long t;
  if (what == HP_TRACE_GLOBAL) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  else if (what == HP_TRACE_SMID) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    t = id;
  } else asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  const size_t cta = blockIdx.x + (size_t)gridDim.x * (blockIdx.y + (size_t)gridDim.y * blockIdx.z);
  p.trace[cta * HP_TRACE_SLOTS + slot] = t;
}
#define HP_TRACE(...) hp_trace(__VA_ARGS__)
#else
#define HP_TRACE(...) ((void)0)
#endif

#endif
