/*
 * thread_core.h — just enough CUDA to run kernel files of kernels/ on a CPU,
 * every CUDA thread an OS thread: dim3 and the vector types; a block's
 * barriers (__syncthreads, __syncthreads_and; bar.sync with a thread count
 * for the family's named barriers); the warp intrinsics (__shfl_sync,
 * __shfl_xor_sync, __shfl_up_sync, __ballot_sync, __match_any_sync,
 * __syncwarp) as an exchange through a barrier of the warp's 32 threads;
 * shared memory as a per-block arena (dynamic, and emu_shared for a kernel's
 * __shared__ variables); atomics and fences; the signal-pad device functions
 * (kernels/common/signal_pad.h) as atomics with the same acquire/release
 * pairs; emu_launch, which a kernel file's launch (kernels/common/launch.cuh,
 * compiled without nvcc) calls, and which returns once its grid is done (one
 * stream per rank).
 *
 * A family's part (allreduce/cuda_emu.h, ep/cuda_emu.h) includes this and
 * adds what its kernels need; the family's Makefile (with thread_core.mk)
 * force-includes that part, each kernel file compiled on its own as nvcc
 * compiles it.
 *
 * What it checks: indexing, tails, routing, the flag, epoch and
 * double-buffer protocols under real concurrency (all blocks of all ranks at
 * once), the timeout paths. What it cannot: the GPU's weaker memory ordering
 * (x86 is TSO), NVLink, performance.
 */
#ifndef DISTLAB_EMU_THREAD_CORE_H
#define DISTLAB_EMU_THREAD_CORE_H

#include <stdint.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* inline: a __noinline__ helper of a kernel header is defined in every
 * kernel file that includes it, which the linker must accept once (nvcc
 * keeps one per file) */
#define __noinline__ __attribute__((noinline)) inline
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
  uint32_t x, y, z, w;
};
struct uint2 {
  uint32_t x, y;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
static inline uint2 make_uint2(uint32_t x, uint32_t y) { return uint2{x, y}; }
typedef void *cudaStream_t;

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline int __popc(uint32_t x) { return __builtin_popcount(x); }
static inline int __ffs(uint32_t x) { return __builtin_ffs((int)x); }

/* ---- blocks and warps --------------------------------------------------------- */

/* A barrier of n threads that also ANDs their predicates. */
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

struct emu_warp {
  emu_sync sync;
  uint64_t vals[32];
};

struct emu_block {
  emu_sync all;       /* __syncthreads: every thread of the block */
  emu_sync named[16]; /* bar.sync 1..15 with a thread count */
  std::vector<emu_warp> warps;
  std::vector<int64_t> dynamic; /* extern __shared__, 8-byte aligned */
  std::mutex m;
  std::vector<std::vector<int64_t>> statics; /* __shared__ variables, in declaration order */
  int n = 0;
  bool sync_and(bool v) { return all.arrive(n, v); }
};
inline thread_local emu_block *emu_this_block;
inline thread_local size_t emu_shared_next;

static inline void __syncthreads() { emu_this_block->sync_and(true); }
static inline bool __syncthreads_and(bool v) { return emu_this_block->sync_and(v); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_this_block->warps[threadIdx.x / 32].sync.arrive(32, true); }

/* Every lane publishes v, then reads lane src's. */
template <typename T> static inline T emu_exchange(T v, int src) {
  emu_warp &w = emu_this_block->warps[threadIdx.x / 32];
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  w.vals[threadIdx.x % 32] = bits;
  w.sync.arrive(32, true);
  T r;
  uint64_t got = w.vals[src & 31];
  memcpy(&r, &got, sizeof r);
  w.sync.arrive(32, true);
  return r;
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) { return emu_exchange(v, src); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int m) {
  return emu_exchange(v, (int)(threadIdx.x % 32) ^ m);
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, int d) {
  const int lane = (int)(threadIdx.x % 32);
  T r = emu_exchange(v, lane >= d ? lane - d : lane);
  return r;
}
static inline unsigned __ballot_sync(unsigned, int pred) {
  emu_warp &w = emu_this_block->warps[threadIdx.x / 32];
  w.vals[threadIdx.x % 32] = pred ? 1 : 0;
  w.sync.arrive(32, true);
  unsigned m = 0;
  for (int i = 0; i < 32; i++) m |= (unsigned)(w.vals[i] != 0) << i;
  w.sync.arrive(32, true);
  return m;
}

// The lanes whose v equals this lane's (every lane takes part).
static inline unsigned __match_any_sync(unsigned, int v) {
  emu_warp &w = emu_this_block->warps[threadIdx.x / 32];
  w.vals[threadIdx.x % 32] = (uint64_t)(uint32_t)v;
  w.sync.arrive(32, true);
  unsigned m = 0;
  for (int i = 0; i < 32; i++) m |= (unsigned)(w.vals[i] == (uint64_t)(uint32_t)v) << i;
  w.sync.arrive(32, true);
  return m;
}

/* The block's k-th __shared__ variable of a kernel (k: the order the kernel
 * declares them in), zeroed at the block's start. */
template <typename T> static inline T &emu_shared() {
  emu_block *b = emu_this_block;
  const size_t k = emu_shared_next++;
  std::lock_guard<std::mutex> lk(b->m);
  if (b->statics.size() <= k) b->statics.resize(k + 1);
  if (b->statics[k].empty()) b->statics[k].assign((sizeof(T) + 7) / 8, 0);
  return *reinterpret_cast<T *>(b->statics[k].data());
}

/* ---- atomics and fences ----------------------------------------------------------- */

static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
static inline uint32_t atomicCAS(uint32_t *p, uint32_t cmp, uint32_t val) {
  __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
static inline uint32_t atomicAdd(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long cmp, unsigned long long val) {
  __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

/* A 16-byte vector as memory holds it now: four word loads, each atomic
 * (what a GPU guarantees at least; a writer's words land one by one). */
static inline uint4 emu_ld_words(const uint32_t *p) {
  return uint4{__atomic_load_n(p, __ATOMIC_RELAXED), __atomic_load_n(p + 1, __ATOMIC_RELAXED),
               __atomic_load_n(p + 2, __ATOMIC_RELAXED), __atomic_load_n(p + 3, __ATOMIC_RELAXED)};
}

/* ---- the signal-pad device side (kernels/common/signal_pad.h under __CUDACC__) ----- */

static inline void dl_signal_store_release(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
static inline uint32_t dl_signal_load_acquire(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint64_t dl_signal_clock_ns(void) {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
static inline bool dl_signal_wait_until(const uint32_t *p, uint32_t v, uint64_t timeout_ns, const uint32_t *gone,
                                        uint32_t *seen, uint32_t *dead) {
  uint64_t t0 = dl_signal_clock_ns();
  uint32_t x;
  int spins = 0;
  *dead = 0;
  while ((int32_t)((x = dl_signal_load_acquire(p)) - v) < 0) {
    if (++spins % 64 == 0) {
      std::this_thread::yield();
      const uint64_t waited = dl_signal_clock_ns() - t0;
      if ((gone && waited > 100000 && (*dead = __atomic_load_n(gone, __ATOMIC_ACQUIRE)) != 0u) ||
          waited > timeout_ns) {
        *seen = x;
        return false;
      }
    }
  }
  return true;
}

/* ---- launches ------------------------------------------------------------------ */

template <typename Kernel> struct emu_launcher {
  Kernel k;
  unsigned grid, block;
  size_t smem;
  template <typename... Args> void operator()(Args... args) {
    std::vector<emu_block> blocks(grid);
    std::vector<std::thread> threads;
    for (unsigned b = 0; b < grid; b++) {
      blocks[b].n = (int)block;
      blocks[b].warps = std::vector<emu_warp>(block / 32);
      blocks[b].dynamic.assign((smem + 7) / 8 + 1, 0x5a5a5a5a5a5a5a5aLL); /* garbage, as on a GPU */
      for (unsigned t = 0; t < block; t++) {
        threads.emplace_back([=, this, &blocks] {
          threadIdx = dim3(t);
          blockIdx = dim3(b);
          blockDim = dim3(block);
          gridDim = dim3(grid);
          emu_this_block = &blocks[b];
          emu_shared_next = 0;
          k(args...);
        });
      }
    }
    for (auto &th : threads) th.join();
  }
};

template <typename Kernel>
emu_launcher<Kernel> emu_launch(Kernel k, int grid, int block, size_t smem, cudaStream_t) {
  return emu_launcher<Kernel>{k, (unsigned)grid, (unsigned)block, smem};
}

#endif
