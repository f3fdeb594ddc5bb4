/*
 * fwd_merge_kernel.cuh — the Hopper forward with the fused merge (dl.attn's
 * accumulate) on persistent CTAs: fwd_kernel's PIPE 0 main loop
 * (fwd_kernel.cuh has the design), but each CTA walks several tiles (query
 * blocks of BM rows of a (batch, head)), and the merge of a tile's (O, LSE)
 * into the running fp32 (acc_out, acc_lse) is done by three producer warps
 * while the consumers already compute the next tile.
 *
 * Why: with one tile a CTA, the merge's epilogue (the running rows read and
 * written in fp32: four times the bytes of the plain step's bf16 O) kept the
 * SM's tensor cores idle for about 3 us a CTA: +4-6% at s 4k-8k causal, d 128
 * (experiments/results/attn/hopper-fwd-h200.md).
 *
 * CTA: fwd_kernel's 384 threads; grid: at most one CTA an SM, tile t of
 * this CTA's walk = blockIdx.x + i * gridDim.x, heavy first (query blocks
 * last to first over every (head, batch)). Shared memory: fwd_kernel's
 * (Q, two K/V stages) and the tile's O / l in fp32 with the rows' LSE
 * (64.5 KB at d 128: 225 KB in all), freed by the merge warps.
 *   warp 8, thread 256: TMA loads; Q of the next tile once the consumers are
 *     done with the last (q_empty), K/V stages as fwd_kernel, their phases
 *     counted over all the CTA's key blocks;
 *   warps 9-11: per tile, once the consumers staged it (o_full): for each row
 *     in the sequence with keys, L = log(e^L_acc + e^L) and acc_out =
 *     acc_out e^(L_acc - L) + O e^(L - L) (a warp a row, a float4 a lane),
 *     then o_empty;
 *   warpgroups 0, 1: fwd_kernel's PIPE 0 loop per tile, then O / l and LSE
 *     into the staging area (once the last tile's merge has read it).
 * Head dims: DV <= 128 (a row: DV / 4 lanes, a float4 each); dl.attn runs it
 * at 128/128 (d 64's plain epilogue costs at most 2%).
 */
#ifndef DISTLAB_HOPPER_FWD_MERGE_KERNEL_CUH
#define DISTLAB_HOPPER_FWD_MERGE_KERNEL_CUH

#include "fwd_kernel.cuh"

template <int DQK, int DV> struct alignas(1024) merge_smem_t {
  uint16_t q[DQK / 64][BM * 64];
  uint16_t k[STAGES][DQK / 64][BN * 64];
  uint16_t v[STAGES][DV / 64][BN * 64];
  float o[BM * DV]; // the tile's O / l, columns permuted within a row (stage_col)
  float lse[BM];    // and its LSE (natural log; -inf: a row with no key)
  uint64_t q_full, q_empty, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES], o_full, o_empty;
  int fail;
};

// Column c of staged row r at c ^ (8 (r % 4)): the consumers' stores (two columns a lane, eight rows
// a warp) hit distinct banks; the merge warps' float4 loads of a row stay contiguous.
HP_DEV int stage_col(int c, int r) { return c ^ (8 * (r % 4)); }

// A tile of the walk: its (batch, head, query block) and sequence.
struct merge_tile_t : hp_seq_t {
  int bb, hh, m_block;
  bool empty; // no row of the sequence in the block (thd): skipped by every role alike
};
HP_DEV merge_tile_t merge_tile(const params_t &p, int t, int mb) {
  merge_tile_t x;
  const int hb = p.h * p.b;
  x.m_block = mb - 1 - t / hb, x.hh = (t % hb) % p.h, x.bb = (t % hb) / p.h;
  static_cast<hp_seq_t &>(x) = hp_seq(p, x.bb);
  x.empty = x.m_block * BM >= x.len_q;
  return x;
}
// The key blocks [n_lo, n_hi) of a tile (fwd_kernel's).
HP_DEV void merge_key_blocks(const params_t &p, const merge_tile_t &x, int &n_lo, int &n_hi) {
  const int shift = p.bottom_right ? x.len_kv - x.len_q : 0, wl = p.window_left, wr = p.window_right;
  const int i0 = x.m_block * BM, i1 = min(i0 + BM, x.len_q);
  const int key_lo = wl >= 0 ? max(0, i0 + shift - wl) : 0, key_hi = wr >= 0 ? min(x.len_kv, i1 + shift + wr) : x.len_kv;
  n_lo = key_lo / BN, n_hi = key_hi > key_lo ? (key_hi + BN - 1) / BN : n_lo;
}

template <int DQK, int DV>
__global__ void __launch_bounds__(THREADS, 1)
    fwd_merge_kernel(const HP_GRID_CONST hp_tmap_t tq, const HP_GRID_CONST hp_tmap_t tk, const HP_GRID_CONST hp_tmap_t tv,
                     const params_t p) {
  static_assert(DV <= 128, "the merge warps take a row as up to 32 lanes x float4");
  static_assert(sizeof(merge_smem_t<DQK, DV>) + 1024 <= 232448, "shared memory beyond sm_90's 227 KB (MLA's 192/128: 274 KB)");
  merge_smem_t<DQK, DV> &sm = *reinterpret_cast<merge_smem_t<DQK, DV> *>((reinterpret_cast<uintptr_t>(hp_smem()) + 1023) & ~uintptr_t(1023));
  const int warp_id = hp_warp_uniform(threadIdx.x / 32), tid = threadIdx.x % 128;
  const int mb = (p.s_q + BM - 1) / BM, tiles = mb * p.h * p.b;
  auto at = [&](const merge_tile_t &x, const int64_t(&st)[3], int row) {
    return ((int64_t)x.first_q + row) * st[0] + x.hh * st[1] + (int64_t)x.tb * st[2];
  };

  if (threadIdx.x == 0) {
    sm.fail = 0;
    mbar_init(&sm.q_full, 1);
    mbar_init(&sm.q_empty, 256);
    for (int i = 0; i < STAGES; i++) {
      mbar_init(&sm.k_full[i], 1);
      mbar_init(&sm.v_full[i], 1);
      mbar_init(&sm.k_empty[i], 256);
      mbar_init(&sm.v_empty[i], 256);
    }
    mbar_init(&sm.o_full, 256);
    mbar_init(&sm.o_empty, 96);
    mbar_init_fence();
  }
  hp_sync();

  if (warp_id >= 8) { // producer warpgroup
    reg_dealloc<24>();
    if (threadIdx.x == 256) { // TMA: Q per tile, K/V per key block, the stages' phases over the whole walk
      int g = 0, n = 0; // key blocks loaded, tiles loaded
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const merge_tile_t x = merge_tile(p, t, mb);
        if (x.empty) continue;
        const int hkv = x.hh / (p.h / p.h_kv);
        int n_lo, n_hi;
        merge_key_blocks(p, x, n_lo, n_hi);
        if (n > 0) mbar_wait(&sm.q_empty, (uint32_t)(n - 1) & 1u, &sm.fail, p.err);
        mbar_expect_tx(&sm.q_full, tile_bytes_t<DQK>::value);
        for (int half = 0; half < DQK / 64; half++)
          tma_load(sm.q[half], &tq, &sm.q_full, 64 * half, x.hh, x.first_q + x.m_block * BM, x.tb);
        n++;
        for (int it = 0; it < n_hi - n_lo; it++, g++) {
          const int nb = n_hi - 1 - it, st = g % STAGES;
          const uint32_t round = g / STAGES;
          if (round > 0) mbar_wait(&sm.k_empty[st], (round - 1) & 1, &sm.fail, p.err);
          mbar_expect_tx(&sm.k_full[st], tile_bytes_t<DQK>::value);
          for (int half = 0; half < DQK / 64; half++)
            tma_load(sm.k[st][half], &tk, &sm.k_full[st], 64 * half, hkv, x.first_kv + nb * BN, x.tb);
          if (round > 0) mbar_wait(&sm.v_empty[st], (round - 1) & 1, &sm.fail, p.err);
          mbar_expect_tx(&sm.v_full[st], tile_bytes_t<DV>::value);
          for (int half = 0; half < DV / 64; half++)
            tma_load(sm.v[st][half], &tv, &sm.v_full[st], 64 * half, hkv, x.first_kv + nb * BN, x.tb);
        }
      }
    } else if (warp_id >= 9) { // the merge: a warp a row, a float4 a lane
      const int w = warp_id - 9, lane = threadIdx.x % 32;
      int n = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const merge_tile_t x = merge_tile(p, t, mb);
        if (x.empty) continue;
        mbar_wait(&sm.o_full, (uint32_t)n & 1u, &sm.fail, p.err);
        const int i0 = x.m_block * BM, rows = min(BM, x.len_q - i0);
        for (int r = w; r < rows; r += 3) {
          const float l = sm.lse[r];
          if (l == -INFINITY) continue; // a row with no key leaves the running pair as it was
          float *acc_l = p.acc_lse + at(x, p.acc_lse_st, i0 + r);
          const float old = *acc_l;
          const float hi = fmaxf(old, l), lnew = hi + log1pf(expf(-fabsf(old - l)));
          const float ka = old == -INFINITY ? 0.0f : expf(old - lnew), kb = expf(l - lnew);
          if (lane < DV / 4) {
            float4 *a = reinterpret_cast<float4 *>(p.acc_out + at(x, p.acc_st, i0 + r)) + lane;
            const float4 y = *reinterpret_cast<const float4 *>(sm.o + r * DV + stage_col(4 * lane, r)), z = *a;
            *a = make_float4(z.x * ka + y.x * kb, z.y * ka + y.y * kb, z.z * ka + y.z * kb, z.w * ka + y.w * kb);
          }
          hp_syncwarp(); // every lane read the old LSE
          if (lane == 0) *acc_l = lnew;
        }
        mbar_arrive(&sm.o_empty);
        n++;
      }
    }
    return;
  }

  reg_alloc<240>();
  // consumers: warpgroup c owns rows [c * 64, c * 64 + 64) of each tile
  const int c = warp_id / 4, warp = tid / 32, lane = tid % 32;
  const int r0 = c * 64 + warp * 16 + lane / 4; // this thread's rows: r0 and r0 + 8 (in the tile)
  const uint32_t q_base = hp_smem_u32(sm.q[0]) + c * 64 * 128;
  auto take_turn = [&] { named_bar_sync(4 + c, 256); };
  auto hand_turn = [&] { named_bar_arrive(5 - c, 256); };
  if (c == 0) named_bar_arrive(4, 256);
  int g = 0, n = 0; // key blocks consumed, tiles done
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const merge_tile_t x = merge_tile(p, t, mb);
    if (x.empty) continue;
    int n_lo, n_hi;
    merge_key_blocks(p, x, n_lo, n_hi);
    const int nblk = n_hi - n_lo, len_kv = x.len_kv, wl = p.window_left, wr = p.window_right;
    const int shift = p.bottom_right ? x.len_kv - x.len_q : 0;
    const int q0 = x.m_block * BM + r0, row0 = x.m_block * BM + c * 64;
    float o[DV / 2], s[64];
    for (int i = 0; i < DV / 2; i++) o[i] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, corr[2];
    uint32_t pa[32];
    // fwd_kernel's PIPE 0 loop (the same steps; the stages' phases counted over the walk: g)
    mbar_wait(&sm.q_full, (uint32_t)n & 1u, &sm.fail, p.err);
    take_turn();
    for (int it = 0; it < nblk; it++, g++) {
      const int st = g % STAGES, key0 = (n_hi - 1 - it) * BN;
      const uint32_t ph = (uint32_t)(g / STAGES) & 1u;
      mbar_wait(&sm.k_full[st], ph, &sm.fail, p.err);
      gemm_qk<DQK>(s, q_base, hp_smem_u32(sm.k[st][0]));
      hand_turn();
      wg_wait<0>();
      mbar_arrive(&sm.k_empty[st]);
      if (it == nblk - 1) mbar_arrive(&sm.q_empty); // the last S of the tile is in: Q is free
      const int j1 = key0 + BN - 1;
      if (j1 >= len_kv || (wr >= 0 && j1 > row0 + shift + wr) || (wl >= 0 && key0 < row0 + 63 + shift - wl))
        mask_block(s, key0, q0, len_kv, shift, wl, wr, lane);
      softmax_step(s, mx, sum, corr, p.scale_log2);
      pack_p(s, pa);
      scale_o<DV>(o, corr);
      mbar_wait(&sm.v_full[st], ph, &sm.fail, p.err);
      const uint32_t v_base = hp_smem_u32(sm.v[st][0]);
      if (len_kv - key0 < BN) zero_tail<DV>(v_base, len_kv - key0, c, tid);
      take_turn();
      gemm_pv_regs<DV>(o, pa, v_base);
      wg_wait<0>();
      mbar_arrive(&sm.v_empty[st]);
    }
    if (nblk == 0) mbar_arrive(&sm.q_empty);
    hand_turn();
    // O / l and LSE into the staging area, once the last tile's merge has read it
    float inv[2];
    row_totals(sum, inv, mx, q0, x.len_q, p, x.hh, lane);
    if (n > 0) mbar_wait(&sm.o_empty, (uint32_t)(n - 1) & 1u, &sm.fail, p.err);
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = r0 + 8 * r;
#pragma unroll
      for (int j = 0; j < DV / 8; j++)
        *reinterpret_cast<float2 *>(sm.o + row * DV + stage_col(8 * j + 2 * (lane % 4), row)) =
            make_float2(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      if (lane % 4 == 0)
        sm.lse[row] = sum[r] > 0.0f ? (mx[r] + log2f(sum[r])) * 0.69314718055994531f : -INFINITY;
    }
    mbar_arrive(&sm.o_full);
    n++;
  }
}

#endif
