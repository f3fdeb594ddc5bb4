/*
 * rows.h — the CPU twins' rows (tensor_math.h says what a row is): where row
 * r starts, r a row-major index over the dims other than dim. The cuda side's
 * is dl_row_base in kernels/tensor/rows.cuh.
 */
#ifndef DISTLAB_TENSOR_CPU_ROWS_H
#define DISTLAB_TENSOR_CPU_ROWS_H

#include "tensor/tensor_math.h"

static inline int64_t dl_row_base_cpu(const dl_view_t *v, int dim, int64_t r) {
  int64_t off = 0;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (d == dim) continue;
    off += (r % v->shape[d]) * v->strides[d];
    r /= v->shape[d];
  }
  return off;
}

#endif
