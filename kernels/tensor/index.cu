/*
 * index.cu — gather, scatter_add and bincount over strided views: one
 * thread per element of the index (of x for bincount), its row-major
 * position turned into each view's offset. scatter_add and bincount add
 * with atomics, in no fixed order: f32/f64/i32/i64 natively (integers wrap),
 * bf16/f16 by a compare-and-swap of the 16-bit word through an fp32 add
 * rounded once (as the CPU twin), u8 by a compare-and-swap of its 32-bit
 * word. An index out of range leaves its element alone (gather writes 0)
 * and keeps the smallest such position in *bad (atomicMin). The CPU twins
 * (kernels/tensor/cpu/index.c) are what the specs compare with.
 */
#include <cuda_runtime.h>

#include "common/dtype.h"
#include "rows.cuh"
#include "tensor_math.h"

// ---------------------------------------------------------------------------
// addressing

/* An element grid (the index's shape) and the strides of up to three views
 * over it; a view indexed at `dim` has stride 0 there (the index value
 * supplies it). */
struct grid3 {
  int nd;
  int64_t shape[DL_MAX_DIMS];
  int64_t st[3][DL_MAX_DIMS];
};

static grid3 grid_of(const dl_view_t *shape, const dl_view_t *a, const dl_view_t *b, const dl_view_t *c, int dim) {
  grid3 g = {};
  g.nd = shape->ndim;
  const dl_view_t *vs[3] = {a, b, c};
  for (int d = 0; d < g.nd; d++) {
    g.shape[d] = shape->shape[d];
    for (int k = 0; k < 3; k++) g.st[k][d] = vs[k] && !(k == 2 && d == dim) ? vs[k]->strides[d] : 0;
  }
  return g;
}

__device__ __forceinline__ void offsets_of(const grid3 &g, int64_t i, int64_t *o) {
  o[0] = o[1] = o[2] = 0;
  for (int d = g.nd - 1; d >= 0; d--) {
    const int64_t c = i % g.shape[d];
    i /= g.shape[d];
    o[0] += c * g.st[0][d];
    o[1] += c * g.st[1][d];
    o[2] += c * g.st[2][d];
  }
}

__device__ __forceinline__ int64_t index_at(const char *ix, int dt, int64_t off) {
  return dt == DL_I64 ? ((const int64_t *)ix)[off] : dt == DL_I32 ? ((const int32_t *)ix)[off] : ((const uint8_t *)ix)[off];
}

// ---------------------------------------------------------------------------
// atomic adds

__device__ __forceinline__ void add_u8(uint8_t *p, unsigned v) {
  unsigned *w = (unsigned *)((uintptr_t)p & ~(uintptr_t)3);
  const unsigned shift = ((uintptr_t)p & 3) * 8;
  unsigned old = *w, assumed;
  do {
    assumed = old;
    const unsigned b = ((assumed >> shift) + v) & 0xffu;
    old = atomicCAS(w, assumed, (assumed & ~(0xffu << shift)) | (b << shift));
  } while (old != assumed);
}

__device__ __forceinline__ void add_half(uint16_t *p, float v, int bf16) {
  unsigned short *w = (unsigned short *)p;
  unsigned short old = *w, assumed;
  do {
    assumed = old;
    const float cur = bf16 ? dl_bf16_to_f32(assumed) : dl_f16_to_f32(assumed);
    const unsigned short nv = bf16 ? dl_f32_to_bf16(cur + v) : dl_f32_to_f16(cur + v);
    old = atomicCAS(w, assumed, nv);
  } while (old != assumed);
}

/* dst[i] += v (v read as dst's dtype from src[j]). */
__device__ __forceinline__ void atomic_add_at(char *dst, int64_t i, int dt, const char *src, int64_t j) {
  switch (dt) {
  case DL_F32: atomicAdd((float *)dst + i, ((const float *)src)[j]); break;
  case DL_F64: atomicAdd((double *)dst + i, ((const double *)src)[j]); break;
  case DL_I32: atomicAdd((int *)dst + i, ((const int *)src)[j]); break;
  case DL_I64:
    atomicAdd((unsigned long long *)dst + i, (unsigned long long)((const long long *)src)[j]);
    break;
  case DL_U8: add_u8((uint8_t *)dst + i, ((const uint8_t *)src)[j]); break;
  case DL_BF16: add_half((uint16_t *)dst + i, dl_bf16_to_f32(((const uint16_t *)src)[j]), 1); break;
  case DL_F16: add_half((uint16_t *)dst + i, dl_f16_to_f32(((const uint16_t *)src)[j]), 0); break;
  }
}

// ---------------------------------------------------------------------------
// kernels

/* g.st: out, index, x (stride 0 at dim). */
__global__ void gather_kernel(char *out, const char *x, int esz, int64_t xs_dim, int64_t size, const char *ix,
                              int idt, grid3 g, int64_t n, unsigned long long *bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o[3];
    offsets_of(g, i, o);
    const int64_t v = index_at(ix, idt, o[1]);
    char *dst = out + o[0] * esz;
    const bool ok = v >= 0 && v < size;
    if (!ok) atomicMin(bad, (unsigned long long)i);
    const char *src = x + (o[2] + (ok ? v : 0) * xs_dim) * esz;
    switch (esz) {
    case 1: *(uint8_t *)dst = ok ? *(const uint8_t *)src : 0; break;
    case 2: *(uint16_t *)dst = ok ? *(const uint16_t *)src : 0; break;
    case 4: *(uint32_t *)dst = ok ? *(const uint32_t *)src : 0; break;
    default: *(uint64_t *)dst = ok ? *(const uint64_t *)src : 0; break;
    }
  }
}

/* g.st: src, index, dst (stride 0 at dim). */
__global__ void scatter_add_kernel(char *dst, int dt, int64_t ds_dim, int64_t size, const char *src, const char *ix,
                                   int idt, grid3 g, int64_t n, unsigned long long *bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o[3];
    offsets_of(g, i, o);
    const int64_t v = index_at(ix, idt, o[1]);
    if (v < 0 || v >= size) {
      atomicMin(bad, (unsigned long long)i);
      continue;
    }
    atomic_add_at(dst, o[2] + v * ds_dim, dt, src, o[0]);
  }
}

/* g.st: x, weights. */
__global__ void bincount_kernel(char *out, int odt, int64_t os, int64_t bins, const char *x, int xdt, const char *w,
                                int wdt, grid3 g, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o[3];
    offsets_of(g, i, o);
    const int64_t v = index_at(x, xdt, o[0]);
    if (v < 0 || v >= bins) continue;
    if (!w) {
      if (odt == DL_I64) atomicAdd((unsigned long long *)out + v * os, 1ull);
      else atomicAdd((int *)out + v * os, 1);
    } else if (odt == DL_F64) {
      atomicAdd((double *)out + v * os, dl_load_f64(w, o[1], wdt));
    } else {
      atomicAdd((float *)out + v * os, (float)dl_load_f64(w, o[1], wdt));
    }
  }
}

// ---------------------------------------------------------------------------
// launchers

extern "C" int dl_gather_cuda(const dl_view_t *out, const dl_view_t *x, int dim, const dl_view_t *index, uint64_t *bad,
                              void *stream) {
  const grid3 g = grid_of(index, out, index, x, dim);
  gather_kernel<<<dl_grid_for(index->numel, 256), 256, 0, (cudaStream_t)stream>>>(
      out->data, x->data, dl_dtype_size(x->dtype), x->strides[dim], x->shape[dim], index->data, index->dtype, g,
      index->numel, (unsigned long long *)bad);
  DL_CUDA_CHECK_LAUNCH("gather_kernel");
  return DL_OK;
}

extern "C" int dl_scatter_add_cuda(const dl_view_t *dst, int dim, const dl_view_t *index, const dl_view_t *src,
                                   uint64_t *bad, void *stream) {
  const grid3 g = grid_of(index, src, index, dst, dim);
  scatter_add_kernel<<<dl_grid_for(index->numel, 256), 256, 0, (cudaStream_t)stream>>>(
      dst->data, dst->dtype, dst->strides[dim], dst->shape[dim], src->data, index->data, index->dtype, g,
      index->numel, (unsigned long long *)bad);
  DL_CUDA_CHECK_LAUNCH("scatter_add_kernel");
  return DL_OK;
}

extern "C" int dl_bincount_cuda(const dl_view_t *out, const dl_view_t *x, const dl_view_t *weights, void *stream) {
  const grid3 g = grid_of(x, x, weights, NULL, -1);
  bincount_kernel<<<dl_grid_for(x->numel, 256), 256, 0, (cudaStream_t)stream>>>(
      out->data, out->dtype, out->strides[0], out->shape[0], x->data, x->dtype, weights ? weights->data : NULL,
      weights ? weights->dtype : 0, g, x->numel);
  DL_CUDA_CHECK_LAUNCH("bincount_kernel");
  return DL_OK;
}
