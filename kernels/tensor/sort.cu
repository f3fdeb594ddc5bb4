/*
 * sort.cu — argsort: the stable sorting permutation of every row (the
 * elements along one dim) of a strided view. Each value becomes its 64-bit
 * key (dl_sort_key in tensor_math.h: ascending keys are ascending values,
 * NaN the largest, -0 = +0; complemented for descending), gathered with its
 * position into the workspace; CUB's segmented stable sort (one segment a
 * row) orders them; the positions are written to the index view. The CPU
 * twin (kernels/tensor/cpu/sort.c) sorts the same keys by (key, position),
 * the same order, and is what the specs compare with.
 *
 * Workspace: keys and positions twice (in, out), the row offsets, CUB's
 * temporary storage; each part 256-byte aligned.
 */
#include <cub/device/device_segmented_sort.cuh>
#include <cuda_runtime.h>

#include "common/dtype.h"
#include "rows.cuh"
#include "tensor_math.h"

// ---------------------------------------------------------------------------
// kernels

__device__ __forceinline__ uint64_t key_at(const char *x, int dt, int64_t off) {
  switch (dt) {
  case DL_I64: return dl_sort_key_i64(((const int64_t *)x)[off]);
  case DL_I32: return dl_sort_key_i64(((const int32_t *)x)[off]);
  case DL_U8: return dl_sort_key_i64(((const uint8_t *)x)[off]);
  default: return dl_sort_key_f64(dl_load_f64(x, off, dt));
  }
}

__global__ void sort_keys_kernel(uint64_t *keys, int32_t *pos, const char *x, int dt, dl_rows_t rx, int64_t sx,
                                 int64_t n, int64_t total, int descending) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = t / n, j = t - r * n;
    const uint64_t k = key_at(x, dt, dl_row_base(rx, r) + j * sx);
    keys[t] = descending ? ~k : k;
    pos[t] = (int32_t)j;
  }
}

__global__ void sort_offsets_kernel(int64_t *offsets, int64_t rows, int64_t n) {
  for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r <= rows; r += (int64_t)gridDim.x * blockDim.x)
    offsets[r] = r * n;
}

__global__ void sort_write_kernel(char *idx, int dt, dl_rows_t ri, int64_t si, const int32_t *pos, int64_t n,
                                  int64_t total) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = t / n, j = t - r * n, o = dl_row_base(ri, r) + j * si;
    if (dt == DL_I64) ((int64_t *)idx)[o] = pos[t];
    else ((int32_t *)idx)[o] = pos[t];
  }
}

// ---------------------------------------------------------------------------
// launchers

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

struct sort_parts {
  size_t keys, pos, offsets, cub, total;
};

static int parts_of(int64_t rows, int64_t n, sort_parts *p) {
  const int64_t total = rows * n;
  size_t cub_bytes = 0;
  DL_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(
      nullptr, cub_bytes, (const uint64_t *)nullptr, (uint64_t *)nullptr, (const int32_t *)nullptr,
      (int32_t *)nullptr, total, rows, (const int64_t *)nullptr, (const int64_t *)nullptr));
  p->keys = align256(sizeof(uint64_t) * (size_t)total);
  p->pos = align256(sizeof(int32_t) * (size_t)total);
  p->offsets = align256(sizeof(int64_t) * (size_t)(rows + 1));
  p->cub = align256(cub_bytes);
  p->total = 2 * p->keys + 2 * p->pos + p->offsets + p->cub;
  return DL_OK;
}

extern "C" int dl_argsort_workspace_cuda(const dl_view_t *x, int dim, size_t *bytes) {
  const int64_t n = x->shape[dim], rows = n ? x->numel / n : 0;
  sort_parts p;
  DL_TRY(parts_of(rows, n, &p));
  *bytes = p.total;
  return DL_OK;
}

extern "C" int dl_argsort_cuda(const dl_view_t *idx, const dl_view_t *x, int dim, int descending, void *workspace,
                               size_t workspace_bytes, void *stream) {
  const int64_t n = x->shape[dim], rows = n ? x->numel / n : 0, total = rows * n;
  if (!total) return DL_OK;
  sort_parts p;
  DL_TRY(parts_of(rows, n, &p));
  DL_CHECK_ARG(workspace_bytes >= p.total, "argsort: workspace of %zu bytes, %zu needed", workspace_bytes, p.total);
  char *w = (char *)workspace;
  uint64_t *keys_in = (uint64_t *)w, *keys_out = (uint64_t *)(w + p.keys);
  int32_t *pos_in = (int32_t *)(w + 2 * p.keys), *pos_out = (int32_t *)(w + 2 * p.keys + p.pos);
  int64_t *offsets = (int64_t *)(w + 2 * p.keys + 2 * p.pos);
  void *temp = w + 2 * p.keys + 2 * p.pos + p.offsets;
  cudaStream_t h = (cudaStream_t)stream;
  sort_keys_kernel<<<dl_grid_for(total, 256), 256, 0, h>>>(keys_in, pos_in, x->data, x->dtype, dl_rows_of(x, dim),
                                                           x->strides[dim], n, total, descending);
  DL_CUDA_CHECK_LAUNCH("sort_keys_kernel");
  sort_offsets_kernel<<<dl_grid_for(rows + 1, 256), 256, 0, h>>>(offsets, rows, n);
  DL_CUDA_CHECK_LAUNCH("sort_offsets_kernel");
  size_t cub_bytes = p.cub;
  DL_CUDA_CHECK(cub::DeviceSegmentedSort::StableSortPairs(temp, cub_bytes, keys_in, keys_out, pos_in, pos_out, total,
                                                          rows, offsets, offsets + 1, h));
  sort_write_kernel<<<dl_grid_for(total, 256), 256, 0, h>>>(idx->data, idx->dtype, dl_rows_of(idx, dim),
                                                            idx->strides[dim], pos_out, n, total);
  DL_CUDA_CHECK_LAUNCH("sort_write_kernel");
  return DL_OK;
}
