/*
 * gemm_internal.h — what dl_gemm (core/ops/gemm/gemm.c), dl_gemm_grouped
 * (core/ops/gemm/grouped.c) and their cuBLASLt calls share: the operand
 * checks, so all refuse the same layouts with the same words on every device,
 * and the size of the copy of c that an in-place 16-bit GEMM runs on.
 */
#ifndef DISTLAB_GEMM_INTERNAL_H
#define DISTLAB_GEMM_INTERNAL_H

#include <stdint.h>

#include "base/internal.h"
#include "gemm/gemm.h"

static inline int dl_gemm_is_half(int dt) { return dt == DL_BF16 || dt == DL_F16; }

/* [lo, hi): the bytes a view touches (an empty view touches none). */
static inline void dl_gemm_extent(const dl_view_t *v, uintptr_t *lo, uintptr_t *hi) {
  int64_t a = 0, b = 0;
  for (int d = 0; d < v->ndim; d++) {
    int64_t span = (v->shape[d] - 1) * v->strides[d];
    if (span < 0) a += span;
    else b += span;
  }
  const int es = dl_dtype_size(v->dtype);
  *lo = (uintptr_t)v->data + (uintptr_t)(a * es);
  *hi = v->numel ? (uintptr_t)v->data + (uintptr_t)((b + 1) * es) : *lo;
}

static inline int dl_gemm_overlaps(const dl_view_t *x, const dl_view_t *y) {
  if (!x->data || !y->data || !x->numel || !y->numel) return 0;
  uintptr_t xl, xh, yl, yh;
  dl_gemm_extent(x, &xl, &xh);
  dl_gemm_extent(y, &yl, &yh);
  return xl < yh && yl < xh;
}

/* An r x c matrix with element strides rs, cs: column-major-like (unit row
 * stride, columns apart by at least a column) or row-major-like, what
 * cuBLAS(Lt) takes without a copy. A size-1 dimension takes any stride. */
static inline int dl_gemm_col_major(int64_t r, int64_t c, int64_t rs, int64_t cs) {
  return (rs == 1 || r == 1) && (c == 1 || cs >= (r > 1 ? r : 1));
}
static inline int dl_gemm_row_major(int64_t r, int64_t c, int64_t rs, int64_t cs) {
  return (cs == 1 || c == 1) && (r == 1 || rs >= (c > 1 ? c : 1));
}

/* c in place (c is d) with a 16-bit d and beta != 0: cuBLASLt 13.1 on an H200 rounded such
 * calls twice, d = bf16(bf16(a @ b) + c) (1024x512x768 bf16: 18976 of 786432 elements an ulp
 * off, 2026-11-29), while the same algorithm with c in a buffer of its own was right. So
 * dl_gemm_lt_run gives cuBLASLt a stream-ordered copy of c, under "gemm_c_copy": these bytes
 * of it (every matrix of a batch; 0: no copy), which meta charges as well. */
static inline int64_t dl_gemm_c_copy_bytes(const dl_gemm_args_t *g) {
  if (g->beta == 0 || g->c.data != g->d.data || !dl_gemm_is_half(g->d.dtype) || !g->m || !g->n)
    return 0;
  const int64_t last = (g->batch > 1 ? (g->batch - 1) * g->sc : 0) + (g->m - 1) * g->c.rs +
                       (g->n - 1) * g->c.cs;
  return (last + 1) * dl_dtype_size(g->c.dtype);
}

/* meta: what a cuda call would take, charged and given back, both held at once so the peak
 * counts them: ws_bytes under "gemm_workspace", copy_bytes (the copy of c) under "gemm_c_copy";
 * 0: none (core/ops/gemm/gemm.c) */
int dl_gemm_meta_charge(int dev_index, int64_t ws_bytes, int64_t copy_bytes);

/* The grouped GEMM's counters (core/ops/gemm/grouped.c), for dl_gemm_stats. */
void dl_gemm_grouped_stats(dl_gemm_stats_t *out);

#endif
