/*
 * grouped_int.h — dl_gemm_grouped as its two files share it: grouped.c (the
 * operands, the counts, the plan, the call, the cpu and meta paths) and
 * grouped_run.c (the GEMMs run on cuda: batches, side streams, the backend).
 */
#ifndef DISTLAB_GEMM_GROUPED_INT_H
#define DISTLAB_GEMM_GROUPED_INT_H

#include "gemm/gemm.h"
#include "gemm_internal.h"

enum { PTR_ALIGN = 256 };

static inline const char *dl_grouped_op_name(int op) {
  return op == DL_GEMM_FWD ? "gemm.grouped" : op == DL_GEMM_DGRAD ? "gemm.grouped_dx"
                                                                   : "gemm.grouped_dw";
}

/* Expert e's matrix [K, N] of a [E, K, N] view. */
static inline dl_view_t dl_grouped_expert_view(const dl_view_t *v, int64_t e) {
  dl_view_t z = *v;
  z.ndim = 2;
  z.data = v->data + e * v->strides[0] * dl_dtype_size(v->dtype);
  z.shape[0] = v->shape[1], z.shape[1] = v->shape[2];
  z.strides[0] = v->strides[1], z.strides[1] = v->strides[2];
  z.numel = z.shape[0] * z.shape[1];
  return z;
}

/* The call's GEMMs: one per expert with rows, in order. */
typedef struct plan {
  dl_gemm_args_t *g; /* the experts with rows, in order */
  int64_t n;
  int64_t *empty; /* wgrad: the experts with none (their dW to zero) */
  int64_t n_empty;
} plan_t;

/* The loop's GEMMs into u (p->n of room): consecutive experts of one shape
 * with evenly spaced operands as one strided batch. Returns their number. */
int64_t dl_grouped_coalesce(const plan_t *p, dl_gemm_args_t *u);

#ifdef DL_WITH_CUDA
/* The plan on cuda under o's backend and streams (o->chosen set). */
int dl_grouped_run_cuda(dl_gemm_grouped_opts_t *o, const plan_t *p, const dl_tensor_t *a,
                        const dl_view_t *dw, int64_t E, dl_stream_t *s);
#endif

#endif
