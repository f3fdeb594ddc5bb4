/*
 * gemm_grouped.cu — the pointer arrays of cuBLAS's grouped GEMM
 * (cublasGemmGroupedBatchedEx reads A, B and C pointers from device memory).
 * The host knows them; a kernel whose by-value arguments carry up to CHUNK
 * of them writes them, so the write is ordered on the call's stream (no
 * pageable copy that a later call could overtake) and a CUDA graph capture
 * records it like any kernel. CHUNK = 384 pointers (the A, B and C arrays of
 * 128 experts) are 3 KiB of arguments, under the 4 KiB every architecture
 * takes; more take one launch per chunk. No CPU twin: on cpu the grouped GEMM
 * loops over the groups (kernels/gemm/cpu/gemm_grouped.c) and needs no arrays.
 */
#include "gemm/gemm.h"

enum { CHUNK = 384 };

struct pointers {
  void *p[CHUNK];
};

// ---- kernels ---------------------------------------------------------------

__global__ void gemm_pointers_kernel(void **dst, pointers src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src.p[i];
}

// ---- launchers ---------------------------------------------------------------

extern "C" int dl_gemm_pointers_cuda(void **dst, void *const *src, int64_t n, void *stream) {
  for (int64_t at = 0; at < n; at += CHUNK) {
    const int len = (int)(n - at < CHUNK ? n - at : CHUNK);
    pointers chunk;
    for (int i = 0; i < len; i++) chunk.p[i] = src[at + i];
    gemm_pointers_kernel<<<(len + 127) / 128, 128, 0, (cudaStream_t)stream>>>(dst + at, chunk, len);
    DL_CUDA_CHECK_LAUNCH("gemm_pointers_kernel");
  }
  return DL_OK;
}
