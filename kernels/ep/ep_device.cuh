// ep_device.cuh — what the expert-parallel kernel files (ep_dispatch.cu,
// ep_combine.cu, the layouts ep_per_expert.cuh and ep_per_rank.cuh) share:
// every rank's buffer and control words, the waits with their timeout and
// failure record, the end of a block (each block counts itself at every
// peer), a block-wide exclusive scan, the row copies in 16-byte vectors and
// the receives' output rows. Protocol, layout and message formats:
// kernels/ep/ep.h. Only the warp intrinsics __shfl*_sync, __ballot_sync, __match_any_sync,
// __syncwarp, the block barrier, atomics and the signal-pad loads and
// stores are used, so the CPU emulation in experiments/ep/emu runs these
// files as they are.
#ifndef DISTLAB_EP_DEVICE_CUH
#define DISTLAB_EP_DEVICE_CUH

#include "common/launch.cuh"
#include "ep/ep.h"
#include "ep/fp8.h"

#define EP_FULL 0xffffffffu

// Shared memory: the kernel's dynamic int array, and a block-wide variable
// (the CPU emulation gives each block its own).
#ifndef EP_SMEM
#define EP_SMEM(name) extern __shared__ int name[]
#define EP_SHARED(type, name) __shared__ type name
#endif

// Rank p's buffer without indexing the parameter block at run time (which
// would copy it to local memory).
__device__ __forceinline__ char *ep_buf(const dl_ep_args_t &a, int p) {
  char *b = a.bufs[0];
#pragma unroll
  for (int q = 1; q < DL_SIGNAL_MAX_RANKS; q++)
    if (p == q) b = a.bufs[q];
  return b;
}

__device__ __forceinline__ uint32_t *ep_ctrl(const dl_ep_args_t &a, int p) {
  return reinterpret_cast<uint32_t *>(ep_buf(a, p));
}

__device__ __forceinline__ uint32_t ep_ld_volatile(const uint32_t *p) {
  return *reinterpret_cast<const volatile uint32_t *>(p);
}

// The first failure of this rank records itself: fields, then kind (the
// host reads kind first, without waiting for the stream). Plain arguments:
// a reference to the parameter block would copy it to local memory.
static __device__ __noinline__ void ep_fail(dl_ep_status_t *s, int phase, uint32_t kind, uint32_t peer,
                                            uint32_t expected, uint32_t seen, uint32_t epoch) {
  if (atomicCAS(&s->claim, 0u, 1u) != 0u) return;
  volatile dl_ep_status_t *v = s;
  v->phase = (uint32_t)phase;
  v->peer = peer;
  v->expected = expected;
  v->seen = seen;
  v->block = blockIdx.x;
  v->epoch = epoch;
  __threadfence_system();
  v->kind = kind;
  __threadfence_system();
}

#ifndef DL_EP_EMU // the CPU emulation brings its own
// The 16-byte vector at p as memory holds it now (the peers write there): L2, every time.
__device__ __forceinline__ uint4 ep_ld_vec_volatile(const uint4 *p) {
  uint4 x;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p)
               : "memory");
  return x;
}
// Between polls of a vector not there yet, after the first few: a nap, so that
// a grid of pollers does not crowd the lines the rows land in, as the
// all-reduce's Lamport kernels nap (EP_POLL_NAP_NS=0 at build time turns it
// off; measured: experiments/ep/NOTES.md).
#define EP_POLL_NAP(spins)                          \
  do {                                              \
    if ((spins) > 4 && EP_POLL_NAP_NS > 0) __nanosleep(EP_POLL_NAP_NS); \
  } while (0)
#define EP_POLL_YIELD() \
  do {                  \
  } while (0)
#endif
#ifndef EP_POLL_NAP_NS
#define EP_POLL_NAP_NS 128
#endif

// Whether a wait of `phase` for `peer` in call `epoch`, `waited` ns long
// already, must stop (ep.h): another block recorded a failure (not a bad
// id), the peer died (status->gone, host memory: read here only), the peer
// started the other kind of call as this call (its ann word, ep.h),
// or the timeout: this wait's reason recorded (a timeout with the call
// waited for, `expected`, and the calls the peer's count `count` held).
// Called every so often by waits that last, never on the fast path.
static __device__ __noinline__ bool ep_stop(dl_ep_status_t *status, const uint32_t *self, int n, int rank, int phase,
                                            int peer, uint32_t epoch, uint32_t expected, const uint32_t *count,
                                            uint64_t waited, uint64_t timeout_ns) {
  volatile dl_ep_status_t *v = status;
  const uint32_t kind = v->kind, gone = v->gone;
  if (kind != 0u && kind != DL_EP_ERR_BAD_ID) return true;
  const uint32_t call = dl_ep_call(self, n, rank, phase, epoch);
  if (ep_ld_volatile(self + dl_ep_ann(n, peer)) == dl_ep_ann_word(call, !dl_ep_is_dispatch(phase))) {
    ep_fail(status, phase, DL_EP_ERR_CALL, (uint32_t)peer, call, call | DL_EP_TAG_OTHER, epoch); // (it may have exited since)
    return true;
  }
  if (gone != 0u) {
    ep_fail(status, phase, DL_EP_ERR_GONE, gone - 1u, epoch, 0u, epoch);
    return true;
  }
  if (waited > timeout_ns) {
    ep_fail(status, phase, DL_EP_ERR_TIMEOUT, (uint32_t)peer, expected, dl_ep_calls_of(ep_ld_volatile(count)), epoch);
    return true;
  }
  return false;
}

// The slow path of ep_wait: polls until word p reaches count or ep_stop says stop.
static __device__ __noinline__ bool ep_wait_slow(dl_ep_status_t *status, const uint32_t *self, int n, int rank,
                                                 int phase, int peer, uint32_t epoch, const uint32_t *p, uint32_t count,
                                                 uint64_t timeout_ns) {
  const uint64_t t0 = dl_signal_clock_ns();
  for (int spins = 1;; spins++) {
    if (DL_SIGNAL_REACHED(dl_signal_load_acquire(p), count)) return true;
    if (spins % 256) continue; // (ep_stop reads host memory: not too often)
    EP_POLL_YIELD();
    const uint64_t waited = dl_signal_clock_ns() - t0;
    if (waited > 100000 &&
        ep_stop(status, self, n, rank, phase, peer, epoch, dl_ep_calls_of(count), p, waited, timeout_ns))
      return false;
  }
}

// One thread: until control word w of this rank reaches count (written by
// `peer`); false, recorded, once ep_stop says so.
__device__ __forceinline__ bool ep_wait(const dl_ep_args_t &a, int phase, int64_t w, uint32_t count, int peer,
                                        uint32_t epoch) {
  const uint32_t *self = ep_ctrl(a, a.rank);
  if (DL_SIGNAL_REACHED(dl_signal_load_acquire(self + w), count)) return true;
  return ep_wait_slow(a.status, self, a.nranks, a.rank, phase, peer, epoch, self + w, count, a.timeout_ns);
}

// A receive's check of what arrived from `peer` (its count, then read): the
// peer's tag of this kind is this call's (ep.h), else recorded.
__device__ __forceinline__ bool ep_tag_ok(const dl_ep_args_t &a, int phase, int peer, uint32_t epoch) {
  const uint32_t *self = ep_ctrl(a, a.rank);
  const uint32_t call = dl_ep_call(self, a.nranks, a.rank, phase, epoch);
  const uint32_t tag = ep_ld_volatile(self + dl_ep_tag_same(a.nranks, phase, peer));
  if (tag == call) return true;
  ep_fail(a.status, phase, DL_EP_ERR_CALL, (uint32_t)peer, call, tag, epoch);
  return false;
}

// Thread q < N of a send's block 0, before its waits: the call this rank
// starts, into rank q's ann word for us (ep.h).
__device__ __forceinline__ void ep_announce(const dl_ep_args_t &a, int phase, uint32_t epoch) {
  const int q = threadIdx.x;
  if (blockIdx.x == 0 && q < a.nranks)
    ep_ctrl(a, q)[dl_ep_ann(a.nranks, a.rank)] =
        dl_ep_ann_word(dl_ep_call(ep_ctrl(a, a.rank), a.nranks, a.rank, phase, epoch), dl_ep_is_dispatch(phase));
}

// Thread q < N of a send's last block (dispatch) or first (combine), the
// block's wait done: this call's tag into rank q's word for us (ahead of the
// block's count there, ep_finish).
__device__ __forceinline__ void ep_send_tag(const dl_ep_args_t &a, int phase, uint32_t epoch) {
  const int q = threadIdx.x;
  if (q < a.nranks)
    ep_ctrl(a, q)[dl_ep_tag_same(a.nranks, phase, a.rank)] =
        dl_ep_call(ep_ctrl(a, a.rank), a.nranks, a.rank, phase, epoch);
}

// Adds v to *p (a peer's counter), system scope. release (a send's count):
// after everything this thread did, and what the block did before its last
// barrier (one fence and a one-way write on NVLink). Not release (a
// receive's count): a relaxed add, no fence. What that count orders is the
// block's reads of its slots (the peer writes them again once it sees it),
// and every one of those reads has returned before the block's last barrier:
// its value was stored to an output, or decided a branch. So no write the
// peer makes after the count can reach them, as NCCL's simple protocol posts
// a receive step with a plain store (the fence's cost: experiments/ep/NOTES.md).
__device__ __forceinline__ void ep_add(uint32_t *p, uint32_t v, bool release) {
#ifdef DL_EP_EMU
  __atomic_fetch_add(p, v, release ? __ATOMIC_RELEASE : __ATOMIC_RELAXED);
#else
  if (release) asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  else asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
#endif
}

// Block-wide values a kernel's threads share.
struct ep_block {
  uint32_t epoch;
  int ok; // no wait of this block timed out
};

// The start of a block of phase `phase` (DL_EP_DISPATCH_SEND ... the one it
// counts as; a fused launch runs two): this phase's epoch, from the counter
// its blocks add to at this rank, word count_of(N, rank) (ep.h: this block
// has not added its share yet, so the count holds the previous calls whole
// and part of this one at most). early: that count as thread 0 read it at
// the start of a fused kernel (the receive half's, read beside the send's).
//
// In two halves, so that the count's load can overlap other loads: thread 0
// reads the count (ep_count_now), then, once the value is needed, sets the
// epoch (ep_set_epoch) before a barrier of the caller's.
__device__ __forceinline__ uint32_t ep_count_now(const dl_ep_args_t &a, int64_t (*count_of)(int, int)) {
  return threadIdx.x == 0 ? ep_ld_volatile(ep_ctrl(a, a.rank) + count_of(a.nranks, a.rank)) : 0u;
}
__device__ __forceinline__ void ep_set_epoch(ep_block &blk, uint32_t count) {
  if (threadIdx.x == 0) {
    blk.epoch = dl_ep_calls_of(count) + 1;
    blk.ok = 1;
  }
}
__device__ __forceinline__ void ep_start(const dl_ep_args_t &a, ep_block &blk, int64_t (*count_of)(int, int),
                                         const uint32_t *early = nullptr) {
  ep_set_epoch(blk, early ? *early : ep_count_now(a, count_of));
  __syncthreads();
}

// The waits of threads q < N for word word_of(N, q) to count call epoch + lag
// whole (lag 0: a receive's, whose tags are then checked: ep_tag_ok).
__device__ __forceinline__ void ep_await(const dl_ep_args_t &a, int phase, ep_block &blk,
                                         int64_t (*word_of)(int, int), int lag) {
  const int q = threadIdx.x;
  if (q < a.nranks && (!ep_wait(a, phase, word_of(a.nranks, q), dl_ep_count_of(blk.epoch + (uint32_t)lag), q, blk.epoch) ||
                       (lag == 0 && !ep_tag_ok(a, phase, q, blk.epoch))))
    blk.ok = 0;
  __syncthreads();
}

__device__ __forceinline__ void ep_begin(const dl_ep_args_t &a, int phase, ep_block &blk,
                                         int64_t (*word_of)(int, int), int lag, int64_t (*count_of)(int, int),
                                         const uint32_t *early = nullptr) {
  ep_start(a, blk, count_of, early);
  ep_await(a, phase, blk, word_of, lag);
}

// The end of a block: thread q < N adds the block's share to its word
// count_of(N, rank) at rank q, unless a wait of the block timed out (the
// peers then time out too, naming this rank). A send's add is a release (the
// block's writes go first), a receive's is relaxed (its reads are done):
// ep_add. No count of the grid's blocks, no last block: a send block's own
// system fence and one write on NVLink (a receive block's: the write alone)
// are all that stand between its last access and the peer.
__device__ __forceinline__ void ep_finish(const dl_ep_args_t &a, ep_block &blk, int64_t (*count_of)(int, int),
                                          bool send) {
  __syncthreads();
  const int q = threadIdx.x;
  if (!blk.ok || q >= a.nranks) return;
  uint32_t *w = ep_ctrl(a, q) + count_of(a.nranks, a.rank);
  ep_add(w, dl_ep_share(blockIdx.x, gridDim.x), send);
}

// Exclusive prefix sums of v[0..n) into pre[0..n], pre[n] the total, by the
// whole block (every thread a contiguous run). tmp: 32 ints of shared memory.
__device__ __forceinline__ void ep_scan(const int *v, int n, int *pre, int *tmp) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n + nt - 1) / nt, lo = tid * per < n ? tid * per : n, hi = lo + per < n ? lo + per : n;
  int sum = 0;
  for (int i = lo; i < hi; i++) sum += v[i];
  int inc = sum; // inclusive scan of the threads' sums within the warp
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(EP_FULL, inc, d);
    if (lane >= d) inc += y;
  }
  if (lane == 31) tmp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = lane < (nt >> 5) ? tmp[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int y = __shfl_up_sync(EP_FULL, w, d);
      if (lane >= d) w += y;
    }
    if (lane < (nt >> 5)) tmp[lane] = w; // inclusive over warps
  }
  __syncthreads();
  int run = inc - sum + (warp > 0 ? tmp[warp - 1] : 0);
  for (int i = lo; i < hi; i++) {
    pre[i] = run;
    run += v[i];
  }
  if (tid == nt - 1) pre[n] = run;
  __syncthreads();
}

// The largest g in [0, n) with pre[g] <= i (pre non-decreasing, pre[0] = 0).
__device__ __forceinline__ int ep_group_of(const int *pre, int n, int64_t i) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (pre[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Rows cut into segments for small calls. A warp that moves a whole row
// (14 KB at H = 7168) alone waits for seven rounds of four vectors a lane,
// and at small B most of the grid's warps sit idle (one token's time was
// mostly one warp's: experiments/ep/NOTES.md). So `items` rows of nv 16-byte vectors are
// split over `warps` warps: segs segments of `per` vectors (a multiple of
// 32, so every lane has work and fp8 groups of 16 vectors stay whole), at
// most one segment per warp. Segment g covers [g * per, min(nv, (g + 1) * per)).
struct ep_split {
  int64_t segs, per;
};

__device__ __forceinline__ ep_split ep_split_rows(int64_t items, int64_t warps, int64_t nv) {
  const int64_t most = nv > 32 ? (nv + 31) / 32 : 1;
  int64_t s = items > 0 ? warps / items : 1;
  s = s < 1 ? 1 : s > most ? most : s;
  ep_split r;
  r.per = ((nv + s - 1) / s + 31) / 32 * 32;
  r.segs = nv > 0 ? (nv + r.per - 1) / r.per : 1;
  return r;
}

// A warp's batch of a row copy: vectors v0 + 32u (u < 4, below nv) of a
// lane, loaded apart from their stores, so that a caller can issue the loads
// of a row's first batch before a wait, or beside the loads of its header.
struct ep_batch {
  uint4 r[4];
};
__device__ __forceinline__ void ep_load_batch(ep_batch &b, const char *src, int64_t nv, int64_t v0) {
  const uint4 *s = reinterpret_cast<const uint4 *>(src);
#pragma unroll
  for (int u = 0; u < 4; u++)
    if (v0 + 32 * u < nv) b.r[u] = s[v0 + 32 * u];
}
// A word as it goes into a Lamport slot (ep.h): never DL_EP_EMPTY.
__device__ __forceinline__ uint32_t ep_lamport_word(uint32_t w) { return w == DL_EP_EMPTY ? DL_EP_NAN : w; }
__device__ __forceinline__ uint4 ep_lamport_clean(const uint4 &x) {
  return make_uint4(ep_lamport_word(x.x), ep_lamport_word(x.y), ep_lamport_word(x.z), ep_lamport_word(x.w));
}
// CLEAN: into Lamport slots (every word an EMPTY one is not).
template <bool CLEAN = false>
__device__ __forceinline__ void ep_store_batch(char *dst, const ep_batch &b, int64_t nv, int64_t v0) {
  uint4 *d = reinterpret_cast<uint4 *>(dst);
#pragma unroll
  for (int u = 0; u < 4; u++) {
    if (v0 + 32 * u >= nv) continue;
    if constexpr (CLEAN) d[v0 + 32 * u] = ep_lamport_clean(b.r[u]);
    else d[v0 + 32 * u] = b.r[u];
  }
}

// A warp copies `bytes` (a multiple of 16) from src to dst, four vectors in
// flight per lane, the first batch already loaded into b (ep_load_batch(b,
// src, bytes / 16, lane)); b then serves the rest. CLEAN: dst is a Lamport slot.
template <bool CLEAN = false>
__device__ __forceinline__ void ep_copy_row_loaded(char *dst, const char *src, int64_t bytes, int lane, ep_batch &b) {
  const int64_t nv = bytes / 16;
  ep_store_batch<CLEAN>(dst, b, nv, lane);
  for (int64_t v0 = lane + 128; v0 < nv; v0 += 128) {
    ep_load_batch(b, src, nv, v0);
    ep_store_batch<CLEAN>(dst, b, nv, v0);
  }
}

// ---- Lamport slots (ep.h): a vector is there once none of its words is empty ----


__device__ __forceinline__ bool ep_vec_full(const uint4 &x) {
  return x.x != DL_EP_EMPTY && x.y != DL_EP_EMPTY && x.z != DL_EP_EMPTY && x.w != DL_EP_EMPTY;
}

// Polls the vector at p until it is whole (into *x): true; false once the
// block gave up (*blk_ok 0: another warp's wait stopped) or ep_stop says
// stop (read once the wait has lasted 100 us; a bad expert id's record stops
// nothing: that call still completes), recorded as a wait of phase `phase`
// for `peer`'s row of call `epoch`, with the calls the peer's count (its
// disp_flag / comb_flag at this rank, self's) held; *blk_ok then 0. Plain
// arguments: a reference to the parameter block would copy it to local
// memory. The first poll (the fast path) is the caller's.
static __device__ __noinline__ bool ep_poll_vec(const uint4 *p, uint4 *x, uint64_t timeout_ns, dl_ep_status_t *status,
                                                int phase, int peer, uint32_t epoch, const uint32_t *self, int n,
                                                int rank, int *blk_ok) {
  const uint64_t t0 = dl_signal_clock_ns();
  const uint32_t *count = self + (dl_ep_is_dispatch(phase) ? dl_ep_disp_flag(n, peer) : dl_ep_comb_flag(n, peer));
  for (int spins = 1;; spins++) {
    *x = ep_ld_vec_volatile(p);
    if (ep_vec_full(*x)) return true;
    EP_POLL_NAP(spins);
    if (spins % 32) continue;
    EP_POLL_YIELD();
    if (*reinterpret_cast<volatile int *>(blk_ok) == 0) return false;
    const uint64_t waited = dl_signal_clock_ns() - t0;
    if (waited > 100000 && spins % 1024 == 0 &&
        ep_stop(status, self, n, rank, phase, peer, epoch, epoch, count, waited, timeout_ns)) {
      *reinterpret_cast<volatile int *>(blk_ok) = 0;
      return false;
    }
  }
}

// The same copy, loads and all.
__device__ __forceinline__ void ep_copy_row(char *dst, const char *src, int64_t bytes, int lane) {
  ep_batch b;
  ep_load_batch(b, src, bytes / 16, lane);
  ep_copy_row_loaded(dst, src, bytes, lane, b);
}

// A warp copies n 32-bit words.
__device__ __forceinline__ void ep_copy_words(uint32_t *dst, const uint32_t *src, int64_t n, int lane) {
  for (int64_t i = lane; i < n; i += 32) dst[i] = src[i];
}

// ---- the receives' rows (both layouts) --------------------------------------------

// 16-byte vectors of an output row: bf16 values, or fp8 codes.
template <bool FP8> __device__ __forceinline__ int64_t ep_row_vectors(const dl_ep_args_t &a) {
  return FP8 ? a.hidden / 16 : a.hidden / 8;
}

// Bytes of an output row (bf16 values, or fp8 codes) and segment g's share.
template <bool FP8> __device__ __forceinline__ int64_t ep_row_bytes(const dl_ep_args_t &a) {
  return FP8 ? a.hidden : 2 * (int64_t)a.hidden;
}
__device__ __forceinline__ int64_t ep_seg_lo(const ep_split &sp, int64_t g) { return 16 * g * sp.per; }
__device__ __forceinline__ int64_t ep_seg_hi(const ep_split &sp, int64_t g, int64_t rb) {
  return min(rb, 16 * (g + 1) * sp.per);
}

// A warp copies segment g of a message's payload into output row `row`
// (the first segment: and the row's scales); b, if given, holds the
// segment's first batch, loaded (ep_load_batch).
template <bool FP8>
__device__ __forceinline__ void ep_store_row(const dl_ep_args_t &a, const char *payload, int64_t row, int lane,
                                             const ep_split &sp, int64_t g, ep_batch *b = nullptr) {
  const int64_t rb = ep_row_bytes<FP8>(a), lo = ep_seg_lo(sp, g), hi = ep_seg_hi(sp, g, rb);
  char *dst = reinterpret_cast<char *>(a.rx) + row * rb + lo;
  ep_batch own;
  if (!b) ep_load_batch(own, payload + lo, (hi - lo) / 16, lane);
  ep_copy_row_loaded(dst, payload + lo, hi - lo, lane, b ? *b : own);
  if (FP8 && g == 0) {
    const int G = a.hidden / DL_EP_FP8_GROUP;
    ep_copy_words(reinterpret_cast<uint32_t *>(a.rscales) + row * G,
                  reinterpret_cast<const uint32_t *>(payload + a.hidden), G, lane);
  }
}

// Block 0 writes the outputs' counts: rows of each local expert
// (expert_major, from cnt[le][source]) or from each source (ntok). The
// caller's N, L and thread index, not reloaded here.
template <bool EXPERT_MAJOR>
__device__ __forceinline__ void ep_recv_counts(const dl_ep_args_t &a, const int *cnt, const int *ntok, int N, int L,
                                               int tid) {
  if (blockIdx.x == 0) {
    if (EXPERT_MAJOR)
      for (int le = tid; le < L; le += blockDim.x) {
        int sum = 0;
        for (int s = 0; s < N; s++) sum += cnt[le * N + s];
        a.rcounts[le] = sum;
      }
    else
      for (int s = tid; s < N; s += blockDim.x) a.rcounts[s] = ntok[s];
  }
}

typedef void (*ep_kernel_t)(const dl_ep_args_t);

// Launches, by the file that defines the kernels (nvcc instantiates a
// template where it is defined); smem: dynamic shared memory bytes.
int ep_launch_dispatch(const dl_ep_args_t *a, void *stream, int64_t smem);
int ep_launch_combine(const dl_ep_args_t *a, void *stream, int64_t smem);

#endif
