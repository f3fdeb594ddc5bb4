/*
 * softmax.cu — softmax and log_softmax along one dim of a strided view:
 * one warp a row, three passes over it (max, then the sum of exp(x - max),
 * then each output), sums in fp32 (fp64 for f64 input), any float dtypes in
 * and out through dtype.h's conversions. The max propagates NaN, as the CPU
 * twin (kernels/tensor/cpu/softmax.c, fp64), which the specs compare with.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "common/dtype.h"
#include "rows.cuh"
#include "tensor_math.h"

// ---------------------------------------------------------------------------
// kernels

template <typename A> __device__ __forceinline__ A nan_max(A a, A b) { return (b > a || b != b) ? b : a; }

template <typename A> __device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o; o >>= 1) v = nan_max(v, (A)__shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o; o >>= 1) v += (A)__shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }

template <typename A>
__global__ void softmax_rows_kernel(char *out, int odt, dl_rows_t ro, int64_t so, const char *x, int xdt,
                                    dl_rows_t rx, int64_t sx, int64_t rows, int64_t n, int log_out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int64_t bx = dl_row_base(rx, r), bo = dl_row_base(ro, r);
    A m = -INFINITY, sum = 0;
    for (int64_t j = lane; j < n; j += 32) m = nan_max(m, (A)dl_load_f64(x, bx + j * sx, xdt));
    m = warp_max(m);
    for (int64_t j = lane; j < n; j += 32) sum += exp_of((A)dl_load_f64(x, bx + j * sx, xdt) - m);
    sum = warp_sum(sum);
    const A lsum = log_of(sum);
    for (int64_t j = lane; j < n; j += 32) {
      const A d = (A)dl_load_f64(x, bx + j * sx, xdt) - m;
      dl_store_f64(out, bo + j * so, odt, log_out ? (double)(d - lsum) : (double)(exp_of(d) / sum));
    }
  }
}

// ---------------------------------------------------------------------------
// launcher

extern "C" int dl_softmax_cuda(const dl_view_t *out, const dl_view_t *x, int dim, int log_out, void *stream) {
  const int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
  if (!rows) return DL_OK;
  const dl_rows_t ro = dl_rows_of(out, dim), rx = dl_rows_of(x, dim);
  const int grid = dl_grid_for(rows, 8);
  cudaStream_t h = (cudaStream_t)stream;
  if (x->dtype == DL_F64)
    softmax_rows_kernel<double><<<grid, 256, 0, h>>>(out->data, out->dtype, ro, out->strides[dim], x->data, x->dtype,
                                                     rx, x->strides[dim], rows, n, log_out);
  else
    softmax_rows_kernel<float><<<grid, 256, 0, h>>>(out->data, out->dtype, ro, out->strides[dim], x->data, x->dtype,
                                                    rx, x->strides[dim], rows, n, log_out);
  DL_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
  return DL_OK;
}
