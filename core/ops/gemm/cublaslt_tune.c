/*
 * cublaslt_tune.c — DISTLAB_GEMM_TUNE (cublaslt.c's header says when it
 * runs): each candidate checked against the first with a c, then timed (the
 * median of TUNE_RUNS runs after a warm-up), on a stream, an output and a
 * workspace of its own (stream-ordered allocations); the fastest that passed
 * is chosen.
 */
#include "gemm_lt_tune.h"

#ifdef DL_WITH_CUDA
#include <math.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "base/internal.h"

enum { TUNE_RUNS = 3, CHECK_BYTES = 4 << 20 };


/* How many of the n elements (dtype dt) of a and b differ: 16-bit ones in any bit, f32 ones by
 * more than 2^-16 of their size (another summation order moves f32 results in their last
 * bits, and a 16-bit one only where the fp32 sum sits at a rounding boundary). */
static int64_t tune_differ(const void *a, const void *b, int64_t n, int dt) {
  int64_t k = 0;
  if (dt != DL_F32) {
    const uint16_t *x = a, *y = b;
    for (int64_t i = 0; i < n; i++) k += x[i] != y[i];
    return k;
  }
  const float *x = a, *y = b;
  for (int64_t i = 0; i < n; i++) {
    const float d = x[i] - y[i], m = fabsf(x[i]) > fabsf(y[i]) ? fabsf(x[i]) : fabsf(y[i]);
    k += !(fabsf(d) <= m * 0x1p-16f); /* a NaN counts */
  }
  return k;
}

/* The fastest of cand[0..n) on t's operands (see the header); *best its index. */
int dl_gemm_lt_tune(const dl_gemm_lt_tuned_t *e, const cublasLtMatmulAlgo_t *cand, int n,
                    const dl_gemm_lt_tune_args_t *t, int64_t ws_bytes, int *best) {
  const dl_gemm_lt_matmul_fn matmul = e->matmul;
  const cublasLtHandle_t h = e->handle;
  cudaStream_t st = NULL;
  cudaEvent_t ev[TUNE_RUNS + 1] = {0};
  void *out = NULL, *ws = NULL;
  const float alpha = 1.f, beta = 0.f;
  float best_ms = -1.f;
  int rc = DL_OK;
  *best = 0;
  DL_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int r = 0; r <= TUNE_RUNS && rc == DL_OK; r++)
    if (cudaEventCreate(&ev[r]) != cudaSuccess) rc = DL_ERR(DL_ECUDA, "gemm tuning: cudaEventCreate failed");
  if (rc == DL_OK && (cudaMallocAsync(&out, t->out_bytes, st) != cudaSuccess ||
                      (ws_bytes > 0 && cudaMallocAsync(&ws, (size_t)ws_bytes, st) != cudaSuccess)))
    rc = DL_ERR(DL_ECUDA, "gemm tuning: cudaMallocAsync of %zu + %lld bytes failed: %s", t->out_bytes,
                (long long)ws_bytes, cudaGetErrorString(cudaGetLastError()));
  /* The check before the timing: each candidate once with beta 1 and c a constant (bytes
   * 0x3f: 0.746 in bf16 and f32, 1.81 in f16), its first CHECK_BYTES of output against the first
   * candidate's. One that rounds the product before it adds c (an H200's tuned chunk GEMM gave
   * bf16(bf16(a @ b) + c): 2.4% of the elements a unit off) differs in a few per cent of the
   * elements; another summation order in a few per hundred thousand. Over 1/256: not chosen. */
  const size_t check = t->out_bytes < CHECK_BYTES ? t->out_bytes : CHECK_BYTES;
  const int es = t->out_dt == DL_F32 ? 4 : 2;
  const int64_t elems = (int64_t)(check / (size_t)es);
  void *cbuf = NULL, *ref = NULL, *got = NULL;
  const float one = 1.f;
  if (rc == DL_OK && (cudaMallocAsync(&cbuf, t->out_bytes, st) != cudaSuccess ||
                      cudaMemsetAsync(cbuf, 0x3f, t->out_bytes, st) != cudaSuccess))
    rc = DL_ERR(DL_ECUDA, "gemm tuning: the check's c (%zu bytes): %s", t->out_bytes,
                cudaGetErrorString(cudaGetLastError()));
  if (rc == DL_OK && (!(ref = malloc(check)) || !(got = malloc(check))))
    rc = DL_ERR(DL_ENOMEM, "gemm tuning: %zu bytes of host memory for the check", 2 * check);
  for (int i = 0; i < n && rc == DL_OK; i++) {
    float ms[TUNE_RUNS];
    int ok = matmul(h, e->desc, &alpha, t->x, e->la, t->y, e->lb, &one, cbuf, e->ld, out, e->ld,
                       &cand[i], ws, (size_t)ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaMemcpyAsync(i ? got : ref, out, check, cudaMemcpyDeviceToHost, st) == cudaSuccess;
    ok = ok && cudaStreamSynchronize(st) == cudaSuccess;
    if (!ok && i == 0) {
      (void)cudaGetLastError();
      break; /* no reference to check against: the first candidate, untimed */
    }
    if (ok && i > 0) ok = tune_differ(got, ref, elems, t->out_dt) * 256 <= elems;
    ok = ok && matmul(h, e->desc, &alpha, t->x, e->la, t->y, e->lb, &beta, out, e->ld, out, e->ld,
                       &cand[i], ws, (size_t)ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cudaEventRecord(ev[0], st) == cudaSuccess;
    for (int r = 0; ok && r < TUNE_RUNS; r++) {
      ok = matmul(h, e->desc, &alpha, t->x, e->la, t->y, e->lb, &beta, out, e->ld, out, e->ld,
                     &cand[i], ws, (size_t)ws_bytes, st) == CUBLAS_STATUS_SUCCESS;
      ok = ok && cudaEventRecord(ev[r + 1], st) == cudaSuccess;
    }
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
    if (best_ms < 0 || ms[TUNE_RUNS / 2] < best_ms) best_ms = ms[TUNE_RUNS / 2], *best = i;
  }
  free(ref);
  free(got);
  if (cbuf) cudaFreeAsync(cbuf, st);
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
