/*
 * fp8.h — the FP8 dispatch payload, shared by the CPU twin and the CUDA
 * kernels so that both give the same bits: e4m3 (1 sign, 4 exponent bits
 * biased by 7, 3 mantissa bits, no infinities, 0x7f/0xff NaN, largest
 * finite 448) with one fp32 scale per 128 values, as DeepEP's and
 * pplx-kernels' low-latency dispatch send it:
 *
 *   amax = max(max |x| over the 128 values, 1e-4)
 *   q    = e4m3(x * (448 / amax))   round to nearest even, saturating at 448
 *   s    = amax / 448               stored; x ~ e4m3_to_f32(q) * s
 *
 * Bound (checked by spec/ep/): |q*s - x| <= 2^-4 |x| + 2^-10 s (half an ulp
 * of the 3-bit mantissa, or of the subnormal spacing 2^-9, in units of s).
 * The conversions are integer arithmetic on the bit patterns, as in
 * common/dtype.h, so the GPU and the CPU twin round identically.
 */
#ifndef DISTLAB_EP_FP8_H
#define DISTLAB_EP_FP8_H

#include "common/dtype.h"
#include "ep/ep.h"

#define DL_EP_FP8_MAX 448.0f
#define DL_EP_FP8_AMIN 1e-4f

DL_HD uint8_t dl_f32_to_e4m3(float f) {
  const uint32_t u = dl_f32_bits(f);
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                  /* NaN */
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (and inf): saturate */
  const int ea = (int)(a >> 23) - 127;
  if (ea >= -6) { /* normal e4m3: round the mantissa to 3 bits */
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    const uint32_t code = r - (120u << 3);
    return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
  }
  if (ea < -10) return sign; /* below 2^-10, half the smallest subnormal */
  /* subnormal: m * 2^-9, m = round(mantissa * 2^(ea + 9 - 23)) */
  const uint32_t man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = (uint32_t)(14 - ea); /* 21..24 */
  uint32_t q = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint8_t)(sign | q); /* q == 8 is the smallest normal, 2^-6 */
}

DL_HD float dl_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = (uint32_t)(v & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xfu, m = v & 7u;
  if ((v & 0x7fu) == 0x7fu) return dl_bits_f32(0x7fc00000u);
  if (e == 0) { /* m * 2^-9, exact in f32 */
    const float f = (float)m * (1.0f / 512.0f);
    return dl_bits_f32(dl_f32_bits(f) | sign);
  }
  return dl_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

#endif
