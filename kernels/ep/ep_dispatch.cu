/*
 * ep_dispatch.cu — the dispatch kernels of the expert-parallel buffer
 * (layout, message formats and protocol: kernels/ep/ep.h), and the launcher
 * of all four phases, dl_ep_cuda.
 *
 *   ep_dispatch_send_kernel   block b owns a contiguous chunk of tokens. Its
 *       routing, without atomics across blocks: every block counts the
 *       selections per expert and the tokens per rank of the tokens before
 *       its chunk (a scan of topk_idx in shared memory), then warp 0 walks
 *       the chunk in order, lane = k, giving each selection its slot at the
 *       destination rank and its position among this rank's tokens for the
 *       expert (so rows come out ordered by token, and cpu and cuda agree).
 *       Then a warp per message (or per segment of one, where the block's
 *       messages are fewer than its warps: ep_split_rows) writes the header
 *       and the payload straight into the receiver's slot (16-byte vectors
 *       over NVLink; fp8: each half-warp quantizes a group of 128 values
 *       with one scale). per_rank: a message per (token, destination rank),
 *       its first selection's warp sends it; per_expert: one per (token, k).
 *       The last block (its scan and walk cover every token) writes the
 *       counts into every receiver's control words; every block then adds
 *       its share to each receiver's disp_flag (release). The wait for the
 *       receivers' reading of the previous call (disp_done) comes after the
 *       routing, just before the first write to a peer.
 *       per_rank with rank_major output, where a.lamport: the messages go
 *       into Lamport slots (ep.h), the counts ahead of them, and the flag's
 *       add is relaxed (no system fence).
 *   ep_dispatch_recv_kernel   waits for every source's disp_flag, then a
 *       warp per message (per_rank with expert_major: per message and
 *       selection; at small B per segment of one) copies the payload
 *       (locally) into the outputs: expert_major rows at the expert's offset
 *       for the source (prefix sums of the counts) plus the position;
 *       rank_major row j of the source with its expert ids and weights; and
 *       the row's origin (src) for combine. Every block then adds its
 *       share to each source's disp_done. In Lamport slots
 *       (ep_dispatch_recv_lamport) it waits for no flag: a warp polls row j
 *       of a peer until it is there (reading the source's count word only to
 *       learn whether a row not there yet comes at all), copies it and
 *       empties it.
 *
 * Requirements: H a multiple of 8 (of 128 with fp8), K <= 24, at most 8
 * ranks, blockDim a multiple of 32. Reference: kernels/ep/cpu/ep.c (the same
 * arguments and routing, bit for bit), checked by spec/ep_spec.lua.
 */
#include "ep/ep_device.cuh"

// ---- dispatch send ----------------------------------------------------------------

// Shared memory of the send kernel: hist_e[E], hist_r[32], then per entry
// (t, k) of the chunk: expert, slot, position, kmask, weight, and the list of
// the entries that send a message.
__host__ __device__ __forceinline__ int64_t ep_send_smem(int experts, int chunk, int topk) {
  return 4 * ((int64_t)experts + 32 + 6 * (int64_t)chunk * topk);
}

// A warp writes vectors [lo, hi) of token t's payload at p (a vector: 8
// values; lo a multiple of 32): bf16 as it is, or fp8 codes at p and the
// scales of their groups at sc (lanes 0-15 and 16-31 each quantize a group
// of 128 values). CLEAN (bf16): into a Lamport slot (no word DL_EP_EMPTY; ep.h).
template <bool FP8, bool CLEAN>
__device__ __forceinline__ void ep_send_payload(const dl_ep_args_t &a, int t, char *p, float *scales, int lane,
                                                int lo, int hi) {
  const int H = a.hidden;
  const char *x = reinterpret_cast<const char *>(a.x) + (int64_t)t * H * 2;
  static_assert(!(FP8 && CLEAN), "Lamport slots take bf16 payloads");
  if (!FP8) {
    ep_batch b;
    ep_load_batch(b, x + 16 * (int64_t)lo, hi - lo, lane);
    ep_copy_row_loaded<CLEAN>(p + 16 * (int64_t)lo, x + 16 * (int64_t)lo, 16 * (int64_t)(hi - lo), lane, b);
    return;
  }
  const uint4 *src = reinterpret_cast<const uint4 *>(x);
  uint2 *codes = reinterpret_cast<uint2 *>(p);
  // four rounds of 32 vectors loaded at once, then quantized one round after
  // another, as bf16's copy keeps four in flight (experiments/ep/NOTES.md)
  for (int base = lo; base < hi; base += 128) {
    uint4 rr[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int v = base + 32 * u + lane;
      rr[u] = v < hi ? src[v] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; u++) {
      if (base + 32 * u >= hi) break; // warp-uniform
      const int v = base + 32 * u + lane;
      const uint32_t wd[4] = {rr[u].x, rr[u].y, rr[u].z, rr[u].w};
      float f[8];
#pragma unroll
      for (int i = 0; i < 4; i++) {
        f[2 * i] = dl_bf16_to_f32((uint16_t)(wd[i] & 0xffffu));
        f[2 * i + 1] = dl_bf16_to_f32((uint16_t)(wd[i] >> 16));
      }
      float amax = DL_EP_FP8_AMIN;
#pragma unroll
      for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
      for (int d = 8; d >= 1; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(EP_FULL, amax, d));
      const float inv = DL_EP_FP8_MAX / amax;
      uint32_t c0 = 0, c1 = 0;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        c0 |= (uint32_t)dl_f32_to_e4m3(f[i] * inv) << (8 * i);
        c1 |= (uint32_t)dl_f32_to_e4m3(f[4 + i] * inv) << (8 * i);
      }
      if (v < hi) codes[v] = make_uint2(c0, c1);
      if (v < hi && (lane & 15) == 0) scales[v / 16] = amax / DL_EP_FP8_MAX;
    }
  }
}

// The send phase, as a kernel of its own or the first half of the fused one.
// per_rank with rank_major output (DIRECT): the messages to this rank are not
// messages: the send writes them straight into their output rows (row j of
// source `rank`, with ids, weights and origin), and the receive copies only
// the peers' (at 2 ranks half the rows cross no link and were copied twice).
// LAMPORT (DIRECT only): the peers' messages go into Lamport slots of the
// call's half, each receiver's count ahead of them, and the count is relaxed
// (ep.h).
template <bool FP8, bool PER_RANK, bool EXPERT_MAJOR, bool LAMPORT>
__device__ __forceinline__ void ep_dispatch_send_body(const dl_ep_args_t &a) {
  constexpr bool DIRECT = PER_RANK && !EXPERT_MAJOR;
  static_assert(!LAMPORT || (DIRECT && !FP8), "Lamport slots are per_rank's with rank_major output, bf16");
  const int phase = DL_EP_DISPATCH_SEND;
  EP_SMEM(smem);
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, E = a.experts, L = a.local, K = a.topk, T = a.tokens, B = a.max_tokens;
  const int C = T > 0 ? (T + (int)gridDim.x - 1) / (int)gridDim.x : 0;
  const int t0 = min((int)blockIdx.x * C, T), t1 = min(t0 + C, T), CK = (t1 - t0) * K;
  int *hist_e = smem, *hist_r = smem + E;
  int *re = hist_r + 32, *rslot = re + C * K, *rpos = rslot + C * K;
  uint32_t *rmask = reinterpret_cast<uint32_t *>(rpos + C * K);
  float *rw = reinterpret_cast<float *>(rmask + C * K);
  int *msgs = reinterpret_cast<int *>(rw + C * K);
  EP_SHARED(int, nmsg);
  // this phase's count at this rank (ep_start), its load overlapping the routing's;
  // warp 0's first token of the chunk too (its walk below), so that the loads overlap the scan
  const uint32_t count = ep_count_now(a, dl_ep_disp_flag);
  int nraw = -1;
  float nwt = 0.0f;
  if (warp == 0 && t0 < t1 && lane < K) {
    nraw = a.idx[(int64_t)t0 * K + lane];
    nwt = a.w[(int64_t)t0 * K + lane];
  }
  for (int i = tid; i < E + 32; i += blockDim.x) smem[i] = 0;
  if (tid == 0) nmsg = 0;
  __syncthreads();

  // counts of the tokens before our chunk: a warp reads G = 32 / K tokens a
  // load (lane = g K + k), eight loads in flight (on the path of every block
  // but the first; a thread per token was slower: experiments/ep/NOTES.md)
  {
    const int G = 32 / K, sub = lane / K, k = lane - sub * K;
    const uint32_t grp = sub < G ? ((1u << K) - 1u) << (sub * K) : 0u, below = (1u << lane) - 1u;
    for (int base = warp * 8 * G; base < t0; base += W * 8 * G) {
      int raw[8];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int t = base + u * G + sub;
        raw[u] = sub < G && t < t0 ? a.idx[(int64_t)t * K + k] : -1;
      }
#pragma unroll
      for (int u = 0; u < 8; u++) {
        if (base + u * G >= t0) break; // warp-uniform: no token of this load or the next is before the chunk
        // an expert an earlier k of the token picked is dropped (cpu/ep.c expert_of):
        // each lane compares the experts of its token's earlier lanes, shuffled up
        // (K <= 8, the usual: 7 shuffles a load, issued at once; not __match_any_sync
        // over the warp's experts, whose cost grows with their distinct values:
        // experiments/ep/NOTES.md). A token counts once for each rank it goes to
        // (__match_any_sync over at most N + 1 distinct ranks: cheap).
        bool dup = false;
        if (K <= 8) {
#pragma unroll
          for (int d = 1; d < 8; d++) {
            const int o = __shfl_up_sync(EP_FULL, raw[u], d);
            dup = dup || (d < K && k >= d && o == raw[u]);
          }
        } else { // rare: one shuffle after another
#pragma unroll 1
          for (int d = 1; d < K; d++) {
            const int o = __shfl_up_sync(EP_FULL, raw[u], d);
            dup = dup || (k >= d && o == raw[u]);
          }
        }
        const int ev = raw[u] >= 0 && raw[u] < E && !dup ? raw[u] : -1;
        const int q = ev >= 0 ? ev / L : -1;
        const uint32_t qm = __match_any_sync(EP_FULL, q) & grp;
        if (ev >= 0) {
          atomicAdd(&hist_e[ev], 1);
          if (!(qm & below)) atomicAdd(&hist_r[q], 1);
        }
      }
    }
  }
  ep_set_epoch(blk, count);
  __syncthreads();
  const uint32_t e = blk.epoch;
  // our chunk in token order: lane k reads the counts, then the first lane
  // of each rank and of each expert advances them (the next token's ids and
  // weights loaded while this one's are used)
  if (warp == 0) {
    for (int t = t0; t < t1; t++) {
      const int raw = nraw;
      const float wt = nwt;
      if (t + 1 < t1 && lane < K) {
        nraw = a.idx[(int64_t)(t + 1) * K + lane];
        nwt = a.w[(int64_t)(t + 1) * K + lane];
      }
      const uint32_t below = (1u << lane) - 1u;
      // an expert an earlier k picked is dropped (cpu/ep.c expert_of), so the
      // lanes' experts differ: each lane owns its expert's count
      const uint32_t same = __match_any_sync(EP_FULL, raw); // every lane, before any branch
      const int ev = raw >= 0 && raw < E && !(same & below) ? raw : -1;
      if (lane < K && ev < 0 && raw != -1) ep_fail(a.status, phase, DL_EP_ERR_BAD_ID, (uint32_t)t, (uint32_t)lane, (uint32_t)raw, e);
      const int q = ev >= 0 ? ev / L : -1;
      const uint32_t qmask = __match_any_sync(EP_FULL, q) & (ev >= 0 ? ~0u : 0u); // the token's selections on q
      int slot = 0, pos = 0;
      if (ev >= 0) {
        slot = hist_r[q];
        pos = hist_e[ev];
      }
      __syncwarp();
      if (ev >= 0 && (qmask & below) == 0) hist_r[q] = slot + 1;
      if (ev >= 0) hist_e[ev] = pos + 1;
      __syncwarp();
      if (lane < K) {
        const int i = (t - t0) * K + lane;
        re[i] = ev;
        rslot[i] = slot;
        rpos[i] = pos;
        rmask[i] = qmask;
        rw[i] = wt;
      }
      // the entries that send: per_rank a token's first selection on each rank
      const uint32_t sends = __ballot_sync(EP_FULL, ev >= 0 && (!PER_RANK || (qmask & below) == 0));
      if (sends >> lane & 1u) msgs[nmsg + __popc(sends & below)] = (t - t0) * K + lane;
      __syncwarp();
      if (lane == 0) nmsg += __popc(sends);
      __syncwarp();
    }
  }
  __syncthreads();
  // the owner's copy of the routing, for combine
  for (int i = tid; i < CK; i += blockDim.x) {
    a.hidx[(int64_t)t0 * K + i] = re[i];
    a.hw[(int64_t)t0 * K + i] = rw[i];
  }
  // the receivers have read our previous messages (waited for only now: the
  // routing above touches no peer, and overlaps the wait)
  ep_await(a, phase, blk, dl_ep_disp_done, -1);
  const int64_t half = dl_ep_dispatch_half(LAMPORT, N, B, e);
  // Lamport slots: the last block's counts (its walk covered every token) go
  // ahead of the messages; each receiver polls them, then the rows
  if (LAMPORT && blockIdx.x == gridDim.x - 1 && blk.ok && tid < N)
    *reinterpret_cast<uint32_t *>(ep_buf(a, tid) + a.drecv_off + dl_ep_dispatch_count_off(N, B, a.msg_d, a.rank)) =
        dl_ep_count_word(e, (uint32_t)hist_r[tid]);
  // the messages, cut into segments so that every warp of the block has one
  // (the first segment's warp writes the header)
  const int nm = nmsg;
  const ep_split sp = ep_split_rows(nm, W, a.hidden / 8);
  for (int64_t it = warp; blk.ok && it < nm * sp.segs; it += W) {
    const int i = msgs[it / sp.segs], g = (int)(it % sp.segs);
    const int ev = re[i], k = i % K, t = t0 + i / K;
    const uint32_t km = rmask[i];
    const int q = ev / L, le = ev % L;
    const int lo = (int)(g * sp.per), hi = (int)min((int64_t)a.hidden / 8, (g + 1) * sp.per);
    const bool direct = DIRECT && q == a.rank; // rank_major row rslot[i] of source `rank`
    const int64_t row = (int64_t)a.rank * B + rslot[i];
    char *msg = ep_buf(a, q) + a.drecv_off +
                (PER_RANK ? half + (int64_t)a.rank * B + rslot[i] : ((int64_t)le * N + a.rank) * B + rpos[i]) * a.msg_d;
    char *pay = direct ? reinterpret_cast<char *>(a.rx) + row * (FP8 ? a.hidden : 2 * (int64_t)a.hidden) : msg + a.hdr;
    float *sc = !FP8 ? nullptr
                : direct ? a.rscales + row * (a.hidden / DL_EP_FP8_GROUP)
                         : reinterpret_cast<float *>(msg + a.hdr + a.hidden);
    // the payload first: its loads lead, the header comes from shared memory
    // (in Lamport slots this rank's own rows are cleaned too: ep.h)
    ep_send_payload<FP8, LAMPORT>(a, t, pay, sc, lane, lo, hi);
    if (g != 0) continue;
    if (direct) { // the row's ids, weights and origin, as ep_recv_rank_row writes them
      for (int kk = lane; kk < K; kk += 32) {
        const int ik = i - k + kk;
        const bool on = re[ik] >= 0 && re[ik] / L == q;
        a.rids[row * K + kk] = on ? re[ik] % L : -1;
        a.rweights[row * K + kk] = on ? rw[ik] : 0.0f;
      }
      if (lane == 0) {
        a.rsrc[row * 2] = t;
        a.rsrc[row * 2 + 1] = dl_ep_src_pack(a.rank, k, le); // k: the token's first selection here
      }
      continue;
    }
    for (int j = lane; j < a.hdr / 4; j += 32) {
      uint32_t v = 0;
      if (j == 0) {
        v = (uint32_t)t;
      } else if (PER_RANK) {
        const int kk = (j - 1) >> 1, ik = i - k + kk;
        if (kk < K) {
          const bool on = re[ik] >= 0 && re[ik] / L == q;
          if ((j - 1) & 1) v = on ? dl_f32_bits(rw[ik]) : 0u;
          else v = on ? ((uint32_t)(re[ik] % L) & 0xffffu) | ((uint32_t)rpos[ik] << 16) : 0xffffu;
        }
      } else {
        v = j == 1 ? (uint32_t)rslot[i] : j == 2 ? ((uint32_t)k | km << 8) : dl_f32_bits(rw[i]);
      }
      reinterpret_cast<uint32_t *>(msg)[j] = LAMPORT ? ep_lamport_word(v) : v;
    }
  }
  // the last block's counts cover every token: each receiver's counts from us
  if (!LAMPORT && blockIdx.x == gridDim.x - 1 && blk.ok)
    for (int i = tid; i < N * L + N; i += blockDim.x) {
      if (i < N * L) ep_ctrl(a, i / L)[dl_ep_cnt(N, L, a.rank, i % L)] = (uint32_t)hist_e[i];
      else ep_ctrl(a, i - N * L)[dl_ep_ntok(N, a.rank)] = (uint32_t)hist_r[i - N * L];
    }
  ep_finish(a, blk, dl_ep_disp_flag, !LAMPORT);
}

template <bool FP8, bool PER_RANK, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_send_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  ep_dispatch_send_body<FP8, PER_RANK, EXPERT_MAJOR, LAMPORT>(a);
}

// ---- dispatch receive ----------------------------------------------------------------

// Shared memory of the receive kernel: cnt[N][L], the message prefix sums
// (E + 1, or N + 1), ntok[N] and the scan's 32.
__host__ __device__ __forceinline__ int64_t ep_recv_smem(int nranks, int experts) {
  return 4 * (2 * (int64_t)experts + 2 * (int64_t)nranks + 2 + 32);
}

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
// carries call `epoch`'s tag (into *x): true; false once another block
// recorded a timeout (read after 100 us) or this wait timed out (recorded as
// ep_poll_vec's, with the calls the peer's disp_flag here, *count, held).
static __device__ __noinline__ bool ep_poll_count(const uint32_t *w, uint32_t *x, uint32_t epoch, uint64_t timeout_ns,
                                                  dl_ep_status_t *status, int peer, const uint32_t *count) {
  const uint64_t t0 = dl_signal_clock_ns();
  for (int spins = 1;; spins++) {
    *x = ep_ld_volatile(w);
    if (dl_ep_count_word_is(*x, epoch)) return true;
    if (spins % 32) continue;
    EP_POLL_YIELD();
    const uint64_t waited = dl_signal_clock_ns() - t0;
    if (waited > 100000 && spins % 1024 == 0 &&
        reinterpret_cast<volatile dl_ep_status_t *>(status)->kind == DL_EP_ERR_TIMEOUT)
      return false;
    if (waited > timeout_ns) {
      ep_fail(status, DL_EP_DISPATCH_RECV, DL_EP_ERR_TIMEOUT, (uint32_t)peer, epoch,
              dl_ep_calls_of(ep_ld_volatile(count)), epoch);
      return false;
    }
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
// (polled until it carries call `epoch`'s tag; n caches it), and j >= n;
// 0 when a poll gave up (ep_poll_vec or ep_poll_count, naming `peer` and the
// call; *blk_ok then 0).
__device__ __forceinline__ int ep_lamport_move(uint4 *dst, uint4 *src, int64_t v0, int64_t v1, int lane,
                                               const dl_ep_args_t &a, int peer, uint32_t epoch, int *blk_ok,
                                               const uint32_t *cw, int j, int &n) {
  const uint4 empty = make_uint4(DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY);
  const uint32_t *count = ep_ctrl(a, a.rank) + dl_ep_disp_flag(a.nranks, peer);
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
          if (!dl_ep_count_word_is(w, epoch) &&
              !ep_poll_count(cw, &w, epoch, a.timeout_ns, a.status, peer, count)) {
            *reinterpret_cast<volatile int *>(blk_ok) = 0;
            return 0;
          }
          n = (int)(w & 0xffffu);
        }
        if (j >= n) return 2;
        if (!ep_poll_vec(src + at, &y[u], a.timeout_ns, a.status, DL_EP_DISPATCH_RECV, peer, epoch, count, blk_ok))
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
                                                        const ep_split &sp, int64_t sg, uint32_t epoch, int *blk_ok,
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
                          lane, a, s, epoch, blk_ok, cw, j, n);
  // (a row whose payload came has its header coming)
  if (sg == 0 && r == 1 && lane < nh && !ep_vec_full(hv) &&
      !ep_poll_vec(hdr + lane, &hv, a.timeout_ns, a.status, DL_EP_DISPATCH_RECV, s, epoch,
                   ep_ctrl(a, a.rank) + dl_ep_disp_flag(a.nranks, s), blk_ok))
    r = 0;
  if (__ballot_sync(EP_FULL, r == 0) != 0u) return 0;
  if (__ballot_sync(EP_FULL, r == 2) != 0u) return 2;
  if (sg != 0) return 1;
  const int t = (int)ep_word_of(hv, 0);
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
    ok = ep_recv_rank_row_lamport(a, slots + ((int64_t)s * B + j) * a.msg_d, s, j, lane, sp, sg, e, &blk.ok,
                                  count_word(s), n) != 0 &&
         __ballot_sync(EP_FULL, *reinterpret_cast<volatile int *>(&blk.ok) == 0) == 0u;
  }
  // the outputs' counts (rows from each source, this rank's own too)
  if (blockIdx.x == gridDim.x - 1 && warp == 0 && lane < N) {
    const uint32_t *cw = count_word(lane);
    uint32_t w = ep_ld_volatile(cw);
    if (dl_ep_count_word_is(w, e) ||
        ep_poll_count(cw, &w, e, a.timeout_ns, a.status, lane, self + dl_ep_disp_flag(N, lane)))
      a.rcounts[lane] = (int)(w & 0xffffu);
    else
      *reinterpret_cast<volatile int *>(&blk.ok) = 0;
  }
  ep_finish(a, blk, dl_ep_disp_done, false);
}

// The receive phase with the flag, as a kernel of its own or the second half
// of the fused one (in Lamport slots: ep_dispatch_recv_lamport).
template <bool FP8, bool PER_RANK, bool EXPERT_MAJOR>
__device__ __forceinline__ void ep_dispatch_recv_body(const dl_ep_args_t &a) {
  const int phase = DL_EP_DISPATCH_RECV;
  EP_SMEM(smem);
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, L = a.local, K = a.topk, B = a.max_tokens, NL = N * L;
  constexpr bool DIRECT = PER_RANK && !EXPERT_MAJOR; // ep_dispatch_send_body
  int *cnt = smem, *pre = cnt + NL, *ntok = pre + NL + 1, *tmp = ntok + N;
  const uint32_t *self = ep_ctrl(a, a.rank);
  if (PER_RANK) {
    // Warp 0 does ep_begin, the counts' reads and their scan before one barrier
    // (not five): lane 0 reads the epoch, lane q < N waits for source q's
    // messages and reads how many they are, and the lanes scan them (N <= 8).
    // DIRECT: this rank's own rows are in place already; none is copied.
    if (warp == 0) {
      const uint32_t e = dl_ep_calls_of(__shfl_sync(EP_FULL, ep_count_now(a, dl_ep_disp_done), 0)) + 1;
      bool ok = true;
      int n = 0;
      if (lane < N) {
        ok = ep_wait(a, phase, dl_ep_disp_flag(N, lane), dl_ep_count_of(e), lane, e);
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
  } else {
    ep_begin(a, phase, blk, dl_ep_disp_flag, 0, dl_ep_disp_done);
    for (int i = tid; i < NL; i += blockDim.x) {
      const int s = i % N, le = i / N; // cnt[le * N + s]: expert-major order
      cnt[i] = (int)ep_ld_volatile(self + dl_ep_cnt(N, L, s, le));
    }
    for (int s = tid; s < N; s += blockDim.x) ntok[s] = (int)ep_ld_volatile(self + dl_ep_ntok(N, s));
    __syncthreads();
    ep_scan(cnt, NL, pre, tmp);
  }
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
  const int64_t total = PER_RANK ? pre[N] : pre[NL];
  const char *region = ep_buf(a, a.rank) + a.drecv_off;
  // rows cut into segments where the messages are fewer than the grid's warps;
  // a message's header words are written by its first segment's warp
  const int64_t warps = (int64_t)gridDim.x * W, items = PER_RANK && EXPERT_MAJOR ? total * K : total;
  const ep_split sp = ep_split_rows(items, warps, ep_row_vectors<FP8>(a));
  if (PER_RANK && EXPERT_MAJOR) {
    // A warp per (message, k): a message brings one payload for each of its selections
    // here, and one warp per message wrote them one after another (at B = 32 on 2 ranks,
    // 1.42x per_expert's dispatch, whose K messages go to K warps at once). Warp i of the
    // grid takes selection k = i % K of message i / K; a k that is not here costs a read
    // of one header word.
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
  }
  for (int64_t it = (int64_t)blockIdx.x * W + warp; !(PER_RANK && EXPERT_MAJOR) && blk.ok && it < items * sp.segs;
       it += warps) {
    const int64_t i = it / sp.segs, sg = it % sp.segs;
    if (PER_RANK) { // rank_major: row j of source s
      const int s = ep_group_of(pre, N, i), j = (int)(i - pre[s]);
      ep_recv_rank_row<FP8>(a, region + ((int64_t)s * B + j) * a.msg_d, s, j, lane, sp, sg);
    } else {
      const int g = ep_group_of(pre, NL, i), le = g / N, s = g % N, j = (int)(i - pre[g]);
      const char *msg = region + ((int64_t)g * B + j) * a.msg_d;
      const uint32_t *h = reinterpret_cast<const uint32_t *>(msg);
      const int t = (int)h[0], row_q = (int)h[1], k = (int)(h[2] & 0xffu);
      const uint32_t kmask = h[2] >> 8;
      if (EXPERT_MAJOR) {
        const int64_t row = (int64_t)le * N * B + (pre[g] - pre[le * N]) + j;
        if (lane == 0 && sg == 0) {
          a.rsrc[row * 2] = t;
          a.rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
        }
        ep_store_row<FP8>(a, msg + a.hdr, row, lane, sp, sg);
      } else {
        const int64_t row = (int64_t)s * B + row_q;
        if ((kmask & ((1u << k) - 1u)) == 0) { // the token's first selection here owns the row
          if (lane < K && !(kmask >> lane & 1u) && sg == 0) {
            a.rids[row * K + lane] = -1;
            a.rweights[row * K + lane] = 0.0f;
          }
          if (lane == 0 && sg == 0) {
            a.rsrc[row * 2] = t;
            a.rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
          }
          ep_store_row<FP8>(a, msg + a.hdr, row, lane, sp, sg);
        }
        if (lane == 0 && sg == 0) {
          a.rids[row * K + k] = le;
          a.rweights[row * K + k] = dl_bits_f32(h[3]);
        }
      }
    }
  }
  ep_finish(a, blk, dl_ep_disp_done, false);
}

template <bool FP8, bool PER_RANK, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_recv_kernel(const dl_ep_args_t a) {
  static_assert(!LAMPORT || (PER_RANK && !EXPERT_MAJOR && !FP8), "Lamport slots are per_rank's with rank_major output, bf16");
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  if constexpr (LAMPORT) ep_dispatch_recv_lamport(a);
  else ep_dispatch_recv_body<FP8, PER_RANK, EXPERT_MAJOR>(a);
}

// dispatch in one launch: the send, then (every block of every rank resident,
// as for the two kernels one after the other) the receive. One launch and one
// grid drain fewer than send and receive apart; the same words and epochs.
// Their dynamic shared memory is one region, used by one half at a time (the
// send's last use comes before the barrier that starts its ep_finish).
template <bool FP8, bool PER_RANK, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  // (the receive half reads its count where it starts, not here beside the
  // send's as the fused combine does: experiments/ep/NOTES.md)
  ep_dispatch_send_body<FP8, PER_RANK, EXPERT_MAJOR, LAMPORT>(a);
  if constexpr (LAMPORT) ep_dispatch_recv_lamport(a);
  else ep_dispatch_recv_body<FP8, PER_RANK, EXPERT_MAJOR>(a);
}

// ---- launchers ---------------------------------------------------------------------

typedef void (*ep_kernel_t)(const dl_ep_args_t);

// The kernel of a phase: per_rank with rank_major output in Lamport slots or
// with the flag (dl_ep_dispatch_lamport), the other layouts with the flag.
template <bool FP8> static ep_kernel_t dispatch_kernel_of(const dl_ep_args_t *a) {
  const int em = a->output == DL_EP_EXPERT_MAJOR, pr = a->layout == DL_EP_PER_RANK;
  const int lp = dl_ep_dispatch_lamport(pr, a->lamport, a->output, FP8);
  // per_expert's send is the same for both outputs; its receive differs. (lp is
  // never set with fp8, so no fp8 kernel in Lamport slots is instantiated.)
#define EP_DISPATCH_PICK(KERNEL)                                                                            \
  (pr ? (em ? KERNEL<FP8, true, true, false> : lp ? KERNEL<FP8, true, false, !FP8> : KERNEL<FP8, true, false, false>) \
      : KERNEL<FP8, false, true, false>)
  switch (a->phase) {
  case DL_EP_DISPATCH_SEND: return EP_DISPATCH_PICK(ep_dispatch_send_kernel);
  case DL_EP_DISPATCH_RECV:
    return !pr && !em ? ep_dispatch_recv_kernel<FP8, false, false, false> : EP_DISPATCH_PICK(ep_dispatch_recv_kernel);
  default: return !pr && !em ? ep_dispatch_kernel<FP8, false, false, false> : EP_DISPATCH_PICK(ep_dispatch_kernel);
  }
#undef EP_DISPATCH_PICK
}

static ep_kernel_t dispatch_kernel(const dl_ep_args_t *a) {
  return a->fp8 ? dispatch_kernel_of<true>(a) : dispatch_kernel_of<false>(a);
}

static const char *dispatch_name(int phase) {
  return phase == DL_EP_DISPATCH_SEND ? "ep_dispatch_send_kernel"
         : phase == DL_EP_DISPATCH_RECV ? "ep_dispatch_recv_kernel"
                                        : "ep_dispatch_kernel";
}

int ep_launch_dispatch(const dl_ep_args_t *a, void *stream, int64_t smem) {
  return dl_launch(dispatch_kernel(a), dispatch_name(a->phase), a->blocks, a->threads, smem, stream, a->pdl, *a);
}

extern "C" int64_t dl_ep_cuda_smem(const dl_ep_args_t *a) {
  const int groups = a->output == DL_EP_EXPERT_MAJOR ? a->local : a->nranks;
  const int64_t send = ep_send_smem(a->experts, a->tokens > 0 ? (a->tokens + a->blocks - 1) / a->blocks : 0, a->topk);
  const int64_t recv = ep_recv_smem(a->nranks, a->experts);
  switch (a->phase) {
  case DL_EP_DISPATCH_SEND: return send;
  case DL_EP_DISPATCH_RECV: return recv;
  case DL_EP_DISPATCH: return send > recv ? send : recv; // one region, a half at a time
  case DL_EP_COMBINE_SEND:
  case DL_EP_COMBINE: return 4 * ((int64_t)2 * groups + 1 + 32); // the receive uses none
  default: return 0;
  }
}

extern "C" int dl_ep_cuda(const dl_ep_args_t *a, void *stream) {
  if (a->blocks < 1 || a->blocks > DL_EP_MAX_BLOCKS || a->threads < 32 || a->threads % 32 ||
      a->threads > DL_EP_THREADS || a->nranks < 1 || a->nranks > DL_SIGNAL_MAX_RANKS || a->topk > DL_EP_MAX_TOPK)
    return DL_ERR(DL_EINVAL, "ep: bad launch shape (%d blocks of %d threads, %d ranks, topk %d)", a->blocks,
                  a->threads, a->nranks, a->topk);
  const int64_t smem = dl_ep_cuda_smem(a);
  switch (a->phase) {
  case DL_EP_DISPATCH_SEND:
  case DL_EP_DISPATCH_RECV:
  case DL_EP_DISPATCH: return ep_launch_dispatch(a, stream, smem);
  case DL_EP_COMBINE_SEND:
  case DL_EP_COMBINE_RECV:
  case DL_EP_COMBINE: return ep_launch_combine(a, stream, smem);
  default: return DL_ERR(DL_EINVAL, "ep: unknown phase %d", a->phase);
  }
}
