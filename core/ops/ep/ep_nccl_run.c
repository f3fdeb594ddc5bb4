/*
 * ep_nccl_run.c — the calls of the nccl_ep buffer, in dl_ep's order
 * (dispatch_send, dispatch_recv, then any number of combines, then the
 * next dispatch; dl_ep_in_order), each checked to the last shape before
 * NCCL EP sees it (its own checks abort the process).
 *
 * A dispatch is ncclEpUpdateHandle with the routing (low latency: the
 * handle keeps the topk_idx descriptor, which its combine reads again; high
 * throughput: its routing maps, an all-gather, and the counts) and then
 * ncclEpDispatch. The send phases are low latency's send_only calls and
 * the receives its ncclEpComplete, which reads the descriptors of the send
 * again: they live in the object. Low latency's group masks a peer that
 * does not arrive within the timeout (enable_mask); every call and
 * dl_ep_nccl_check read the flag it sets (ncclEpGetAsyncError), and the
 * buffer then refuses work, as does any NCCL EP call that failed (the
 * ranks are out of step).
 */
#include <stdio.h>
#include <string.h>

#include "ep_nccl_int.h"
#include "base/device.h"

/* ---- state ------------------------------------------------------------------------- */

/* The buffer refuses further work, for the error just set. */
static int fail(dl_ep_nccl_t *e, int rc) {
  if (!e->failed) snprintf(e->failure, sizeof e->failure, "%s", dl_last_error());
  e->failed = 1;
  return rc;
}

/* Low latency: a peer NCCL EP masked after a wait past the timeout. */
static int masked(dl_ep_nccl_t *e, int call) {
  if (e->cfg.algorithm != DL_EP_NCCL_LOW_LATENCY) return DL_OK;
  int flag = 0, r = e->api->GetAsyncError(e->group, &flag);
  if (r != 0) return fail(e, dl_ep_nccl_error(e, call, "ncclEpGetAsyncError", r));
  if (!flag) return DL_OK;
  char what[256];
  dl_ep_nccl_describe(e, call, what, sizeof what);
  return fail(e, DL_ERR(DL_ETIMEOUT,
                        "%s: a peer did not arrive within %.1f s: NCCL EP's low-latency kernels masked it and went "
                        "on without its rows; did every rank make the same ep calls?", what, e->timeout_s));
}

/* What every call checks first; *stream gets its CUDA stream. */
static int begin(dl_ep_nccl_t *e, int call, const char *fn, dl_stream_t *s, void **stream) {
  DL_TRY(dl_ep_nccl_live(e, fn));
  char what[256];
  dl_ep_nccl_describe(e, call, what, sizeof what);
  if (e->failed) return DL_ERR(DL_ESTATE, "%s: this nccl_ep buffer failed earlier and refuses work: %s", what, e->failure);
  const int staged = call == DL_EP_DISPATCH_SEND || call == DL_EP_DISPATCH_RECV || call == DL_EP_COMBINE_SEND ||
                     call == DL_EP_COMBINE_RECV;
  DL_CHECK_ARG(!staged || e->cfg.algorithm == DL_EP_NCCL_LOW_LATENCY,
               "%s: high_throughput has no send and receive phases (NCCL EP's send_only is low-latency only): "
               "ep:dispatch and ep:combine, or algorithm = \"low_latency\"", what);
  if (!dl_ep_in_order(call, e->state))
    return DL_ERR(DL_ESTATE, "%s: out of order: %s", what, dl_ep_order_rules[call]);
  DL_TRY(dl_stream_for(s, DL_CUDA, e->dev, stream));
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(e->dev));
#endif
  DL_TRY(masked(e, call));
  dl_graph_note_user(e);
  return DL_OK;
}

static void *data(const dl_tensor_t *t) {
  void *p = NULL;
  if (t) dl_tensor_data_ptr(t, &p);
  return p;
}

/* A view of t that keeps its storage (the combine reads it again). */
static int keep(dl_ep_nccl_t *e, int which, const dl_tensor_t *t) {
  dl_tensor_t *v;
  DL_TRY(dl_tensor_as_strided(&v, t, t->nd, t->sz, t->st, t->offset));
  dl_tensor_free(e->t[which]);
  e->t[which] = v;
  return DL_OK;
}

/* ---- dispatch ----------------------------------------------------------------------- */

/* The output descriptors of the configuration (distlab.h). */
static void describe_outputs(dl_ep_nccl_t *e) {
  const dl_ep_nccl_config_t *c = &e->cfg;
  const int64_t N = e->size, B = c->max_tokens, H = c->hidden, K = c->topk, L = e->local, S = e->slots;
  const dl_tensor_t *x = e->t[DL_EP_X];
  dl_nccl_desc(&e->rx, c->fp8 ? NCCLX_FLOAT8E4M3 : NCCLX_BFLOAT16, data(x), x->nd, x->sz[0], x->sz[1],
               x->nd > 2 ? x->sz[2] : 0);
  if (c->fp8) dl_nccl_desc(&e->rscales, NCCLX_FLOAT32, data(e->t[DL_EP_SCALES]), 3, x->sz[0], x->sz[1], H / 128);
  dl_nccl_desc(&e->counts, NCCLX_INT32, data(e->t[DL_EP_COUNTS]), 1, e->t[DL_EP_COUNTS]->sz[0], 0, 0);
  if (c->algorithm == DL_EP_NCCL_LOW_LATENCY) {
    dl_nccl_desc(&e->rw, NCCLX_FLOAT32, data(e->t[DL_EP_WEIGHTS]), 3, N, B, K);
    dl_nccl_desc(&e->ridx, NCCLX_INT32, data(e->t[DL_EP_EXPERT_IDS]), 3, N, B, K);
  } else if (c->output == DL_EP_EXPERT_MAJOR) {
    dl_nccl_desc(&e->rw, NCCLX_FLOAT32, data(e->t[DL_EP_WEIGHTS]), 1, S, 0, 0);
    dl_nccl_desc(&e->offsets, NCCLX_INT32, data(e->t[T_OFFSETS]), 1, L, 0, 0);
  } else {
    dl_nccl_desc(&e->rw, NCCLX_FLOAT32, data(e->t[DL_EP_WEIGHTS]), 2, S, K, 0);
    dl_nccl_desc(&e->ridx, NCCLX_INT64, data(e->t[DL_EP_EXPERT_IDS]), 2, S, K, 0); /* its HT ids are 64-bit */
  }
}

static int dispatch(dl_ep_nccl_t *e, int call, const char *fn, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                    const dl_tensor_t *topk_weights, dl_stream_t *s) {
  void *stream;
  DL_TRY(begin(e, call, fn, s, &stream));
  const dl_ep_nccl_config_t *c = &e->cfg;
  const char *owner = "the nccl_ep buffer";
  dl_view_t vx, vi, vw;
  DL_TRY(dl_tensor_arg(x, "x", DL_CUDA, e->dev, owner, &vx));
  const int64_t T = vx.ndim == 2 ? vx.shape[0] : -1;
  DL_CHECK_ARG(T >= 0, "nccl_ep dispatch: x must be [T, %d] (2 dimensions), got %d", c->hidden, vx.ndim);
  DL_CHECK_ARG(T <= c->max_tokens, "nccl_ep dispatch: %lld tokens, more than the buffer's max_tokens %d",
               (long long)T, c->max_tokens);
  const int64_t sx[2] = {T, c->hidden}, sk[2] = {T, c->topk};
  DL_TRY(dl_ep_tensor_arg(x, "nccl_ep dispatch: x", DL_CUDA, e->dev, owner, DL_BF16, 2, sx, &vx));
  DL_TRY(dl_ep_tensor_arg(topk_idx, "nccl_ep dispatch: topk_idx", DL_CUDA, e->dev, owner, DL_I32, 2, sk, &vi));
  DL_TRY(dl_ep_tensor_arg(topk_weights, "nccl_ep dispatch: topk_weights", DL_CUDA, e->dev, owner, DL_F32, 2, sk, &vw));
  const int ll = c->algorithm == DL_EP_NCCL_LOW_LATENCY, em = c->output == DL_EP_EXPERT_MAJOR;
  dl_nccl_desc(&e->x, NCCLX_BFLOAT16, vx.data, 2, T, c->hidden, 0);
  dl_nccl_desc(&e->idx, NCCLX_INT32, vi.data, 2, T, c->topk, 0);
  dl_nccl_desc(&e->w, NCCLX_FLOAT32, vw.data, 2, T, c->topk, 0);
  describe_outputs(e);

  ncclEpLayoutInfo_t routing = {sizeof routing, NCCL_EP_MAGIC, NULL, NULL, NULL, NULL, 0, {0}};
  if (!ll && em) routing.expert_counters = &e->counts.t, routing.expert_offsets = &e->offsets.t;
  if (!ll && !em) routing.recv_total_counter = &e->counts.t;
  int r = e->api->UpdateHandle(e->handle, &e->idx.t, ll ? NULL : &routing, stream);
  if (r != 0) return fail(e, dl_ep_nccl_error(e, call, "ncclEpUpdateHandle", r));

  ncclEpLayoutInfo_t counters = {sizeof counters, NCCL_EP_MAGIC, NULL, NULL, NULL, NULL, NCCL_EP_EXPERT_ID_LOCAL, {0}};
  if (ll && em) counters.expert_counters = &e->counts.t;
  if (ll && !em) counters.src_rank_counters = &e->counts.t;
  const int ll_em = ll && em; /* LL expert-major takes the weights at the combine */
  ncclEpDispatchInputs_t in = {sizeof in, NCCL_EP_MAGIC, &e->x.t, ll_em ? NULL : &e->w.t, NULL};
  ncclEpDispatchOutputs_t out = {sizeof out, NCCL_EP_MAGIC, &e->rx.t, ll_em ? NULL : &e->rw.t,
                                 c->fp8 ? &e->rscales.t : NULL, (ll && !em) || (!ll && !em) ? &e->ridx.t : NULL};
  ncclEpDispatchConfig_t cfg = {sizeof cfg, NCCL_EP_MAGIC, call == DL_EP_DISPATCH_SEND, 0, 0,
                                c->fp8 ? NCCL_EP_DISP_QUANT_DS_FP8E3M4 : NCCL_EP_DISP_QUANT_NONE};
  r = e->api->Dispatch(e->handle, &in, &out, &counters, &cfg, stream);
  if (r != 0) return fail(e, dl_ep_nccl_error(e, call, "ncclEpDispatch", r));
  e->state = call == DL_EP_DISPATCH_SEND ? SENT : DISPATCHED;
  e->tokens = (int)T;
  e->dispatches++;
  DL_TRY(keep(e, T_IDX, topk_idx));
  return keep(e, T_W, topk_weights);
}

int dl_ep_nccl_dispatch_send(dl_ep_nccl_t *e, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                             const dl_tensor_t *topk_weights, dl_stream_t *s) {
  return dispatch(e, DL_EP_DISPATCH_SEND, "dl_ep_nccl_dispatch_send", x, topk_idx, topk_weights, s);
}

int dl_ep_nccl_dispatch(dl_ep_nccl_t *e, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                        const dl_tensor_t *topk_weights, dl_stream_t *s) {
  return dispatch(e, DL_EP_DISPATCH, "dl_ep_nccl_dispatch", x, topk_idx, topk_weights, s);
}

/* The receive of a send_only call: ncclEpComplete. */
static int complete(dl_ep_nccl_t *e, int call, void *stream, int next) {
  int r = e->api->Complete(e->handle, NULL, stream);
  if (r != 0) return fail(e, dl_ep_nccl_error(e, call, "ncclEpComplete", r));
  e->state = next;
  return DL_OK;
}

int dl_ep_nccl_dispatch_recv(dl_ep_nccl_t *e, dl_stream_t *s) {
  void *stream;
  DL_TRY(begin(e, DL_EP_DISPATCH_RECV, "dl_ep_nccl_dispatch_recv", s, &stream));
  return complete(e, DL_EP_DISPATCH_RECV, stream, DISPATCHED);
}

/* ---- combine ------------------------------------------------------------------------ */

/* y shaped like x (bf16) into out [T, H] bf16; combine_send writes into the
 * buffer's own out, where combine_recv must look (NCCL EP names the output
 * at the send). */
static int combine(dl_ep_nccl_t *e, int call, const char *fn, const dl_tensor_t *y, const dl_tensor_t *out,
                   dl_stream_t *s) {
  void *stream;
  DL_TRY(begin(e, call, fn, s, &stream));
  const dl_ep_nccl_config_t *c = &e->cfg;
  const dl_tensor_t *x = e->t[DL_EP_X];
  const char *owner = "the nccl_ep buffer";
  const int64_t so[2] = {e->tokens, c->hidden};
  dl_view_t vy, vo;
  DL_TRY(dl_ep_tensor_arg(y, "nccl_ep combine: y (shaped like recv.x, bf16)", DL_CUDA, e->dev, owner, DL_BF16, x->nd,
                          x->sz, &vy));
  if (out) {
    DL_TRY(dl_ep_tensor_arg(out, "nccl_ep combine: out", DL_CUDA, e->dev, owner, DL_BF16, 2, so, &vo));
  } else {
    vo.data = data(e->t[DL_EP_OUT]);
  }
  dl_nccl_desc(&e->y, NCCLX_BFLOAT16, vy.data, x->nd, x->sz[0], x->sz[1], x->nd > 2 ? x->sz[2] : 0);
  dl_nccl_desc(&e->out, NCCLX_BFLOAT16, vo.data, 2, e->tokens, c->hidden, 0);
  const int ll_em = c->algorithm == DL_EP_NCCL_LOW_LATENCY && c->output == DL_EP_EXPERT_MAJOR;
  dl_nccl_desc(&e->cw, NCCLX_FLOAT32, data(e->t[T_W]), 2, e->tokens, c->topk, 0);
  ncclEpCombineInputs_t in = {sizeof in, NCCL_EP_MAGIC, &e->y.t, NULL, NULL};
  ncclEpCombineOutputs_t o = {sizeof o, NCCL_EP_MAGIC, &e->out.t, ll_em ? &e->cw.t : NULL};
  ncclEpCombineConfig_t cfg = {sizeof cfg, NCCL_EP_MAGIC, call == DL_EP_COMBINE_SEND, 0, 0};
  int r = e->api->Combine(e->handle, &in, &o, &cfg, stream);
  if (r != 0) return fail(e, dl_ep_nccl_error(e, call, "ncclEpCombine", r));
  e->state = call == DL_EP_COMBINE_SEND ? COMBINE_SENT : COMBINED;
  if (call == DL_EP_COMBINE) e->combines++;
  return DL_OK;
}

int dl_ep_nccl_combine_send(dl_ep_nccl_t *e, const dl_tensor_t *y, dl_stream_t *s) {
  DL_CHECK_ARG(y, "nccl_ep combine: y is NULL");
  return combine(e, DL_EP_COMBINE_SEND, "dl_ep_nccl_combine_send", y, NULL, s);
}

int dl_ep_nccl_combine(dl_ep_nccl_t *e, const dl_tensor_t *y, dl_tensor_t *out, dl_stream_t *s) {
  DL_CHECK_ARG(y && out, "nccl_ep combine: y and out must not be NULL");
  return combine(e, DL_EP_COMBINE, "dl_ep_nccl_combine", y, out, s);
}

int dl_ep_nccl_combine_recv(dl_ep_nccl_t *e, dl_tensor_t *out, dl_stream_t *s) {
  void *stream;
  DL_TRY(begin(e, DL_EP_COMBINE_RECV, "dl_ep_nccl_combine_recv", s, &stream));
  DL_CHECK_ARG(out && data(out) == e->out.t.data,
               "nccl_ep combine_recv: out must be where combine_send wrote, the buffer's own out (NCCL EP names "
               "the output at the send): give none, or use ep:combine(y, h, {out = t})");
  DL_TRY(complete(e, DL_EP_COMBINE_RECV, stream, COMBINED));
  e->combines++;
  return DL_OK;
}

/* ---- check -------------------------------------------------------------------------- */

int dl_ep_nccl_check(dl_ep_nccl_t *e, dl_stream_t *s) {
  DL_TRY(dl_ep_nccl_live(e, "dl_ep_nccl_check"));
  char what[256];
  dl_ep_nccl_describe(e, C_CHECK, what, sizeof what);
  if (e->failed) return DL_ERR(DL_ESTATE, "%s: this nccl_ep buffer failed earlier and refuses work: %s", what, e->failure);
#ifdef DL_WITH_CUDA
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, e->dev, &h));
  DL_TRY(dl_cuda_use(e->dev));
  const double t0 = dl_now_us(), most_s = 2 * e->timeout_s + 1;
  cudaError_t q;
  while ((q = cudaStreamQuery((cudaStream_t)h)) == cudaErrorNotReady) {
    DL_TRY(masked(e, C_CHECK));
    if (dl_now_us() - t0 > most_s * 1e6)
      return fail(e, DL_ERR(DL_ETIMEOUT, "%s: the stream did not finish within %.1f s", what, most_s));
    dl_wait_pause(t0);
  }
  if (q != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(e, DL_ERR(DL_ECUDA, "%s: the stream failed: %s (%s; high_throughput's kernels trap on a wait past "
                                    "the timeout, %.1f s: the CUDA context is lost)",
                          what, cudaGetErrorString(q), cudaGetErrorName(q), e->timeout_s));
  }
#else
  (void)s;
#endif
  return masked(e, C_CHECK);
}
