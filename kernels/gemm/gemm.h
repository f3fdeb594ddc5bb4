/*
 * gemm.h — the arguments of one GEMM, d = alpha * a @ b + beta * c, as the
 * core (core/ops/gemm/) hands them to cuBLASLt (core/ops/gemm/cublaslt.c)
 * and to the CPU twin (kernels/gemm/cpu/gemm.c). Matrices are raw pointers
 * with element strides, so transposed views need no copy.
 */
#ifndef DISTLAB_KERNELS_GEMM_H
#define DISTLAB_KERNELS_GEMM_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element (i, j) at data + (i * rs + j * cs) * dtype size. */
typedef struct dl_gemm_mat {
  void *data;
  int64_t rs, cs;
  int dtype;
} dl_gemm_mat_t;

typedef struct dl_gemm_args {
  int64_t m, n, k;
  dl_gemm_mat_t a, b; /* a [m, k], b [k, n] */
  dl_gemm_mat_t c, d; /* c [m, n] the addend (read only when beta != 0), d [m, n] the result */
  double alpha, beta;
  /* batch > 1: as many GEMMs, GEMM i's matrices i * sa, sb, sc, sd elements
   * (>= 0) after the first's (the grouped GEMM's experts of one shape);
   * 0 or 1: one GEMM */
  int64_t batch, sa, sb, sc, sd;
} dl_gemm_args_t;

/* The reference: products summed in fp64, d = alpha * sum + beta * c
 * rounded at the end, each GEMM of a batch in turn. Blocked (64 x 256 tiles of d, 256-deep
 * panels converted to fp64 once), so specs can afford shapes of a few
 * hundred. stream is ignored. */
int dl_gemm_cpu(const dl_gemm_args_t *g, void *stream);

/* The grouped GEMM's twin: g[0..groups) one after the other, each as
 * dl_gemm_cpu (fp64 sums); a group with k = 0 writes beta * c (0). */
int dl_gemm_grouped_cpu(const dl_gemm_args_t *g, int64_t groups, void *stream);

/* cuda: dst[i] = src[i] for i < n, src a host array of device pointers
 * (kernels/gemm/gemm_grouped.cu): the pointer arrays of cuBLAS's grouped
 * GEMM written by kernels whose arguments carry them, so that the call is
 * ordered on stream and a graph capture records it. */
int dl_gemm_pointers_cuda(void **dst, void *const *src, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
