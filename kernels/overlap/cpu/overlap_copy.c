/*
 * overlap_copy.c — CPU twin of kernels/overlap/overlap_copy.cu: the bytes
 * move with memcpy (on cpu a peer's buffer is shared memory mapped here).
 */
#include <string.h>

#include "overlap/overlap.h"

int dl_overlap_copy_cpu(void *dst, const void *src, int64_t bytes, int blocks, void *stream) {
  (void)blocks, (void)stream;
  if (bytes > 0) memcpy(dst, src, (size_t)bytes);
  return DL_OK;
}
