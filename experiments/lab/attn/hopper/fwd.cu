/*
 * fwd.cu — lab driver of dl.attn's Hopper forward (kernels/attn/hopper/fwd_kernel.cuh,
 * whose header says how it works): the kernel alone, with its own checker and
 * timer, its main loops (PIPE 0: the steps in turn; PIPE 1: FA3's
 * intra-warpgroup pipelining; PIPE 2: PIPE 1 with V's wait placed so that
 * ptxas keeps the softmax under the P V; P through shared memory was slower
 * than 0 and 1).
 * Shapes: bshd, sbhd or thd (NaN between sequences), bf16, d = 128 (or 64: -DLAB_D=64), GQA/MQA,
 * any length, windows top-left or bottom-right, the fused merge.
 *
 * --check: sampled rows of every sequence against an fp64 reference kernel,
 * normwise and elementwise for O and LSE, with a planted 2% error that must
 * fail; after the timing, on the data the timed runs left. --merge also
 * times the fused-merge step into an fp32 and into a bf16 running out (CP's
 * accumulator has q's dtype) and checks each against a host merge of the
 * plain step's (O, LSE).
 *
 *   make -C experiments/lab/attn hopper       (nvcc -Ikernels ... -gencode=arch=compute_90a,code=sm_90a)
 *   ./hopper_fwd [--check] [--b 2] [--h 16] [--hkv 16] [--layout bshd|sbhd] [--s 4096,8192,16384,32768]
 *         [--thd L1,L2,...] [--window L,R] [--bottom-right] [--merge] [--iters 20] [--pipe 0,1,2]
 *         [--warm-ms 300] [--min-ms 600] (timing as attn_bench_torch.py's: warm-up work, then at least
 *         iters launches and min-ms of work) [--trace FILE] (a -DHP_FWD_TRACE=1 build: trace_run below)
 * scripts/gpu/hopper_lab.sh runs the checks, compute-sanitizer and the bench in one device call.
 */
#include "attn/hopper/fwd_kernel.cuh"
#ifndef HP_FWD_TRACE // a kernel from before the trace (an A/B's -I.ab/oldk)
#define HP_FWD_TRACE 0
#endif

#ifndef LAB_D
#define LAB_D 128 // the head dim this binary runs (-DLAB_D=64: the d 64 kernel)
#endif
#ifndef LAB_OPT // the kernels' OPT bits (fwd_params.cuh's HP_FWD_OPT_*; -DLAB_OPT=22: dl.attn's d 128 kernel,
#define LAB_OPT HP_FWD_OPT // TREE, TMA_O and LAZY; with TMA_O the fifth map is O's, boxes of 64 rows)
#endif
constexpr int D = LAB_D;

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)


namespace {

// ---- the tensors' layout -------------------------------------------------------------------------

// bshd or sbhd: b sequences of s tokens; thd: sequence bb has len[bb] rows from row first[bb] of a
// packed [rows, h, d] tensor (batch extent tb = 1), with 3 NaN rows after each (padding gaps).
struct layout_t {
  bool thd, sbhd;
  int b, s, rows, tb; // s: the longest sequence
  std::vector<int> len, first, cu;
};

static layout_t dense_layout(bool sbhd, int b, int s) {
  layout_t l{false, sbhd, b, s, s, b, std::vector<int>(b, s), std::vector<int>(b, 0), std::vector<int>(b + 1, 0)};
  for (int bb = 0; bb < b; bb++) l.cu[bb + 1] = l.cu[bb] + s;
  return l;
}

static layout_t thd_layout(const std::vector<int> &lens) {
  layout_t l{true, false, (int)lens.size(), 0, 0, 1, lens, {}, {0}};
  int row = 5; // offsets that do not start at 0
  for (int n : lens) {
    l.first.push_back(row), l.cu.push_back(l.cu.back() + n);
    row += n + 3, l.s = n > l.s ? n : l.s;
  }
  l.rows = row;
  return l;
}

// ---- the reference: fp64, one block of D threads per sampled (sequence, row) and head --------------

struct ref_args_t {
  int h, h_kv, wl, wr, thd; // params_t's window_left, window_right (bottom_right: no shift here)
  int64_t sq[3], skv[3];
  const int *first, *len; // per sequence
  double scale;
};

__global__ void ref_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, ref_args_t a,
                           const int2 *pairs, double *o_ref, double *lse_ref) {
  const int ri = blockIdx.x, hh = blockIdx.y, t = threadIdx.x, bb = pairs[ri].x, row = pairs[ri].y;
  __shared__ double qs[D], ps[D], red[D]; // D threads: D keys a chunk
  const int hkv = hh / (a.h / a.h_kv), len = a.len[bb];
  auto at = [&](const __nv_bfloat16 *x, int pos) { // element 0 of position pos of sequence bb
    const int64_t r = a.thd ? a.first[bb] + pos : pos, tb = a.thd ? 0 : bb;
    return x == q ? x + r * a.sq[0] + hh * a.sq[1] + tb * a.sq[2] : x + r * a.skv[0] + hkv * a.skv[1] + tb * a.skv[2];
  };
  qs[t] = (double)__bfloat162float(at(q, row)[t]);
  __syncthreads();
  double m = -INFINITY, l = 0.0, acc = 0.0;
  // the keys row sees: [lo, hi] of the sequence's (self-attention here: as many keys as queries)
  const int shift = 0; // bottom_right: len_kv - len_q = 0
  const int lo = a.wl >= 0 ? max(0, row + shift - a.wl) : 0, hi = a.wr >= 0 ? min(len - 1, row + shift + a.wr) : len - 1;
  const int keys = hi >= lo ? hi - lo + 1 : 0;
  for (int k0 = 0; k0 < keys; k0 += D) {
    double sc = -INFINITY; // thread t: score of key lo + k0 + t
    if (k0 + t < keys) {
      const __nv_bfloat16 *kr = at(k, lo + k0 + t);
      sc = 0.0;
      for (int i = 0; i < D; i++) sc += qs[i] * (double)__bfloat162float(kr[i]);
      sc *= a.scale;
    }
    red[t] = sc;
    __syncthreads();
    double bm = -INFINITY;
    for (int i = 0; i < D; i++) bm = fmax(bm, red[i]);
    const double mn = fmax(m, bm), cr = m == -INFINITY ? 0.0 : exp(m - mn);
    __syncthreads();
    ps[t] = k0 + t < keys ? exp(sc - mn) : 0.0;
    __syncthreads();
    double ls = 0.0, av = 0.0;
    for (int i = 0; i < D && k0 + i < keys; i++) {
      ls += ps[i];
      av += ps[i] * (double)__bfloat162float(at(v, lo + k0 + i)[t]);
    }
    l = l * cr + ls;
    acc = acc * cr + av;
    m = mn;
    __syncthreads();
  }
  const int64_t idx = (int64_t)hh * gridDim.x + ri;
  o_ref[idx * D + t] = keys ? acc / l : 0.0;
  if (t == 0) lse_ref[idx] = keys ? m + log(l) : -INFINITY;
}

__global__ void fill_kernel(__nv_bfloat16 *x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = __float2bfloat16(((float)(z >> 40) / (float)(1u << 24) - 0.5f) * 2.0f); // uniform in [-1, 1)
  }
}

} // namespace

// ---- host ---------------------------------------------------------------------------------------

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  if (!fn) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) {
      fprintf(stderr, "cuTensorMapEncodeTiled not found in the driver\n");
      exit(1);
    }
  }
  return fn;
}

// (d, heads, rows, batch) of a tensor of layout l; boxes of 64 x 1 x box_rows x 1 with the 128-byte swizzle.
static CUtensorMap tensor_map(const __nv_bfloat16 *x, const layout_t &l, int heads, int box_rows = 128) {
  CUtensorMap m;
  int64_t st[3];
  hp_strides(l.sbhd, l.tb, l.rows, heads, D, st);
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)l.rows, (cuuint64_t)l.tb};
  const cuuint64_t strides[3] = {(cuuint64_t)st[1] * 2, (cuuint64_t)st[0] * 2, (cuuint64_t)st[2] * 2};
  const cuuint32_t box[4] = {64, 1, (cuuint32_t)box_rows, 1}, estr[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)x, dims, strides, box, estr,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", (int)r);
    exit(1);
  }
  return m;
}

static void run(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const params_t &p,
                const layout_t &l, int pipe, cudaStream_t st) {
  const CUtensorMap tq = tensor_map(q, l, p.h), tk = tensor_map(k, l, p.h_kv), tv = tensor_map(v, l, p.h_kv);
  const size_t smem = fwd_smem_bytes<D, D>(p.acc_out != nullptr), most = fwd_smem_bytes<D, D>(true);
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(fwd_kernel<0, D, D, LAB_OPT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    CK(cudaFuncSetAttribute(fwd_kernel<1, D, D, LAB_OPT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    CK(cudaFuncSetAttribute(fwd_kernel<2, D, D, LAB_OPT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    attr = true;
  }
  const dim3 grid((p.s_q + BM - 1) / BM, p.h, p.b);
  // the fifth map: O's (boxes of a warpgroup's 64 rows) for HP_FWD_OPT_TMA_O's store, else unread
  const CUtensorMap to = LAB_OPT & HP_FWD_OPT_TMA_O ? tensor_map(reinterpret_cast<const __nv_bfloat16 *>(p.o), l, p.h, 64) : tq;
  if (pipe == 2) fwd_kernel<2, D, D, LAB_OPT><<<grid, THREADS, smem, st>>>(tq, tk, tv, p, to);
  else if (pipe == 1) fwd_kernel<1, D, D, LAB_OPT><<<grid, THREADS, smem, st>>>(tq, tk, tv, p, to);
  else fwd_kernel<0, D, D, LAB_OPT><<<grid, THREADS, smem, st>>>(tq, tk, tv, p, to);
  CK(cudaGetLastError());
}

// Sampled rows of every sequence against the fp64 reference: normwise and elementwise error of O
// and LSE. planted: O scaled by 1.02 first (the check must then fail).
static bool check(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const params_t &p,
                  const layout_t &l, const int *d_first, const int *d_len, bool planted) {
  std::vector<int2> pairs; // (sequence, row)
  for (int bb = 0; bb < l.b; bb++) {
    for (int r = 0; r < l.len[bb]; r += 97) pairs.push_back(make_int2(bb, r));
    if (l.len[bb] > 0) pairs.push_back(make_int2(bb, l.len[bb] - 1));
  }
  const int np = (int)pairs.size();
  if (np == 0) return true;
  int2 *dpairs;
  double *oref, *lref;
  CK(cudaMalloc(&dpairs, np * sizeof(int2)));
  CK(cudaMalloc(&oref, (size_t)p.h * np * D * sizeof(double)));
  CK(cudaMalloc(&lref, (size_t)p.h * np * sizeof(double)));
  CK(cudaMemcpy(dpairs, pairs.data(), np * sizeof(int2), cudaMemcpyHostToDevice));
  ref_args_t a{p.h, p.h_kv, p.window_left, p.window_right, l.thd, {}, {}, d_first, d_len,
               (double)p.scale_log2 / 1.4426950408889634};
  hp_strides(l.sbhd, l.tb, l.rows, p.h, D, a.sq);
  hp_strides(l.sbhd, l.tb, l.rows, p.h_kv, D, a.skv);
  ref_kernel<<<dim3(np, p.h), D>>>(q, k, v, a, dpairs, oref, lref);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<double> ho((size_t)p.h * np * D), hl((size_t)p.h * np);
  CK(cudaMemcpy(ho.data(), oref, ho.size() * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), lref, hl.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<__nv_bfloat16> go((size_t)l.tb * l.rows * p.h * D);
  std::vector<float> gl(l.thd ? (size_t)p.h * l.rows : (size_t)l.b * p.h * l.s);
  CK(cudaMemcpy(go.data(), p.o, go.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), p.lse, gl.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, emax = 0, lmax = 0;
  for (int hh = 0; hh < p.h; hh++)
    for (int i = 0; i < np; i++) {
      const int bb = pairs[i].x, row = pairs[i].y;
      const int64_t ri = (int64_t)hh * np + i, r = l.thd ? l.first[bb] + row : row, tb = l.thd ? 0 : bb;
      double rmax = 0; // elementwise errors against |ref| plus the row's largest |ref|
      for (int c = 0; c < D; c++) rmax = fmax(rmax, fabs(ho[ri * D + c]));
      for (int c = 0; c < D; c++) {
        double got = (double)__bfloat162float(go[r * p.o_st[0] + hh * p.o_st[1] + tb * p.o_st[2] + c]);
        if (planted) got *= 1.02;
        const double ref = ho[ri * D + c], d = got - ref;
        num += d * d;
        den += ref * ref;
        emax = got != got ? INFINITY : fmax(emax, fabs(d) / (fabs(ref) + rmax + (rmax == 0 ? 1.0 : 0.0)));
      }
      const double lg = gl[l.thd ? (int64_t)hh * l.rows + r : ((int64_t)bb * p.h + hh) * l.s + row], lr = hl[ri];
      lmax = lg != lg || (lr == -INFINITY) != (lg == -INFINITY) ? INFINITY
             : lr == -INFINITY                                   ? lmax
                                                                 : fmax(lmax, fabs(lg - lr) / fmax(1.0, fabs(lr)));
    }
  const double nw = den > 0 ? sqrt(num / den) : 0.0;
  // bf16 output and P: normwise 4e-3, elementwise 1e-2 of |ref| + the row's largest |ref|, LSE 1e-4
  // (experiments/lab/emu/attn/hopper_fwd.cpp's bounds; it measured 1.9-2.4e-3 normwise, 2.2-3.2e-3 elementwise)
  const bool ok = nw <= 4e-3 && emax <= 1e-2 && lmax <= 1e-4;
  printf("  check s=%d window (%d,%d)%s: normwise %.2e, elementwise %.2e, lse %.2e over %d rows x %d heads: %s\n", l.s,
         p.window_left, p.window_right, planted ? " (2%% planted)" : "", nw, emax, lmax, np, p.h, ok ? "ok" : "FAIL");
  CK(cudaFree(dpairs));
  CK(cudaFree(oref));
  CK(cudaFree(lref));
  return ok;
}

// The fused merge against the plain step: acc_out/acc_lse started as acc0/lse0 (host copies; bf16-exact
// values where acc_bf16), and the plain run left o/lse (checked by check()); every valid row's merge in fp64
// on the host.
static bool check_merge(const params_t &p, const layout_t &l, const std::vector<float> &acc0,
                        const std::vector<float> &lse0, const __nv_bfloat16 *o, const float *lse) {
  std::vector<float> acc(acc0.size()), accl(lse0.size()), pl(lse0.size());
  std::vector<__nv_bfloat16> po(acc0.size());
  if (p.acc_bf16) {
    CK(cudaMemcpy(po.data(), p.acc_out, po.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < acc.size(); i++) acc[i] = __bfloat162float(po[i]);
  } else {
    CK(cudaMemcpy(acc.data(), p.acc_out, acc.size() * 4, cudaMemcpyDeviceToHost));
  }
  CK(cudaMemcpy(accl.data(), p.acc_lse, accl.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(po.data(), o, po.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(pl.data(), lse, pl.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0, lmax = 0;
  for (int bb = 0; bb < l.b; bb++)
    for (int hh = 0; hh < p.h; hh++)
      for (int i = 0; i < l.len[bb]; i++) {
        const int64_t r = l.thd ? l.first[bb] + i : i, tb = l.thd ? 0 : bb;
        const int64_t at = r * p.o_st[0] + hh * p.o_st[1] + tb * p.o_st[2];
        const int64_t li = l.thd ? (int64_t)hh * l.rows + r : ((int64_t)bb * p.h + hh) * l.s + i;
        const double l0 = lse0[li], ls = pl[li];
        const double ln = ls == -INFINITY ? l0 : l0 == -INFINITY ? ls : fmax(l0, ls) + log1p(exp(-fabs(l0 - ls)));
        for (int c = 0; c < D; c++) {
          const double want = ls == -INFINITY ? acc0[at + c]
                              : (l0 == -INFINITY ? 0.0 : acc0[at + c] * exp(l0 - ln)) +
                                    (double)__bfloat162float(po[at + c]) * exp(ls - ln);
          const double d = acc[at + c] - want;
          num += d != d ? INFINITY : d * d, den += want * want;
        }
        lmax = fmax(lmax, accl[li] != accl[li] ? INFINITY : ln == -INFINITY ? (accl[li] == -INFINITY ? 0 : INFINITY)
                                                                          : fabs(accl[li] - ln) / fmax(1.0, fabs(ln)));
      }
  // the plain O was rounded to bf16 (2^-8 relative at most), and a bf16 running out is rounded once more
  const double nw = den > 0 ? sqrt(num / den) : 0.0;
  const bool ok = nw <= (p.acc_bf16 ? 8e-3 : 4e-3) && lmax <= 1e-4;
  printf("  merge into %s against the plain step: normwise %.2e, lse %.2e: %s\n", p.acc_bf16 ? "bf16" : "f32", nw,
         lmax, ok ? "ok" : "FAIL");
  return ok;
}

#if HP_FWD_TRACE
// --trace FILE (a build with -DHP_FWD_TRACE=1): after each timed step, TRACE_REPS more launches of it
// back to back, each with its own p.trace (fwd_kernel.cuh's hp_trace), and a summary over the second
// half of them (the steady state of a timing loop): a launch's span (its first CTA's start to its last
// warp's stores, %globaltimer) and the gap to the next launch's first CTA; per SM, the sums over its
// CTAs of the start (to Q landed), the main loop (to the last consumer warp's loop end), the epilogue
// (to the last warp's stores issued) and the gaps between CTAs, in us and in SM clocks; the SMs' last
// ends (median and latest: the grid's tail). The last launch's CTAs are appended to FILE, a line each.
constexpr int TRACE_REPS = 16;
static void trace_run(const char *file, const char *tag, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                      const __nv_bfloat16 *v, params_t p, const layout_t &l, int pipe) {
  const size_t ctas = (size_t)((p.s_q + BM - 1) / BM) * p.h * p.b, words = ctas * HP_TRACE_SLOTS;
  unsigned long long *d;
  CK(cudaMalloc(&d, words * 8 * TRACE_REPS));
  CK(cudaMemset(d, 0, words * 8 * TRACE_REPS));
  for (int r = 0; r < TRACE_REPS; r++) p.trace = d + r * words, run(q, k, v, p, l, pipe, 0);
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> t(words * TRACE_REPS);
  CK(cudaMemcpy(t.data(), d, t.size() * 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  if (FILE *fp = fopen(file, "a")) {
    const unsigned long long *last = &t[(TRACE_REPS - 1) * words];
    for (size_t c = 0; c < ctas; c++) {
      fprintf(fp, "%s,%d,%d,%zu", tag, l.s, pipe, c);
      for (int i = 0; i < HP_TRACE_SLOTS; i++) fprintf(fp, ",%llu", last[c * HP_TRACE_SLOTS + i]);
      fprintf(fp, "\n");
    }
    fclose(fp);
  }
  struct cta_t { unsigned long long start, gstart, q, loop, end, gend; };
  double span = 0, gap_next = 0, ghz = 0, s_start = 0, s_main = 0, s_epi = 0, s_gap = 0, c_main = 0, c_epi = 0,
         end_med = 0, end_max = 0;
  int counted = 0;
  unsigned long long prev_end = 0;
  for (int r = 0; r < TRACE_REPS; r++) {
    std::vector<std::vector<cta_t>> per_sm(1024);
    unsigned long long g0 = ~0ull, g1 = 0;
    for (size_t c = 0; c < ctas; c++) {
      const unsigned long long *w = &t[(r * ctas + c) * HP_TRACE_SLOTS];
      if (w[1] == 0) continue; // a CTA past its sequence (thd): returned before the trace
      cta_t x{w[1], w[2], w[5], 0, 0, 0};
      for (int i = 0; i < 8; i++)
        x.loop = std::max(x.loop, w[8 + i]), x.end = std::max(x.end, w[16 + i]), x.gend = std::max(x.gend, w[24 + i]);
      per_sm[w[0]].push_back(x), g0 = std::min(g0, x.gstart), g1 = std::max(g1, x.gend);
    }
    if (r > 0 && r > TRACE_REPS / 2) gap_next += (double)g0 - (double)prev_end;
    prev_end = g1;
    if (r < TRACE_REPS / 2) continue;
    counted++, span += (double)(g1 - g0) * 1e-3;
    double cyc = 0, ns = 0, sm_start = 0, sm_main = 0, sm_epi = 0, sm_gap = 0;
    std::vector<double> ends;
    for (auto &v : per_sm) {
      if (v.empty()) continue;
      std::sort(v.begin(), v.end(), [](const cta_t &a, const cta_t &b) { return a.start < b.start; });
      cyc += (double)(v.back().end - v.front().start), ns += (double)(v.back().gend - v.front().gstart);
      ends.push_back((double)(v.back().gend - g0) * 1e-3);
      for (size_t i = 0; i < v.size(); i++) {
        sm_start += v[i].q - v[i].start, sm_main += v[i].loop - v[i].q, sm_epi += v[i].end - v[i].loop;
        if (i + 1 < v.size()) sm_gap += (double)v[i + 1].start - (double)v[i].end;
      }
    }
    const double g = cyc / ns, n = (double)ends.size();
    std::sort(ends.begin(), ends.end());
    ghz += g, s_start += sm_start / n / g * 1e-3, s_main += sm_main / n / g * 1e-3, s_epi += sm_epi / n / g * 1e-3;
    s_gap += sm_gap / n / g * 1e-3, c_main += sm_main / n, c_epi += sm_epi / n;
    end_med += ends[ends.size() / 2], end_max += ends.back();
  }
  const double kc = 1.0 / counted, kg = counted > 1 ? 1.0 / (counted - 1) : 0.0;
  printf("  trace %s s=%d pipe=%d (launches %d-%d of %d): span %.1f us, gap to the next launch %.1f us, SM clock %.3f "
         "GHz; per SM: start %.1f us, main loop %.1f (%.0f k clocks), epilogue %.1f (%.1f k clocks), gaps %.1f; "
         "SMs' last ends: median %.1f, latest %.1f us\n",
         tag, l.s, pipe, TRACE_REPS / 2 + 1, TRACE_REPS, TRACE_REPS, span * kc, gap_next * kg * 1e-3, ghz * kc,
         s_start * kc, s_main * kc, c_main * kc * 1e-3, s_epi * kc, c_epi * kc * 1e-3, s_gap * kc, end_med * kc, end_max * kc);
}
#endif

int main(int argc, char **argv) {
  int b = 2, h = 16, h_kv = 0, iters = 20;
  float warm_ms = 300, min_ms = 600;
  bool sbhd = false;
  bool do_check = false;
  std::vector<int> ss = {4096, 8192, 16384, 32768}, thd_lens;
  std::vector<int> pipes = {0, 1}; // the kernel's main loops (fwd_kernel.cuh)
  std::vector<std::pair<int, int>> windows = {{-1, -1}, {-1, 0}}; // none, causal
  bool bottom_right = false, merge = false, acc_misalign = false;
  [[maybe_unused]] const char *trace_file = nullptr; // --trace (HP_FWD_TRACE builds)
  auto ints = [](char *list) {
    std::vector<int> out;
    for (char *t = strtok(list, ","); t; t = strtok(nullptr, ",")) out.push_back(atoi(t));
    return out;
  };
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) do_check = true;
    else if (!strcmp(argv[i], "--b") && i + 1 < argc) b = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--h") && i + 1 < argc) h = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hkv") && i + 1 < argc) h_kv = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
      const char *l = argv[++i];
      if (strcmp(l, "bshd") && strcmp(l, "sbhd")) {
        fprintf(stderr, "--layout: bshd or sbhd, got %s\n", l);
        return 2;
      }
      sbhd = !strcmp(l, "sbhd");
    } else if (!strcmp(argv[i], "--thd") && i + 1 < argc) thd_lens = ints(argv[++i]);
    else if (!strcmp(argv[i], "--window") && i + 1 < argc) { // L,R: the one mask to run (-1: unbounded)
      const std::vector<int> w = ints(argv[++i]);
      if (w.size() != 2) {
        fprintf(stderr, "--window L,R\n");
        return 2;
      }
      windows = {{w[0], w[1]}};
    } else if (!strcmp(argv[i], "--bottom-right")) bottom_right = true;
    else if (!strcmp(argv[i], "--merge")) merge = true; // also time the fused merge, and check it
    // the running out one element past a 16-byte boundary: the staged merge's 8-byte (f32) and 4-byte
    // (bf16) copies instead of 16-byte ones
    else if (!strcmp(argv[i], "--acc-misalign")) acc_misalign = true;
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
      trace_file = argv[++i];
      if (!HP_FWD_TRACE) {
        fprintf(stderr, "--trace needs a build with -DHP_FWD_TRACE=1\n");
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--warm-ms") && i + 1 < argc) warm_ms = (float)atof(argv[++i]);
    else if (!strcmp(argv[i], "--min-ms") && i + 1 < argc) min_ms = (float)atof(argv[++i]);
    else if (!strcmp(argv[i], "--pipe") && i + 1 < argc) {
      pipes.clear();
      for (int x : ints(argv[++i])) pipes.push_back(x);
    } else if (!strcmp(argv[i], "--s") && i + 1 < argc) ss = ints(argv[++i]);
    else {
      fprintf(stderr, "usage: fwd [--check] [--b B] [--h H] [--hkv H_KV] [--layout bshd|sbhd] [--s S1,S2,...] "
                      "[--thd L1,L2,...] [--window L,R] [--bottom-right] [--merge [--acc-misalign]] [--iters N] [--warm-ms 300] [--min-ms 600] [--pipe 0,1,2] [--trace FILE]\n");
      return 2;
    }
  }
  int dev;
  cudaDeviceProp prop;
  CK(cudaGetDevice(&dev));
  CK(cudaGetDeviceProperties(&prop, dev));
  if (h_kv == 0) h_kv = h;
  if (h_kv < 1 || h % h_kv) {
    fprintf(stderr, "--hkv %d must divide --h %d\n", h_kv, h);
    return 2;
  }
  std::vector<layout_t> layouts;
  if (!thd_lens.empty()) layouts.push_back(thd_layout(thd_lens));
  else
    for (int s : ss) layouts.push_back(dense_layout(sbhd, b, s));
  printf("device %s, sm_%d%d; %s bf16, h=%d h_kv=%d d=%d\n", prop.name, prop.major, prop.minor,
         thd_lens.empty() ? (sbhd ? "sbhd" : "bshd") : "thd", h, h_kv, D);
  bool all_ok = true;
  int *d_err; // params_t.err: a wait that timed out (the kernel then ends with garbage)
  CK(cudaMalloc(&d_err, sizeof(int)));
  CK(cudaMemset(d_err, 0, sizeof(int)));
  auto check_err = [&](const char *what) {
    int e = 0;
    CK(cudaMemcpy(&e, d_err, sizeof(int), cudaMemcpyDeviceToHost));
    if (e) {
      fprintf(stderr, "fwd: a wait of the kernel timed out (%s); its results are garbage\n", what);
      exit(1);
    }
  };
  for (const layout_t &l : layouts) {
    const size_t n = (size_t)l.tb * l.rows * h * D, nkv = (size_t)l.tb * l.rows * h_kv * D;
    const size_t nlse = l.thd ? (size_t)h * l.rows : (size_t)l.b * h * l.s;
    __nv_bfloat16 *q, *k, *v, *o;
    float *lse;
    int *d_first, *d_len, *d_cu;
    CK(cudaMalloc(&q, n * 2));
    CK(cudaMalloc(&k, nkv * 2));
    CK(cudaMalloc(&v, nkv * 2));
    CK(cudaMalloc(&o, n * 2));
    CK(cudaMalloc(&lse, nlse * 4));
    CK(cudaMalloc(&d_first, l.b * sizeof(int)));
    CK(cudaMalloc(&d_len, l.b * sizeof(int)));
    CK(cudaMalloc(&d_cu, (l.b + 1) * sizeof(int)));
    CK(cudaMemcpy(d_first, l.first.data(), l.b * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_len, l.len.data(), l.b * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_cu, l.cu.data(), (l.b + 1) * sizeof(int), cudaMemcpyHostToDevice));
    fill_kernel<<<1024, 256>>>(q, n, 1);
    fill_kernel<<<1024, 256>>>(k, nkv, 2);
    fill_kernel<<<1024, 256>>>(v, nkv, 3);
    CK(cudaGetLastError());
    if (l.thd) // NaN in the rows no sequence owns: before the first, in the gaps, after the last
      for (int bb = 0; bb <= l.b; bb++) {
        const int from = bb == 0 ? 0 : l.first[bb - 1] + l.len[bb - 1], to = bb == l.b ? l.rows : l.first[bb];
        CK(cudaMemset(q + (size_t)from * h * D, 0xff, (size_t)(to - from) * h * D * 2));
        CK(cudaMemset(k + (size_t)from * h_kv * D, 0xff, (size_t)(to - from) * h_kv * D * 2));
        CK(cudaMemset(v + (size_t)from * h_kv * D, 0xff, (size_t)(to - from) * h_kv * D * 2));
      }
    for (const auto &w : windows)
      for (int pipe : pipes) {
        double work = 0; // attention FLOPs: 4 d per (query, visible key)
        for (int bb = 0; bb < l.b; bb++)
          for (int i = 0; i < l.len[bb]; i++) {
            const int lo = w.first >= 0 ? std::max(0, i - w.first) : 0;
            const int hi = w.second >= 0 ? std::min(l.len[bb] - 1, i + w.second) : l.len[bb] - 1;
            work += hi >= lo ? 4.0 * h * D * (hi - lo + 1) : 0.0;
          }
        params_t p{};
        p.b = l.b, p.h = h, p.h_kv = h_kv, p.s_q = p.s_kv = l.s;
        p.window_left = w.first, p.window_right = w.second, p.bottom_right = bottom_right ? 1 : 0;
        p.scale_log2 = 1.4426950408889634f / sqrtf((float)D);
        p.o = reinterpret_cast<uint16_t *>(o), p.lse = lse;
        hp_strides(l.sbhd, l.tb, l.rows, h, D, p.o_st);
        hp_lse_strides(l.thd, h, l.thd ? l.rows : l.s, p.lse_st);
        memcpy(p.acc_st, p.o_st, sizeof p.o_st), memcpy(p.acc_lse_st, p.lse_st, sizeof p.lse_st);
        if (l.thd) p.cu_q = p.cu_kv = d_cu, p.pad_q = p.pad_kv = d_first;
        p.err = d_err;
        CK(cudaMemset(o, 0xff, n * 2)); // poison: NaN bf16 until the kernel writes
        CK(cudaMemset(lse, 0xff, nlse * 4));
        run(q, k, v, p, l, pipe, 0);
        CK(cudaDeviceSynchronize());
        check_err("the first run");
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        // as experiments/attn/attn_bench_torch.py times its anchors: warm-up work of warm_ms, then at
        // least iters launches and min_ms of work between two events (the clocks settle as they do there)
        auto time_us = [&](const params_t &pp) {
          CK(cudaEventRecord(e0));
          run(q, k, v, pp, l, pipe, 0);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float one;
          CK(cudaEventElapsedTime(&one, e0, e1));
          one = std::max(one, 1e-3f);
          for (int i = 0; i < (int)ceilf(warm_ms / one); i++) run(q, k, v, pp, l, pipe, 0);
          const int n = std::max(iters, (int)ceilf(min_ms / one));
          CK(cudaEventRecord(e0));
          for (int i = 0; i < n; i++) run(q, k, v, pp, l, pipe, 0);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          check_err("the timed runs");
          return ms * 1e3 / n;
        };
        const double us = time_us(p);
        printf("s=%6d window (%d,%d) pipe=%d  %9.1f us  %6.1f TFLOP/s\n", l.s, w.first, w.second, pipe, us,
               work / us * 1e-6);
#if HP_FWD_TRACE
        char tag[64];
        snprintf(tag, sizeof tag, "%s,w%d_%d,plain", l.thd ? "thd" : "dense", w.first, w.second);
        if (trace_file) trace_run(trace_file, tag, q, k, v, p, l, pipe);
#endif
        if (do_check) { // after timing: the data the timed runs left
          const bool ok = check(q, k, v, p, l, d_first, d_len, false),
                     caught = !check(q, k, v, p, l, d_first, d_len, true);
          if (!caught) printf("  the planted 2%% error went unseen\n");
          all_ok = all_ok && ok && caught;
        }
        for (int bf = 0; merge && bf < 2; bf++) { // the same step merged into a running (acc_out, acc_lse),
          // acc_out fp32 then bf16, timed the same way
          std::vector<float> acc0(n), lse0(nlse);
          std::vector<__nv_bfloat16> acc0h(n);
          uint64_t z = 12345;
          for (size_t i = 0; i < n; i++) {
            z = z * 6364136223846793005ull + 1, acc0[i] = (float)(z >> 40) / (1 << 24) - 0.5f;
            if (bf) acc0h[i] = __float2bfloat16(acc0[i]), acc0[i] = __bfloat162float(acc0h[i]);
          }
          for (size_t i = 0; i < nlse; i++) lse0[i] = i % 7 == 3 ? -INFINITY : (float)(i % 13) - 6.0f;
          const size_t esize = bf ? 2 : 4;
          void *acc_alloc;
          float *accl;
          CK(cudaMalloc(&acc_alloc, n * esize + 16));
          CK(cudaMalloc(&accl, nlse * 4));
          // --acc-misalign: two elements off (8 bytes f32, 4 bf16), for the kernel's 8- and 4-byte copies
          // (dl.attn passes 16-byte aligned rows only; the epilogue stores element pairs, so one element
          // off faults)
          void *acc = static_cast<char *>(acc_alloc) + (acc_misalign ? 2 * esize : 0);
          params_t pm = p;
          pm.acc_out = acc, pm.acc_lse = accl, pm.acc_bf16 = bf;
          pm.acc_vec = hp_acc_vec(acc, pm.acc_st, (int)esize);
          if (acc_misalign) printf("  running out at +%zu bytes: copies of %d bytes\n", 2 * esize, pm.acc_vec);
          auto reset = [&] {
            CK(cudaMemcpy(acc, bf ? (const void *)acc0h.data() : (const void *)acc0.data(), n * esize,
                          cudaMemcpyHostToDevice));
            CK(cudaMemcpy(accl, lse0.data(), nlse * 4, cudaMemcpyHostToDevice));
          };
          const double mus = time_us(pm);
          printf("s=%6d window (%d,%d) pipe=%d  %9.1f us  merged into %s (%+.1f%% against the plain step)\n", l.s,
                 w.first, w.second, pipe, mus, bf ? "bf16" : "f32", (mus / us - 1.0) * 100.0);
#if HP_FWD_TRACE
          snprintf(tag, sizeof tag, "%s,w%d_%d,%s", l.thd ? "thd" : "dense", w.first, w.second, bf ? "bf16" : "f32");
          if (trace_file) trace_run(trace_file, tag, q, k, v, pm, l, pipe);
#endif
          reset(); // one merge from the known start, checked against the plain step's o and lse
          run(q, k, v, pm, l, pipe, 0);
          CK(cudaDeviceSynchronize());
          check_err("the merge");
          all_ok = check_merge(pm, l, acc0, lse0, o, lse) && all_ok;
          CK(cudaFree(acc_alloc));
          CK(cudaFree(accl));
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
      }
    for (void *ptr : {(void *)q, (void *)k, (void *)v, (void *)o, (void *)lse, (void *)d_first, (void *)d_len, (void *)d_cu})
      CK(cudaFree(ptr));
  }
  CK(cudaFree(d_err));
  if (do_check) printf("%s\n", all_ok ? "check: all ok" : "check: FAILED");
  return all_ok ? 0 : 1;
}
