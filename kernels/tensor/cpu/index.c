/*
 * index.c — CPU twins of kernels/tensor/index.cu: gather, scatter_add and
 * bincount over strided views, in row-major order of the index (of x for
 * bincount). Sums go through fp64 and round once to the destination's dtype
 * (bf16/f16: as the GPU's fp32 add, since a sum of two of them is exact in
 * fp64 and rounds through fp32 alike); integers add with wrap-around, as
 * the GPU's atomics. These are the reference the GPU specs compare with.
 */
#include <string.h>

#include "tensor/tensor_math.h"

static int64_t load_index(const dl_view_t *ix, int64_t off) {
  return ix->dtype == DL_I64 ? ((const int64_t *)ix->data)[off] : ((const int32_t *)ix->data)[off];
}

/* Advances a row-major multi-index over shape. */
static void next_index(int64_t *idx, const int64_t *shape, int ndim) {
  for (int d = ndim - 1; d >= 0; d--) {
    if (++idx[d] < shape[d]) return;
    idx[d] = 0;
  }
}

static int64_t dot(const int64_t *idx, const int64_t *strides, int ndim, int skip) {
  int64_t off = 0;
  for (int d = 0; d < ndim; d++)
    if (d != skip) off += idx[d] * strides[d];
  return off;
}

/* dst[i] += src[j], each add rounded to the dtype (integers wrap). */
static void add_into(char *dst, int64_t i, const char *src, int64_t j, int dtype) {
  switch (dtype) {
  case DL_I64: ((int64_t *)dst)[i] = (int64_t)((uint64_t)((int64_t *)dst)[i] + (uint64_t)((const int64_t *)src)[j]); break;
  case DL_I32: ((int32_t *)dst)[i] = (int32_t)((uint32_t)((int32_t *)dst)[i] + (uint32_t)((const int32_t *)src)[j]); break;
  case DL_U8: ((uint8_t *)dst)[i] = (uint8_t)(((uint8_t *)dst)[i] + ((const uint8_t *)src)[j]); break;
  default: dl_store_f64(dst, i, dtype, dl_load_f64(dst, i, dtype) + dl_load_f64(src, j, dtype));
  }
}

int dl_gather_cpu(const dl_view_t *out, const dl_view_t *x, int dim, const dl_view_t *index, uint64_t *bad,
                  void *stream) {
  (void)stream;
  int esz = dl_dtype_size(x->dtype), nd = index->ndim;
  int64_t idx[DL_MAX_DIMS] = {0};
  for (int64_t i = 0; i < index->numel; i++, next_index(idx, index->shape, nd)) {
    char *o = out->data + dot(idx, out->strides, nd, -1) * esz;
    int64_t v = load_index(index, dot(idx, index->strides, nd, -1));
    if (v < 0 || v >= x->shape[dim]) {
      if ((uint64_t)i < *bad) *bad = (uint64_t)i;
      memset(o, 0, (size_t)esz);
      continue;
    }
    memcpy(o, x->data + (dot(idx, x->strides, nd, dim) + v * x->strides[dim]) * esz, (size_t)esz);
  }
  return DL_OK;
}

int dl_scatter_add_cpu(const dl_view_t *dst, int dim, const dl_view_t *index, const dl_view_t *src, uint64_t *bad,
                       void *stream) {
  (void)stream;
  int nd = index->ndim;
  int64_t idx[DL_MAX_DIMS] = {0};
  for (int64_t i = 0; i < index->numel; i++, next_index(idx, index->shape, nd)) {
    int64_t v = load_index(index, dot(idx, index->strides, nd, -1));
    if (v < 0 || v >= dst->shape[dim]) {
      if ((uint64_t)i < *bad) *bad = (uint64_t)i;
      continue;
    }
    add_into(dst->data, dot(idx, dst->strides, nd, dim) + v * dst->strides[dim], src->data,
             dot(idx, src->strides, nd, -1), dst->dtype);
  }
  return DL_OK;
}

int dl_bincount_cpu(const dl_view_t *out, const dl_view_t *x, const dl_view_t *weights, void *stream) {
  (void)stream;
  int nd = x->ndim;
  int64_t idx[DL_MAX_DIMS] = {0}, n = out->shape[0], st = out->strides[0];
  for (int64_t i = 0; i < x->numel; i++, next_index(idx, x->shape, nd)) {
    int64_t off = dot(idx, x->strides, nd, -1);
    int64_t v = x->dtype == DL_U8 ? ((const uint8_t *)x->data)[off] : load_index(x, off);
    if (v < 0 || v >= n) continue;
    if (!weights) {
      if (out->dtype == DL_I64) ((int64_t *)out->data)[v * st] += 1;
      else ((int32_t *)out->data)[v * st] += 1;
      continue;
    }
    double w = dl_load_f64(weights->data, dot(idx, weights->strides, nd, -1), weights->dtype);
    dl_store_f64(out->data, v * st, out->dtype, dl_load_f64(out->data, v * st, out->dtype) + w);
  }
  return DL_OK;
}
