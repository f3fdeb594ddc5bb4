/*
 * ep_combine.cu — the combine kernels of the expert-parallel buffer
 * (layout, message formats and protocol: kernels/ep/ep.h), instantiated for
 * each layout policy (ep_layouts.cuh: its combine_slot).
 *
 *   ep_combine_send_kernel   on the experts' rank: once every owner has read
 *       our previous combine, a warp per output row (rows r < counts[g] of
 *       each expert, or source; at small B per segment of one) sends y's row
 *       to its owner's slot: [k][t] (per_rank; rank_major rows to the
 *       token's first selection on this rank; in Lamport slots, of the
 *       call's half, where a.lamport: ep.h) or [e][t] (per_expert), 16-byte
 *       vectors over NVLink. Every block then adds its share to every
 *       owner's comb_flag (a release; in Lamport slots a relaxed add: the
 *       rows say themselves that they are there).
 *   ep_combine_recv_kernel   on the owner: waits for every rank's comb_flag
 *       (not with Lamport slots); then a warp per token (at small B per
 *       segment of one) sums its slots in fp32, k by k with fmaf
 *       (expert_major: weighted by topk_weights; rank_major: the rows came
 *       weighted, one per rank), skipping ids of -1, and writes bf16; in
 *       Lamport slots it polls each vector until it is there, and empties it
 *       once summed. Every block then adds its share to every rank's
 *       comb_done.
 *
 * Reference: kernels/ep/cpu/ep.c (the same sums in the same order).
 */
#include "ep/ep_layouts.cuh"

template <class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__device__ __forceinline__ void ep_combine_send_body(const dl_ep_args_t &a) {
  const int phase = DL_EP_COMBINE_SEND;
  EP_SMEM(smem);
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, B = a.max_tokens, H = a.hidden;
  const int groups = EXPERT_MAJOR ? a.local : N;
  const int64_t per_group = EXPERT_MAJOR ? (int64_t)N * B : B;
  int *counts = smem, *pre = counts + groups, *tmp = pre + groups + 1;
  const uint32_t count = ep_count_now(a, dl_ep_comb_flag); // ep_start, its load beside the counts'
  for (int g = tid; g < groups; g += blockDim.x) counts[g] = a.rcounts[g];
  ep_set_epoch(blk, count);
  __syncthreads();
  ep_announce(a, phase, blk.epoch);
  ep_scan(counts, groups, pre, tmp);
  const int64_t warps = (int64_t)gridDim.x * W, rows = pre[groups], nv = H / 8;
  const ep_split sp = ep_split_rows(rows, warps, nv); // rows cut into segments (ep_device.cuh)
  // A warp's first row: its origin and its first batch of y are loaded before
  // the wait below (it guards the stores only), so the wait hides their latency.
  const int64_t it0 = (int64_t)blockIdx.x * W + warp;
  ep_batch b;
  int t = 0;
  uint32_t p = 0;
  int64_t lo = 0, hi = 0;
  const char *src = nullptr;
  // item it: bytes [lo, hi) of output row `row`, its origin (t, p) and its first batch of y
  auto fetch = [&](int64_t it) {
    const int64_t i = it / sp.segs;
    const int g = ep_group_of(pre, groups, i);
    const int64_t row = g * per_group + (i - pre[g]);
    lo = 16 * (it % sp.segs) * sp.per;
    hi = min(16 * nv, lo + 16 * sp.per);
    t = a.rsrc[row * 2];
    p = (uint32_t)a.rsrc[row * 2 + 1];
    src = reinterpret_cast<const char *>(a.y) + row * H * 2 + lo;
    ep_load_batch(b, src, (hi - lo) / 16, lane);
  };
  if (it0 < rows * sp.segs) fetch(it0);
  // the owners have read our previous combine (per_rank: and emptied the
  // slots of this call's half in the call before it, ep.h)
  ep_await(a, phase, blk, dl_ep_comb_done, -1);
  if (blockIdx.x == 0 && blk.ok) ep_send_tag(a, phase, blk.epoch); // the call's tag (ep.h), ahead of block 0's count
  const int64_t half = dl_ep_combine_half(LAMPORT, a.topk, B, blk.epoch);
  for (int64_t it = it0; blk.ok && it < rows * sp.segs; it += warps) {
    if (it != it0) fetch(it);
    const int s = (int)(p & 0xffu), k = (int)((p >> 8) & 0xffu), le = (int)(p >> 16);
    const int64_t slot = Layout::combine_slot(k, (int64_t)a.rank * a.local + le);
    char *dst = ep_buf(a, s) + a.crecv_off + (half + slot * B + t) * a.msg_c;
    ep_copy_row_loaded<LAMPORT>(dst + lo, src, hi - lo, lane, b);
  }
  ep_finish(a, blk, dl_ep_comb_flag, !LAMPORT);
}

template <class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_combine_send_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  ep_combine_send_body<Layout, EXPERT_MAJOR, LAMPORT>(a);
}

struct ep_sums {
  const uint4 *slots[DL_EP_THREADS / 32][DL_EP_MAX_TOPK];
  float weights[DL_EP_THREADS / 32][DL_EP_MAX_TOPK];
  int from[DL_EP_THREADS / 32][DL_EP_MAX_TOPK]; // the rank that sends the slot's row (per_rank: a timeout's peer)
};

template <class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__device__ __forceinline__ void ep_combine_recv_body(const dl_ep_args_t &a, const uint32_t *early = nullptr) {
  const int phase = DL_EP_COMBINE_RECV;
  EP_SHARED(ep_block, blk);
  EP_SHARED(ep_sums, sh); // per warp: the token's slots and weights, in k order
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int K = a.topk, B = a.max_tokens, H = a.hidden, L = a.local;
  const int64_t warps = (int64_t)gridDim.x * W, nv = H / 8;
  const ep_split sp = ep_split_rows(a.tokens, warps, nv); // tokens cut into segments (ep_device.cuh)
  // lane k: the expert and weight of selection k of the warp's next token (the
  // handle is ours: the first token's are loaded before the wait for the rows)
  int64_t it = (int64_t)blockIdx.x * W + warp;
  int nid = -1;
  float nwt = 0.0f;
  if (it < a.tokens * sp.segs && lane < K) {
    nid = a.hidx[it / sp.segs * K + lane];
    nwt = a.hw[it / sp.segs * K + lane];
  }
  if constexpr (LAMPORT) ep_start(a, blk, dl_ep_comb_done, early); // no wait: the slots say when a row is there
  else ep_begin(a, phase, blk, dl_ep_comb_flag, 0, dl_ep_comb_done, early);
  const uint32_t epoch = blk.epoch;
  char *region = ep_buf(a, a.rank) + a.crecv_off + dl_ep_combine_half(LAMPORT, K, B, epoch) * a.msg_c;
  // the warp's: no wait of the block timed out (one answer for its lanes:
  // with Lamport slots another warp may clear the block's word while they read it)
  bool ok = true;
  if constexpr (LAMPORT) ok = __ballot_sync(EP_FULL, *reinterpret_cast<volatile int *>(&blk.ok) == 0) == 0u;
  for (; (LAMPORT ? ok : blk.ok) && it < a.tokens * sp.segs; it += warps) {
    const int t = (int)(it / sp.segs);
    const int64_t lo = (it % sp.segs) * sp.per, hi = min(nv, lo + sp.per);
    // lane k: the slot of selection k and its weight; n of them, in k order
    const int id = nid;
    bool use = id >= 0;
    float w = use ? nwt : 0.0f;
    nid = -1;
    if (it + warps < a.tokens * sp.segs && lane < K) {
      nid = a.hidx[(it + warps) / sp.segs * K + lane];
      nwt = a.hw[(it + warps) / sp.segs * K + lane];
    }
    if (!EXPERT_MAJOR) { // one row per rank: the rank's first selection
      for (int j = 0; j < K; j++) {
        const int ij = __shfl_sync(EP_FULL, id, j);
        if (j < lane && ij >= 0 && use && ij / L == id / L) use = false;
      }
      w = 1.0f;
    }
    const uint32_t m = __ballot_sync(EP_FULL, use);
    if (use) {
      const int at = __popc(m & ((1u << lane) - 1u));
      sh.slots[warp][at] = reinterpret_cast<const uint4 *>(region + (Layout::combine_slot(lane, id) * B + t) * a.msg_c);
      sh.weights[warp][at] = w;
      if constexpr (LAMPORT) sh.from[warp][at] = id / L;
    }
    __syncwarp();
    const int n = __popc(m);
    uint4 *out = reinterpret_cast<uint4 *>(reinterpret_cast<char *>(a.out) + (int64_t)t * H * 2);
    bool here = true; // Lamport slots: every vector this lane summed had arrived
    for (int64_t v = lo + lane; v < hi; v += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if constexpr (LAMPORT) { // four polls in flight, then the slow path for a vector not there yet
        for (int j0 = 0; j0 < n; j0 += 4) {
          uint4 y[4];
#pragma unroll
          for (int u = 0; u < 4; u++)
            if (j0 + u < n) y[u] = ep_ld_vec_volatile(sh.slots[warp][j0 + u] + v);
#pragma unroll
          for (int u = 0; u < 4; u++) {
            const int j = j0 + u;
            if (j >= n) break;
            if (here && !ep_vec_full(y[u]) &&
                !ep_poll_vec(sh.slots[warp][j] + v, &y[u], a.timeout_ns, a.status, phase, sh.from[warp][j], epoch,
                             ep_ctrl(a, a.rank), a.nranks, a.rank, &blk.ok))
              here = false;
            const float wj = sh.weights[warp][j];
            const uint32_t wd[4] = {y[u].x, y[u].y, y[u].z, y[u].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
              acc[2 * i] = fmaf(wj, dl_bf16_to_f32((uint16_t)(wd[i] & 0xffffu)), acc[2 * i]);
              acc[2 * i + 1] = fmaf(wj, dl_bf16_to_f32((uint16_t)(wd[i] >> 16)), acc[2 * i + 1]);
            }
          }
        }
        if (!here) continue;
        const uint4 empty = make_uint4(DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY, DL_EP_EMPTY);
        for (int j = 0; j < n; j++) const_cast<uint4 *>(sh.slots[warp][j])[v] = empty;
      } else {
#pragma unroll 4
        for (int j = 0; j < n; j++) {
          const uint4 y = sh.slots[warp][j][v];
          const float wj = sh.weights[warp][j];
          const uint32_t wd[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
          for (int i = 0; i < 4; i++) {
            acc[2 * i] = fmaf(wj, dl_bf16_to_f32((uint16_t)(wd[i] & 0xffffu)), acc[2 * i]);
            acc[2 * i + 1] = fmaf(wj, dl_bf16_to_f32((uint16_t)(wd[i] >> 16)), acc[2 * i + 1]);
          }
        }
      }
      uint32_t o[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        o[i] = (uint32_t)dl_f32_to_bf16(acc[2 * i]) | (uint32_t)dl_f32_to_bf16(acc[2 * i + 1]) << 16;
      out[v] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    if constexpr (LAMPORT) // one answer for the warp's lanes (each reads the block's word; another warp may clear it)
      ok = __ballot_sync(EP_FULL, !here || *reinterpret_cast<volatile int *>(&blk.ok) == 0) == 0u;
    __syncwarp();
  }
  ep_finish(a, blk, dl_ep_comb_done, false);
}

template <class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_combine_recv_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  ep_combine_recv_body<Layout, EXPERT_MAJOR, LAMPORT>(a);
}

// combine in one launch: the send, then the receive (as ep_dispatch_kernel).
template <class Layout, bool EXPERT_MAJOR, bool LAMPORT>
__global__ void __launch_bounds__(DL_EP_THREADS, 2) ep_combine_kernel(const dl_ep_args_t a) {
  dl_pdl_wait(); // the grid ahead done and visible (a launch with a.pdl may start early)
  dl_pdl_release();
  // the receive half's count (ep_start), read now: its load off the receive's path
  const uint32_t early = ep_count_now(a, dl_ep_comb_done);
  ep_combine_send_body<Layout, EXPERT_MAJOR, LAMPORT>(a);
  ep_combine_recv_body<Layout, EXPERT_MAJOR, LAMPORT>(a, &early);
}

// ---- launcher ----------------------------------------------------------------------

template <class L, bool EM, bool LP> static ep_kernel_t combine_kernel_at(int phase) {
  if (phase == DL_EP_COMBINE_SEND) return ep_combine_send_kernel<L, EM, LP>;
  if (phase == DL_EP_COMBINE) return ep_combine_kernel<L, EM, LP>;
  return ep_combine_recv_kernel<L, EM, LP>;
}

// The combine kernel of a->phase: of a's layout and output, in Lamport slots
// where the layout has them and a.lamport.
static ep_kernel_t combine_kernel(const dl_ep_args_t *a) {
  return ep_pick_layout(a, ep_layouts(), [a]<class L>() -> ep_kernel_t {
    const bool em = a->output == DL_EP_EXPERT_MAJOR;
    if constexpr (L::has_lamport)
      if (a->lamport) return em ? combine_kernel_at<L, true, true>(a->phase) : combine_kernel_at<L, false, true>(a->phase);
    return em ? combine_kernel_at<L, true, false>(a->phase) : combine_kernel_at<L, false, false>(a->phase);
  });
}

int ep_launch_combine(const dl_ep_args_t *a, void *stream, int64_t smem) {
  const ep_kernel_t k = combine_kernel(a);
  const char *name = a->phase == DL_EP_COMBINE_SEND   ? "ep_combine_send_kernel"
                     : a->phase == DL_EP_COMBINE_RECV ? "ep_combine_recv_kernel"
                                                      : "ep_combine_kernel";
  return dl_launch(k, name, a->blocks, a->threads, smem, stream, a->pdl, *a);
}
