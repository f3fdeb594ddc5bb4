/*
 * ep_int.h — the EP object as its files share it: ep.c (lifetime, layout of
 * the buffer, the failure record worded, the lifecycle's hooks) and
 * ep_run.c (the phases, their order and arguments).
 */
#ifndef DISTLAB_EP_INT_H
#define DISTLAB_EP_INT_H

#include "ep/ep.h"
#include "ops/common/devop.h"

/* where the phases stand (ep_run.c keeps their order) */
enum { IDLE = 0, SENT, DISPATCHED, COMBINE_SENT, COMBINED };
/* the object's own tensors past the public ones */
enum { T_SRC = DL_EP_NUM_TENSORS, T_HIDX, T_HW, N_TENSORS };

struct dl_ep {
  dl_devop_t op; /* the lifecycle: identity, buffer, failure (core/ops/common/devop.h) */
  dl_ep_config_t cfg;
  int local;
  int blocks, threads;
  dl_ep_args_t base;     /* the launch arguments that never change */
  int64_t bytes[DL_EP_NUM_PARTS];
  int tags[DL_EP_NUM_PARTS]; /* the tag each charged part went to */
  int charged;           /* parts charged so far (to give back) */
  dl_ep_status_t *status; /* op.status: host-mapped on cuda */
  dl_tensor_t *t[N_TENSORS];
  int state, tokens;
  int64_t dispatches, combines;
};

/* The EP buffer's kind of device op (ep.c). */
extern const dl_devop_kind_t dl_ep_kind;

/* DL_OK if ep is a live ep buffer, else DL_ESTATE naming fn. */
static inline int dl_ep_live(const dl_ep_t *ep, const char *fn) {
  return dl_devop_live(ep ? &ep->op : NULL, &dl_ep_kind, fn);
}
/* An output tensor [d0, d1, d2][:ndim] of dtype on the device, its storage's
 * bytes added to *bytes (ep.c). */
int dl_ep_output(dl_tensor_t **t, int64_t *bytes, int dev_type, int dev_index, int dtype, int ndim, int64_t d0,
                 int64_t d1, int64_t d2);
/* A tensor argument of an EP call: contiguous, on (dev_type, dev_index),
 * of dtype and shape [ndim], or an error naming what and owner. */
int dl_ep_tensor_arg(const dl_tensor_t *t, const char *what, int dev_type, int dev_index, const char *owner,
                     int dtype, int ndim, const int64_t *shape, dl_view_t *v);
/* Whether a phase (DL_EP_DISPATCH_SEND ...) may follow the state (IDLE
 * ...), and the rule each phase's refusal states (ep_run.c; the nccl_ep
 * backend keeps the same order: ep_nccl_run.c). */
int dl_ep_in_order(int phase, int state);
extern const char *const dl_ep_order_rules[];
/* "ep dispatch recv (per_rank, expert_major, bf16) on rank 1 of 4 (comm 'w', cpu:0)" */
int dl_ep_describe(const dl_ep_t *ep, int phase, char *buf, size_t len);

#endif
