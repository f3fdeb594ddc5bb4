/*
 * gemm_grouped.c — CPU twin of dl.gemm.grouped (cuBLAS's grouped GEMM or a
 * cuBLASLt GEMM per expert on cuda): each group's GEMM (or batch of them:
 * experts of one shape) in turn through dl_gemm_cpu, so products are summed
 * in fp64 and every output rounded once.
 * A group with k = 0 (an expert that got no rows, in the weight gradient)
 * writes alpha * 0 + beta * c: zeros, or c unchanged when accumulating.
 * Checked against a plain fp64 loop in Lua (spec/gemm_grouped_spec.lua).
 */
#include "gemm/gemm.h"

int dl_gemm_grouped_cpu(const dl_gemm_args_t *g, int64_t groups, void *stream) {
  for (int64_t i = 0; i < groups; i++) DL_TRY(dl_gemm_cpu(&g[i], stream));
  return DL_OK;
}
