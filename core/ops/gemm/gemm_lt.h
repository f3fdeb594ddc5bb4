/*
 * gemm_lt.h — what core/ops/gemm/gemm.c asks of the cuBLASLt side
 * (core/ops/gemm/cublaslt.c): run one GEMM on a CUDA device, and its counters.
 */
#ifndef DISTLAB_GEMM_LT_H
#define DISTLAB_GEMM_LT_H

#include "base/internal.h"
#include "gemm/gemm.h"

/* g on cuda:dev, ordered on stream (a cudaStream_t); workspace: ws_bytes of
 * device memory, the algorithm must fit in it. */
int dl_gemm_lt_run(const dl_gemm_args_t *g, int dev, void *workspace, int64_t ws_bytes,
                   void *stream);
void dl_gemm_lt_stats(dl_gemm_stats_t *out);

#endif
