/*
 * gemm_lt.h — what core/ops/gemm/gemm.c asks of the cuBLASLt side
 * (core/ops/gemm/cublaslt.c): run one GEMM on a CUDA device, its counters,
 * and its mapping of a row-major GEMM onto column-major cuBLAS, which the
 * grouped GEMM's cuBLAS path (core/ops/gemm/cublas.c) shares.
 */
#ifndef DISTLAB_GEMM_LT_H
#define DISTLAB_GEMM_LT_H

#include "base/internal.h"
#include "gemm/gemm.h"

/* g on cuda:dev, ordered on stream (a cudaStream_t); workspace: ws_bytes of
 * device memory, the algorithm must fit in it. c in place with a 16-bit d and
 * beta != 0 runs on a copy of c, allocated on stream under "gemm_c_copy"
 * (dl_gemm_c_copy_bytes). */
int dl_gemm_lt_run(const dl_gemm_args_t *g, int dev, void *workspace, int64_t ws_bytes,
                   void *stream);
void dl_gemm_lt_stats(dl_gemm_stats_t *out);

/* g as cuBLAS takes it, column-major: d' = op(x) op(y) (rows x cols, depth
 * k; op 0 = N, 1 = T, cuBLAS's values), leading dimensions ldx, ldy, ldd.
 * d' is d^T when d is row-major. Fails (naming the matrix) on strides that
 * cuBLAS cannot take, or when c and d are laid out differently. */
typedef struct dl_gemm_cm {
  const void *x, *y;
  void *d;
  int opx, opy;
  int64_t rows, cols, k;
  int64_t ldx, ldy, ldd;
} dl_gemm_cm_t;
int dl_gemm_lt_map(const dl_gemm_args_t *g, dl_gemm_cm_t *cm);

/* The folder of the libcudart this library runs with ("" when unknown):
 * where CUDA installs libcublasLt and libcublas, which our RUNPATH does not
 * give dlopen. */
void dl_gemm_cudart_dir(char *buf, size_t len);

#endif
