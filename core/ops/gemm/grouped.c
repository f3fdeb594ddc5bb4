/*
 * grouped.c — dl_gemm_grouped: the expert GEMMs of a MoE layer, one GEMM
 * per expert over the rows ep:dispatch grouped by expert (distlab.h says
 * which three GEMMs and which layouts).
 *
 * Every call: check the operands (dtypes, shapes, devices, a unit stride in
 * each matrix, no output overlapping an input), bring the counts to the host
 * and check them (each within the rows an expert has, or their sum within
 * the packed rows), allocate what the caller left out (out under the current
 * memory tag; on cuda and meta the workspace, DL_GEMM_WORKSPACE_BYTES plus
 * the pointer arrays, under "gemm_workspace", given back stream-ordered),
 * then describe each expert's GEMM as dl_gemm's arguments (pointers and
 * element strides, transposes as swapped strides: no copies) and run them:
 *   cpu   the fp64 twin, the loop's GEMMs (batches as below) one after the
 *         other (kernels/gemm/cpu/gemm_grouped.c)
 *   meta  nothing (out and the workspace are charged, and when the loop
 *         accumulates into a 16-bit out, the copy of c that it takes: copy_bound)
 *   cuda  backend CUBLAS: one cublasGemmGroupedBatchedEx (core/ops/gemm/cublas.c);
 *         backend LOOP: one cuBLASLt GEMM per expert through dl_gemm's
 *         algorithm cache (core/ops/gemm/cublaslt.c), consecutive experts of
 *         one shape with evenly spaced operands as one strided-batched GEMM
 *         (uniform counts: a single call, what torch.bmm runs; its algorithm
 *         the fastest of cuBLASLt's first 8 at its first call, which may
 *         round up to 1 element in 256 differently from the first, unless
 *         DISTLAB_GEMM_TUNE says otherwise, cublaslt_tune.c), on `streams`
 *         side streams that wait for the calling stream and that it waits
 *         for afterwards (the largest GEMM first, each to the stream with
 *         the least work so far; each stream its slice of the workspace);
 *         0 or 1: the calling stream alone.
 * Experts with no rows run nothing; in the weight gradient their dW is
 * zeroed (left as it is when accumulating), since no GEMM writes it.
 *
 * AUTO is LOOP. cuBLAS's grouped GEMM (warp-level MMA, as NVIDIA described
 * it at 12.5) ran at 0.44-0.98x the loop's cuBLASLt GEMMs (warp-group MMA) at
 * every one of the 48 rows of experiments/results/gemm/grouped-h200.md
 * (DeepSeek-V3 expert shapes, 8 and 32 experts, uniform and skewed counts,
 * forward and both backward GEMMs), skewed counts included, where the rule
 * before (CUBLAS unless every GEMM fills the SMs) took it at half speed. It
 * stays as backend CUBLAS, chosen only by name.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "gemm_internal.h"
#include "grouped_int.h"
#include "mem/alloc.h"
#include "tensor/elementwise.h"


int64_t dl_gemm_grouped_workspace_bytes(int64_t groups) {
  const int64_t ptrs = (3 * (groups > 0 ? groups : 0) * (int64_t)sizeof(void *) + PTR_ALIGN - 1) /
                       PTR_ALIGN * PTR_ALIGN;
  return ptrs + DL_GEMM_WORKSPACE_BYTES;
}

/* ---- operands ------------------------------------------------------------- */

/* Rows grouped by expert: expert-major [E, R, cols] (experts > 0) or packed
 * [T, cols] (experts = 0, cap = T). */
typedef struct rows {
  const char *name;
  char *data;
  int dtype;
  int64_t experts, cap, cols;
  int64_t es, rs, cs; /* expert, row and column strides, in elements */
} rows_t;

static int rows_of(const char *fn, const char *name, const dl_view_t *v, rows_t *r) {
  DL_CHECK_ARG(v->ndim == 2 || v->ndim == 3, "%s: %s must be [E, R, columns] (expert-major) or "
               "[T, columns] (packed), got %d dimensions", fn, name, v->ndim);
  const int x = v->ndim == 3;
  *r = (rows_t){name, v->data, v->dtype, x ? v->shape[0] : 0, v->shape[x], v->shape[x + 1],
                x ? v->strides[0] : 0, v->strides[x], v->strides[x + 1]};
  DL_CHECK_ARG(v->numel == 0 || dl_gemm_row_major(r->cap, r->cols, r->rs, r->cs) ||
                   dl_gemm_col_major(r->cap, r->cols, r->rs, r->cs),
               "%s: %s has strides (%lld, %lld) in its last two dimensions: each expert's matrix "
               "needs a unit stride in one of them and the other at least that dimension's size "
               "(make it contiguous)", fn, name, (long long)r->rs, (long long)r->cs);
  return DL_OK;
}

static const char *layout_name(const rows_t *r) { return r->experts ? "expert-major" : "packed"; }

/* The rows of expert e (first row `first` of the packed rows) as a matrix,
 * or its transpose. */
static dl_gemm_mat_t rows_mat(const rows_t *r, int64_t e, int64_t first, int trans) {
  const int64_t at = r->experts ? e * r->es : first * r->rs;
  dl_gemm_mat_t m = {r->data + at * dl_dtype_size(r->dtype), trans ? r->cs : r->rs,
                     trans ? r->rs : r->cs, r->dtype};
  return m;
}

/* w [E, K, N] (fwd, dgrad) or dw [E, K, N] (wgrad out). */
static int experts_of(const char *fn, const char *name, const dl_view_t *v) {
  DL_CHECK_ARG(v->ndim == 3, "%s: %s must be [E, K, N], got %d dimensions", fn, name, v->ndim);
  DL_CHECK_ARG(v->numel == 0 ||
                   dl_gemm_row_major(v->shape[1], v->shape[2], v->strides[1], v->strides[2]) ||
                   dl_gemm_col_major(v->shape[1], v->shape[2], v->strides[1], v->strides[2]),
               "%s: %s has strides (%lld, %lld) in its last two dimensions: each expert's matrix "
               "needs a unit stride in one of them and the other at least that dimension's size "
               "(make it contiguous)", fn, name, (long long)v->strides[1],
               (long long)v->strides[2]);
  return DL_OK;
}

static int same_device(const char *fn, const char *name, const dl_tensor_t *t,
                       const dl_tensor_t *a, const char *aname) {
  DL_CHECK_ARG(t->dev_type == a->dev_type && t->dev_index == a->dev_index,
               "%s: %s is on %s:%d but %s is on %s:%d", fn, name, dl_device_type_name(t->dev_type),
               t->dev_index, aname, dl_device_type_name(a->dev_type), a->dev_index);
  return DL_OK;
}

/* ---- counts --------------------------------------------------------------- */

#ifdef DL_WITH_CUDA
static pthread_mutex_t counts_mu = PTHREAD_MUTEX_INITIALIZER;
static void *pinned; /* DL_GEMM_GROUPED_MAX int64s, for the counts' trip to the host */

/* n counts of es bytes each at dev_ptr, after the work queued on stream. */
static int counts_from_device(const char *fn, const void *dev_ptr, int64_t n, int es,
                              void *stream, void *host) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  DL_CUDA_CHECK(cudaStreamIsCapturing((cudaStream_t)stream, &cs));
  DL_CHECK_ARG(cs == cudaStreamCaptureStatusNone, "%s: counts on cuda cannot be read inside a CUDA "
               "graph capture (pass them as a cpu tensor or a Lua list: a graph replays the "
               "counts it was captured with)", fn);
  pthread_mutex_lock(&counts_mu);
  int rc = DL_OK;
  cudaEvent_t ev = NULL;
  if (!pinned && cudaMallocHost(&pinned, DL_GEMM_GROUPED_MAX * sizeof(int64_t)) != cudaSuccess) {
    pinned = NULL;
    rc = DL_ERR(DL_ECUDA, "%s: cudaMallocHost for the counts failed: %s", fn,
                cudaGetErrorString(cudaGetLastError()));
  }
  if (!rc && (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
              cudaMemcpyAsync(pinned, dev_ptr, (size_t)n * es, cudaMemcpyDeviceToHost,
                              (cudaStream_t)stream) != cudaSuccess ||
              cudaEventRecord(ev, (cudaStream_t)stream) != cudaSuccess))
    rc = DL_ERR(DL_ECUDA, "%s: reading the counts back: %s", fn,
                cudaGetErrorString(cudaGetLastError()));
  /* polled, so that a stream stuck upstream (a dispatch waiting for a peer) ends in an error */
  const double t0 = dl_now_us(), limit = dl_timeout_s();
  cudaError_t q = cudaSuccess;
  while (!rc && (q = cudaEventQuery(ev)) == cudaErrorNotReady) {
    if (dl_now_us() - t0 > limit * 1e6)
      rc = DL_ERR(DL_ETIMEOUT, "%s: the counts on cuda were not ready within %.1f s (the work "
                  "that writes them is stuck; DISTLAB_TIMEOUT sets the limit)", fn, limit);
    else
      dl_wait_pause(t0);
  }
  if (!rc && q != cudaSuccess)
    rc = DL_ERR(DL_ECUDA, "%s: reading the counts back: %s", fn, cudaGetErrorString(q));
  if (!rc) memcpy(host, pinned, (size_t)n * es);
  if (ev) cudaEventDestroy(ev);
  (void)cudaGetLastError();
  pthread_mutex_unlock(&counts_mu);
  return rc;
}
#endif

/* The counts on the host (*cnt, E of them; NULL on meta, where a counts
 * tensor holds no values), and E. */
static int read_counts(const char *fn, const dl_gemm_grouped_opts_t *o, const dl_tensor_t *a,
                       void *stream, int64_t **cnt, int64_t *E) {
  *cnt = NULL;
  if (o->host_counts) {
    DL_CHECK_ARG(o->groups >= 0 && o->groups <= DL_GEMM_GROUPED_MAX, "%s: %lld counts (0..%d "
                 "experts)", fn, (long long)o->groups, DL_GEMM_GROUPED_MAX);
    *E = o->groups;
    *cnt = malloc(sizeof(int64_t) * (size_t)(*E > 0 ? *E : 1));
    if (!*cnt) return DL_ERR(DL_ENOMEM, "%s: out of host memory", fn);
    memcpy(*cnt, o->host_counts, sizeof(int64_t) * (size_t)*E);
    return DL_OK;
  }
  DL_CHECK_ARG(o->counts, "%s: no counts (a tensor or host counts)", fn);
  dl_view_t v;
  DL_TRY(dl_view_of(o->counts, &v));
  DL_CHECK_ARG(v.ndim == 1 && (v.dtype == DL_I32 || v.dtype == DL_I64), "%s: counts must be int32 "
               "or int64 [E], got %s with %d dimensions", fn, dl_dtype_name(v.dtype), v.ndim);
  DL_CHECK_ARG(v.shape[0] <= DL_GEMM_GROUPED_MAX, "%s: counts has %lld entries (at most %d "
               "experts)", fn, (long long)v.shape[0], DL_GEMM_GROUPED_MAX);
  const int on_a = o->counts->dev_type == a->dev_type && o->counts->dev_index == a->dev_index;
  DL_CHECK_ARG(o->counts->dev_type == DL_CPU || on_a, "%s: counts is on %s:%d; it must be on cpu "
               "or on %s:%d with the inputs", fn, dl_device_type_name(o->counts->dev_type),
               o->counts->dev_index, dl_device_type_name(a->dev_type), a->dev_index);
  *E = v.shape[0];
  if (o->counts->dev_type == DL_META) return DL_OK;
  DL_CHECK_ARG(v.shape[0] <= 1 || v.strides[0] == 1, "%s: counts must be contiguous", fn);
  int64_t *c = malloc(sizeof(int64_t) * (size_t)(*E > 0 ? *E : 1));
  if (!c) return DL_ERR(DL_ENOMEM, "%s: out of host memory", fn);
  const int es = dl_dtype_size(v.dtype);
  const void *src = v.data;
  void *raw = c; /* int32 counts land in the first half, then widen back to front */
  int rc = DL_OK;
#ifdef DL_WITH_CUDA
  if (o->counts->dev_type == DL_CUDA && *E > 0) {
    rc = dl_cuda_use(o->counts->dev_index);
    if (!rc) rc = counts_from_device(fn, src, *E, es, stream, raw);
  } else
#endif
  if (*E > 0) {
    (void)stream;
    memcpy(raw, src, (size_t)*E * es);
  }
  if (!rc && v.dtype == DL_I32)
    for (int64_t e = *E - 1; e >= 0; e--) c[e] = ((const int32_t *)raw)[e];
  if (rc) {
    free(c);
    return rc;
  }
  *cnt = c;
  return DL_OK;
}

/* Each count within what x's layout holds. */
static int check_counts(const char *fn, const int64_t *cnt, int64_t E, const rows_t *x) {
  int64_t sum = 0;
  for (int64_t e = 0; e < E; e++) {
    DL_CHECK_ARG(cnt[e] >= 0, "%s: the count of expert %lld of %lld (1-based) is %lld; counts "
                 "must be >= 0", fn, (long long)e + 1, (long long)E, (long long)cnt[e]);
    DL_CHECK_ARG(!x->experts || cnt[e] <= x->cap, "%s: the count of expert %lld of %lld (1-based) "
                 "is %lld, more than the %lld rows per expert of %s [%lld, %lld, %lld]", fn,
                 (long long)e + 1, (long long)E, (long long)cnt[e], (long long)x->cap, x->name,
                 (long long)x->experts, (long long)x->cap, (long long)x->cols);
    sum += cnt[e];
  }
  DL_CHECK_ARG(x->experts || sum <= x->cap, "%s: the counts sum to %lld, more than the %lld rows "
               "of %s (packed [T, %lld])", fn, (long long)sum, (long long)x->cap, x->name,
               (long long)x->cols);
  return DL_OK;
}

/* ---- the call's GEMMs ---------------------------------------------------- */

static void plan_free(plan_t *p) {
  free(p->g);
  free(p->empty);
  memset(p, 0, sizeof *p);
}

/* x: the rows operand a; y: b's rows (wgrad) ; w: b's view (fwd, dgrad);
 * d: out as rows (fwd, dgrad) or its view (wgrad). */
static int plan_make(int op, const int64_t *cnt, int64_t E, const rows_t *x, const rows_t *y,
                     const dl_view_t *w, const rows_t *drows, const dl_view_t *dw, double beta,
                     plan_t *p) {
  memset(p, 0, sizeof *p);
  p->g = calloc((size_t)(E > 0 ? E : 1), sizeof *p->g);
  p->empty = calloc((size_t)(E > 0 ? E : 1), sizeof *p->empty);
  if (!p->g || !p->empty) {
    plan_free(p);
    return DL_ERR(DL_ENOMEM, "%s: out of host memory for %lld experts", dl_grouped_op_name(op),
                  (long long)E);
  }
  int64_t first = 0;
  for (int64_t e = 0; e < E; first += cnt[e], e++) {
    dl_gemm_args_t g;
    memset(&g, 0, sizeof g);
    g.alpha = 1;
    g.beta = beta;
    if (op == DL_GEMM_WGRAD) {
      /* dW_e [K, N] = X_e^T [K, m_e] dY_e [m_e, N] */
      if (cnt[e] == 0) {
        p->empty[p->n_empty++] = e;
        continue;
      }
      g.m = x->cols, g.n = y->cols, g.k = cnt[e];
      g.a = rows_mat(x, e, first, 1);
      g.b = rows_mat(y, e, first, 0);
      g.d = (dl_gemm_mat_t){dw->data + e * dw->strides[0] * dl_dtype_size(dw->dtype),
                            dw->strides[1], dw->strides[2], dw->dtype};
    } else {
      if (cnt[e] == 0) continue;
      /* fwd: Y_e = X_e W_e, W_e [K, N]; dgrad: dX_e = dY_e W_e^T, W_e^T [N, K] */
      const int t = op == DL_GEMM_DGRAD;
      g.m = cnt[e], g.k = x->cols, g.n = t ? w->shape[1] : w->shape[2];
      g.a = rows_mat(x, e, first, 0);
      g.b = (dl_gemm_mat_t){w->data + e * w->strides[0] * dl_dtype_size(w->dtype),
                            t ? w->strides[2] : w->strides[1], t ? w->strides[1] : w->strides[2],
                            w->dtype};
      g.d = rows_mat(drows, e, first, 0);
    }
    g.c = g.d;
    if (g.m > 0 && g.n > 0) p->g[p->n++] = g; /* an empty result: nothing to run */
  }
  return DL_OK;
}

/* meta: the most that cuda's loop takes for the copy of c (dl_gemm_lt_run, gemm_internal.h)
 * when it accumulates into a 16-bit out: all of out, which every expert in one strided batch
 * (uniform counts) copies; other counts copy one GEMM's or batch's part at a time. (Backend
 * cublas, which has no C apart from out, refuses that case: check_out.) */
static int64_t copy_bound(const dl_gemm_grouped_opts_t *o, const dl_view_t *vd) {
  if (!o->accumulate || !dl_gemm_is_half(vd->dtype)) return 0;
  uintptr_t lo, hi;
  dl_gemm_extent(vd, &lo, &hi);
  return (int64_t)(hi - lo);
}

/* ---- the call ---------------------------------------------------------------- */

/* What the call's operands say: E, the rows operands, the output's shape. */
typedef struct call {
  rows_t x, y, d;          /* a's rows; b's rows (wgrad); out's rows (fwd, dgrad) */
  dl_view_t va, vb, vd;
  int64_t E;
  int nd;                  /* dimensions of out, and its shape */
  int64_t shape[3];
} call_t;

static int check_inputs(const dl_gemm_grouped_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
                        int64_t E_counts, call_t *c) {
  const char *fn = dl_grouped_op_name(o->op);
  const int wg = o->op == DL_GEMM_WGRAD;
  const char *an = o->op == DL_GEMM_DGRAD ? "dy" : "x", *bn = wg ? "dy" : "w";
  DL_CHECK_ARG(a, "%s: %s is NULL", fn, an);
  DL_CHECK_ARG(b, "%s: %s is NULL", fn, bn);
  DL_TRY(dl_view_of(a, &c->va));
  DL_TRY(dl_view_of(b, &c->vb));
  DL_TRY(same_device(fn, bn, b, a, an));
  DL_CHECK_ARG(dl_gemm_is_half(c->va.dtype) && c->vb.dtype == c->va.dtype, "%s: %s and %s must "
               "both be bf16 or both f16, got %s and %s", fn, an, bn, dl_dtype_name(c->va.dtype),
               dl_dtype_name(c->vb.dtype));
  DL_TRY(rows_of(fn, an, &c->va, &c->x));
  if (wg) {
    DL_TRY(rows_of(fn, bn, &c->vb, &c->y));
    DL_CHECK_ARG(c->x.experts == c->y.experts && c->x.cap == c->y.cap, "%s: x is %s with %lld "
                 "rows%s but dy is %s with %lld rows%s (the same rows, laid out alike)", fn,
                 layout_name(&c->x), (long long)c->x.cap, c->x.experts ? " per expert" : "",
                 layout_name(&c->y), (long long)c->y.cap, c->y.experts ? " per expert" : "");
    c->E = c->x.experts ? c->x.experts : E_counts;
    c->nd = 3;
    c->shape[0] = c->E, c->shape[1] = c->x.cols, c->shape[2] = c->y.cols;
  } else {
    DL_TRY(experts_of(fn, bn, &c->vb));
    c->E = c->vb.shape[0];
    const int64_t K = c->vb.shape[1], N = c->vb.shape[2];
    const int64_t want = o->op == DL_GEMM_FWD ? K : N, give = o->op == DL_GEMM_FWD ? N : K;
    DL_CHECK_ARG(c->x.cols == want, "%s: %s has %lld columns but w is [%lld, %lld, %lld] (it "
                 "must have %lld: w's %s)", fn, an, (long long)c->x.cols, (long long)c->E,
                 (long long)K, (long long)N, (long long)want, o->op == DL_GEMM_FWD ? "K" : "N");
    DL_CHECK_ARG(want > 0, "%s: w is [%lld, %lld, %lld]: the sums over its %s would be empty "
                 "(fill out with zeros instead)", fn, (long long)c->E, (long long)K, (long long)N,
                 o->op == DL_GEMM_FWD ? "K rows" : "N columns");
    c->nd = c->va.ndim;
    for (int d = 0; d < c->nd - 1; d++) c->shape[d] = c->va.shape[d];
    c->shape[c->nd - 1] = give;
  }
  if (c->x.experts)
    DL_CHECK_ARG(c->x.experts == c->E, "%s: %s has %lld experts but %s %lld", fn, an,
                 (long long)c->x.experts, wg ? "the counts have" : "w has", (long long)c->E);
  DL_CHECK_ARG(E_counts == c->E, "%s: the counts have %lld entries but %s %lld experts", fn,
               (long long)E_counts, wg ? an : "w has", (long long)c->E);
  return DL_OK;
}

static int check_out(const dl_gemm_grouped_opts_t *o, const dl_tensor_t *a, dl_tensor_t **out,
                     dl_stream_t *s, call_t *c, dl_tensor_t **made) {
  const char *fn = dl_grouped_op_name(o->op);
  DL_CHECK_ARG(out, "%s: the out slot is NULL", fn);
  DL_CHECK_ARG(*out || !o->accumulate, "%s: accumulate adds into out: give out", fn);
  if (!*out) {
    const int dt = o->out_dtype < 0 ? c->va.dtype : o->out_dtype;
    DL_CHECK_ARG(dt == c->va.dtype || dt == DL_F32, "%s: out_dtype %s with %s inputs (it must be "
                 "%s or f32)", fn, dl_dtype_name(dt), dl_dtype_name(c->va.dtype),
                 dl_dtype_name(c->va.dtype));
    DL_TRY(dl_tensor_empty(made, dt, c->nd, c->shape, a->dev_type, a->dev_index, s));
    *out = *made;
  }
  DL_TRY(dl_view_of(*out, &c->vd));
  DL_TRY(same_device(fn, "out", *out, a, o->op == DL_GEMM_DGRAD ? "dy" : "x"));
  DL_CHECK_ARG(c->vd.dtype == c->va.dtype || c->vd.dtype == DL_F32, "%s: out is %s with %s inputs "
               "(it must be %s or f32)", fn, dl_dtype_name(c->vd.dtype), dl_dtype_name(c->va.dtype),
               dl_dtype_name(c->va.dtype));
  /* cuBLAS's grouped GEMM has no C apart from its D: into a 16-bit out it rounds a@b, then + c
   * (26% of bf16 elements off on an H200, CUDA 13.0), so it is refused rather than wrong */
  DL_CHECK_ARG(!(o->accumulate && o->backend == DL_GEMM_GROUPED_CUBLAS &&
                 dl_gemm_is_half(c->vd.dtype)),
               "%s: backend cublas cannot accumulate into a %s out (cuBLAS's grouped GEMM reads c "
               "from the out it writes and rounds twice): take backend loop (the default) or an "
               "f32 out", fn, dl_dtype_name(c->vd.dtype));
  const int64_t *want = c->shape;
  int same = c->vd.ndim == c->nd;
  for (int d = 0; same && d < c->nd; d++) same = c->vd.shape[d] == want[d];
  if (!same) {
    char have[96] = "", need[96] = "";
    for (int d = 0; d < c->vd.ndim; d++)
      snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "",
               (long long)c->vd.shape[d]);
    for (int d = 0; d < c->nd; d++)
      snprintf(need + strlen(need), sizeof need - strlen(need), "%s%lld", d ? ", " : "",
               (long long)want[d]);
    return DL_ERR(DL_EINVAL, "%s: out is [%s] but must be [%s]", fn, have, need);
  }
  if (o->op == DL_GEMM_WGRAD) DL_TRY(experts_of(fn, "out", &c->vd));
  else DL_TRY(rows_of(fn, "out", &c->vd, &c->d));
  DL_CHECK_ARG(!dl_gemm_overlaps(&c->vd, &c->va) && !dl_gemm_overlaps(&c->vd, &c->vb), "%s: out "
               "overlaps %s in memory (the GEMMs would read what they write)", fn,
               dl_gemm_overlaps(&c->vd, &c->va) ? (o->op == DL_GEMM_DGRAD ? "dy" : "x")
                                                : (o->op == DL_GEMM_WGRAD ? "dy" : "w"));
  return DL_OK;
}

int dl_gemm_grouped(dl_gemm_grouped_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
                    dl_tensor_t **out, dl_stream_t *s) {
  DL_CHECK_ARG(o, "gemm.grouped: opts is NULL");
  DL_CHECK_ARG(o->op >= DL_GEMM_FWD && o->op <= DL_GEMM_WGRAD, "gemm.grouped: op %d (0 fwd, 1 "
               "dgrad, 2 wgrad)", o->op);
  const char *fn = dl_grouped_op_name(o->op);
  DL_CHECK_ARG(o->backend >= DL_GEMM_GROUPED_AUTO && o->backend <= DL_GEMM_GROUPED_LOOP,
               "%s: backend %d (0 auto, 1 cublas, 2 loop)", fn, o->backend);
  DL_CHECK_ARG(o->streams >= 0 && o->streams <= DL_GEMM_GROUPED_MAX_STREAMS, "%s: streams is %d, "
               "outside 0..%d", fn, o->streams, DL_GEMM_GROUPED_MAX_STREAMS);
  DL_CHECK_ARG(a, "%s: %s is NULL", fn, o->op == DL_GEMM_DGRAD ? "dy" : "x");
  o->chosen = DL_GEMM_GROUPED_AUTO;
  void *h = NULL;
  DL_TRY(dl_stream_for(s, a->dev_type, a->dev_index, &h));
  int64_t *cnt = NULL, E = 0;
  DL_TRY(read_counts(fn, o, a, h, &cnt, &E));
  call_t c;
  dl_tensor_t *made = NULL;
  plan_t p = {0};
  int rc = check_inputs(o, a, b, E, &c);
  if (!rc && cnt) rc = check_counts(fn, cnt, E, &c.x);
  if (!rc) rc = check_out(o, a, out, s, &c, &made);
  if (!rc && o->workspace && a->dev_type == DL_CPU)
    rc = DL_ERR(DL_EINVAL, "%s: a workspace is for cuda (and meta, which counts it); x is on cpu", fn);
  if (!rc && a->dev_type == DL_META) {
    rc = dl_gemm_meta_charge(a->dev_index, o->workspace ? 0 : dl_gemm_grouped_workspace_bytes(E),
                             copy_bound(o, &c.vd));
  } else if (!rc) {
    rc = plan_make(o->op, cnt, E, &c.x, &c.y, &c.vb, &c.d, &c.vd, o->accumulate ? 1 : 0, &p);
    if (!rc && a->dev_type == DL_CPU) {
      for (int64_t i = 0; i < p.n_empty && !rc && !o->accumulate; i++) {
        const dl_view_t z = dl_grouped_expert_view(&c.vd, p.empty[i]);
        rc = dl_fill_cpu(&z, 0, NULL);
      }
      /* the loop's GEMMs, batches and all, as cuda's backend LOOP runs them */
      dl_gemm_args_t *u = p.n > 0 ? malloc(sizeof *u * (size_t)p.n) : NULL;
      if (!rc && p.n > 0 && !u) rc = DL_ERR(DL_ENOMEM, "%s: out of host memory", fn);
      if (!rc) rc = dl_gemm_grouped_cpu(u, u ? dl_grouped_coalesce(&p, u) : 0, NULL);
      free(u);
    } else if (!rc) {
#ifdef DL_WITH_CUDA
      rc = dl_grouped_run_cuda(o, &p, a, &c.vd, E, s);
#else
      rc = DL_ERR(DL_EUNSUPPORTED, "%s on cuda needs a CUDA build (no nvcc at build time)", fn);
#endif
    }
    plan_free(&p);
  }
  free(cnt);
  if (rc && made) {
    dl_tensor_free(made);
    *out = NULL;
  }
  return rc;
}
