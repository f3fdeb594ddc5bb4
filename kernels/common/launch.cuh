/*
 * launch.cuh — the one launch of the device ops' kernels (all-reduce, EP,
 * ...): a grid of kernel k with the family's argument block, its dynamic
 * shared memory (above 48 KiB by opting in), and programmatic stream
 * serialization when pdl (pdl.cuh: the grid may be scheduled while the one
 * ahead of it finishes). An error is DL_ECUDA naming the kernel.
 *
 * Compiled as C++ without nvcc (__CUDACC__ unset), a kernel file is one of
 * the CPU emulators' (experiments/): the grid then runs on emu_launch, which
 * their cuda_emu.h defines, and returns once done.
 */
#ifndef DISTLAB_KERNELS_COMMON_LAUNCH_CUH
#define DISTLAB_KERNELS_COMMON_LAUNCH_CUH

#include "common/base.h"
#include "common/pdl.cuh"

template <class A>
static int dl_launch(void (*k)(const A), const char *name, int blocks, int threads, int64_t smem, void *stream,
                     int pdl, const A &a) {
#ifdef __CUDACC__
  if (smem > 48 * 1024) DL_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const cudaError_t e = dl_pdl_launch(k, blocks, threads, (size_t)smem, (cudaStream_t)stream, pdl, a);
  if (e != cudaSuccess) return DL_ERR(DL_ECUDA, "launch of %s failed: %s", name, cudaGetErrorString(e));
#else
  (void)name, (void)pdl;
  emu_launch(k, blocks, threads, (size_t)smem, (cudaStream_t)stream)(a);
#endif
  return DL_OK;
}

#endif
