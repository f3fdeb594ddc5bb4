/*
 * attn.c — the core side of an attention step (merges: attn_merge.c; the
 * argument checks both use: attn_args.c): checks the tensors of one step,
 * turns them into the raw-pointer params of kernels/attn/attn.h, allocates what the caller left NULL
 * (outputs, and the backward's workspace under the current memory tag), makes freshly allocated thd
 * outputs defined outside the sequences (out, dq, dk, dv zero; lse -inf), and runs the CUDA kernel
 * or its CPU twin on the stream given. On meta it allocates and runs nothing, so peak memory can be
 * read.
 *
 * opts->backend picks ours or cuDNN's fused attention (core/ops/attn/attn_cudnn.c decides and
 * runs it; "auto": cuDNN where it takes the call).
 *
 * cu_seqlens contents are checked (non-decreasing, every sequence inside its
 * tensor) wherever they are read on the host: always on cpu, and on cuda
 * when max_seqlen_* is not given (the kernels need the largest length).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/alloc.h"
#include "attn_args.h"
#include "attn_cudnn.h"
#include "base/device.h"

/* ---- one step ------------------------------------------------------------------ */

typedef struct step {
  const char *op;
  int layout, thd;
  const dl_tensor_t *q;
  dl_attn_operand_t oq, ok, ov;
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
  DL_TRY(dl_attn_arg_cu(op, names[0], ts[0], st->q, "q", -1, ptrs[0]));
  int64_t n = ts[0]->sz[0];
  for (int i = 1; i < 4; i++)
    if (ts[i]) DL_TRY(dl_attn_arg_cu(op, names[i], ts[i], st->q, "q", n, ptrs[i]));
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
    if (ts[i]) DL_TRY(dl_attn_arg_cu_host(op, names[i], ts[i], s, &st->host[i]));
  int mq, mkv;
  DL_TRY(dl_attn_arg_check_seqs(op, names[0], ts[2] ? names[2] : names[0], st->host[0],
                                st->host[2] ? st->host[2] : st->host[0], p->b, p->total_q, "q",
                                &mq));
  DL_TRY(dl_attn_arg_check_seqs(op, names[1], ts[3] ? names[3] : names[1], st->host[1],
                                st->host[3] ? st->host[3] : st->host[1], p->b, p->total_kv, "k",
                                &mkv));
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
  DL_TRY(dl_attn_arg_seq(op, "q", q, o->layout, &st->oq));
  DL_TRY(dl_attn_arg_seq(op, "k", k, o->layout, &st->ok));
  DL_TRY(dl_attn_arg_seq(op, "v", v, o->layout, &st->ov));
  /* f32 on the cpu: a reference in fp32 (the twin computes in fp64 whatever it loads) */
  DL_CHECK_ARG(q->dtype_id == DL_BF16 || q->dtype_id == DL_F16 ||
                   (q->dtype_id == DL_F32 && q->dev_type != DL_CUDA),
               "%s: q must be bf16 or f16%s, got %s", op,
               q->dev_type == DL_CUDA ? " on cuda (f32 is for a reference on the cpu)" : " (or f32)",
               dl_dtype_name(q->dtype_id));
  DL_CHECK_ARG(k->dtype_id == q->dtype_id, "%s: k is %s but q is %s", op,
               dl_dtype_name(k->dtype_id), dl_dtype_name(q->dtype_id));
  DL_CHECK_ARG(v->dtype_id == q->dtype_id, "%s: v is %s but q is %s", op,
               dl_dtype_name(v->dtype_id), dl_dtype_name(q->dtype_id));
  DL_TRY(dl_attn_arg_same_device(op, "k", k, q, "q"));
  DL_TRY(dl_attn_arg_same_device(op, "v", v, q, "q"));
  dl_attn_operand_t *oq = &st->oq, *ok = &st->ok, *ov = &st->ov;
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
  return dl_attn_layout_shape(st->layout, st->oq.b, st->oq.s, st->oq.h, d, sz);
}
static int lse_shape_of(const step_t *st, int64_t *sz) {
  return dl_attn_lse_shape(st->thd, st->oq.b, st->oq.h, st->oq.s, sz);
}

/* dl_attn_runs' counts of steps that returned without error: [bwd * 4 + kind], kind 0 cpu, 1 portable, 2 Hopper,
 * 3 cuDNN */
static int64_t runs[DL_ATTN_RUNS];
static void count_run(int bwd, int kind) { __atomic_fetch_add(&runs[bwd * 4 + kind], 1, __ATOMIC_RELAXED); }

int dl_attn_runs(int64_t *out) {
  DL_CHECK_ARG(out, "dl_attn_runs: out is NULL");
  for (int i = 0; i < DL_ATTN_RUNS; i++) out[i] = __atomic_load_n(&runs[i], __ATOMIC_RELAXED);
  return 0;
}

static int launch(int bwd, const dl_attn_params_t *p, const dl_tensor_t *q, dl_stream_t *s) {
  void *h;
  if (q->dev_type == DL_CPU) {
    const int rc = bwd ? dl_attn_bwd_cpu(p, NULL) : dl_attn_fwd_cpu(p, NULL);
    if (!rc) count_run(bwd, 0);
    return rc;
  }
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(q->dev_index));
  DL_TRY(dl_stream_for(s, q->dev_type, q->dev_index, &h));
  int hopper = 0; /* the kernel dl_attn_{fwd,bwd}_cuda took, for dl_attn_runs */
  const int rc = bwd ? dl_attn_bwd_cuda(p, h, &hopper) : dl_attn_fwd_cuda(p, h, &hopper);
  if (!rc) count_run(bwd, hopper ? 2 : 1);
  return rc;
#else
  (void)h, (void)s;
  return DL_ERR(DL_ENODEV, "attn: cpu-only build");
#endif
}

static int fwd_outputs(step_t *st, dl_attn_made_t *m, dl_attn_params_t *p, dl_tensor_t **out,
                       dl_tensor_t **lse, dl_tensor_t **max_logit, dl_tensor_t *acc_out,
                       dl_tensor_t *acc_lse, dl_stream_t *s) {
  const char *op = st->op;
  int64_t osz[4], lsz[3], hsz = st->oq.h;
  int ond = out_shape(st, st->ov.d, osz), lnd = lse_shape_of(st, lsz);
  dl_attn_operand_t x;
  if (acc_out || acc_lse) {
    DL_CHECK_ARG(acc_out && acc_lse, "%s: accumulate needs both out and lse", op);
    DL_CHECK_ARG(!(out && *out) && !(lse && *lse),
                 "%s: out/lse given with accumulate; the step is merged into accumulate", op);
    DL_TRY(dl_attn_arg_seq(op, "accumulate.out", acc_out, st->layout, &x));
    DL_TRY(dl_attn_arg_expect_shape(op, "accumulate.out", acc_out, ond, osz));
    DL_TRY(dl_attn_arg_same_device(op, "accumulate.out", acc_out, st->q, "q"));
    int adt = acc_out->dtype_id;
    DL_CHECK_ARG(adt == DL_F32 || adt == DL_BF16 || adt == DL_F16,
                 "%s: accumulate.out must be f32, bf16 or f16, got %s", op, dl_dtype_name(adt));
    p->acc_out = x.ptr, p->acc_out_st = x.st, p->acc_dtype = adt;
    DL_TRY(dl_attn_arg_lse(op, "accumulate.lse", acc_lse, st->thd, &x));
    DL_TRY(dl_attn_arg_expect_shape(op, "accumulate.lse", acc_lse, lnd, lsz));
    DL_TRY(dl_attn_arg_same_device(op, "accumulate.lse", acc_lse, st->q, "q"));
    p->acc_lse = x.ptr, p->acc_lse_st = x.st;
  } else if (out && *out && (*out)->dtype_id == DL_F32 && st->q->dtype_id != DL_F32) {
    /* An f32 out for a 16-bit step (a partial kept in fp32): the epilogue's
     * merge into (out, lse) = (0, -inf) writes exactly the step's (O, L),
     * with O in f32; rows outside the sequences (thd) come out 0 and -inf. */
    DL_CHECK_ARG(lse, "%s: out and lse slots are NULL", op);
    DL_TRY(dl_attn_arg_output(op, "out", m, out, DL_F32, ond, osz, st->q, 0, 0, s));
    DL_TRY(dl_attn_arg_output(op, "lse", m, lse, DL_F32, lnd, lsz, st->q, 0, 0, s));
    DL_TRY(dl_attn_arg_seq(op, "out", *out, st->layout, &x));
    p->acc_out = x.ptr, p->acc_out_st = x.st, p->acc_dtype = DL_F32;
    DL_TRY(dl_attn_arg_lse(op, "lse", *lse, st->thd, &x));
    p->acc_lse = x.ptr, p->acc_lse_st = x.st;
    DL_TRY(dl_tensor_fill(*out, 0, s));
    DL_TRY(dl_tensor_fill(*lse, -INFINITY, s));
  } else {
    DL_CHECK_ARG(out && lse, "%s: out and lse slots are NULL", op);
    DL_TRY(dl_attn_arg_output(op, "out", m, out, st->q->dtype_id, ond, osz, st->q, st->thd, 0, s));
    DL_TRY(dl_attn_arg_output(op, "lse", m, lse, DL_F32, lnd, lsz, st->q, st->thd, -INFINITY, s));
    DL_TRY(dl_attn_arg_seq(op, "out", *out, st->layout, &x));
    p->out = x.ptr, p->out_st = x.st;
    DL_TRY(dl_attn_arg_lse(op, "lse", *lse, st->thd, &x));
    p->lse = x.ptr, p->lse_st = x.st;
  }
  if (max_logit) {
    DL_TRY(
        dl_attn_arg_output(op, "max_logit", m, max_logit, DL_F32, 1, &hsz, st->q, 1, -INFINITY, s));
    dl_view_t v;
    DL_TRY(dl_view_of(*max_logit, &v));
    p->max_logit = (float *)v.data;
  }
  return 0;
}

int dl_attn_fwd(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_tensor_t *k,
                const dl_tensor_t *v, dl_tensor_t **out, dl_tensor_t **lse, dl_tensor_t **max_logit,
                dl_tensor_t *acc_out, dl_tensor_t *acc_lse, dl_stream_t *s) {
  step_t st = {.op = "attn.fwd"};
  dl_attn_made_t m = {.n = 0};
  dl_attn_params_t p = {0};
  int rc = step_inputs(&st, o, q, k, v, &p, s), cudnn = 0;
  const int want_max = max_logit != NULL;
  if (!rc) rc = fwd_outputs(&st, &m, &p, out, lse, max_logit, acc_out, acc_lse, s);
  const int fused = p.acc_out != NULL; /* accumulate, or an f32 out */
  if (!rc) rc = dl_attn_cudnn_choose(o, q, &p, st.thd, 0, fused, want_max, &cudnn, NULL, 0);
  if (!rc && cudnn && q->dev_type == DL_META)
    rc = dl_attn_cudnn_account(&p, 0, st.thd, want_max, q, 0);
  if (!rc && q->dev_type != DL_META && st.oq.s > 0 && (st.oq.b > 0 || (st.thd && p.b > 0))) {
    void **ptrs[] = {(void **)&p.q, (void **)&p.k, (void **)&p.v};
    dl_attn_lend(ptrs, 3);
#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)
    if (cudnn) {
      if (!(rc = dl_attn_cudnn_fwd(&p, st.thd, q, s))) count_run(0, 3);
    } else
#endif
      rc = launch(0, &p, q, s);
  }
  step_free(&st);
  if (rc) dl_attn_made_undo(&m);
  return rc;
}

int dl_attn_bwd(const dl_attn_opts_t *o, const dl_tensor_t *dout, const dl_tensor_t *q,
                const dl_tensor_t *k, const dl_tensor_t *v, const dl_tensor_t *out,
                const dl_tensor_t *lse, dl_tensor_t **dq, dl_tensor_t **dk, dl_tensor_t **dv,
                dl_stream_t *s) {
  step_t st = {.op = "attn.bwd"};
  dl_attn_made_t m = {.n = 0};
  dl_attn_params_t p = {0};
  dl_storage_t *ws = NULL;
  const char *op = st.op;
  int rc = step_inputs(&st, o, q, k, v, &p, s);
  int64_t osz[4], lsz[3], qsz[4], ksz[4], vsz[4];
  dl_attn_operand_t x;
  int ond = out_shape(&st, st.ov.d, osz), lnd = lse_shape_of(&st, lsz);
  dl_attn_layout_shape(st.layout, st.oq.b, st.oq.s, st.oq.h, st.oq.d, qsz);
  dl_attn_layout_shape(st.layout, st.ok.b, st.ok.s, st.ok.h, st.ok.d, ksz);
  dl_attn_layout_shape(st.layout, st.ov.b, st.ov.s, st.ov.h, st.ov.d, vsz);
  struct {
    const char *name;
    const dl_tensor_t *t;
  } in[2] = {{"dout", dout}, {"out", out}};
  for (int i = 0; i < 2 && !rc; i++) {
    rc = dl_attn_arg_seq(op, in[i].name, in[i].t, st.layout, &x);
    if (!rc) rc = dl_attn_arg_same_device(op, in[i].name, in[i].t, q, "q");
    if (!rc && in[i].t->dtype_id != q->dtype_id)
      rc = DL_ERR(DL_EINVAL, "%s: %s is %s but q is %s", op, in[i].name,
                  dl_dtype_name(in[i].t->dtype_id), dl_dtype_name(q->dtype_id));
    if (!rc) rc = dl_attn_arg_expect_shape(op, in[i].name, in[i].t, ond, osz);
    if (!rc && i == 0) p.dout = x.ptr, p.dout_st = x.st;
    if (!rc && i == 1) p.out = x.ptr, p.out_st = x.st;
  }
  if (!rc) rc = dl_attn_arg_lse(op, "lse", lse, st.thd, &x);
  if (!rc) rc = dl_attn_arg_same_device(op, "lse", lse, q, "q");
  if (!rc) rc = dl_attn_arg_expect_shape(op, "lse", lse, lnd, lsz);
  if (!rc) p.lse = x.ptr, p.lse_st = x.st;
  if (!rc && o->accumulate_grads && !(dq && *dq && dk && *dk && dv && *dv))
    rc = DL_ERR(DL_EINVAL, "%s: accumulate_grads needs dq, dk and dv given", op);
  if (!rc && !(dq && dk && dv)) rc = DL_ERR(DL_EINVAL, "%s: dq, dk, dv slots are NULL", op);
  int dt = q->dtype_id, z = st.thd;
  if (!rc) rc = dl_attn_arg_output(op, "dq", &m, dq, dt, ond, qsz, q, z, 0, s);
  if (!rc) rc = dl_attn_arg_output(op, "dk", &m, dk, dt, ond, ksz, q, z, 0, s);
  if (!rc) rc = dl_attn_arg_output(op, "dv", &m, dv, dt, ond, vsz, q, z, 0, s);
  const char *gn[3] = {"dq", "dk", "dv"};
  dl_tensor_t **gs[3] = {dq, dk, dv};
  for (int i = 0; i < 3 && !rc; i++) {
    rc = dl_attn_arg_seq(op, gn[i], *gs[i], st.layout, &x);
    if (i == 0) p.dq = x.ptr, p.dq_st = x.st;
    if (i == 1) p.dk = x.ptr, p.dk_st = x.st;
    if (i == 2) p.dv = x.ptr, p.dv_st = x.st;
  }
  p.accumulate_grads = o && o->accumulate_grads;
  int empty = !(st.oq.s > 0 || st.ok.s > 0) || (st.thd ? p.b == 0 : st.oq.b == 0), cudnn = 0;
  if (!rc) rc = dl_attn_cudnn_choose(o, q, &p, st.thd, 1, 0, 0, &cudnn, NULL, 0);
  if (!rc && cudnn && q->dev_type == DL_META) {
    int64_t gb = (dl_tensor_numel(*dq) + dl_tensor_numel(*dk) + dl_tensor_numel(*dv)) *
                 dl_dtype_size(q->dtype_id);
    rc = dl_attn_cudnn_account(&p, 1, st.thd, 0, q, gb);
  }
  if (!rc && q->dev_type != DL_CPU && !empty && !cudnn) {
    void *h = NULL;
    dl_attn_params_t sized = p; /* on meta cu_seqlens_q has no memory; thd is its being set */
    if (st.thd) sized.cu_seqlens_q = (const int32_t *)&sized;
    p.workspace_bytes = dl_attn_bwd_workspace_bytes(&sized);
    rc = dl_stream_for(s, q->dev_type, q->dev_index, &h);
    if (!rc) rc = dl_storage_new(q->dev_type, q->dev_index, (int64_t)p.workspace_bytes, h, &ws);
    if (rc)
      rc = dl_error_context(rc, "%s: allocating the workspace", op);
    else
      p.workspace = ws->ptr;
  }
  if (!rc && q->dev_type != DL_META && !empty) {
    void **ptrs[] = {(void **)&p.q,   (void **)&p.k,    (void **)&p.v,
                     (void **)&p.out, (void **)&p.dout, (void **)&p.dq,
                     (void **)&p.dk,  (void **)&p.dv,   (void **)&p.lse};
    dl_attn_lend(ptrs, 9);
#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)
    if (cudnn) {
      if (!(rc = dl_attn_cudnn_bwd(&p, st.thd, q, *dq, *dk, *dv, st.layout, s))) count_run(1, 3);
    }
    else
#endif
      rc = launch(1, &p, q, s);
  }
  dl_storage_release(ws); /* stream-ordered: the next user of the block queues after us */
  step_free(&st);
  if (rc) dl_attn_made_undo(&m);
  return rc;
}

#ifdef DL_WITH_CUDA
/* "; kernel: <the Hopper kernel's description>" or "; kernel: portable (<label>: why not)" after why. */
static int kernel_why(dl_attn_params_t *p, int dev_index, int (*fits)(const dl_attn_params_t *, char *, size_t),
                      int (*usable)(const dl_attn_params_t *, int *), const char *label, char *why,
                      int64_t whylen) {
  char path[256]; // the kernel's why: its features (the forward's with the merge's options passed 160)
  int ok = 0, rc = 0;
  const int fit = fits(p, path, sizeof path);
  if (fit && !(rc = dl_cuda_use(dev_index))) rc = usable(p, &ok);
  if (rc) return rc;
  const size_t n = strlen(why);
  if (ok)
    snprintf(why + n, (size_t)whylen - n, "; kernel: %s", path);
  else
    snprintf(why + n, (size_t)whylen - n, "; kernel: portable (%s: %s)", label, fit ? "not an sm_90 device" : path);
  return 0;
}
#endif

int dl_attn_backend(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_tensor_t *k,
                    const dl_tensor_t *v, int bwd, int accumulate, int max_logit, int *chosen,
                    char *why, int64_t whylen) {
  step_t st = {.op = bwd ? "attn.bwd" : "attn.fwd"};
  dl_attn_params_t p = {0};
  DL_CHECK_ARG(chosen && why && whylen > 0, "dl_attn_backend: chosen or why is NULL");
  int rc = step_inputs(&st, o, q, k, v, &p, NULL), use = 0;
  if (!rc) {
    dl_attn_opts_t asked = *o;
    if (asked.backend == DL_ATTN_CUDNN) asked.backend = DL_ATTN_AUTO; /* a refusal is an answer here */
    rc = dl_attn_cudnn_choose(&asked, q, &p, st.thd, bwd, accumulate >= 0, max_logit, &use, why,
                              (size_t)whylen);
    if (!rc && !use && o->backend == DL_ATTN_CUDNN && strncmp(why, "ours: no keys", 13)) {
      *chosen = -1;
      memmove(why, why + 6, strlen(why + 6) + 1); /* drop "ours: " */
    } else {
      *chosen = use ? DL_ATTN_CUDNN : DL_ATTN_OURS;
    }
  }
#ifdef DL_WITH_CUDA
  /* ours on cuda: which of our kernels runs (the Hopper forward or backward, or the portable one) */
  if (!rc && *chosen == DL_ATTN_OURS && q->dev_type == DL_CUDA) {
    /* what the call would have: a merge target, else out; max_logit (the forward's variants read all three);
     * the merge target's stand-in 16-byte aligned as dl.attn's accumulators are (the TMA_M test reads it) */
    if (!bwd && accumulate >= 0) p.acc_out = (void *)(uintptr_t)256, p.acc_dtype = accumulate;
    else if (!bwd) p.out = (void *)1;
    if (!bwd && max_logit) p.max_logit = (float *)1;
    rc = kernel_why(&p, q->dev_index, bwd ? dl_attn_bwd_hopper_fits : dl_attn_fwd_hopper_fits,
                    bwd ? dl_attn_bwd_hopper_usable : dl_attn_fwd_hopper_usable,
                    bwd ? "hopper backward" : "hopper forward", why, whylen);
  }
#endif
  step_free(&st);
  return rc;
}
