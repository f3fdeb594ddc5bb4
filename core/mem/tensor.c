/*
 * tensor.c — tensors: creation, strided views over shared storage, and the
 * element-wise ops (copy between devices and dtypes, fill, axpby, scale-shift,
 * multiply, random, compare), each checked here and dispatched to a GPU kernel
 * or its CPU twin (kernels/tensor/elementwise.h). Meta tensors are validated like
 * any other and then nothing runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/device.h"
#include "common/dtype.h"
#include "tensor/elementwise.h"

enum { TENSOR_MAGIC = 0x54544c44 }; /* "DLTT" */

/* ---- views ----------------------------------------------------------------- */

static void drop_dim(dl_view_t *v, int d) {
  for (int k = d; k + 1 < v->ndim; k++) {
    v->shape[k] = v->shape[k + 1];
    v->strides[k] = v->strides[k + 1];
  }
  v->ndim--;
}

void dl_view_coalesce2(dl_view_t *a, dl_view_t *b) {
  for (int d = a->ndim - 1; d >= 0; d--) /* size-1 dims carry no stride information */
    if (a->shape[d] == 1 && a->ndim > 1) {
      drop_dim(a, d);
      if (b) drop_dim(b, d);
    }
  for (int d = a->ndim - 2; d >= 0; d--) {
    int ok = a->strides[d] == a->strides[d + 1] * a->shape[d + 1];
    if (b) ok = ok && b->strides[d] == b->strides[d + 1] * b->shape[d + 1];
    if (!ok) continue;
    a->shape[d] *= a->shape[d + 1];
    a->strides[d] = a->strides[d + 1];
    drop_dim(a, d + 1);
    if (b) {
      b->shape[d] *= b->shape[d + 1];
      b->strides[d] = b->strides[d + 1];
      drop_dim(b, d + 1);
    }
  }
}

void dl_view_coalesce1(dl_view_t *a) { dl_view_coalesce2(a, NULL); }

/* ---- tensors --------------------------------------------------------------- */

int dl_tensor_check(const dl_tensor_t *t) {
  if (!t) return DL_ERR(DL_EINVAL, "tensor is nil");
  if (t->magic != TENSOR_MAGIC) return DL_ERR(DL_ESTATE, "not a distlab tensor (ill-formed or corrupted object)");
  if (!t->storage) return DL_ERR(DL_ESTATE, "use of a freed tensor (t:free() was called on it)");
  return DL_OK;
}

int dl_view_of(const dl_tensor_t *t, dl_view_t *v) {
  DL_TRY(dl_tensor_check(t));
  v->dtype = t->dtype_id;
  v->ndim = t->nd;
  v->numel = 1;
  for (int d = 0; d < t->nd; d++) {
    v->shape[d] = t->sz[d];
    v->strides[d] = t->st[d];
    v->numel *= t->sz[d];
  }
  v->data = t->storage->ptr ? (char *)t->storage->ptr + t->offset * dl_dtype_size(t->dtype_id) : NULL;
  return DL_OK;
}

int dl_tensor_arg(const dl_tensor_t *t, const char *what, int dev_type, int dev_index,
                  const char *owner, dl_view_t *v) {
  DL_CHECK_ARG(t, "%s tensor is NULL", what);
  DL_TRY(dl_view_of(t, v));
  DL_CHECK_ARG(dl_view_is_contiguous(v), "%s tensor must be contiguous", what);
  if (dev_type == DL_META) return DL_OK;
  DL_CHECK_ARG(t->dev_type == dev_type && (dev_type != DL_CUDA || t->dev_index == dev_index),
               "%s tensor is on %s:%d but %s works on %s:%d", what,
               dl_device_type_name(t->dev_type), t->dev_index, owner,
               dl_device_type_name(dev_type), dev_index);
  return DL_OK;
}

int64_t dl_tensor_numel(const dl_tensor_t *t) {
  if (!t || t->magic != TENSOR_MAGIC) return -1;
  int64_t n = 1;
  for (int d = 0; d < t->nd; d++) n *= t->sz[d];
  return n;
}

int dl_tensor_is_contiguous(const dl_tensor_t *t) {
  dl_view_t v;
  if (dl_view_of(t, &v)) return 0;
  return dl_view_is_contiguous(&v);
}

/* Elements of a shape. Its bytes (of esz each, zero sizes left out, since
 * strides multiply the others) must stay under 2^61, so that no byte count,
 * stride or offset computed from it overflows. */
static int check_shape(int ndim, const int64_t *shape, int esz, int64_t *numel) {
  DL_CHECK_ARG(ndim >= 0 && ndim <= 8, "a tensor has 0 to 8 dimensions, got %d", ndim);
  DL_CHECK_ARG(ndim == 0 || shape, "shape is NULL");
  int64_t n = 1, nonzero = 1;
  for (int d = 0; d < ndim; d++) {
    DL_CHECK_ARG(shape[d] >= 0, "negative size %lld in dimension %d", (long long)shape[d], d + 1);
    if (shape[d] && nonzero > ((int64_t)1 << 61) / esz / shape[d]) {
      char dims[200];
      int used = 0;
      for (int e = 0; e < ndim && used < (int)sizeof dims; e++)
        used += snprintf(dims + used, sizeof dims - (size_t)used, "%s%lld", e ? ", " : "",
                         (long long)shape[e]);
      return DL_ERR(DL_EINVAL, "a tensor of shape [%s] with %d-byte elements would take 2^61 "
                    "bytes or more", dims, esz);
    }
    if (shape[d]) nonzero *= shape[d];
    n *= shape[d];
  }
  *numel = n;
  return DL_OK;
}

static dl_tensor_t *tensor_alloc(void) {
  dl_tensor_t *t = calloc(1, sizeof *t);
  if (t) t->magic = TENSOR_MAGIC;
  return t;
}

int dl_tensor_empty(dl_tensor_t **out, int dtype, int ndim, const int64_t *shape, int dev_type,
                    int dev_index, dl_stream_t *stream) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_CHECK_ARG(dtype >= 0 && dtype < DL_NUM_DTYPES, "unknown dtype id %d", dtype);
  int64_t numel;
  DL_TRY(check_shape(ndim, shape, dl_dtype_size(dtype), &numel));
  void *h;
  DL_TRY(dl_stream_for(stream, dev_type, dev_index, &h));
  dl_storage_t *s;
  DL_TRY(dl_storage_new(dev_type, dev_index, numel * dl_dtype_size(dtype), h, &s));
  dl_tensor_t *t = tensor_alloc();
  if (!t) {
    dl_storage_release(s);
    return DL_ERR(DL_ENOMEM, "out of host memory for a tensor");
  }
  t->dtype_id = dtype;
  t->nd = ndim;
  t->dev_type = dev_type;
  t->dev_index = dev_index;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->sz[d] = shape[d];
    t->st[d] = stride;
    stride *= shape[d];
  }
  t->storage = s;
  *out = t;
  return DL_OK;
}

int dl_tensor_as_strided(dl_tensor_t **out, const dl_tensor_t *base, int ndim, const int64_t *shape,
                         const int64_t *strides, int64_t offset) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_TRY(dl_tensor_check(base));
  int64_t numel;
  DL_TRY(check_shape(ndim, shape, dl_dtype_size(base->dtype_id), &numel));
  DL_CHECK_ARG(ndim == 0 || strides, "strides is NULL");
  DL_CHECK_ARG(offset >= 0, "negative storage offset %lld", (long long)offset);
  int64_t last = offset;
  for (int d = 0; d < ndim; d++) {
    DL_CHECK_ARG(strides[d] >= 0, "negative stride %lld in dimension %d", (long long)strides[d],
                 d + 1);
    if (shape[d] > 0) last += (shape[d] - 1) * strides[d];
  }
  int64_t cap = base->storage->nbytes / dl_dtype_size(base->dtype_id);
  if (numel > 0 && last >= cap)
    return DL_ERR(DL_EINVAL, "view reaches element %lld of a storage of %lld elements",
                  (long long)last, (long long)cap);
  dl_tensor_t *t = tensor_alloc();
  if (!t) return DL_ERR(DL_ENOMEM, "out of host memory for a tensor");
  t->dtype_id = base->dtype_id;
  t->nd = ndim;
  t->dev_type = base->dev_type;
  t->dev_index = base->dev_index;
  for (int d = 0; d < ndim; d++) {
    t->sz[d] = shape[d];
    t->st[d] = strides[d];
  }
  t->offset = offset;
  t->storage = base->storage;
  dl_storage_retain(t->storage);
  *out = t;
  return DL_OK;
}

void dl_tensor_free(dl_tensor_t *t) {
  if (!t || t->magic != TENSOR_MAGIC) return;
  dl_storage_release(t->storage);
  t->magic = 0;
  free(t);
}

int dl_tensor_release(dl_tensor_t *t) {
  DL_TRY(dl_tensor_check(t));
  dl_storage_release(t->storage);
  t->storage = NULL;
  return DL_OK;
}

int dl_tensor_data_ptr(const dl_tensor_t *t, void **ptr) {
  DL_CHECK_ARG(ptr, "out is NULL");
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  *ptr = v.data;
  return DL_OK;
}

int dl_tensor_storage_info(const dl_tensor_t *t, int64_t *nbytes, int32_t *refs) {
  DL_TRY(dl_tensor_check(t));
  if (nbytes) *nbytes = t->storage->nbytes;
  if (refs) *refs = t->storage->refs;
  return DL_OK;
}

int dl_tensor_record_stream(dl_tensor_t *t, dl_stream_t *s) {
  DL_TRY(dl_tensor_check(t));
  void *h;
  DL_TRY(dl_stream_for(s, t->dev_type, t->dev_index, &h));
  return dl_storage_record_stream(t->storage, h);
}

/* ---- op plumbing ------------------------------------------------------------ */

/* Checks t, selects its CUDA device, resolves the stream handle. */
static int prepare(const dl_tensor_t *t, dl_stream_t *s, void **h) {
  DL_TRY(dl_tensor_check(t));
#ifdef DL_WITH_CUDA
  if (t->dev_type == DL_CUDA) DL_TRY(dl_cuda_use(t->dev_index));
#endif
  return dl_stream_for(s, t->dev_type, t->dev_index, h);
}

static int same_shape(const dl_tensor_t *a, const dl_tensor_t *b, const char *op) {
  int eq = a->nd == b->nd;
  for (int d = 0; eq && d < a->nd; d++) eq = a->sz[d] == b->sz[d];
  if (eq) return DL_OK;
  char sa[160] = "", sb[160] = "";
  for (int d = 0; d < a->nd; d++)
    snprintf(sa + strlen(sa), sizeof sa - strlen(sa), "%s%lld", d ? ", " : "", (long long)a->sz[d]);
  for (int d = 0; d < b->nd; d++)
    snprintf(sb + strlen(sb), sizeof sb - strlen(sb), "%s%lld", d ? ", " : "", (long long)b->sz[d]);
  return DL_ERR(DL_EINVAL, "%s: shape mismatch, [%s] vs [%s]", op, sa, sb);
}

static int same_device(const dl_tensor_t *a, const dl_tensor_t *b, const char *op) {
  if (a->dev_type == b->dev_type && a->dev_index == b->dev_index) return DL_OK;
  return DL_ERR(DL_EINVAL, "%s: tensors on different devices, %s:%d and %s:%d", op,
                dl_device_type_name(a->dev_type), a->dev_index, dl_device_type_name(b->dev_type), b->dev_index);
}

static int is_float(int dtype) {
  return dtype == DL_F32 || dtype == DL_F16 || dtype == DL_BF16 || dtype == DL_F64;
}

/* Does a writable view overlap (share storage with) a source? Conservative: same storage. */
static int aliases(const dl_tensor_t *dst, const dl_tensor_t *src) {
  return dst->storage == src->storage && !(dst->offset == src->offset && dst->nd == src->nd &&
                                           !memcmp(dst->st, src->st, sizeof(int64_t) * dst->nd));
}

#define DISPATCH(t, name, ...)                                                           \
  ((t)->dev_type == DL_META  ? DL_OK                                                     \
   : (t)->dev_type == DL_CPU ? name##_cpu(__VA_ARGS__)                                   \
                             : CUDA_OR_FAIL(name, __VA_ARGS__))
#ifdef DL_WITH_CUDA
#define CUDA_OR_FAIL(name, ...) name##_cuda(__VA_ARGS__)
#else
#define CUDA_OR_FAIL(name, ...) DL_ERR(DL_ENODEV, "cpu-only build")
#endif

/* ---- copy --------------------------------------------------------------------- */

static int contiguous_like(const dl_tensor_t *like, int dtype, int dev_type, int dev_index,
                           dl_stream_t *s, dl_tensor_t **out) {
  return dl_tensor_empty(out, dtype, like->nd, like->sz, dev_type, dev_index, s);
}

#ifdef DL_WITH_CUDA
/* Copy between two devices where at least one is cuda. Same dtype, both
 * contiguous: one cudaMemcpy. Otherwise convert on the source side into a
 * contiguous staging tensor, move it, and scatter on the destination side. */
static int copy_cross(dl_tensor_t *dst, const dl_tensor_t *src, dl_stream_t *s) {
  void *hs = NULL, *hd = NULL;
  if (src->dev_type == DL_CUDA) DL_TRY(prepare(src, src->dev_index == dst->dev_index || dst->dev_type != DL_CUDA ? s : NULL, &hs));
  if (dst->dev_type == DL_CUDA) DL_TRY(prepare(dst, s, &hd));
  dl_tensor_t *stage_src = NULL, *stage_dst = NULL;
  int rc = DL_OK;
  const dl_tensor_t *from = src;
  if (!dl_tensor_is_contiguous(src) || src->dtype_id != dst->dtype_id) {
    rc = contiguous_like(src, dst->dtype_id, src->dev_type, src->dev_index, hs ? s : NULL, &stage_src);
    if (!rc) rc = dl_tensor_copy(stage_src, src, src->dev_type == DL_CUDA ? s : NULL);
    from = stage_src;
  }
  dl_tensor_t *to = dst;
  if (!rc && !dl_tensor_is_contiguous(dst)) {
    rc = contiguous_like(dst, dst->dtype_id, dst->dev_type, dst->dev_index, hd ? s : NULL, &stage_dst);
    to = stage_dst;
  }
  if (!rc) {
    dl_view_t vf, vt;
    dl_view_of(from, &vf);
    dl_view_of(to, &vt);
    size_t bytes = (size_t)(vt.numel * dl_dtype_size(dst->dtype_id));
    cudaError_t e = cudaSuccess;
    if (from->dev_type == DL_CUDA && to->dev_type == DL_CUDA) {
      dl_cuda_use(to->dev_index);
      e = cudaMemcpyPeerAsync(vt.data, to->dev_index, vf.data, from->dev_index, bytes,
                              (cudaStream_t)hd);
    } else if (to->dev_type == DL_CUDA) {
      dl_cuda_use(to->dev_index);
      e = cudaMemcpyAsync(vt.data, vf.data, bytes, cudaMemcpyHostToDevice, (cudaStream_t)hd);
      if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)hd);
    } else {
      dl_cuda_use(from->dev_index);
      e = cudaMemcpyAsync(vt.data, vf.data, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)hs);
      if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)hs);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      rc = DL_ERR(DL_ECUDA, "copy %s:%d -> %s:%d of %zu bytes: %s", dl_device_type_name(src->dev_type),
                  src->dev_index, dl_device_type_name(dst->dev_type), dst->dev_index, bytes, cudaGetErrorString(e));
    }
  }
  if (!rc && stage_dst) rc = dl_tensor_copy(dst, stage_dst, dst->dev_type == DL_CUDA ? s : NULL);
  if (stage_src && stage_src->dev_type == DL_CUDA && hs != hd) dl_tensor_record_stream(stage_src, s);
  dl_tensor_free(stage_src);
  dl_tensor_free(stage_dst);
  return rc;
}
#endif

int dl_tensor_copy(dl_tensor_t *dst, const dl_tensor_t *src, dl_stream_t *s) {
  DL_TRY(dl_tensor_check(dst));
  DL_TRY(dl_tensor_check(src));
  DL_TRY(same_shape(dst, src, "copy"));
  if (dst->dev_type == DL_META || src->dev_type == DL_META) {
    if (dst->dev_type == src->dev_type) return DL_OK;
    return DL_ERR(DL_EINVAL, "copy between meta and %s: meta tensors hold no data",
                  dl_device_type_name(dst->dev_type == DL_META ? src->dev_type : dst->dev_type));
  }
  if (dst->dev_type != src->dev_type || dst->dev_index != src->dev_index) {
#ifdef DL_WITH_CUDA
    return copy_cross(dst, src, s);
#endif
  }
  if (aliases(dst, src)) { /* overlapping views: go through a temporary */
    dl_tensor_t *tmp;
    DL_TRY(contiguous_like(src, src->dtype_id, src->dev_type, src->dev_index, s, &tmp));
    int rc = dl_tensor_copy(tmp, src, s);
    if (!rc) rc = dl_tensor_copy(dst, tmp, s);
    dl_tensor_free(tmp);
    return rc;
  }
  void *h;
  DL_TRY(prepare(dst, s, &h));
  dl_view_t vd, vs;
  dl_view_of(dst, &vd);
  dl_view_of(src, &vs);
  if (vd.numel == 0) return DL_OK;
  dl_view_coalesce2(&vd, &vs);
  return DISPATCH(dst, dl_copy, &vd, &vs, h);
}

/* ---- element-wise ------------------------------------------------------------- */

int dl_tensor_fill(dl_tensor_t *t, double value, dl_stream_t *s) {
  void *h;
  DL_TRY(prepare(t, s, &h));
  dl_view_t v;
  dl_view_of(t, &v);
  if (v.numel == 0) return DL_OK;
  dl_view_coalesce1(&v);
  return DISPATCH(t, dl_fill, &v, value, h);
}

static int binary_prep(dl_tensor_t *dst, const dl_tensor_t *src, const char *op, dl_stream_t *s,
                       void **h, dl_view_t *vd, dl_view_t *vs) {
  DL_TRY(prepare(dst, s, h));
  DL_TRY(dl_tensor_check(src));
  DL_TRY(same_shape(dst, src, op));
  DL_TRY(same_device(dst, src, op));
  DL_CHECK_ARG(!aliases(dst, src), "%s: the two tensors overlap in memory in different layouts", op);
  dl_view_of(dst, vd);
  dl_view_of(src, vs);
  dl_view_coalesce2(vd, vs);
  return DL_OK;
}

int dl_tensor_axpby(dl_tensor_t *dst, double beta, const dl_tensor_t *src, double alpha,
                    dl_stream_t *s) {
  void *h;
  dl_view_t vd, vs;
  DL_TRY(binary_prep(dst, src, "add", s, &h, &vd, &vs));
  if (vd.numel == 0) return DL_OK;
  return DISPATCH(dst, dl_axpby, &vd, beta, &vs, alpha, h);
}

int dl_tensor_mul(dl_tensor_t *dst, const dl_tensor_t *src, dl_stream_t *s) {
  void *h;
  dl_view_t vd, vs;
  DL_TRY(binary_prep(dst, src, "mul", s, &h, &vd, &vs));
  if (vd.numel == 0) return DL_OK;
  return DISPATCH(dst, dl_mul, &vd, &vs, h);
}

int dl_tensor_scale_shift(dl_tensor_t *dst, double a, double b, dl_stream_t *s) {
  void *h;
  DL_TRY(prepare(dst, s, &h));
  dl_view_t v;
  dl_view_of(dst, &v);
  if (v.numel == 0) return DL_OK;
  dl_view_coalesce1(&v);
  return DISPATCH(dst, dl_scale_shift, &v, a, b, h);
}

int dl_tensor_random(dl_tensor_t *t, int dist, uint64_t seed, uint64_t offset, double a, double b,
                     dl_stream_t *s) {
  void *h;
  DL_TRY(prepare(t, s, &h));
  DL_CHECK_ARG(dist == DL_RAND_UNIFORM || dist == DL_RAND_NORMAL, "unknown distribution %d", dist);
  DL_CHECK_ARG(is_float(t->dtype_id), "random values need a floating-point tensor, got %s",
               dl_dtype_name(t->dtype_id));
  DL_CHECK_ARG(dist != DL_RAND_NORMAL || b >= 0, "normal with negative std %g", b);
  dl_view_t v;
  dl_view_of(t, &v);
  if (v.numel == 0) return DL_OK;
  return DISPATCH(t, dl_random, &v, dist, seed, offset, a, b, h);
}

/* ---- compare ------------------------------------------------------------------ */

int dl_tensor_compare(const dl_tensor_t *a, const dl_tensor_t *b, double atol, double rtol,
                      dl_compare_t *out) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_TRY(dl_tensor_check(a));
  DL_TRY(dl_tensor_check(b));
  DL_TRY(same_shape(a, b, "compare"));
  DL_CHECK_ARG(a->dev_type == DL_CPU && b->dev_type == DL_CPU,
               "compare works on cpu tensors (got %s and %s); copy them with :to('cpu')",
               dl_device_type_name(a->dev_type), dl_device_type_name(b->dev_type));
  dl_view_t va, vb;
  dl_view_of(a, &va);
  dl_view_of(b, &vb);
  memset(out, 0, sizeof *out);
  out->first_not_close = -1;
  int64_t ia[DL_MAX_DIMS] = {0};
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < va.numel; i++) {
    double x = dl_load_f64(va.data, oa, va.dtype), y = dl_load_f64(vb.data, ob, vb.dtype);
    int fx = isfinite(x), fy = isfinite(y);
    if (!fx) out->n_nonfinite_a++;
    if (!fy) out->n_nonfinite_b++;
    int close;
    if (fx && fy) {
      double diff = fabs(x - y);
      out->sum_sq_diff += diff * diff;
      out->sum_sq_ref += y * y;
      if (diff > out->max_abs_diff) out->max_abs_diff = diff;
      close = diff <= atol + rtol * fabs(y);
    } else {
      close = (isnan(x) && isnan(y)) || x == y;
    }
    if (!close) {
      if (out->n_not_close == 0) out->first_not_close = i;
      out->n_not_close++;
    }
    for (int d = va.ndim - 1; d >= 0; d--) {
      oa += va.strides[d];
      ob += vb.strides[d];
      if (++ia[d] < va.shape[d]) break;
      oa -= va.strides[d] * va.shape[d];
      ob -= vb.strides[d] * vb.shape[d];
      ia[d] = 0;
    }
  }
  return DL_OK;
}
