/*
 * cuda_emu.h — the all-reduce kernels' part of the CPU emulation (the .cu
 * files of kernels/allreduce/ on ../thread_core.h, OS threads as CUDA
 * threads): their __shared__ word, the named barriers, the Lamport polls.
 * Force-included by the Makefile.
 */
#ifndef DISTLAB_EMU_ALLREDUCE_CUDA_EMU_H
#define DISTLAB_EMU_ALLREDUCE_CUDA_EMU_H

#include "../thread_core.h"

/* a block's __shared__ word: one per emulated thread here (allreduce_device.cuh
 * keeps only a clock in one, so a copy per thread changes how often, not what) */
#define __shared__ static thread_local

#define DL_AR_EMU_NAMED_SYNC
#define DL_AR_EMU 1 /* kernels/allreduce/*.cuh: this file brings the polls and waits they would define */
static inline bool named_sync_and(int id, int n, bool pred) { return emu_this_block->named[id].arrive(n, pred); }

/* kernels/allreduce/lamport.cuh's poll: each word loaded atomically, and a
 * yield so that spinning threads let the writers run */
static inline uint4 ld_volatile_vec(const char *base, int64_t v) {
  return emu_ld_words(reinterpret_cast<const uint32_t *>(base) + 4 * v);
}
/* its tagged vectors: two 64-bit words, each loaded and stored whole, as on a GPU */
static inline uint4 ld_volatile_tagged(const char *base, int64_t v) {
  const uint64_t *p = reinterpret_cast<const uint64_t *>(base) + 2 * v;
  const uint64_t w0 = __atomic_load_n(p, __ATOMIC_RELAXED), w1 = __atomic_load_n(p + 1, __ATOMIC_RELAXED);
  return uint4{(uint32_t)w0, (uint32_t)(w0 >> 32), (uint32_t)w1, (uint32_t)(w1 >> 32)};
}
static inline void st_tagged(char *base, int64_t v, uint32_t d0, uint32_t d1, uint32_t t0, uint32_t t1) {
  uint64_t *p = reinterpret_cast<uint64_t *>(base) + 2 * v;
  __atomic_store_n(p, (uint64_t)t0 << 32 | d0, __ATOMIC_RELAXED);
  __atomic_store_n(p + 1, (uint64_t)t1 << 32 | d1, __ATOMIC_RELAXED);
}
#define DL_AR_POLL_PAUSE(spins, ns) std::this_thread::yield()

#endif
