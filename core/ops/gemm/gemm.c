/*
 * gemm.c — dl_gemm: d = alpha * a @ b + beta * c for 2-D tensors. Checks the
 * operands (dtypes, shapes, devices, a unit stride in each matrix, no output
 * overlapping an input), allocates what the caller left out (the output under
 * the current memory tag; on cuda the workspace, DL_GEMM_WORKSPACE_BYTES,
 * under the tag "gemm_workspace", given back stream-ordered after the call;
 * c in place with a 16-bit out: a copy of c, under "gemm_c_copy", made by
 * dl_gemm_lt_run, see gemm_internal.h), and runs cuBLASLt
 * (core/ops/gemm/cublaslt.c) or the CPU twin
 * (kernels/gemm/cpu/gemm.c). On meta it allocates the same and runs nothing.
 */
#include <stdint.h>
#include <string.h>

#include "mem/alloc.h"
#include "base/device.h"
#include "gemm_cublas.h"
#include "gemm_internal.h"
#include "gemm_lt.h"

static int col_major(const dl_view_t *v) {
  return dl_gemm_col_major(v->shape[0], v->shape[1], v->strides[0], v->strides[1]);
}
static int row_major(const dl_view_t *v) {
  return dl_gemm_row_major(v->shape[0], v->shape[1], v->strides[0], v->strides[1]);
}

static int matrix(const char *name, const dl_tensor_t *t, dl_view_t *v) {
  DL_CHECK_ARG(t, "gemm: %s is NULL", name);
  DL_TRY(dl_view_of(t, v));
  DL_CHECK_ARG(v->ndim == 2, "gemm: %s must be 2-D, got %d dimensions", name, v->ndim);
  DL_CHECK_ARG(v->numel == 0 || row_major(v) || col_major(v),
               "gemm: %s has strides (%lld, %lld): a matrix needs a unit stride in one dimension "
               "and the other at least that dimension's size (make it contiguous)", name,
               (long long)v->strides[0], (long long)v->strides[1]);
  return DL_OK;
}

static int same_device(const char *name, const dl_tensor_t *t, const dl_tensor_t *a) {
  DL_CHECK_ARG(t->dev_type == a->dev_type && t->dev_index == a->dev_index,
               "gemm: %s is on %s:%d but a is on %s:%d", name, dl_device_type_name(t->dev_type),
               t->dev_index, dl_device_type_name(a->dev_type), a->dev_index);
  return DL_OK;
}

static dl_gemm_mat_t mat_of(const dl_view_t *v) {
  dl_gemm_mat_t m = {v->data, v->strides[0], v->strides[1], v->dtype};
  return m;
}

/* Checks every operand; *made is the output allocated here (NULL if given). */
static int prepare(const dl_gemm_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
                   dl_tensor_t **out, dl_stream_t *s, dl_gemm_args_t *g, dl_tensor_t **made) {
  dl_view_t va, vb, vd, vc;
  DL_TRY(matrix("a", a, &va));
  DL_TRY(matrix("b", b, &vb));
  DL_TRY(same_device("b", b, a));
  DL_CHECK_ARG(dl_gemm_is_half(va.dtype) && vb.dtype == va.dtype,
               "gemm: a and b must both be bf16 or both f16, got %s and %s",
               dl_dtype_name(va.dtype), dl_dtype_name(vb.dtype));
  DL_CHECK_ARG(va.shape[1] == vb.shape[0], "gemm: a is [%lld, %lld] but b is [%lld, %lld] (a's "
               "columns must equal b's rows)", (long long)va.shape[0], (long long)va.shape[1],
               (long long)vb.shape[0], (long long)vb.shape[1]);
  DL_CHECK_ARG(out, "gemm: the out slot is NULL");
  const int64_t m = va.shape[0], n = vb.shape[1], k = va.shape[1];
  if (!*out) {
    int dt = o->out_dtype < 0 ? va.dtype : o->out_dtype;
    DL_CHECK_ARG(dt == va.dtype || dt == DL_F32,
                 "gemm: out_dtype %s with %s inputs (it must be %s or f32)", dl_dtype_name(dt),
                 dl_dtype_name(va.dtype), dl_dtype_name(va.dtype));
    void *h = NULL;
    DL_TRY(dl_stream_for(s, a->dev_type, a->dev_index, &h));
    const int64_t shape[2] = {m, n};
    DL_TRY(dl_tensor_empty(made, dt, 2, shape, a->dev_type, a->dev_index, s));
    *out = *made;
  }
  DL_TRY(matrix("out", *out, &vd));
  DL_TRY(same_device("out", *out, a));
  DL_CHECK_ARG(vd.dtype == va.dtype || vd.dtype == DL_F32,
               "gemm: out is %s with %s inputs (it must be %s or f32)", dl_dtype_name(vd.dtype),
               dl_dtype_name(va.dtype), dl_dtype_name(va.dtype));
  DL_CHECK_ARG(vd.shape[0] == m && vd.shape[1] == n,
               "gemm: out is [%lld, %lld] but a @ b is [%lld, %lld]", (long long)vd.shape[0],
               (long long)vd.shape[1], (long long)m, (long long)n);
  DL_CHECK_ARG(!dl_gemm_overlaps(&vd, &va) && !dl_gemm_overlaps(&vd, &vb),
               "gemm: out overlaps %s in memory (cuBLASLt would read what it writes)",
               dl_gemm_overlaps(&vd, &va) ? "a" : "b");
  vc = vd;
  if (o->c) {
    DL_TRY(matrix("c", o->c, &vc));
    DL_TRY(same_device("c", o->c, a));
    DL_CHECK_ARG(vc.dtype == vd.dtype && vc.shape[0] == m && vc.shape[1] == n,
                 "gemm: c is %s [%lld, %lld] but out is %s [%lld, %lld]", dl_dtype_name(vc.dtype),
                 (long long)vc.shape[0], (long long)vc.shape[1], dl_dtype_name(vd.dtype),
                 (long long)m, (long long)n);
    const int is_out = vc.data == vd.data && vc.strides[0] == vd.strides[0] &&
                       vc.strides[1] == vd.strides[1];
    DL_CHECK_ARG(is_out || !dl_gemm_overlaps(&vd, &vc), "gemm: c overlaps out without being out itself");
    DL_CHECK_ARG(vd.numel == 0 || (row_major(&vc) && row_major(&vd)) ||
                     (col_major(&vc) && col_major(&vd)),
                 "gemm: c and out must both be row-major or both column-major");
  }
  memset(g, 0, sizeof *g);
  g->m = m;
  g->n = n;
  g->k = k;
  g->a = mat_of(&va);
  g->b = mat_of(&vb);
  g->c = mat_of(&vc);
  g->d = mat_of(&vd);
  g->alpha = o->alpha;
  g->beta = o->beta;
  return DL_OK;
}

static int run_cuda(const dl_gemm_args_t *g, const dl_tensor_t *a, dl_tensor_t *ws,
                    dl_stream_t *s) {
#ifdef DL_WITH_CUDA
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, a->dev_index, &h));
  DL_TRY(dl_cuda_use(a->dev_index));
  if (ws) {
    dl_view_t vw;
    DL_TRY(dl_tensor_arg(ws, "gemm workspace", DL_CUDA, a->dev_index, "gemm", &vw));
    const int64_t bytes = vw.numel * dl_dtype_size(vw.dtype);
    DL_CHECK_ARG(bytes >= DL_GEMM_WORKSPACE_BYTES,
                 "gemm: the workspace holds %lld bytes, it needs %d", (long long)bytes,
                 DL_GEMM_WORKSPACE_BYTES);
    return dl_gemm_lt_run(g, a->dev_index, vw.data, bytes, h);
  }
  dl_storage_t *st = NULL;
  DL_TRY(dl_mem_tag_push("gemm_workspace"));
  int rc = dl_storage_new(DL_CUDA, a->dev_index, DL_GEMM_WORKSPACE_BYTES, h, &st);
  dl_mem_tag_pop();
  if (rc) return dl_error_context(rc, "gemm: allocating the workspace");
  rc = dl_gemm_lt_run(g, a->dev_index, st->ptr, DL_GEMM_WORKSPACE_BYTES, h);
  dl_storage_release(st); /* stream-ordered: the next user of the block queues after us */
  return rc;
#else
  (void)g, (void)a, (void)ws, (void)s;
  return DL_ERR(DL_EUNSUPPORTED, "gemm on cuda needs a CUDA build (no nvcc at build time)");
#endif
}

int dl_gemm_meta_charge(int dev_index, int64_t ws_bytes, int64_t copy_bytes) {
  dl_storage_t *ws = NULL, *cs = NULL;
  int rc = DL_OK;
  if (ws_bytes > 0) {
    DL_TRY(dl_mem_tag_push("gemm_workspace"));
    rc = dl_storage_new(DL_META, dev_index, ws_bytes, NULL, &ws);
    dl_mem_tag_pop();
  }
  if (!rc && copy_bytes > 0) {
    rc = dl_mem_tag_push("gemm_c_copy"); /* the tag's id, >= 0, or an error */
    if (rc >= 0) {
      rc = dl_storage_new(DL_META, dev_index, copy_bytes, NULL, &cs);
      dl_mem_tag_pop();
    }
  }
  if (cs) dl_storage_release(cs);
  if (ws) dl_storage_release(ws);
  return rc < 0 ? rc : DL_OK;
}

int dl_gemm(const dl_gemm_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
            dl_tensor_t **out, dl_stream_t *s) {
  DL_CHECK_ARG(o, "gemm: opts is NULL");
  dl_gemm_args_t g;
  dl_tensor_t *made = NULL;
  int rc = prepare(o, a, b, out, s, &g, &made);
  if (!rc && o->workspace && a->dev_type == DL_CPU)
    rc = DL_ERR(DL_EINVAL, "gemm: a workspace is for cuda (and meta, which counts it); a is on cpu");
  /* meta data pointers are all NULL: a c of a storage of its own is not out */
  if (!rc && a->dev_type == DL_META)
    rc = dl_gemm_meta_charge(a->dev_index, o->workspace ? 0 : DL_GEMM_WORKSPACE_BYTES,
                             g.k && !(o->c && o->c->storage != (*out)->storage)
                                 ? dl_gemm_c_copy_bytes(&g) : 0);
  if (!rc && a->dev_type == DL_CPU) rc = dl_gemm_cpu(&g, NULL);
  if (!rc && a->dev_type == DL_CUDA && g.m && g.n && g.k == 0) {
    /* an empty sum (cuBLASLt refuses k = 0): out = beta * c */
    if (o->beta == 0) {
      rc = dl_tensor_fill(*out, 0, s);
    } else {
      if (o->c && o->c != *out) rc = dl_tensor_copy(*out, o->c, s);
      if (!rc) rc = dl_tensor_scale_shift(*out, o->beta, 0, s);
    }
  } else if (!rc && a->dev_type == DL_CUDA && g.m && g.n) {
    rc = run_cuda(&g, a, o->workspace, s);
  }
  if (rc && made) {
    dl_tensor_free(made);
    *out = NULL;
  }
  return rc;
}

int dl_gemm_stats(dl_gemm_stats_t *out) {
  DL_CHECK_ARG(out, "dl_gemm_stats: out is NULL");
  memset(out, 0, sizeof *out);
#ifdef DL_WITH_CUDA
  dl_gemm_lt_stats(out);
  dl_gemm_cublas_stats(out);
#endif
  dl_gemm_grouped_stats(out);
  return DL_OK;
}
