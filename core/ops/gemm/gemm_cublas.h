/*
 * gemm_cublas.h — what core/ops/gemm/grouped.c asks of the cuBLAS side
 * (core/ops/gemm/cublas.c): the groups' GEMMs in one
 * cublasGemmGroupedBatchedEx, and its counters.
 */
#ifndef DISTLAB_GEMM_CUBLAS_H
#define DISTLAB_GEMM_CUBLAS_H

#include "base/internal.h"
#include "gemm/gemm.h"

/* g[0..n) (every group k > 0, one dtype pair, c = d or beta = 0) on cuda:dev,
 * ordered on stream; ptrs: device memory for 3n pointers; ws: ws_bytes of
 * device memory for cuBLAS's workspace. DL_EUNSUPPORTED (with the message)
 * where cuBLAS lacks the dtype combination or the library cannot be loaded. */
int dl_gemm_cublas_grouped(const dl_gemm_args_t *g, int64_t n, int dev, void **ptrs, void *ws,
                           int64_t ws_bytes, void *stream);
void dl_gemm_cublas_stats(dl_gemm_stats_t *out);

#endif
