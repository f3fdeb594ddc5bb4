/*
 * attn_params.c — validation of the attention and merge parameter structs,
 * shared by the CPU twins and the CUDA launchers so that both reject the
 * same requests with the same message, and the size of the backward
 * workspace (fp32 dQ accumulator, rowsum(dO*O), the Hopper backward's lse
 * log2(e)), which the core allocates.
 */
#include <math.h>

#include "attn_cpu.h"

static int is_half_dtype(int dt) { return dt == DL_BF16 || dt == DL_F16; }
static int is_float_dtype(int dt) { return dt == DL_F32 || is_half_dtype(dt); }

/* The CUDA kernels move 16-byte chunks: base 16-byte aligned, strides in
 * multiples of 8 elements (fixed layouts use the batch stride too). */
static int check_chunks(const char *name, const void *ptr, const dl_attn_strides_t *st, int thd) {
  if (((uintptr_t)ptr & 15u) != 0)
    return DL_ERR(DL_EINVAL, "attn: %s must be 16-byte aligned for the CUDA kernels", name);
  if (st->s % 8 || st->h % 8 || (!thd && st->b % 8))
    return DL_ERR(DL_EINVAL,
                  "attn: strides of %s (b=%lld s=%lld h=%lld) must be multiples of 8 "
                  "elements for the CUDA kernels",
                  name, (long long)st->b, (long long)st->s, (long long)st->h);
  return 0;
}

int64_t dl_attn_bwd_lse_rows(const dl_attn_params_t *p) {
  int64_t rows = p->cu_seqlens_q ? p->total_q : (int64_t)p->b * p->s_q;
  return (rows + 63) / 64 * 64 + 64 * (int64_t)p->b;
}

/* The fp32 dQ accumulator [h][rows][d_qk] (256-aligned), then D [h][lse rows] (the portable kernels
 * use its first rows a head, [h][rows]), then the Hopper backward's lse log2(e) [h][lse rows]. */
size_t dl_attn_bwd_workspace_bytes(const dl_attn_params_t *p) {
  int64_t rows = p->cu_seqlens_q ? p->total_q : (int64_t)p->b * p->s_q;
  size_t dq = (size_t)rows * p->h_q * p->d_qk * sizeof(float);
  dq = (dq + 255) & ~(size_t)255;
  return dq + 2 * (size_t)dl_attn_bwd_lse_rows(p) * p->h_q * sizeof(float);
}

int dl_attn_validate(const dl_attn_params_t *p, int bwd, int cuda) {
  DL_CHECK_ARG(p, "attn: params is NULL");
  DL_CHECK_ARG(is_half_dtype(p->dtype) || (!cuda && p->dtype == DL_F32),
               "attn: dtype %d is not bf16 or fp16 (or fp32, on the cpu)", p->dtype);
  DL_CHECK_ARG(p->b >= 0 && p->s_q >= 0 && p->s_kv >= 0,
               "attn: negative size (b=%d s_q=%d s_kv=%d)", p->b, p->s_q, p->s_kv);
  DL_CHECK_ARG(p->h_q >= 1 && p->h_kv >= 1 && p->h_q % p->h_kv == 0,
               "attn: h_kv=%d must be >= 1 and divide h_q=%d", p->h_kv, p->h_q);
  DL_CHECK_ARG(p->d_qk >= 8 && p->d_qk <= 256 && p->d_qk % 8 == 0,
               "attn: head dim d_qk=%d unsupported (multiples of 8 up to 256)", p->d_qk);
  DL_CHECK_ARG(p->d_v >= 8 && p->d_v <= 256 && p->d_v % 8 == 0,
               "attn: head dim d_v=%d unsupported (multiples of 8 up to 256)", p->d_v);
  DL_CHECK_ARG(isfinite(p->scale) && p->scale > 0, "attn: scale %g must be finite and > 0",
               (double)p->scale);
  DL_CHECK_ARG(p->window_left >= -1 && p->window_right >= -1,
               "attn: window (%d, %d): bounds are >= 0 or -1 (unbounded)", p->window_left,
               p->window_right);
  DL_CHECK_ARG(p->q && p->k && p->v, "attn: q, k and v must not be NULL");
  int thd = p->cu_seqlens_q != NULL;
  DL_CHECK_ARG(thd == (p->cu_seqlens_kv != NULL),
               "attn: thd needs both cu_seqlens_q and cu_seqlens_kv");
  DL_CHECK_ARG(!thd || (p->total_q >= 0 && p->total_kv >= 0), "attn: negative total_q/total_kv");
  if (!bwd && p->acc_out) {
    DL_CHECK_ARG(p->acc_lse, "attn: acc_out given without acc_lse");
    DL_CHECK_ARG(is_float_dtype(p->acc_dtype), "attn: acc_dtype %d is not fp32, bf16 or fp16",
                 p->acc_dtype);
  } else {
    DL_CHECK_ARG(p->out && p->lse, "attn: out and lse must not be NULL");
  }
  if (bwd) {
    DL_CHECK_ARG(p->dout && p->dq && p->dk && p->dv, "attn bwd: dout, dq, dk, dv must not be NULL");
    if (cuda) {
      size_t need = dl_attn_bwd_workspace_bytes(p);
      DL_CHECK_ARG(p->workspace && p->workspace_bytes >= need,
                   "attn bwd: workspace of %zu bytes given, %zu needed", p->workspace_bytes,
                   need);
      DL_CHECK_ARG(((uintptr_t)p->workspace & 255u) == 0,
                   "attn bwd: workspace must be 256-byte aligned");
    }
  }
  if (!cuda) return 0;
  DL_TRY(check_chunks("q", p->q, &p->q_st, thd));
  DL_TRY(check_chunks("k", p->k, &p->k_st, thd));
  DL_TRY(check_chunks("v", p->v, &p->v_st, thd));
  if (p->out) DL_TRY(check_chunks("out", p->out, &p->out_st, thd));
  if (!bwd && p->acc_out) DL_TRY(check_chunks("acc_out", p->acc_out, &p->acc_out_st, thd));
  if (bwd) {
    DL_TRY(check_chunks("dout", p->dout, &p->dout_st, thd));
    DL_TRY(check_chunks("dq", p->dq, &p->dq_st, thd));
    DL_TRY(check_chunks("dk", p->dk, &p->dk_st, thd));
    DL_TRY(check_chunks("dv", p->dv, &p->dv_st, thd));
  }
  return 0;
}

int dl_attn_merge_validate(const dl_attn_merge_params_t *p, int what, int cuda) {
  (void)cuda; /* the merge kernels move single elements */
  DL_CHECK_ARG(p, "attn merge: params is NULL");
  int thd = p->cu_seqlens_padded != NULL;
  DL_CHECK_ARG(p->b >= 0 && p->h >= 1 && (thd || p->s >= 0) && (!thd || p->total >= 0),
               "attn merge: bad sizes (b=%d h=%d s=%d total=%lld)", p->b, p->h, p->s,
               (long long)p->total);
  DL_CHECK_ARG(p->half >= DL_ATTN_HALF_ALL && p->half <= DL_ATTN_HALF_SECOND,
               "attn merge: half=%d is not 0 (all), 1 (first) or 2 (second)", p->half);
  DL_CHECK_ARG(p->part_is_half == 0 || (p->part_is_half == 1 && p->half != DL_ATTN_HALF_ALL),
               "attn merge: part_is_half=%d needs half = 1 or 2", p->part_is_half);
  DL_CHECK_ARG(thd || p->half == DL_ATTN_HALF_ALL || p->s % 2 == 0,
               "attn merge: s=%d must be even to select a half", p->s);
  if (what == 0) {
    DL_CHECK_ARG(p->lse && p->part_lse, "attn merge lse: lse and part_lse must not be NULL");
    return 0;
  }
  DL_CHECK_ARG(p->d >= 1, "attn merge: d=%d must be >= 1", p->d);
  DL_CHECK_ARG(p->out && p->part, "attn merge: out and part must not be NULL");
  DL_CHECK_ARG(is_float_dtype(p->out_dtype) && is_float_dtype(p->part_dtype),
               "attn merge: dtypes (%d, %d) must be fp32, bf16 or fp16", p->out_dtype,
               p->part_dtype);
  if (what == 1) {
    DL_CHECK_ARG(p->mode == DL_ATTN_MERGE_INCR || p->mode == DL_ATTN_MERGE_INIT ||
                     p->mode == DL_ATTN_MERGE_ADD,
                 "attn merge out: mode %d is not INCR, INIT or ADD", p->mode);
    DL_CHECK_ARG(p->lse && p->part_lse, "attn merge out: lse and part_lse must not be NULL");
  } else {
    DL_CHECK_ARG(p->mode == DL_ATTN_GRAD_COPY || p->mode == DL_ATTN_GRAD_ADD,
                 "attn merge grad: mode %d is not GRAD_COPY or GRAD_ADD", p->mode);
  }
  return 0;
}
