/*
 * ep_dispatch.cu — the dispatch kernels of the expert-parallel buffer
 * (layout, message formats and protocol: kernels/ep/ep.h), instantiated for
 * each layout policy (ep_layouts.cuh), and the launcher of all four phases,
 * dl_ep_cuda.
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
 *       with one scale); the layout says which entries send, where and with
 *       what header. The last block (its scan and walk cover every token)
 *       writes the counts into every receiver's control words; every block
 *       then adds its share to each receiver's disp_flag (release). The wait
 *       for the receivers' reading of the previous call (disp_done) comes
 *       after the routing, just before the first write to a peer. In Lamport
 *       slots (a.lamport: ep.h) the counts go ahead of the messages and the
 *       flag's add is relaxed (no system fence).
 *   ep_dispatch_recv_kernel   the layout's receive (its dispatch_recv, or in
 *       Lamport slots dispatch_recv_lamport): the payloads copied into the
 *       outputs with the rows' origin (src) for combine; every block then
 *       adds its share to each source's disp_done.
 *   ep_dispatch_kernel        both in one launch.
 *
 * Requirements: H a multiple of 8 (of 128 with fp8), K <= 24, at most 8
 * ranks, blockDim a multiple of 32. Reference: kernels/ep/cpu/ep.c (the same
 * arguments and routing, bit for bit), checked by spec/ep_spec.lua.
 */
#include "ep/ep_layouts.cuh"

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
// DIRECT (Layout::direct, per_rank with rank_major output): the messages to
// this rank are not messages: the send writes them straight into their
// output rows (row j of source `rank`, with ids, weights and origin), and the
// receive copies only the peers' (at 2 ranks half the rows cross no link and
// were copied twice). LAMPORT (DIRECT only): the peers' messages go into
// Lamport slots of the call's half, each receiver's count ahead of them, and
// the count is relaxed (ep.h).
template <bool FP8, class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__device__ __forceinline__ void ep_dispatch_send_body(const dl_ep_args_t &a) {
  constexpr bool DIRECT = Layout::template direct<EXPERT_MAJOR>;
  static_assert(!LAMPORT || (DIRECT && !FP8), "Lamport slots are a direct send's, bf16");
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
  ep_announce(a, phase, e);
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
      // the entries that send (the layout's choice)
      const uint32_t sends = __ballot_sync(EP_FULL, ev >= 0 && Layout::sends(qmask, below));
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
  // (tagged with the call, as the rows' headers are: ep.h)
  const uint32_t call = LAMPORT ? dl_ep_call(ep_ctrl(a, a.rank), N, a.rank, phase, e) : 0u;
  if (LAMPORT && blockIdx.x == gridDim.x - 1 && blk.ok && tid < N)
    *reinterpret_cast<uint32_t *>(ep_buf(a, tid) + a.drecv_off + dl_ep_dispatch_count_off(N, B, a.msg_d, a.rank)) =
        dl_ep_count_word(call, (uint32_t)hist_r[tid]);
  if (blockIdx.x == gridDim.x - 1 && blk.ok) ep_send_tag(a, phase, e); // the call's tag (ep.h), with the counts
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
    char *msg = ep_buf(a, q) + a.drecv_off + Layout::dispatch_slot(rslot, rpos, i, le, N, B, a.rank, half) * a.msg_d;
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
      if (j == 0) v = LAMPORT ? (uint32_t)t | (call & 0xffffu) << 16 : (uint32_t)t;
      else v = Layout::header_word(re, rpos, rslot, rw, i, k, km, K, L, q, j);
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

template <bool FP8, class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_send_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  ep_dispatch_send_body<FP8, Layout, EXPERT_MAJOR, LAMPORT>(a);
}

// ---- dispatch receive ----------------------------------------------------------------

// Shared memory of the receive kernel: cnt[N][L], the message prefix sums
// (E + 1, or N + 1), ntok[N] and the scan's 32.
__host__ __device__ __forceinline__ int64_t ep_recv_smem(int nranks, int experts) {
  return 4 * (2 * (int64_t)experts + 2 * (int64_t)nranks + 2 + 32);
}

// The receive phase: the layout's (in Lamport slots its Lamport receive).
template <bool FP8, class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__device__ __forceinline__ void ep_dispatch_recv_body(const dl_ep_args_t &a) {
  static_assert(!LAMPORT || (Layout::has_lamport && !EXPERT_MAJOR && !FP8), "Lamport slots: rank_major output, bf16");
  if constexpr (LAMPORT) Layout::dispatch_recv_lamport(a);
  else Layout::template dispatch_recv<FP8, EXPERT_MAJOR>(a);
}

template <bool FP8, class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_recv_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  ep_dispatch_recv_body<FP8, Layout, EXPERT_MAJOR, LAMPORT>(a);
}

// dispatch in one launch: the send, then (every block of every rank resident,
// as for the two kernels one after the other) the receive. One launch and one
// grid drain fewer than send and receive apart; the same words and epochs.
// Their dynamic shared memory is one region, used by one half at a time (the
// send's last use comes before the barrier that starts its ep_finish).
template <bool FP8, class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_dispatch_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  // (the receive half reads its count where it starts, not here beside the
  // send's as the fused combine does: experiments/ep/NOTES.md)
  ep_dispatch_send_body<FP8, Layout, EXPERT_MAJOR, LAMPORT>(a);
  ep_dispatch_recv_body<FP8, Layout, EXPERT_MAJOR, LAMPORT>(a);
}

// ---- launchers ---------------------------------------------------------------------

// The kernel of a phase for layout L, output EM, Lamport slots LP (a send
// that does not depend on the output is one kernel: L::send_output).
template <bool FP8, class L, bool EM, bool LP> static ep_kernel_t dispatch_kernel_at(int phase) {
  switch (phase) {
  case DL_EP_DISPATCH_SEND: return ep_dispatch_send_kernel<FP8, L, L::template send_output<EM>, LP>;
  case DL_EP_DISPATCH_RECV: return ep_dispatch_recv_kernel<FP8, L, EM, LP>;
  default: return ep_dispatch_kernel<FP8, L, EM, LP>;
  }
}

// The dispatch kernel of a->phase: of a's layout and output, in Lamport slots
// where dl_ep_dispatch_lamport says (bf16 only: no fp8 kernel in Lamport
// slots is instantiated).
template <bool FP8> static ep_kernel_t dispatch_kernel_of(const dl_ep_args_t *a) {
  return ep_pick_layout(a, ep_layouts(), [a]<class L>() -> ep_kernel_t {
    if (a->output == DL_EP_EXPERT_MAJOR) return dispatch_kernel_at<FP8, L, true, false>(a->phase);
    if constexpr (L::has_lamport && !FP8)
      if (dl_ep_dispatch_lamport(L::id, a->lamport, a->output, FP8))
        return dispatch_kernel_at<FP8, L, false, true>(a->phase);
    return dispatch_kernel_at<FP8, L, false, false>(a->phase);
  });
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
