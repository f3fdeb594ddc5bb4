/*
 * attn_cudnn.cu — the small kernels around cuDNN's fused attention (the
 * "cudnn" backend of dl.attn; core/ops/attn/attn_cudnn.c calls them):
 *
 *   ragged: thd metadata in cuDNN's form. cuDNN takes per-sequence valid
 *     lengths ([b] int32) and, per tensor, the element offset of each
 *     sequence's first row ([b+1] int32: row start times the tensor's row
 *     stride); ours are cu_seqlens (prefix sums of lengths) and
 *     cu_seqlens_padded (row starts, which need not begin at 0).
 *   stats: cuDNN's softmax stats (natural-log LSE, packed fp32 [b, h, s])
 *     into our lse (any strides; thd: [h, t], rows of each sequence only),
 *     with our convention for a row that sees no key (lse = -inf, out row =
 *     0) whatever cuDNN left there (-inf or NaN); and back, for the
 *     backward, where such a row's -inf becomes +inf so that cuDNN's
 *     exp(s - lse) is 0 (not exp(-inf + inf) = NaN) and its gradient rows 0.
 *     With max_logit asked for, cuDNN gives the LSE's parts instead (row
 *     max and sum of exp(s - max)): the LSE is max + log(sum).
 *   empty rows: thd, the gradient rows of a sequence with no keys (dq) or
 *     no queries (dk, dv) are 0; cuDNN leaves them unwritten or not 0.
 *   max: our max_logit [h] (running max of the scaled logits) from cuDNN's
 *     per-row max ([b, h, s] fp32), over the valid rows.
 * Launches checked with DL_CUDA_CHECK_LAUNCH. cuda only: the backend they serve
 * runs on cuda only, so they have no cpu twin; spec/attn_cudnn_spec.lua
 * checks their effect end to end against the fp64 reference.
 */
#include <math.h>

#include "attn/attn.h"
#include "common/base.h"

/* ---- kernels ------------------------------------------------------------------- */

__global__ void attn_cudnn_ragged_kernel(dl_attn_ragged_params_t p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x; /* sequence 0..b (b: the end) */
  if (i > p.b) return;
  const int32_t *cu[2] = {p.cu_q, p.cu_kv}, *pad[2] = {p.pad_q, p.pad_kv};
  int32_t *seq[2] = {p.seq_q, p.seq_kv};
  for (int side = 0; side < 2; side++)
    if (i < p.b) seq[side][i] = cu[side][i + 1] - cu[side][i];
  for (int t = 0; t < p.n; t++) {
    const int side = p.kv_side[t];
    const int64_t start = pad[side] ? pad[side][i] : cu[side][i];
    p.ragged[t][i] = (int32_t)(start * p.row_stride[t]);
  }
}

/* Row r of sequence bi: its first row in a thd tensor, or position r of a bshd one. */
__device__ __forceinline__ int64_t row_base(const int32_t *cu, const int32_t *pad, int bi,
                                            const dl_attn_strides_t &st) {
  if (!cu) return (int64_t)bi * st.b;
  return (int64_t)(pad ? pad[bi] : cu[bi]) * st.s;
}

__global__ void attn_cudnn_stats_kernel(dl_attn_stats_params_t p) {
  const int64_t n = (int64_t)p.b * p.h * p.s;
  for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n;
       x += (int64_t)gridDim.x * blockDim.x) {
    const int i = (int)(x % p.s), hh = (int)(x / p.s % p.h), bi = (int)(x / p.s / p.h);
    if (p.cu && i >= p.cu[bi + 1] - p.cu[bi]) continue;
    float *lse = p.lse + row_base(p.cu, p.pad, bi, p.lse_st) + hh * p.lse_st.h + i * p.lse_st.s;
    if (p.to_lse) {
      float v = p.max ? p.max[x] + logf(p.sum_exp[x]) : p.stats[x];
      if (p.seq_kv && p.seq_kv[bi] == 0) v = -INFINITY;
      if (!(v > -INFINITY)) { /* no visible key: -inf or NaN from cuDNN */
        v = -INFINITY;
        if (p.out) {
          uint16_t *o = (uint16_t *)p.out + row_base(p.cu, p.pad, bi, p.out_st) +
                        hh * p.out_st.h + i * p.out_st.s;
          for (int c = 0; c < p.d; c++) o[c] = 0;
        }
      }
      *lse = v;
    } else {
      const float v = *lse;
      p.stats[x] = v == -INFINITY ? INFINITY : v;
    }
  }
}

/* One block per (sequence, which of dq/dk/dv); threads over its rows x heads x d. */
__global__ void attn_cudnn_empty_rows_kernel(dl_attn_empty_rows_params_t p) {
  const int bi = blockIdx.x, which = blockIdx.y; /* 0 dq (no keys), 1 dk, 2 dv (no queries) */
  const int32_t *cu_me = which ? p.cu_kv : p.cu_q, *pad_me = which ? p.pad_kv : p.pad_q;
  const int32_t *cu_other = which ? p.cu_q : p.cu_kv;
  if (cu_other[bi + 1] - cu_other[bi] != 0) return;
  const int rows = cu_me[bi + 1] - cu_me[bi];
  const int64_t start = pad_me ? pad_me[bi] : cu_me[bi];
  uint16_t *g = (uint16_t *)(which == 0 ? p.dq : which == 1 ? p.dk : p.dv);
  const dl_attn_strides_t st = which == 0 ? p.dq_st : which == 1 ? p.dk_st : p.dv_st;
  const int h = which == 0 ? p.h_q : p.h_kv, d = which == 2 ? p.d_v : p.d_qk;
  const int64_t n = (int64_t)rows * h * d;
  for (int64_t x = threadIdx.x; x < n; x += blockDim.x) {
    const int c = (int)(x % d), hh = (int)(x / d % h);
    const int64_t r = x / d / h;
    g[(start + r) * st.s + hh * st.h + c] = 0;
  }
}

/* One block per head: the max over the valid rows of every sequence. */
__global__ void attn_cudnn_max_kernel(const float *rowmax, int b, int h, int s, const int32_t *seq,
                                      float *max_logit) {
  const int hh = blockIdx.x;
  float m = -INFINITY;
  for (int bi = 0; bi < b; bi++) {
    const int len = seq ? seq[bi] : s;
    const float *r = rowmax + ((int64_t)bi * h + hh) * s;
    for (int i = threadIdx.x; i < len; i += blockDim.x) m = fmaxf(m, r[i]); /* NaN: ignored */
  }
  __shared__ float red[32];
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)blockDim.x / 32; w++) m = fmaxf(m, red[w]);
    max_logit[hh] = fmaxf(max_logit[hh], m);
  }
}

/* ---- launchers ------------------------------------------------------------------- */

extern "C" int dl_attn_cudnn_ragged_cuda(const dl_attn_ragged_params_t *p, void *stream) {
  const int threads = 128, blocks = (p->b + 1 + threads - 1) / threads;
  attn_cudnn_ragged_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*p);
  DL_CUDA_CHECK_LAUNCH("attn_cudnn_ragged_kernel");
  return 0;
}

extern "C" int dl_attn_cudnn_stats_cuda(const dl_attn_stats_params_t *p, void *stream) {
  const int64_t n = (int64_t)p->b * p->h * p->s;
  if (n == 0) return 0;
  const int threads = 256;
  const int blocks = (int)(n / threads + 1 < 4096 ? n / threads + 1 : 4096);
  attn_cudnn_stats_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(*p);
  DL_CUDA_CHECK_LAUNCH("attn_cudnn_stats_kernel");
  return 0;
}

extern "C" int dl_attn_cudnn_empty_rows_cuda(const dl_attn_empty_rows_params_t *p, void *stream) {
  if (p->b == 0) return 0;
  attn_cudnn_empty_rows_kernel<<<dim3(p->b, 3), 256, 0, (cudaStream_t)stream>>>(*p);
  DL_CUDA_CHECK_LAUNCH("attn_cudnn_empty_rows_kernel");
  return 0;
}

extern "C" int dl_attn_cudnn_max_cuda(const float *rowmax, int b, int h, int s, const int32_t *seq,
                                      float *max_logit, void *stream) {
  if (h == 0) return 0;
  attn_cudnn_max_kernel<<<h, 256, 0, (cudaStream_t)stream>>>(rowmax, b, h, s, seq, max_logit);
  DL_CUDA_CHECK_LAUNCH("attn_cudnn_max_kernel");
  return 0;
}
