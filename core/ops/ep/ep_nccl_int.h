/*
 * ep_nccl_int.h — the nccl_ep object as its files share it: ep_nccl.c
 * (options checked, group and handle, tensors, bytes, lifetime) and
 * ep_nccl_run.c (the calls, their order, NCCL EP's descriptors).
 */
#ifndef DISTLAB_EP_NCCL_INT_H
#define DISTLAB_EP_NCCL_INT_H

#include "ep_int.h"
#include "nccl_ep_api.h"

/* the object's tensors: the public ones, offsets, and the views of the
 * last dispatch's topk_idx and topk_weights (read again by the combine) */
enum { T_OFFSETS = DL_EP_OFFSETS, T_IDX, T_W, N_T };
/* the calls are dl_ep's phases (DL_EP_DISPATCH_SEND ... DL_EP_COMBINE, in
 * the same order: dl_ep_in_order, states IDLE ...), and for messages: */
enum { C_SETUP = DL_EP_COMBINE + 1, C_CHECK };

/* An NCCL EP tensor descriptor and the extents it points to. NCCL EP reads
 * them again in ncclEpComplete, so they live in the object. */
typedef struct {
  ncclEpTensor_t t;
  size_t sizes[3];
} dl_nccl_desc_t;

struct dl_ep_nccl {
  uint32_t magic;
  const dl_nccl_ep_api_t *api;
  dl_comm_t *comm;       /* not owned: the group runs on its ncclComm_t */
  dl_ep_nccl_config_t cfg;
  int rank, size, dev, local;
  int layout;            /* NCCL_EP_LAYOUT_* */
  int64_t slots;         /* rows of x */
  double timeout_s;
  char comm_name[96];
  ncclEpGroup_t group;
  ncclEpHandle_t handle;
  dl_tensor_t *t[N_T];
  int64_t bytes[DL_EP_NCCL_NUM_PARTS];
  int tag;               /* the memory tag charged with bytes[TOTAL] */
  int charged;
  /* what NCCL EP holds through the allocator hooks: pointer and size */
  struct { void *p; size_t n; } *blocks;
  int nblocks, cap;
  int64_t hooked;
  /* the descriptors of the calls in flight */
  dl_nccl_desc_t x, idx, w, rx, rscales, rw, ridx, counts, offsets, y, out, cw;
  int state, tokens, failed; /* state: IDLE ... (ep_int.h) */
  char failure[768];
  int64_t dispatches, combines;
};

/* "nccl_ep dispatch (low_latency, expert_major, bf16) on rank 0 of 2 (comm 'w', cuda:0)" */
void dl_ep_nccl_describe(const dl_ep_nccl_t *e, int call, char *buf, size_t len);
/* DL_OK for a live object; else DL_ESTATE naming fn. */
int dl_ep_nccl_live(const dl_ep_nccl_t *e, const char *fn);
/* Fill d for a contiguous tensor of NCCL dtype `dtype` at data. */
void dl_nccl_desc(dl_nccl_desc_t *d, int dtype, void *data, int ndim, int64_t d0, int64_t d1, int64_t d2);
/* An NCCL EP result as an error: the call, the object, NCCL's words for it. */
int dl_ep_nccl_error(const dl_ep_nccl_t *e, int call, const char *fn, int result);

#endif
