/*
 * fwd_kernel.cuh — dl.attn's forward on Hopper (sm_90a): wgmma and TMA,
 * warp-specialised, FA3's design written out in PTX (ptx.cuh). The launcher
 * is attn_hopper.cu (which calls are taken: dl_attn_fwd_hopper_fits);
 * experiments/lab/attn/hopper/ times it alone (fwd.cu) and runs this file on
 * the CPU with wgmma, TMA and mbarriers emulated (emu.cpp).
 *
 * Why hand-written PTX and not CuTe: the kernel needs a few instructions that
 * CuTe wraps (TMA load, mbarrier, wgmma SS/RS, named barriers, setmaxnreg)
 * and two kinds of shared memory descriptors; spelled out they are one
 * screen each, the descriptors are explicit (below), and the file compiles
 * in seconds on CI's two cores. Layouts read from CUTLASS 4.2's
 * cute/atom/mma_traits_sm90_gmma.hpp and cute/arch/copy_sm90_tma.hpp; no
 * code copied.
 *
 * Shapes: bf16, head dims (d_qk, d_v) = (64, 64), (128, 128) or MLA's (192, 128) (templates DQK, DV); bshd, sbhd or thd (packed rows, first rows
 * that need not start at 0, anything (NaN) between sequences); GQA/MQA; any
 * length; dl.attn's masks (a window (left, right) around the diagonal,
 * top-left or bottom-right); LSE (natural log), max_logit, and the fused
 * merge into a running (acc_out, acc_lse): acc_out fp32, or bf16 (CP's
 * accumulator has q's dtype), the merge in fp32 either way.
 *
 * CTA: 384 threads, BM = 128 query rows of one (batch, head); grid (m-blocks
 * last to first, heads, batches).
 *   warpgroup 2, producer (setmaxnreg 24): one thread TMA-loads Q once, then
 *     K and V of each key block (BN = 128; last block first) into STAGES = 2
 *     buffers; full barriers carry the bytes, empty barriers free them. With
 *     the merge, warps 9-11 copy the running rows (cp.async) into shared
 *     memory past the tiles once the first S ran (acc_stage_t), so that the
 *     epilogue finds them there; where they do not fit beside the tiles
 *     (MLA's 192/128), the consumers load them into registers under the last
 *     P V instead (merge_loads).
 *   warpgroups 0, 1, consumers (setmaxnreg 240): 64 query rows each. Per key
 *     block: S = Q K^T (8 wgmma m64n128k16 from shared memory); the element
 *     mask (selects) only in blocks that need it; online softmax in base 2
 *     (FFMA + MUFU.EX2 an element); O += P V with P in registers (8 RS wgmma,
 *     V transposed by its descriptor). The two warpgroups take turns at the
 *     tensor cores (FA3's scheduler: named barriers 4 and 5), so one's
 *     softmax runs under the other's GEMMs. PIPE = 1 adds FA3's
 *     intra-warpgroup pipelining (S(j) issued with P(j-1) V(j-1)).
 *   Every wait times out into *err (no trap: a trap made ptxas spill P).
 *
 * Shared memory tiles, each a TMA box of 64 columns (128 bytes) x rows with
 * the 128-byte swizzle, 1024-byte aligned; a d = 128 tile is two of them:
 * Q [2][BM][64], K and V [STAGES][2][BN][64]: 160 KB, one CTA an SM.
 * wgmma descriptors (start >> 4 at [0,14), leading byte offset >> 4 at
 * [16,30), stride byte offset >> 4 at [32,46), 1 = 128B swizzle at [62,64)):
 *   K-major (Q as A, K as B): SBO = 1024 (8 rows of 128 B), LBO = 16 (unused);
 *     the k16 step kk of a half at start + 32 kk, the second half of d at
 *     start + rows * 128.
 *   MN-major (V as B; d = N contiguous): SBO = 1024 (8 keys), LBO = BN * 128
 *     (the second 64 columns of d); the k16 step (16 keys) at start + 2048.
 *
 * The variants tried and dropped (the merge's stores and copies, persistent
 * grids, P through shared memory) and their timings: experiments/lab/attn/NOTES.md.
 */
#ifndef DISTLAB_HOPPER_FWD_KERNEL_CUH
#define DISTLAB_HOPPER_FWD_KERNEL_CUH

#include <math.h>
#include <stdint.h>

#include <type_traits>

#ifndef HOPPER_EMU
#include "ptx.cuh"
#endif

// 2 consumer warpgroups (warps 0-7) and a producer warpgroup (8-11); head dims DQK (q, k) and DV (v, o),
// multiples of 64, in halves of 64 columns (a TMA box each)
constexpr int BM = 128, BN = 128, STAGES = 2, THREADS = 384;
template <int DH> struct tile_bytes_t { static constexpr uint32_t value = 128 * DH * 2; }; // a [128][DH] bf16 tile

template <int DQK, int DV> struct alignas(1024) smem_t {
  uint16_t q[DQK / 64][BM * 64];
  uint16_t k[STAGES][DQK / 64][BN * 64];
  uint16_t v[STAGES][DV / 64][BN * 64];
  uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
  uint64_t acc_go, acc_full; // the running rows staged (acc_stage_t): go (the producer's thread), landed
  int fail; // a wait of this CTA timed out (mbar_wait)
};

// The fused merge's running rows in shared memory right past smem_t: the block's BM rows of acc_out
// (DV values, fp32 or bf16, a row's 16-byte chunk c at chunk c ^ (row % 8), so that the epilogue's
// reads of eight rows at once fall in different banks), then BM fp32 LSEs. Staged where the tiles
// leave room (227 KB an SM: head dims 64 and 128); HP_FWD_STAGE_ACC=0 (a build flag, for A/B
// timings) turns it off.
#ifndef HP_FWD_STAGE_ACC
#define HP_FWD_STAGE_ACC 1
#endif
#ifndef HP_FWD_TRACE // the lab's timeline of each CTA (hp_trace)
#define HP_FWD_TRACE 0
#endif

template <int DQK, int DV> struct acc_stage_t {
  static constexpr uint32_t o_bytes = BM * DV * 4, bytes = o_bytes + BM * 4;
  static constexpr bool on = HP_FWD_STAGE_ACC && sizeof(smem_t<DQK, DV>) + 1024 + bytes <= 227 * 1024;
  // the copies: each of the 96 copying threads keeps one 16-byte chunk of a row (fwd_kernel)
  static_assert(!on || 96 % (DV * 4 / 16) == 0, "a staged row's 16-byte chunks must divide 96 threads");
};
// Where byte `byte` of staged row `row` (row_bytes a row, a power of 2 of at least 128) lies
// (acc_stage_t's swizzle).
HP_DEV uint32_t acc_stage_at(uint32_t stage, int row, int row_bytes, int byte) {
  return stage + row * row_bytes + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}
// The dynamic shared memory of a launch (+ 1024: the slack of aligning smem_t to 1024 bytes).
template <int DQK, int DV> HP_HD size_t fwd_smem_bytes(bool merge) {
  return sizeof(smem_t<DQK, DV>) + 1024 + (merge && acc_stage_t<DQK, DV>::on ? acc_stage_t<DQK, DV>::bytes : 0);
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
HP_DEV void mbar_wait(uint64_t *b, uint32_t parity, volatile int *fail, int *err) {
  for (long n = 0; !mbar_try(b, parity); n++)
    if (n > (1l << 26) || *fail) {
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

// The tile a CTA computes: m-block m_block (of BM query rows) of head hh, sequence bb. CTAs start in grid order
// (m-blocks, heads, sequences; x fastest). Unmasked calls keep it: each head's m-blocks last to first, head after
// head; their tiles are of one length, so there is no tail to win back, and fewer heads' K and V share L2 at once.
// Masked calls (causal, windows; HP_FWD_GROUP=0 turns this off) take heads in groups whose K and V fit in L2
// (HP_FWD_GROUP_BYTES), and within a group the tiles by m-block, heaviest first over all of the group's heads, so
// that the last heavy tiles do not start near the grid's end. Timings: experiments/lab/attn/NOTES.md.
#ifndef HP_FWD_GROUP
#define HP_FWD_GROUP 1
#endif
#ifndef HP_FWD_GROUP_BYTES // the L2 a group's K and V may take (a smaller one in the emulator: partial groups)
#define HP_FWD_GROUP_BYTES (16 << 20)
#endif
struct hp_tile_t {
  int m_block, hh, bb;
};
template <int DQK, int DV> HP_DEV hp_tile_t hp_fwd_tile(const params_t &p) {
  const int nm = gridDim.x;
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  if (!HP_FWD_GROUP || !masked) return hp_tile_t{nm - 1 - (int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z};
  const int nhb = gridDim.y * gridDim.z, lin = blockIdx.x + nm * (blockIdx.y + gridDim.y * blockIdx.z);
  const int64_t kv_head = (int64_t)p.s_kv * (DQK + DV) * 2; // a head's K and V bytes (bshd; thd: the longest)
  const int g_max = (int)max((int64_t)1, min((int64_t)nhb, (int64_t)(HP_FWD_GROUP_BYTES) / max(kv_head, (int64_t)1)));
  const int group = lin / (g_max * nm), first = group * g_max, g = min(g_max, nhb - first);
  const int within = lin - group * g_max * nm, hb = first + within % g;
  return hp_tile_t{nm - 1 - within / g, hb % (int)gridDim.y, hb / (int)gridDim.y};
}

// A shared memory matrix descriptor with the 128-byte swizzle.
HP_DEV uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
         (uint64_t)((sbo >> 4) & 0x3fff) << 32 | 1ull << 62;
}


// ---- the consumers' steps (thread t of a warpgroup holds rows r0 = 16 (t / 32) + (t % 32) / 4 and
// r0 + 8 of its 64, columns 8 j + 2 (t % 4) + {0, 1}: value 4 j + e is row r0 + 8 (e / 2), column
// 8 j + 2 (t % 4) + e % 2) ----

// X = A B^T over DH: A the warpgroup's 64 rows in a tile of A_ROWS rows, B a tile of B_ROWS rows (a
// tile's second half of d lies ROWS * 128 bytes on), both K-major in shared memory; DH / 16 wgmma
// m64nNk16 with N = 2 NACC (64 accumulators: N = 128; 32: N = 64), one commit group.
template <int DH, int A_ROWS, int B_ROWS, int NACC> HP_DEV void gemm_kmajor(float (&x)[NACC], uint32_t a_base, uint32_t b_base) {
  wg_fence();
#pragma unroll
  for (int half = 0; half < DH / 64; half++)
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(x, gmma_desc(a_base + half * A_ROWS * 128 + kk * 32, 16, 1024),
               gmma_desc(b_base + half * B_ROWS * 128 + kk * 32, 16, 1024), half | kk);
  wg_commit();
}

// S = Q K^T over d = DH.
template <int DH> HP_DEV void gemm_qk(float (&s)[64], uint32_t q_base, uint32_t k_base) { gemm_kmajor<DH, BM, BN>(s, q_base, k_base); }

// The element mask of a key block that needs one (diag below): -inf where the key is past len_kv or
// outside the row's window. Selects, not branches: a branch an element made the loop too long for the
// instruction cache (most of the stalls at s 8k were instruction fetch).
HP_DEV void mask_block(float (&s)[64], int key0, int q0, int len_kv, int shift, int wl, int wr, int lane) {
#pragma unroll
  for (int j = 0; j < 16; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int col = key0 + 8 * j + 2 * (lane % 4) + (e & 1), row = q0 + 8 * (e >> 1);
      const bool keep = (col < len_kv) & hp_visible(row, col, shift, wl, wr);
      s[4 * j + e] = keep ? s[4 * j + e] : -INFINITY;
    }
}

// The online softmax in base 2: s (raw logits, masked) becomes exp2(s * scale - max), one FFMA and
// one MUFU.EX2 an element, with max (mx) in scaled units; sum grows, corr is the factor that brings
// O (and the old sum, already scaled) to the new max. The block's row maxima are taken on the raw
// logits (scale > 0).
HP_DEV void softmax_step(float (&s)[64], float (&mx)[2], float (&sum)[2], float (&corr)[2], float scale_log2) {
  float mraw[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) mraw[e >> 1] = fmaxf(mraw[e >> 1], s[4 * j + e]);
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    mraw[r] = fmaxf(mraw[r], hp_shfl_xor(mraw[r], 1));
    mraw[r] = fmaxf(mraw[r], hp_shfl_xor(mraw[r], 2));
    const float mnew = fmaxf(mx[r], mraw[r] * scale_log2);
    base[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with no key yet
    corr[r] = hp_exp2(mx[r] - base[r]);
    mx[r] = mnew;
    sum[r] *= corr[r];
  }
#pragma unroll
  for (int j = 0; j < 16; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      s[4 * j + e] = hp_exp2(fmaf(s[4 * j + e], scale_log2, -base[e >> 1]));
      sum[e >> 1] += s[4 * j + e];
    }
}

template <int DH> HP_DEV void scale_o(float (&o)[DH / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < DH / 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[4 * j + e] *= corr[e >> 1];
}

// P rounded to bf16 in registers: the fp32 layout of a 16-column slice pair is wgmma's A layout of a
// k16 step (a0 row r0 and a1 row r0 + 8 of slice 2 kc, a2 and a3 of slice 2 kc + 1).
HP_DEV void pack_p(const float (&s)[64], uint32_t (&pa)[32]) {
#pragma unroll
  for (int j = 0; j < 16; j++) {
    pa[2 * j] = pack_bf16(s[4 * j], s[4 * j + 1]);
    pa[2 * j + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
  }
}

// O += P V with P in registers (pa must stay as it is until the wgmma.wait_group that covers it):
// 8 wgmma m64nDHk16.
template <int DH> HP_DEV void gemm_pv_regs(float (&o)[DH / 2], const uint32_t (&pa)[32], uint32_t v_base) {
  wg_fence();
#pragma unroll
  for (int kc = 0; kc < 8; kc++) // pa's own registers (the emulator checks they hold until the wait)
    wgmma_rs(o, *reinterpret_cast<const uint32_t(*)[4]>(pa + 4 * kc), gmma_desc(v_base + kc * 16 * 128, BN * 128, 1024));
  wg_commit();
}

// The epilogue's start: a row's sum over its four threads, 1 / sum (0 for a row with no key), and
// the rows' largest scaled logit (mx, log2 units) into p.max_logit[hh] (natural units; one atomic a
// warp) where it is given; rows q0 and q0 + 8 count if below len_q.
HP_DEV void row_totals(float (&sum)[2], float (&inv)[2], const float (&mx)[2], int q0, int len_q, const params_t &p, int hh,
                       int lane) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    sum[r] += hp_shfl_xor(sum[r], 1);
    sum[r] += hp_shfl_xor(sum[r], 2);
  }
  inv[0] = sum[0] > 0.0f ? 1.0f / sum[0] : 0.0f, inv[1] = sum[1] > 0.0f ? 1.0f / sum[1] : 0.0f;
  if (p.max_logit) {
    float m = fmaxf(q0 < len_q ? mx[0] : -INFINITY, q0 + 8 < len_q ? mx[1] : -INFINITY);
#pragma unroll
    for (int d = 4; d < 32; d *= 2) m = fmaxf(m, hp_shfl_xor(m, d));
    if (lane == 0 && m > -INFINITY) hp_atomic_max(p.max_logit + hh, m * 0.69314718055994531f);
  }
}

// Rows [valid, BN) of a V stage set to 0 by consumer warpgroup 0, then both consumer warpgroups meet
// (named barrier 3, 256 threads): the rows past a sequence's keys may hold anything (thd's padding
// gaps: NaN), and P's zeros there would still make 0 * NaN in P V.
template <int DH> HP_DEV void zero_tail(uint32_t v_base, int valid, int c, int tid) {
  if (c == 0)
    for (int i = tid; i < (BN - valid) * 8 * (DH / 64); i += 128) { // 16-byte chunks: 8 a row in each half of d
      const int row = valid + i / (8 * (DH / 64)), half = (i / 8) % (DH / 64), chunk = i % 8;
      st_shared_zero16(v_base + half * BN * 128 + row * 128 + chunk * 16);
    }
  fence_proxy_async();
  named_bar_sync(3, 256);
}

// Grid (s / BM, h, b), m-blocks last to first (the causal heavy ones start first). The two consumer
// warpgroups take turns at the tensor cores (take_turn / hand_turn below). PIPE = 0: per key block,
// S, softmax, P V one after another, P in registers. PIPE = 1: FA3's intra-warpgroup pipelining,
// the softmax of block it between the issue of S(it) with P(it - 1) V(it - 1) and their completion,
// P in registers.
template <int PIPE, int DQK, int DV>
__global__ void __launch_bounds__(THREADS, 1)
    fwd_kernel(const HP_GRID_CONST hp_tmap_t tq, const HP_GRID_CONST hp_tmap_t tk, const HP_GRID_CONST hp_tmap_t tv,
               const params_t p) {
  smem_t<DQK, DV> &sm = *reinterpret_cast<smem_t<DQK, DV> *>((reinterpret_cast<uintptr_t>(hp_smem()) + 1023) & ~uintptr_t(1023));
  const hp_tile_t tile = hp_fwd_tile<DQK, DV>(p);
  const int m_block = tile.m_block, hh = tile.hh, bb = tile.bb, hkv = hh / (p.h / p.h_kv);
  const int warp_id = hp_warp_uniform(threadIdx.x / 32), tid = threadIdx.x % 128; // lane 0's, as CUTLASS does
  // this sequence: its lengths, the rows (thd) or batch (bshd/sbhd) the tensor maps address it by
  const hp_seq_t sq = hp_seq(p, bb);
  const int len_q = sq.len_q, len_kv = sq.len_kv, first_q = sq.first_q, first_kv = sq.first_kv, tb = sq.tb;
  if (m_block * BM >= len_q) return; // the whole CTA, before any barrier
  if (threadIdx.x == 0) HP_TRACE(p, 0, HP_TRACE_SMID), HP_TRACE(p, 1), HP_TRACE(p, 2, HP_TRACE_GLOBAL);
  using ST = acc_stage_t<DQK, DV>;
  constexpr bool STAGED = ST::on;
  const uint32_t stage = hp_smem_u32(&sm) + sizeof(smem_t<DQK, DV>); // the running rows (STAGED)
  // key blocks [n_lo, n_hi): those holding a key that a row of this block sees; walked last to first
  const int shift = p.bottom_right ? len_kv - len_q : 0, wl = p.window_left, wr = p.window_right;
  const int i0 = m_block * BM, i1 = min(i0 + BM, len_q);
  const int key_lo = wl >= 0 ? max(0, i0 + shift - wl) : 0, key_hi = wr >= 0 ? min(len_kv, i1 + shift + wr) : len_kv;
  const int n_lo = key_lo / BN, n_hi = key_hi > key_lo ? (key_hi + BN - 1) / BN : n_lo, nblk = n_hi - n_lo;

  if (threadIdx.x == 0) {
    sm.fail = 0;
    mbar_init(&sm.q_full, 1);
    for (int i = 0; i < STAGES; i++) {
      mbar_init(&sm.k_full[i], 1);
      mbar_init(&sm.v_full[i], 1);
      mbar_init(&sm.k_empty[i], 256);
      mbar_init(&sm.v_empty[i], 256);
    }
    mbar_init(&sm.acc_go, 1);
    mbar_init(&sm.acc_full, 96);
    mbar_init_fence();
  }
  hp_sync();

  // where row `row` of the sequence (from 0) is in an operand with strides st (params_t)
  auto at = [&](const int64_t(&st)[3], int row) { return ((int64_t)first_q + row) * st[0] + hh * st[1] + (int64_t)tb * st[2]; };

  if (warp_id >= 8) { // producer
    reg_dealloc<24>();
    if (STAGED && warp_id >= 9 && p.acc_out) { // the running rows into shared memory (acc_stage_t), once
      // the first key blocks are on their way (copied at once, they slowed the first blocks' loads: fp32
      // rows are as many bytes as Q, K and V of a block)
      // (in 24 registers: one wait in the code, for the go and then for the copies to land, so that no
      // thread leaves with its copies in flight; the rows' addresses from the first's, one step a row;
      // shifts, no divisions: a row's bytes and vec are powers of 2)
      for (int landed = 0;; landed = 1) {
        mbar_wait(landed ? &sm.acc_full : &sm.acc_go, 0, &sm.fail, p.err);
        if (landed) {
          if (threadIdx.x == 288) HP_TRACE(p, 3);
          break;
        }
        const int t = threadIdx.x - 288, es = p.acc_bf16 ? 2 : 4, row_bytes = DV * es, vec = p.acc_vec;
        const int rows = i1 - i0, lg_vec = __ffs(vec) - 1, lg_row = __ffs(row_bytes / vec) - 1;
        const char *acc = static_cast<const char *>(p.acc_out) + at(p.acc_st, i0) * es;
        const int64_t step = p.acc_st[0] * es;
        if (vec == 16) { // 16-byte copies: a thread keeps one chunk c of rows r, r + rstep, ... (16 or 32 chunks a
          // row divide the 96 threads), so that a copy costs two adds and the swizzle's XOR
          const int c = t & ((1 << lg_row) - 1), rstep = 96 >> lg_row;
          const int64_t src_step = rstep * step;
          const uint32_t dst_step = rstep * row_bytes;
          int r = t >> lg_row;
          const char *src = acc + r * step + 16 * c;
          for (uint32_t dst = stage + r * row_bytes; r < rows; r += rstep, src += src_step, dst += dst_step)
            cp_async(dst + ((c ^ (r & 7)) << 4), src, 16);
        } else // 8- or 4-byte copies (a running out off 16-byte alignment; dl.attn never passes one)
          for (int i = t; i < rows << lg_row; i += 96) {
            const int r = i >> lg_row, byte = (i - (r << lg_row)) << lg_vec;
            cp_async(acc_stage_at(stage, r, row_bytes, byte), acc + r * step + byte, vec);
          }
        const float *lse0 = p.acc_lse + at(p.acc_lse_st, i0);
        for (int r = t; r < rows; r += 96) cp_async(stage + ST::o_bytes + 4 * r, lse0 + r * p.acc_lse_st[0], 4);
        cp_async_arrive(&sm.acc_full);
      }
    }
    if (threadIdx.x == 256) {
      // the go of the running rows' copies (STAGED merge): once the consumers are done with the first
      // K (the first S ran), or once every load is issued where there are at most two blocks
      const bool go = STAGED && p.acc_out;
      mbar_expect_tx(&sm.q_full, tile_bytes_t<DQK>::value);
      for (int half = 0; half < DQK / 64; half++)
        tma_load(sm.q[half], &tq, &sm.q_full, 64 * half, hh, first_q + m_block * BM, tb);
      for (int it = 0; it < nblk; it++) {
        const int n = n_hi - 1 - it, st = it % STAGES;
        const uint32_t round = it / STAGES;
        if (round > 0) mbar_wait(&sm.k_empty[st], (round - 1) & 1, &sm.fail, p.err);
        if (go && it == STAGES) mbar_arrive(&sm.acc_go);
        mbar_expect_tx(&sm.k_full[st], tile_bytes_t<DQK>::value);
        for (int half = 0; half < DQK / 64; half++)
          tma_load(sm.k[st][half], &tk, &sm.k_full[st], 64 * half, hkv, first_kv + n * BN, tb);
        if (round > 0) mbar_wait(&sm.v_empty[st], (round - 1) & 1, &sm.fail, p.err);
        mbar_expect_tx(&sm.v_full[st], tile_bytes_t<DV>::value);
        for (int half = 0; half < DV / 64; half++)
          tma_load(sm.v[st][half], &tv, &sm.v_full[st], 64 * half, hkv, first_kv + n * BN, tb);
      }
      if (go && nblk <= STAGES) mbar_arrive(&sm.acc_go);
      HP_TRACE(p, 4);
    }
    return;
  }

  reg_alloc<240>();
  // consumers: warpgroup c (warps 4c .. 4c + 3) owns rows [c * 64, c * 64 + 64) of the block
  const int c = warp_id / 4, warp = tid / 32, lane = tid % 32;
  const int r0 = c * 64 + warp * 16 + lane / 4; // this thread's rows: r0 and r0 + 8 (in the block)
  const int q0 = m_block * BM + r0;
  float o[DV / 2], s[64];
  for (int i = 0; i < 64; i++) o[i] = 0.0f;
  float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  const uint32_t q_base = hp_smem_u32(sm.q[0]) + c * 64 * 128;
  const int row0 = m_block * BM + c * 64; // the warpgroup's first row
  // key block n_hi - 1 - it needs element masks where it reaches past the sequence's keys (the rows
  // past them hold another sequence's or zeros) or past the window of one of the warpgroup's rows
  auto diag = [&](int it) {
    const int j0 = (n_hi - 1 - it) * BN, j1 = j0 + BN - 1; // its first and last key
    return j1 >= len_kv || (wr >= 0 && j1 > row0 + shift + wr) || (wl >= 0 && j0 < row0 + 63 + shift - wl);
  };
  auto key0 = [&](int it) { return (n_hi - 1 - it) * BN; };
  auto k_base = [&](int it) { return hp_smem_u32(sm.k[it % STAGES][0]); };
  auto v_base = [&](int it) { return hp_smem_u32(sm.v[it % STAGES][0]); };
  auto parity = [](int it) { return (uint32_t)(it / STAGES) & 1u; };
  // V of block it in its stage, with the rows past the sequence's keys zeroed in the one block that has them
  auto wait_v = [&](int it) {
    mbar_wait(&sm.v_full[it % STAGES], parity(it), &sm.fail, p.err);
    const int valid = len_kv - (n_hi - 1 - it) * BN;
    if (valid < BN) zero_tail<DV>(v_base(it), valid, c, tid);
  };
  float corr[2];
  auto step_softmax = [&](int it) {
    if (diag(it)) mask_block(s, key0(it), q0, len_kv, shift, wl, wr, lane);
    softmax_step(s, mx, sum, corr, p.scale_log2);
  };
  uint32_t pa[32]; // P in bf16
  // FA3's warpgroup scheduler: a warpgroup issues its GEMMs in its turn (named barrier 4 + c, 256
  // threads: its own 128 and the other's arrival) and hands the turn over (arrives at 5 - c), so that
  // one warpgroup's softmax runs while the other's GEMMs use the tensor cores. Warpgroup 0 starts.
  // Every turn taken is handed over; warpgroup 0's opening arrival is the one left at the end.
  auto take_turn = [&] { named_bar_sync(4 + c, 256); };
  auto hand_turn = [&] { named_bar_arrive(5 - c, 256); };
  if (c == 0) named_bar_arrive(4, 256);
  // where the running rows are not staged: their reads (LSE and O) into registers, issued while the
  // last P V runs, so that the round trip is not on the epilogue's path
  float old[2] = {-INFINITY, -INFINITY};
  float2 x[2][STAGED ? 1 : DV / 8];
  auto merge_loads = [&] {
    if constexpr (!STAGED) {
      if (!p.acc_out) return;
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int row = q0 + 8 * r;
        const bool in = row < len_q;
        old[r] = in ? p.acc_lse[at(p.acc_lse_st, row)] : -INFINITY;
        const int64_t e = (in ? at(p.acc_st, row) : 0) + 2 * (lane % 4);
        if (p.acc_bf16) {
          const uint32_t *a = reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(p.acc_out) + e);
#pragma unroll
          for (int j = 0; j < DV / 8; j++) x[r][j] = in ? unpack_bf16(a[4 * j]) : make_float2(0.0f, 0.0f);
        } else {
          const float2 *a = reinterpret_cast<const float2 *>(static_cast<const float *>(p.acc_out) + e);
#pragma unroll
          for (int j = 0; j < DV / 8; j++) x[r][j] = in ? a[4 * j] : make_float2(0.0f, 0.0f);
        }
      }
    }
  };
  mbar_wait(&sm.q_full, 0, &sm.fail, p.err);
  if (tid == 0 && c == 0) HP_TRACE(p, 5);

  if (PIPE == 0) {
    // the turn: P(it - 1) V(it - 1) issued and waited for, then S(it) issued
    take_turn();
    for (int it = 0; it < nblk; it++) {
      mbar_wait(&sm.k_full[it % STAGES], parity(it), &sm.fail, p.err);
      gemm_qk<DQK>(s, q_base, k_base(it));
      hand_turn();
      wg_wait<0>();
      mbar_arrive(&sm.k_empty[it % STAGES]);
      step_softmax(it);
      pack_p(s, pa);
      scale_o<DV>(o, corr);
      wait_v(it);
      take_turn();
      gemm_pv_regs<DV>(o, pa, v_base(it));
      if (it == nblk - 1) merge_loads();
      wg_wait<0>();
      mbar_arrive(&sm.v_empty[it % STAGES]);
    }
    if (nblk == 0) merge_loads();
    hand_turn();
  } else if (nblk > 0) {
    // S(0) and its softmax before the loop, outside the turns; then the turn: S(it) and
    // P(it - 1) V(it - 1) issued together
    mbar_wait(&sm.k_full[0], parity(0), &sm.fail, p.err);
    gemm_qk<DQK>(s, q_base, k_base(0));
    wg_wait<0>();
    mbar_arrive(&sm.k_empty[0]);
    step_softmax(0);
    pack_p(s, pa);
    for (int it = 1; it < nblk; it++) {
      mbar_wait(&sm.k_full[it % STAGES], parity(it), &sm.fail, p.err);
      wait_v(it - 1); // before the turn: the block with a tail meets the other warpgroup there
      take_turn();
      gemm_qk<DQK>(s, q_base, k_base(it));
      gemm_pv_regs<DV>(o, pa, v_base(it - 1));
      hand_turn();
      wg_wait<1>(); // S(it) is in (commit groups complete in order); P(it - 1) V(it - 1) still runs
      mbar_arrive(&sm.k_empty[it % STAGES]);
      step_softmax(it);
      wg_wait<0>(); // P(it - 1) V(it - 1) is in: O, P and V's stage are free
      mbar_arrive(&sm.v_empty[(it - 1) % STAGES]);
      scale_o<DV>(o, corr);
      pack_p(s, pa);
    }
    wait_v(nblk - 1);
    gemm_pv_regs<DV>(o, pa, v_base(nblk - 1));
    merge_loads();
    wg_wait<0>();
    mbar_arrive(&sm.v_empty[(nblk - 1) % STAGES]);
  } else {
    merge_loads();
  }

  // epilogue: the row sums over the four threads of a row, O / l, LSE (natural log); or the merge
  if (lane == 0) HP_TRACE(p, 8 + warp_id);
  float inv[2];
  row_totals(sum, inv, mx, q0, len_q, p, hh, lane);
  float lse[2];
#pragma unroll
  for (int r = 0; r < 2; r++) lse[r] = sum[r] > 0.0f ? (mx[r] + log2f(sum[r])) * 0.69314718055994531f : -INFINITY;
  if (!p.acc_out) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = q0 + 8 * r;
      if (row >= len_q) continue; // rows past the sequence: another sequence's, or nothing
      const int64_t oa = at(p.o_st, row);
#pragma unroll
      for (int j = 0; j < DV / 8; j++)
        *reinterpret_cast<uint32_t *>(p.o + oa + 8 * j + 2 * (lane % 4)) =
            pack_bf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      if (lane % 4 == 0) p.lse[at(p.lse_st, row)] = lse[r];
    }
    if (lane == 0) HP_TRACE(p, 16 + warp_id), HP_TRACE(p, 24 + warp_id, HP_TRACE_GLOBAL);
    return;
  }
  // merge: L = log(e^L_acc + e^L), acc_out = acc_out e^(L_acc - L) + O e^(L - L); a row of the step
  // with no key (L = -inf) leaves the running pair as it was. The running LSE and O are in shared
  // memory (STAGED), or were read by merge_loads (under the last P V).
  if (STAGED) mbar_wait(&sm.acc_full, 0, &sm.fail, p.err);
  else hp_syncwarp(); // a row's four threads read the old LSE before its first thread writes the new
  // both rows' factors first, in base 2 on MUFU.EX2/LG2 (no branch between the rows, so that their
  // latencies overlap), then the pairs
  float ka[2], kb[2], lnew[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if constexpr (STAGED) old[r] = ld_shared_f32(stage + ST::o_bytes + 4 * (r0 + 8 * r));
    const float o2 = old[r] * 1.4426950408889634f, l2 = lse[r] * 1.4426950408889634f; // -inf stays -inf
    const float hi = fmaxf(o2, l2), n2 = hi + hp_log2(1.0f + hp_exp2(fminf(o2, l2) - hi));
    ka[r] = hp_exp2(o2 - n2), kb[r] = hp_exp2(l2 - n2) * inv[r], lnew[r] = n2 * 0.69314718055994531f;
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + 8 * r;
    if (row >= len_q || lse[r] == -INFINITY) continue;
    const int br = r0 + 8 * r; // the row in the block (staged)
    const int64_t e = at(p.acc_st, row) + 2 * (lane % 4);
    // the pairs of a running out of ES bytes an element: pair j (columns 8 j + 2 (lane % 4), + 1) of
    // staged row br lies at off[j % J] + 128 (j / J), J pairs to 128 bytes (the swizzle's XOR stays
    // inside 128 bytes), so that a pair's read is one instruction with an immediate offset
    auto merge_row = [&](auto es_c) {
      constexpr int ES = decltype(es_c)::value, J = 128 / (8 * ES);
      [[maybe_unused]] uint32_t off[J]; // read only where the rows are staged
#pragma unroll
      for (int k = 0; k < J; k++)
        if constexpr (STAGED) off[k] = acc_stage_at(stage, br, DV * ES, (8 * k + 2 * (lane % 4)) * ES);
#pragma unroll
      for (int j = 0; j < DV / 8; j++) {
        float2 y;
        if constexpr (STAGED) {
          const uint32_t a = off[j % J] + 128 * (j / J);
          if constexpr (ES == 2) y = unpack_bf16(ld_shared_u32(a));
          else y = ld_shared_f2(a);
        } else {
          y = x[r][j];
        }
        const float v0 = y.x * ka[r] + o[4 * j + 2 * r] * kb[r], v1 = y.y * ka[r] + o[4 * j + 2 * r + 1] * kb[r];
        if constexpr (ES == 2) reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(p.acc_out) + e)[4 * j] = pack_bf16(v0, v1);
        else reinterpret_cast<float2 *>(static_cast<float *>(p.acc_out) + e)[4 * j] = make_float2(v0, v1);
      }
    };
    if (p.acc_bf16) merge_row(std::integral_constant<int, 2>{});
    else merge_row(std::integral_constant<int, 4>{});
    if (lane % 4 == 0) p.acc_lse[at(p.acc_lse_st, row)] = lnew[r];
  }
  if (lane == 0) HP_TRACE(p, 16 + warp_id), HP_TRACE(p, 24 + warp_id, HP_TRACE_GLOBAL);
}

#endif
