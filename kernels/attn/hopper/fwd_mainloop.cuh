/*
 * fwd_mainloop.cuh — the consumer warpgroups' steps of the Hopper forward's
 * main loop (fwd_kernel.cuh): the GEMMs on wgmma (S = Q K^T, O += P V, and
 * the K-major GEMM the backward shares), the element mask, the online
 * softmax and its row totals, and the zeroed tail of a V stage.
 */
#ifndef DISTLAB_HOPPER_FWD_MAINLOOP_CUH
#define DISTLAB_HOPPER_FWD_MAINLOOP_CUH

#include "fwd_params.cuh"

// A shared memory matrix descriptor with the 128-byte swizzle.
HP_DEV uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
         (uint64_t)((sbo >> 4) & 0x3fff) << 32 | 1ull << 62;
}
// A descriptor moved on by `bytes` (a multiple of 16, a compile-time offset within the same tile): the
// address field (bits 0-13, address / 16) takes the sum with no carry out of it, shared memory ending
// below 2^18 bytes. A GEMM's wgmmas then cost one add each, where gmma_desc of each address cost a shift
// and masks (the profile, experiments/results/attn/attn-prof-h200.md: ~6 uniform instructions a
// wgmma, 1.36x FA4's instructions in the forward; FA4-GAP.md section 7).
HP_DEV uint64_t desc_at(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

// ---- the consumers' steps (thread t of a warpgroup holds rows r0 = 16 (t / 32) + (t % 32) / 4 and
// r0 + 8 of its 64, columns 8 j + 2 (t % 4) + {0, 1}: value 4 j + e is row r0 + 8 (e / 2), column
// 8 j + 2 (t % 4) + e % 2) ----

// X = A B^T over DH: A the warpgroup's 64 rows in a tile of A_ROWS rows, B a tile of B_ROWS rows (a
// tile's second half of d lies ROWS * 128 bytes on), both K-major in shared memory; DH / 16 wgmma
// m64nNk16 with N = 2 NACC (64 accumulators: N = 128; 32: N = 64), one commit group.
template <int DH, int A_ROWS, int B_ROWS, int NACC> HP_DEV void gemm_kmajor(float (&x)[NACC], uint32_t a_base, uint32_t b_base) {
  const uint64_t da = gmma_desc(a_base, 16, 1024), db = gmma_desc(b_base, 16, 1024);
  wg_fence();
#pragma unroll
  for (int half = 0; half < DH / 64; half++)
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss(x, desc_at(da, half * A_ROWS * 128 + kk * 32), desc_at(db, half * B_ROWS * 128 + kk * 32), half | kk);
  wg_commit();
}

// S = Q K^T over d = DH, Q a tile of ROWS rows.
template <int DH, int ROWS = BM> HP_DEV void gemm_qk(float (&s)[64], uint32_t q_base, uint32_t k_base) {
  gemm_kmajor<DH, ROWS, BN>(s, q_base, k_base);
}

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
// one MUFU.EX2 an element, with max (mx) in scaled units; the sums grow, corr is the factor that brings
// O (and the old sums, already scaled) to the new max. The block's row maxima are taken on the raw
// logits (scale > 0). NSUM = 1: a row's max and sum each one chain over its 32 values (sum[r]);
// NSUM = 4 (HP_FWD_OPT_TREE): 4 independent chains of 8 a row, the maxima then joined by a tree, the
// sums kept apart across blocks (sum[4 r + a]) and added by row_sums. LAZY (HP_FWD_OPT_LAZY): mx, the
// exps' base, stays where the block raises the row's max by HP_FWD_LAZY_LOG2 or less (corr 1).
// softmax_base is its first half (the maxima, base, corr and the old sums scaled), softmax_exps<J0, J1>
// the exps of columns 8 j.. for j in [J0, J1): split so that the loop can wait for the last P V (and
// pack P into the registers it read) among the exps (softmax_exps_pack), as FA4 does.
template <int NSUM = 1, bool LAZY = false>
HP_DEV void softmax_base(const float (&s)[64], float (&mx)[2], float (&sum)[2 * NSUM], float (&corr)[2], float (&base)[2],
                         float scale_log2) {
  static_assert(NSUM == 1 || NSUM == 4, "one chain a row, or four");
  float mraw[2] = {-INFINITY, -INFINITY};
  if constexpr (NSUM == 1) {
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) mraw[e >> 1] = fmaxf(mraw[e >> 1], s[4 * j + e]);
  } else { // chain a = 2 (j % 2) + e % 2 of row r: values 4 j + 2 r + e % 2
    float m4[2][4];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int a = 0; a < 4; a++) m4[r][a] = s[4 * (a >> 1) + 2 * r + (a & 1)];
#pragma unroll
    for (int j = 2; j < 16; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) m4[e >> 1][2 * (j & 1) + (e & 1)] = fmaxf(m4[e >> 1][2 * (j & 1) + (e & 1)], s[4 * j + e]);
#pragma unroll
    for (int r = 0; r < 2; r++) mraw[r] = fmaxf(fmaxf(m4[r][0], m4[r][1]), fmaxf(m4[r][2], m4[r][3]));
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    mraw[r] = fmaxf(mraw[r], hp_shfl_xor(mraw[r], 1));
    mraw[r] = fmaxf(mraw[r], hp_shfl_xor(mraw[r], 2));
    const float mnew = fmaxf(mx[r], mraw[r] * scale_log2);
    if (LAZY && mx[r] != -INFINITY && mnew - mx[r] <= HP_FWD_LAZY_LOG2) { // the same for a row's 4 threads
      base[r] = mx[r], corr[r] = 1.0f;
      continue;
    }
    base[r] = mnew == -INFINITY ? 0.0f : mnew; // a row with no key yet
    corr[r] = hp_exp2(mx[r] - base[r]);
    mx[r] = mnew;
#pragma unroll
    for (int a = 0; a < NSUM; a++) sum[NSUM * r + a] *= corr[r];
  }
}

template <int NSUM>
HP_DEV void softmax_exp_col(float (&s)[64], float (&sum)[2 * NSUM], const float (&base)[2], float scale_log2, int j) {
#pragma unroll
  for (int e = 0; e < 4; e++) {
    s[4 * j + e] = hp_exp2(fmaf(s[4 * j + e], scale_log2, -base[e >> 1]));
    if constexpr (NSUM == 1) sum[e >> 1] += s[4 * j + e];
    else sum[4 * (e >> 1) + 2 * (j & 1) + (e & 1)] += s[4 * j + e];
  }
}

template <int NSUM, int J0, int J1>
HP_DEV void softmax_exps(float (&s)[64], float (&sum)[2 * NSUM], const float (&base)[2], float scale_log2) {
#pragma unroll
  for (int j = J0; j < J1; j++) softmax_exp_col<NSUM>(s, sum, base, scale_log2, j);
}

template <int NSUM = 1, bool LAZY = false>
HP_DEV void softmax_step(float (&s)[64], float (&mx)[2], float (&sum)[2 * NSUM], float (&corr)[2], float scale_log2) {
  float base[2];
  softmax_base<NSUM, LAZY>(s, mx, sum, corr, base, scale_log2);
  softmax_exps<NSUM, 0, 16>(s, sum, base, scale_log2);
}

// A row's sum of a thread from its NSUM partial sums (softmax_step), a tree where there are 4.
template <int NSUM> HP_DEV void row_sums(const float (&sum)[2 * NSUM], float (&tot)[2]) {
#pragma unroll
  for (int r = 0; r < 2; r++)
    if constexpr (NSUM == 1) tot[r] = sum[r];
    else tot[r] = (sum[4 * r] + sum[4 * r + 1]) + (sum[4 * r + 2] + sum[4 * r + 3]);
}

template <int DH> HP_DEV void scale_o(float (&o)[DH / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < DH / 8; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) o[4 * j + e] *= corr[e >> 1];
}

// P rounded to bf16 in registers: the fp32 layout of a 16-column slice pair is wgmma's A layout of a
// k16 step (a0 row r0 and a1 row r0 + 8 of slice 2 kc, a2 and a3 of slice 2 kc + 1). pack_col: column
// slice j's two registers; pack_p: all 16.
HP_DEV void pack_col(const float (&s)[64], uint32_t (&pa)[32], int j) {
  pa[2 * j] = pack_bf16(s[4 * j], s[4 * j + 1]);
  pa[2 * j + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
}
HP_DEV void pack_p(const float (&s)[64], uint32_t (&pa)[32]) {
#pragma unroll
  for (int j = 0; j < 16; j++) pack_col(s, pa, j);
}

// P packed into pa, columns [0, J0) done by softmax_exps before, the exps of [J0, 16) each packed as soon
// as its values are in: the F2FPs fill MUFU.EX2's issue gaps, as in FA4's SASS, where pack_p after
// all the exps ran them alone (FA4-GAP.md section 20).
template <int NSUM, int J0>
HP_DEV void softmax_exps_pack(float (&s)[64], float (&sum)[2 * NSUM], const float (&base)[2], float scale_log2,
                              uint32_t (&pa)[32]) {
#pragma unroll
  for (int j = 0; j < 16; j++) {
    if (j >= J0) softmax_exp_col<NSUM>(s, sum, base, scale_log2, j);
    pack_col(s, pa, j);
  }
}

// O += P V with P in registers (pa must stay as it is until the wgmma.wait_group that covers it):
// 8 wgmma m64nDHk16.
template <int DH> HP_DEV void gemm_pv_regs(float (&o)[DH / 2], const uint32_t (&pa)[32], uint32_t v_base) {
  const uint64_t dv = gmma_desc(v_base, BN * 128, 1024);
  wg_fence();
#pragma unroll
  for (int kc = 0; kc < 8; kc++) // pa's own registers (the emulator checks they hold until the wait)
    wgmma_rs(o, *reinterpret_cast<const uint32_t(*)[4]>(pa + 4 * kc), desc_at(dv, kc * 16 * 128));
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
    float m = fmaxf(q0 >= 0 && q0 < len_q ? mx[0] : -INFINITY, q0 + 8 >= 0 && q0 + 8 < len_q ? mx[1] : -INFINITY);
#pragma unroll
    for (int d = 4; d < 32; d *= 2) m = fmaxf(m, hp_shfl_xor(m, d));
    if (lane == 0 && m > -INFINITY) hp_atomic_max(p.max_logit + hh, m * 0.69314718055994531f);
  }
}

// Rows [valid, BN) of a V stage set to 0 by consumer warpgroup 0, then the NWG consumer warpgroups
// meet (named barrier 3, 128 NWG threads): the rows past a sequence's keys may hold anything (thd's
// padding gaps: NaN), and P's zeros there would still make 0 * NaN in P V.
template <int DH, int NWG = 2> HP_DEV void zero_tail(uint32_t v_base, int valid, int c, int tid) {
  if (c == 0)
    for (int i = tid; i < (BN - valid) * 8 * (DH / 64); i += 128) { // 16-byte chunks: 8 a row in each half of d
      const int row = valid + i / (8 * (DH / 64)), half = (i / 8) % (DH / 64), chunk = i % 8;
      st_shared_zero16(v_base + half * BN * 128 + row * 128 + chunk * 16);
    }
  fence_proxy_async();
  named_bar_sync(3, 128 * NWG);
}

#endif
