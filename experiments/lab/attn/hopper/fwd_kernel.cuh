/*
 * fwd_kernel.cuh — the Hopper forward's kernel (hopper/fwd.cu says what it
 * does and how; hopper/emu.cpp runs this file on the CPU). The instructions
 * come from hopper/ptx.cuh on the GPU, from the emulator on the CPU.
 */
#ifndef DISTLAB_LAB_HOPPER_FWD_KERNEL_CUH
#define DISTLAB_LAB_HOPPER_FWD_KERNEL_CUH

#include <math.h>
#include <stdint.h>

#ifndef HOPPER_EMU
#include "ptx.cuh"
#endif

constexpr int D = 128, BM = 128, BN = 128, STAGES = 2, THREADS = 384;
constexpr uint32_t TILE_BYTES = 128 * 128 * 2; // a [128][128] bf16 tile: two TMA boxes

struct alignas(1024) smem_t {
  uint16_t q[2][BM * 64];
  uint16_t k[STAGES][2][BN * 64];
  uint16_t v[STAGES][2][BN * 64];
  uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
};

struct params_t {
  int b, h, s, causal;
  float scale_log2; // softmax scale * log2(e)
  uint16_t *o;      // bf16 [b, s, h, d]
  float *lse;       // [b, h, s]
};

// Every wait ends: a phase that never completes traps (a launch error on the host), it does not hang.
HP_DEV void mbar_wait(uint64_t *b, uint32_t parity) {
  for (long n = 0; !mbar_try(b, parity); n++)
    if (n > (1l << 26)) hp_trap();
}

// A shared memory matrix descriptor with the 128-byte swizzle.
HP_DEV uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
         (uint64_t)((sbo >> 4) & 0x3fff) << 32 | 1ull << 62;
}

// Grid (s / BM, h, b), m-blocks last to first (the causal heavy ones start first).
__global__ void __launch_bounds__(THREADS, 1)
    fwd_kernel(const HP_GRID_CONST hp_tmap_t tq, const HP_GRID_CONST hp_tmap_t tk, const HP_GRID_CONST hp_tmap_t tv,
               const params_t p) {
  smem_t &sm = *reinterpret_cast<smem_t *>((reinterpret_cast<uintptr_t>(hp_smem()) + 1023) & ~uintptr_t(1023));
  const int m_block = gridDim.x - 1 - blockIdx.x, hh = blockIdx.y, bb = blockIdx.z;
  const int wg = hp_warp_uniform(threadIdx.x / 128), tid = threadIdx.x % 128; // lane 0's, as CUTLASS does
  const int n_end = p.causal ? min(p.s / BN, ((m_block + 1) * BM + BN - 1) / BN) : p.s / BN;

  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    for (int i = 0; i < STAGES; i++) {
      mbar_init(&sm.k_full[i], 1);
      mbar_init(&sm.v_full[i], 1);
      mbar_init(&sm.k_empty[i], 256);
      mbar_init(&sm.v_empty[i], 256);
    }
    mbar_init_fence();
  }
  hp_sync();

  if (wg == 0) { // producer
    reg_dealloc<40>();
    if (tid == 0) {
      mbar_expect_tx(&sm.q_full, TILE_BYTES);
      for (int half = 0; half < 2; half++) tma_load(sm.q[half], &tq, &sm.q_full, 64 * half, hh, m_block * BM, bb);
      for (int it = 0; it < n_end; it++) {
        const int n = n_end - 1 - it, st = it % STAGES;
        const uint32_t round = it / STAGES;
        if (round > 0) mbar_wait(&sm.k_empty[st], (round - 1) & 1);
        mbar_expect_tx(&sm.k_full[st], TILE_BYTES);
        for (int half = 0; half < 2; half++) tma_load(sm.k[st][half], &tk, &sm.k_full[st], 64 * half, hh, n * BN, bb);
        if (round > 0) mbar_wait(&sm.v_empty[st], (round - 1) & 1);
        mbar_expect_tx(&sm.v_full[st], TILE_BYTES);
        for (int half = 0; half < 2; half++) tma_load(sm.v[st][half], &tv, &sm.v_full[st], 64 * half, hh, n * BN, bb);
      }
    }
    return;
  }

  // consumers: warpgroup c = wg - 1 owns rows [c * 64, c * 64 + 64) of the block
  reg_alloc<232>();
  const int c = wg - 1, warp = tid / 32, lane = tid % 32;
  const int r0 = c * 64 + warp * 16 + lane / 4; // this thread's rows: r0 and r0 + 8 (in the block)
  const int q0 = m_block * BM + r0;
  float o[64], s[64];
  for (int i = 0; i < 64; i++) o[i] = 0.0f;
  float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  const uint32_t q_base = hp_smem_u32(sm.q[0]) + c * 64 * 128;
  mbar_wait(&sm.q_full, 0);

  for (int it = 0; it < n_end; it++) {
    const int n = n_end - 1 - it, st = it % STAGES;
    const uint32_t parity = (it / STAGES) & 1;
    // S = Q K^T
    mbar_wait(&sm.k_full[st], parity);
    const uint32_t k_base = hp_smem_u32(sm.k[st][0]);
    wg_fence();
#pragma unroll
    for (int half = 0; half < 2; half++)
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        wgmma_ss(s, gmma_desc(q_base + half * BM * 128 + kk * 32, 16, 1024),
                 gmma_desc(k_base + half * BN * 128 + kk * 32, 16, 1024), half | kk);
    wg_commit();
    wg_wait0();
    mbar_arrive(&sm.k_empty[st]);

    // mask (causal, the blocks that reach past a row) and online softmax, base 2
    const bool diag = p.causal && (n + 1) * BN - 1 > m_block * BM + c * 64;
    float mnew[2] = {mx[0], mx[1]};
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = n * BN + 8 * j + 2 * (lane % 4) + (e & 1), row = q0 + 8 * (e >> 1);
        float v = s[4 * j + e] * p.scale_log2;
        if (diag && col > row) v = -INFINITY;
        s[4 * j + e] = v;
        mnew[e >> 1] = fmaxf(mnew[e >> 1], v);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      mnew[r] = fmaxf(mnew[r], hp_shfl_xor(mnew[r], 1));
      mnew[r] = fmaxf(mnew[r], hp_shfl_xor(mnew[r], 2));
      const float base = mnew[r] == -INFINITY ? 0.0f : mnew[r]; // a row with no key yet
      corr[r] = exp2f(mx[r] - base);
      mx[r] = mnew[r];
      sum[r] *= corr[r];
    }
    uint32_t pa[32]; // P in bf16, as eight k16 A fragments of four registers
#pragma unroll
    for (int j = 0; j < 16; j++) {
      float e4[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float base = mx[e >> 1] == -INFINITY ? 0.0f : mx[e >> 1];
        e4[e] = exp2f(s[4 * j + e] - base);
        sum[e >> 1] += e4[e];
      }
      pa[2 * j] = pack_bf16(e4[0], e4[1]);     // row r0: columns 2q, 2q+1 of this 8-column slice
      pa[2 * j + 1] = pack_bf16(e4[2], e4[3]); // row r0 + 8
    }
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) o[4 * j + e] *= corr[e >> 1];

    // O += P V
    mbar_wait(&sm.v_full[st], parity);
    const uint32_t v_base = hp_smem_u32(sm.v[st][0]);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < 8; kc++) {
      // keys 16 kc .. 16 kc + 15: slices 2 kc (a0 row r0, a1 row r0 + 8) and 2 kc + 1 (a2, a3)
      const uint32_t a[4] = {pa[4 * kc], pa[4 * kc + 1], pa[4 * kc + 2], pa[4 * kc + 3]};
      wgmma_rs(o, a, gmma_desc(v_base + kc * 16 * 128, BN * 128, 1024));
    }
    wg_commit();
    wg_wait0();
    mbar_arrive(&sm.v_empty[st]);
  }

  // epilogue: the row sums over the four threads of a row, O / l, LSE (natural log)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    sum[r] += hp_shfl_xor(sum[r], 1);
    sum[r] += hp_shfl_xor(sum[r], 2);
  }
  const float inv[2] = {sum[0] > 0.0f ? 1.0f / sum[0] : 0.0f, sum[1] > 0.0f ? 1.0f / sum[1] : 0.0f};
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + 8 * r;
    uint16_t *out = p.o + (((int64_t)bb * p.s + row) * p.h + hh) * D;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const int col = 8 * j + 2 * (lane % 4);
      *reinterpret_cast<uint32_t *>(out + col) = pack_bf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
    }
    if (lane % 4 == 0)
      p.lse[((int64_t)bb * p.h + hh) * p.s + row] =
          sum[r] > 0.0f ? (mx[r] + log2f(sum[r])) * 0.69314718055994531f : -INFINITY;
  }
}


#endif
