// ep_per_rank.cuh — the per_rank layout (kernels/ep/ep.h) as a policy of the
// EP kernels (ep_dispatch.cu, ep_combine.cu): a message per (token,
// destination rank) into slot [source][its position among the source's
// tokens for that rank], its header carrying the token's selections on that
// rank, and the combine's slots [k][token]. With rank_major output the send
// writes this rank's own rows straight into the outputs, and the buffers
// that a.lamport marks have Lamport slots (ep.h). Its twin:
// kernels/ep/cpu/ep.c (the per_rank functions). What a layout provides:
// ep_layouts.cuh.
#ifndef DISTLAB_EP_PER_RANK_CUH
#define DISTLAB_EP_PER_RANK_CUH

#include "ep/ep_device.cuh"

// A warp writes rank_major row `row`'s expert ids, weights and origin (src),
// where `write` (the row's first segment): lane k < K holds selection k's local
// expert le (-1: on another rank) and weight w of token t from source s.
__device__ __forceinline__ void ep_rank_row_meta(const dl_ep_args_t &a, int64_t row, int s, int t, int le, float w,
                                                 int lane, bool write) {
  const int K = a.topk;
  const uint32_t here = __ballot_sync(EP_FULL, le >= 0);
  if (lane < K && write) {
    a.rids[row * K + lane] = le;
    a.rweights[row * K + lane] = le >= 0 ? w : 0.0f;
  }
  const int kf = here ? __ffs(here) - 1 : 0;
  const int lef = __shfl_sync(EP_FULL, le, kf);
  if (lane == 0 && write) {
    a.rsrc[row * 2] = t;
    a.rsrc[row * 2 + 1] = dl_ep_src_pack(s, kf, lef);
  }
}

// A warp stores segment sg of per_rank message j of source s as rank_major
// row j of s, the first segment with its expert ids, weights and origin.
template <bool FP8>
__device__ __forceinline__ void ep_recv_rank_row(const dl_ep_args_t &a, const char *msg, int s, int j, int lane,
                                                 const ep_split &sp, int64_t sg) {
  const int K = a.topk;
  // the segment's first batch, loaded with the header (both in flight at once)
  const int64_t rb = ep_row_bytes<FP8>(a), lo = ep_seg_lo(sp, sg), hi = ep_seg_hi(sp, sg, rb);
  ep_batch b;
  ep_load_batch(b, msg + a.hdr + lo, (hi - lo) / 16, lane);
  const uint32_t *h = reinterpret_cast<const uint32_t *>(msg);
  const int t = (int)h[0];
  int le = -1;
  float w = 0.0f;
  if (lane < K) {
    le = (int16_t)(h[1 + 2 * lane] & 0xffffu);
    w = dl_bits_f32(h[2 + 2 * lane]);
  }
  const int64_t row = (int64_t)s * a.max_tokens + j;
  ep_rank_row_meta(a, row, s, t, le, w, lane, sg == 0);
  ep_store_row<FP8>(a, msg + a.hdr, row, lane, sp, sg, &b);
}

// Polls source `peer`'s count word at w (Lamport slots, ep.h) until it
// carries the tag of this call (`epoch`, call tag `tag`) (into *x): true;
// false once ep_stop says stop (as ep_poll_vec's; self: this rank's control
// words).
static __device__ __noinline__ bool ep_poll_count(const uint32_t *w, uint32_t *x, uint32_t epoch, uint32_t tag,
                                                  uint64_t timeout_ns, dl_ep_status_t *status, int peer,
                                                  const uint32_t *self, int n, int rank) {
  const uint64_t t0 = dl_signal_clock_ns();
  for (int spins = 1;; spins++) {
    *x = ep_ld_volatile(w);
    if (dl_ep_count_word_is(*x, tag)) return true;
    if (spins % 32) continue;
    EP_POLL_YIELD();
    const uint64_t waited = dl_signal_clock_ns() - t0;
    if (waited > 100000 && spins % 1024 == 0 &&
        ep_stop(status, self, n, rank, DL_EP_DISPATCH_RECV, peer, epoch, epoch, self + dl_ep_disp_flag(n, peer),
                waited, timeout_ns))
      return false;
  }
}

// Word j of the 16-byte vectors the warp's lanes hold (lane j / 4 holds it);
// each lane asks for its own j.
__device__ __forceinline__ uint32_t ep_word_of(const uint4 &v, int j) {
  const int from = j >> 2, c = j & 3;
  const uint32_t x = __shfl_sync(EP_FULL, v.x, from), y = __shfl_sync(EP_FULL, v.y, from);
  const uint32_t z = __shfl_sync(EP_FULL, v.z, from), w = __shfl_sync(EP_FULL, v.w, from);
  return c == 0 ? x : c == 1 ? y : c == 2 ? z : w;
}

// A warp moves vectors [v0, v1) of row j of a Lamport slot at src to dst: it
// polls each until it is there (four in flight), stores it and empties it.
// Returns (this lane) 1 when moved; 2 when the row does not come: a vector
// not there at its first poll sends the lane to the source's count word cw
// (polled until it carries the call's tag; n caches it), and j >= n;
// 0 when a poll gave up (ep_poll_vec or ep_poll_count, naming `peer` and the
// call; *blk_ok then 0).
__device__ __forceinline__ int ep_lamport_move(uint4 *dst, uint4 *src, int64_t v0, int64_t v1, int lane,
                                               const dl_ep_args_t &a, int peer, uint32_t epoch, uint32_t tag,
                                               int *blk_ok,
                                               const uint32_t *cw, int j, int &n) {
  const uint4 empty = make_uint4(DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY);
  const uint32_t *self = ep_ctrl(a, a.rank);
  for (int64_t v = v0 + lane; v < v1; v += 128) {
    uint4 y[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      if (v + 32 * u < v1) y[u] = ep_ld_vec_volatile(src + v + 32 * u);
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int64_t at = v + 32 * u;
      if (at >= v1) break;
      if (!ep_vec_full(y[u])) {
        if (n < 0) { // does the row come at all?
          uint32_t w = ep_ld_volatile(cw);
          if (!dl_ep_count_word_is(w, tag) &&
              !ep_poll_count(cw, &w, epoch, tag, a.timeout_ns, a.status, peer, self, a.nranks, a.rank)) {
            *reinterpret_cast<volatile int *>(blk_ok) = 0;
            return 0;
          }
          n = (int)(w & 0xffffu);
        }
        if (j >= n) return 2;
        if (!ep_poll_vec(src + at, &y[u], a.timeout_ns, a.status, DL_EP_DISPATCH_RECV, peer, epoch, self, a.nranks,
                         a.rank, blk_ok))
          return 0;
      }
      dst[at] = y[u];
      src[at] = empty;
    }
  }
  return 1;
}

// ep_recv_rank_row from a Lamport slot (ep.h; bf16): the header (first
// segment) and the payload polled until there, copied, and emptied. Returns
// (the whole warp) 1 when moved, 2 when row j does not come (ep_lamport_move;
// cw, n), 0 when a poll of a lane gave up.
__device__ __forceinline__ int ep_recv_rank_row_lamport(const dl_ep_args_t &a, char *msg, int s, int j, int lane,
                                                        const ep_split &sp, int64_t sg, uint32_t epoch, uint32_t tag,
                                                        int *blk_ok,
                                                        const uint32_t *cw, int &n) {
  const int K = a.topk, nh = (int)(a.hdr / 16);
  const int64_t rb = ep_row_bytes<false>(a), lo = ep_seg_lo(sp, sg), hi = ep_seg_hi(sp, sg, rb);
  const int64_t row = (int64_t)s * a.max_tokens + j;
  const uint4 empty = make_uint4(DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY);
  uint4 *hdr = reinterpret_cast<uint4 *>(msg), *pay = reinterpret_cast<uint4 *>(msg + a.hdr);
  // the header's first poll beside the payload's
  uint4 hv = empty;
  if (sg == 0 && lane < nh) hv = ep_ld_vec_volatile(hdr + lane);
  int r = ep_lamport_move(reinterpret_cast<uint4 *>(reinterpret_cast<char *>(a.rx) + row * rb), pay, lo / 16, hi / 16,
                          lane, a, s, epoch, tag, blk_ok, cw, j, n);
  // (a row whose payload came has its header coming)
  if (sg == 0 && r == 1 && lane < nh && !ep_vec_full(hv) &&
      !ep_poll_vec(hdr + lane, &hv, a.timeout_ns, a.status, DL_EP_DISPATCH_RECV, s, epoch, ep_ctrl(a, a.rank),
                   a.nranks, a.rank, blk_ok))
    r = 0;
  if (__ballot_sync(EP_FULL, r == 0) != 0u) return 0;
  if (__ballot_sync(EP_FULL, r == 2) != 0u) return 2;
  if (sg != 0) return 1;
  // word 0: the token, under the call's tag (ep.h): rows of another call stop here
  const uint32_t w0 = ep_word_of(hv, 0);
  const int t = (int)(w0 & 0xffffu);
  if ((w0 >> 16) != (tag & 0xffffu)) {
    if (lane == 0)
      ep_fail(a.status, DL_EP_DISPATCH_RECV, DL_EP_ERR_CALL, (uint32_t)s, tag, w0 >> 16, epoch);
    *reinterpret_cast<volatile int *>(blk_ok) = 0;
    return 0;
  }
  const uint32_t lw = ep_word_of(hv, lane < K ? 1 + 2 * lane : 0), ww = ep_word_of(hv, lane < K ? 2 + 2 * lane : 0);
  if (lane < nh) hdr[lane] = empty;
  int le = -1;
  float w = 0.0f;
  if (lane < K) {
    le = (int16_t)(lw & 0xffffu);
    w = dl_bits_f32(ww);
  }
  ep_rank_row_meta(a, row, s, t, le, w, lane, true);
  return 1;
}

// The receive in Lamport slots (ep.h; per_rank, rank_major, bf16). Rows are
// dealt without the counts: item i is row j = i % B of the i / B-th peer
// (this rank's own rows are in place already), so no warp waits for the
// counts or a barrier before its first poll. A row not whole at its first
// poll sends the warp to its source's count word, to learn whether the row
// comes at all (ep_lamport_move). The last block's warp 0 writes the
// outputs' counts from the count words.
__device__ __forceinline__ void ep_dispatch_recv_lamport(const dl_ep_args_t &a) {
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, B = a.max_tokens;
  const uint32_t *self = ep_ctrl(a, a.rank);
  char *region = ep_buf(a, a.rank) + a.drecv_off;
  if (tid == 0) blk.ok = 1;
  // the call: from the count this phase's blocks add to here, which holds the
  // calls before whole and this one not (this block has not added its share)
  const uint32_t e =
      dl_ep_calls_of(__shfl_sync(EP_FULL, lane == 0 ? ep_ld_volatile(self + dl_ep_disp_done(N, a.rank)) : 0u, 0)) + 1;
  const uint32_t tag = dl_ep_call(self, N, a.rank, DL_EP_DISPATCH_RECV, e); // the rows' and counts' (ep.h)
  __syncthreads(); // blk.ok set before any poll reads it
  auto count_word = [&](int q) {
    return reinterpret_cast<const uint32_t *>(region + dl_ep_dispatch_count_off(N, B, a.msg_d, q));
  };
  char *slots = region + dl_ep_dispatch_half(true, N, B, e) * a.msg_d;
  const int64_t warps = (int64_t)gridDim.x * W, items = (int64_t)(N - 1) * B;
  const ep_split sp = ep_split_rows(items, warps, a.hidden / 8);
  int n = -1, n_of = -1; // a source's count, once read, and the source
  bool ok = true;
  for (int64_t it = (int64_t)blockIdx.x * W + warp; ok && it < items * sp.segs; it += warps) {
    const int64_t i = it / sp.segs, sg = it % sp.segs;
    const int si = (int)(i / B), j = (int)(i % B), s = si < a.rank ? si : si + 1;
    if (s != n_of) n = -1, n_of = s;
    ok = ep_recv_rank_row_lamport(a, slots + ((int64_t)s * B + j) * a.msg_d, s, j, lane, sp, sg, e, tag, &blk.ok,
                                  count_word(s), n) != 0 &&
         __ballot_sync(EP_FULL, *reinterpret_cast<volatile int *>(&blk.ok) == 0) == 0u;
  }
  // the outputs' counts (rows from each source, this rank's own too)
  if (blockIdx.x == gridDim.x - 1 && warp == 0 && lane < N) {
    const uint32_t *cw = count_word(lane);
    uint32_t w = ep_ld_volatile(cw);
    if (dl_ep_count_word_is(w, tag) ||
        ep_poll_count(cw, &w, e, tag, a.timeout_ns, a.status, lane, self, N, a.rank))
      a.rcounts[lane] = (int)(w & 0xffffu);
    else
      *reinterpret_cast<volatile int *>(&blk.ok) = 0;
  }
  ep_finish(a, blk, dl_ep_disp_done, false);
}

// The receive with the flag. Warp 0 does ep_begin, the counts' reads and
// their scan before one barrier (not five): lane 0 reads the epoch, lane q <
// N waits for source q's messages and reads how many they are, and the lanes
// scan them (N <= 8). rank_major (direct): this rank's own rows are in place
// already; none is copied, and a warp per message (at small B per segment of
// one) stores row j of source s. expert_major: a warp per (message, k).
template <bool FP8, bool EXPERT_MAJOR> __device__ __forceinline__ void ep_per_rank_recv(const dl_ep_args_t &a) {
  const int phase = DL_EP_DISPATCH_RECV;
  EP_SMEM(smem);
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, L = a.local, K = a.topk, B = a.max_tokens, NL = N * L;
  constexpr bool DIRECT = !EXPERT_MAJOR; // the send wrote this rank's own rows (ep_dispatch_send_body)
  // (the receive's shared memory as per_expert's lays it out: ep_recv_smem; tmp unused here)
  [[maybe_unused]] int *cnt = smem, *pre = cnt + NL, *ntok = pre + NL + 1, *tmp = ntok + N;
  const uint32_t *self = ep_ctrl(a, a.rank);
  if (warp == 0) {
    const uint32_t e = dl_ep_calls_of(__shfl_sync(EP_FULL, ep_count_now(a, dl_ep_disp_done), 0)) + 1;
    bool ok = true;
    int n = 0;
    if (lane < N) {
      ok = ep_wait(a, phase, dl_ep_disp_flag(N, lane), dl_ep_count_of(e), lane, e) && ep_tag_ok(a, phase, lane, e);
      if (ok) n = (int)ep_ld_volatile(self + dl_ep_ntok(N, lane));
    }
    int inc = DIRECT && lane == a.rank ? 0 : n;
#pragma unroll
    for (int d = 1; d < DL_SIGNAL_MAX_RANKS; d <<= 1) {
      const int y = __shfl_up_sync(EP_FULL, inc, d);
      if (lane >= d) inc += y;
    }
    if (lane < N) {
      ntok[lane] = n;
      pre[lane + 1] = inc;
    }
    const bool all = __ballot_sync(EP_FULL, !ok) == 0u;
    if (lane == 0) {
      pre[0] = 0;
      blk.epoch = e;
      blk.ok = all;
    }
  }
  __syncthreads();
  for (int i = tid; EXPERT_MAJOR && i < NL; i += blockDim.x) { // the experts' rows from each source
    const int s = i % N, le = i / N; // cnt[le * N + s]: expert-major order
    cnt[i] = (int)ep_ld_volatile(self + dl_ep_cnt(N, L, s, le));
  }
  if (EXPERT_MAJOR) __syncthreads();
  ep_recv_counts<EXPERT_MAJOR>(a, cnt, ntok, N, L, tid);
  const int64_t total = pre[N];
  const char *region = ep_buf(a, a.rank) + a.drecv_off;
  // rows cut into segments where the messages are fewer than the grid's warps;
  // a message's header words are written by its first segment's warp
  const int64_t warps = (int64_t)gridDim.x * W, items = EXPERT_MAJOR ? total * K : total;
  const ep_split sp = ep_split_rows(items, warps, ep_row_vectors<FP8>(a));
  if (EXPERT_MAJOR) {
    // A warp per (message, k): a message brings one payload for each of its
    // selections here, which one warp per message wrote one after another
    // (experiments/ep/NOTES.md). Warp i of the grid takes selection k = i % K
    // of message i / K; a k that is not here costs a read of one header word.
    for (int64_t it = (int64_t)blockIdx.x * W + warp; blk.ok && it < items * sp.segs; it += warps) {
      const int64_t i = it / sp.segs, sg = it % sp.segs, mi = i / K;
      const int k = (int)(i % K);
      const int s = ep_group_of(pre, N, mi), j = (int)(mi - pre[s]);
      const char *msg = region + ((int64_t)s * B + j) * a.msg_d;
      const uint32_t *h = reinterpret_cast<const uint32_t *>(msg);
      const uint32_t e = h[1 + 2 * k];
      const int le = (int16_t)(e & 0xffffu);
      if (le < 0) continue;
      int off = 0; // rows of expert le from sources before s
      for (int r = 0; r < s; r++) off += cnt[le * N + r];
      const int64_t row = (int64_t)le * N * B + off + (int)(e >> 16);
      if (lane == 0 && sg == 0) {
        a.rsrc[row * 2] = (int)h[0];
        a.rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
      }
      ep_store_row<FP8>(a, msg + a.hdr, row, lane, sp, sg);
    }
  } else {
    for (int64_t it = (int64_t)blockIdx.x * W + warp; blk.ok && it < items * sp.segs; it += warps) {
      const int64_t i = it / sp.segs, sg = it % sp.segs;
      const int s = ep_group_of(pre, N, i), j = (int)(i - pre[s]);
      ep_recv_rank_row<FP8>(a, region + ((int64_t)s * B + j) * a.msg_d, s, j, lane, sp, sg);
    }
  }
  ep_finish(a, blk, dl_ep_disp_done, false);
}

struct ep_per_rank {
  static constexpr int id = DL_EP_PER_RANK;
  // Lamport slots where a.lamport (rank_major output; the dispatch bf16 only:
  // dl_ep_dispatch_lamport); rank_major's send writes this rank's own rows
  // (direct), so the send differs by output
  static constexpr bool has_lamport = true;
  template <bool EXPERT_MAJOR> static constexpr bool direct = !EXPERT_MAJOR;
  template <bool EXPERT_MAJOR> static constexpr bool send_output = EXPERT_MAJOR;

  // Whether a selection sends a message: the token's first on each rank.
  __device__ static __forceinline__ bool sends(uint32_t qmask, uint32_t below) { return (qmask & below) == 0; }
  // The slot at its receiver of entry i's message (half: the call's, in Lamport slots).
  __device__ static __forceinline__ int64_t dispatch_slot(const int *rslot, const int *rpos, int i, int le, int N,
                                                          int B, int rank, int64_t half) {
    return half + (int64_t)rank * B + rslot[i];
  }
  // Word j >= 1 of entry i's header: per selection kk of the token, its local
  // expert and position on rank q (0xffff: not there), then its weight.
  __device__ static __forceinline__ uint32_t header_word(const int *re, const int *rpos, const int *rslot,
                                                         const float *rw, int i, int k, uint32_t km, int K, int L,
                                                         int q, int j) {
    uint32_t v = 0;
    const int kk = (j - 1) >> 1, ik = i - k + kk;
    if (kk < K) {
      const bool on = re[ik] >= 0 && re[ik] / L == q;
      if ((j - 1) & 1) v = on ? dl_f32_bits(rw[ik]) : 0u;
      else v = on ? ((uint32_t)(re[ik] % L) & 0xffffu) | ((uint32_t)rpos[ik] << 16) : 0xffffu;
    }
    return v;
  }
  template <bool FP8, bool EXPERT_MAJOR> __device__ static __forceinline__ void dispatch_recv(const dl_ep_args_t &a) {
    ep_per_rank_recv<FP8, EXPERT_MAJOR>(a);
  }
  __device__ static __forceinline__ void dispatch_recv_lamport(const dl_ep_args_t &a) { ep_dispatch_recv_lamport(a); }
  // The combine slot of selection k of a token: one per k.
  __device__ static __forceinline__ int64_t combine_slot(int k, int64_t e) { return k; }
};

#endif
