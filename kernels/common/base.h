/*
 * base.h — the one core header a kernel includes: status codes and dtypes
 * (the ABI header), error setting and propagation, the strided view that
 * kernels take, and CUDA error checks for the launchers. C and CUDA (nvcc)
 * both include it. Core internals (tensors, allocator, communicators) stay
 * in core/; core/base/internal.h adds what only the core uses.
 */
#ifndef DISTLAB_KERNELS_BASE_H
#define DISTLAB_KERNELS_BASE_H

#include "distlab.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the per-thread message (printf format, " at file:line" appended) and
 * returns code, so `return dl_set_error(DL_EINVAL, __FILE__, __LINE__, ...)`. */
int dl_set_error(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefix the current message with "what: " (context while propagating). */
int dl_error_context(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DL_ERR(code, ...) dl_set_error((code), __FILE__, __LINE__, __VA_ARGS__)

/* Propagate a negative status from a call that has already set the message. */
#define DL_TRY(expr)                                                                     \
  do {                                                                                   \
    int dl_try_rc_ = (expr);                                                             \
    if (dl_try_rc_ < 0) return dl_try_rc_;                                               \
  } while (0)

#define DL_CHECK_ARG(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) return DL_ERR(DL_EINVAL, __VA_ARGS__);                                  \
  } while (0)

/* Kernels and the core see tensors as this: a raw pointer already advanced by
 * the offset, and strides in elements. ndim may be 0 (a scalar). */
enum { DL_MAX_DIMS = 8 };
typedef struct dl_view {
  char *data;
  int dtype;
  int ndim;
  int64_t numel;
  int64_t shape[DL_MAX_DIMS];
  int64_t strides[DL_MAX_DIMS];
} dl_view_t;

/* Row-major contiguous (size-1 dims may have any stride). */
static inline int dl_view_is_contiguous(const dl_view_t *v) {
  int64_t expect = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (v->shape[d] != 1 && v->strides[d] != expect) return 0;
    expect *= v->shape[d];
  }
  return 1;
}

#ifdef __cplusplus
}
#endif

/* CUDA error propagation for the core and the launchers. */
#if defined(DL_WITH_CUDA) || defined(__CUDACC__)
#include <cuda_runtime_api.h>
#define DL_CUDA_CHECK(expr)                                                              \
  do {                                                                                   \
    cudaError_t dl_cu_err_ = (expr);                                                     \
    if (dl_cu_err_ != cudaSuccess) {                                                     \
      (void)cudaGetLastError();                                                          \
      return dl_set_error(DL_ECUDA, __FILE__, __LINE__, "%s failed: %s (%s)", #expr,     \
                          cudaGetErrorString(dl_cu_err_), cudaGetErrorName(dl_cu_err_)); \
    }                                                                                    \
  } while (0)
/* After a <<<>>> launch. */
#define DL_CUDA_CHECK_LAUNCH(name)                                                       \
  do {                                                                                   \
    cudaError_t dl_cu_err_ = cudaGetLastError();                                         \
    if (dl_cu_err_ != cudaSuccess)                                                       \
      return dl_set_error(DL_ECUDA, __FILE__, __LINE__, "launch of %s failed: %s", name, \
                          cudaGetErrorString(dl_cu_err_));                               \
  } while (0)
#endif

#endif
