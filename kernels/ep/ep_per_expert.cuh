// ep_per_expert.cuh — the per_expert layout (kernels/ep/ep.h) as a policy of
// the EP kernels (ep_dispatch.cu, ep_combine.cu): a message per (token,
// selection) into slot [local expert][source][position of the token among the
// source's tokens for the expert], its 16-byte header (token, rank_major row,
// k | kmask << 8, weight), and the combine's slots [expert][token]. Its twin:
// kernels/ep/cpu/ep.c (the per_expert functions). What a layout provides:
// ep_layouts.cuh.
#ifndef DISTLAB_EP_PER_EXPERT_CUH
#define DISTLAB_EP_PER_EXPERT_CUH

#include "ep/ep_device.cuh"

// The receive with the flag: wait for every source, then a warp per message
// (at small B per segment of one) copies the payload into the outputs:
// expert_major rows at the expert's offset for the source (prefix sums of the
// counts) plus the position; rank_major row `row_q` of the source, which the
// token's first selection here owns, with its expert ids and weights.
template <bool FP8, bool EXPERT_MAJOR> __device__ __forceinline__ void ep_per_expert_recv(const dl_ep_args_t &a) {
  const int phase = DL_EP_DISPATCH_RECV;
  EP_SMEM(smem);
  EP_SHARED(ep_block, blk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, W = blockDim.x >> 5;
  const int N = a.nranks, L = a.local, K = a.topk, B = a.max_tokens, NL = N * L;
  int *cnt = smem, *pre = cnt + NL, *ntok = pre + NL + 1, *tmp = ntok + N;
  const uint32_t *self = ep_ctrl(a, a.rank);
  ep_begin(a, phase, blk, dl_ep_disp_flag, 0, dl_ep_disp_done);
  for (int i = tid; i < NL; i += blockDim.x) {
    const int s = i % N, le = i / N; // cnt[le * N + s]: expert-major order
    cnt[i] = (int)ep_ld_volatile(self + dl_ep_cnt(N, L, s, le));
  }
  for (int s = tid; s < N; s += blockDim.x) ntok[s] = (int)ep_ld_volatile(self + dl_ep_ntok(N, s));
  __syncthreads();
  ep_scan(cnt, NL, pre, tmp);
  ep_recv_counts<EXPERT_MAJOR>(a, cnt, ntok, N, L, tid);
  const int64_t total = pre[NL];
  const char *region = ep_buf(a, a.rank) + a.drecv_off;
  // rows cut into segments where the messages are fewer than the grid's warps
  const int64_t warps = (int64_t)gridDim.x * W, items = total;
  const ep_split sp = ep_split_rows(items, warps, ep_row_vectors<FP8>(a));
  for (int64_t it = (int64_t)blockIdx.x * W + warp; blk.ok && it < items * sp.segs; it += warps) {
    const int64_t i = it / sp.segs, sg = it % sp.segs;
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
  ep_finish(a, blk, dl_ep_disp_done, false);
}

struct ep_per_expert {
  static constexpr int id = DL_EP_PER_EXPERT;
  // no Lamport slots; the send is the same for both outputs (EXPERT_MAJOR is ignored)
  static constexpr bool has_lamport = false;
  template <bool EXPERT_MAJOR> static constexpr bool direct = false;
  template <bool EXPERT_MAJOR> static constexpr bool send_output = true;

  // Whether a selection of the send's routing sends a message (qmask: the
  // token's selections on its rank; below: the lanes of earlier k): every one.
  __device__ static __forceinline__ bool sends(uint32_t qmask, uint32_t below) { return true; }
  // The slot at its receiver of entry i's message (the send's routing in
  // shared memory: per entry its slot at the destination rank, rslot, and
  // its position among our tokens for its expert, rpos; local expert le).
  __device__ static __forceinline__ int64_t dispatch_slot(const int *rslot, const int *rpos, int i, int le, int N,
                                                          int B, int rank, int64_t half) {
    return ((int64_t)le * N + rank) * B + rpos[i];
  }
  // Word j >= 1 of entry i's header (selection k, the token's selections on
  // its rank km, to rank q), from the send's routing in shared memory: per
  // entry its expert re, position rpos, slot rslot and weight rw.
  __device__ static __forceinline__ uint32_t header_word(const int *re, const int *rpos, const int *rslot,
                                                         const float *rw, int i, int k, uint32_t km, int K, int L,
                                                         int q, int j) {
    return j == 1 ? (uint32_t)rslot[i] : j == 2 ? ((uint32_t)k | km << 8) : dl_f32_bits(rw[i]);
  }
  template <bool FP8, bool EXPERT_MAJOR> __device__ static __forceinline__ void dispatch_recv(const dl_ep_args_t &a) {
    ep_per_expert_recv<FP8, EXPERT_MAJOR>(a);
  }
  // The combine slot of selection k of a token, expert e: one per expert.
  __device__ static __forceinline__ int64_t combine_slot(int k, int64_t e) { return e; }
};

#endif
