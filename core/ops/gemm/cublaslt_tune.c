/*
 * cublaslt_tune.c — cuBLASLt's opt-in tuning for core/ops/gemm/cublaslt.c.
 *
 * DISTLAB_GEMM_TUNE=N (2..8; 0 or 1: off, the heuristic's first candidate,
 * cublaslt.c's header; unset: off, but DL_LT_TUNE_BATCHED for a strided batch,
 * the grouped GEMM's experts of one shape, where the heuristic's first candidate
 * was 0.71x the fastest of 8 at 8 experts x 128 rows x 2048 -> 7168 on an H200)
 * times the first N candidates that qualify, at the
 * configuration's first call, in the call's own alpha, beta and c (in place
 * where the call is: c copied into the scratch output first), and keeps the
 * fastest (median of 3 runs after one warm-up each) whose output agrees with
 * the first candidate's (dl_lt_tune_pick: a candidate can round twice). Whether
 * beta is 0 and whether c is the output are part of the key. The runs go to a
 * stream, an output and a workspace of their own (stream-ordered allocations:
 * nothing waits for the device's other streams), read the call's operands as
 * they are, and are waited for before the call's own GEMM is queued; the
 * caller's results are untouched. They
 * time whatever else the GPU runs meanwhile: make a configuration's first
 * call with the GPU otherwise idle (ag_gemm_bench's "gemm parts" rows do,
 * for the chunks of its pipelines). A call inside a graph capture is not
 * tuned (the first candidate). N is part of the cache key, so a process may
 * switch it between calls and keep both choices. A chosen kernel may round
 * differently from the first candidate (another tile order): results are
 * then equal within fp32 accumulation, not bit-identical.
 */
#include <math.h>
#include <stdlib.h>

#include "gemm_lt_tune.h"

enum { TUNE_RUNS = 3 };

int dl_lt_tune_count(int batched, int *out) {
  const char *env = getenv("DISTLAB_GEMM_TUNE");
  *out = 0;
  if (!env || !*env) {
    *out = batched ? DL_LT_TUNE_BATCHED : 0;
    return DL_OK;
  }
  char *end = NULL;
  long v = strtol(env, &end, 10);
  if (*end || v < 0 || v > DL_LT_TUNE_MAX)
    return DL_ERR(DL_EINVAL, "DISTLAB_GEMM_TUNE=%s: expected the number of cuBLASLt candidates "
                  "to time, 0..%d (0 or 1: no tuning)", env, DL_LT_TUNE_MAX);
  *out = v > 1 ? (int)v : 0;
  return DL_OK;
}


#ifdef DL_WITH_CUDA

/* Elements of got that differ from want by more than rounding's reordering:
 * 16-bit outputs, any bit (two roundings of one sum differ by an ulp at about a
 * third of the elements, a different order of fp32 sums at few); f32, beyond
 * 2^-16 relative. */
static size_t tune_differ(const void *got, const void *want, size_t bytes, int out_dt) {
  size_t bad = 0;
  if (out_dt == DL_F32) {
    const float *g = got, *w = want;
    for (size_t i = 0; i < bytes / 4; i++)
      if (!(fabsf(g[i] - w[i]) <= fabsf(w[i]) * 0x1p-16f)) bad++;
  } else {
    const uint16_t *g = got, *w = want;
    for (size_t i = 0; i < bytes / 2; i++) bad += g[i] != w[i];
  }
  return bad;
}

/* The fastest of cand[0..n) on t's operands (see the header); *best its index.
 * Each candidate is timed and checked in the call's own configuration (its
 * beta, its c, in place where the call is) on a scratch output: the fastest
 * whose output differs from the heuristic's first candidate's (the untuned
 * choice) at no more than 1 element in 256 is taken. An H200 (cuBLASLt 13.1,
 * 2026-11-28) had a candidate that, at beta 1 with c in place, rounded to bf16
 * twice (19198 of 786432 elements an ulp off). */
int dl_lt_tune_pick(dl_lt_matmul_fn mm, cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                    cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *cand, int n,
                    const dl_lt_tune_args_t *t, int64_t ws_bytes, int *best) {
  cudaStream_t st = NULL;
  cudaEvent_t ev[TUNE_RUNS + 1] = {0};
  void *out = NULL, *ws = NULL, *host = NULL;
  float med[DL_LT_TUNE_MAX];
  int rc = DL_OK;
  *best = 0;
  DL_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int r = 0; r <= TUNE_RUNS && rc == DL_OK; r++)
    if (cudaEventCreate(&ev[r]) != cudaSuccess) rc = DL_ERR(DL_ECUDA, "gemm tuning: cudaEventCreate failed");
  if (rc == DL_OK && (cudaMallocAsync(&out, t->out_bytes, st) != cudaSuccess ||
                      (ws_bytes > 0 && cudaMallocAsync(&ws, (size_t)ws_bytes, st) != cudaSuccess)))
    rc = DL_ERR(DL_ECUDA, "gemm tuning: cudaMallocAsync of %zu + %lld bytes failed: %s", t->out_bytes,
                (long long)ws_bytes, cudaGetErrorString(cudaGetLastError()));
  if (rc == DL_OK && !(host = malloc(2 * t->out_bytes)))
    rc = DL_ERR(DL_ENOMEM, "gemm tuning: %zu bytes of host memory", 2 * t->out_bytes);
  const int fill = t->in_place && t->beta != 0.f; /* c copied into the scratch before a run */
  const void *c = (t->in_place || t->beta == 0.f || !t->c) ? out : t->c;
  /* one run of candidate i on the scratch output, c copied in first where the call is in place */
  #define TUNE_RUN(i)                                                                          \
    (mm(h, desc, &t->alpha, t->x, la, t->y, lb, &t->beta, c, lc, out, ld, &cand[i], ws,            \
        (size_t)ws_bytes, st) == CUBLAS_STATUS_SUCCESS)
  #define TUNE_FILL() \
    (!fill || cudaMemcpyAsync(out, t->c, t->out_bytes, cudaMemcpyDeviceToDevice, st) == cudaSuccess)
  for (int i = 0; i < n && rc == DL_OK; i++) {
    float ms[TUNE_RUNS];
    med[i] = -1.f;
    int ok = TUNE_FILL() && TUNE_RUN(i) && cudaEventRecord(ev[0], st) == cudaSuccess;
    for (int r = 0; ok && r < TUNE_RUNS; r++)
      ok = TUNE_RUN(i) && cudaEventRecord(ev[r + 1], st) == cudaSuccess;
    ok = ok && cudaEventSynchronize(ev[TUNE_RUNS]) == cudaSuccess;
    for (int r = 0; ok && r < TUNE_RUNS; r++) ok = cudaEventElapsedTime(&ms[r], ev[r], ev[r + 1]) == cudaSuccess;
    if (!ok) {
      (void)cudaGetLastError();
      continue; /* a candidate that does not run (or cannot be timed) is not chosen */
    }
    for (int a = 1; a < TUNE_RUNS; a++) /* median: sort 3 */
      for (int b = a; b > 0 && ms[b] < ms[b - 1]; b--) {
        float tmp = ms[b];
        ms[b] = ms[b - 1];
        ms[b - 1] = tmp;
      }
    med[i] = ms[TUNE_RUNS / 2];
  }
  /* the reference output (candidate 0's), then the fastest candidate that agrees with it */
  char *want = host, *got = want ? want + t->out_bytes : NULL;
  int have_want = rc == DL_OK && med[0] >= 0 && TUNE_FILL() && TUNE_RUN(0) &&
                  cudaMemcpyAsync(want, out, t->out_bytes, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
                  cudaStreamSynchronize(st) == cudaSuccess;
  for (int tries = 0; have_want && tries < n; tries++) {
    int f = -1;
    for (int i = 1; i < n; i++)
      if (med[i] >= 0 && med[i] < med[0] && (f < 0 || med[i] < med[f])) f = i;
    if (f < 0) break; /* none faster than the heuristic's first */
    int ok = TUNE_FILL() && TUNE_RUN(f) &&
             cudaMemcpyAsync(got, out, t->out_bytes, cudaMemcpyDeviceToHost, st) == cudaSuccess &&
             cudaStreamSynchronize(st) == cudaSuccess;
    if (ok && tune_differ(got, want, t->out_bytes, t->out_dt) <= t->out_bytes / dl_dtype_size(t->out_dt) / 256) {
      *best = f;
      break;
    }
    (void)cudaGetLastError();
    med[f] = -1.f; /* disagrees (or failed): never chosen */
  }
  #undef TUNE_RUN
  #undef TUNE_FILL
  free(host);
  if (out) cudaFreeAsync(out, st);
  if (ws) cudaFreeAsync(ws, st);
  if (cudaStreamSynchronize(st) != cudaSuccess && rc == DL_OK)
    rc = DL_ERR(DL_ECUDA, "gemm tuning: %s", cudaGetErrorString(cudaGetLastError()));
  for (int r = 0; r <= TUNE_RUNS; r++)
    if (ev[r]) cudaEventDestroy(ev[r]);
  cudaStreamDestroy(st);
  return rc;
}

#endif
