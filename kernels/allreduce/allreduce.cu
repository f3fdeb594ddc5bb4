/*
 * allreduce.cu — sum all-reduce over symmetric buffers (CUDA IPC, no NVLink
 * multicast), for 2..8 ranks of one host, f32 / f16 / bf16 with fp32
 * accumulation in rank order (so every rank gets bit-identical results).
 *
 *   allreduce_one_shot_pipe_kernel  every rank gets every input and reduces it
 *                                   all. Warp-specialised and pipelined: half
 *                                   the warps copy the local input into this
 *                                   rank's staging (pull: the other half then
 *                                   reads the peers' staging) or write it into
 *                                   every peer's staging (push: the other half
 *                                   reads it locally), round after round, while
 *                                   the other half reduces the rounds that have
 *                                   arrived; in place or not.
 *   allreduce_one_shot_kernel       zero copy: the inputs already sit in every
 *                                   rank's buffer; read them all, reduce.
 *   allreduce_two_shot_kernel<PUSH> reduce-scatter by reading the peers' copies
 *                                   of this rank's slice, then all-gather by
 *                                   reading the peers' reduced slices (pull) or
 *                                   by writing this rank's reduced slice into
 *                                   every peer (push). Copy-in or zero-copy
 *                                   (in place in the buffer). two_shot_write
 *                                   (PUSH, no copy-in): every rank writes slice
 *                                   q of its input into rank q's staging slot
 *                                   `rank`, so the reduce-scatter reads only
 *                                   local memory and nothing is copied in.
 *   allreduce_one_shot_flat_kernel  one-shot push without roles: every thread
 *                                   pushes its part of a round, the block
 *                                   meets its peers, every thread reduces.
 *   allreduce_lamport_kernel        one-shot push without flags or fences:
 *                                   the peers' data is polled where it lands,
 *                                   against the sentinel its region is kept at
 *                                   (kernels/allreduce/allreduce.h), and emptied again.
 *   allreduce_two_shot_lamport_kernel  the same for two-shot: slices pushed
 *                                   to their owners, sums pushed back, both
 *                                   polled where they land.
 *
 * Work is cut in 16-byte vectors (the tail vector of a size that is not a
 * multiple is loaded and stored element by element) and in rounds: round k
 * of block b covers vectors [(k*G + b)*R, +R) (of the tensor, or of each
 * slice for two-shot), R = round_vecs, each thread U vectors T apart per step,
 * all loads of a step issued before the first use. A round's data only ever
 * flows between blocks of the same index on different ranks, so the
 * barriers are per block: block b of every rank meets block b of every
 * other (flags[b][from] in the peer's ctrl, counts that only grow; protocol
 * in kernels/common/signal_pad.h, buffer layout and the double buffering in
 * kernels/allreduce/allreduce.h).
 *
 * Every wait ends after a->timeout_ns: the first to time out records
 * {peer, expected, seen, block, algo, call} in a->status and the pad's
 * error[], the kernel finishes without touching data, and the host turns
 * the record into an error naming the op, the rank and the peer.
 *
 * Requirements: n >= 1; in/out aligned to 16 bytes for the vector path (the
 * AL=false instantiation moves them element by element); zero-copy inputs
 * at a 16-byte aligned offset, the same on every rank. Reference:
 * kernels/allreduce/cpu/allreduce.c (same arguments, same algorithm), checked by
 * spec/allreduce_spec.lua against an fp64 sum.
 */
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <string.h>

#include "allreduce.h"
#include "common/vec.cuh" // the 16-byte vectors of each dtype, unpacked to fp32
#include "common/dtype.h"

// ---- synchronisation --------------------------------------------------------------

// Vectors in flight per thread: enough loads to cover NVLink latency,
// registers for NR x U of them.
template <int NR> struct shape {
  enum { NRC = NR ? NR : DL_SIGNAL_MAX_RANKS, U = NR == 2 ? 4 : (NR == 3 || NR == 4) ? 2 : 1 };
};
#ifndef DL_AR_THREADS // a knob for the CPU emulation in experiments/lab/allreduce_emu
#define DL_AR_THREADS 512
#endif
enum { AR_THREADS = DL_AR_THREADS };

__device__ __forceinline__ dl_ar_ctrl_t *ctrl_of(char *buf) {
  return reinterpret_cast<dl_ar_ctrl_t *>(buf);
}

// Rank p's buffer without indexing the parameter block at run time (which
// would copy it to local memory).
__device__ __forceinline__ char *buf_of(const dl_ar_args_t &a, int p) {
  char *b = a.bufs[0];
#pragma unroll
  for (int q = 1; q < DL_SIGNAL_MAX_RANKS; q++)
    if (p == q) b = a.bufs[q];
  return b;
}

__device__ __forceinline__ char *staging(const dl_ar_args_t &a, int rank, int half, int slot) {
  return buf_of(a, rank) + a.staging_off + ((int64_t)half * a.nranks + slot) * a.slot_bytes;
}

// The first wait to time out on this rank records itself (pad and status).
__device__ __noinline__ void ar_fail(dl_signal_pad_t *pad, dl_ar_status_t *status, int algo,
                                     int peer, uint32_t expected, uint32_t seen, uint32_t seq) {
  if (atomicCAS(&pad->error[0], 0u, (uint32_t)DL_SIGNAL_ERR_BARRIER) != 0u) return;
  pad->error[1] = (uint32_t)peer;
  pad->error[2] = expected;
  pad->error[3] = seen;
  volatile dl_ar_status_t *s = status;
  s->peer = (uint32_t)peer;
  s->expected = expected;
  s->seen = seen;
  s->block = blockIdx.x;
  s->algo = (uint32_t)algo;
  s->seq = seq;
  __threadfence_system();
  s->kind = DL_SIGNAL_ERR_BARRIER;
  __threadfence_system();
}

// Block b of this rank meets block b of every other rank: this block's
// writes before it are visible to those blocks after it, and theirs here.
// Thread p (< nranks) keeps the count for peer p, signals it, waits for it.
__device__ __forceinline__ bool ar_barrier(const dl_ar_args_t &a, dl_ar_ctrl_t *self,
                                           uint32_t seq) {
  __syncthreads();
  bool ok = true;
  const int p = threadIdx.x;
  if (p < a.nranks && p != a.rank) {
    const uint32_t e = self->counts[blockIdx.x][p] + 1;
    self->counts[blockIdx.x][p] = e;
    dl_signal_store_release(&ctrl_of(buf_of(a, p))->flags[blockIdx.x][a.rank], e);
    uint32_t seen = 0;
    if (!dl_signal_wait_until(&self->flags[blockIdx.x][p], e, a.timeout_ns, &seen)) {
      ar_fail(a.pad, a.status, a.algo, p, e, seen, seq);
      ok = false;
    }
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

// Programmatic dependent launch (sm_90; no-ops elsewhere). A kernel launched
// with programmatic stream serialization may start before the grid ahead of
// it in the stream has finished: pdl_wait() returns once that grid has
// completed and its memory is visible, so it comes before any access.
// pdl_release() lets the grid after this one be scheduled now; it too waits
// for this grid's completion before it touches memory, so releasing early
// is safe, and it hides the launch of the next all-reduce of a sequence
// behind this one's tail.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The call counter: read by every block at its start, advanced by the last
// block to finish (each block counts itself after all its reads of seq).
__device__ __forceinline__ uint32_t ar_begin(dl_ar_ctrl_t *self) {
  pdl_wait();
  pdl_release();
  return *reinterpret_cast<volatile uint32_t *>(&self->seq);
}

__device__ __forceinline__ void ar_end(dl_ar_ctrl_t *self, uint32_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&self->done, 1u) == gridDim.x - 1) {
      *reinterpret_cast<volatile uint32_t *>(&self->done) = 0;
      *reinterpret_cast<volatile uint32_t *>(&self->seq) = seq + 1;
      __threadfence();
    }
  }
}

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

// ---- kernels --------------------------------------------------------------------

// Round k of block b covers vectors [(k*G + b)*R, +R) of the tensor (or of
// each slice), R = a.round_vecs (the core spreads the vectors evenly over
// blocks and rounds); in step s thread t handles the U vectors
// r0 + s*T*U + u*T + t, steps until the round is covered. Only the rounds are
// separated by barriers, so R trades barriers against overlap between the
// phases of blocks.

// Zero copy: every rank's input already in its buffer. Meet, read and
// reduce everything, meet again (so nobody rewrites its input while a peer
// still reads it).
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 2) allreduce_one_shot_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks;
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, a.rank));
  const uint32_t seq = ar_begin(self);
  const int64_t nv = vec_count<DT>(a.n);
  const char *src[NRC];
#pragma unroll
  for (int p = 0; p < NRC; p++) src[p] = p < nr ? a.bufs[p] + a.zc_off : nullptr;
  const int64_t per_step = (int64_t)blockDim.x * U;
  bool ok = ar_barrier(a, self, seq);
  for (int64_t s0 = blockIdx.x * per_step + threadIdx.x; ok && s0 < nv; s0 += per_step * gridDim.x) {
    uint4 x[U][NRC];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t v = s0 + (int64_t)u * blockDim.x;
#pragma unroll
      for (int p = 0; p < NRC; p++)
        if (p < nr && v < nv) x[u][p] = ld_vec(src[p], v);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t v = s0 + (int64_t)u * blockDim.x;
      if (v < nv) st_user<DT, AL>(a.out, v, a.n, reduce_vec<DT, NRC>(x[u], nr));
    }
  }
  if (ok) ar_barrier(a, self, seq);
  ar_end(self, seq);
}

// Copy-in (PUSH = false) and push (PUSH = true), pipelined: the first half
// of the block's warps produce round after round (copy the input into our
// staging, or write it into slot `rank` of every peer's staging) and signal
// each round to the peers (flags[block][rank] := base + k + 1) and to their
// own block (progress[block]); the other half consume: wait for round k from
// every peer and from their producers, then reduce it (our input read where
// it is, the peers' from their staging (pull) or ours (push)) into out. So
// NVLink traffic of round k+1 overlaps the reduction of round k, and an
// in-place output is written only after our producers have read the input.
template <int DT, int NR, bool AL, bool PUSH>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_pipe_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  const int half = blockDim.x / 2, b = blockIdx.x;
  const bool producer = threadIdx.x < half;
  const int t = producer ? threadIdx.x : threadIdx.x - half; // index within the role
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, me));
  const uint32_t seq = ar_begin(self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  // counts before this call: thread t < nr of each role keeps peer t's
  const uint32_t base = t < nr ? self->counts[b][t] : 0;
  const uint32_t base_me = self->counts[b][me];
  const int64_t per_step = (int64_t)half * U, per_round = a.round_vecs;
  uint32_t k = 0;
  bool ok = true;
  for (int64_t r0 = b * per_round; r0 < nv; r0 += per_round * gridDim.x, k++) {
    const int64_t r1 = r0 + per_round < nv ? r0 + per_round : nv;
    if (producer) {
      for (int64_t s0 = r0 + t; s0 < r1; s0 += per_step) {
        uint4 x[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t v = s0 + (int64_t)u * half;
          if (v < r1) x[u] = ld_user<DT, AL>(a.in, v, a.n);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t v = s0 + (int64_t)u * half;
          if (v >= r1) continue;
          if (PUSH) {
#pragma unroll
            for (int p = 0; p < NRC; p++)
              if (p < nr && p != me) st_vec(staging(a, p, h, me), v, x[u]);
          } else {
            st_vec(staging(a, me, h, 0), v, x[u]);
          }
        }
      }
      named_sync_and(1, half, true); // every producer's reads and writes of round k are issued
      if (t == 0) *reinterpret_cast<volatile uint32_t *>(&self->progress[b]) = base_me + k + 1;
      if (t < nr && t != me)
        dl_signal_store_release(&ctrl_of(buf_of(a, t))->flags[b][me], base + k + 1);
    } else {
      if (t < nr) {
        uint32_t seen = 0;
        if (t == me) { // our producers have read round k of the input
          if (!dl_signal_wait_until(&self->progress[b], base_me + k + 1, a.timeout_ns, &seen)) {
            ar_fail(a.pad, a.status, a.algo, me, base_me + k + 1, seen, seq);
            ok = false;
          }
        } else if (!dl_signal_wait_until(&self->flags[b][t], base + k + 1, a.timeout_ns, &seen)) {
          ar_fail(a.pad, a.status, a.algo, t, base + k + 1, seen, seq);
          ok = false;
        }
      }
      if (!(ok = named_sync_and(2, half, ok))) break;
      for (int64_t s0 = r0 + t; s0 < r1; s0 += per_step) {
        uint4 own[U], x[U][NRC];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t v = s0 + (int64_t)u * half;
          if (v < r1) own[u] = ld_user<DT, AL>(a.in, v, a.n);
#pragma unroll
          for (int p = 0; p < NRC; p++)
            if (p < nr && p != me && v < r1)
              x[u][p] = ld_vec(PUSH ? staging(a, me, h, p) : staging(a, p, h, 0), v);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t v = s0 + (int64_t)u * half;
          if (v < r1) st_user<DT, AL>(a.out, v, a.n, reduce_vec_own<DT, NRC>(x[u], nr, me, own[u]));
        }
      }
    }
  }
  __syncthreads();
  // k rounds were signalled and waited for: the counts move on by k
  if (threadIdx.x < nr) self->counts[b][threadIdx.x] = (threadIdx.x == me ? base_me : base) + k;
  ar_end(self, seq);
}

// Push without roles: round after round (at most a few), every thread of the
// block writes its vectors of the round into slot `rank` of every peer's
// staging, the block meets the same block of every peer, and every thread
// reduces the round (our input read where it is). Twice the stores in flight
// of the pipelined push, whose producers are half the block; no overlap
// between the rounds, so it suits sizes a grid covers in a round or two.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_flat_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, me));
  const uint32_t seq = ar_begin(self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t per_step = (int64_t)blockDim.x * U, per_round = a.round_vecs;
  for (int64_t r0 = blockIdx.x * per_round; r0 < nv; r0 += per_round * gridDim.x) {
    const int64_t r1 = r0 + per_round < nv ? r0 + per_round : nv;
    for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
      uint4 x[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
        if (v < r1) x[u] = ld_user<DT, AL>(a.in, v, a.n);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
#pragma unroll
        for (int p = 0; p < NRC; p++)
          if (p < nr && p != me && v < r1) st_vec(staging(a, p, h, me), v, x[u]);
      }
    }
    if (!ar_barrier(a, self, seq)) break;
    for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
      uint4 own[U], x[U][NRC];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
        if (v < r1) own[u] = ld_user<DT, AL>(a.in, v, a.n);
#pragma unroll
        for (int p = 0; p < NRC; p++)
          if (p < nr && p != me && v < r1) x[u][p] = ld_vec(staging(a, me, h, p), v);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
        if (v < r1) st_user<DT, AL>(a.out, v, a.n, reduce_vec_own<DT, NRC>(x[u], nr, me, own[u]));
      }
    }
  }
  ar_end(self, seq);
}

// Slices: slice q is vectors [q*sv, min((q+1)*sv, nv)), sv = ceil(nv / nranks).
// Rounds walk j in [0, sv); vector q*sv + j of every slice belongs to the
// same thread of the same block on every rank.
template <int DT, int NR, bool AL, bool PUSH, bool WRITE = false>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(buf_of(a, me));
  const uint32_t seq = ar_begin(self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t sv = (nv + nr - 1) / nr;
  // where each rank's input (then its reduced slice) lives
  char *buf[NRC];
#pragma unroll
  for (int p = 0; p < NRC; p++)
    buf[p] = p < nr ? (a.zero_copy ? a.bufs[p] + a.zc_off : staging(a, p, h, 0)) : nullptr;
  char *const mine = a.zero_copy ? buf_of(a, me) + a.zc_off : staging(a, me, h, 0);
  // two_shot_write: slice q of every rank p lands in rank q's slot p (slot 0
  // at q's own slice positions is then free for the all-gather's writes, which
  // go to the writer's slice positions: the two never overlap)
  const bool wr = PUSH && WRITE && !a.zero_copy; // an instantiation of its own: no registers for the others
  const int64_t per_step = (int64_t)blockDim.x * U, per_round = a.round_vecs;
  bool ok = true;
  for (int64_t r0 = blockIdx.x * per_round; r0 < sv; r0 += per_round * gridDim.x) {
    const int64_t r1 = r0 + per_round < sv ? r0 + per_round : sv;
    if (!a.zero_copy) { // copy-in: this round's part of every slice
      for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t j = s0 + (int64_t)u * blockDim.x;
#pragma unroll
          for (int q = 0; q < NRC; q++) {
            const int64_t v = (int64_t)q * sv + j;
            if (q < nr && j < r1 && v < nv) {
              if (!wr) st_vec(mine, v, ld_user<DT, AL>(a.in, v, a.n));
              else if (q != me) st_vec(staging(a, q, h, me), v, ld_user<DT, AL>(a.in, v, a.n));
            }
          }
        }
      }
    }
    if (!a.zero_copy || r0 == blockIdx.x * per_round)
      if (!(ok = ar_barrier(a, self, seq))) break;
    // reduce-scatter: our slice, from every rank
    for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
      uint4 x[U][NRC], own[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t j = s0 + (int64_t)u * blockDim.x, v = (int64_t)me * sv + j;
        if (wr && j < r1 && v < nv) own[u] = ld_user<DT, AL>(a.in, v, a.n);
#pragma unroll
        for (int p = 0; p < NRC; p++)
          if (p < nr && j < r1 && v < nv && !(wr && p == me))
            x[u][p] = ld_vec(wr ? staging(a, me, h, p) : buf[p], v);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t j = s0 + (int64_t)u * blockDim.x, v = (int64_t)me * sv + j;
        if (j < r1 && v < nv) {
          const uint4 y = wr ? reduce_vec_own<DT, NRC>(x[u], nr, me, own[u]) : reduce_vec<DT, NRC>(x[u], nr);
          if (a.zero_copy) {
            st_user<DT, true>(mine, v, a.n, y);
          } else {
            st_user<DT, AL>(a.out, v, a.n, y);
            if (!PUSH) st_vec(mine, v, y);
          }
          if (PUSH) {
#pragma unroll
            for (int p = 0; p < NRC; p++)
              if (p < nr && p != me) {
                if (a.zero_copy) st_user<DT, true>(buf[p], v, a.n, y);
                else st_vec(buf[p], v, y);
              }
          }
        }
      }
    }
    if (!(ok = ar_barrier(a, self, seq))) break;
    // all-gather: every other slice, read from its owner or from our buffer
    if (PUSH && a.zero_copy) continue;
    for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
      uint4 x[U][NRC];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t j = s0 + (int64_t)u * blockDim.x;
#pragma unroll
        for (int q = 0; q < NRC; q++) {
          const int64_t v = (int64_t)q * sv + j;
          if (q < nr && q != me && j < r1 && v < nv) x[u][q] = ld_vec(PUSH ? mine : buf[q], v);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t j = s0 + (int64_t)u * blockDim.x;
#pragma unroll
        for (int q = 0; q < NRC; q++) {
          const int64_t v = (int64_t)q * sv + j;
          if (q < nr && q != me && j < r1 && v < nv) {
            if (a.zero_copy) st_user<DT, true>(mine, v, a.n, x[u][q]);
            else st_user<DT, AL>(a.out, v, a.n, x[u][q]);
          }
        }
      }
    }
  }
  // zero-copy pull: peers may still read our reduced slice in the buffer
  if (ok && a.zero_copy && !PUSH) ar_barrier(a, self, seq);
  ar_end(self, seq);
}

// ---- Lamport one-shot ---------------------------------------------------------------

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
// Between polls after the first few: a nap of a->poll_ns, so that a grid of
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

// Push the input vectors (cleaned) into slot `rank` of every peer's lamport
// half, and, vector by vector, poll the peers' copies in our half until each
// is whole, reduce in rank order and empty them. Thread t of block b owns
// vectors j*T*G + b*T + t (a step j of the grid is T*G vectors), and pushes
// its step j + a.lamport_ahead before it reduces step j (0: every step
// first), so the reduction of arrived data overlaps the pushes still going
// out (2 H200s, 8 MB: 31.9 us with every step first, 29.2 with two ahead;
// allreduce-h200x2-knobs.md). A vector's push and reduction are in the same
// thread, so an in-place output is written only after its thread read the
// input. A wait that times out (or sees another thread's failure) records it
// and ends the kernel's work.
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

template <int DT, int NR, bool AL>
__device__ __forceinline__ void lamport_push(const dl_ar_args_t &a, int nr, int h, int64_t v) {
  constexpr int NRC = shape<NR>::NRC;
  const uint4 x = lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
  for (int p = 0; p < NRC; p++)
    if (p < nr && p != a.rank) st_vec(lamport(a, p, h, a.rank), v, x);
}

template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_lamport_kernel(const dl_ar_args_t a) {
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

// Two-shot without flags or fences, for more ranks than one-shot Lamport
// suits (it sends every input to every peer). Slice q of every rank's input
// goes into slot `rank` of rank q's lamport half, at the slice's own
// positions; rank q polls its slice from every peer, reduces it in rank
// order (cleaned, so every rank writes the same bits), writes it out and
// pushes it into slot q of every peer, again at the slice's positions; every
// rank polls the other slices' sums there and writes them out. In a rank's
// half, slot p holds p's share of our slice at our slice's positions and
// p's sum at p's: the two never meet. Every word is emptied by the rank that
// polled it. Thread t of block b owns position j = k*T*G + b*T + t of every
// slice; it scatters step k + a.lamport_ahead before it reduces step k, and
// reads the sums of step k one step later, when they have had time to land.
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

// ---- launchers ------------------------------------------------------------------

extern "C" void dl_allreduce_cuda_shape(int nranks, int *threads, int *unroll) {
  *threads = AR_THREADS;
  *unroll = nranks == 2   ? (int)shape<2>::U
            : nranks == 4 ? (int)shape<4>::U
            : nranks == 8 ? (int)shape<8>::U
                          : (int)shape<0>::U;
}

// One grid of kernel k with the arguments' shape (and programmatic stream
// serialization when a->pdl), its launch error checked.
static int go(void (*k)(const dl_ar_args_t), const dl_ar_args_t *a, cudaStream_t st, const char *what) {
#ifdef DL_AR_EMU
  k<<<a->blocks, a->threads, 0, st>>>(*a);
#else
  cudaLaunchAttribute attr;
  memset(&attr, 0, sizeof attr);
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDim = dim3((unsigned)a->blocks);
  cfg.blockDim = dim3((unsigned)a->threads);
  cfg.stream = st;
  cfg.attrs = &attr;
  cfg.numAttrs = a->pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, *a);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DL_ERR(DL_ECUDA, "launch of %s failed: %s", what, cudaGetErrorString(e));
  }
#endif
  DL_CUDA_CHECK_LAUNCH(what);
  return DL_OK;
}

template <int DT, int NR, bool AL> static int launch(const dl_ar_args_t *a, cudaStream_t st) {
  switch (a->algo) {
  case DL_AR_ONE_SHOT:
    if (a->zero_copy) return go(allreduce_one_shot_kernel<DT, NR, AL>, a, st, "allreduce_one_shot_kernel");
    return go(allreduce_one_shot_pipe_kernel<DT, NR, AL, false>, a, st, "allreduce_one_shot_pipe_kernel (copy-in)");
  case DL_AR_ONE_SHOT_PUSH:
    return go(allreduce_one_shot_pipe_kernel<DT, NR, AL, true>, a, st, "allreduce_one_shot_pipe_kernel (push)");
  case DL_AR_TWO_SHOT: return go(allreduce_two_shot_kernel<DT, NR, AL, false>, a, st, "allreduce_two_shot_kernel");
  case DL_AR_TWO_SHOT_PUSH:
    return go(allreduce_two_shot_kernel<DT, NR, AL, true>, a, st, "allreduce_two_shot_kernel (push)");
  case DL_AR_TWO_SHOT_WRITE:
    return go(allreduce_two_shot_kernel<DT, NR, AL, true, true>, a, st, "allreduce_two_shot_kernel (write)");
  case DL_AR_ONE_SHOT_LAMPORT: return go(allreduce_lamport_kernel<DT, NR, AL>, a, st, "allreduce_lamport_kernel");
  case DL_AR_TWO_SHOT_LAMPORT:
    return go(allreduce_two_shot_lamport_kernel<DT, NR, AL>, a, st, "allreduce_two_shot_lamport_kernel");
  case DL_AR_ONE_SHOT_PUSH_FLAT:
    return go(allreduce_one_shot_flat_kernel<DT, NR, AL>, a, st, "allreduce_one_shot_flat_kernel");
  default: return DL_ERR(DL_EINVAL, "allreduce: algorithm %d has no kernel", a->algo);
  }
}

template <int DT> static int launch_dt(const dl_ar_args_t *a, cudaStream_t st) {
  const int al = ((uintptr_t)a->in % DL_AR_VEC_BYTES == 0 || a->zero_copy) &&
                 (uintptr_t)a->out % DL_AR_VEC_BYTES == 0;
  if (!al) return launch<DT, 0, false>(a, st);
  switch (a->nranks) {
  case 2: return launch<DT, 2, true>(a, st);
  case 4: return launch<DT, 4, true>(a, st);
  case 8: return launch<DT, 8, true>(a, st);
  default: return launch<DT, 0, true>(a, st);
  }
}

extern "C" int dl_allreduce_cuda(const dl_ar_args_t *a, void *stream) {
  int threads, unroll;
  dl_allreduce_cuda_shape(a->nranks, &threads, &unroll);
  if (a->threads != threads || a->unroll != unroll || a->round_vecs < 1 || a->blocks < 1 ||
      a->blocks > DL_AR_MAX_BLOCKS || a->nranks < 2 || a->nranks > DL_SIGNAL_MAX_RANKS)
    return DL_ERR(DL_EINVAL, "allreduce: bad launch shape (%d blocks of %d threads, unroll %d, "
                  "%d vectors a round, %d ranks)", a->blocks, a->threads, a->unroll, a->round_vecs, a->nranks);
  cudaStream_t st = (cudaStream_t)stream;
  switch (a->dtype) {
  case DL_F32: return launch_dt<DL_F32>(a, st);
  case DL_F16: return launch_dt<DL_F16>(a, st);
  case DL_BF16: return launch_dt<DL_BF16>(a, st);
  default: return DL_ERR(DL_EUNSUPPORTED, "allreduce kernels: dtype %s (f32, f16, bf16 only)",
                         dl_dtype_name(a->dtype));
  }
}
