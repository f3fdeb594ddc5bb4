/*
 * ep_run.c — the phases of an EP buffer: every rank makes the same calls in
 * the same order: dispatch_send, dispatch_recv, then any number of
 * (combine_send, combine_recv) pairs, then the next dispatch (or the fused
 * dispatch and combine). The host keeps that order; the epochs that pair a
 * phase with the peers' live in the buffer and the kernels advance them, so
 * a CUDA graph of calls replays correctly. One dispatch is in flight per
 * object: its outputs (x, counts, ...) and its routing (the handle: where
 * each row's output goes, the owner's topk copy) are the object's tensors,
 * reused by the next dispatch.
 */
#include <stdio.h>
#include <string.h>

#include "ep_int.h"
#include "base/device.h"

/* ---- running ------------------------------------------------------------------------ */

static void *data(const dl_tensor_t *t) {
  void *p = NULL;
  if (t) dl_tensor_data_ptr(t, &p);
  return p;
}

/* A tensor argument: contiguous, on the object's device, dtype and shape. */
static int arg(const dl_ep_t *ep, const dl_tensor_t *t, const char *what, int dtype, int ndim,
               const int64_t *shape, dl_view_t *v) {
  return dl_ep_tensor_arg(t, what, ep->op.dev_type, ep->op.dev_index, "the ep buffer", dtype, ndim, shape, v);
}

int dl_ep_tensor_arg(const dl_tensor_t *t, const char *what, int dev_type, int dev_index, const char *owner,
                     int dtype, int ndim, const int64_t *shape, dl_view_t *v) {
  DL_TRY(dl_tensor_arg(t, what, dev_type, dev_index, owner, v));
  char want[96], got[96];
  int n = 0, m = 0;
  for (int d = 0; d < ndim; d++) n += snprintf(want + n, sizeof want - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
  for (int d = 0; d < v->ndim; d++) m += snprintf(got + m, sizeof got - m, "%s%lld", d ? ", " : "", (long long)v->shape[d]);
  DL_CHECK_ARG(v->dtype == dtype, "%s must be %s, got %s", what, dl_dtype_name(dtype), dl_dtype_name(v->dtype));
  int same = v->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = v->shape[d] == shape[d];
  DL_CHECK_ARG(same, "%s must have shape [%s], got [%s]", what, want, got);
  return DL_OK;
}

/* The phase's kernel (or twin); meta runs nothing. */
static int launch(dl_ep_t *ep, dl_ep_args_t *a, dl_stream_t *s) {
  if (ep->op.dev_type == DL_META) return DL_OK;
  void *stream = NULL;
  DL_TRY(dl_stream_for(s, ep->op.dev_type, ep->op.dev_index, &stream));
  return dl_devop_launch(&ep->op, a, stream); /* the twin's timeout or bad id, worded */
}

/* The states each phase may follow: a dispatch after a finished dispatch
 * or combine, its receive after its send, combines after a dispatch. */
int dl_ep_in_order(int phase, int state) {
  switch (phase) {
  case DL_EP_DISPATCH_SEND:
  case DL_EP_DISPATCH: return state == IDLE || state == DISPATCHED || state == COMBINED;
  case DL_EP_DISPATCH_RECV: return state == SENT;
  case DL_EP_COMBINE_SEND:
  case DL_EP_COMBINE: return state == DISPATCHED || state == COMBINED;
  default: return state == COMBINE_SENT;
  }
}

const char *const dl_ep_order_rules[] = {
    "a dispatch_send or combine_send is waiting for its receive phase",
    "dispatch_recv needs a dispatch_send first",
    "combine needs a finished dispatch (dispatch_send, dispatch_recv) first",
    "combine_recv needs a combine_send first",
    "a dispatch_send or combine_send is waiting for its receive phase",
    "combine needs a finished dispatch (dispatch_send, dispatch_recv) first"};

/* Runs a phase; *launched says whether it ran (an error from an earlier
 * call's record, or a call out of order, runs nothing). Errors get the
 * phase's description. */
static int run(dl_ep_t *ep, int phase, dl_ep_args_t *a, dl_stream_t *s, int *launched) {
  char what[256];
  dl_ep_describe(ep, phase, what, sizeof what);
  *launched = 0;
  /* a bad expert id that an earlier kernel recorded (cuda: the host reads
   * the record without waiting for the stream) does not stop this phase:
   * it runs, then the id is reported (DL_EINVAL), as the cpu twin reports
   * it at the end of its own call; the buffer goes on */
  const volatile dl_ep_status_t *st = ep->status;
  const int deferred = !ep->op.failed && st && st->kind == DL_EP_ERR_BAD_ID;
  int rc = deferred ? DL_OK : dl_devop_recorded_failure(&ep->op);
  if (rc == DL_OK && !dl_ep_in_order(phase, ep->state))
    rc = DL_ERR(DL_ESTATE, "%s: out of order: %s", what, dl_ep_order_rules[phase]);
  if (rc < 0) return rc;
  a->phase = phase;
  *launched = 1;
  rc = launch(ep, a, s);
  if (rc < 0 && !ep->op.failed && rc != DL_EINVAL) { /* a recorded failure names the phase already */
    dl_error_context(rc, "%s", what);
    dl_devop_set_failed(&ep->op);
  }
  if (rc == DL_OK && deferred) rc = dl_devop_recorded_failure(&ep->op);
  return rc;
}

/* The send phase's arguments, checked: x [T, H] bf16, topk_idx [T, K] i32,
 * topk_weights [T, K] f32, T <= max_tokens. */
static int send_args(dl_ep_t *ep, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                     const dl_tensor_t *topk_weights, dl_ep_args_t *out) {
  const dl_ep_config_t *c = &ep->cfg;
  dl_view_t vx, vi, vw;
  DL_TRY(dl_tensor_arg(x, "x", ep->op.dev_type, ep->op.dev_index, "the ep buffer", &vx));
  const int64_t T = vx.ndim == 2 ? vx.shape[0] : -1;
  DL_CHECK_ARG(T >= 0, "ep dispatch: x must be [T, %d] (2 dimensions), got %d", c->hidden, vx.ndim);
  DL_CHECK_ARG(T <= c->max_tokens, "ep dispatch: %lld tokens, more than the buffer's max_tokens %d",
               (long long)T, c->max_tokens);
  const int64_t sx[2] = {T, c->hidden}, sk[2] = {T, c->topk};
  DL_TRY(arg(ep, x, "ep dispatch: x", DL_BF16, 2, sx, &vx));
  DL_TRY(arg(ep, topk_idx, "ep dispatch: topk_idx", DL_I32, 2, sk, &vi));
  DL_TRY(arg(ep, topk_weights, "ep dispatch: topk_weights", DL_F32, 2, sk, &vw));
  dl_ep_args_t a = ep->base;
  a.tokens = (int)T;
  a.x = vx.data;
  a.idx = (const int32_t *)vi.data;
  a.w = (const float *)vw.data;
  a.hidx = data(ep->t[T_HIDX]);
  a.hw = data(ep->t[T_HW]);
  *out = a;
  return DL_OK;
}

/* The receive phase's outputs. */
static void recv_args(const dl_ep_t *ep, dl_ep_args_t *a) {
  a->rx = data(ep->t[DL_EP_X]);
  a->rscales = data(ep->t[DL_EP_SCALES]);
  a->rcounts = data(ep->t[DL_EP_COUNTS]);
  a->rids = data(ep->t[DL_EP_EXPERT_IDS]);
  a->rweights = data(ep->t[DL_EP_WEIGHTS]);
  a->rsrc = data(ep->t[T_SRC]);
}

/* A dispatch's send (phase DL_EP_DISPATCH_SEND, or both halves with
 * DL_EP_DISPATCH): run, and the state it leaves. */
static int dispatch(dl_ep_t *ep, int phase, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                    const dl_tensor_t *topk_weights, dl_stream_t *s) {
  dl_ep_args_t a;
  DL_TRY(send_args(ep, x, topk_idx, topk_weights, &a));
  recv_args(ep, &a); /* the send too: per_rank + rank_major writes this rank's own rows itself */
  int launched, rc = run(ep, phase, &a, s, &launched);
  if (!launched || (rc < 0 && rc != DL_EINVAL)) return rc;
  /* sent (a bad expert id on cpu is reported now, the protocol done) */
  ep->state = phase == DL_EP_DISPATCH ? DISPATCHED : SENT;
  ep->tokens = a.tokens;
  ep->dispatches++;
  return rc;
}

int dl_ep_dispatch_send(dl_ep_t *ep, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                        const dl_tensor_t *topk_weights, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_dispatch_send"));
  return dispatch(ep, DL_EP_DISPATCH_SEND, x, topk_idx, topk_weights, s);
}

int dl_ep_dispatch(dl_ep_t *ep, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                   const dl_tensor_t *topk_weights, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_dispatch"));
  return dispatch(ep, DL_EP_DISPATCH, x, topk_idx, topk_weights, s);
}

int dl_ep_dispatch_recv(dl_ep_t *ep, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_dispatch_recv"));
  dl_ep_args_t a = ep->base;
  a.tokens = ep->tokens;
  recv_args(ep, &a);
  int launched, rc = run(ep, DL_EP_DISPATCH_RECV, &a, s, &launched);
  if (!launched || (rc < 0 && rc != DL_EINVAL)) return rc;
  ep->state = DISPATCHED; /* ran (a bad id of an earlier send is reported now) */
  return rc;
}

/* The combine's send (y shaped like recv.x, bf16) and receive (out bf16
 * [T, H]) arguments, checked; either may be NULL (not this call's half). */
static int combine_args(dl_ep_t *ep, const dl_tensor_t *y, dl_tensor_t *out, dl_ep_args_t *a) {
  *a = ep->base;
  a->tokens = ep->tokens;
  if (y) {
    const dl_tensor_t *x = ep->t[DL_EP_X];
    dl_view_t vy;
    DL_TRY(arg(ep, y, "ep combine: y (shaped like recv.x, bf16)", DL_BF16, x->nd, x->sz, &vy));
    a->y = vy.data;
    a->rcounts = data(ep->t[DL_EP_COUNTS]);
    a->rsrc = data(ep->t[T_SRC]);
  }
  if (out) {
    dl_view_t vo;
    const int64_t so[2] = {ep->tokens, ep->cfg.hidden};
    DL_TRY(arg(ep, out, "ep combine: out", DL_BF16, 2, so, &vo));
    a->out = vo.data;
    a->hidx = data(ep->t[T_HIDX]);
    a->hw = data(ep->t[T_HW]);
  }
  return DL_OK;
}

/* A combine phase (DL_EP_COMBINE_SEND, _RECV, or both halves with
 * DL_EP_COMBINE): run, and the state it leaves. */
static int combine(dl_ep_t *ep, int phase, const dl_tensor_t *y, dl_tensor_t *out, dl_stream_t *s) {
  dl_ep_args_t a;
  DL_TRY(combine_args(ep, y, out, &a));
  int launched, rc = run(ep, phase, &a, s, &launched);
  if (!launched || (rc < 0 && rc != DL_EINVAL)) return rc;
  ep->state = phase == DL_EP_COMBINE_SEND ? COMBINE_SENT : COMBINED;
  if (phase != DL_EP_COMBINE_SEND) ep->combines++;
  return rc;
}

int dl_ep_combine_send(dl_ep_t *ep, const dl_tensor_t *y, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_combine_send"));
  DL_CHECK_ARG(y, "ep combine: y is NULL");
  return combine(ep, DL_EP_COMBINE_SEND, y, NULL, s);
}

int dl_ep_combine_recv(dl_ep_t *ep, dl_tensor_t *out, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_combine_recv"));
  DL_CHECK_ARG(out, "ep combine: out is NULL");
  return combine(ep, DL_EP_COMBINE_RECV, NULL, out, s);
}

int dl_ep_combine(dl_ep_t *ep, const dl_tensor_t *y, dl_tensor_t *out, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_combine"));
  DL_CHECK_ARG(y && out, "ep combine: y and out must not be NULL");
  return combine(ep, DL_EP_COMBINE, y, out, s);
}

int dl_ep_check(dl_ep_t *ep, dl_stream_t *s) {
  DL_TRY(dl_ep_live(ep, "dl_ep_check"));
  DL_TRY(dl_devop_wait_stream(&ep->op, s, "ep check", NULL));
  return dl_devop_recorded_failure(&ep->op);
}
