/*
 * attn.c — the core side of attention: checks the tensors of one attention
 * step or merge (dtype, device, shape per layout, contiguous last dim) with
 * messages that name the argument, turns them into the raw-pointer params of
 * kernels/attn.h, allocates what the caller left NULL (outputs, and the
 * backward's workspace under the current memory tag), makes freshly
 * allocated thd outputs defined outside the sequences (out, dq, dk, dv zero;
 * lse -inf), and runs the CUDA kernel or its CPU twin on the stream given.
 * On meta it allocates and runs nothing, so peak memory can be read.
 *
 * cu_seqlens contents are checked (non-decreasing, every sequence inside its
 * tensor) wherever they are read on the host: always on cpu, and on cuda
 * when max_seqlen_* is not given (the kernels need the largest length).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "attn.h"
#include "device.h"

static const char *layout_names[] = {"bshd", "sbhd", "thd"};

/* ---- operands ---------------------------------------------------------------- */

/* A [b, s, h, d] operand (thd: b = 0, s = rows) or an lse ([b, h, s] / [h, t]). */
typedef struct operand {
  int64_t b, s, h, d;
  dl_attn_strides_t st;
  void *ptr;
} operand_t;

static int present(const char *op, const char *name, const dl_tensor_t *t) {
  if (!t) return DL_ERR(DL_EINVAL, "%s: %s is missing", op, name);
  int rc = dl_tensor_check(t);
  return rc ? dl_error_context(rc, "%s: %s", op, name) : 0;
}

static void shape_str(char *buf, size_t n, int nd, const int64_t *sz) {
  buf[0] = 0;
  for (int d = 0; d < nd; d++)
    snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", d ? ", " : "", (long long)sz[d]);
}

static int same_device(const char *op, const char *name, const dl_tensor_t *t,
                       const dl_tensor_t *ref, const char *ref_name) {
  if (t->dev_type == ref->dev_type && t->dev_index == ref->dev_index) return 0;
  return DL_ERR(DL_EINVAL, "%s: %s is on another device than %s", op, name, ref_name);
}

/* Sequence operand in `layout`: checks rank and the contiguous last dim. */
static int seq_operand(const char *op, const char *name, const dl_tensor_t *t, int layout,
                       operand_t *x) {
  DL_TRY(present(op, name, t));
  int thd = layout == DL_ATTN_THD, nd = thd ? 3 : 4;
  if (t->nd != nd)
    return DL_ERR(DL_EINVAL, "%s: %s must have %d dims [%s] for layout %s, got %d", op, name, nd,
                  thd ? "t, h, d" : layout == DL_ATTN_BSHD ? "b, s, h, d" : "s, b, h, d",
                  layout_names[layout], t->nd);
  if (t->st[nd - 1] != 1 && t->sz[nd - 1] > 1)
    return DL_ERR(DL_EINVAL, "%s: the last dim of %s must be contiguous (stride 1), got stride %lld",
                  op, name, (long long)t->st[nd - 1]);
  int bi = layout == DL_ATTN_SBHD ? 1 : 0, si = thd ? 0 : layout == DL_ATTN_SBHD ? 0 : 1;
  x->b = thd ? 0 : t->sz[bi];
  x->s = t->sz[si];
  x->h = t->sz[nd - 2];
  x->d = t->sz[nd - 1];
  x->st.b = thd ? 0 : t->st[bi];
  x->st.s = t->st[si];
  x->st.h = t->st[nd - 2];
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  x->ptr = v.data;
  return 0;
}

static int lse_operand(const char *op, const char *name, const dl_tensor_t *t, int thd,
                       operand_t *x) {
  DL_TRY(present(op, name, t));
  if (t->dtype_id != DL_F32)
    return DL_ERR(DL_EINVAL, "%s: %s must be f32, got %s", op, name, dl_dtype_name(t->dtype_id));
  if (t->nd != (thd ? 2 : 3))
    return DL_ERR(DL_EINVAL, "%s: %s must have %s, got %d dims", op, name,
                  thd ? "2 dims [h, t]" : "3 dims [b, h, s]", t->nd);
  x->b = thd ? 0 : t->sz[0];
  x->h = t->sz[thd ? 0 : 1];
  x->s = t->sz[thd ? 1 : 2];
  x->d = 0;
  x->st.b = thd ? 0 : t->st[0];
  x->st.h = t->st[thd ? 0 : 1];
  x->st.s = t->st[thd ? 1 : 2];
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  x->ptr = v.data;
  return 0;
}

/* The shape of a [b, s, h, d] operand in `layout` (thd: [s, h, d]); returns ndim. */
static int layout_shape(int layout, int64_t b, int64_t s, int64_t h, int64_t d, int64_t *sz) {
  if (layout == DL_ATTN_THD) {
    sz[0] = s, sz[1] = h, sz[2] = d;
    return 3;
  }
  sz[0] = layout == DL_ATTN_BSHD ? b : s;
  sz[1] = layout == DL_ATTN_BSHD ? s : b;
  sz[2] = h, sz[3] = d;
  return 4;
}

static int lse_shape(int thd, int64_t b, int64_t h, int64_t s, int64_t *sz) {
  if (thd) {
    sz[0] = h, sz[1] = s;
    return 2;
  }
  sz[0] = b, sz[1] = h, sz[2] = s;
  return 3;
}

static int expect_shape(const char *op, const char *name, const dl_tensor_t *t, int nd,
                        const int64_t *want) {
  int eq = t->nd == nd;
  for (int d = 0; eq && d < nd; d++) eq = t->sz[d] == want[d];
  if (eq) return 0;
  char a[160], b[160];
  shape_str(a, sizeof a, t->nd, t->sz);
  shape_str(b, sizeof b, nd, want);
  return DL_ERR(DL_EINVAL, "%s: %s has shape [%s], expected [%s]", op, name, a, b);
}

/* ---- cu_seqlens ------------------------------------------------------------------ */

static int cu_operand(const char *op, const char *name, const dl_tensor_t *t,
                      const dl_tensor_t *like, const char *like_name, int64_t n,
                      const int32_t **ptr) {
  DL_TRY(present(op, name, t));
  DL_CHECK_ARG(t->dtype_id == DL_I32, "%s: %s must be i32, got %s", op, name,
               dl_dtype_name(t->dtype_id));
  DL_CHECK_ARG(t->nd == 1 && t->sz[0] >= 1 && (n < 0 || t->sz[0] == n),
               "%s: %s must be 1-D with %s entries (b+1), got %lld", op, name,
               n < 0 ? "at least 1" : "the same number of", (long long)dl_tensor_numel(t));
  DL_CHECK_ARG(t->st[0] == 1 || t->sz[0] == 1, "%s: %s must be contiguous", op, name);
  DL_TRY(same_device(op, name, t, like, like_name));
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  *ptr = (const int32_t *)v.data;
  return 0;
}

/* A host copy of a cu_seqlens tensor (malloc'd; a sync on cuda). */
static int cu_host(const char *op, const char *name, const dl_tensor_t *t, dl_stream_t *s,
                   int32_t **out) {
  int64_t n = t->sz[0];
  int32_t *h = malloc(sizeof(int32_t) * n);
  if (!h) return DL_ERR(DL_ENOMEM, "%s: out of host memory reading %s", op, name);
  if (t->dev_type == DL_CPU) {
    dl_view_t v;
    dl_view_of(t, &v);
    memcpy(h, v.data, sizeof(int32_t) * n);
    *out = h;
    return 0;
  }
  dl_tensor_t *tmp;
  int rc = dl_tensor_empty(&tmp, DL_I32, 1, &n, DL_CPU, 0);
  if (!rc) {
    rc = dl_tensor_copy(tmp, t, s);
    if (!rc) memcpy(h, tmp->storage->ptr, sizeof(int32_t) * n);
    dl_tensor_free(tmp);
  }
  if (rc) {
    free(h);
    return dl_error_context(rc, "%s: reading %s", op, name);
  }
  *out = h;
  return 0;
}

/* Every sequence i (length cu[i+1]-cu[i] >= 0, first row start[i]) inside
 * `rows`; *max_len gets the largest length. */
static int check_seqs(const char *op, const char *name, const char *pname, const int32_t *cu,
                      const int32_t *start, int64_t b, int64_t rows, const char *tname,
                      int *max_len) {
  int m = 0;
  for (int64_t i = 0; i < b; i++) {
    int64_t len = (int64_t)cu[i + 1] - cu[i];
    if (len < 0)
      return DL_ERR(DL_EINVAL, "%s: %s decreases at entry %lld (%d after %d)", op, name,
                    (long long)i + 1, cu[i + 1], cu[i]);
    if (start[i] < 0 || start[i] + len > rows)
      return DL_ERR(DL_EINVAL,
                    "%s: sequence %lld (rows %lld..%lld by %s) lies outside the %lld rows of %s",
                    op, (long long)i, (long long)start[i], (long long)start[i] + len - 1, pname,
                    (long long)rows, tname);
    if (len > m) m = (int)len;
  }
  *max_len = m;
  return 0;
}

/* ---- outputs ------------------------------------------------------------------- */

/* What a call allocated, so that a failure leaves the caller's slots as they were. */
typedef struct made {
  dl_tensor_t **slot[4];
  int n;
} made_t;

static void made_undo(made_t *m) {
  for (int i = 0; i < m->n; i++) {
    dl_tensor_free(*m->slot[i]);
    *m->slot[i] = NULL;
  }
}

/* *slot: checked against (dtype, shape), or allocated like `like` and filled. */
static int output(const char *op, const char *name, made_t *m, dl_tensor_t **slot, int dtype,
                  int nd, const int64_t *shape, const dl_tensor_t *like, int fill, double value,
                  dl_stream_t *s) {
  if (*slot) {
    DL_TRY(present(op, name, *slot));
    DL_TRY(same_device(op, name, *slot, like, "q"));
    DL_CHECK_ARG((*slot)->dtype_id == dtype, "%s: %s must be %s, got %s", op, name,
                 dl_dtype_name(dtype), dl_dtype_name((*slot)->dtype_id));
    DL_TRY(expect_shape(op, name, *slot, nd, shape));
    if ((*slot)->st[nd - 1] != 1 && shape[nd - 1] > 1)
      return DL_ERR(DL_EINVAL, "%s: the last dim of %s must be contiguous (stride 1)", op, name);
    return 0;
  }
  dl_tensor_t *t;
  int rc = dl_tensor_empty(&t, dtype, nd, shape, like->dev_type, like->dev_index);
  if (rc) return dl_error_context(rc, "%s: allocating %s", op, name);
  m->slot[m->n++] = slot;
  *slot = t;
  DL_TRY(dl_tensor_record_stream(t, s));
  return fill ? dl_tensor_fill(t, value, s) : 0;
}

/* ---- one step ------------------------------------------------------------------ */

typedef struct step {
  const char *op;
  int layout, thd;
  const dl_tensor_t *q;
  operand_t oq, ok, ov;
  int32_t *host[4]; /* cu_seqlens q, kv, q_padded, kv_padded read on the host */
} step_t;

static void step_free(step_t *st) {
  for (int i = 0; i < 4; i++) free(st->host[i]);
}

/* thd: the cu_seqlens pointers, and max lengths from opts or from the host. */
static int step_thd(step_t *st, const dl_attn_opts_t *o, dl_attn_params_t *p, dl_stream_t *s) {
  const char *op = st->op;
  const char *names[4] = {"cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded",
                          "cu_seqlens_kv_padded"};
  const dl_tensor_t *ts[4] = {o->cu_seqlens_q, o->cu_seqlens_kv, o->cu_seqlens_q_padded,
                              o->cu_seqlens_kv_padded};
  const int32_t **ptrs[4] = {&p->cu_seqlens_q, &p->cu_seqlens_kv, &p->cu_seqlens_q_padded,
                             &p->cu_seqlens_kv_padded};
  if (!ts[0] || !ts[1])
    return DL_ERR(DL_EINVAL, "%s: layout thd needs cu_seqlens_q and cu_seqlens_kv", op);
  DL_TRY(cu_operand(op, names[0], ts[0], st->q, "q", -1, ptrs[0]));
  int64_t n = ts[0]->sz[0];
  for (int i = 1; i < 4; i++)
    if (ts[i]) DL_TRY(cu_operand(op, names[i], ts[i], st->q, "q", n, ptrs[i]));
  p->b = (int)(n - 1);
  p->total_q = st->oq.s;
  p->total_kv = st->ok.s;
  DL_CHECK_ARG(o->max_seqlen_q >= 0 && o->max_seqlen_kv >= 0,
               "%s: max_seqlen_q/kv must be >= 0 (0 = read from cu_seqlens)", op);
  p->s_q = o->max_seqlen_q;
  p->s_kv = o->max_seqlen_kv;
  int on_host = st->q->dev_type == DL_CPU;
  int need = st->q->dev_type == DL_CUDA && (!o->max_seqlen_q || !o->max_seqlen_kv);
  if (!on_host && !need) return 0;
  for (int i = 0; i < 4; i++)
    if (ts[i]) DL_TRY(cu_host(op, names[i], ts[i], s, &st->host[i]));
  int mq, mkv;
  DL_TRY(check_seqs(op, names[0], ts[2] ? names[2] : names[0], st->host[0],
                    st->host[2] ? st->host[2] : st->host[0], p->b, p->total_q, "q", &mq));
  DL_TRY(check_seqs(op, names[1], ts[3] ? names[3] : names[1], st->host[1],
                    st->host[3] ? st->host[3] : st->host[1], p->b, p->total_kv, "k", &mkv));
  DL_CHECK_ARG(!o->max_seqlen_q || o->max_seqlen_q >= mq,
               "%s: max_seqlen_q=%d is below the longest q sequence (%d)", op, o->max_seqlen_q, mq);
  DL_CHECK_ARG(!o->max_seqlen_kv || o->max_seqlen_kv >= mkv,
               "%s: max_seqlen_kv=%d is below the longest kv sequence (%d)", op, o->max_seqlen_kv,
               mkv);
  if (!p->s_q) p->s_q = mq;
  if (!p->s_kv) p->s_kv = mkv;
  return 0;
}

/* Checks q, k, v and the options; fills the input side of p. */
static int step_inputs(step_t *st, const dl_attn_opts_t *o, const dl_tensor_t *q,
                       const dl_tensor_t *k, const dl_tensor_t *v, dl_attn_params_t *p,
                       dl_stream_t *s) {
  const char *op = st->op;
  DL_CHECK_ARG(o, "%s: opts is NULL", op);
  DL_CHECK_ARG(o->layout >= DL_ATTN_BSHD && o->layout <= DL_ATTN_THD,
               "%s: layout %d is not bshd (0), sbhd (1) or thd (2)", op, o->layout);
  st->layout = o->layout;
  st->thd = o->layout == DL_ATTN_THD;
  st->q = q;
  DL_TRY(seq_operand(op, "q", q, o->layout, &st->oq));
  DL_TRY(seq_operand(op, "k", k, o->layout, &st->ok));
  DL_TRY(seq_operand(op, "v", v, o->layout, &st->ov));
  DL_CHECK_ARG(q->dtype_id == DL_BF16 || q->dtype_id == DL_F16, "%s: q must be bf16 or f16, got %s",
               op, dl_dtype_name(q->dtype_id));
  DL_CHECK_ARG(k->dtype_id == q->dtype_id, "%s: k is %s but q is %s", op,
               dl_dtype_name(k->dtype_id), dl_dtype_name(q->dtype_id));
  DL_CHECK_ARG(v->dtype_id == q->dtype_id, "%s: v is %s but q is %s", op,
               dl_dtype_name(v->dtype_id), dl_dtype_name(q->dtype_id));
  DL_TRY(same_device(op, "k", k, q, "q"));
  DL_TRY(same_device(op, "v", v, q, "q"));
  operand_t *oq = &st->oq, *ok = &st->ok, *ov = &st->ov;
  DL_CHECK_ARG(st->thd || (ok->b == oq->b && ov->b == oq->b),
               "%s: batch sizes differ: q %lld, k %lld, v %lld", op, (long long)oq->b,
               (long long)ok->b, (long long)ov->b);
  DL_CHECK_ARG(ov->s == ok->s, "%s: k has %lld %s but v has %lld", op, (long long)ok->s,
               st->thd ? "rows" : "positions", (long long)ov->s);
  DL_CHECK_ARG(ov->h == ok->h, "%s: k has %lld heads but v has %lld", op, (long long)ok->h,
               (long long)ov->h);
  DL_CHECK_ARG(oq->h >= 1 && ok->h >= 1 && oq->h % ok->h == 0,
               "%s: k's %lld heads must divide q's %lld heads (GQA/MQA)", op, (long long)ok->h,
               (long long)oq->h);
  DL_CHECK_ARG(ok->d == oq->d, "%s: head dims of q (%lld) and k (%lld) differ", op,
               (long long)oq->d, (long long)ok->d);
  DL_CHECK_ARG(oq->d >= 8 && oq->d <= 256 && oq->d % 8 == 0,
               "%s: head dim %lld of q and k is unsupported (multiples of 8 up to 256)", op,
               (long long)oq->d);
  DL_CHECK_ARG(ov->d >= 8 && ov->d <= 256 && ov->d % 8 == 0,
               "%s: head dim %lld of v is unsupported (multiples of 8 up to 256)", op,
               (long long)ov->d);
  DL_CHECK_ARG(oq->s <= INT32_MAX && ok->s <= INT32_MAX && oq->b <= INT32_MAX,
               "%s: sizes beyond int32", op);
  DL_CHECK_ARG(o->window_left >= -1 && o->window_right >= -1,
               "%s: window (%d, %d): bounds are >= 0, or -1 for none", op, o->window_left,
               o->window_right);
  DL_CHECK_ARG(o->scale == 0 || (isfinite(o->scale) && o->scale > 0),
               "%s: scale %g must be finite and > 0 (0 = 1/sqrt(d))", op, o->scale);
  p->dtype = q->dtype_id;
  p->h_q = (int)oq->h;
  p->h_kv = (int)ok->h;
  p->d_qk = (int)oq->d;
  p->d_v = (int)ov->d;
  p->scale = (float)(o->scale ? o->scale : 1.0 / sqrt((double)oq->d));
  p->window_left = o->window_left;
  p->window_right = o->window_right;
  p->bottom_right = o->bottom_right != 0;
  p->q = oq->ptr, p->k = ok->ptr, p->v = ov->ptr;
  p->q_st = oq->st, p->k_st = ok->st, p->v_st = ov->st;
  if (!st->thd) {
    p->b = (int)oq->b;
    p->s_q = (int)oq->s;
    p->s_kv = (int)ok->s;
    return 0;
  }
  return step_thd(st, o, p, s);
}

/* Shapes of out ([.., s_q, h_q, d_v]) and lse in the step's layout. */
static int out_shape(const step_t *st, int64_t d, int64_t *sz) {
  return layout_shape(st->layout, st->oq.b, st->oq.s, st->oq.h, d, sz);
}
static int lse_shape_of(const step_t *st, int64_t *sz) {
  return lse_shape(st->thd, st->oq.b, st->oq.h, st->oq.s, sz);
}

/* Operands that hold no element have no memory; the kernels want non-NULL
 * pointers and never read them, so lend them another operand's. */
static void lend(void **ptrs[], int n) {
  void *any = NULL;
  for (int i = 0; i < n && !any; i++) any = *ptrs[i];
  for (int i = 0; i < n; i++)
    if (!*ptrs[i]) *ptrs[i] = any;
}

static int launch(int bwd, const dl_attn_params_t *p, const dl_tensor_t *q, dl_stream_t *s) {
  void *h;
  if (q->dev_type == DL_CPU) return bwd ? dl_attn_bwd_cpu(p, NULL) : dl_attn_fwd_cpu(p, NULL);
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(q->dev_index));
  DL_TRY(dl_stream_for(s, q->dev_type, q->dev_index, &h));
  return bwd ? dl_attn_bwd_cuda(p, h) : dl_attn_fwd_cuda(p, h);
#else
  (void)h, (void)s;
  return DL_ERR(DL_ENODEV, "attn: cpu-only build");
#endif
}

static int fwd_outputs(step_t *st, made_t *m, dl_attn_params_t *p, dl_tensor_t **out,
                       dl_tensor_t **lse, dl_tensor_t **max_logit, dl_tensor_t *acc_out,
                       dl_tensor_t *acc_lse, dl_stream_t *s) {
  const char *op = st->op;
  int64_t osz[4], lsz[3], hsz = st->oq.h;
  int ond = out_shape(st, st->ov.d, osz), lnd = lse_shape_of(st, lsz);
  operand_t x;
  if (acc_out || acc_lse) {
    DL_CHECK_ARG(acc_out && acc_lse, "%s: accumulate needs both out and lse", op);
    DL_CHECK_ARG(!(out && *out) && !(lse && *lse),
                 "%s: out/lse given with accumulate; the step is merged into accumulate", op);
    DL_TRY(seq_operand(op, "accumulate.out", acc_out, st->layout, &x));
    DL_TRY(expect_shape(op, "accumulate.out", acc_out, ond, osz));
    DL_TRY(same_device(op, "accumulate.out", acc_out, st->q, "q"));
    int adt = acc_out->dtype_id;
    DL_CHECK_ARG(adt == DL_F32 || adt == DL_BF16 || adt == DL_F16,
                 "%s: accumulate.out must be f32, bf16 or f16, got %s", op, dl_dtype_name(adt));
    p->acc_out = x.ptr, p->acc_out_st = x.st, p->acc_dtype = adt;
    DL_TRY(lse_operand(op, "accumulate.lse", acc_lse, st->thd, &x));
    DL_TRY(expect_shape(op, "accumulate.lse", acc_lse, lnd, lsz));
    DL_TRY(same_device(op, "accumulate.lse", acc_lse, st->q, "q"));
    p->acc_lse = x.ptr, p->acc_lse_st = x.st;
  } else {
    DL_CHECK_ARG(out && lse, "%s: out and lse slots are NULL", op);
    DL_TRY(output(op, "out", m, out, st->q->dtype_id, ond, osz, st->q, st->thd, 0, s));
    DL_TRY(output(op, "lse", m, lse, DL_F32, lnd, lsz, st->q, st->thd, -INFINITY, s));
    DL_TRY(seq_operand(op, "out", *out, st->layout, &x));
    p->out = x.ptr, p->out_st = x.st;
    DL_TRY(lse_operand(op, "lse", *lse, st->thd, &x));
    p->lse = x.ptr, p->lse_st = x.st;
  }
  if (max_logit) {
    DL_TRY(output(op, "max_logit", m, max_logit, DL_F32, 1, &hsz, st->q, 1, -INFINITY, s));
    dl_view_t v;
    DL_TRY(dl_view_of(*max_logit, &v));
    p->max_logit = (float *)v.data;
  }
  return 0;
}

int dl_attn_fwd(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_tensor_t *k,
                const dl_tensor_t *v, dl_tensor_t **out, dl_tensor_t **lse,
                dl_tensor_t **max_logit, dl_tensor_t *acc_out, dl_tensor_t *acc_lse,
                dl_stream_t *s) {
  step_t st = {.op = "attn.fwd"};
  made_t m = {.n = 0};
  dl_attn_params_t p = {0};
  int rc = step_inputs(&st, o, q, k, v, &p, s);
  if (!rc) rc = fwd_outputs(&st, &m, &p, out, lse, max_logit, acc_out, acc_lse, s);
  if (!rc && q->dev_type != DL_META && st.oq.s > 0 && (st.oq.b > 0 || (st.thd && p.b > 0))) {
    void **ptrs[] = {(void **)&p.q, (void **)&p.k, (void **)&p.v};
    lend(ptrs, 3);
    rc = launch(0, &p, q, s);
  }
  step_free(&st);
  if (rc) made_undo(&m);
  return rc;
}

int dl_attn_bwd(const dl_attn_opts_t *o, const dl_tensor_t *dout, const dl_tensor_t *q,
                const dl_tensor_t *k, const dl_tensor_t *v, const dl_tensor_t *out,
                const dl_tensor_t *lse, dl_tensor_t **dq, dl_tensor_t **dk, dl_tensor_t **dv,
                dl_stream_t *s) {
  step_t st = {.op = "attn.bwd"};
  made_t m = {.n = 0};
  dl_attn_params_t p = {0};
  dl_storage_t *ws = NULL;
  const char *op = st.op;
  int rc = step_inputs(&st, o, q, k, v, &p, s);
  int64_t osz[4], lsz[3], qsz[4], ksz[4], vsz[4];
  operand_t x;
  int ond = out_shape(&st, st.ov.d, osz), lnd = lse_shape_of(&st, lsz);
  layout_shape(st.layout, st.oq.b, st.oq.s, st.oq.h, st.oq.d, qsz);
  layout_shape(st.layout, st.ok.b, st.ok.s, st.ok.h, st.ok.d, ksz);
  layout_shape(st.layout, st.ov.b, st.ov.s, st.ov.h, st.ov.d, vsz);
  struct {
    const char *name;
    const dl_tensor_t *t;
  } in[2] = {{"dout", dout}, {"out", out}};
  for (int i = 0; i < 2 && !rc; i++) {
    rc = seq_operand(op, in[i].name, in[i].t, st.layout, &x);
    if (!rc) rc = same_device(op, in[i].name, in[i].t, q, "q");
    if (!rc && in[i].t->dtype_id != q->dtype_id)
      rc = DL_ERR(DL_EINVAL, "%s: %s is %s but q is %s", op, in[i].name,
                  dl_dtype_name(in[i].t->dtype_id), dl_dtype_name(q->dtype_id));
    if (!rc) rc = expect_shape(op, in[i].name, in[i].t, ond, osz);
    if (!rc && i == 0) p.dout = x.ptr, p.dout_st = x.st;
    if (!rc && i == 1) p.out = x.ptr, p.out_st = x.st;
  }
  if (!rc) rc = lse_operand(op, "lse", lse, st.thd, &x);
  if (!rc) rc = same_device(op, "lse", lse, q, "q");
  if (!rc) rc = expect_shape(op, "lse", lse, lnd, lsz);
  if (!rc) p.lse = x.ptr, p.lse_st = x.st;
  if (!rc && o->accumulate_grads && !(dq && *dq && dk && *dk && dv && *dv))
    rc = DL_ERR(DL_EINVAL, "%s: accumulate_grads needs dq, dk and dv given", op);
  if (!rc && !(dq && dk && dv)) rc = DL_ERR(DL_EINVAL, "%s: dq, dk, dv slots are NULL", op);
  int dt = q->dtype_id, z = st.thd;
  if (!rc) rc = output(op, "dq", &m, dq, dt, ond, qsz, q, z, 0, s);
  if (!rc) rc = output(op, "dk", &m, dk, dt, ond, ksz, q, z, 0, s);
  if (!rc) rc = output(op, "dv", &m, dv, dt, ond, vsz, q, z, 0, s);
  const char *gn[3] = {"dq", "dk", "dv"};
  dl_tensor_t **gs[3] = {dq, dk, dv};
  for (int i = 0; i < 3 && !rc; i++) {
    rc = seq_operand(op, gn[i], *gs[i], st.layout, &x);
    if (i == 0) p.dq = x.ptr, p.dq_st = x.st;
    if (i == 1) p.dk = x.ptr, p.dk_st = x.st;
    if (i == 2) p.dv = x.ptr, p.dv_st = x.st;
  }
  p.accumulate_grads = o && o->accumulate_grads;
  int empty = !(st.oq.s > 0 || st.ok.s > 0) || (st.thd ? p.b == 0 : st.oq.b == 0);
  if (!rc && q->dev_type != DL_CPU && !empty) {
    void *h = NULL;
    dl_attn_params_t sized = p; /* on meta cu_seqlens_q has no memory; thd is its being set */
    if (st.thd) sized.cu_seqlens_q = (const int32_t *)&sized;
    p.workspace_bytes = dl_attn_bwd_workspace_bytes(&sized);
    rc = dl_stream_for(s, q->dev_type, q->dev_index, &h);
    if (!rc) rc = dl_storage_new(q->dev_type, q->dev_index, (int64_t)p.workspace_bytes, h, &ws);
    if (rc) rc = dl_error_context(rc, "%s: allocating the workspace", op);
    else p.workspace = ws->ptr;
  }
  if (!rc && q->dev_type != DL_META && !empty) {
    void **ptrs[] = {(void **)&p.q,  (void **)&p.k,  (void **)&p.v,    (void **)&p.out,
                     (void **)&p.dout, (void **)&p.dq, (void **)&p.dk, (void **)&p.dv,
                     (void **)&p.lse};
    lend(ptrs, 9);
    rc = launch(1, &p, q, s);
  }
  dl_storage_release(ws); /* stream-ordered: the next user of the block queues after us */
  step_free(&st);
  if (rc) made_undo(&m);
  return rc;
}

/* ---- merges ---------------------------------------------------------------------- */

/* A part shorter than its target holds the selected half only (bshd/sbhd:
 * exactly half the positions; thd: checked against cu_seqlens_padded). */
static int part_rows(const char *op, const char *name, int64_t n, const char *tname, int64_t tn,
                     int half, int thd) {
  if (n == tn || (half && (thd ? n < tn : 2 * n == tn))) return 0;
  return DL_ERR(DL_EINVAL, "%s: %s has %lld %s but %s has %lld; a shorter part needs rows = "
                "first or second half and %s", op, name, (long long)n,
                thd ? "rows" : "positions", tname, (long long)tn,
                thd ? "fewer rows" : "half the positions");
}

/* what: 0 lse merge, 1 output merge, 2 gradient; main = lse (0) or out/grad. */
static int merge(const char *op, const dl_attn_merge_opts_t *o, int what, int mode,
                 dl_tensor_t *out, dl_tensor_t *lse, const dl_tensor_t *part,
                 const dl_tensor_t *part_lse, dl_stream_t *s) {
  DL_CHECK_ARG(o, "%s: opts is NULL", op);
  DL_CHECK_ARG(o->layout >= DL_ATTN_BSHD && o->layout <= DL_ATTN_THD,
               "%s: layout %d is not bshd (0), sbhd (1) or thd (2)", op, o->layout);
  DL_CHECK_ARG(o->rows >= DL_ATTN_ROWS_ALL && o->rows <= DL_ATTN_ROWS_SECOND_HALF,
               "%s: rows %d is not all (0), first half (1) or second half (2)", op, o->rows);
  int thd = o->layout == DL_ATTN_THD, half = o->rows != DL_ATTN_ROWS_ALL;
  const char *oname = what == 2 ? "grad" : "out";
  dl_attn_merge_params_t p;
  memset(&p, 0, sizeof p);
  operand_t mo = {0}, ml = {0}, po = {0}, pl = {0};
  const dl_tensor_t *main = what == 0 ? lse : out;
  if (what != 0) {
    DL_TRY(seq_operand(op, oname, out, o->layout, &mo));
    DL_TRY(seq_operand(op, "part", part, o->layout, &po));
    DL_TRY(same_device(op, "part", part, out, oname));
    int dts[2] = {out->dtype_id, part->dtype_id};
    for (int i = 0; i < 2; i++)
      DL_CHECK_ARG(dts[i] == DL_F32 || dts[i] == DL_BF16 || dts[i] == DL_F16,
                   "%s: %s must be f32, bf16 or f16, got %s", op, i ? "part" : oname,
                   dl_dtype_name(dts[i]));
    DL_CHECK_ARG((thd || po.b == mo.b) && po.h == mo.h && po.d == mo.d,
                 "%s: part's batch, heads or head dim differ from %s's", op, oname);
    p.out = mo.ptr, p.out_st = mo.st, p.out_dtype = out->dtype_id;
    p.part = po.ptr, p.part_st = po.st, p.part_dtype = part->dtype_id;
    p.d = (int)mo.d;
  }
  if (what != 2) {
    DL_TRY(lse_operand(op, "lse", lse, thd, &ml));
    DL_TRY(lse_operand(op, "part_lse", part_lse, thd, &pl));
    DL_TRY(same_device(op, "part_lse", part_lse, lse, "lse"));
    if (what == 1) {
      DL_TRY(same_device(op, "lse", lse, out, "out"));
      int64_t want[3];
      DL_TRY(expect_shape(op, "lse", lse, lse_shape(thd, mo.b, mo.h, mo.s, want), want));
    }
    DL_CHECK_ARG((thd || pl.b == ml.b) && pl.h == ml.h,
                 "%s: part_lse's batch or heads differ from lse's", op);
    p.lse = ml.ptr, p.lse_st = ml.st;
    p.part_lse = pl.ptr, p.part_lse_st = pl.st;
  }
  operand_t *mn = what == 0 ? &ml : &mo, *pn = what == 0 ? &pl : &po;
  int packed = pn->s != mn->s;
  DL_TRY(part_rows(op, what == 0 ? "part_lse" : "part", pn->s, what == 0 ? "lse" : oname, mn->s,
                   half, thd));
  if (what == 1) {
    DL_TRY(part_rows(op, "part_lse", pl.s, "lse", ml.s, half, thd));
    DL_CHECK_ARG((pl.s != ml.s) == packed,
                 "%s: part and part_lse disagree on holding one half only", op);
  }
  p.half = o->rows;
  p.part_is_half = packed;
  p.b = (int)mn->b;
  p.h = (int)mn->h;
  p.s = thd ? 0 : (int)mn->s;
  p.total = thd ? mn->s : 0;
  p.skip_zero_rows = o->skip_zero_rows != 0;
  static const int out_modes[] = {DL_ATTN_MERGE_INCR, DL_ATTN_MERGE_INIT, DL_ATTN_MERGE_ADD};
  static const int grad_modes[] = {DL_ATTN_GRAD_COPY, DL_ATTN_GRAD_ADD};
  if (what == 1) {
    DL_CHECK_ARG(mode >= DL_ATTN_OUT_INCREMENTAL && mode <= DL_ATTN_OUT_ADD,
                 "%s: mode %d is not incremental (0), init (1) or add (2)", op, mode);
    p.mode = out_modes[mode];
  } else if (what == 2) {
    DL_CHECK_ARG(mode == DL_ATTN_GRAD_SET || mode == DL_ATTN_GRAD_ACCUMULATE,
                 "%s: mode %d is not set (0) or accumulate (1)", op, mode);
    p.mode = grad_modes[mode];
  }
  int32_t *host = NULL;
  if (thd) {
    DL_TRY(cu_operand(op, "cu_seqlens_padded", o->cu_seqlens_padded, main, what ? oname : "lse",
                      -1, &p.cu_seqlens_padded));
    p.b = (int)(o->cu_seqlens_padded->sz[0] - 1);
    if (main->dev_type == DL_CPU) {
      DL_TRY(cu_host(op, "cu_seqlens_padded", o->cu_seqlens_padded, s, &host));
      int rc = 0;
      for (int i = 0; i < p.b && !rc; i++) {
        int64_t len = (int64_t)host[i + 1] - host[i];
        if (len < 0 || host[i] < 0 || host[i + 1] > mn->s)
          rc = DL_ERR(DL_EINVAL, "%s: cu_seqlens_padded: sequence %d (rows %d..%d) is not inside "
                      "the %lld rows", op, i, host[i], host[i + 1] - 1, (long long)mn->s);
        else if (half && len % 2)
          rc = DL_ERR(DL_EINVAL, "%s: cu_seqlens_padded: sequence %d has odd length %lld; a "
                      "half needs even lengths", op, i, (long long)len);
      }
      if (!rc && packed && p.b > 0 && (host[p.b] - host[0]) / 2 > pn->s)
        rc = DL_ERR(DL_EINVAL, "%s: the packed half needs %d rows, part has %lld", op,
                    (host[p.b] - host[0]) / 2, (long long)pn->s);
      free(host);
      DL_TRY(rc);
    }
  }
  if (main->dev_type == DL_META || mn->s == 0 || (thd ? p.b : mn->b) == 0) return 0;
  void **ptrs[] = {&p.out, (void **)&p.lse, (void **)&p.part, (void **)&p.part_lse};
  lend(ptrs, 4);
  if (main->dev_type == DL_CPU)
    return what == 0 ? dl_attn_merge_lse_cpu(&p, NULL)
           : what == 1 ? dl_attn_merge_out_cpu(&p, NULL) : dl_attn_merge_grad_cpu(&p, NULL);
#ifdef DL_WITH_CUDA
  void *h;
  DL_TRY(dl_cuda_use(main->dev_index));
  DL_TRY(dl_stream_for(s, main->dev_type, main->dev_index, &h));
  return what == 0 ? dl_attn_merge_lse_cuda(&p, h)
         : what == 1 ? dl_attn_merge_out_cuda(&p, h) : dl_attn_merge_grad_cuda(&p, h);
#else
  return DL_ERR(DL_ENODEV, "attn: cpu-only build");
#endif
}

int dl_attn_merge_lse(const dl_attn_merge_opts_t *o, dl_tensor_t *lse,
                      const dl_tensor_t *part_lse, dl_stream_t *s) {
  return merge("attn.merge_lse", o, 0, 0, NULL, lse, NULL, part_lse, s);
}

int dl_attn_merge_out(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *out,
                      dl_tensor_t *lse, const dl_tensor_t *part, const dl_tensor_t *part_lse,
                      dl_stream_t *s) {
  return merge("attn.merge_out", o, 1, mode, out, lse, part, part_lse, s);
}

int dl_attn_merge_grad(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *grad,
                       const dl_tensor_t *part, dl_stream_t *s) {
  return merge("attn.correct_grad", o, 2, mode, grad, NULL, part, NULL, s);
}
