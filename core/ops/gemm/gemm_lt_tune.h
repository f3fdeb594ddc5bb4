/*
 * gemm_lt_tune.h — cuBLASLt's opt-in tuning (core/ops/gemm/cublaslt_tune.c),
 * which core/ops/gemm/cublaslt.c asks at a configuration's first call when
 * DISTLAB_GEMM_TUNE is set, and for a strided batch unless it is 0 or 1.
 */
#ifndef DISTLAB_GEMM_LT_TUNE_H
#define DISTLAB_GEMM_LT_TUNE_H

#include "base/internal.h"

enum {
  DL_LT_TUNE_MAX = 8,     /* candidates asked of the heuristic, at most */
  DL_LT_TUNE_BATCHED = 8, /* timed for a strided batch when DISTLAB_GEMM_TUNE is unset */
};

/* DISTLAB_GEMM_TUNE: how many candidates to time (0: no tuning) for a GEMM, a strided batch
 * of them when batched (unset: DL_LT_TUNE_BATCHED); an error names a bad value. */
int dl_lt_tune_count(int batched, int *out);

#ifdef DL_WITH_CUDA
#include <cublasLt.h>

/* What a tuning run needs of the call: its operands' data, its alpha, beta and
 * c (in place: c is d), its output dtype and the bytes of its output (as
 * cuBLASLt lays it out: ld x lcols of out_dt). */
typedef struct dl_lt_tune_args {
  const void *x, *y, *c;
  float alpha, beta;
  int in_place, out_dt;
  size_t out_bytes;
  void *stream;
} dl_lt_tune_args_t;

typedef cublasStatus_t (*dl_lt_matmul_fn)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *,
                                          const void *, cublasLtMatrixLayout_t, const void *,
                                          cublasLtMatrixLayout_t, const void *, const void *,
                                          cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                          const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t);

/* The fastest of cand[0..n) on t's operands whose output agrees with cand[0]'s
 * (see cublaslt_tune.c): *best its index. mm: cublasLtMatmul as loaded. */
int dl_lt_tune_pick(dl_lt_matmul_fn mm, cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                    cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                    cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *cand, int n,
                    const dl_lt_tune_args_t *t, int64_t ws_bytes, int *best);
#endif

#endif
