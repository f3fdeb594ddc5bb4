/*
 * cuda_emu.h — the expert-parallel kernels' part of the CPU emulation
 * (kernels/ep/ep_dispatch.cu, ep_combine.cu on ../thread_core.h, OS threads
 * as CUDA threads): their shared memory through the block's arena, the
 * Lamport slots' poll. Force-included by the Makefile.
 */
#ifndef DISTLAB_EMU_EP_CUDA_EMU_H
#define DISTLAB_EMU_EP_CUDA_EMU_H

#include <math.h>

#include "../thread_core.h"

#define DL_EP_EMU 1

static inline int min(int a, int b) { return a < b ? a : b; }

#define EP_SMEM(name) int *name = reinterpret_cast<int *>(emu_this_block->dynamic.data())
#define EP_SHARED(type, name) type &name = emu_shared<type>()

/* ---- Lamport slots (kernels/ep/ep_device.cuh) -------------------------------------- */

static inline uint4 ep_ld_vec_volatile(const uint4 *p) { return emu_ld_words(reinterpret_cast<const uint32_t *>(p)); }
#define EP_POLL_YIELD() std::this_thread::yield()
#define EP_POLL_NAP(spins) \
  do {                     \
  } while (0)

#endif
