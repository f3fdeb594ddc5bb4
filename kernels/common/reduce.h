/* reduce.h — the host reduction of n buffers (kernels/common/cpu/reduce.c). */
#ifndef DISTLAB_KERNELS_REDUCE_H
#define DISTLAB_KERNELS_REDUCE_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i] = src[0][i] (red) ... (red) src[n-1][i] for i < k, in that order;
 * red is DL_RED_*, avg divides the sum by n. acc: k floats of scratch, used
 * for bf16 and fp16 (summed in fp32, rounded once). dst may be a src. */
void dl_reduce_cpu(void *dst, char *const *src, int n, int64_t k, int dtype, int red, float *acc);

#ifdef __cplusplus
}
#endif
#endif
