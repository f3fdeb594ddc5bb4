/*
 * gemm.c — CPU twin of dl.gemm (cuBLASLt on cuda): d = alpha * a @ b + beta * c
 * with the products summed in fp64 and d rounded at the end (through fp32,
 * as dl_store_f64 does: far below bf16/f16 resolution), for any element
 * strides and the dtypes the core admits (bf16/f16 inputs; bf16, f16 or f32
 * results; f64 works too), and a batch of them (the grouped GEMM's experts
 * of one shape) one after the other.
 *
 * Blocked so that the specs can afford real shapes: d is done in tiles of
 * MB x NB held in fp64; for each KB-deep slice the tile's rows of a and the
 * slice of b are converted to fp64 once into contiguous panels, and the
 * inner loop (i, l, j) runs over contiguous rows that the compiler
 * vectorises. Checked against a plain fp64 triple loop in Lua
 * (spec/gemm_spec.lua).
 */
#include <stdlib.h>

#include "gemm/gemm.h"
#include "common/dtype.h"

enum { MB = 64, NB = 256, KB = 256 };

static double at(const dl_gemm_mat_t *x, int64_t i, int64_t j) {
  return dl_load_f64(x->data, i * x->rs + j * x->cs, x->dtype);
}

static int one(const dl_gemm_args_t *g);

int dl_gemm_cpu(const dl_gemm_args_t *g, void *stream) {
  (void)stream;
  for (int64_t i = 0; i < (g->batch > 1 ? g->batch : 1); i++) {
    dl_gemm_args_t x = *g;
    dl_gemm_mat_t *mats[4] = {&x.a, &x.b, &x.c, &x.d};
    const int64_t strides[4] = {g->sa, g->sb, g->sc, g->sd};
    for (int j = 0; j < 4 && i > 0; j++)
      mats[j]->data = (char *)mats[j]->data + i * strides[j] * dl_dtype_size(mats[j]->dtype);
    DL_TRY(one(&x));
  }
  return DL_OK;
}

static int one(const dl_gemm_args_t *g) {
  if (g->m == 0 || g->n == 0) return DL_OK;
  double *acc = malloc(sizeof(double) * MB * NB);
  double *ap = malloc(sizeof(double) * MB * KB);
  double *bp = malloc(sizeof(double) * KB * NB);
  if (!acc || !ap || !bp) {
    free(acc);
    free(ap);
    free(bp);
    return DL_ERR(DL_ENOMEM, "gemm (cpu): out of host memory for the panels");
  }
  for (int64_t i0 = 0; i0 < g->m; i0 += MB) {
    const int64_t mb = g->m - i0 < MB ? g->m - i0 : MB;
    for (int64_t j0 = 0; j0 < g->n; j0 += NB) {
      const int64_t nb = g->n - j0 < NB ? g->n - j0 : NB;
      for (int64_t x = 0; x < mb * nb; x++) acc[x] = 0;
      for (int64_t l0 = 0; l0 < g->k; l0 += KB) {
        const int64_t kb = g->k - l0 < KB ? g->k - l0 : KB;
        for (int64_t i = 0; i < mb; i++)
          for (int64_t l = 0; l < kb; l++) ap[i * kb + l] = at(&g->a, i0 + i, l0 + l);
        for (int64_t l = 0; l < kb; l++)
          for (int64_t j = 0; j < nb; j++) bp[l * nb + j] = at(&g->b, l0 + l, j0 + j);
        for (int64_t i = 0; i < mb; i++) {
          double *row = acc + i * nb;
          for (int64_t l = 0; l < kb; l++) {
            const double x = ap[i * kb + l];
            const double *br = bp + l * nb;
            for (int64_t j = 0; j < nb; j++) row[j] += x * br[j];
          }
        }
      }
      for (int64_t i = 0; i < mb; i++)
        for (int64_t j = 0; j < nb; j++) {
          double v = g->alpha * acc[i * nb + j];
          if (g->beta != 0) v += g->beta * at(&g->c, i0 + i, j0 + j);
          dl_store_f64(g->d.data, (i0 + i) * g->d.rs + (j0 + j) * g->d.cs, g->d.dtype, v);
        }
    }
  }
  free(acc);
  free(ap);
  free(bp);
  return DL_OK;
}
