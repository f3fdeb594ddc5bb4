/*
 * gemm_lt_tune.h — DISTLAB_GEMM_TUNE's timing of cuBLASLt's candidates
 * (cublaslt_tune.c), for the algorithm cache of cublaslt.c, which describes
 * the tuning and holds the loaded library.
 */
#ifndef DISTLAB_GEMM_LT_TUNE_H
#define DISTLAB_GEMM_LT_TUNE_H

#ifdef DL_WITH_CUDA
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>

typedef cublasStatus_t (*dl_gemm_lt_matmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *,
                                               const void *, cublasLtMatrixLayout_t, const void *,
                                               cublasLtMatrixLayout_t, const void *, const void *,
                                               cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                               const cublasLtMatmulAlgo_t *, void *, size_t,
                                               cudaStream_t);

/* The configuration tuned: cuBLASLt's cublasLtMatmul as loaded, a handle, the descriptors. */
typedef struct dl_gemm_lt_tuned {
  dl_gemm_lt_matmul_fn matmul;
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
} dl_gemm_lt_tuned_t;

/* What a tuning run needs of the call: its operands' data, the bytes of its output (as
 * cuBLASLt lays it out: ld x lcols of out_dt), its stream. */
typedef struct dl_gemm_lt_tune_args {
  const void *x, *y;
  size_t out_bytes;
  void *stream;
  int out_dt;
} dl_gemm_lt_tune_args_t;

/* The fastest of cand[0..n) that passes the check (cublaslt_tune.c); *best its index (0 where
 * none could be timed). */
int dl_gemm_lt_tune(const dl_gemm_lt_tuned_t *e, const cublasLtMatmulAlgo_t *cand, int n,
                    const dl_gemm_lt_tune_args_t *t, int64_t ws_bytes, int *best);
#endif

#endif
