/*
 * attn.h — raw-pointer interface of the attention kernels (flash forward and
 * backward, the fused merge epilogue, and the merges of partial results that
 * context-parallel schedules use). Internal: the core fills these structs
 * from tensors; Lua never sees them.
 *
 * Every launcher has a CUDA version (kernels/attn_*.cu) and a CPU twin
 * (kernels/attn/cpu/attn*.c) with the same signature; the twin computes in double
 * and is the reference the specs and experiments/lab/attn trust.
 *
 * Addressing. An operand X of logical shape [b, s, h, d] is addressed with
 * dl_attn_strides_t X_st (elements): element (batch bi, position i, head hh,
 * column c) is at X + base(bi) + i*X_st.s + hh*X_st.h + c, where base(bi) is
 * bi*X_st.b for bshd/sbhd and start(bi)*X_st.s for thd, start(bi) being the
 * sequence's row in the packed tensor (cu_seqlens_*_padded[bi]). The last
 * dim is contiguous. LSE-like operands ([b, h, s] or [h, t], fp32) use the
 * same struct with no column.
 */
#ifndef DISTLAB_KERNELS_ATTN_H
#define DISTLAB_KERNELS_ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_attn_strides {
  int64_t b, s, h;
} dl_attn_strides_t;

/* One attention step. Masks are a window (left, right) around the diagonal:
 * key j is visible to query i iff  i + shift - left <= j <= i + shift + right
 * (a bound of -1 is unbounded) and 0 <= j < s_kv, with shift = 0 (top-left)
 * or s_kv - s_q of the sequence (bottom_right). none = (-1,-1),
 * causal = (-1, 0). A row with no visible key gets out = 0, lse = -inf.    */
typedef struct dl_attn_params {
  int dtype; /* DL_BF16 or DL_F16: q k v out dout dq dk dv */
  int b, h_q, h_kv;
  int s_q, s_kv; /* bshd/sbhd: the lengths; thd: the largest valid length (grid size) */
  int d_qk, d_v; /* multiples of 8, <= 256 */
  float scale;   /* softmax scale, > 0 */
  int window_left, window_right;
  int bottom_right;

  /* thd when cu_seqlens_q != NULL: device int32 [b+1]. cu_seqlens_* are
   * prefix sums of valid lengths; *_padded[bi] is where sequence bi starts
   * in the tensor (NULL: same as cu_seqlens_*). Only rows
   * [padded[bi], padded[bi] + len(bi)) are read or written.               */
  const int32_t *cu_seqlens_q, *cu_seqlens_kv;
  const int32_t *cu_seqlens_q_padded, *cu_seqlens_kv_padded;
  int64_t total_q, total_kv; /* thd: rows of the q and k tensors */

  const void *q, *k, *v;
  dl_attn_strides_t q_st, k_st, v_st;
  void *out; /* fwd output; bwd input */
  dl_attn_strides_t out_st;
  float *lse; /* fwd output, bwd input: [b, h_q, s_q] or thd [h_q, total_q] */
  dl_attn_strides_t lse_st;
  float *max_logit; /* optional fwd output [h_q], caller fills -inf */

  /* Fused merge (fwd): when acc_out != NULL the step's (O, L) is merged into
   * the running (acc_out, acc_lse) and out/lse are not written.           */
  void *acc_out;
  int acc_dtype; /* DL_F32, DL_BF16 or DL_F16 */
  dl_attn_strides_t acc_out_st;
  float *acc_lse;
  dl_attn_strides_t acc_lse_st;

  /* Backward. */
  const void *dout;
  dl_attn_strides_t dout_st;
  void *dq, *dk, *dv;
  dl_attn_strides_t dq_st, dk_st, dv_st;
  int accumulate_grads; /* add into dq/dk/dv instead of overwriting */
  void *workspace;      /* CUDA bwd: dl_attn_bwd_workspace_bytes(p), 256-aligned */
  size_t workspace_bytes;
} dl_attn_params_t;

/* Checks p (bwd: the backward fields too; cuda: alignment the kernels need).
 * 0, or DL_EINVAL with a message naming the field. */
int dl_attn_validate(const dl_attn_params_t *p, int bwd, int cuda);
size_t dl_attn_bwd_workspace_bytes(const dl_attn_params_t *p);
/* Rows a head of the workspace's D (and of the Hopper backward's lse log2(e) after it): the rows of q
 * rounded up to 64, plus 64 a sequence (each sequence's rows at a multiple of 64 for the Hopper
 * backward's bulk loads: bwd_kernel.cuh's bwd_lse_row). */
int64_t dl_attn_bwd_lse_rows(const dl_attn_params_t *p);

/* The step on cuda (fwd, bwd): the Hopper kernel where usable, else the portable one; *hopper (may be
 * NULL) is set to 1 when the Hopper kernel ran, else 0. */
int dl_attn_fwd_cuda(const dl_attn_params_t *p, void *stream, int *hopper);
/* The Hopper forward (kernels/attn/hopper/; sm_90a; bf16, head dims 64/64 or 128/128; 192/128 with DISTLAB_ATTN_HOPPER_MLA=1): whether it takes p's shape (1, else 0 with
 * the reason in why when given), whether it runs here (that and an sm_90 device), and the run.
 * dl_attn_fwd_cuda takes it where usable. */
int dl_attn_fwd_hopper_fits(const dl_attn_params_t *p, char *why, size_t n);
int dl_attn_fwd_hopper_usable(const dl_attn_params_t *p, int *yes);
int dl_attn_fwd_hopper_cuda(const dl_attn_params_t *p, void *stream);
int dl_attn_bwd_cuda(const dl_attn_params_t *p, void *stream, int *hopper);
/* The Hopper backward's main kernel (kernels/attn/hopper/bwd_kernel.cuh; bf16, head dims 64/64 or
 * 128/128), as the
 * forward's three: dl_attn_bwd_cuda runs it (and its own dQ conversion) after its prep, on its
 * workspace (the fp32 dQ accumulator and D = rowsum(dO * O)). */
int dl_attn_bwd_hopper_fits(const dl_attn_params_t *p, char *why, size_t n);
int dl_attn_bwd_hopper_usable(const dl_attn_params_t *p, int *yes);
int dl_attn_bwd_hopper_cuda(const dl_attn_params_t *p, float *dq_acc, float *delta, void *stream);
/* 1 when dl_attn_bwd_hopper_cuda runs its own prep for p, so that dl_attn_bwd_cuda runs none: B5's (on unless
 * DISTLAB_ATTN_HOPPER_BWD_BULK_LSE=0, where B3's 80 and B6's 128 query rows do not run: D and lse log2(e) in
 * rows padded per sequence, dl_attn_bwd_lse_rows a head), or where they run bwd_prep_kernel without BULK (the portable
 * prep's layout; off with DISTLAB_ATTN_HOPPER_BWD_PREP_WS=0). */
int dl_attn_bwd_hopper_preps(const dl_attn_params_t *p);
int dl_attn_fwd_cpu(const dl_attn_params_t *p, void *stream);
int dl_attn_bwd_cpu(const dl_attn_params_t *p, void *stream);

/* ---- merges of partial results ------------------------------------------
 * Rows: bshd/sbhd (cu_seqlens_padded == NULL) have b sequences of s rows;
 * thd has the sequences [padded[bi], padded[bi+1]) of a tensor of `total`
 * rows. `half` selects the rows of every sequence that take part: all, the
 * first half or the second half (lengths must be even). `part` (and
 * part_lse) hold either the same rows as out (part_is_half = 0) or only the
 * selected half, packed: sequence bi at row (padded[bi]-padded[0])/2 for thd,
 * positions 0..s/2-1 for bshd/sbhd (part_is_half = 1).                    */
enum { DL_ATTN_HALF_ALL = 0, DL_ATTN_HALF_FIRST = 1, DL_ATTN_HALF_SECOND = 2 };
enum {
  DL_ATTN_MERGE_INCR = 0, /* O <- O e^(L-L') + P e^(Lp-L'), L <- L' = logaddexp(L, Lp) */
  DL_ATTN_MERGE_INIT = 1, /* O  = P e^(Lp-L) with L the final lse (read only) */
  DL_ATTN_MERGE_ADD = 2,  /* O += P e^(Lp-L) */
  DL_ATTN_GRAD_COPY = 3,  /* O  = P */
  DL_ATTN_GRAD_ADD = 4    /* O += P */
};

typedef struct dl_attn_merge_params {
  int b, h, s, d;
  const int32_t *cu_seqlens_padded; /* thd when != NULL: device int32 [b+1] */
  int64_t total;                    /* thd: rows of out */
  int half, part_is_half;
  int mode;           /* DL_ATTN_MERGE_* or DL_ATTN_GRAD_* */
  int skip_zero_rows; /* out merges: a part row that is exactly 0 contributes nothing */
  void *out;          /* running / final output, or gradient */
  int out_dtype;      /* DL_F32, DL_BF16, DL_F16 */
  dl_attn_strides_t out_st;
  float *lse; /* running (INCR, lse merge) or final (INIT, ADD) */
  dl_attn_strides_t lse_st;
  const void *part;
  int part_dtype;
  dl_attn_strides_t part_st;
  const float *part_lse;
  dl_attn_strides_t part_lse_st;
} dl_attn_merge_params_t;

/* what: 0 lse merge, 1 output merge, 2 gradient correction; cuda: alignment. */
int dl_attn_merge_validate(const dl_attn_merge_params_t *p, int what, int cuda);
/* lse <- logaddexp(lse, part_lse) on the selected rows (d, out, part unused). */
int dl_attn_merge_lse_cuda(const dl_attn_merge_params_t *p, void *stream);
int dl_attn_merge_lse_cpu(const dl_attn_merge_params_t *p, void *stream);
/* Output merges: mode INCR, INIT or ADD. */
int dl_attn_merge_out_cuda(const dl_attn_merge_params_t *p, void *stream);
int dl_attn_merge_out_cpu(const dl_attn_merge_params_t *p, void *stream);
/* Gradient correction: mode GRAD_COPY or GRAD_ADD (lse unused). */
int dl_attn_merge_grad_cuda(const dl_attn_merge_params_t *p, void *stream);
int dl_attn_merge_grad_cpu(const dl_attn_merge_params_t *p, void *stream);

/* ---- around cuDNN's fused attention (kernels/attn/attn_cudnn.cu; cuda only) ---- */

/* thd: seq_q/seq_kv [b] = lengths from cu_seqlens; for each of n tensors,
 * ragged[t] [b+1] = row start of each sequence (pad, else cu; entry b: the
 * end) times row_stride[t], on the q side or the kv side (kv_side[t]). */
typedef struct dl_attn_ragged_params {
  int b, n;
  const int32_t *cu_q, *cu_kv, *pad_q, *pad_kv; /* pad_*: NULL = cu_* */
  int32_t *seq_q, *seq_kv;
  int32_t *ragged[8];
  int64_t row_stride[8];
  int kv_side[8];
} dl_attn_ragged_params_t;

/* Between cuDNN's packed stats [b, h, s] and an lse (lse_st; thd when cu !=
 * NULL: sequence bi's rows start at pad[bi] (or cu[bi]), only its
 * cu[bi+1]-cu[bi] rows take part). to_lse: a row whose stat is -inf or NaN
 * gets lse -inf and, when out != NULL (16-bit, d columns), a zero row; else
 * (lse to stats) -inf becomes +inf. stats and lse may be the same memory. */
typedef struct dl_attn_stats_params {
  int b, h, s, d;
  const int32_t *cu, *pad;
  const int32_t *seq_kv; /* thd: a sequence with no keys has no visible key anywhere */
  const float *max, *sum_exp; /* to_lse: when set, the stat is max + log(sum_exp) */
  float *stats;
  float *lse;
  dl_attn_strides_t lse_st;
  void *out;
  dl_attn_strides_t out_st;
  int to_lse;
} dl_attn_stats_params_t;

int dl_attn_cudnn_ragged_cuda(const dl_attn_ragged_params_t *p, void *stream);
int dl_attn_cudnn_stats_cuda(const dl_attn_stats_params_t *p, void *stream);
/* thd bwd: zero the rows of dq (dk, dv) of sequences that have no keys (no
 * queries), which cuDNN may leave unwritten or write garbage into. */
typedef struct dl_attn_empty_rows_params {
  int b;
  const int32_t *cu_q, *cu_kv, *pad_q, *pad_kv;
  void *dq, *dk, *dv; /* 16-bit */
  dl_attn_strides_t dq_st, dk_st, dv_st;
  int h_q, h_kv, d_qk, d_v;
} dl_attn_empty_rows_params_t;
int dl_attn_cudnn_empty_rows_cuda(const dl_attn_empty_rows_params_t *p, void *stream);
/* max_logit[hh] = max(max_logit[hh], rowmax[bi, hh, i] for i < seq[bi] (or s)). */
int dl_attn_cudnn_max_cuda(const float *rowmax, int b, int h, int s, const int32_t *seq,
                           float *max_logit, void *stream);

#ifdef __cplusplus
}
#endif
#endif
