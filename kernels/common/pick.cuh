/*
 * pick.cuh — element i of an array in a kernel's parameter block, without
 * indexing the block at run time (which makes every thread copy the whole
 * block to local memory): a chain of selects, folded to one parameter load
 * where i is known at compile time (an unrolled loop's index). The all-reduce
 * kernels use it; ep_device.cuh keeps its own loop of the same form (written
 * through this one, the EP kernels' PTX changed a little, and EP was not
 * timed again).
 */
#ifndef DISTLAB_KERNELS_COMMON_PICK_CUH
#define DISTLAB_KERNELS_COMMON_PICK_CUH

template <class T, int N> __device__ __forceinline__ T dl_param_pick(const T (&arr)[N], int i) {
  T x = arr[0];
#pragma unroll
  for (int q = 1; q < N; q++)
    if (i == q) x = arr[q];
  return x;
}

#endif
