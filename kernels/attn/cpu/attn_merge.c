/*
 * attn_merge.c — CPU twins of kernels/attn/attn_merge.cu: the merges of partial
 * attention results (out_i, lse_i) that context-parallel schedules use, in
 * double, with the row selection of dl_attn_merge_params_t (all / first /
 * second half of every sequence; part full-size or the packed half).
 * Checked by experiments/lab/attn/attn_cpu_test.c: merging the results of
 * split key ranges reproduces attention over their union.
 */
#include "attn_cpu.h"

typedef void (*row_fn)(const dl_attn_merge_params_t *p, int64_t o, int64_t po, int64_t l,
                       int64_t pl);

static int64_t row_off(const dl_attn_strides_t *st, int thd, int bi, int64_t row) {
  return (thd ? 0 : bi * st->b) + row * st->s;
}

/* Calls f for every selected (row, head) with the offsets of out, part, lse
 * and part_lse (columns start at the first two). */
static void for_rows(const dl_attn_merge_params_t *p, row_fn f) {
  int thd = p->cu_seqlens_padded != NULL;
  const int32_t *cu = p->cu_seqlens_padded;
  for (int bi = 0; bi < p->b; bi++) {
    int64_t len = thd ? cu[bi + 1] - cu[bi] : p->s;
    int64_t lo = p->half == DL_ATTN_HALF_SECOND ? len / 2 : 0;
    int64_t hi = p->half == DL_ATTN_HALF_FIRST ? len / 2 : len;
    for (int64_t i = lo; i < hi; i++) {
      int64_t row = thd ? cu[bi] + i : i;
      int64_t prow = !p->part_is_half ? row : thd ? (cu[bi] - cu[0]) / 2 + (i - lo) : i - lo;
      for (int hh = 0; hh < p->h; hh++) {
        f(p, row_off(&p->out_st, thd, bi, row) + hh * p->out_st.h,
          row_off(&p->part_st, thd, bi, prow) + hh * p->part_st.h,
          row_off(&p->lse_st, thd, bi, row) + hh * p->lse_st.h,
          row_off(&p->part_lse_st, thd, bi, prow) + hh * p->part_lse_st.h);
      }
    }
  }
}

static void lse_row(const dl_attn_merge_params_t *p, int64_t o, int64_t po, int64_t l,
                    int64_t pl) {
  (void)o, (void)po;
  p->lse[l] = (float)attn_logaddexp(p->lse[l], p->part_lse[pl]);
}

static int part_row_is_zero(const dl_attn_merge_params_t *p, int64_t po) {
  for (int c = 0; c < p->d; c++)
    if (attn_ld(p->part, p->part_dtype, po + c) != 0) return 0;
  return 1;
}

static void out_row(const dl_attn_merge_params_t *p, int64_t o, int64_t po, int64_t l,
                    int64_t pl) {
  double L = p->lse[l], Lp = p->part_lse[pl], keep, take;
  int skip = Lp == -INFINITY || (p->skip_zero_rows && part_row_is_zero(p, po));
  if (p->mode == DL_ATTN_MERGE_INCR) {
    if (skip) return;
    double Ln = attn_logaddexp(L, Lp);
    keep = L == -INFINITY ? 0 : exp(L - Ln);
    take = exp(Lp - Ln);
    p->lse[l] = (float)Ln;
  } else {
    keep = p->mode == DL_ATTN_MERGE_ADD;
    take = skip || L == -INFINITY ? 0 : exp(Lp - L);
  }
  for (int c = 0; c < p->d; c++) {
    double old = keep != 0 ? keep * attn_ld(p->out, p->out_dtype, o + c) : 0;
    double add = take != 0 ? take * attn_ld(p->part, p->part_dtype, po + c) : 0;
    attn_st(p->out, p->out_dtype, o + c, old + add);
  }
}

static void grad_row(const dl_attn_merge_params_t *p, int64_t o, int64_t po, int64_t l,
                     int64_t pl) {
  (void)l, (void)pl;
  for (int c = 0; c < p->d; c++) {
    double v = attn_ld(p->part, p->part_dtype, po + c);
    if (p->mode == DL_ATTN_GRAD_ADD) v += attn_ld(p->out, p->out_dtype, o + c);
    attn_st(p->out, p->out_dtype, o + c, v);
  }
}

int dl_attn_merge_lse_cpu(const dl_attn_merge_params_t *p, void *stream) {
  (void)stream;
  DL_TRY(dl_attn_merge_validate(p, 0, 0));
  for_rows(p, lse_row);
  return 0;
}

int dl_attn_merge_out_cpu(const dl_attn_merge_params_t *p, void *stream) {
  (void)stream;
  DL_TRY(dl_attn_merge_validate(p, 1, 0));
  for_rows(p, out_row);
  return 0;
}

int dl_attn_merge_grad_cpu(const dl_attn_merge_params_t *p, void *stream) {
  (void)stream;
  DL_TRY(dl_attn_merge_validate(p, 2, 0));
  for_rows(p, grad_row);
  return 0;
}
