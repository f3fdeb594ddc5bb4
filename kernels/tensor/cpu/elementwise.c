/*
 * elementwise.c — CPU twins of kernels/tensor/elementwise.cu: fill, convert-copy,
 * axpby, scale-shift, multiply and Philox random, over strided views.
 *
 * Values pass through double (dtype.h), so every dtype pair works and the
 * results round exactly as the GPU kernels do. Contiguous same-dtype copies
 * and fills take a memcpy / typed fast path; everything else walks the view
 * with a multi-index. These are also the reference the GPU specs trust.
 */
#include <string.h>

#include "common/dtype.h"
#include "tensor/elementwise.h"
#include "common/philox.h"

/* Element offset (in elements) of row-major index i. */
static int64_t view_offset(const dl_view_t *v, int64_t i) {
  int64_t off = 0;
  for (int d = v->ndim - 1; d >= 0; d--) {
    int64_t n = v->shape[d];
    off += (i % n) * v->strides[d];
    i /= n;
  }
  return off;
}

/* Walks a view in row-major order, keeping the element offset incrementally. */
typedef struct walker {
  const dl_view_t *v;
  int64_t idx[DL_MAX_DIMS];
  int64_t off;
} walker_t;

static void walk_init(walker_t *w, const dl_view_t *v) {
  memset(w, 0, sizeof *w);
  w->v = v;
}

static void walk_next(walker_t *w) {
  const dl_view_t *v = w->v;
  for (int d = v->ndim - 1; d >= 0; d--) {
    w->off += v->strides[d];
    if (++w->idx[d] < v->shape[d]) return;
    w->off -= v->strides[d] * v->shape[d];
    w->idx[d] = 0;
  }
}

int dl_fill_cpu(const dl_view_t *dst, double value, void *stream) {
  (void)stream;
  int es = dl_dtype_size(dst->dtype);
  char one[8];
  dl_store_f64(one, 0, dst->dtype, value);
  static const char zeros[8];
  if (dl_view_is_contiguous(dst)) {
    if (es == 1 || memcmp(one, zeros, (size_t)es) == 0) {
      memset(dst->data, (unsigned char)one[0], (size_t)(dst->numel * es));
      return DL_OK;
    }
    if (es == 2) {
      uint16_t v;
      memcpy(&v, one, 2);
      for (int64_t i = 0; i < dst->numel; i++) ((uint16_t *)dst->data)[i] = v;
    } else if (es == 4) {
      uint32_t v;
      memcpy(&v, one, 4);
      for (int64_t i = 0; i < dst->numel; i++) ((uint32_t *)dst->data)[i] = v;
    } else {
      uint64_t v;
      memcpy(&v, one, 8);
      for (int64_t i = 0; i < dst->numel; i++) ((uint64_t *)dst->data)[i] = v;
    }
    return DL_OK;
  }
  walker_t w;
  walk_init(&w, dst);
  for (int64_t i = 0; i < dst->numel; i++, walk_next(&w)) memcpy(dst->data + w.off * es, one, (size_t)es);
  return DL_OK;
}

int dl_copy_cpu(const dl_view_t *dst, const dl_view_t *src, void *stream) {
  (void)stream;
  if (dst->dtype == src->dtype && dl_view_is_contiguous(dst) && dl_view_is_contiguous(src)) {
    memmove(dst->data, src->data, (size_t)(dst->numel * dl_dtype_size(dst->dtype)));
    return DL_OK;
  }
  walker_t wd, ws;
  walk_init(&wd, dst);
  walk_init(&ws, src);
  for (int64_t i = 0; i < dst->numel; i++, walk_next(&wd), walk_next(&ws))
    dl_store_f64(dst->data, wd.off, dst->dtype, dl_load_f64(src->data, ws.off, src->dtype));
  return DL_OK;
}

int dl_axpby_cpu(const dl_view_t *dst, double beta, const dl_view_t *src, double alpha,
                 void *stream) {
  (void)stream;
  walker_t wd, ws;
  walk_init(&wd, dst);
  walk_init(&ws, src);
  for (int64_t i = 0; i < dst->numel; i++, walk_next(&wd), walk_next(&ws)) {
    double d = dl_load_f64(dst->data, wd.off, dst->dtype);
    double s = dl_load_f64(src->data, ws.off, src->dtype);
    dl_store_f64(dst->data, wd.off, dst->dtype, beta == 0 ? alpha * s : beta * d + alpha * s);
  }
  return DL_OK;
}

int dl_scale_shift_cpu(const dl_view_t *dst, double a, double b, void *stream) {
  (void)stream;
  walker_t w;
  walk_init(&w, dst);
  for (int64_t i = 0; i < dst->numel; i++, walk_next(&w))
    dl_store_f64(dst->data, w.off, dst->dtype, dl_load_f64(dst->data, w.off, dst->dtype) * a + b);
  return DL_OK;
}

int dl_mul_cpu(const dl_view_t *dst, const dl_view_t *src, void *stream) {
  (void)stream;
  walker_t wd, ws;
  walk_init(&wd, dst);
  walk_init(&ws, src);
  for (int64_t i = 0; i < dst->numel; i++, walk_next(&wd), walk_next(&ws)) {
    double d = dl_load_f64(dst->data, wd.off, dst->dtype);
    dl_store_f64(dst->data, wd.off, dst->dtype, d * dl_load_f64(src->data, ws.off, src->dtype));
  }
  return DL_OK;
}

int dl_random_cpu(const dl_view_t *dst, int dist, uint64_t seed, uint64_t offset, double a,
                  double b, void *stream) {
  (void)stream;
  for (int64_t i = 0; i < dst->numel; i++) {
    double r = dist == DL_RAND_NORMAL ? a + b * dl_philox_normal(seed, offset + (uint64_t)i)
                                      : a + (b - a) * dl_philox_uniform(seed, offset + (uint64_t)i);
    dl_store_f64(dst->data, view_offset(dst, i), dst->dtype, r);
  }
  return DL_OK;
}
