/*
 * attn_bench.cu — times the CUDA attention kernels on one GPU: forward,
 * backward and forward+backward of b=2 h=16 d=128 bf16 for s in 4k..32k,
 * causal and not, bshd and thd (equal-length packed sequences), and the
 * incremental merge. CUDA events around each call, warm-up, median of the
 * repetitions. FLOPs: forward 4*b*h*s*s*d (halved for causal), backward 2.5x
 * that, forward+backward 3.5x (the convention of FlashAttention's
 * benchmarks). Targets on H100/H200 (b=2 h=16 d=128 s=8k causal): forward
 * >= 308 TFLOP/s and forward+backward >= 288 (PyTorch's FA2); cuDNN ~550.
 *
 *   attn_bench [--quick]      (--quick: s = 8k only)
 * Built and run by scripts/gpu/attn_lab.sh.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "attn/attn.h"
#include "common/base.h"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                      \
      exit(2);                                                                             \
    }                                                                                      \
  } while (0)

/* values in [-1, 1) from a hash of the index, as bf16 */
__global__ void fill_kernel(uint16_t *x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    float f = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    uint32_t u = __float_as_uint(f);
    x[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

static void *alloc_fill(size_t elems, uint32_t seed) {
  void *p;
  CK(cudaMalloc(&p, elems * 2));
  fill_kernel<<<1024, 256>>>((uint16_t *)p, elems, seed);
  CK(cudaGetLastError());
  return p;
}

template <class F>
static double median_ms(F fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; i++) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(a));
    fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a)); CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static void check(int rc) {
  if (rc) {
    fprintf(stderr, "attn call failed: %s\n", dl_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  bool quick = argc > 1 && !strcmp(argv[1], "--quick");
  const int B = 2, H = 16, D = 128, SMAX = quick ? 8192 : 32768;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("# %s, b=%d h=%d d=%d bf16; TFLOP/s with fwd = 4bhssd (/2 causal), bwd = 2.5 fwd\n", prop.name, B, H, D);
  size_t n = (size_t)B * SMAX * H * D;
  void *q = alloc_fill(n, 1), *k = alloc_fill(n, 2), *v = alloc_fill(n, 3), *dout = alloc_fill(n, 4);
  void *out, *dq, *dk, *dv, *ws;
  float *lse;
  int32_t *cu;
  CK(cudaMalloc(&out, n * 2)); CK(cudaMalloc(&dq, n * 2)); CK(cudaMalloc(&dk, n * 2)); CK(cudaMalloc(&dv, n * 2));
  CK(cudaMalloc(&lse, (size_t)B * H * SMAX * 4)); CK(cudaMalloc(&cu, (B + 1) * 4));
  printf("%-6s %-7s %6s %9s %8s %9s %8s %9s %8s\n", "layout", "mask", "s", "fwd_ms", "fwd_TF", "bwd_ms", "bwd_TF",
         "fb_ms", "fb_TF");
  size_t ws_bytes = 0;
  for (int s : {4096, 8192, 16384, 32768}) {
    if (s > SMAX || (quick && s != 8192)) continue;
    for (int thd = 0; thd < 2; thd++)
      for (int causal = 1; causal >= 0; causal--) {
        dl_attn_params_t p = {};
        p.dtype = DL_BF16, p.b = B, p.h_q = p.h_kv = H, p.s_q = p.s_kv = s, p.d_qk = p.d_v = D;
        p.scale = 0.08838834764831845f, p.window_left = -1, p.window_right = causal ? 0 : -1;
        dl_attn_strides_t st = {(int64_t)s * H * D, (int64_t)H * D, D};
        p.q = q, p.k = k, p.v = v, p.out = out, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
        p.q_st = p.k_st = p.v_st = p.out_st = p.dout_st = p.dq_st = p.dk_st = p.dv_st = st;
        p.lse = lse, p.lse_st = {(int64_t)H * s, 1, s};
        if (thd) {
          int32_t h_cu[3] = {0, s, 2 * s};
          CK(cudaMemcpy(cu, h_cu, sizeof h_cu, cudaMemcpyHostToDevice));
          p.cu_seqlens_q = p.cu_seqlens_kv = cu, p.total_q = p.total_kv = (int64_t)B * s;
          p.lse_st = {0, 1, (int64_t)B * s};
        }
        size_t need = dl_attn_bwd_workspace_bytes(&p);
        if (need > ws_bytes) {
          if (ws_bytes) CK(cudaFree(ws));
          CK(cudaMalloc(&ws, need));
          ws_bytes = need;
        }
        p.workspace = ws, p.workspace_bytes = ws_bytes;
        double flops = 4.0 * B * H * (double)s * s * D / (causal ? 2 : 1);
        int reps = s <= 8192 ? 20 : 7;
        double tf = median_ms([&] { check(dl_attn_fwd_cuda(&p, nullptr, nullptr)); }, reps);
        double tb = median_ms([&] { check(dl_attn_bwd_cuda(&p, nullptr, nullptr)); }, reps);
        double tfb = median_ms([&] { check(dl_attn_fwd_cuda(&p, nullptr, nullptr)), check(dl_attn_bwd_cuda(&p, nullptr, nullptr)); }, reps);
        printf("%-6s %-7s %6d %9.3f %8.1f %9.3f %8.1f %9.3f %8.1f\n", thd ? "thd" : "bshd", causal ? "causal" : "none", s,
               tf, flops / tf / 1e9, tb, 2.5 * flops / tb / 1e9, tfb, 3.5 * flops / tfb / 1e9);
        fflush(stdout);
      }
  }
  /* the incremental merge of one step's (out, lse) into an fp32 accumulator, s = 8k */
  {
    const int s = 8192;
    float *acc, *acc_lse;
    CK(cudaMalloc(&acc, (size_t)B * s * H * D * 4)); CK(cudaMalloc(&acc_lse, (size_t)B * H * s * 4));
    CK(cudaMemset(acc, 0, (size_t)B * s * H * D * 4)); CK(cudaMemset(acc_lse, 0, (size_t)B * H * s * 4));
    CK(cudaMemset(lse, 0, (size_t)B * H * s * 4));
    dl_attn_merge_params_t m = {};
    m.b = B, m.h = H, m.s = s, m.d = D, m.mode = DL_ATTN_MERGE_INCR;
    m.out = acc, m.out_dtype = DL_F32, m.out_st = {(int64_t)s * H * D, (int64_t)H * D, D};
    m.lse = acc_lse, m.lse_st = {(int64_t)H * s, 1, s};
    m.part = q, m.part_dtype = DL_BF16, m.part_st = {(int64_t)s * H * D, (int64_t)H * D, D};
    m.part_lse = lse, m.part_lse_st = m.lse_st;
    double t = median_ms([&] { check(dl_attn_merge_out_cuda(&m, nullptr)); }, 20);
    double bytes = (double)B * s * H * D * (4 + 4 + 2) + (double)B * H * s * 12;
    printf("# merge incremental (fp32 acc, bf16 part) b=%d s=%d h=%d d=%d: %.3f ms, %.0f GB/s\n", B, s, H, D, t,
           bytes / t / 1e6);
    CK(cudaFree(acc)); CK(cudaFree(acc_lse));
  }
  return 0;
}
