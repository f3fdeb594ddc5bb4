/*
 * sort.c — CPU twin of kernels/tensor/sort.cu: the stable sorting
 * permutation of every row (the elements along dim) of a strided view. Each
 * row's (key, position) pairs (dl_sort_key: the keys the GPU sorts) are
 * sorted by key, then position, which is the stable order; descending sorts
 * the complemented keys, so equal values keep their order there too.
 */
#include <stdlib.h>

#include "tensor/cpu/rows.h"
#include "tensor/tensor_math.h"

typedef struct pair {
  uint64_t key;
  int64_t pos;
} pair_t;

static int by_key_then_pos(const void *a, const void *b) {
  const pair_t *p = a, *q = b;
  if (p->key != q->key) return p->key < q->key ? -1 : 1;
  return (p->pos > q->pos) - (p->pos < q->pos);
}


static uint64_t key_at(const dl_view_t *x, int64_t off) {
  switch (x->dtype) {
  case DL_I64: return dl_sort_key_i64(((const int64_t *)x->data)[off]);
  case DL_I32: return dl_sort_key_i64(((const int32_t *)x->data)[off]);
  case DL_U8: return dl_sort_key_i64(((const uint8_t *)x->data)[off]);
  default: return dl_sort_key_f64(dl_load_f64(x->data, off, x->dtype));
  }
}

int dl_argsort_workspace_cpu(const dl_view_t *x, int dim, size_t *bytes) {
  *bytes = sizeof(pair_t) * (size_t)(x->shape[dim] ? x->shape[dim] : 1);
  return DL_OK;
}

int dl_argsort_cpu(const dl_view_t *idx, const dl_view_t *x, int dim, int descending, void *workspace,
                   size_t workspace_bytes, void *stream) {
  (void)stream;
  int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
  DL_CHECK_ARG(workspace_bytes >= sizeof(pair_t) * (size_t)n, "argsort: workspace of %zu bytes, %zu needed",
               workspace_bytes, sizeof(pair_t) * (size_t)n);
  pair_t *p = workspace;
  for (int64_t r = 0; r < rows; r++) {
    int64_t bx = dl_row_base_cpu(x, dim, r), bi = dl_row_base_cpu(idx, dim, r);
    for (int64_t j = 0; j < n; j++) {
      uint64_t k = key_at(x, bx + j * x->strides[dim]);
      p[j].key = descending ? ~k : k;
      p[j].pos = j;
    }
    qsort(p, (size_t)n, sizeof *p, by_key_then_pos);
    for (int64_t j = 0; j < n; j++) {
      int64_t o = bi + j * idx->strides[dim];
      if (idx->dtype == DL_I64) ((int64_t *)idx->data)[o] = p[j].pos;
      else ((int32_t *)idx->data)[o] = (int32_t)p[j].pos;
    }
  }
  return DL_OK;
}
