/*
 * allreduce_device.cuh — what the all-reduce kernel files (one_shot.cu,
 * two_shot.cu; their Lamport kernels also lamport.cuh) share, and what the
 * launcher (allreduce_launch.cu) needs of
 * them: the launch shape per world size, every rank's buffer, the per-block
 * barrier and the failure record, the call
 * counter, sums in rank order, and how each family's file picks the
 * instantiation of its kernel for a call (dl_ar_pick, DL_AR_PICK). No file
 * outside kernels/allreduce/ includes it (the CPU emulation in
 * experiments/lab/allreduce_emu compiles it with the kernel files).
 *
 * Work is cut in 16-byte vectors (the tail vector of a size that is not a
 * multiple is loaded and stored element by element) and in rounds: round k
 * of block b covers vectors [(k*G + b)*R, +R) (of the tensor, or of each
 * slice for two-shot), R = a.round_vecs, each thread U vectors T apart per
 * step, all loads of a step issued before the first use. A round's data only
 * ever flows between blocks of the same index on different ranks, so the
 * barriers are per block: block b of every rank meets block b of every
 * other (flags[b][from] in the peer's ctrl, counts that only grow; protocol
 * in kernels/common/signal_pad.h, buffer layout and the double buffering in
 * kernels/allreduce/allreduce.h). In step s of a round starting at r0,
 * thread t handles the U vectors r0 + s*T*U + u*T + t, steps until the round
 * is covered; the core spreads the vectors evenly over blocks and rounds.
 * Only the rounds are separated by barriers, so R trades barriers against
 * overlap between the phases of blocks.
 *
 * Every wait ends after a.timeout_ns: the first to time out records
 * {peer, expected, seen, block, algo, call} in a.status and the pad's
 * error[], the kernel finishes without touching data, and the host turns
 * the record into an error naming the op, the rank and the peer.
 */
#ifndef DISTLAB_ALLREDUCE_DEVICE_CUH
#define DISTLAB_ALLREDUCE_DEVICE_CUH

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "allreduce/allreduce.h"
#include "common/vec.cuh" // the 16-byte vectors of each dtype, unpacked to fp32
#include "common/dtype.h"
#include "common/pdl.cuh"
#include "common/pick.cuh"

// ---- shape, buffers, synchronisation ----------------------------------------------

// Vectors in flight per thread: enough loads to cover NVLink latency,
// registers for NR x U of them.
template <int NR> struct shape {
  enum { NRC = NR ? NR : DL_SIGNAL_MAX_RANKS, U = NR == 2 ? 4 : (NR == 3 || NR == 4) ? 2 : 1 };
};
#ifndef DL_AR_THREADS // a knob for the CPU emulation in experiments/lab/allreduce_emu
#define DL_AR_THREADS 512
#endif
enum { AR_THREADS = DL_AR_THREADS };
#ifndef DL_AR_WARP // the granularity of a Lamport kernel's block (the CPU emulation tries smaller ones)
#define DL_AR_WARP 32
#endif

__device__ __forceinline__ dl_ar_ctrl_t *ctrl_of(char *buf) {
  return reinterpret_cast<dl_ar_ctrl_t *>(buf);
}

// Rank p's buffer (dl_param_pick: no run-time index into the parameter block).
__device__ __forceinline__ char *buf_of(const dl_ar_args_t &a, int p) { return dl_param_pick(a.bufs, p); }

// The i-th rank after me (i = 0: me; 1 .. nr - 1 the peers), and its
// buffer (a.ring, dl_ar_args_ring; i known at compile time in the unrolled
// loops, so no search). Every loop that writes to each peer in turn goes
// in this order, so that the ranks' first writes go to different ranks
// rather than all to rank 0, then all to rank 1 (measured:
// experiments/results/allreduce/NOTES.md, peer order).
__device__ __forceinline__ int peer_after(int me, int i, int nr) {
  const int q = me + i;
  return q >= nr ? q - nr : q;
}
__device__ __forceinline__ char *ring_buf(const dl_ar_args_t &a, int i) { return dl_param_pick(a.ring, i); }

// Staging slot `slot` of half `half` in the buffer at base.
__device__ __forceinline__ char *staging_at(const dl_ar_args_t &a, char *base, int half, int slot) {
  return base + a.staging_off + ((int64_t)half * a.nranks + slot) * a.slot_bytes;
}

__device__ __forceinline__ char *staging(const dl_ar_args_t &a, int rank, int half, int slot) {
  return staging_at(a, buf_of(a, rank), half, slot);
}

#ifndef DL_AR_EMU // the CPU emulation brings its own
// Between polls after the first few: a nap of ns, so that a grid of pollers
// waiting for data still on its way does not crowd the memory it lands in.
#define DL_AR_POLL_PAUSE(spins, ns) \
  do {                              \
    if ((spins) > 8 && (ns) > 0) __nanosleep(ns); \
  } while (0)
#endif

// This call as every rank describes it to the others (dl_ar_call_t), as 8
// words: word 0 is 1 + seq, the marker a peer polls for.
__device__ __forceinline__ void ar_call_words(const dl_ar_args_t &a, uint32_t seq, uint32_t (&w)[8]) {
  dl_ar_call_t c = dl_ar_call_of(&a);
  c.seq = seq + 1;
  memcpy(w, &c, sizeof w);
}

// The failure paths take plain values, never the parameter block by
// reference: a __noinline__ function given the block's address makes every
// thread of every kernel copy the whole block (216 bytes) into local memory
// at its start and read its parameters from there ever after.

// The first failure of this rank records itself (pad and status): true for
// the thread that recorded it.
static __device__ __noinline__ bool ar_record(dl_signal_pad_t *pad, dl_ar_status_t *status, uint32_t algo,
                                              uint32_t kind, uint32_t block, int peer, uint32_t expected,
                                              uint32_t seen, uint32_t seq, const uint32_t *mine,
                                              const uint32_t *theirs) {
  if (atomicCAS(&pad->error[0], 0u, kind) != 0u) return false;
  pad->error[1] = (uint32_t)peer;
  pad->error[2] = expected;
  pad->error[3] = seen;
  volatile dl_ar_status_t *s = status;
  s->peer = (uint32_t)peer;
  s->expected = expected;
  s->seen = seen;
  s->block = block;
  s->algo = algo;
  s->seq = seq;
  if (mine && theirs)
    for (int i = 0; i < 8; i++) {
      reinterpret_cast<volatile uint32_t *>(&s->mine)[i] = mine[i];
      reinterpret_cast<volatile uint32_t *>(&s->theirs)[i] = theirs[i];
    }
  __threadfence_system();
  s->kind = kind;
  return true;
}

// The first failure of this rank records itself (ar_record); unless it is a
// peer's abort, every peer is told to give up too (its ctrl.abort), so no
// peer completes a call against this rank's abandoned one.
__device__ __forceinline__ void ar_fail(const dl_ar_args_t &a, uint32_t kind, uint32_t block, int peer,
                                        uint32_t expected, uint32_t seen, uint32_t seq,
                                        const uint32_t *mine = nullptr, const uint32_t *theirs = nullptr) {
  if (!ar_record(a.pad, a.status, (uint32_t)a.algo, kind, block, peer, expected, seen, seq, mine, theirs)) return;
  if (kind != DL_AR_FAIL_ABORT)
    for (int p = 0; p < a.nranks; p++)
      if (p != a.rank) dl_signal_store_release(&ctrl_of(buf_of(a, p))->abort, (uint32_t)a.rank + 1);
  __threadfence_system();
}

// Which failure, if any, ends a wait (on peer, begun at t0) now: 0 none;
// else kind | (1 + the rank it names) << 16, kind DL_AR_STOP_SEEN where
// another thread of this rank failed already (recorded). A peer gave up,
// the host saw a peer's process die, or the timeout expired.
//
// The watchdog's word (status->gone) is host memory: a read crosses PCIe.
// It is read only once a wait has lasted 100 us, and then by at most one
// waiting thread of a block per gone_gap_ns (a block-wide clock in shared
// memory, taken by compare-and-swap; garbage at the kernel's start delays
// one read). Every waiting thread reading it (gone_gap_ns 0) puts tens of
// thousands of reads on PCIe when a Lamport grid waits: they take
// milliseconds to drain, the late rank's peers then wait past 100 us in
// turn, and back-to-back calls stay milliseconds slow.
#define DL_AR_STOP_SEEN 0xffffu
static __device__ __noinline__ uint32_t ar_stop_kind(dl_signal_pad_t *pad, dl_ar_ctrl_t *self,
                                                     dl_ar_status_t *status, uint64_t timeout_ns, uint64_t t0,
                                                     int peer, uint32_t gone_gap_ns) {
  if (*reinterpret_cast<volatile uint32_t *>(&pad->error[0]) != 0u) return DL_AR_STOP_SEEN;
  const uint32_t ab = *reinterpret_cast<volatile uint32_t *>(&self->abort);
  if (ab) return DL_AR_FAIL_ABORT | ab << 16;
  const uint64_t now = dl_signal_clock_ns(), waited = now - t0;
  if (waited > 100000) {
    // when a thread of this block last read the host's word: atomics, so that the one thread
    // whose compare-and-swap wins reads it (racecheck saw the plain read and write race)
    __shared__ unsigned long long host_read_at;
    const unsigned long long last = atomicAdd(&host_read_at, 0ull);
    if (now - last >= gone_gap_ns && atomicCAS(&host_read_at, last, (unsigned long long)now) == last) {
      const uint32_t gone = reinterpret_cast<volatile dl_ar_status_t *>(status)->gone;
      if (gone) return DL_AR_FAIL_DEAD | gone << 16;
    }
  }
  if (waited > timeout_ns) return DL_AR_FAIL_TIMEOUT | (uint32_t)(peer + 1) << 16;
  return 0;
}

// Whether a wait (on peer, begun at t0) must end now, recorded (ar_stop_kind).
__device__ __forceinline__ bool ar_stop(const dl_ar_args_t &a, dl_ar_ctrl_t *self, uint64_t t0, int peer,
                                        uint32_t expected, uint32_t seen, uint32_t seq, uint32_t block) {
  const uint32_t r = ar_stop_kind(a.pad, self, a.status, a.timeout_ns, t0, peer, a.gone_gap_ns);
  if (r == 0) return false;
  if ((r & 0xffffu) != DL_AR_STOP_SEEN) ar_fail(a, r & 0xffffu, block, (int)(r >> 16) - 1, expected, seen, seq);
  return true;
}

// One thread waits until the count *p (peer's signal) reaches v; false once
// ar_stop says so.
__device__ __forceinline__ bool ar_wait(const dl_ar_args_t &a, dl_ar_ctrl_t *self, const uint32_t *p, uint32_t v,
                                        int peer, uint32_t seq) {
  const uint64_t t0 = dl_signal_clock_ns();
  uint32_t x;
  for (int spins = 1; !DL_SIGNAL_REACHED(x = dl_signal_load_acquire(p), v); spins++) {
    if (spins % 64 == 0) {
      DL_AR_POLL_PAUSE(spins, 0);
      if (ar_stop(a, self, t0, peer, v, x, seq, blockIdx.x)) return false;
    }
  }
  return true;
}

// Block 0, thread p (< nranks): this call into peer p's ctrl at the start of
// every kernel, each word tagged with the call's seq (dl_ar_call_wire_t): no
// fence, no order among the stores. Thread `rank` keeps a copy in our own
// ctrl, for the host's report of a peer that gave up (core: abort_was_mismatch).
__device__ __forceinline__ void ar_announce(const dl_ar_args_t &a, uint32_t seq) {
  const int p = threadIdx.x;
  if (blockIdx.x != 0 || p >= a.nranks) return;
  uint32_t w[8];
  ar_call_words(a, seq, w);
  volatile uint64_t *dst = ctrl_of(buf_of(a, p))->calls[seq & 1][a.rank].w;
#pragma unroll
  for (int i = 0; i < 8; i++) dst[i] = dl_ar_call_wire_word(w[0], w[i]);
}

// Peer p's entry for call seq (read once): true once every word carries
// tag (1 + seq), its words then in theirs; x the tag of the first word that did not.
__device__ __forceinline__ bool ar_call_read(const dl_ar_ctrl_t *self, int p, uint32_t seq, uint32_t tag,
                                             uint32_t (&theirs)[8], uint32_t &x) {
  const uint64_t *in = self->calls[seq & 1][p].w;
  uint64_t v[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
  for (int i = 0; i < 8; i += 2) // four 16-byte loads in flight
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v[i]), "=l"(v[i + 1]) : "l"(in + i) : "memory");
#else
  for (int i = 0; i < 8; i++) v[i] = reinterpret_cast<const volatile uint64_t *>(in)[i];
#endif
  bool here = true;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    theirs[i] = (uint32_t)v[i];
    if (here && (uint32_t)(v[i] >> 32) != tag) {
      here = false;
      x = (uint32_t)(v[i] >> 32);
    }
  }
  return here;
}

// Peer p's call, read once: 1 here and the same as ours (mine: ar_call_words),
// 0 not here yet, -1 here and different (recorded: the mismatch, both calls;
// also when the same if always: a tagged vector of p said another call).
__device__ __forceinline__ int ar_call_peek(const dl_ar_args_t &a, dl_ar_ctrl_t *self, int p, uint32_t seq,
                                            const uint32_t (&mine)[8], uint32_t &x, bool always = false) {
  uint32_t theirs[8];
  if (!ar_call_read(self, p, seq, mine[0], theirs, x)) return 0;
  bool same = true;
#pragma unroll
  for (int i = 1; i < 8; i++) same = same && theirs[i] == mine[i];
  if (same && !always) return 1;
  uint32_t m[8], t[8]; // the record's copies: only this path keeps words in local memory
#pragma unroll
  for (int i = 0; i < 8; i++) m[i] = mine[i], t[i] = theirs[i];
  ar_fail(a, DL_AR_FAIL_MISMATCH, blockIdx.x, p, mine[0], mine[0], seq, m, t);
  return -1;
}

// One thread, before it first reads what peer p sent in this call: wait for
// p's call (ar_announce) and compare it with ours; false (recorded) when
// they differ or the wait ends (always: a mismatch recorded in any case, the
// calls in the record, once p's is here).
__device__ __forceinline__ bool ar_agree(const dl_ar_args_t &a, dl_ar_ctrl_t *self, int p, uint32_t seq,
                                         bool always = false) {
  uint32_t mine[8];
  ar_call_words(a, seq, mine);
  const uint64_t t0 = dl_signal_clock_ns();
  uint32_t x = 0;
  int got;
  for (int spins = 1; (got = ar_call_peek(a, self, p, seq, mine, x, always)) == 0; spins++) {
    // a nap between polls after the first few: a grid's pollers crowd the
    // line the call lands in (the Lamport kernels poll it before their data)
    DL_AR_POLL_PAUSE(spins, a.poll_ns);
    if (spins % 64 == 0) {
      // a peer that saw the mismatch first gives up at once: its call, once
      // here, says more than its abort
      if (*reinterpret_cast<volatile uint32_t *>(&self->abort) != 0u &&
          (got = ar_call_peek(a, self, p, seq, mine, x, always)) != 0)
        break;
      if (ar_stop(a, self, t0, p, seq + 1, x, seq, DL_AR_BLOCK_CALL)) return false;
    }
  }
  return got > 0;
}

// Block b of this rank meets block b of every other rank: this block's
// writes before it are visible to those blocks after it, and theirs here.
// Thread p (< nranks) keeps the count for peer p, signals it, waits for it;
// at a call's first barrier (first) it then compares p's call with ours.
__device__ __forceinline__ bool ar_barrier(const dl_ar_args_t &a, dl_ar_ctrl_t *self,
                                           uint32_t seq, bool first = false) {
  __syncthreads();
  bool ok = true;
  const int p = threadIdx.x;
  if (p < a.nranks && p != a.rank) {
    const uint32_t e = self->counts[blockIdx.x][p] + 1;
    self->counts[blockIdx.x][p] = e;
    dl_signal_store_release(&ctrl_of(buf_of(a, p))->flags[blockIdx.x][a.rank], e);
    ok = ar_wait(a, self, &self->flags[blockIdx.x][p], e, p, seq);
    if (ok && first) ok = ar_agree(a, self, p, seq);
  }
  return __syncthreads_and(ok);
}

// Threads of one role (n of them, warps whole) meet at barrier `id` (1..15);
// true in all of them if pred held in all.
#ifndef DL_AR_EMU_NAMED_SYNC // the CPU emulation brings its own
__device__ __forceinline__ bool named_sync_and(int id, int n, bool pred) {
  uint32_t out;
  asm volatile("{\n\t.reg .pred p, q;\n\tsetp.ne.u32 q, %1, 0;\n\t"
               "bar.red.and.pred p, %2, %3, q;\n\tselp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(out)
               : "r"((uint32_t)pred), "r"(id), "r"(n)
               : "memory");
  return out != 0;
}
#endif

// The call counter: read by every block at its start, advanced by the last
// block to finish (each block counts itself after all its reads of seq).
// Block 0 announces the call to the peers (ar_announce).
__device__ __forceinline__ uint32_t ar_begin(const dl_ar_args_t &a, dl_ar_ctrl_t *self, bool announce = true) {
  dl_pdl_wait(); // programmatic dependent launch: common/pdl.cuh
  dl_pdl_release();
  const uint32_t seq = *reinterpret_cast<volatile uint32_t *>(&self->seq);
  if (announce) ar_announce(a, seq);
  return seq;
}

// The abort word (a peer gave up: ar_fail) as thread 0 of a block reads it
// for ar_end (0 in the other threads).
__device__ __forceinline__ uint32_t ar_abort_peek(const dl_ar_ctrl_t *self) {
  return threadIdx.x == 0 ? *reinterpret_cast<const volatile uint32_t *>(&self->abort) : 0u;
}

// A peer that gave up while this block passed its last signal voids the
// call here too (recorded; the host reports it at the next run or check).
// ab: the abort word as ar_abort_peek read it once the block's waits were
// under way (one_shot_lamport: before its polls, so that the read's round
// trip hides under them; experiments/results/allreduce/NOTES.md). A peer
// that gives up after that read either pushed all its
// data first (this call's sums are right; the next call's read sees the
// word) or leaves a wait here that stops on the word (ar_stop).
__device__ __forceinline__ void ar_end(const dl_ar_args_t &a, dl_ar_ctrl_t *self, uint32_t seq, uint32_t ab) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (ab && *reinterpret_cast<volatile uint32_t *>(&a.pad->error[0]) == 0u)
      ar_fail(a, DL_AR_FAIL_ABORT, blockIdx.x, (int)ab - 1, 0, 0, seq);
    __threadfence();
    if (atomicAdd(&self->done, 1u) == gridDim.x - 1) {
      *reinterpret_cast<volatile uint32_t *>(&self->done) = 0;
      *reinterpret_cast<volatile uint32_t *>(&self->seq) = seq + 1;
      __threadfence();
    }
  }
}
// The same, the abort word read before the block's barrier, so that its round
// trip overlaps the wait for the block's last threads.
__device__ __forceinline__ void ar_end(const dl_ar_args_t &a, dl_ar_ctrl_t *self, uint32_t seq) {
  ar_end(a, self, seq, ar_abort_peek(self));
}

// ---- vectors and sums ------------------------------------------------------------

// Number of 16-byte vectors holding n elements.
template <int DT> __device__ __forceinline__ int64_t vec_count(int64_t n) {
  return (n + vt<DT>::L - 1) / vt<DT>::L;
}

// Sum x[0..nr) in rank order into one vector.
template <int DT, int NRC>
__device__ __forceinline__ uint4 reduce_vec(const uint4 (&x)[NRC], int nr) {
  float acc[vt<DT>::L];
  vt<DT>::first(acc, x[0]);
#pragma unroll
  for (int p = 1; p < NRC; p++)
    if (p < nr) vt<DT>::add(acc, x[p]);
  return vt<DT>::pack(acc);
}

// The same with rank me's term taken from `own` instead of x[me].
template <int DT, int NRC>
__device__ __forceinline__ uint4 reduce_vec_own(const uint4 (&x)[NRC], int nr, int me,
                                                uint4 own) {
  float acc[vt<DT>::L];
  uint4 y = x[0];
  if (me == 0) y = own;
  vt<DT>::first(acc, y);
#pragma unroll
  for (int p = 1; p < NRC; p++) {
    if (p < nr) {
      y = x[p];
      if (p == me) y = own;
      vt<DT>::add(acc, y);
    }
  }
  return vt<DT>::pack(acc);
}

// ---- the kernels ------------------------------------------------------------------

// A kernel instantiated for one dtype (DT), world size (NR; 0: read at run
// time) and alignment (AL: in and out 16-byte aligned). One kernel per
// algorithm a user names, allreduce_<algo>_kernel (one_shot has a second,
// allreduce_one_shot_zero_copy_kernel, for an input already in the
// zero-copy region).
typedef void (*dl_ar_kernel_t)(const dl_ar_args_t);

// Names one instantiation of a kernel, for the pickers below.
template <int DT, int NR, bool AL> struct dl_ar_inst {};

// of(dl_ar_inst<DT, NR, AL>()) for a's dtype, world size and alignment:
// every dtype; world sizes 2, 4, 8 and any other when in and out are
// aligned, any size when not. NULL for a dtype the kernels lack.
template <int DT, class F> dl_ar_kernel_t dl_ar_pick_ranks(const dl_ar_args_t *a, F of) {
  const bool al = ((uintptr_t)a->in % DL_AR_VEC_BYTES == 0 || a->zero_copy) &&
                  (uintptr_t)a->out % DL_AR_VEC_BYTES == 0;
  if (!al) return of(dl_ar_inst<DT, 0, false>());
  switch (a->nranks) {
  case 2: return of(dl_ar_inst<DT, 2, true>());
  case 4: return of(dl_ar_inst<DT, 4, true>());
  case 8: return of(dl_ar_inst<DT, 8, true>());
  default: return of(dl_ar_inst<DT, 0, true>());
  }
}
template <class F> dl_ar_kernel_t dl_ar_pick(const dl_ar_args_t *a, F of) {
  switch (a->dtype) {
  case DL_F32: return dl_ar_pick_ranks<DL_F32>(a, of);
  case DL_F16: return dl_ar_pick_ranks<DL_F16>(a, of);
  case DL_BF16: return dl_ar_pick_ranks<DL_BF16>(a, of);
  default: return nullptr;
  }
}

// A kernel picked for a call, and its name for errors.
struct dl_ar_picked_t {
  dl_ar_kernel_t kernel;
  const char *name;
};

// Kernel template `kernel` instantiated for a: DL_AR_PICK(a, allreduce_two_shot_kernel).
#define DL_AR_PICK(a, kernel) \
  dl_ar_picked_t{dl_ar_pick((a), []<int DT, int NR, bool AL>(dl_ar_inst<DT, NR, AL>) { return kernel<DT, NR, AL>; }), #kernel}

// The kernel of a->algo picked for a, by the file of its family (NULL for an
// algorithm of another family). There, not in the launcher: nvcc wants a
// kernel template instantiated in the file that defines it.
dl_ar_picked_t dl_ar_one_shot_kernel(const dl_ar_args_t *a); // one_shot.cu
dl_ar_picked_t dl_ar_two_shot_kernel(const dl_ar_args_t *a); // two_shot.cu

#endif
