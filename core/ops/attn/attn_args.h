/*
 * attn_args.h — what core/ops/attn/attn.c (steps) and core/ops/attn/attn_merge.c (merges)
 * share: checking the tensors of an attention call, with messages that name
 * the argument, and turning them into the kernels' operands; reading
 * cu_seqlens; checking or allocating outputs. Internal to the core.
 */
#ifndef DISTLAB_ATTN_ARGS_H
#define DISTLAB_ATTN_ARGS_H

#include "attn/attn.h"
#include "base/internal.h"

extern const char *dl_attn_layout_names[];

/* A [b, s, h, d] operand (thd: b = 0, s = rows) or an lse ([b, h, s] / [h, t]). */
typedef struct dl_attn_operand {
  int64_t b, s, h, d;
  dl_attn_strides_t st;
  void *ptr;
} dl_attn_operand_t;

/* What a call allocated, so that a failure leaves the caller's slots as they were. */
typedef struct dl_attn_made {
  dl_tensor_t **slot[4];
  int n;
} dl_attn_made_t;

int dl_attn_arg_present(const char *op, const char *name, const dl_tensor_t *t);

void dl_attn_arg_shape_str(char *buf, size_t n, int nd, const int64_t *sz);

int dl_attn_arg_same_device(const char *op, const char *name, const dl_tensor_t *t,
                            const dl_tensor_t *ref, const char *ref_name);

/* Sequence operand in `layout`: checks rank and the contiguous last dim. */
int dl_attn_arg_seq(const char *op, const char *name, const dl_tensor_t *t, int layout,
                    dl_attn_operand_t *x);

int dl_attn_arg_lse(const char *op, const char *name, const dl_tensor_t *t, int thd,
                    dl_attn_operand_t *x);

/* The shape of a [b, s, h, d] operand in `layout` (thd: [s, h, d]); returns ndim. */
int dl_attn_layout_shape(int layout, int64_t b, int64_t s, int64_t h, int64_t d, int64_t *sz);

int dl_attn_lse_shape(int thd, int64_t b, int64_t h, int64_t s, int64_t *sz);

int dl_attn_arg_expect_shape(const char *op, const char *name, const dl_tensor_t *t, int nd,
                             const int64_t *want);

int dl_attn_arg_cu(const char *op, const char *name, const dl_tensor_t *t, const dl_tensor_t *like,
                   const char *like_name, int64_t n, const int32_t **ptr);

/* A host copy of a cu_seqlens tensor (malloc'd; a sync on cuda). */
int dl_attn_arg_cu_host(const char *op, const char *name, const dl_tensor_t *t, dl_stream_t *s,
                        int32_t **out);

/* Every sequence i (length cu[i+1]-cu[i] >= 0, first row start[i]) inside
 * `rows`; *max_len gets the largest length. */
int dl_attn_arg_check_seqs(const char *op, const char *name, const char *pname, const int32_t *cu,
                           const int32_t *start, int64_t b, int64_t rows, const char *tname,
                           int *max_len);

void dl_attn_made_undo(dl_attn_made_t *m);

/* *slot: checked against (dtype, shape), or allocated like `like` and filled. */
int dl_attn_arg_output(const char *op, const char *name, dl_attn_made_t *m, dl_tensor_t **slot,
                       int dtype, int nd, const int64_t *shape, const dl_tensor_t *like, int fill,
                       double value, dl_stream_t *s);

/* Operands that hold no element have no memory; the kernels want non-NULL
 * pointers and never read them, so lend them another operand's. */
void dl_attn_lend(void **ptrs[], int n);

#endif
