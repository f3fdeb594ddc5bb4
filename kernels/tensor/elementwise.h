/*
 * elementwise.h — launchers of the element-wise kernels (fill, convert-copy,
 * axpby, scale-shift, multiply, random) and of their CPU twins, which take
 * the same arguments. Views come from dl_view_of (core/base/internal.h); `stream`
 * is a cudaStream_t (ignored by the twins). Shapes are checked by the core.
 */
#ifndef DISTLAB_ELEMENTWISE_H
#define DISTLAB_ELEMENTWISE_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_TWIN(name, ...)                                                               \
  int name##_cpu(__VA_ARGS__);                                                           \
  int name##_cuda(__VA_ARGS__);

DL_TWIN(dl_fill, const dl_view_t *dst, double value, void *stream)
/* dst and src on the same device; any dtypes; element-wise, row-major order. */
DL_TWIN(dl_copy, const dl_view_t *dst, const dl_view_t *src, void *stream)
DL_TWIN(dl_axpby, const dl_view_t *dst, double beta, const dl_view_t *src, double alpha,
        void *stream)
DL_TWIN(dl_scale_shift, const dl_view_t *dst, double a, double b, void *stream)
DL_TWIN(dl_mul, const dl_view_t *dst, const dl_view_t *src, void *stream)
DL_TWIN(dl_random, const dl_view_t *dst, int dist, uint64_t seed, uint64_t offset, double a,
        double b, void *stream)

#undef DL_TWIN

#ifdef __cplusplus
}
#endif
#endif
