/*
 * fwd.cu — lab: a Hopper (sm_90a) flash-attention forward for issue 19, on
 * wgmma and TMA, warp-specialised; standalone (its own main, checker and
 * timer), not yet part of dl.attn. Shape: bshd bf16, d = 128, s_q = s_kv a
 * multiple of 128, causal (top-left) or not; out bf16 [b, s, h, d] and the
 * natural-log LSE fp32 [b, h, s].
 *
 * Why hand-written PTX and not CuTe: the kernel needs five instructions that
 * CuTe wraps (TMA load, mbarrier, wgmma SS/RS, setmaxnreg) and two shared
 * memory descriptors; spelled out here they are one screen each, the
 * descriptors are explicit (below), and the file compiles in seconds on CI's
 * two cores, where CuTe's template instantiations take minutes. The layouts
 * were read from CUTLASS 4.2's cute/atom/mma_traits_sm90_gmma.hpp
 * (make_gmma_desc) and cute/arch/copy_sm90_tma.hpp; no code is copied.
 *
 * CTA: 3 warpgroups, BM = 128 query rows of one (batch, head).
 *   warpgroup 0, producer (one thread): TMA loads Q once, then K and V of
 *     each key block (BN = 128), last block first, into STAGES = 2 buffers;
 *     full barriers carry the bytes (expect_tx), empty barriers free them.
 *   warpgroups 1, 2, consumers: 64 query rows each. Per key block:
 *     S = Q K^T (8 wgmma m64n128k16, both operands in shared memory),
 *     K's buffer released, causal mask on the diagonal block, online
 *     softmax in base 2 (row max and sum over the 4 threads of a row),
 *     P rounded to bf16 in registers as wgmma's A operand (the fp32
 *     accumulator layout of a 16-column slice is the A layout of a k16
 *     step), O += P V (8 wgmma, V transposed by the descriptor), V's
 *     buffer released. Epilogue: O / l to global memory, LSE.
 *   Not yet here (FA3 has them): softmax of block j overlapped with the
 *   GEMMs of block j+1 (intra-warpgroup pipelining), ping-pong between the
 *   two consumer warpgroups, a TMA store of O, thd/sbhd, GQA, windows, the
 *   fused merge epilogue, backward.
 *
 * Shared memory tiles, each a TMA box of 64 columns (128 bytes) x rows with
 * the 128-byte swizzle, 1024-byte aligned; a d = 128 tile is two of them:
 *   Q [2][BM][64], K [STAGES][2][BN][64], V [STAGES][2][BN][64] bf16.
 * wgmma descriptors (64 bits: start >> 4 at [0,14), leading byte offset >> 4
 * at [16,30), stride byte offset >> 4 at [32,46), layout 1 = 128B swizzle at
 * [62,64)):
 *   K-major (Q as A, K as B; d contiguous): SBO = 1024 (8 rows of 128 B),
 *     LBO = 16 (unused by swizzled K-major); the k16 step kk of a half at
 *     start + 32 kk; the second half of d at start + rows * 128.
 *   MN-major (V as B; d = N contiguous): SBO = 1024 (8 keys), LBO = BN * 128
 *     (the second 64 columns of d); the k16 step (16 keys) at start + 2048.
 *
 * Status: written and compiled without a GPU (2026-11-26); never run. The
 * first GPU call must run `./fwd --check` (sampled rows against an fp64
 * reference, normwise and elementwise, with a planted 2% error that must
 * fail) before any timing is believed.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o fwd fwd.cu
 *   ./fwd [--check] [--b 2] [--h 16] [--s 4096,8192,16384,32768] [--iters 20]
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

namespace {

constexpr int D = 128, BM = 128, BN = 128, STAGES = 2, THREADS = 384;
constexpr uint32_t TILE_BYTES = 128 * 128 * 2; // a [128][128] bf16 tile: two TMA boxes

struct alignas(1024) smem_t {
  __nv_bfloat16 q[2][BM * 64];
  __nv_bfloat16 k[STAGES][2][BN * 64];
  __nv_bfloat16 v[STAGES][2][BN * 64];
  uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
};

struct params_t {
  int b, h, s, causal;
  float scale_log2; // softmax scale * log2(e)
  __nv_bfloat16 *o;
  float *lse;
};

// ---- PTX ------------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint64_t *b, uint32_t parity) {
  uint32_t ok;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(ok)
               : "r"(smem_u32(b)), "r"(parity)
               : "memory");
  return ok != 0;
}
// Every wait ends: a phase that never completes traps (a launch error on the host), it does not hang.
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
  for (long n = 0; !mbar_try(b, parity); n++)
    if (n > (1l << 26)) __trap();
}

// TMA: box {64, 1, rows, 1} of a 4-d tensor map (d, h, s, b) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1, int c2,
                                         int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
               ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int R> __device__ __forceinline__ void reg_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R> __device__ __forceinline__ void reg_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// A shared memory matrix descriptor with the 128-byte swizzle.
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
         (uint64_t)((sbo >> 4) & 0x3fff) << 32 | 1ull << 62;
}

// D (64 x 128, fp32, in registers) (+)= A (64 x 16, smem descriptor) * B (16 x 128, smem descriptor)
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

// D += A (64 x 16 bf16 in registers, four b32 a thread) * B (16 x 128, smem descriptor, MN-major: transposed)
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

// Grid (s / BM, h, b), m-blocks last to first (the causal heavy ones start first).
__global__ void __launch_bounds__(THREADS, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
               const __grid_constant__ CUtensorMap tv, const params_t p) {
  extern __shared__ char smem_raw[];
  smem_t &sm = *reinterpret_cast<smem_t *>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int m_block = gridDim.x - 1 - blockIdx.x, hh = blockIdx.y, bb = blockIdx.z;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int n_end = p.causal ? min(p.s / BN, ((m_block + 1) * BM + BN - 1) / BN) : p.s / BN;

  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    for (int i = 0; i < STAGES; i++) {
      mbar_init(&sm.k_full[i], 1);
      mbar_init(&sm.v_full[i], 1);
      mbar_init(&sm.k_empty[i], 256);
      mbar_init(&sm.v_empty[i], 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

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
  const uint32_t q_base = smem_u32(sm.q[0]) + c * 64 * 128;
  mbar_wait(&sm.q_full, 0);

  for (int it = 0; it < n_end; it++) {
    const int n = n_end - 1 - it, st = it % STAGES;
    const uint32_t parity = (it / STAGES) & 1;
    // S = Q K^T
    mbar_wait(&sm.k_full[st], parity);
    const uint32_t k_base = smem_u32(sm.k[st][0]);
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
      mnew[r] = fmaxf(mnew[r], __shfl_xor_sync(0xffffffffu, mnew[r], 1));
      mnew[r] = fmaxf(mnew[r], __shfl_xor_sync(0xffffffffu, mnew[r], 2));
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
    const uint32_t v_base = smem_u32(sm.v[st][0]);
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
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
  }
  const float inv[2] = {sum[0] > 0.0f ? 1.0f / sum[0] : 0.0f, sum[1] > 0.0f ? 1.0f / sum[1] : 0.0f};
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = q0 + 8 * r;
    __nv_bfloat16 *out = p.o + (((int64_t)bb * p.s + row) * p.h + hh) * D;
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

// ---- the reference: fp64, one block of D threads per sampled (row, head, batch) ----------------

__global__ void ref_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, int b, int h,
                           int s, int causal, double scale, const int *rows, double *o_ref, double *lse_ref) {
  const int ri = blockIdx.x, hh = blockIdx.y, bb = blockIdx.z, t = threadIdx.x, row = rows[ri];
  __shared__ double qs[D], ps[128], red[D];
  auto at = [&](const __nv_bfloat16 *x, int pos) { return x + (((int64_t)bb * s + pos) * h + hh) * D; };
  qs[t] = (double)__bfloat162float(at(q, row)[t]);
  __syncthreads();
  double m = -INFINITY, l = 0.0, acc = 0.0;
  const int keys = causal ? row + 1 : s;
  for (int k0 = 0; k0 < keys; k0 += 128) {
    double sc = -INFINITY; // thread t: score of key k0 + t
    if (k0 + t < keys) {
      const __nv_bfloat16 *kr = at(k, k0 + t);
      sc = 0.0;
      for (int i = 0; i < D; i++) sc += qs[i] * (double)__bfloat162float(kr[i]);
      sc *= scale;
    }
    red[t] = sc;
    __syncthreads();
    double bm = -INFINITY;
    for (int i = 0; i < 128; i++) bm = fmax(bm, red[i]);
    const double mn = fmax(m, bm), cr = exp(m - mn);
    __syncthreads();
    ps[t] = k0 + t < keys ? exp(sc - mn) : 0.0;
    __syncthreads();
    double ls = 0.0, a = 0.0;
    for (int i = 0; i < 128 && k0 + i < keys; i++) {
      ls += ps[i];
      a += ps[i] * (double)__bfloat162float(at(v, k0 + i)[t]);
    }
    l = l * cr + ls;
    acc = acc * cr + a;
    m = mn;
    __syncthreads();
  }
  const int64_t idx = ((int64_t)bb * h + hh) * gridDim.x + ri;
  o_ref[idx * D + t] = acc / l;
  if (t == 0) lse_ref[idx] = m + log(l);
}

__global__ void fill_kernel(__nv_bfloat16 *x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(((float)(z >> 40) / (float)(1u << 24) - 0.5f) * 2.0f); // uniform in [-1, 1)
  }
}

} // namespace

// ---- host ---------------------------------------------------------------------------------------

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) {
      fprintf(stderr, "cuTensorMapEncodeTiled not found in the driver\n");
      exit(1);
    }
  }
  return fn;
}

// (d, h, s, b) of a bshd bf16 tensor; boxes of 64 x 1 x 128 x 1 with the 128-byte swizzle.
static CUtensorMap tensor_map(const __nv_bfloat16 *x, int b, int h, int s) {
  CUtensorMap m;
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)h, (cuuint64_t)s, (cuuint64_t)b};
  const cuuint64_t strides[3] = {(cuuint64_t)D * 2, (cuuint64_t)h * D * 2, (cuuint64_t)s * h * D * 2};
  const cuuint32_t box[4] = {64, 1, 128, 1}, estr[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)x, dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", (int)r);
    exit(1);
  }
  return m;
}

static void run(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const params_t &p,
                cudaStream_t st) {
  const CUtensorMap tq = tensor_map(q, p.b, p.h, p.s), tk = tensor_map(k, p.b, p.h, p.s),
                    tv = tensor_map(v, p.b, p.h, p.s);
  const size_t smem = sizeof(smem_t) + 1024;
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attr = true;
  }
  fwd_kernel<<<dim3(p.s / BM, p.h, p.b), THREADS, smem, st>>>(tq, tk, tv, p);
  CK(cudaGetLastError());
}

// Sampled rows against the fp64 reference: normwise and elementwise error of O and LSE.
// planted: O scaled by 1.02 first (the check must then fail).
static bool check(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const params_t &p,
                  bool planted) {
  std::vector<int> rows;
  for (int r = 0; r < p.s; r += 97) rows.push_back(r);
  rows.push_back(p.s - 1);
  const int nr = (int)rows.size();
  int *drows;
  double *oref, *lref;
  CK(cudaMalloc(&drows, nr * sizeof(int)));
  CK(cudaMalloc(&oref, (size_t)p.b * p.h * nr * D * sizeof(double)));
  CK(cudaMalloc(&lref, (size_t)p.b * p.h * nr * sizeof(double)));
  CK(cudaMemcpy(drows, rows.data(), nr * sizeof(int), cudaMemcpyHostToDevice));
  ref_kernel<<<dim3(nr, p.h, p.b), D>>>(q, k, v, p.b, p.h, p.s, p.causal, (double)p.scale_log2 / 1.4426950408889634,
                                        drows, oref, lref);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<double> ho((size_t)p.b * p.h * nr * D), hl((size_t)p.b * p.h * nr);
  CK(cudaMemcpy(ho.data(), oref, ho.size() * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), lref, hl.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<__nv_bfloat16> go((size_t)p.b * p.s * p.h * D);
  std::vector<float> gl((size_t)p.b * p.h * p.s);
  CK(cudaMemcpy(go.data(), p.o, go.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), p.lse, gl.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, emax = 0, lmax = 0;
  for (int bb = 0; bb < p.b; bb++)
    for (int hh = 0; hh < p.h; hh++)
      for (int i = 0; i < nr; i++) {
        const int64_t ri = ((int64_t)bb * p.h + hh) * nr + i;
        for (int c = 0; c < D; c++) {
          double got = (double)__bfloat162float(go[(((int64_t)bb * p.s + rows[i]) * p.h + hh) * D + c]);
          if (planted) got *= 1.02;
          const double ref = ho[ri * D + c], d = got - ref;
          num += d * d;
          den += ref * ref;
          emax = fmax(emax, fabs(d) / (fabs(ref) + 1e-2)); // NaN stays NaN through fmax? no: checked below
          if (got != got) emax = INFINITY;
        }
        const double lg = gl[((int64_t)bb * p.h + hh) * p.s + rows[i]];
        lmax = fmax(lmax, lg != lg ? INFINITY : fabs(lg - hl[ri]) / fmax(1.0, fabs(hl[ri])));
      }
  const double nw = sqrt(num / den);
  // bf16 output: 2^-8 relative rounding; normwise 4e-3, elementwise 2e-2 of (|ref| + 0.01), LSE 1e-4
  const bool ok = nw <= 4e-3 && emax <= 2e-2 && lmax <= 1e-4;
  printf("  check s=%d causal=%d%s: normwise %.2e, elementwise %.2e, lse %.2e over %d rows x %d heads x %d: %s\n",
         p.s, p.causal, planted ? " (2%% planted)" : "", nw, emax, lmax, nr, p.h, p.b, ok ? "ok" : "FAIL");
  CK(cudaFree(drows));
  CK(cudaFree(oref));
  CK(cudaFree(lref));
  return ok;
}

int main(int argc, char **argv) {
  int b = 2, h = 16, iters = 20;
  bool do_check = false;
  std::vector<int> ss = {4096, 8192, 16384, 32768};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) do_check = true;
    else if (!strcmp(argv[i], "--b") && i + 1 < argc) b = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--h") && i + 1 < argc) h = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--s") && i + 1 < argc) {
      ss.clear();
      for (char *t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) ss.push_back(atoi(t));
    } else {
      fprintf(stderr, "usage: fwd [--check] [--b B] [--h H] [--s S1,S2,...] [--iters N]\n");
      return 2;
    }
  }
  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("device %s, sm_%d%d; bshd bf16, b=%d h=%d d=%d\n", prop.name, prop.major, prop.minor, b, h, D);
  bool all_ok = true;
  for (int s : ss) {
    if (s % 128) {
      fprintf(stderr, "s=%d: the lab kernel needs s a multiple of 128\n", s);
      return 2;
    }
    const size_t n = (size_t)b * s * h * D;
    __nv_bfloat16 *q, *k, *v, *o;
    float *lse;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, n * 2));
    CK(cudaMalloc(&v, n * 2));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&lse, (size_t)b * h * s * 4));
    fill_kernel<<<1024, 256>>>(q, n, 1);
    fill_kernel<<<1024, 256>>>(k, n, 2);
    fill_kernel<<<1024, 256>>>(v, n, 3);
    CK(cudaGetLastError());
    for (int causal = 0; causal < 2; causal++) {
      params_t p{b, h, s, causal, 1.4426950408889634f / sqrtf((float)D), o, lse};
      CK(cudaMemset(o, 0xff, n * 2)); // poison: NaN bf16 until the kernel writes
      CK(cudaMemset(lse, 0xff, (size_t)b * h * s * 4));
      run(q, k, v, p, 0);
      CK(cudaDeviceSynchronize());
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      for (int i = 0; i < 3; i++) run(q, k, v, p, 0);
      CK(cudaEventRecord(e0));
      for (int i = 0; i < iters; i++) run(q, k, v, p, 0);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = ms * 1e3 / iters, flops = 4.0 * b * h * (double)s * s * D / (causal ? 2 : 1);
      printf("s=%6d causal=%d  %9.1f us  %6.1f TFLOP/s\n", s, causal, us, flops / us * 1e-6);
      if (do_check) { // after timing: the data the timed runs left
        const bool ok = check(q, k, v, p, false), caught = !check(q, k, v, p, true);
        if (!caught) printf("  the planted 2%% error went unseen\n");
        all_ok = all_ok && ok && caught;
      }
      CK(cudaEventDestroy(e0));
      CK(cudaEventDestroy(e1));
    }
    CK(cudaFree(q));
    CK(cudaFree(k));
    CK(cudaFree(v));
    CK(cudaFree(o));
    CK(cudaFree(lse));
  }
  if (do_check) printf("%s\n", all_ok ? "check: all ok" : "check: FAILED");
  return all_ok ? 0 : 1;
}
