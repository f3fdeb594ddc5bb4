/*
 * attn_device.cuh — everything the attention kernels take from the device:
 * warp-level PTX (ldmatrix, mma.sync m16n8k16, cp.async, ex2), shuffles,
 * atomics, bf16/fp16 packing, dynamic shared memory, and the launch glue.
 * The kernels are plain C++ on top of these names, so the lab can run them
 * on a CPU: experiments/lab/emu/attn/cuda_emu.h defines the same names (and
 * this header's guard) with a warp emulator. Keep the two in step.
 *
 * Fragment conventions (PTX ISA, mma.m16n8k16 .row.col, lane = 4*g + t):
 *   A 16x16: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
 *   B 16x8 (k x n): b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
 *   C 16x8: c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
 */
#ifndef DISTLAB_KERNELS_ATTN_DEVICE_CUH
#define DISTLAB_KERNELS_ATTN_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/base.h"
#include "common/pdl.cuh" /* the backward's prep releases the Hopper main kernel early */

#define ATTN_DEV __device__ __forceinline__

/* ---- shared memory, barriers, lanes -------------------------------------- */

ATTN_DEV char *attn_smem() {
  extern __shared__ __align__(128) char attn_dyn_smem[];
  return attn_dyn_smem;
}

ATTN_DEV void attn_sync() { __syncthreads(); }
ATTN_DEV void attn_syncwarp() { __syncwarp(); }

ATTN_DEV float attn_shfl_xor(float x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
ATTN_DEV bool attn_all(bool x) { return __all_sync(0xffffffffu, x); }

/* ---- ldmatrix / mma -------------------------------------------------------- */

ATTN_DEV uint32_t attn_smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 b16 matrices; lane l gives the shared address of row l%8 of
 * matrix l/8 (attn_smem_u32 of a pointer into attn_smem()). */
ATTN_DEV void ldmatrix_x4(uint32_t r[4], uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

ATTN_DEV void ldmatrix_x4_trans(uint32_t r[4], uint32_t row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row));
}

/* c += a * b, fp32 accumulate. */
template <bool BF16>
ATTN_DEV void mma_16816(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
  if (BF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- cp.async ------------------------------------------------------------- */

/* 16 bytes global -> shared; zero-fills (and reads nothing) when !valid. */
ATTN_DEV void cp_async16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(attn_smem_u32(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}

ATTN_DEV void cp_async4(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(attn_smem_u32(dst)),
               "l"(src), "r"(valid ? 4 : 0));
}

ATTN_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
ATTN_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ---- numerics --------------------------------------------------------------- */

/* 2^x by the SFU (ex2.approx.ftz): exact enough for softmax, 2^-inf = 0. */
ATTN_DEV float attn_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* Two floats to packed bf16x2 / f16x2 (round to nearest even), lo in bits 0..15. */
template <bool BF16>
ATTN_DEV uint32_t attn_pack2(float lo, float hi) {
  uint32_t r;
  if (BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <bool BF16>
ATTN_DEV float attn_unpack_lo(uint32_t x) {
  if (BF16) return __uint_as_float(x << 16);
  return __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
}

template <bool BF16>
ATTN_DEV float attn_unpack_hi(uint32_t x) {
  return attn_unpack_lo<BF16>(x >> 16);
}

/* ---- vector global access (aligned to the size) ----------------------------------- */

ATTN_DEV void attn_ld_b64(const void *p, uint32_t r[2]) {
  const uint2 v = *reinterpret_cast<const uint2 *>(p);
  r[0] = v.x, r[1] = v.y;
}

ATTN_DEV void attn_st_b64(void *p, const uint32_t r[2]) {
  *reinterpret_cast<uint2 *>(p) = make_uint2(r[0], r[1]);
}

ATTN_DEV void attn_ld_b128(const void *p, uint32_t r[4]) {
  const uint4 v = *reinterpret_cast<const uint4 *>(p);
  r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
}

ATTN_DEV void attn_st_b128(void *p, const uint32_t r[4]) {
  *reinterpret_cast<uint4 *>(p) = make_uint4(r[0], r[1], r[2], r[3]);
}

/* ---- atomics ------------------------------------------------------------------ */

ATTN_DEV void attn_atomic_add4(float *dst, float a, float b, float c, float d) {
  atomicAdd(reinterpret_cast<float4 *>(dst), make_float4(a, b, c, d));
}

/* Max of floats through the integer order (caller starts from -inf). */
ATTN_DEV void attn_atomic_max(float *dst, float x) {
  if (x >= 0.0f)
    atomicMax(reinterpret_cast<int *>(dst), __float_as_int(x));
  else
    atomicMin(reinterpret_cast<unsigned int *>(dst), __float_as_uint(x));
}

/* ---- launch glue ---------------------------------------------------------------- */

/* Launches kernel<<<grid, block, smem, stream>>>(args...) and checks it. */
template <typename... KArgs, typename... Args>
static int attn_launch(const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                       size_t smem, void *stream, Args... args) {
  if (smem > 48 * 1024)
    DL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
  kernel<<<grid, block, smem, (cudaStream_t)stream>>>(args...);
  DL_CUDA_CHECK_LAUNCH(name);
  return 0;
}

#endif
