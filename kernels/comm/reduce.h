/*
 * reduce.h — the reduction of n buffers that communicators use: the CUDA
 * kernel (kernels/comm/reduce.cu) and its CPU twin (kernels/comm/cpu/reduce.c),
 * same arguments.
 */
#ifndef DISTLAB_KERNELS_COMM_REDUCE_H
#define DISTLAB_KERNELS_COMM_REDUCE_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Communicators that reduce on the device take at most this many sources. */
enum { DL_REDUCE_MAX_SRCS = DL_SIGNAL_MAX_RANKS };

/* dst[i] = src[0][i] (red) src[1][i] ... (red) src[n-1][i] for i < k, in that
 * order; red is DL_RED_*, avg divides by n (integer division for integers).
 * Integers wrap; bf16 and fp16 are summed in fp32 and rounded once (to
 * nearest even). dst may be one of the sources. stream: cudaStream_t for
 * the kernel (n <= DL_REDUCE_MAX_SRCS there), ignored by the twin. */
int dl_reduce_cpu(void *dst, char *const *src, int n, int64_t k, int dtype, int red, void *stream);
int dl_reduce_cuda(void *dst, char *const *src, int n, int64_t k, int dtype, int red,
                   void *stream);

#ifdef __cplusplus
}
#endif
#endif
