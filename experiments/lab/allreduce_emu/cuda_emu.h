/*
 * cuda_emu.h — just enough CUDA to run the all-reduce kernels (the .cu files
 * of kernels/allreduce/) on a CPU: every CUDA thread is an OS thread,
 * __syncthreads a real barrier of its block, the signal-pad device functions
 * (kernels/common/signal_pad.h, device side) atomics with the same
 * acquire/release pairs. Force-included by the Makefile; a launch
 * (kernels/common/launch.cuh, compiled without nvcc) calls
 * `emu_launch(k, g, b, smem, s)(args)`, which blocks until the grid is done
 * (one stream per rank).
 *
 * What it checks: indexing, tails, rounds, slices, the flag and double-buffer
 * protocol under real concurrency (blocks of all ranks run at once), the
 * timeout path. What it cannot: the GPU's weaker memory ordering (x86 is
 * TSO), NVLink, performance.
 */
#ifndef ALLREDUCE_CUDA_EMU_H
#define ALLREDUCE_CUDA_EMU_H

#include <stdint.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
/* a block's __shared__ word: one per emulated thread here (allreduce_device.cuh
 * keeps only a clock in one, so a copy per thread changes how often, not what) */
#define __shared__ static thread_local
#define __host__
#define __forceinline__ inline
/* inline: a __noinline__ helper of allreduce_device.cuh is defined in every
 * kernel file, which the linker must accept once (nvcc keeps one per file) */
#define __noinline__ __attribute__((noinline)) inline
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
  uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  return uint4{x, y, z, w};
}
typedef void *cudaStream_t;

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---- blocks ----------------------------------------------------------------- */

struct emu_sync {
  std::mutex m;
  std::condition_variable cv;
  int count = 0;
  unsigned gen = 0;
  bool acc = true, result = true;
  bool arrive(int n, bool v) {
    std::unique_lock<std::mutex> lk(m);
    acc = acc && v;
    if (++count == n) {
      result = acc;
      acc = true;
      count = 0;
      gen++;
      cv.notify_all();
      return result;
    }
    unsigned g = gen;
    cv.wait(lk, [&] { return gen != g; });
    return result;
  }
};

struct emu_block {
  emu_sync named[16]; /* bar.sync 1..15 with a thread count */
  emu_sync all;       /* __syncthreads: every thread of the block */
  int n = 0;
  bool sync_and(bool v) { return all.arrive(n, v); }
};
inline thread_local emu_block *emu_this_block;

static inline void __syncthreads() { emu_this_block->sync_and(true); }
#define DL_AR_EMU_NAMED_SYNC
#define DL_AR_EMU 1 /* kernels/allreduce/*.cuh: this file brings the polls and waits they would define */
static inline bool named_sync_and(int id, int n, bool pred) { return emu_this_block->named[id].arrive(n, pred); }
static inline bool __syncthreads_and(bool v) { return emu_this_block->sync_and(v); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline uint32_t atomicCAS(uint32_t *p, uint32_t cmp, uint32_t val) {
  __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

/* ---- the signal-pad device side (kernels/common/signal_pad.h under __CUDACC__) ----- */

static inline void dl_signal_store_release(uint32_t *p, uint32_t v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint32_t dl_signal_load_acquire(const uint32_t *p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t dl_signal_clock_ns(void) {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
/* kernels/allreduce/lamport.cuh's poll: each word loaded atomically (what a
 * GPU guarantees at least), and a yield so that spinning threads let the
 * writers run */
static inline uint4 ld_volatile_vec(const char *base, int64_t v) {
  const uint32_t *p = reinterpret_cast<const uint32_t *>(base) + 4 * v;
  return uint4{__atomic_load_n(p, __ATOMIC_RELAXED), __atomic_load_n(p + 1, __ATOMIC_RELAXED),
               __atomic_load_n(p + 2, __ATOMIC_RELAXED), __atomic_load_n(p + 3, __ATOMIC_RELAXED)};
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
/* ---- launches ------------------------------------------------------------------ */

template <typename Kernel> struct emu_launcher {
  Kernel k;
  unsigned grid, block;
  template <typename... Args> void operator()(Args... args) {
    std::vector<emu_block> blocks(grid);
    std::vector<std::thread> threads;
    for (unsigned b = 0; b < grid; b++) {
      blocks[b].n = (int)block;
      for (unsigned t = 0; t < block; t++) {
        threads.emplace_back([=, &blocks] {
          threadIdx = dim3(t);
          blockIdx = dim3(b);
          blockDim = dim3(block);
          gridDim = dim3(grid);
          emu_this_block = &blocks[b];
          k(args...);
        });
      }
    }
    for (auto &th : threads) th.join();
  }
};

template <typename Kernel>
emu_launcher<Kernel> emu_launch(Kernel k, int grid, int block, int shmem, cudaStream_t) {
  (void)shmem;
  return emu_launcher<Kernel>{k, (unsigned)grid, (unsigned)block};
}

#endif
