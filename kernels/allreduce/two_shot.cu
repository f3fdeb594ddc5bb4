/*
 * two_shot.cu — the two-shot all-reduces over symmetric buffers: a
 * reduce-scatter (rank q reduces slice q of every rank's input), then an
 * all-gather of the reduced slices. Each rank moves 2 (n-1)/n of the tensor
 * instead of a one-shot's n-1 copies, so it wins at large sizes and many
 * ranks. f32 / f16 / bf16 summed in fp32 in rank order, so every rank gets
 * the same bits.
 *
 *   two_shot        copy-in (or zero-copy: in place in the buffer); the
 *                   reduce-scatter reads the peers' copies of this rank's
 *                   slice, the all-gather reads the peers' reduced slices.
 *   two_shot_push   the same, but the all-gather writes this rank's reduced
 *                   slice into every peer.
 *   two_shot_write  push, and no copy-in either: every rank writes slice q of
 *                   its input into rank q's staging slot `rank`, so the
 *                   reduce-scatter reads only local memory.
 *   two_shot_lamport  slices pushed to their owners, sums pushed back, both
 *                   polled where they land in the Lamport region: no flags,
 *                   no fences, no copy-in (lamport.cuh).
 *
 * Requirements: n >= 1; in/out aligned to 16 bytes for the vector path (the
 * AL=false instantiation moves them element by element); a zero-copy input
 * at a 16-byte aligned offset, the same on every rank, and reduced in place;
 * the Lamport kernel's own in lamport.cuh. Shared helpers and the scheme of rounds and barriers:
 * allreduce_device.cuh. Reference: kernels/allreduce/cpu/allreduce.c (same
 * arguments, same algorithm), checked by spec/allreduce_spec.lua against an
 * fp64 sum.
 */
#include "allreduce/lamport.cuh"

// ---- kernels --------------------------------------------------------------------

// The two-shot, pull or push (PUSH), with or without copy-in (WRITE: the
// reduce-scatter's inputs are written into their owners' staging). Slices:
// slice q is vectors [q*sv, min((q+1)*sv, nv)), sv = ceil(nv / nranks).
// Rounds walk j in [0, sv); vector q*sv + j of every slice belongs to the
// same thread of the same block on every rank.
template <int DT, int NR, bool AL, bool PUSH, bool WRITE>
__device__ __forceinline__ void two_shot(const dl_ar_args_t &a) {
  constexpr int NRC = shape<NR>::NRC, U = shape<NR>::U;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t sv = (nv + nr - 1) / nr;
  // where each rank's input (then its reduced slice) lives
  char *buf[NRC];
#pragma unroll
  for (int p = 0; p < NRC; p++)
    buf[p] = p < nr ? (a.zero_copy ? a.bufs[p] + a.zc_off : staging(a, p, h, 0)) : nullptr;
  char *const mine = a.zero_copy ? ring_buf(a, 0) + a.zc_off : staging_at(a, ring_buf(a, 0), h, 0);
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
          for (int i = 0; i < NRC; i++) {
            const int q = peer_after(me, i, nr);
            const int64_t v = (int64_t)q * sv + j;
            if (i < nr && j < r1 && v < nv) {
              if (!wr) st_vec(mine, v, ld_user<DT, AL>(a.in, v, a.n));
              else if (i != 0) st_vec(staging_at(a, ring_buf(a, i), h, me), v, ld_user<DT, AL>(a.in, v, a.n));
            }
          }
        }
      }
    }
    if (!a.zero_copy || r0 == blockIdx.x * per_round)
      if (!(ok = ar_barrier(a, self, seq, r0 == blockIdx.x * per_round))) break;
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
            x[u][p] = ld_vec(wr ? staging_at(a, ring_buf(a, 0), h, p) : buf[p], v);
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
            for (int i = 1; i < NRC; i++) {
              if (i >= nr) continue;
              char *peer = ring_buf(a, i); // buf[] of peer_after(me, i, nr), by its definition
              if (a.zero_copy) st_user<DT, true>(peer + a.zc_off, v, a.n, y);
              else st_vec(staging_at(a, peer, h, 0), v, y);
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
  ar_end(a, self, seq);
}

// two_shot: reduce-scatter and all-gather both by reading the peers.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_kernel(const dl_ar_args_t a) {
  two_shot<DT, NR, AL, false, false>(a);
}

// two_shot_push: the all-gather writes into the peers.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_push_kernel(const dl_ar_args_t a) {
  two_shot<DT, NR, AL, true, false>(a);
}

// two_shot_write: both phases write into the peers, nothing is copied in
// (zero-copy inputs run as two_shot_push).
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_write_kernel(const dl_ar_args_t a) {
  two_shot<DT, NR, AL, true, true>(a);
}

// two_shot_lamport: a two-shot without flags or fences, for more ranks than
// one-shot Lamport suits (it sends every input to every peer). Slice q of
// every rank's input goes into slot `rank` of rank q's lamport half, at
// [0, sv); rank q polls its slice from every peer, reduces it in rank order
// (cleaned, so every rank writes the same bits), writes it out and pushes it
// into slot q of every peer, at [sv, 2 sv); every rank polls the other
// slices' sums there and writes them out. In a rank's half, slot p holds p's
// share of our slice in its first sv vectors and p's sum in the next sv: the
// two never meet, and a piece may be nranks / 2 slots (the core's
// lamport_piece). Every word is emptied by the rank
// that polled it. Thread t of block b owns position j = k*T*G + b*T + t of
// every slice; it scatters step k + a.lamport_ahead before it reduces step
// k, and reads the sums of step k one step later, when they have had time
// to land.
template <int DT, int NR, bool AL>
__global__ void __launch_bounds__(AR_THREADS, 1) allreduce_two_shot_lamport_kernel(const dl_ar_args_t a) {
  constexpr int NRC = shape<NR>::NRC;
  const int nr = NR ? NR : a.nranks, me = a.rank;
  dl_ar_ctrl_t *self = ctrl_of(ring_buf(a, 0));
  const uint32_t seq = ar_begin(a, self);
  const int h = seq & 1;
  const int64_t nv = vec_count<DT>(a.n);
  const int64_t sv = (nv + nr - 1) / nr;
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t next = first; // the next position to scatter
  for (int k = 0; (a.lamport_ahead <= 0 || k < a.lamport_ahead) && next < sv; k++, next += stride)
    lamport_scatter<DT, NR, AL>(a, nr, h, sv, nv, next);
  const uint4 empty = lamport_empty();
  const uint64_t t0 = dl_signal_clock_ns();
  bool ok = true;
  // the peers' calls, compared with ours before their data is read: thread
  // p of a block with work compares peer p's, the block waits for all (its
  // other threads idle at the barrier, as in one_shot_lamport)
  const int q = threadIdx.x;
  if (q < nr && q != me && (int64_t)blockIdx.x * blockDim.x < sv) ok = ar_agree(a, self, q, seq);
  ok = __syncthreads_and(ok);
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
        if (p < nr && p != me && ok) ok = lamport_wait(a, self, lamport_at(a, ring_buf(a, 0), h, p), j, p, t0, seq, x[p]);
      if (!ok) break;
      const uint4 sum = lamport_clean(reduce_vec_own<DT, NRC>(x, nr, me, own));
      st_user<DT, AL>(a.out, v, a.n, sum);
#pragma unroll
      for (int i = 1; i < NRC; i++) {
        if (i >= nr) continue;
        st_vec(lamport_at(a, ring_buf(a, i), h, me), sv + j, sum);
        st_vec(lamport_at(a, ring_buf(a, 0), h, peer_after(me, i, nr)), j, empty);
      }
    }
    if (prev >= 0) ok = lamport_gather<DT, NR, AL>(a, self, nr, h, sv, nv, prev, t0, seq);
    prev = j;
  }
  if (ok && prev >= 0) lamport_gather<DT, NR, AL>(a, self, nr, h, sv, nv, prev, t0, seq);
  ar_end(a, self, seq);
}

// ---- launcher -----------------------------------------------------------------

dl_ar_picked_t dl_ar_two_shot_kernel(const dl_ar_args_t *a) {
  switch (a->algo) {
  case DL_AR_TWO_SHOT: return DL_AR_PICK(a, allreduce_two_shot_kernel);
  case DL_AR_TWO_SHOT_PUSH: return DL_AR_PICK(a, allreduce_two_shot_push_kernel);
  case DL_AR_TWO_SHOT_WRITE: return DL_AR_PICK(a, allreduce_two_shot_write_kernel);
  case DL_AR_TWO_SHOT_LAMPORT: return DL_AR_PICK(a, allreduce_two_shot_lamport_kernel);
  default: return {nullptr, nullptr};
  }
}
