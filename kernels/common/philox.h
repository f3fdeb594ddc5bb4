/*
 * philox.h — Philox4x32-10 counter-based random numbers, identical on the CPU
 * and the GPU (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
 *
 * Element n of a random tensor uses the counter (n, 0) under the key (seed):
 * one 4-word block per element, so any element can be computed alone and the
 * order of evaluation never matters. Uniform values take 53 bits; normal
 * values use Box-Muller in double precision, then round once to the dtype, so
 * CPU and GPU agree except where the double results straddle a rounding tie.
 */
#ifndef DISTLAB_PHILOX_H
#define DISTLAB_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DL_PHX __host__ __device__ __forceinline__
#else
#define DL_PHX static inline
#endif

typedef struct dl_philox4 {
  uint32_t v[4];
} dl_philox4_t;

DL_PHX dl_philox4_t dl_philox(uint64_t seed, uint64_t n) {
  uint32_t c0 = (uint32_t)n, c1 = (uint32_t)(n >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0;
    uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  dl_philox4_t out = {{c0, c1, c2, c3}};
  return out;
}

/* 53-bit uniform in [0, 1) from two words. */
DL_PHX double dl_u53(uint32_t a, uint32_t b) {
  uint64_t x = ((uint64_t)(a >> 5) << 26) | (uint64_t)(b >> 6);
  return (double)x * (1.0 / 9007199254740992.0);
}

DL_PHX double dl_philox_uniform(uint64_t seed, uint64_t n) {
  dl_philox4_t r = dl_philox(seed, n);
  return dl_u53(r.v[0], r.v[1]);
}

DL_PHX double dl_philox_normal(uint64_t seed, uint64_t n) {
  dl_philox4_t r = dl_philox(seed, n);
  double u1 = 1.0 - dl_u53(r.v[0], r.v[1]); /* (0, 1] */
  double u2 = dl_u53(r.v[2], r.v[3]);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
