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
 * one_shot_lamport's small calls go as tagged vectors instead (a.tagged;
 * kernels/allreduce/allreduce.h): 8 bytes of input and 8 of tags a vector,
 * any input word sent as it is, a peer's call compared only when its tags
 * say another call or a wait lasts.
 *
 * Requirements of both kernels: n >= 1 and at most one lamport slot, half a
 * slot tagged (the core cuts larger tensors in pieces, and tags only calls
 * that fit); in/out aligned to 16 bytes for the
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

// Lamport slot `slot` of half `half` in the buffer at base (ring_buf(a, i):
// the buffer of peer_after(rank, i); ring_buf(a, 0) ours).
__device__ __forceinline__ char *lamport_at(const dl_ar_args_t &a, char *base, int half, int slot) {
  return base + a.lamport_off + ((int64_t)half * a.nranks + slot) * a.lamport_stride;
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
// a.poll_ns after the first few polls, of a.long_poll_ns after
// a.long_poll_after: a late peer's data lands among a grid of pollers, each
// of whose polls is a load of the memory it lands in); false once ar_stop
// says so (the wait timed out, another thread failed, a peer gave up or died).
__device__ __forceinline__ bool lamport_wait(const dl_ar_args_t &a, dl_ar_ctrl_t *self, const char *src,
                                             int64_t v, int peer, uint64_t t0, uint32_t seq, uint4 &x) {
  for (int spins = 1; !lamport_full(x = ld_volatile_vec(src, v)); spins++) {
    DL_AR_POLL_PAUSE(spins, (uint32_t)spins > a.long_poll_after ? a.long_poll_ns : a.poll_ns);
    if (spins % 256 == 0 && ar_stop(a, self, t0, peer, (uint32_t)v, 0u, seq, blockIdx.x)) return false;
  }
  return true;
}

// What an empty vector of the region holds.
__device__ __forceinline__ uint4 lamport_empty() {
  return make_uint4(DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY, DL_AR_LAMPORT_EMPTY);
}

// ---- tagged vectors (kernels/allreduce/allreduce.h) ------------------------------

#ifndef DL_AR_EMU // the CPU emulation brings its own
// Vector v of base as two 64-bit words, each loaded whole, into (payload 0,
// tag 0, payload 1, tag 1), going to memory every time.
__device__ __forceinline__ uint4 ld_volatile_tagged(const char *base, int64_t v) {
  uint64_t w0, w1;
  const uint4 *p = reinterpret_cast<const uint4 *>(base) + v;
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p) : "memory");
  return make_uint4((uint32_t)w0, (uint32_t)(w0 >> 32), (uint32_t)w1, (uint32_t)(w1 >> 32));
}
// Payload words d0, d1 under tags t0, t1 into vector v of base, as two
// 64-bit words, each stored whole.
__device__ __forceinline__ void st_tagged(char *base, int64_t v, uint32_t d0, uint32_t d1, uint32_t t0,
                                          uint32_t t1) {
  reinterpret_cast<ulonglong2 *>(base)[v] = make_ulonglong2((uint64_t)t0 << 32 | d0, (uint64_t)t1 << 32 | d1);
}
#endif

// A tag that is there and not the one expected.
__device__ __forceinline__ bool lamport_tag_wrong(uint32_t t, uint32_t want) {
  return t != DL_AR_LAMPORT_EMPTY && t != want;
}

// Whether peer p's call for seq is here and differs from ours (hash: ours,
// dl_ar_call_hash). Plain values (allreduce_device.cuh: the failure paths),
// called only between the polls of a wait that lasts.
static __device__ __noinline__ bool lamport_call_differs(const dl_ar_ctrl_t *self, int p, uint32_t seq,
                                                         uint32_t hash) {
  uint32_t w[8], x;
  if (!ar_call_read(self, p, seq, seq + 1, w, x)) return false;
  dl_ar_call_t c;
  memcpy(&c, w, sizeof c);
  return dl_ar_call_hash(&c) != hash;
}

// What ended a tagged wait without its data (lamport_wait_tagged), for
// lamport_tagged_fail: the cold path stays out of the polling loop.
enum { LAMPORT_STOPPED = 0, LAMPORT_OK = 1, LAMPORT_WRONG_TAG = 2, LAMPORT_CHECK = 3 };

// Poll input vector v of peer `peer` (region vectors 2v and 2v + 1 of src)
// until every word carries this call's tags (LAMPORT_OK, the payload in x);
// LAMPORT_WRONG_TAG once a word carries another's; LAMPORT_CHECK once a peer
// gave up, or `peer`'s call is here and differs (a peer whose algorithm
// waits for a flag of ours before it compares calls sends no data); neither
// recorded yet (lamport_tagged_fail). LAMPORT_STOPPED once ar_stop says so
// (recorded). Naps as lamport_wait's.
__device__ __forceinline__ int lamport_wait_tagged(const dl_ar_args_t &a, dl_ar_ctrl_t *self, const char *src,
                                                   int64_t v, int peer, uint64_t t0, uint32_t seq, uint32_t tag,
                                                   uint4 &x) {
  const uint32_t hash = a.call_hash;
  for (int spins = 1;; spins++) {
    const uint4 lo = ld_volatile_tagged(src, 2 * v), hi = ld_volatile_tagged(src, 2 * v + 1);
    if (lo.y == tag && hi.y == tag && lo.w == hash && hi.w == hash) {
      x = make_uint4(lo.x, lo.z, hi.x, hi.z);
      return LAMPORT_OK;
    }
    if (lamport_tag_wrong(lo.y, tag) || lamport_tag_wrong(hi.y, tag) || lamport_tag_wrong(lo.w, hash) ||
        lamport_tag_wrong(hi.w, hash))
      return LAMPORT_WRONG_TAG;
    DL_AR_POLL_PAUSE(spins, (uint32_t)spins > a.long_poll_after ? a.long_poll_ns : a.poll_ns);
    if (spins % 256 == 0) {
      if (*reinterpret_cast<volatile uint32_t *>(&self->abort) != 0u ||
          lamport_call_differs(self, peer, seq, hash))
        return LAMPORT_CHECK;
      if (ar_stop(a, self, t0, peer, (uint32_t)v, 0u, seq, blockIdx.x)) return LAMPORT_STOPPED;
    }
  }
}

// A tagged wait on peer `peer` at vector v ended by `why`, recorded. A wrong
// tag: the peer runs another call; its call (announced at its start) is
// compared with ours, so the record names both (ar_agree; the same call with
// other tags is recorded as a mismatch too, which no live buffer shows).
// LAMPORT_CHECK: a peer whose call is here and differs is named (a peer
// that gave up saw a mismatch, most likely), else the abort (ar_stop's record).
__device__ __forceinline__ void lamport_tagged_fail(const dl_ar_args_t &a, dl_ar_ctrl_t *self, int why, int peer,
                                                    int64_t v, uint64_t t0, uint32_t seq) {
  if (why == LAMPORT_WRONG_TAG) ar_agree(a, self, peer, seq, true);
  if (why != LAMPORT_CHECK) return;
  uint32_t mine[8], x = 0;
  ar_call_words(a, seq, mine);
  for (int q = 0; q < a.nranks; q++)
    if (q != a.rank && ar_call_peek(a, self, q, seq, mine, x) < 0) return;
  // nothing stops the wait: `peer`'s call differs by its hash but by no word
  // (which cannot be): recorded as a mismatch all the same
  if (!ar_stop(a, self, t0, peer, (uint32_t)v, 0u, seq, blockIdx.x)) ar_agree(a, self, peer, seq, true);
}

// ---- pushes and gathers of the two kernels -------------------------------------

// Input vector v into slot `rank` of every peer's half (one_shot_lamport):
// cleaned, or (TAGGED) as region vectors 2v and 2v + 1 under tags `tag`
// and a.call_hash.
template <int DT, int NR, bool AL, bool TAGGED>
__device__ __forceinline__ void lamport_push(const dl_ar_args_t &a, int nr, int h, int64_t v, uint32_t tag) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 x = TAGGED ? ld_user<DT, AL>(a.in, v, a.n) : lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
  for (int i = 1; i < NRC; i++) {
    if (i >= nr) continue;
    char *dst = lamport_at(a, ring_buf(a, i), h, a.rank);
    if (TAGGED) {
      st_tagged(dst, 2 * v, x.x, x.y, tag, a.call_hash);
      st_tagged(dst, 2 * v + 1, x.z, x.w, tag, a.call_hash);
    } else {
      st_vec(dst, v, x);
    }
  }
}

// two_shot_lamport's slot p of rank q holds two slices of sv vectors: at
// [0, sv) slice q of p's input (the reduce-scatter's), at [sv, 2 sv) p's sum
// of slice p (the all-gather's); so a call of up to nranks / 2 slots runs in
// one piece (the slices at their own positions used 2 / nranks of a slot).

// Position j of every slice of our input into slot `rank` of the slice's
// owner's half, at j (two_shot_lamport).
template <int DT, int NR, bool AL>
__device__ __forceinline__ void lamport_scatter(const dl_ar_args_t &a, int nr, int h, int64_t sv, int64_t nv,
                                                int64_t j) {
  constexpr int NRC = shape<NR>::NRC;
#pragma unroll
  for (int i = 1; i < NRC; i++) {
    const int q = peer_after(a.rank, i, nr);
    const int64_t v = q * sv + j;
    if (i < nr && v < nv) st_vec(lamport_at(a, ring_buf(a, i), h, a.rank), j, lamport_clean(ld_user<DT, AL>(a.in, v, a.n)));
  }
}

// The sums of every other slice at position j (slot q's vector sv + j): poll, write out, empty.
template <int DT, int NR, bool AL>
__device__ __forceinline__ bool lamport_gather(const dl_ar_args_t &a, dl_ar_ctrl_t *self, int nr,
                                               int h, int64_t sv, int64_t nv, int64_t j, uint64_t t0,
                                               uint32_t seq) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 empty = lamport_empty();
#pragma unroll
  for (int i = 1; i < NRC; i++) {
    const int q = peer_after(a.rank, i, nr);
    const int64_t v = q * sv + j;
    if (!(i < nr && v < nv)) continue;
    char *src = lamport_at(a, ring_buf(a, 0), h, q);
    uint4 x;
    if (!lamport_wait(a, self, src, sv + j, q, t0, seq, x)) return false;
    st_user<DT, AL>(a.out, v, a.n, x);
    st_vec(src, sv + j, empty);
  }
  return true;
}

#endif
