/*
 * pdl.cuh — programmatic dependent launch (sm_90; no-ops elsewhere), for
 * kernels that run back to back on a stream (the all-reduce's, the EP
 * dispatch/combine's). A kernel launched with programmatic stream
 * serialization may start before the grid ahead of it in the stream has
 * finished: dl_pdl_wait() returns once that grid has completed and its
 * memory is visible, so it comes before any access. dl_pdl_release() lets
 * the grid after this one be scheduled now; it too waits for this grid's
 * completion before it touches memory, so releasing early is safe, and it
 * hides the launch of the next kernel of a sequence behind this one's tail.
 * A grid whose blocks must all be resident at once (the fused EP kernels)
 * is not hurt: the next grid is scheduled only once every block of this one
 * has released, so every one of them is resident by then.
 *
 * dl_pdl_launch (nvcc only; the CPU emulations launch with <<<>>>): one
 * grid of k (blocks and threads, each an int or a dim3) with its arguments,
 * with the attribute when pdl, its error returned.
 */
#ifndef DISTLAB_KERNELS_COMMON_PDL_CUH
#define DISTLAB_KERNELS_COMMON_PDL_CUH

#include <string.h>

__device__ __forceinline__ void dl_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dl_pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#ifdef __CUDACC__
#include <utility>
template <class... P, class... A>
static cudaError_t dl_pdl_launch(void (*k)(P...), dim3 blocks, dim3 threads, size_t smem, cudaStream_t st, int pdl,
                                 A &&...a) {
  cudaLaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = blocks;
  cfg.blockDim = threads;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, std::forward<A>(a)...);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e;
}
#endif

#endif
