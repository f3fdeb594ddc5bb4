/*
 * attn_cpu.h — what the CPU twins of the attention kernels share: element
 * loads and stores of bf16/fp16/fp32 through double (round-to-nearest-even,
 * subnormals kept), the row addressing of dl_attn_strides_t, and the mask.
 * Internal to kernels/cpu/attn*.c.
 */
#ifndef DISTLAB_KERNELS_CPU_ATTN_CPU_H
#define DISTLAB_KERNELS_CPU_ATTN_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../core/internal.h"
#include "../attn.h"

static inline uint32_t attn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float attn_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t attn_f32_to_bf16(float f) {
  uint32_t u = attn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float attn_bf16_to_f32(uint16_t h) { return attn_bits_f32((uint32_t)h << 16); }

static inline uint16_t attn_f32_to_f16(float f) {
  uint32_t u = attn_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {                                    /* below 2^-14: subnormal */
    if (a < 0x33000000u) return sign;                       /* below 2^-25: to zero */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* value = m * 2^(e-150); unit = 2^-24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a - 0x38000000u; /* rebias 127 -> 15, keep 23 mantissa bits */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

static inline float attn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return attn_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * 0x1p-24f;
  return attn_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

static inline double attn_ld(const void *base, int dtype, int64_t idx) {
  if (dtype == DL_F32) return ((const float *)base)[idx];
  uint16_t h = ((const uint16_t *)base)[idx];
  return dtype == DL_BF16 ? attn_bf16_to_f32(h) : attn_f16_to_f32(h);
}

static inline void attn_st(void *base, int dtype, int64_t idx, double v) {
  float f = (float)v;
  if (dtype == DL_F32)
    ((float *)base)[idx] = f;
  else
    ((uint16_t *)base)[idx] = dtype == DL_BF16 ? attn_f32_to_bf16(f) : attn_f32_to_f16(f);
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
