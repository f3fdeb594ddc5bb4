// vec.cuh — the 16-byte vectors of the all-reduce kernels (kernels/allreduce/):
// per dtype, unpack to fp32 lanes, accumulate, pack back; loads and stores of
// a vector of the caller's tensor (element-wise at the tail or when
// unaligned) and of the padded staging regions. Device code, included through
// kernels/allreduce/allreduce_device.cuh (and so by the CPU emulation in
// experiments/lab/emu/allreduce).
#ifndef DISTLAB_ALLREDUCE_VEC_CUH
#define DISTLAB_ALLREDUCE_VEC_CUH

#include "dtype.h"

// 16 bytes of a dtype: unpack into fp32 lanes, accumulate, pack back.
template <int DT> struct vt;

template <> struct vt<DL_F32> {
  enum { L = 4, ES = 4 };
  static __device__ __forceinline__ void first(float *acc, const uint4 &x) {
    acc[0] = dl_bits_f32(x.x), acc[1] = dl_bits_f32(x.y), acc[2] = dl_bits_f32(x.z),
    acc[3] = dl_bits_f32(x.w);
  }
  static __device__ __forceinline__ void add(float *acc, const uint4 &x) {
    acc[0] += dl_bits_f32(x.x), acc[1] += dl_bits_f32(x.y), acc[2] += dl_bits_f32(x.z),
        acc[3] += dl_bits_f32(x.w);
  }
  static __device__ __forceinline__ uint4 pack(const float *acc) {
    return make_uint4(dl_f32_bits(acc[0]), dl_f32_bits(acc[1]), dl_f32_bits(acc[2]),
                      dl_f32_bits(acc[3]));
  }
};

// Two 16-bit values per 32-bit word, element 2i in the low half.
template <int DT> struct half2_ops;

template <> struct half2_ops<DL_BF16> {
  static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
    lo = dl_bits_f32(w << 16);
    hi = dl_bits_f32(w & 0xffff0000u);
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
#ifdef __CUDA_ARCH__
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
#else
    return (uint32_t)dl_f32_to_bf16(lo) | ((uint32_t)dl_f32_to_bf16(hi) << 16);
#endif
  }
};

template <> struct half2_ops<DL_F16> {
  static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
#ifdef __CUDA_ARCH__
    float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
    lo = f.x;
    hi = f.y;
#else
    lo = dl_f16_to_f32((uint16_t)(w & 0xffffu));
    hi = dl_f16_to_f32((uint16_t)(w >> 16));
#endif
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
#ifdef __CUDA_ARCH__
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
#else
    return (uint32_t)dl_f32_to_f16(lo) | ((uint32_t)dl_f32_to_f16(hi) << 16);
#endif
  }
};

template <int DT> struct vt16 {
  enum { L = 8, ES = 2 };
  typedef half2_ops<DT> H;
  static __device__ __forceinline__ void first(float *acc, const uint4 &x) {
    H::unpack(x.x, acc[0], acc[1]);
    H::unpack(x.y, acc[2], acc[3]);
    H::unpack(x.z, acc[4], acc[5]);
    H::unpack(x.w, acc[6], acc[7]);
  }
  static __device__ __forceinline__ void add(float *acc, const uint4 &x) {
    float t[8];
    first(t, x);
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] += t[i];
  }
  static __device__ __forceinline__ uint4 pack(const float *acc) {
    return make_uint4(H::pack(acc[0], acc[1]), H::pack(acc[2], acc[3]), H::pack(acc[4], acc[5]),
                      H::pack(acc[6], acc[7]));
  }
};
template <> struct vt<DL_BF16> : vt16<DL_BF16> {};
template <> struct vt<DL_F16> : vt16<DL_F16> {};

union vec_pun {
  uint4 v;
  uint32_t w[4];
  uint16_t h[8];
};

// Vector v of the caller's tensor of n elements: 16-byte access when the
// whole vector is inside and the pointer is aligned, else element-wise (lanes
// past n read as 0 and are never written).
template <int DT, bool AL>
__device__ __forceinline__ uint4 ld_user(const void *p, int64_t v, int64_t n) {
  constexpr int L = vt<DT>::L;
  const int64_t e0 = v * L;
  if (AL && e0 + L <= n) return reinterpret_cast<const uint4 *>(p)[v];
  vec_pun r;
  r.v = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < L; i++) {
    if (e0 + i < n) {
      if (vt<DT>::ES == 4) r.w[i] = reinterpret_cast<const uint32_t *>(p)[e0 + i];
      else r.h[i] = reinterpret_cast<const uint16_t *>(p)[e0 + i];
    }
  }
  return r.v;
}

template <int DT, bool AL>
__device__ __forceinline__ void st_user(void *p, int64_t v, int64_t n, const uint4 &x) {
  constexpr int L = vt<DT>::L;
  const int64_t e0 = v * L;
  if (AL && e0 + L <= n) {
    reinterpret_cast<uint4 *>(p)[v] = x;
    return;
  }
  vec_pun r;
  r.v = x;
#pragma unroll
  for (int i = 0; i < L; i++) {
    if (e0 + i < n) {
      if (vt<DT>::ES == 4) reinterpret_cast<uint32_t *>(p)[e0 + i] = r.w[i];
      else reinterpret_cast<uint16_t *>(p)[e0 + i] = r.h[i];
    }
  }
}

// Staging and zero-copy regions are padded to whole vectors.
__device__ __forceinline__ uint4 ld_vec(const char *base, int64_t v) {
  return reinterpret_cast<const uint4 *>(base)[v];
}
__device__ __forceinline__ void st_vec(char *base, int64_t v, const uint4 &x) {
  reinterpret_cast<uint4 *>(base)[v] = x;
}

#endif
