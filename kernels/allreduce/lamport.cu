/*
 * lamport.cu — the Lamport all-reduces over symmetric buffers: no flags, no
 * fences, no copy-in. Data is pushed into a region every word of which is
 * kept at a sentinel (a NaN that inputs are never sent as) and polled where
 * it lands until no word is empty, then emptied again by the reader; so a
 * vector is summed as soon as it has arrived, with no round trip of a flag.
 * f32 / f16 / bf16 summed in fp32 in rank order, so every rank gets the same
 * bits (an input word equal to the sentinel is sent, and summed, as another
 * NaN).
 *
 *   one_shot_lamport  every rank pushes its input into every peer's region
 *                     and polls the peers' copies in its own.
 *   two_shot_lamport  slices pushed to their owners, sums pushed back, both
 *                     polled where they land: for more ranks than the
 *                     one-shot suits.
 *
 * Requirements: n >= 1 and at most one lamport slot (the core cuts larger
 * tensors in pieces); in/out aligned to 16 bytes for the vector path (the
 * AL=false instantiation moves them element by element); the region at the
 * sentinel when a call starts (kernels/allreduce/allreduce.h: how two
 * halves keep that true call after call). Shared helpers:
 * allreduce_device.cuh. Reference: kernels/allreduce/cpu/allreduce.c (same
 * arguments, same algorithm), checked by spec/allreduce_spec.lua against an
 * fp64 sum.
 */
#include "allreduce/allreduce_device.cuh"

// ---- the region and its polling ---------------------------------------------------

#ifndef DL_AR_EMU // the CPU emulation brings its own
// A 16-byte load that goes to memory every time (peers write there).
__device__ __forceinline__ uint4 ld_volatile_vec(const char *base, int64_t v) {
  uint4 x;
  const uint4 *p = reinterpret_cast<const uint4 *>(base) + v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(p)
               : "memory");
  return x;
}
// Between polls after the first few: a nap of a.poll_ns, so that a grid of
// pollers waiting for data still on its way does not crowd the memory the
// data is landing in.
#define DL_AR_POLL_PAUSE(spins, ns) \
  do {                              \
    if ((spins) > 8 && (ns) > 0) __nanosleep(ns); \
  } while (0)
#endif

__device__ __forceinline__ char *lamport(const dl_ar_args_t &a, int rank, int half, int slot) {
  return buf_of(a, rank) + a.lamport_off + ((int64_t)half * a.nranks + slot) * a.lamport_slot;
}

__device__ __forceinline__ uint32_t lamport_word(uint32_t w) {
  return w == DL_AR_LAMPORT_EMPTY ? DL_AR_LAMPORT_NAN : w;
}
// An input vector as it is sent (and summed, so every rank sums the same bits).
__device__ __forceinline__ uint4 lamport_clean(const uint4 &x) {
  return make_uint4(lamport_word(x.x), lamport_word(x.y), lamport_word(x.z), lamport_word(x.w));
}
__device__ __forceinline__ bool lamport_full(const uint4 &x) {
  return x.x != DL_AR_LAMPORT_EMPTY && x.y != DL_AR_LAMPORT_EMPTY && x.z != DL_AR_LAMPORT_EMPTY &&
         x.w != DL_AR_LAMPORT_EMPTY;
}

// Poll vector v of `src` (peer `peer`'s copy) until it is whole; false once
// the wait times out (recorded) or another thread has failed.
__device__ __forceinline__ bool lamport_wait(const dl_ar_args_t &a, const volatile uint32_t *failed,
                                             const char *src, int64_t v, int peer, uint64_t t0, uint32_t seq,
                                             uint4 &x) {
  for (int spins = 1; !lamport_full(x = ld_volatile_vec(src, v)); spins++) {
    DL_AR_POLL_PAUSE(spins, a.poll_ns);
    if (spins % 256 == 0 && (*failed != 0u || dl_signal_clock_ns() - t0 > a.timeout_ns)) {
      if (*failed == 0u) ar_fail(a.pad, a.status, a.algo, peer, (uint32_t)v, 0u, seq);
      return false;
    }
  }
  return true;
}

// What an empty vector of the region holds.
__device__ __forceinline__ uint4 lamport_empty() {
  return make_uint4(DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY);
}

// ---- kernels --------------------------------------------------------------------

// Input vector v, cleaned, into slot `rank` of every peer's half (one_shot_lamport).
template <int DT, int NR, bool AL>
__device__ __forceinline__ void lamport_push(const dl_ar_args_t &a, int nr, int h, int64_t v) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 x = lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
  for (int p = 0; p < NRC; p++)
    if (p < nr && p != a.rank) st_vec(lamport(a, p, h, a.rank), v, x);
}

// one_shot_lamport: push the input vectors (cleaned) into slot `rank` of
// every peer's lamport half, and, vector by vector, poll the peers' copies in
// our half until each is whole, reduce in rank order and empty them. Thread
// t of block b owns vectors j*T*G + b*T + t (a step j of the grid is T*G
// vectors), and pushes its step j + a.lamport_ahead before it reduces step j
// (0: every step first), so the reduction of arrived data overlaps the
// pushes still going out (2 H200s, 8 MB: 31.9 us with every step first, 29.2
// with two ahead; allreduce-h200x2-knobs.md). A vector's push and reduction
// are in the same thread, so an in-place output is written only after its
// thread read the input. A wait that times out (or sees another thread's
// failure) records it and ends the kernel's work.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_lamport_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, me));
  const uint32_t seq = ar_begin(self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t next = first; // the next vector to push
  for (int j = 0; (a.lamport_ahead <= 0 || j < a.lamport_ahead) && next < nv; j++, next += stride)
    lamport_push<DT, NR, AL>(a, nr, h, next);
  const uint4 empty = lamport_empty();
  const volatile uint32_t *failed = &a.pad->error[0];
  const uint64_t t0 = dl_signal_clock_ns();
  bool ok = true;
  for (int64_t v = first; ok && v < nv; v += stride) {
    if (next < nv) {
      lamport_push<DT, NR, AL>(a, nr, h, next);
      next += stride;
    }
    uint4 x[NRC];
    const uint4 own = lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
    for (int p = 0; p < NRC; p++)
      if (p < nr && p != me && ok) ok = lamport_wait(a, failed, lamport(a, me, h, p), v, p, t0, seq, x[p]);
    if (!ok) break;
    st_user<DT, AL>(a.out, v, a.n, reduce_vec_own<DT, NRC>(x, nr, me, own));
#pragma unroll
    for (int p = 0; p < NRC; p++)
      if (p < nr && p != me) st_vec(lamport(a, me, h, p), v, empty);
  }
  ar_end(self, seq);
}

// Position j of every slice of our input into slot `rank` of the slice's
// owner's half (two_shot_lamport).
template <int DT, int NR, bool AL>
__device__ __forceinline__ void lamport_scatter(const dl_ar_args_t &a, int nr, int h, int64_t sv, int64_t nv,
                                                int64_t j) {
  constexpr int NRC = shape<NR>::NRC;
#pragma unroll
  for (int q = 0; q < NRC; q++) {
    const int64_t v = q * sv + j;
    if (q < nr && q != a.rank && v < nv)
      st_vec(lamport(a, q, h, a.rank), v, lamport_clean(ld_user<DT, AL>(a.in, v, a.n)));
  }
}

// The sums of every other slice at position j: poll, write out, empty.
template <int DT, int NR, bool AL>
__device__ __forceinline__ bool lamport_gather(const dl_ar_args_t &a, const volatile uint32_t *failed, int nr,
                                               int h, int64_t sv, int64_t nv, int64_t j, uint64_t t0,
                                               uint32_t seq) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 empty = lamport_empty();
#pragma unroll
  for (int q = 0; q < NRC; q++) {
    const int64_t v = q * sv + j;
    if (!(q < nr && q != a.rank && v < nv)) continue;
    char *src = lamport(a, a.rank, h, q);
    uint4 x;
    if (!lamport_wait(a, failed, src, v, q, t0, seq, x)) return false;
    st_user<DT, AL>(a.out, v, a.n, x);
    st_vec(src, v, empty);
  }
  return true;
}

// two_shot_lamport: a two-shot without flags or fences, for more ranks than
// one-shot Lamport suits (it sends every input to every peer). Slice q of
// every rank's input goes into slot `rank` of rank q's lamport half, at the
// slice's own positions; rank q polls its slice from every peer, reduces it
// in rank order (cleaned, so every rank writes the same bits), writes it out
// and pushes it into slot q of every peer, again at the slice's positions;
// every rank polls the other slices' sums there and writes them out. In a
// rank's half, slot p holds p's share of our slice at our slice's positions
// and p's sum at p's: the two never meet. Every word is emptied by the rank
// that polled it. Thread t of block b owns position j = k*T*G + b*T + t of
// every slice; it scatters step k + a.lamport_ahead before it reduces step
// k, and reads the sums of step k one step later, when they have had time
// to land.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_lamport_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, me));
  const uint32_t seq = ar_begin(self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t sv = (nv + nr - 1) / nr;
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t next = first; // the next position to scatter
  for (int k = 0; (a.lamport_ahead <= 0 || k < a.lamport_ahead) && next < sv; k++, next += stride)
    lamport_scatter<DT, NR, AL>(a, nr, h, sv, nv, next);
  const uint4 empty = lamport_empty();
  const volatile uint32_t *failed = &a.pad->error[0];
  const uint64_t t0 = dl_signal_clock_ns();
  bool ok = true;
  int64_t prev = -1; // the position whose sums are gathered next
  for (int64_t j = first; ok && j < sv; j += stride) {
    if (next < sv) {
      lamport_scatter<DT, NR, AL>(a, nr, h, sv, nv, next);
      next += stride;
    }
    const int64_t v = me * sv + j;
    if (v < nv) { // our slice: reduce, write out, send the sum to every peer
      uint4 x[NRC];
      const uint4 own = lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
      for (int p = 0; p < NRC; p++)
        if (p < nr && p != me && ok) ok = lamport_wait(a, failed, lamport(a, me, h, p), v, p, t0, seq, x[p]);
      if (!ok) break;
      const uint4 sum = lamport_clean(reduce_vec_own<DT, NRC>(x, nr, me, own));
      st_user<DT, AL>(a.out, v, a.n, sum);
#pragma unroll
      for (int p = 0; p < NRC; p++) {
        if (p < nr && p != me) {
          st_vec(lamport(a, p, h, me), v, sum);
          st_vec(lamport(a, me, h, p), v, empty);
        }
      }
    }
    if (prev >= 0) ok = lamport_gather<DT, NR, AL>(a, failed, nr, h, sv, nv, prev, t0, seq);
    prev = j;
  }
  if (ok && prev >= 0) lamport_gather<DT, NR, AL>(a, failed, nr, h, sv, nv, prev, t0, seq);
  ar_end(self, seq);
}

// ---- launcher -----------------------------------------------------------------

dl_ar_kernel_t dl_ar_lamport_kernel(const dl_ar_args_t *a) {
  switch (a->algo) {
  case DL_AR_ONE_SHOT_LAMPORT: return DL_AR_PICK(a, allreduce_one_shot_lamport_kernel);
  case DL_AR_TWO_SHOT_LAMPORT: return DL_AR_PICK(a, allreduce_two_shot_lamport_kernel);
  default: return nullptr;
  }
}
