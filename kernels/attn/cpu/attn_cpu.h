/*
 * attn_cpu.h — what the CPU twins of the attention kernels share: element
 * loads and stores of bf16/fp16/fp32 through double (kernels/common/dtype.h: round
 * to nearest even, subnormals kept), the row addressing of dl_attn_strides_t, and the mask.
 * Internal to kernels/attn/cpu/attn*.c.
 */
#ifndef DISTLAB_KERNELS_CPU_ATTN_CPU_H
#define DISTLAB_KERNELS_CPU_ATTN_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/base.h"
#include "attn/attn.h"
#include "common/dtype.h"

/* Loads and stores through double, with the project's conversions (dtype.h). */
static inline double attn_ld(const void *base, int dtype, int64_t idx) {
  return dl_load_f64(base, idx, dtype);
}

static inline void attn_st(void *base, int dtype, int64_t idx, double v) {
  dl_store_f64(base, idx, dtype, v);
}

/* Where sequence bi starts in an operand: bi*st.b, or row `start` for thd. */
static inline int64_t attn_base(const dl_attn_strides_t *st, int thd, int bi, int64_t start) {
  return thd ? start * st->s : (int64_t)bi * st->b;
}

/* The mask of dl_attn_params_t: is key j visible to query i? */
static inline int attn_visible(const dl_attn_params_t *p, int64_t i, int64_t j, int q_len,
                               int kv_len) {
  int64_t shift = p->bottom_right ? (int64_t)kv_len - q_len : 0;
  if (j < 0 || j >= kv_len) return 0;
  if (p->window_left >= 0 && j < i + shift - p->window_left) return 0;
  if (p->window_right >= 0 && j > i + shift + p->window_right) return 0;
  return 1;
}

/* logaddexp with -inf as the identity. */
static inline double attn_logaddexp(double a, double b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  double mx = a > b ? a : b, mn = a > b ? b : a;
  return mx + log1p(exp(mn - mx));
}

#endif
