/*
 * reduce.cu — the reduction of n buffers on the GPU, for communicators that
 * move data through symmetric buffers (core/comm/comm_ipc.c): element i of
 * the output is src[0][i] (red) src[1][i] ... (red) src[n-1][i], taken over
 * the buffers in the order given, so every rank that reduces the same
 * buffers in the same order gets bitwise the same result. sum, avg, max,
 * min over every dtype; integers wrap; bf16/fp16 are summed in fp32 and
 * rounded once with the project's conversions (common/dtype.h), exactly as
 * the CPU twin kernels/comm/cpu/reduce.c does, which the communicator specs
 * compare against (the same sums on the cpu and cuda devices).
 *
 * A grid-stride loop of one element a thread: the communicator's buffers are
 * small and this runs where ranks share a GPU, a correctness mode.
 */
#include "comm/reduce.h"
#include "common/dtype.h"

struct reduce_srcs {
  const char *p[DL_REDUCE_MAX_SRCS];
};

// ---- element types: load to the accumulation type, store back ---------------

template <typename T> struct acc_of {
  typedef T A;
  __device__ static A load(T x) { return x; }
  __device__ static T store(A a) { return a; }
  __device__ static A add(A a, A b) { return a + b; }
};
template <> struct acc_of<int32_t> {
  typedef int32_t A;
  __device__ static A load(int32_t x) { return x; }
  __device__ static int32_t store(A a) { return a; }
  __device__ static A add(A a, A b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
};
template <> struct acc_of<int64_t> {
  typedef int64_t A;
  __device__ static A load(int64_t x) { return x; }
  __device__ static int64_t store(A a) { return a; }
  __device__ static A add(A a, A b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
};
template <> struct acc_of<uint8_t> {
  typedef uint8_t A;
  __device__ static A load(uint8_t x) { return x; }
  __device__ static uint8_t store(A a) { return a; }
  __device__ static A add(A a, A b) { return (uint8_t)(a + b); }
};
struct bf16_bits {
  uint16_t x;
};
struct f16_bits {
  uint16_t x;
};
template <> struct acc_of<bf16_bits> {
  typedef float A;
  __device__ static A load(bf16_bits v) { return dl_bf16_to_f32(v.x); }
  __device__ static bf16_bits store(A a) { return bf16_bits{dl_f32_to_bf16(a)}; }
  __device__ static A add(A a, A b) { return a + b; }
};
template <> struct acc_of<f16_bits> {
  typedef float A;
  __device__ static A load(f16_bits v) { return dl_f16_to_f32(v.x); }
  __device__ static f16_bits store(A a) { return f16_bits{dl_f32_to_f16(a)}; }
  __device__ static A add(A a, A b) { return a + b; }
};

// ---- kernel -------------------------------------------------------------------

template <typename T>
__global__ void reduce_kernel(T *dst, reduce_srcs s, int n, int64_t k, int red) {
  typedef acc_of<T> E;
  typedef typename E::A A;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < k;
       i += (int64_t)gridDim.x * blockDim.x) {
    A a = E::load(((const T *)s.p[0])[i]);
    // unrolled over the most sources, so s.p is indexed by constants (a run-time
    // index would copy the parameter to local memory in every thread)
#pragma unroll
    for (int j = 1; j < DL_REDUCE_MAX_SRCS; j++) {
      if (j >= n) break;
      A b = E::load(((const T *)s.p[j])[i]);
      if (red == DL_RED_MAX) a = b > a ? b : a;
      else if (red == DL_RED_MIN) a = b < a ? b : a;
      else a = E::add(a, b);
    }
    dst[i] = E::store(red == DL_RED_AVG ? (A)(a / (A)n) : a);
  }
}

// ---- launcher -----------------------------------------------------------------

template <typename T>
static int launch(void *dst, const reduce_srcs &s, int n, int64_t k, int red, cudaStream_t st) {
  const int threads = 256;
  int64_t blocks = (k + threads - 1) / threads;
  if (blocks > 1024) blocks = 1024;
  reduce_kernel<T><<<(unsigned)blocks, threads, 0, st>>>((T *)dst, s, n, k, red);
  DL_CUDA_CHECK_LAUNCH("reduce_kernel");
  return DL_OK;
}

extern "C" int dl_reduce_cuda(void *dst, char *const *src, int n, int64_t k, int dtype, int red,
                              void *stream) {
  DL_CHECK_ARG(n >= 1 && n <= DL_REDUCE_MAX_SRCS, "reduce: %d sources (1 to %d)", n,
               (int)DL_REDUCE_MAX_SRCS);
  if (k <= 0) return DL_OK;
  reduce_srcs s = {};
  for (int j = 0; j < n; j++) s.p[j] = src[j];
  cudaStream_t st = (cudaStream_t)stream;
  switch (dtype) {
  case DL_F32: return launch<float>(dst, s, n, k, red, st);
  case DL_F64: return launch<double>(dst, s, n, k, red, st);
  case DL_I32: return launch<int32_t>(dst, s, n, k, red, st);
  case DL_I64: return launch<int64_t>(dst, s, n, k, red, st);
  case DL_U8: return launch<uint8_t>(dst, s, n, k, red, st);
  case DL_BF16: return launch<bf16_bits>(dst, s, n, k, red, st);
  case DL_F16: return launch<f16_bits>(dst, s, n, k, red, st);
  default: return DL_ERR(DL_EINVAL, "reduce: dtype %d", dtype);
  }
}
