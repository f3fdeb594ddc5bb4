/*
 * dtype.h — element conversions shared by the CPU twins and the CUDA kernels.
 *
 * bf16 and fp16 are handled as raw 16-bit patterns with integer arithmetic,
 * so the CPU and the GPU round identically: round-to-nearest-even, fp16
 * subnormals kept, NaN stays NaN, overflow goes to Inf. Conversions to the
 * integer dtypes truncate toward zero and saturate (NaN gives 0), so no
 * conversion is undefined behaviour.
 */
#ifndef DISTLAB_DTYPE_H
#define DISTLAB_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DL_HD __host__ __device__ __forceinline__
#else
#define DL_HD static inline
#endif

DL_HD uint32_t dl_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

DL_HD float dl_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

DL_HD float dl_bf16_to_f32(uint16_t h) { return dl_bits_f32((uint32_t)h << 16); }

DL_HD uint16_t dl_f32_to_bf16(float f) {
  uint32_t u = dl_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

DL_HD float dl_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  return dl_bits_f32(u);
}

DL_HD uint16_t dl_f32_to_f16(float f) {
  uint32_t u = dl_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to Inf (>= 65520) */
  if (a >= 0x38800000u) {                                   /* normal fp16 */
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
  /* subnormal: shift the full mantissa, round to nearest even */
  uint32_t exp = a >> 23;
  uint32_t man = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126u - exp; /* 14..24 */
  uint32_t q = man >> shift;
  uint32_t rem = man & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}

/* Load element i of a raw buffer as double / store a double, by dtype id. */
DL_HD double dl_load_f64(const void *p, int64_t i, int dtype) {
  switch (dtype) {
  case 0: return ((const float *)p)[i];
  case 1: return dl_f16_to_f32(((const uint16_t *)p)[i]);
  case 2: return dl_bf16_to_f32(((const uint16_t *)p)[i]);
  case 3: return ((const int32_t *)p)[i];
  case 4: return (double)((const int64_t *)p)[i];
  case 5: return ((const uint8_t *)p)[i];
  default: return ((const double *)p)[i];
  }
}

DL_HD int64_t dl_sat_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

DL_HD void dl_store_f64(void *p, int64_t i, int dtype, double v) {
  switch (dtype) {
  case 0: ((float *)p)[i] = (float)v; break;
  case 1: ((uint16_t *)p)[i] = dl_f32_to_f16((float)v); break;
  case 2: ((uint16_t *)p)[i] = dl_f32_to_bf16((float)v); break;
  case 3: ((int32_t *)p)[i] = (int32_t)dl_sat_i64(v, -2147483648.0, 2147483647.0); break;
  case 4: ((int64_t *)p)[i] = dl_sat_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
  case 5: ((uint8_t *)p)[i] = (uint8_t)dl_sat_i64(v, 0.0, 255.0); break;
  default: ((double *)p)[i] = v; break;
  }
}

#endif
