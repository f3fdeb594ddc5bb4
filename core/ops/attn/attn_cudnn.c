/*
 * attn_cudnn.c — the "cudnn" backend of an attention step, on the core's
 * side: which backend a call runs (dl_attn_opts_t.backend: ours, cudnn,
 * auto), and the cudnn call itself around core/ops/attn/cudnn_sdpa.cpp
 * (cuDNN's frontend; it builds and caches the plans).
 *
 * Choice. "cudnn" runs cuDNN or fails with the reason; "auto" runs cuDNN
 * where it takes the call, else ours; either way dl_attn_backend says which
 * and why. Reasons, checked in this order: the device (cuda only; meta
 * counts cuDNN's memory by formula, below), a call with no keys (nothing to
 * attend: ours writes the defined result, out 0 and lse -inf), the fused
 * merge (accumulate: it lives in our kernel's epilogue), a build without
 * cuDNN's frontend, a libcudnn that cannot be opened, views whose rows are
 * not 16-byte aligned, a configuration the libcudnn opened is known to
 * compute wrongly (the errata below: meta reads them for the cuDNN a cuda call
 * would open, core/ops/attn/cudnn_lib.c), then cuDNN's own answer: the plan is
 * built (and cached) and cuDNN's support check says yes or why not.
 *
 * A call. Our operands map onto cuDNN's [b, h, s, d] through strides (bshd,
 * sbhd; thd with the largest length as s and per-tensor ragged offsets made
 * from cu_seqlens and cu_seqlens_padded on the device: kernels/attn/
 * attn_cudnn.cu). cuDNN's stats are its natural-log LSE, packed [b, h, s]:
 * a bshd/sbhd lse that is packed takes them in place, others (thd's [h, t])
 * through a packed temporary; the same kernel gives rows that see no key
 * our convention (lse -inf, out 0). The backward reads a packed copy of lse
 * (cuDNN before 9.26 reads non-ragged stats as packed whatever their
 * strides). max_logit: cuDNN's per-row max, reduced over rows by our
 * kernel. accumulate_grads: cuDNN overwrites, so it writes temporaries that
 * are added into dq, dk, dv.
 *
 * Memory. Everything this backend allocates (cuDNN's workspace, the
 * temporaries above) is charged to the tag "cudnn_workspace" and given back
 * stream-ordered after the call. On meta nothing runs and cuDNN is not
 * asked, so the workspace is counted by formula: what cuDNN 9's Hopper
 * engines ask for, none forward, and an fp32 dQ accumulator plus an fp32
 * row sum of dO·O backward (b·h_q·s_q·(d_qk + 1)·4 bytes; the GPU check in
 * experiments/cp/cp_memory.lua measures the real one beside it).
 */
#include <stdio.h>
#include <string.h>

#include "attn_args.h"
#include "attn_cudnn.h"
#include "base/device.h"
#include "mem/alloc.h"

#define TAG "cudnn_workspace"

#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)
static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int strides_aligned(const dl_attn_strides_t *st) {
  return st->b % 8 == 0 && st->h % 8 == 0 && st->s % 8 == 0;
}
#endif

/* ---- errata ---------------------------------------------------------------------------- */

/* Configurations a cuDNN release computes wrongly, found by spec/attn_cudnn_spec.lua on a GPU:
 * below the first release known right, "cudnn" refuses them naming both, "auto" runs ours.
 * A row matches a direction, thd or not, and a head dim (d_qk or d_v) above above_d. */
static const struct cudnn_erratum {
  int64_t fixed_in; /* the first release known right, cudnnGetVersion's numbering */
  int bwd, thd;
  int64_t above_d;
  const char *what;
} errata[] = {
    {91900, 1, 1, 128,
     "thd backward with a head dim above 128 returns a wrong dq, silently (f16, d 256, "
     "causal_bottom_right: 134147 of 590848 elements, relative error 0.40, cuDNN 9.14.0 on an H200, "
     "2026-11-28; right on 9.19.0 and 9.28.1; bf16 and the other masks at that head dim are not "
     "known right before 9.19 either)"},
};

/* Why cuDNN `version` (the file at path) must not run this call, in buf; NULL if it may. */
static const char *erratum(int64_t version, const char *path, const dl_attn_params_t *p, int thd,
                           int bwd, char *buf, size_t n) {
  for (size_t i = 0; version && i < sizeof errata / sizeof errata[0]; i++) {
    const struct cudnn_erratum *e = &errata[i];
    if (version >= e->fixed_in || e->bwd != !!bwd || e->thd != !!thd ||
        (p->d_qk <= e->above_d && p->d_v <= e->above_d))
      continue;
    char v[32], fixed[32];
    dl_cudnn_version_str(version, v, sizeof v);
    dl_cudnn_version_str(e->fixed_in, fixed, sizeof fixed);
    snprintf(buf, n,
             "cuDNN %s (%s) is known to compute it wrongly: %s; use cuDNN %s or newer (PyTorch's "
             "wheel or scripts/fetch-cudnn-lib.sh's, which the pick prefers; or DISTLAB_CUDNN=<its "
             "libcudnn.so.9>) or backend \"ours\"",
             v, path[0] ? path : "?", e->what, fixed);
    return buf;
  }
  return NULL;
}

#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)
/* The plan key of a call (bwd: with the backward operands' strides). */
static void key_of(const dl_attn_params_t *p, int thd, int bwd, int want_max, int dev,
                   dl_cudnn_key_t *k) {
  memset(k, 0, sizeof *k);
  k->dev = dev, k->bwd = bwd, k->dtype = p->dtype, k->thd = thd;
  k->b = p->b, k->h_q = p->h_q, k->h_kv = p->h_kv, k->s_q = p->s_q, k->s_kv = p->s_kv;
  k->d_qk = p->d_qk, k->d_v = p->d_v;
  const dl_attn_strides_t *st[DL_CUDNN_NT] = {&p->q_st,    &p->k_st,  &p->v_st,  &p->out_st,
                                              &p->dout_st, &p->dq_st, &p->dk_st, &p->dv_st};
  for (int i = 0; i < DL_CUDNN_NT; i++) {
    if (!bwd && i > DL_CUDNN_O) break;
    const int q_side = i == DL_CUDNN_Q || i == DL_CUDNN_O || i == DL_CUDNN_DO || i == DL_CUDNN_DQ;
    const int64_t s = q_side ? p->s_q : p->s_kv;
    /* thd: ragged offsets place each sequence; the batch stride only has to be plausible */
    k->st[i][0] = thd ? (s > 0 ? s : 1) * st[i]->s : st[i]->b;
    k->st[i][1] = st[i]->h;
    k->st[i][2] = st[i]->s;
  }
  k->window_left = p->window_left, k->window_right = p->window_right;
  k->bottom_right = p->bottom_right, k->want_max = want_max && !bwd;
  memcpy(&k->scale_bits, &p->scale, sizeof p->scale);
}
#endif

static int say(char *why, size_t n, const char *fmt, const char *a) {
  if (why && n) snprintf(why, n, fmt, a);
  return 0;
}

int dl_attn_cudnn_choose(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_attn_params_t *p,
                         int thd, int bwd, int fused, int want_max, int *use, char *why,
                         size_t whylen) {
  *use = 0;
  const int backend = o->backend;
  DL_CHECK_ARG(backend >= DL_ATTN_OURS && backend <= DL_ATTN_AUTO,
               "attn: backend %d is not ours (0), cudnn (1) or auto (2)", backend);
  if (backend == DL_ATTN_OURS) return say(why, whylen, "%s", "backend \"ours\" asked for");
  const char *no = NULL;
  char buf[2048], path[512];
#if !defined(DL_WITH_CUDA) || !defined(DL_WITH_CUDNN_FE)
  (void)want_max;
#endif
  if (p->s_kv == 0 || p->s_q == 0) /* the result is fixed; not a refusal, even for "cudnn" */
    return say(why, whylen, "%s", "ours: no keys or no queries, nothing to attend (ours writes "
               "the defined result: out 0, lse -inf)");
  if (q->dev_type == DL_CPU) no = "q is on cpu; cuDNN runs on cuda only";
  else if (fused)
    no = "accumulate (the fused merge) lives in our kernel's epilogue; cuDNN has none";
  else if (q->dev_type == DL_META) {
    /* what cuda would run here: cuDNN unless the cuDNN it would open is known wrong on it */
    const int64_t v = dl_cudnn_errata_version(path, sizeof path);
    if (!(no = erratum(v, path, p, thd, bwd, buf, sizeof buf))) {
      *use = 1;
      return say(why, whylen, "%s", "meta: cuDNN's workspace counted by formula, nothing runs");
    }
  }
#if !defined(DL_WITH_CUDA) || !defined(DL_WITH_CUDNN_FE)
  else
    no = "this build has no cuDNN frontend (scripts/fetch-cudnn-frontend.sh, then rebuild)";
#else
  else if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) ||
             !strides_aligned(&p->q_st) || !strides_aligned(&p->k_st) ||
             !strides_aligned(&p->v_st))
    no = "q, k or v has rows that are not 16-byte aligned (cuDNN needs them)";
  else {
    int rc = dl_cudnn_load();
    if (!rc && !(no = erratum(dl_cudnn_errata_version(path, sizeof path), path, p, thd, bwd, buf,
                              sizeof buf))) {
      dl_cudnn_key_t key;
      void *plan;
      int64_t ws;
      key_of(p, thd, bwd, want_max, q->dev_index, &key);
      rc = dl_cudnn_plan(&key, &plan, &ws);
    }
    if (rc == DL_EUNSUPPORTED) {
      snprintf(buf, sizeof buf, "%s", dl_last_error());
      dl_clear_error();
      no = buf;
    } else if (rc) {
      return rc;
    }
  }
#endif
  if (!no) {
    *use = 1;
    return say(why, whylen, "%s", "cuDNN supports this call");
  }
  if (backend == DL_ATTN_AUTO) return say(why, whylen, "ours: %s", no);
  return DL_ERR(DL_EUNSUPPORTED,
                "attn.%s: backend \"cudnn\" cannot run this call: %s (backend \"auto\" would run "
                "ours)", bwd ? "bwd" : "fwd", no);
}

/* ---- meta ------------------------------------------------------------------------- */

int dl_attn_cudnn_account(const dl_attn_params_t *p, int bwd, int thd, int want_max,
                          const dl_tensor_t *q, int64_t grads_bytes) {
  int64_t rows = (int64_t)p->b * p->h_q * p->s_q, bytes = 0;
  const int packed = p->lse_st.s == 1 && p->lse_st.h == p->s_q &&
                     p->lse_st.b == (int64_t)p->h_q * p->s_q;
  if (bwd) bytes = rows * (p->d_qk + 1) * 4 + rows * 4; /* dQ accumulator and row sums; stats copy */
  else if (want_max) bytes = 2 * rows * 4;              /* row max and sum of exp */
  else if (thd || !packed) bytes = rows * 4;            /* stats temporary */
  if (bwd && p->accumulate_grads) bytes += grads_bytes; /* dq, dk, dv temporaries */
  if (thd) bytes += (int64_t)(2 * p->b + 8 * (p->b + 1)) * 4;
  dl_storage_t *st = NULL;
  DL_TRY(dl_mem_tag_push(TAG));
  int rc = dl_storage_new(DL_META, q->dev_index, bytes, NULL, &st);
  dl_mem_tag_pop();
  dl_storage_release(st);
  return rc;
}

/* ---- cuda ------------------------------------------------------------------------- */

#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)

/* One allocation for the call, carved into 256-byte aligned pieces. */
typedef struct carve {
  int64_t used;
  char *base;
} carve_t;

static void *piece(carve_t *c, int64_t bytes) {
  void *p = c->base ? c->base + c->used : NULL;
  c->used += (bytes + 255) / 256 * 256;
  return p;
}

/* Sizes (base NULL) or places (base set) the call's memory. */
static void lay_out(carve_t *c, const dl_attn_params_t *p, int thd, int bwd, int stats_tmp,
                    int want_max, int64_t ws, dl_cudnn_ptrs_t *ptrs, void **workspace) {
  const int64_t rows = (int64_t)p->b * p->h_q * p->s_q;
  *workspace = piece(c, ws > 0 ? ws : 1);
  ptrs->stats = stats_tmp ? (float *)piece(c, rows * 4) : NULL;
  ptrs->max = want_max && !bwd ? (float *)piece(c, rows * 4) : NULL;
  ptrs->sum_exp = want_max && !bwd ? (float *)piece(c, rows * 4) : NULL;
  if (thd) {
    ptrs->seq_q = (int32_t *)piece(c, p->b * 4);
    ptrs->seq_kv = (int32_t *)piece(c, p->b * 4);
    for (int i = 0; i < DL_CUDNN_NT; i++) ptrs->ragged[i] = (int32_t *)piece(c, (p->b + 1) * 4);
  }
}

static int ragged(const dl_attn_params_t *p, dl_cudnn_ptrs_t *ptrs, void *h) {
  const dl_attn_strides_t *st[DL_CUDNN_NT] = {&p->q_st,    &p->k_st,  &p->v_st,  &p->out_st,
                                              &p->dout_st, &p->dq_st, &p->dk_st, &p->dv_st};
  dl_attn_ragged_params_t r = {.b = p->b, .n = DL_CUDNN_NT};
  r.cu_q = p->cu_seqlens_q, r.cu_kv = p->cu_seqlens_kv;
  r.pad_q = p->cu_seqlens_q_padded, r.pad_kv = p->cu_seqlens_kv_padded;
  r.seq_q = ptrs->seq_q, r.seq_kv = ptrs->seq_kv;
  for (int i = 0; i < DL_CUDNN_NT; i++) {
    const int kv = i == DL_CUDNN_K || i == DL_CUDNN_V || i == DL_CUDNN_DK || i == DL_CUDNN_DV;
    DL_CHECK_ARG((kv ? p->total_kv : p->total_q) * st[i]->s <= INT32_MAX,
                 "attn (cudnn): thd offsets beyond int32 (%lld rows of stride %lld)",
                 (long long)(kv ? p->total_kv : p->total_q), (long long)st[i]->s);
    r.ragged[i] = ptrs->ragged[i], r.row_stride[i] = st[i]->s, r.kv_side[i] = kv;
  }
  return dl_attn_cudnn_ragged_cuda(&r, h);
}

static int stats_pass(const dl_attn_params_t *p, int thd, const dl_cudnn_ptrs_t *ptrs, int to_lse,
                      void *h) {
  dl_attn_stats_params_t sp = {.b = p->b, .h = p->h_q, .s = p->s_q, .d = p->d_v};
  sp.cu = thd ? p->cu_seqlens_q : NULL;
  sp.pad = thd ? p->cu_seqlens_q_padded : NULL;
  sp.seq_kv = thd ? ptrs->seq_kv : NULL;
  sp.max = ptrs->max, sp.sum_exp = ptrs->sum_exp;
  sp.stats = ptrs->stats, sp.lse = p->lse, sp.lse_st = p->lse_st;
  sp.out = to_lse ? p->out : NULL, sp.out_st = p->out_st;
  sp.to_lse = to_lse;
  return dl_attn_cudnn_stats_cuda(&sp, h);
}

static int packed_lse(const dl_attn_params_t *p) {
  return p->lse_st.s == 1 && p->lse_st.h == p->s_q && p->lse_st.b == (int64_t)p->h_q * p->s_q;
}

/* Runs a step on cuDNN: fwd, or bwd into dq/dk/dv (temporaries when accumulating). */
static int run(const dl_attn_params_t *p, int thd, int bwd, int want_max, int dev, void *h,
               dl_storage_t **mem) {
  dl_cudnn_key_t key;
  void *plan;
  int64_t ws;
  key_of(p, thd, bwd, want_max, dev, &key);
  DL_TRY(dl_cudnn_plan(&key, &plan, &ws));
  const int stats_tmp = bwd || ((thd || !packed_lse(p)) && !want_max);
  dl_cudnn_ptrs_t ptrs;
  memset(&ptrs, 0, sizeof ptrs);
  void *workspace;
  carve_t c = {0, NULL};
  lay_out(&c, p, thd, bwd, stats_tmp, want_max, ws, &ptrs, &workspace);
  DL_TRY(dl_mem_tag_push(TAG));
  int rc = dl_storage_new(DL_CUDA, dev, c.used, h, mem);
  dl_mem_tag_pop();
  if (rc) return dl_error_context(rc, "attn (cudnn): allocating %lld bytes of workspace",
                                  (long long)c.used);
  c = (carve_t){0, (char *)(*mem)->ptr};
  lay_out(&c, p, thd, bwd, stats_tmp, want_max, ws, &ptrs, &workspace);
  if (!stats_tmp) ptrs.stats = p->lse;
  const void *t[DL_CUDNN_NT] = {p->q, p->k, p->v, p->out, p->dout, p->dq, p->dk, p->dv};
  for (int i = 0; i < DL_CUDNN_NT; i++) ptrs.t[i] = (void *)t[i];
  if (thd) DL_TRY(ragged(p, &ptrs, h));
  if (bwd) DL_TRY(stats_pass(p, thd, &ptrs, 0, h));
  DL_TRY(dl_cudnn_run(plan, &ptrs, workspace, h));
  if (!bwd) DL_TRY(stats_pass(p, thd, &ptrs, 1, h));
  if (bwd && thd) {
    dl_attn_empty_rows_params_t e = {.b = p->b, .h_q = p->h_q, .h_kv = p->h_kv, .d_qk = p->d_qk,
                                     .d_v = p->d_v};
    e.cu_q = p->cu_seqlens_q, e.cu_kv = p->cu_seqlens_kv;
    e.pad_q = p->cu_seqlens_q_padded, e.pad_kv = p->cu_seqlens_kv_padded;
    e.dq = p->dq, e.dk = p->dk, e.dv = p->dv;
    e.dq_st = p->dq_st, e.dk_st = p->dk_st, e.dv_st = p->dv_st;
    DL_TRY(dl_attn_cudnn_empty_rows_cuda(&e, h));
  }
  if (ptrs.max && p->max_logit)
    DL_TRY(dl_attn_cudnn_max_cuda(ptrs.max, p->b, p->h_q, p->s_q, thd ? ptrs.seq_q : NULL,
                                  p->max_logit, h));
  return 0;
}

int dl_attn_cudnn_fwd(const dl_attn_params_t *p, int thd, const dl_tensor_t *q, dl_stream_t *s) {
  void *h;
  dl_storage_t *mem = NULL;
  DL_TRY(dl_cuda_use(q->dev_index));
  DL_TRY(dl_stream_for(s, q->dev_type, q->dev_index, &h));
  int rc = run(p, thd, 0, p->max_logit != NULL, q->dev_index, h, &mem);
  dl_storage_release(mem); /* stream-ordered: the next user of the block queues after us */
  return rc;
}

/* A zeroed temporary shaped like g, charged to the backend's tag. */
static int grad_tmp(const dl_tensor_t *g, dl_tensor_t **out, dl_stream_t *s) {
  DL_TRY(dl_mem_tag_push(TAG));
  int rc = dl_tensor_empty(out, g->dtype_id, g->nd, g->sz, g->dev_type, g->dev_index, s);
  dl_mem_tag_pop();
  if (!rc) rc = dl_tensor_fill(*out, 0, s);
  return rc;
}

int dl_attn_cudnn_bwd(const dl_attn_params_t *p, int thd, const dl_tensor_t *q, dl_tensor_t *dq,
                      dl_tensor_t *dk, dl_tensor_t *dv, int layout, dl_stream_t *s) {
  void *h;
  dl_storage_t *mem = NULL;
  DL_TRY(dl_cuda_use(q->dev_index));
  DL_TRY(dl_stream_for(s, q->dev_type, q->dev_index, &h));
  if (!p->accumulate_grads) {
    int rc = run(p, thd, 1, 0, q->dev_index, h, &mem);
    dl_storage_release(mem);
    return rc;
  }
  dl_tensor_t *gs[3] = {dq, dk, dv}, *tmp[3] = {NULL, NULL, NULL};
  dl_attn_params_t pt = *p;
  dl_attn_operand_t x;
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) rc = grad_tmp(gs[i], &tmp[i], s);
  if (!rc) rc = dl_attn_arg_seq("attn.bwd", "dq", tmp[0], layout, &x);
  if (!rc) pt.dq = x.ptr, pt.dq_st = x.st, rc = dl_attn_arg_seq("attn.bwd", "dk", tmp[1], layout, &x);
  if (!rc) pt.dk = x.ptr, pt.dk_st = x.st, rc = dl_attn_arg_seq("attn.bwd", "dv", tmp[2], layout, &x);
  if (!rc) pt.dv = x.ptr, pt.dv_st = x.st, rc = run(&pt, thd, 1, 0, q->dev_index, h, &mem);
  for (int i = 0; i < 3 && !rc; i++) rc = dl_tensor_axpby(gs[i], 1, tmp[i], 1, s);
  dl_storage_release(mem);
  for (int i = 0; i < 3; i++) dl_tensor_free(tmp[i]);
  return rc;
}

#endif

/* ---- what the library is -------------------------------------------------------------- */

int dl_attn_cudnn_info(dl_attn_cudnn_info_t *out) {
  DL_CHECK_ARG(out, "dl_attn_cudnn_info: out is NULL");
  memset(out, 0, sizeof *out);
#if defined(DL_WITH_CUDA) && defined(DL_WITH_CUDNN_FE)
  dl_cudnn_info_fill(out);
#else
  snprintf(out->path, sizeof out->path, "%s",
           "this build has no cuDNN frontend (scripts/fetch-cudnn-frontend.sh, then rebuild)");
#endif
  dl_cudnn_pick_describe(out->pick, sizeof out->pick);
  return DL_OK;
}
