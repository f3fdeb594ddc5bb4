/*
 * rows.cuh — what the tensor math kernels share: the addressing of a
 * strided view as rows (the elements along one dim at each index of the
 * others) and as elements over a shape with several views' strides, plus a
 * grid size. Internal to kernels/tensor/*.cu.
 */
#ifndef DISTLAB_TENSOR_ROWS_CUH
#define DISTLAB_TENSOR_ROWS_CUH

#include "common/base.h"

/* The dims of a view other than `dim`: a row index -> the row's first element. */
struct dl_rows_t {
  int nd;
  int64_t shape[DL_MAX_DIMS];
  int64_t strides[DL_MAX_DIMS];
};

static inline dl_rows_t dl_rows_of(const dl_view_t *v, int dim) {
  dl_rows_t r = {};
  for (int d = 0; d < v->ndim; d++) {
    if (d == dim) continue;
    r.shape[r.nd] = v->shape[d];
    r.strides[r.nd++] = v->strides[d];
  }
  return r;
}

__device__ __forceinline__ int64_t dl_row_base(const dl_rows_t &r, int64_t row) {
  int64_t off = 0;
  for (int d = r.nd - 1; d >= 0; d--) {
    off += (row % r.shape[d]) * r.strides[d];
    row /= r.shape[d];
  }
  return off;
}

static inline int dl_grid_for(int64_t n, int per_block) {
  int64_t b = (n + per_block - 1) / per_block;
  return (int)(b < 1 ? 1 : b > 16384 ? 16384 : b);
}

#endif
