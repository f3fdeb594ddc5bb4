/*
 * tensor_math.h — launchers of the kernels behind the math a reference
 * needs (softmax, argsort, gather, scatter_add, bincount) and of their CPU
 * twins, which take the same arguments: kernels/tensor/{softmax,sort,index}.cu
 * and kernels/tensor/cpu/{softmax,sort,index}.c. The core (core/mem/tensor_math.c)
 * checks shapes, dtypes and devices; these take strided views (dl_view_of)
 * and `dim`, 0-based; `stream` is a cudaStream_t, ignored by the twins.
 *
 * A "row" is the line of elements along dim at one index of the other
 * dims. Index tensors are DL_I64 or DL_I32. `bad` (device memory on cuda,
 * host memory on cpu) starts at UINT64_MAX; a kernel that meets an index out
 * of range there keeps the smallest row-major position of one in it and
 * leaves that element alone (gather writes 0).
 */
#ifndef DISTLAB_TENSOR_MATH_H
#define DISTLAB_TENSOR_MATH_H

#include <stddef.h>

#include "common/base.h"
#include "common/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_TWIN(name, ...)                                                               \
  int name##_cpu(__VA_ARGS__);                                                           \
  int name##_cuda(__VA_ARGS__);

/* out := softmax (log: log_softmax) of every row of x; float dtypes, out and
 * x of the same shape (out may be x). Twins in fp64; cuda in fp32 (fp64 for
 * f64), one warp a row. */
DL_TWIN(dl_softmax, const dl_view_t *out, const dl_view_t *x, int dim, int log, void *stream)

/* Bytes of workspace dl_argsort needs for x along dim. */
DL_TWIN(dl_argsort_workspace, const dl_view_t *x, int dim, size_t *bytes)
/* idx := stable sorting permutation of every row of x (ascending, or
 * descending). The order is that of dl_sort_key (a 64-bit key per value:
 * NaN above +inf, -0 = +0), so both twins sort the same keys. cuda: CUB's
 * segmented stable sort on keys gathered into the workspace. */
DL_TWIN(dl_argsort, const dl_view_t *idx, const dl_view_t *x, int dim, int descending, void *workspace,
        size_t workspace_bytes, void *stream)

/* out[i] := x[i with i[dim] = index[i]]; out and index of one shape, out
 * and x of one dtype (bytes are moved, not converted). */
DL_TWIN(dl_gather, const dl_view_t *out, const dl_view_t *x, int dim, const dl_view_t *index, uint64_t *bad,
        void *stream)
/* dst[i with i[dim] = index[i]] += src[i] for every i of index; one dtype,
 * each add rounded to it (bf16/f16 through fp32). cuda: atomics. */
DL_TWIN(dl_scatter_add, const dl_view_t *dst, int dim, const dl_view_t *index, const dl_view_t *src,
        uint64_t *bad, void *stream)
/* out[x[i]] += 1, or weights[i] (weights NULL or shaped like x), for x[i]
 * in [0, out->numel); out 1-D. cuda: atomics. */
DL_TWIN(dl_bincount, const dl_view_t *out, const dl_view_t *x, const dl_view_t *weights, void *stream)

#undef DL_TWIN

#ifdef __cplusplus
}
#endif

/* The 64-bit sort key of a value: ascending keys are ascending values, NaN
 * (any) the largest, -0 and +0 one key. Integers keep every bit. */
DL_HD uint64_t dl_sort_key_f64(double v) {
  if (v != v) return 0xfff8000000000000ull; /* the key of +NaN */
  if (v == 0) v = 0.0;
  uint64_t u;
  memcpy(&u, &v, 8);
  return (u >> 63) ? ~u : u | 0x8000000000000000ull;
}
DL_HD uint64_t dl_sort_key_i64(int64_t v) { return (uint64_t)v ^ 0x8000000000000000ull; }

#endif
