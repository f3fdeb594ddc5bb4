/*
 * tensor_math.c — softmax, argsort, topk, gather, scatter_add and bincount:
 * each checked here (dtypes, shapes, devices, a dim in range; messages name
 * the op and the argument) and dispatched to a GPU kernel or its CPU twin
 * (kernels/tensor/tensor_math.h). topk is argsort, a narrow and a gather.
 * The index ops report an index out of range after the kernel: the twin
 * and the kernel keep the first position of one (the kernel in a device
 * word this file reads back, which waits for the stream). Meta is checked
 * like any device and runs nothing.
 */
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "base/device.h"
#include "tensor/tensor_math.h"

#ifdef DL_WITH_CUDA
#define RUN(t, name, ...) ((t)->dev_type == DL_CPU ? name##_cpu(__VA_ARGS__) : name##_cuda(__VA_ARGS__))
#else
#define RUN(t, name, ...) ((t)->dev_type == DL_CPU ? name##_cpu(__VA_ARGS__) : DL_ERR(DL_ENODEV, "cpu-only build"))
#endif

static int is_float(int dt) { return dt == DL_F32 || dt == DL_F16 || dt == DL_BF16 || dt == DL_F64; }
static int is_index(int dt) { return dt == DL_I64 || dt == DL_I32; }

/* The op's view of tensor t (named `name`), on ref's device. */
static int arg(const char *op, const char *name, const dl_tensor_t *t, const dl_tensor_t *ref, dl_view_t *v) {
  DL_CHECK_ARG(t, "%s: %s is NULL", op, name);
  int rc = dl_view_of(t, v);
  if (rc) return dl_error_context(rc, "%s: %s", op, name);
  if (ref && (t->dev_type != ref->dev_type || t->dev_index != ref->dev_index))
    return DL_ERR(DL_EINVAL, "%s: %s is on %s:%d, the other tensors on %s:%d", op, name,
                  dl_device_type_name(t->dev_type), t->dev_index, dl_device_type_name(ref->dev_type),
                  ref->dev_index);
  return DL_OK;
}

static int dim_arg(const char *op, int dim, const dl_tensor_t *t) {
  DL_CHECK_ARG(t->nd >= 1, "%s: a 0-dimensional tensor has no dimension %d", op, dim + 1);
  DL_CHECK_ARG(dim >= 0 && dim < t->nd, "%s: dimension %d out of range for a %d-dimensional tensor", op, dim + 1,
               t->nd);
  return DL_OK;
}

static void shape_str(char *buf, size_t n, const dl_tensor_t *t) {
  buf[0] = 0;
  for (int d = 0; d < t->nd; d++)
    snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", d ? ", " : "", (long long)t->sz[d]);
}

static int same_shape(const char *op, const char *a, const dl_tensor_t *ta, const char *b, const dl_tensor_t *tb) {
  int eq = ta->nd == tb->nd;
  for (int d = 0; eq && d < ta->nd; d++) eq = ta->sz[d] == tb->sz[d];
  if (eq) return DL_OK;
  char sa[160], sb[160];
  shape_str(sa, sizeof sa, ta);
  shape_str(sb, sizeof sb, tb);
  return DL_ERR(DL_EINVAL, "%s: %s has shape [%s] but %s [%s]", op, a, sa, b, sb);
}

/* Selects t's device and resolves the stream. */
static int prepare(const dl_tensor_t *t, dl_stream_t *s, void **h) {
#ifdef DL_WITH_CUDA
  if (t->dev_type == DL_CUDA) DL_TRY(dl_cuda_use(t->dev_index));
#endif
  return dl_stream_for(s, t->dev_type, t->dev_index, h);
}

/* Same storage in another layout: an op that reads one while writing the other is undefined. */
static int overlap(const dl_tensor_t *a, const dl_tensor_t *b) {
  return a->storage == b->storage &&
         !(a->offset == b->offset && a->nd == b->nd && !memcmp(a->st, b->st, sizeof(int64_t) * a->nd));
}

/* ---- softmax ---------------------------------------------------------------------- */

int dl_tensor_softmax(dl_tensor_t *out, const dl_tensor_t *x, int dim, int log, dl_stream_t *s) {
  const char *op = log ? "log_softmax" : "softmax";
  dl_view_t vo, vx;
  void *h;
  DL_TRY(arg(op, "x", x, NULL, &vx));
  DL_TRY(arg(op, "out", out, x, &vo));
  DL_TRY(dim_arg(op, dim, x));
  DL_CHECK_ARG(is_float(x->dtype_id) && is_float(out->dtype_id), "%s: x and out must be float tensors, got %s and %s",
               op, dl_dtype_name(x->dtype_id), dl_dtype_name(out->dtype_id));
  DL_TRY(same_shape(op, "out", out, "x", x));
  DL_CHECK_ARG(!overlap(out, x), "%s: out overlaps x in another layout", op);
  DL_TRY(prepare(x, s, &h));
  if (x->dev_type == DL_META || vx.numel == 0) return DL_OK;
  return RUN(x, dl_softmax, &vo, &vx, dim, log, h);
}

/* ---- argsort and topk ------------------------------------------------------------------ */

int dl_tensor_argsort(dl_tensor_t *indices, const dl_tensor_t *x, int dim, int descending, dl_stream_t *s) {
  const char *op = "argsort";
  dl_view_t vi, vx;
  void *h;
  DL_TRY(arg(op, "x", x, NULL, &vx));
  DL_TRY(arg(op, "indices", indices, x, &vi));
  DL_TRY(dim_arg(op, dim, x));
  DL_CHECK_ARG(is_index(indices->dtype_id), "%s: indices must be i64 or i32, got %s", op,
               dl_dtype_name(indices->dtype_id));
  DL_CHECK_ARG(x->sz[dim] <= INT32_MAX, "%s: %lld elements along dimension %d; at most 2^31 - 1 are sorted", op,
               (long long)x->sz[dim], dim + 1);
  DL_TRY(same_shape(op, "indices", indices, "x", x));
  DL_CHECK_ARG(indices->storage != x->storage, "%s: indices share x's memory", op);
  DL_TRY(prepare(x, s, &h));
  if (x->dev_type == DL_META || vx.numel == 0) return DL_OK;
  size_t bytes = 0;
  DL_TRY(RUN(x, dl_argsort_workspace, &vx, dim, &bytes));
  dl_storage_t *ws;
  DL_TRY(dl_storage_new(x->dev_type, x->dev_index, (int64_t)bytes, h, &ws));
  int rc = RUN(x, dl_argsort, &vi, &vx, dim, descending, ws->ptr, bytes, h);
  dl_storage_release(ws); /* stream-ordered, as every block */
  return rc;
}

int dl_tensor_topk(dl_tensor_t *values, dl_tensor_t *indices, const dl_tensor_t *x, int64_t k, int dim,
                   int largest, dl_stream_t *s) {
  const char *op = "topk";
  dl_view_t v;
  DL_TRY(arg(op, "x", x, NULL, &v));
  DL_TRY(dim_arg(op, dim, x));
  DL_CHECK_ARG(k >= 0 && k <= x->sz[dim], "%s: k = %lld, but dimension %d has %lld elements", op, (long long)k,
               dim + 1, (long long)x->sz[dim]);
  int64_t want[8];
  memcpy(want, x->sz, sizeof want);
  want[dim] = k;
  dl_tensor_t shaped = *x;
  shaped.sz[dim] = k;
  if (values) {
    DL_TRY(arg(op, "values", values, x, &v));
    DL_CHECK_ARG(values->dtype_id == x->dtype_id, "%s: values must be %s (x's dtype), got %s", op,
                 dl_dtype_name(x->dtype_id), dl_dtype_name(values->dtype_id));
    DL_TRY(same_shape(op, "values", values, "x with k at dim", &shaped));
    DL_CHECK_ARG(!overlap(values, x) && values->storage != x->storage, "%s: values share x's memory", op);
  }
  if (indices) {
    DL_TRY(arg(op, "indices", indices, x, &v));
    DL_CHECK_ARG(is_index(indices->dtype_id), "%s: indices must be i64 or i32, got %s", op,
                 dl_dtype_name(indices->dtype_id));
    DL_TRY(same_shape(op, "indices", indices, "x with k at dim", &shaped));
  }
  dl_tensor_t *perm = NULL, *first = NULL;
  int rc = dl_tensor_empty(&perm, DL_I64, x->nd, x->sz, x->dev_type, x->dev_index, s);
  if (!rc) rc = dl_tensor_argsort(perm, x, dim, largest, s);
  if (!rc) rc = dl_tensor_as_strided(&first, perm, x->nd, want, perm->st, 0);
  if (!rc && indices) rc = dl_tensor_copy(indices, first, s);
  if (!rc && values) rc = dl_tensor_gather(values, x, dim, first, s);
  dl_tensor_free(first);
  dl_tensor_free(perm);
  return rc ? dl_error_context(rc, "%s", op) : DL_OK;
}

/* ---- gather, scatter_add, bincount -------------------------------------------------------- */

/* Index sizes within `limit`'s in every dim (but `skip`). */
static int index_fits(const char *op, const dl_tensor_t *index, const char *name, const dl_tensor_t *limit, int skip) {
  DL_CHECK_ARG(index->nd == limit->nd, "%s: index has %d dimensions but %s has %d", op, index->nd, name, limit->nd);
  for (int d = 0; d < index->nd; d++) {
    if (d == skip || index->sz[d] <= limit->sz[d]) continue;
    char a[160], b[160];
    shape_str(a, sizeof a, index);
    shape_str(b, sizeof b, limit);
    return DL_ERR(DL_EINVAL, "%s: index [%s] is larger than %s [%s] in dimension %d", op, a, name, b, d + 1);
  }
  return DL_OK;
}

/* The word where a kernel records the first bad index: host memory on cpu, a device tensor on cuda. */
typedef struct bad_word {
  uint64_t host;
  dl_tensor_t *dev;
  uint64_t *ptr;
} bad_word_t;

static int bad_new(bad_word_t *b, const dl_tensor_t *like, dl_stream_t *s) {
  memset(b, 0, sizeof *b);
  b->host = UINT64_MAX;
  b->ptr = &b->host;
  if (like->dev_type != DL_CUDA) return DL_OK;
  int64_t one = 1;
  DL_TRY(dl_tensor_empty(&b->dev, DL_I64, 1, &one, like->dev_type, like->dev_index, s));
  int rc = dl_tensor_fill(b->dev, -1, s); /* all ones: UINT64_MAX */
  if (!rc) rc = dl_tensor_data_ptr(b->dev, (void **)&b->ptr);
  if (rc) dl_tensor_free(b->dev);
  return rc;
}

/* The first bad position, or UINT64_MAX (reads the device word back: a sync). */
static int bad_read(bad_word_t *b, dl_stream_t *s, uint64_t *first) {
  int rc = DL_OK;
  if (b->dev) {
    dl_tensor_t *h = NULL;
    int64_t one = 1;
    rc = dl_tensor_empty(&h, DL_I64, 1, &one, DL_CPU, 0, NULL);
    if (!rc) rc = dl_tensor_copy(h, b->dev, s);
    if (!rc) b->host = *(uint64_t *)h->storage->ptr;
    dl_tensor_free(h);
    dl_tensor_free(b->dev);
    b->dev = NULL;
  }
  *first = b->host;
  return rc;
}

/* The index value at row-major position pos of index (on cpu, or read back). */
static int64_t index_value_at(const dl_tensor_t *index, uint64_t pos, dl_stream_t *s) {
  int64_t at[8], off = index->offset, p = (int64_t)pos;
  for (int d = index->nd - 1; d >= 0; d--) {
    at[d] = p % index->sz[d];
    p /= index->sz[d];
    off += at[d] * index->st[d];
  }
  dl_tensor_t *one = NULL, *h = NULL;
  int64_t v = 0;
  if (dl_tensor_as_strided(&one, index, 0, NULL, NULL, off)) return 0;
  if (!dl_tensor_empty(&h, DL_I64, 0, NULL, DL_CPU, 0, NULL) && !dl_tensor_copy(h, one, s))
    v = *(int64_t *)h->storage->ptr;
  dl_tensor_free(h);
  dl_tensor_free(one);
  return v;
}

static int report_bad(const char *op, const dl_tensor_t *index, uint64_t first, int64_t size, int dim,
                      dl_stream_t *s) {
  if (first == UINT64_MAX) return DL_OK;
  return DL_ERR(DL_EINVAL, "%s: index %lld at position %llu (row-major) of index is out of range for dimension %d "
                "of size %lld", op, (long long)index_value_at(index, first, s), (unsigned long long)first, dim + 1,
                (long long)size);
}

int dl_tensor_gather(dl_tensor_t *out, const dl_tensor_t *x, int dim, const dl_tensor_t *index, dl_stream_t *s) {
  const char *op = "gather";
  dl_view_t vo, vx, vi;
  void *h;
  DL_TRY(arg(op, "x", x, NULL, &vx));
  DL_TRY(arg(op, "index", index, x, &vi));
  DL_TRY(arg(op, "out", out, x, &vo));
  DL_TRY(dim_arg(op, dim, x));
  DL_CHECK_ARG(is_index(index->dtype_id), "%s: index must be i64 or i32, got %s", op, dl_dtype_name(index->dtype_id));
  DL_CHECK_ARG(out->dtype_id == x->dtype_id, "%s: out must be %s (x's dtype), got %s", op, dl_dtype_name(x->dtype_id),
               dl_dtype_name(out->dtype_id));
  DL_TRY(index_fits(op, index, "x", x, dim));
  DL_TRY(same_shape(op, "out", out, "index", index));
  DL_CHECK_ARG(out->storage != x->storage && out->storage != index->storage, "%s: out shares memory with x or index",
               op);
  DL_TRY(prepare(x, s, &h));
  if (x->dev_type == DL_META || vi.numel == 0) return DL_OK;
  bad_word_t bad;
  DL_TRY(bad_new(&bad, x, s));
  int rc = RUN(x, dl_gather, &vo, &vx, dim, &vi, bad.ptr, h);
  uint64_t first;
  int rc2 = bad_read(&bad, s, &first);
  if (rc) return rc;
  DL_TRY(rc2);
  return report_bad(op, index, first, x->sz[dim], dim, s);
}

int dl_tensor_scatter_add(dl_tensor_t *dst, int dim, const dl_tensor_t *index, const dl_tensor_t *src,
                          dl_stream_t *s) {
  const char *op = "scatter_add";
  dl_view_t vd, vi, vs;
  void *h;
  DL_TRY(arg(op, "dst", dst, NULL, &vd));
  DL_TRY(arg(op, "index", index, dst, &vi));
  DL_TRY(arg(op, "src", src, dst, &vs));
  DL_TRY(dim_arg(op, dim, dst));
  DL_CHECK_ARG(is_index(index->dtype_id), "%s: index must be i64 or i32, got %s", op, dl_dtype_name(index->dtype_id));
  DL_CHECK_ARG(src->dtype_id == dst->dtype_id, "%s: src is %s but dst %s (one dtype)", op,
               dl_dtype_name(src->dtype_id), dl_dtype_name(dst->dtype_id));
  DL_TRY(index_fits(op, index, "src", src, -1));
  DL_TRY(index_fits(op, index, "dst", dst, dim));
  DL_CHECK_ARG(dst->storage != src->storage && dst->storage != index->storage,
               "%s: dst shares memory with src or index", op);
  DL_TRY(prepare(dst, s, &h));
  if (dst->dev_type == DL_META || vi.numel == 0) return DL_OK;
  bad_word_t bad;
  DL_TRY(bad_new(&bad, dst, s));
  int rc = RUN(dst, dl_scatter_add, &vd, dim, &vi, &vs, bad.ptr, h);
  uint64_t first;
  int rc2 = bad_read(&bad, s, &first);
  if (rc) return rc;
  DL_TRY(rc2);
  return report_bad(op, index, first, dst->sz[dim], dim, s);
}

int dl_tensor_bincount(dl_tensor_t *out, const dl_tensor_t *x, const dl_tensor_t *weights, dl_stream_t *s) {
  const char *op = "bincount";
  dl_view_t vo, vx, vw;
  void *h;
  DL_TRY(arg(op, "x", x, NULL, &vx));
  DL_TRY(arg(op, "out", out, x, &vo));
  DL_CHECK_ARG(is_index(x->dtype_id) || x->dtype_id == DL_U8, "%s: x must be i64, i32 or u8, got %s", op,
               dl_dtype_name(x->dtype_id));
  DL_CHECK_ARG(out->nd == 1, "%s: out must be 1-dimensional (one count a value), got %d dimensions", op, out->nd);
  if (weights) {
    DL_TRY(arg(op, "weights", weights, x, &vw));
    DL_TRY(same_shape(op, "weights", weights, "x", x));
    DL_CHECK_ARG(is_float(weights->dtype_id), "%s: weights must be a float tensor, got %s", op,
                 dl_dtype_name(weights->dtype_id));
    DL_CHECK_ARG(out->dtype_id == DL_F32 || out->dtype_id == DL_F64, "%s: out must be f32 or f64 with weights, got %s",
                 op, dl_dtype_name(out->dtype_id));
  } else {
    DL_CHECK_ARG(is_index(out->dtype_id), "%s: out must be i64 or i32 (counts), got %s", op,
                 dl_dtype_name(out->dtype_id));
  }
  DL_CHECK_ARG(out->storage != x->storage && (!weights || out->storage != weights->storage),
               "%s: out shares memory with x or weights", op);
  DL_TRY(prepare(x, s, &h));
  if (x->dev_type == DL_META || vx.numel == 0 || vo.numel == 0) return DL_OK;
  return RUN(x, dl_bincount, &vo, &vx, weights ? &vw : NULL, h);
}
