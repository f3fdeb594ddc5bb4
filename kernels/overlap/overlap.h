/*
 * overlap.h — the SM copy of the overlap schedules' "copy = sm" transport: a
 * kernel on the GPU (kernels/overlap/overlap_copy.cu) and its CPU twin
 * (kernels/overlap/cpu/overlap_copy.c), same arguments.
 */
#ifndef DISTLAB_KERNELS_OVERLAP_H
#define DISTLAB_KERNELS_OVERLAP_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bytes from src to dst (either may be a peer's mapped buffer); blocks > 0
 * blocks on the GPU, ignored by the twin; stream: cudaStream_t. */
int dl_overlap_copy_cuda(void *dst, const void *src, int64_t bytes, int blocks, void *stream);
int dl_overlap_copy_cpu(void *dst, const void *src, int64_t bytes, int blocks, void *stream);

#ifdef __cplusplus
}
#endif
#endif
