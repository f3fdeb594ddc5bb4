// overlap_copy.cu — the "sm" transport of the overlap schedules
// (bindings/distlab/overlap/): a copy kernel of a chosen number of blocks
// that moves a shard between this rank's symmetric buffer and a peer's
// (loads from the peer for get, stores into it for put, over NVLink, or in
// the same GPU's memory where ranks share one), where "ce" uses the copy
// engine (cudaMemcpyAsync). The grid is the caller's: the schedules give it
// a few multiprocessors, so the GEMM running beside it keeps the rest.
//
// 16-byte vectors, UNROLL loads in flight per thread before the stores,
// grid-stride; pointers that are not both 16-byte aligned take a byte loop
// (correct, slow: the schedules' slots are 256-byte aligned). Checked
// against the copy engine and the CPU twin (kernels/overlap/cpu/overlap_copy.c)
// in spec/overlap/copy.lua.
#include "overlap/overlap.h"

enum { COPY_THREADS = 512, COPY_UNROLL = 4 };

// ---- kernels ------------------------------------------------------------------

__global__ void __launch_bounds__(COPY_THREADS) overlap_copy_vec_kernel(uint4 *dst, const uint4 *src,
                                                                        int64_t n) {
  const int64_t per_block = (int64_t)COPY_THREADS * COPY_UNROLL;
  for (int64_t base = blockIdx.x * per_block + threadIdx.x; base < n; base += per_block * gridDim.x) {
    uint4 v[COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; u++) {
      const int64_t i = base + (int64_t)u * COPY_THREADS;
      if (i < n) v[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; u++) {
      const int64_t i = base + (int64_t)u * COPY_THREADS;
      if (i < n) dst[i] = v[u];
    }
  }
}

__global__ void __launch_bounds__(COPY_THREADS) overlap_copy_bytes_kernel(char *dst, const char *src,
                                                                          int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)COPY_THREADS + threadIdx.x; i < n;
       i += (int64_t)COPY_THREADS * gridDim.x)
    dst[i] = src[i];
}

// ---- launcher -------------------------------------------------------------------

extern "C" int dl_overlap_copy_cuda(void *dst, const void *src, int64_t bytes, int blocks,
                                    void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (bytes <= 0) return DL_OK;
  if (blocks < 1) return DL_ERR(DL_EINVAL, "overlap copy: %d blocks", blocks);
  const int64_t nv = bytes / 16;
  const bool aligned = ((uintptr_t)dst | (uintptr_t)src) % 16 == 0;
  if (aligned && nv > 0) {
    const int64_t need = (nv + COPY_THREADS * COPY_UNROLL - 1) / (COPY_THREADS * COPY_UNROLL);
    const int grid = need < blocks ? (int)need : blocks;
    overlap_copy_vec_kernel<<<grid, COPY_THREADS, 0, st>>>((uint4 *)dst, (const uint4 *)src, nv);
    DL_CUDA_CHECK_LAUNCH("overlap_copy_vec_kernel");
  }
  const int64_t done = aligned ? nv * 16 : 0, rest = bytes - done;
  if (rest > 0) {
    const int64_t need = (rest + COPY_THREADS - 1) / COPY_THREADS;
    const int grid = need < blocks ? (int)need : blocks;
    overlap_copy_bytes_kernel<<<grid, COPY_THREADS, 0, st>>>((char *)dst + done,
                                                            (const char *)src + done, rest);
    DL_CUDA_CHECK_LAUNCH("overlap_copy_bytes_kernel");
  }
  return DL_OK;
}
