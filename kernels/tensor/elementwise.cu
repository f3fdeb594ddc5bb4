/*
 * elementwise.cu — fill, convert-copy, axpby, scale-shift, multiply and
 * Philox random over strided views, on one GPU.
 *
 * Every kernel is a grid-stride loop over the row-major index; a view that
 * the core coalesced to one contiguous dimension skips the index arithmetic.
 * Conversions use dtype.h, bit-for-bit the same as the CPU twins in
 * kernels/tensor/cpu/elementwise.c, which the specs compare against. Zero fills and
 * contiguous same-dtype copies go to cudaMemsetAsync / cudaMemcpyAsync.
 */
#include <cuda_runtime.h>

#include "common/dtype.h"
#include "elementwise.h"
#include "common/philox.h"

// ---------------------------------------------------------------------------
// element access

struct dl_shape_t {
  int ndim;
  int contiguous;
  int64_t shape[DL_MAX_DIMS];
  int64_t strides[DL_MAX_DIMS];
};

static dl_shape_t shape_of(const dl_view_t *v) {
  dl_shape_t s;
  s.ndim = v->ndim;
  s.contiguous = dl_view_is_contiguous(v);
  for (int d = 0; d < DL_MAX_DIMS; d++) {
    s.shape[d] = d < v->ndim ? v->shape[d] : 1;
    s.strides[d] = d < v->ndim ? v->strides[d] : 0;
  }
  return s;
}

__device__ __forceinline__ int64_t elem_offset(const dl_shape_t &s, int64_t i) {
  if (s.contiguous) return i;
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; d--) {
    int64_t n = s.shape[d];
    off += (i % n) * s.strides[d];
    i /= n;
  }
  return off;
}

template <typename T> struct elem;
template <> struct elem<float> {
  __device__ static double load(const float *p) { return *p; }
  __device__ static void store(float *p, double v) { *p = (float)v; }
};
template <> struct elem<double> {
  __device__ static double load(const double *p) { return *p; }
  __device__ static void store(double *p, double v) { *p = v; }
};
struct f16_t {
  uint16_t x;
};
struct bf16_t {
  uint16_t x;
};
template <> struct elem<f16_t> {
  __device__ static double load(const f16_t *p) { return dl_f16_to_f32(p->x); }
  __device__ static void store(f16_t *p, double v) { p->x = dl_f32_to_f16((float)v); }
};
template <> struct elem<bf16_t> {
  __device__ static double load(const bf16_t *p) { return dl_bf16_to_f32(p->x); }
  __device__ static void store(bf16_t *p, double v) { p->x = dl_f32_to_bf16((float)v); }
};
template <> struct elem<int32_t> {
  __device__ static double load(const int32_t *p) { return *p; }
  __device__ static void store(int32_t *p, double v) {
    *p = (int32_t)dl_sat_i64(v, -2147483648.0, 2147483647.0);
  }
};
template <> struct elem<int64_t> {
  __device__ static double load(const int64_t *p) { return (double)*p; }
  __device__ static void store(int64_t *p, double v) {
    *p = dl_sat_i64(v, -9223372036854775808.0, 9223372036854774784.0);
  }
};
template <> struct elem<uint8_t> {
  __device__ static double load(const uint8_t *p) { return *p; }
  __device__ static void store(uint8_t *p, double v) { *p = (uint8_t)dl_sat_i64(v, 0.0, 255.0); }
};

// Calls F.template operator()<T>() with T the storage type of dtype.
template <typename F> static int dispatch_dtype(int dtype, F f) {
  switch (dtype) {
  case DL_F32: return f.template operator()<float>();
  case DL_F16: return f.template operator()<f16_t>();
  case DL_BF16: return f.template operator()<bf16_t>();
  case DL_I32: return f.template operator()<int32_t>();
  case DL_I64: return f.template operator()<int64_t>();
  case DL_U8: return f.template operator()<uint8_t>();
  case DL_F64: return f.template operator()<double>();
  }
  return DL_ERR(DL_EINVAL, "unknown dtype id %d", dtype);
}

static int grid_for(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return (int)(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

// ---------------------------------------------------------------------------
// kernels

template <typename T> __global__ void fill_kernel(T *dst, dl_shape_t s, int64_t n, T value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[elem_offset(s, i)] = value;
}

template <typename TD, typename TS>
__global__ void copy_kernel(TD *dst, dl_shape_t sd, const TS *src, dl_shape_t ss, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    elem<TD>::store(dst + elem_offset(sd, i), elem<TS>::load(src + elem_offset(ss, i)));
}

template <typename TD, typename TS>
__global__ void axpby_kernel(TD *dst, dl_shape_t sd, double beta, const TS *src, dl_shape_t ss,
                             double alpha, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    TD *d = dst + elem_offset(sd, i);
    double s = alpha * elem<TS>::load(src + elem_offset(ss, i));
    elem<TD>::store(d, beta == 0 ? s : beta * elem<TD>::load(d) + s);
  }
}

template <typename TD, typename TS>
__global__ void mul_kernel(TD *dst, dl_shape_t sd, const TS *src, dl_shape_t ss, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    TD *d = dst + elem_offset(sd, i);
    elem<TD>::store(d, elem<TD>::load(d) * elem<TS>::load(src + elem_offset(ss, i)));
  }
}

template <typename T>
__global__ void scale_shift_kernel(T *dst, dl_shape_t s, double a, double b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    T *d = dst + elem_offset(s, i);
    elem<T>::store(d, elem<T>::load(d) * a + b);
  }
}

template <typename T>
__global__ void random_kernel(T *dst, dl_shape_t s, int64_t n, int dist, uint64_t seed,
                              uint64_t offset, double a, double b) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double r = dist == DL_RAND_NORMAL ? a + b * dl_philox_normal(seed, offset + (uint64_t)i)
                                      : a + (b - a) * dl_philox_uniform(seed, offset + (uint64_t)i);
    elem<T>::store(dst + elem_offset(s, i), r);
  }
}

// Contiguous fast paths: no shape struct in the launch (a smaller parameter
// block launches measurably faster) and no index arithmetic.

template <typename T> __global__ void fill_contig_kernel(T *dst, int64_t n, T value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

template <typename TD, typename TS>
__global__ void axpby_contig_kernel(TD *dst, double beta, const TS *src, double alpha, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double s = alpha * elem<TS>::load(src + i);
    elem<TD>::store(dst + i, beta == 0 ? s : beta * elem<TD>::load(dst + i) + s);
  }
}

template <typename T>
__global__ void scale_shift_contig_kernel(T *dst, double a, double b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    elem<T>::store(dst + i, elem<T>::load(dst + i) * a + b);
}

// ---------------------------------------------------------------------------
// launchers

extern "C" int dl_fill_cuda(const dl_view_t *dst, double value, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  uint64_t bits = 0;
  dl_store_f64(&bits, 0, dst->dtype, value);
  int es = dl_dtype_size(dst->dtype);
  if (dl_view_is_contiguous(dst) && (bits == 0 || es == 1)) {
    DL_CUDA_CHECK(cudaMemsetAsync(dst->data, (int)(bits & 0xff), (size_t)(dst->numel * es), st));
    return DL_OK;
  }
  dl_shape_t s = shape_of(dst);
  return dispatch_dtype(dst->dtype, [&]<typename T>() -> int {
    T v;
    memcpy(&v, &bits, sizeof(T));
    if (s.contiguous) {
      fill_contig_kernel<T><<<grid_for(dst->numel), 256, 0, st>>>((T *)dst->data, dst->numel, v);
      DL_CUDA_CHECK_LAUNCH("fill_contig_kernel");
      return DL_OK;
    }
    fill_kernel<T><<<grid_for(dst->numel), 256, 0, st>>>((T *)dst->data, s, dst->numel, v);
    DL_CUDA_CHECK_LAUNCH("fill_kernel");
    return DL_OK;
  });
}

extern "C" int dl_copy_cuda(const dl_view_t *dst, const dl_view_t *src, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  if (dst->dtype == src->dtype && dl_view_is_contiguous(dst) && dl_view_is_contiguous(src)) {
    DL_CUDA_CHECK(cudaMemcpyAsync(dst->data, src->data,
                                  (size_t)(dst->numel * dl_dtype_size(dst->dtype)),
                                  cudaMemcpyDeviceToDevice, st));
    return DL_OK;
  }
  dl_shape_t sd = shape_of(dst), ss = shape_of(src);
  return dispatch_dtype(dst->dtype, [&]<typename TD>() -> int {
    return dispatch_dtype(src->dtype, [&]<typename TS>() -> int {
      copy_kernel<TD, TS><<<grid_for(dst->numel), 256, 0, st>>>((TD *)dst->data, sd,
                                                                (const TS *)src->data, ss,
                                                                dst->numel);
      DL_CUDA_CHECK_LAUNCH("copy_kernel");
      return DL_OK;
    });
  });
}

extern "C" int dl_axpby_cuda(const dl_view_t *dst, double beta, const dl_view_t *src,
                             double alpha, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  dl_shape_t sd = shape_of(dst), ss = shape_of(src);
  return dispatch_dtype(dst->dtype, [&]<typename TD>() -> int {
    return dispatch_dtype(src->dtype, [&]<typename TS>() -> int {
      if (sd.contiguous && ss.contiguous) {
        axpby_contig_kernel<TD, TS><<<grid_for(dst->numel), 256, 0, st>>>(
            (TD *)dst->data, beta, (const TS *)src->data, alpha, dst->numel);
        DL_CUDA_CHECK_LAUNCH("axpby_contig_kernel");
        return DL_OK;
      }
      axpby_kernel<TD, TS><<<grid_for(dst->numel), 256, 0, st>>>(
          (TD *)dst->data, sd, beta, (const TS *)src->data, ss, alpha, dst->numel);
      DL_CUDA_CHECK_LAUNCH("axpby_kernel");
      return DL_OK;
    });
  });
}

extern "C" int dl_mul_cuda(const dl_view_t *dst, const dl_view_t *src, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  dl_shape_t sd = shape_of(dst), ss = shape_of(src);
  return dispatch_dtype(dst->dtype, [&]<typename TD>() -> int {
    return dispatch_dtype(src->dtype, [&]<typename TS>() -> int {
      mul_kernel<TD, TS><<<grid_for(dst->numel), 256, 0, st>>>((TD *)dst->data, sd,
                                                               (const TS *)src->data, ss,
                                                               dst->numel);
      DL_CUDA_CHECK_LAUNCH("mul_kernel");
      return DL_OK;
    });
  });
}

extern "C" int dl_scale_shift_cuda(const dl_view_t *dst, double a, double b, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  dl_shape_t s = shape_of(dst);
  return dispatch_dtype(dst->dtype, [&]<typename T>() -> int {
    if (s.contiguous) {
      scale_shift_contig_kernel<T><<<grid_for(dst->numel), 256, 0, st>>>((T *)dst->data, a, b,
                                                                          dst->numel);
      DL_CUDA_CHECK_LAUNCH("scale_shift_contig_kernel");
      return DL_OK;
    }
    scale_shift_kernel<T><<<grid_for(dst->numel), 256, 0, st>>>((T *)dst->data, s, a, b,
                                                                 dst->numel);
    DL_CUDA_CHECK_LAUNCH("scale_shift_kernel");
    return DL_OK;
  });
}

extern "C" int dl_random_cuda(const dl_view_t *dst, int dist, uint64_t seed, uint64_t offset,
                              double a, double b, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (dst->numel == 0) return DL_OK;
  dl_shape_t s = shape_of(dst);
  return dispatch_dtype(dst->dtype, [&]<typename T>() -> int {
    random_kernel<T><<<grid_for(dst->numel), 256, 0, st>>>((T *)dst->data, s, dst->numel, dist,
                                                           seed, offset, a, b);
    DL_CUDA_CHECK_LAUNCH("random_kernel");
    return DL_OK;
  });
}
