/*
 * signal_pad.h — the signal pad of a symmetric buffer and the flag protocol that
 * kernels of different ranks synchronise with (kernels/common/signal.cu,
 * kernels/common/cpu/signal.c, and any kernel that includes this file).
 *
 * Every value in a pad is a counter that only grows (modulo 2^32), and a
 * wait is "until the counter reaches v", compared as a signed difference.
 * So no one ever resets a flag, and a fast rank that already moved on to the
 * next round (and wrote v+1) still satisfies a slow rank waiting for v:
 * back-to-back calls cannot race. This is the idea behind vLLM's custom
 * all-reduce counters (a per-block count that every barrier increments,
 * written into the peers' slots), here with ">=" instead of "==", which
 * also makes one slot per (block, rank) enough for any sequence of barriers.
 *
 * Barrier of block b among n ranks: this block's count e = epoch[b] + 1; the
 * thread t < n writes e into slot barrier[b][rank] of rank t's pad (release,
 * system scope), then waits until barrier[b][t] of its own pad reaches e
 * (acquire); then epoch[b] = e. Writes before the barrier on any rank are
 * visible after it on every rank.
 *
 * Waits end after a timeout (the GPU's globaltimer), or once the peers'
 * word `gone` is set: 1 + the rank of a member whose process died, written
 * by the host's watchdog (core/comm/peers.c) into pinned host memory that
 * the device reads (NULL: none). The waiter records {kind, index, expected,
 * seen} in its own pad's error[] (index: the flag, the peer waited for, or
 * the dead rank) and returns false; the host turns that record into an
 * error (dl_symm_check).
 */
#ifndef DISTLAB_SIGNAL_PAD_H
#define DISTLAB_SIGNAL_PAD_H

#include <stdint.h>

#include "base.h"

enum { DL_SIGNAL_ERR_FLAG = 1, DL_SIGNAL_ERR_BARRIER = 2, DL_SIGNAL_ERR_DEAD = 3 };

typedef struct dl_signal_pad {
  uint32_t flags[DL_SIGNAL_FLAGS];
  uint32_t barrier[DL_SIGNAL_MAX_BLOCKS][DL_SIGNAL_MAX_RANKS]; /* [block][from rank] */
  uint32_t epoch[DL_SIGNAL_MAX_BLOCKS];                        /* this rank's counts */
  uint32_t error[4]; /* kind, flag or peer, expected, seen; kind 0: none */
} dl_signal_pad_t;

typedef struct dl_signal_peers {
  dl_signal_pad_t *pads[DL_SIGNAL_MAX_RANKS]; /* every rank's pad, as mapped here */
} dl_signal_peers_t;

#ifdef __cplusplus
extern "C" {
#endif
/* Launchers (kernels/common/signal.cu): one tiny kernel each on `stream`. */
int dl_signal_set_cuda(dl_signal_pad_t *pad, int flag, uint32_t value, void *stream);
int dl_signal_wait_cuda(dl_signal_pad_t *self, int flag, uint32_t value, double timeout_s,
                        const uint32_t *gone, void *stream);
int dl_signal_barrier_cuda(dl_signal_peers_t peers, int rank, int nranks, double timeout_s,
                           const uint32_t *gone, void *stream);
/* CPU twins (kernels/common/cpu/signal.c): same protocol on host memory; a
 * failed wait is also returned as DL_ETIMEOUT or DL_EPEER with a message
 * naming the flag or the peer. */
int dl_signal_set_cpu(dl_signal_pad_t *pad, int flag, uint32_t value, void *stream);
int dl_signal_wait_cpu(dl_signal_pad_t *self, int flag, uint32_t value, double timeout_s,
                       const uint32_t *gone, void *stream);
int dl_signal_barrier_cpu(dl_signal_peers_t peers, int rank, int nranks, double timeout_s,
                          const uint32_t *gone, void *stream);
#ifdef __cplusplus
}
#endif

/* a has reached b, counting modulo 2^32 */
#define DL_SIGNAL_REACHED(a, b) ((int32_t)((uint32_t)(a) - (uint32_t)(b)) >= 0)

#ifdef __CUDACC__
/* ---- device side, for any kernel ------------------------------------------ */

__device__ __forceinline__ void dl_signal_store_release(uint32_t *p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t dl_signal_load_acquire(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t dl_signal_clock_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Record the first failure in the pad; later ones keep the first. */
__device__ __forceinline__ void dl_signal_fail(dl_signal_pad_t *self, uint32_t kind,
                                               uint32_t index, uint32_t expected,
                                               uint32_t seen) {
  if (atomicCAS(&self->error[0], 0u, kind) == 0u) {
    self->error[1] = index;
    self->error[2] = expected;
    self->error[3] = seen;
    __threadfence_system();
  }
}

/* One thread waits until *p reaches v: true once it does; false after
 * timeout_ns (*dead = 0) or once *gone is set (*dead = its value: 1 + the
 * dead rank). gone is host memory: read only once the wait has lasted
 * 100 us, every 64 polls. */
__device__ __forceinline__ bool dl_signal_wait_until(const uint32_t *p, uint32_t v,
                                                     uint64_t timeout_ns, const uint32_t *gone,
                                                     uint32_t *seen, uint32_t *dead) {
  uint64_t t0 = dl_signal_clock_ns();
  uint32_t x;
  int spins = 0;
  *dead = 0;
  while (!DL_SIGNAL_REACHED(x = dl_signal_load_acquire(p), v)) {
    if (++spins % 64) continue;
    const uint64_t waited = dl_signal_clock_ns() - t0;
    if ((gone && waited > 100000 && (*dead = *(const volatile uint32_t *)gone) != 0u) ||
        waited > timeout_ns) {
      *seen = x;
      return false;
    }
  }
  return true;
}

/* The whole block meets the same block of every rank; false (in every
 * thread) when a peer did not come within timeout_ns or died. */
__device__ __forceinline__ bool dl_signal_barrier_block(const dl_signal_peers_t &peers, int rank,
                                                        int nranks, uint64_t timeout_ns,
                                                        const uint32_t *gone) {
  dl_signal_pad_t *self = peers.pads[rank];
  __syncthreads();
  uint32_t e = self->epoch[blockIdx.x] + 1;
  bool ok = true;
  if (threadIdx.x < (unsigned)nranks) {
    __threadfence_system();
    dl_signal_store_release(&peers.pads[threadIdx.x]->barrier[blockIdx.x][rank], e);
    uint32_t seen = 0, dead = 0;
    ok = dl_signal_wait_until(&self->barrier[blockIdx.x][threadIdx.x], e, timeout_ns, gone, &seen,
                              &dead);
    if (!ok && dead) dl_signal_fail(self, DL_SIGNAL_ERR_DEAD, dead - 1, e, seen);
    else if (!ok) dl_signal_fail(self, DL_SIGNAL_ERR_BARRIER, threadIdx.x, e, seen);
  }
  ok = __syncthreads_and(ok);
  if (threadIdx.x == 0 && ok) self->epoch[blockIdx.x] = e;
  return ok;
}
#endif

#endif
