/*
 * lamport.cuh — the Lamport region of the all-reduce buffer and its polling,
 * for one_shot_lamport (one_shot.cu) and two_shot_lamport (two_shot.cu): no
 * flags, no fences, no copy-in. Data is pushed into a region every word of
 * which is kept at a sentinel (a NaN that inputs are never sent as) and
 * polled where it lands until no word is empty, then emptied again by the
 * reader; so a vector is summed as soon as it has arrived, with no round
 * trip of a flag. f32 / f16 / bf16 summed in fp32 in rank order, so every
 * rank gets the same bits (an input word equal to the sentinel is sent, and
 * summed, as another NaN).
 *
 * Requirements of both kernels: n >= 1 and at most one lamport slot (the
 * core cuts larger tensors in pieces); in/out aligned to 16 bytes for the
 * vector path (the AL=false instantiation moves them element by element);
 * the region at the sentinel when a call starts (kernels/allreduce/allreduce.h:
 * how two halves keep that true call after call). Reference:
 * kernels/allreduce/cpu/allreduce.c, checked by spec/allreduce_spec.lua
 * against an fp64 sum.
 */
#ifndef DISTLAB_KERNELS_ALLREDUCE_LAMPORT_CUH
#define DISTLAB_KERNELS_ALLREDUCE_LAMPORT_CUH

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

// Poll vector v of `src` (peer `peer`'s copy) until it is whole (naps of
// a.poll_ns after the first few polls, of a.long_poll_ns after 128: a late
// peer's data lands among a grid of pollers, each of whose polls is a load
// of the memory it lands in); false once ar_stop says so (the wait timed
// out, another thread failed, a peer gave up or died).
__device__ __forceinline__ bool lamport_wait(const dl_ar_args_t &a, dl_ar_ctrl_t *self, const char *src,
                                             int64_t v, int peer, uint64_t t0, uint32_t seq, uint4 &x) {
  for (int spins = 1; !lamport_full(x = ld_volatile_vec(src, v)); spins++) {
    DL_AR_POLL_PAUSE(spins, spins > 128 ? a.long_poll_ns : a.poll_ns);
    if (spins % 256 == 0 && ar_stop(a, self, t0, peer, (uint32_t)v, 0u, seq, blockIdx.x)) return false;
  }
  return true;
}

// What an empty vector of the region holds.
__device__ __forceinline__ uint4 lamport_empty() {
  return make_uint4(DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY);
}

// ---- pushes and gathers of the two kernels -------------------------------------

// Input vector v, cleaned, into slot `rank` of every peer's half (one_shot_lamport).
template <int DT, int NR, bool AL>
__device__ __forceinline__ void lamport_push(const dl_ar_args_t &a, int nr, int h, int64_t v) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 x = lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
  for (int p = 0; p < NRC; p++)
    if (p < nr && p != a.rank) st_vec(lamport(a, p, h, a.rank), v, x);
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
__device__ __forceinline__ bool lamport_gather(const dl_ar_args_t &a, dl_ar_ctrl_t *self, int nr,
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
    if (!lamport_wait(a, self, src, v, q, t0, seq, x)) return false;
    st_user<DT, AL>(a.out, v, a.n, x);
    st_vec(src, v, empty);
  }
  return true;
}

#endif
