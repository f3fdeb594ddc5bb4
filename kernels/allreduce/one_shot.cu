/*
 * one_shot.cu — the one-shot all-reduces over symmetric buffers: every rank
 * gets every input and reduces all of them, so one trip over NVLink and n x
 * the reads (or writes) of a two-shot: the choice for small and mid sizes.
 * f32 / f16 / bf16 summed in fp32 in rank order, so every rank gets the same
 * bits.
 *
 *   one_shot            copy-in, pipelined (one_shot_pipe): half the warps
 *                       copy the input into this rank's staging round after
 *                       round, the other half read the peers' staging and
 *                       reduce the rounds that have arrived. An input already
 *                       in the zero-copy region runs the zero-copy kernel:
 *                       read every rank's buffer, reduce.
 *   one_shot_push       push, pipelined: half the warps write the input into
 *                       every peer's staging, the other half reduce what
 *                       arrived in ours, locally.
 *   one_shot_push_flat  push without roles: every thread pushes its part of
 *                       a round, the block meets its peers, every thread
 *                       reduces.
 *   one_shot_lamport    push into every peer's Lamport region, poll the
 *                       peers' copies in ours: no flags, no fences
 *                       (lamport.cuh); small calls as tagged vectors, whose
 *                       tags say which call sent them (allreduce.h).
 *
 * Requirements: n >= 1; in/out aligned to 16 bytes for the vector path (the
 * AL=false instantiation moves them element by element); a zero-copy input
 * at a 16-byte aligned offset, the same on every rank, and the output
 * elsewhere; the Lamport kernel's own in lamport.cuh. Shared helpers and the
 * scheme of rounds and barriers: allreduce_device.cuh. Reference: kernels/allreduce/cpu/allreduce.c (same
 * arguments, same algorithm), checked by spec/allreduce_spec.lua against an
 * fp64 sum.
 */
#include "allreduce/lamport.cuh"

// ---- kernels --------------------------------------------------------------------

// one_shot, zero copy: every rank's input already in its buffer. Meet, read
// and reduce everything, meet again (so nobody rewrites its input while a
// peer still reads it).
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 2) allreduce_one_shot_zero_copy_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks;
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self);
  const int64_t nv = vec_count<DT>(a.n);
  const char *src[NRC];
#pragma unroll
  for (int p = 0; p < NRC; p++) src[p] = p < nr ? a.bufs[p] + a.zc_off : nullptr;
  const int64_t per_step = (int64_t)blockDim.x * U;
  bool ok = ar_barrier(a, self, seq, true);
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
  ar_end(a, self, seq);
}

// The pipelined one-shot, copy-in (PUSH = false) and push (PUSH = true): the
// first half of the block's warps produce round after round (copy the input
// into our staging, or write it into slot `rank` of every peer's staging) and
// signal each round to the peers (flags[block][rank] := base + k + 1) and to
// their own block (progress[block]); the other half consume: wait for round k
// from every peer and from their producers, then reduce it (our input read
// where it is, the peers' from their staging (pull) or ours (push)) into out.
// So NVLink traffic of round k+1 overlaps the reduction of round k, and an
// in-place output is written only after our producers have read the input.
template <int DT, int NR, bool AL, bool PUSH>
__device__ __forceinline__ void one_shot_pipe(const dl_ar_args_t &a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  const int half = blockDim.x / 2, b = blockIdx.x;
  const bool producer = threadIdx.x < half;
  const int t = producer ? threadIdx.x : threadIdx.x - half; // index within the role
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self);
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
            for (int i = 1; i < NRC; i++)
              if (i < nr) st_vec(staging_at(a, ring_buf(a, i), h, me), v, x[u]);
          } else {
            st_vec(staging_at(a, ring_buf(a, 0), h, 0), v, x[u]);
          }
        }
      }
      named_sync_and(1, half, true); // every producer's reads and writes of round k are issued
      if (t == 0) *reinterpret_cast<volatile uint32_t *>(&self->progress[b]) = base_me + k + 1;
      if (t < nr && t != me)
        dl_signal_store_release(&ctrl_of(buf_of(a, t))->flags[b][me], base + k + 1);
    } else {
      if (t < nr) {
        if (t == me) // our producers have read round k of the input
          ok = ar_wait(a, self, &self->progress[b], base_me + k + 1, me, seq);
        else // peer t's round k has arrived; before its first, its call is compared with ours
          ok = ar_wait(a, self, &self->flags[b][t], base + k + 1, t, seq) && (k > 0 || ar_agree(a, self, t, seq));
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
              x[u][p] = ld_vec(PUSH ? staging_at(a, ring_buf(a, 0), h, p) : staging(a, p, h, 0), v);
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
  ar_end(a, self, seq);
}

// one_shot, copy-in: the pipelined one-shot pulling from the peers' staging.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_kernel(const dl_ar_args_t a) {
  one_shot_pipe<DT, NR, AL, false>(a);
}

// one_shot_push: the pipelined one-shot writing into the peers' staging.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_push_kernel(const dl_ar_args_t a) {
  one_shot_pipe<DT, NR, AL, true>(a);
}

// one_shot_push_flat, push without roles: round after round (at most a
// few), every thread of the block writes its vectors of the round into slot
// `rank` of every peer's staging, the block meets the same block of every
// peer, and every thread reduces the round (our input read where it is).
// Twice the stores in flight of the pipelined push, whose producers are half
// the block; no overlap between the rounds, so it suits sizes a grid covers
// in a round or two.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_one_shot_push_flat_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self);
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
        for (int i = 1; i < NRC; i++)
          if (i < nr && v < r1) st_vec(staging_at(a, ring_buf(a, i), h, me), v, x[u]);
      }
    }
    if (!ar_barrier(a, self, seq, r0 == blockIdx.x * per_round)) break;
    for (int64_t s0 = r0 + threadIdx.x; s0 < r1; s0 += per_step) {
      uint4 own[U], x[U][NRC];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
        if (v < r1) own[u] = ld_user<DT, AL>(a.in, v, a.n);
#pragma unroll
        for (int p = 0; p < NRC; p++)
          if (p < nr && p != me && v < r1) x[u][p] = ld_vec(staging_at(a, ring_buf(a, 0), h, p), v);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t v = s0 + (int64_t)u * blockDim.x;
        if (v < r1) st_user<DT, AL>(a.out, v, a.n, reduce_vec_own<DT, NRC>(x[u], nr, me, own[u]));
      }
    }
  }
  ar_end(a, self, seq);
}


// one_shot_lamport: push the input vectors (cleaned) into slot `rank` of
// every peer's lamport half, and, vector by vector, poll the peers' copies in
// our half until each is whole, reduce in rank order and empty them. Thread
// t of block b owns vectors j*T*G + b*T + t (a step j of the grid is T*G
// vectors), and pushes its step j + a.lamport_ahead before it reduces step j
// (0: every step first), so the reduction of arrived data overlaps the
// pushes still going out. A vector's push and reduction
// are in the same thread, so an in-place output is written only after its
// thread read the input. A wait that times out (or sees another thread's
// failure) records it and ends the kernel's work.
//
// Untagged, the peers' calls are compared with ours before their data is
// read: thread p of a block with work compares peer p's, the block waits for
// all (its other threads idle at the barrier, not polling the lines the data
// lands in). TAGGED (small calls, a.tagged): every vector says which call
// sent it (allreduce.h), so each thread checks the tags of what it polls and
// nothing waits for a call. The variants measured against these:
// experiments/results/allreduce/NOTES.md (Lamport kernels).
template <int DT, int NR, bool AL, bool TAGGED>
__device__ __forceinline__ void one_shot_lamport(const dl_ar_args_t &a) {
  constexpr int NRC = shape<NR>::NRC;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self, !TAGGED);
  const int h = seq & 1;
  const uint32_t tag = dl_ar_tag_seq(seq);
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t next = first; // the next vector to push
  for (int j = 0; (a.lamport_ahead <= 0 || j < a.lamport_ahead) && next < nv; j++, next += stride)
    lamport_push<DT, NR, AL, TAGGED>(a, nr, h, next, tag);
  if (TAGGED) ar_announce(a, seq); // for the failure paths only: after the data, not ahead of it
  const uint32_t ab = ar_abort_peek(self); // for ar_end, its round trip under the polls
  const uint4 empty = lamport_empty();
  const uint64_t t0 = dl_signal_clock_ns();
  bool ok = true;
  if (!TAGGED) {
    const int q = threadIdx.x;
    if (q < nr && q != me && (int64_t)blockIdx.x * blockDim.x < nv) ok = ar_agree(a, self, q, seq);
    ok = __syncthreads_and(ok);
  }
  int64_t v = first;
  int why = LAMPORT_OK, peer = 0; // TAGGED: how and where a wait ended
  for (; ok && v < nv; v += stride) {
    if (next < nv) {
      lamport_push<DT, NR, AL, TAGGED>(a, nr, h, next, tag);
      next += stride;
    }
    uint4 x[NRC];
    const uint4 own = TAGGED ? ld_user<DT, AL>(a.in, v, a.n) : lamport_clean(ld_user<DT, AL>(a.in, v, a.n));
#pragma unroll
    for (int p = 0; p < NRC; p++) {
      if (!(p < nr && p != me && ok)) continue;
      const char *src = lamport_at(a, ring_buf(a, 0), h, p);
      if (TAGGED) {
        why = lamport_wait_tagged(a, self, src, v, p, t0, seq, tag, x[p]);
        ok = why == LAMPORT_OK;
        peer = p;
      } else {
        ok = lamport_wait(a, self, src, v, p, t0, seq, x[p]);
      }
    }
    if (!ok) break;
    st_user<DT, AL>(a.out, v, a.n, reduce_vec_own<DT, NRC>(x, nr, me, own));
#pragma unroll
    for (int p = 0; p < NRC; p++) {
      if (!(p < nr && p != me)) continue;
      char *src = lamport_at(a, ring_buf(a, 0), h, p);
      if (TAGGED) {
        st_vec(src, 2 * v, empty);
        st_vec(src, 2 * v + 1, empty);
      } else {
        st_vec(src, v, empty);
      }
    }
  }
  if (TAGGED && why != LAMPORT_OK) lamport_tagged_fail(a, self, why, peer, v, t0, seq);
  ar_end(a, self, seq, ab);
}

// Two blocks of AR_THREADS a multiprocessor at 2 ranks (no spills), so
// that a grid of twice the multiprocessors is resident at once (on two waves
// of blocks a call could stall for a wave); one at other counts, where the
// bound spilled or cost time, and the tuned grids keep to one wave
// (experiments/results/allreduce/NOTES.md, Lamport occupancy).
template <int NR> struct lamport_occupancy {
  enum { BLOCKS = NR == 2 ? 2 : 1 };
};

template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, lamport_occupancy<NR>::BLOCKS)
    allreduce_one_shot_lamport_kernel(const dl_ar_args_t a) {
  one_shot_lamport<DT, NR, AL, false>(a);
}

// one_shot_lamport with tagged vectors (a.tagged: 2 x the input fits a lamport slot).
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, lamport_occupancy<NR>::BLOCKS)
    allreduce_one_shot_lamport_tagged_kernel(const dl_ar_args_t a) {
  one_shot_lamport<DT, NR, AL, true>(a);
}

// ---- launcher -----------------------------------------------------------------

dl_ar_picked_t dl_ar_one_shot_kernel(const dl_ar_args_t *a) {
  switch (a->algo) {
  case DL_AR_ONE_SHOT:
    if (a->zero_copy) return DL_AR_PICK(a, allreduce_one_shot_zero_copy_kernel);
    return DL_AR_PICK(a, allreduce_one_shot_kernel);
  case DL_AR_ONE_SHOT_PUSH: return DL_AR_PICK(a, allreduce_one_shot_push_kernel);
  case DL_AR_ONE_SHOT_PUSH_FLAT: return DL_AR_PICK(a, allreduce_one_shot_push_flat_kernel);
  case DL_AR_ONE_SHOT_LAMPORT:
    if (a->tagged) return DL_AR_PICK(a, allreduce_one_shot_lamport_tagged_kernel);
    return DL_AR_PICK(a, allreduce_one_shot_lamport_kernel);
  default: return {nullptr, nullptr};
  }
}
