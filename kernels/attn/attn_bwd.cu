/*
 * attn_bwd.cu — flash attention backward (FA2 algorithm) for one attention
 * step: dq, dk, dv of sum(dout * out) given q, k, v, out and the forward's
 * lse (which may be a merged lse: P = exp(scale q k^T - lse)).
 *
 *   attn_bwd_prep_kernel   D = rowsum(dout * out) into the workspace, and
 *                          zero the fp32 dQ accumulator rows
 *   attn_bwd_kernel        one CTA per BN keys of one kv head (and one half
 *                          of the head dims when NSPLIT = 2); it loops over
 *                          the q heads of its GQA group and their BM-row
 *                          blocks that see its keys, keeping dK, dV in
 *                          registers, and adds dQ with fp32 vector atomics
 *   attn_bwd_dq_kernel     dq = scale * accumulator (+ dq if accumulating)
 * On sm_90, where dl_attn_bwd_hopper_fits takes the call, the Hopper main
 * kernel (kernels/attn/hopper/bwd_kernel.cuh: wgmma, TMA) and its own dQ
 * conversion run instead of attn_bwd_kernel and attn_bwd_dq_kernel, on the
 * same workspace (and, where dl_attn_bwd_hopper_preps says so, its own prep
 * instead of attn_bwd_prep_kernel).
 *
 * In attn_bwd_kernel each warp owns 16 keys and computes transposed tiles:
 * S^T = K Q^T and dP^T = V dO^T have keys as rows, so P^T and
 * dS^T = P^T (dP^T - D) sit in registers exactly as the A operand of
 * dV += P^T dO and dK += dS^T Q. dS^T also goes to shared memory once for
 * dQ = dS K, which the warps share out as (16 rows, column group) tiles.
 * Q, dO, lse and D of the next row block load with cp.async during the
 * current one (two stages); two barriers per block. With NSPLIT = 2 (head
 * dims > 128) S^T and dP^T are computed by both halves, so the accumulators
 * fit in registers.
 *
 * Requires what attn_fwd.cu requires, plus the workspace of
 * dl_attn_bwd_workspace_bytes. Checked against dl_attn_bwd_cpu by
 * experiments/lab/attn/attn_check.cu (on a GPU, and on the CPU emulator).
 */
#include "attn_common.cuh"

/* Lab knob: warps (= keys / 16) of the d=128 CTA: 8 (BN=128, 1 CTA/SM) or 4
 * (BN=64, 2 CTAs/SM), so experiments/lab/attn can compare them on a GPU. */
#ifndef DL_ATTN_BWD128_NW
#define DL_ATTN_BWD128_NW 8
#endif

template <int D_QK_, int D_V_, int NW_, int NSPLIT_>
struct attn_bwd_cfg {
  static constexpr int D_QK = D_QK_, D_V = D_V_, NW = NW_, NSPLIT = NSPLIT_, NT = 32 * NW;
  static constexpr int BN = 16 * NW, BM = 64, QT = BM / 8;
  static constexpr int DKS = D_QK / NSPLIT, DVS = D_V / NSPLIT; /* columns of dK/dQ, dV per CTA */
  static constexpr int MQ = BM / 16, CG = NW / MQ, DQC = DKS / CG, DQT = DQC / 8;
  static constexpr int DQP = DQT < 8 ? DQT : 8; /* n8 tiles of dQ per pass */
  static constexpr int SQ = BM * D_QK, SDO = BM * D_V; /* elements of one stage */
  static constexpr size_t SMEM =
      (size_t)(BN * D_QK + BN * D_V + 2 * SQ + 2 * SDO + BN * BM) * 2 + 4 * BM * sizeof(float);
  static_assert(NW % MQ == 0 && DQC % 16 == 0 && DKS % 16 == 0 && DVS % 16 == 0 && DQT % DQP == 0, "bwd tiles");
};

/* Rows of the workspace: thd rows of the tensor, else b * s_q. */
ATTN_DEV int64_t attn_ws_row(const dl_attn_params_t &p, const attn_seq_t &s, int bi, int i) {
  return s.thd ? s.q_start + i : (int64_t)bi * p.s_q + i;
}

static int64_t attn_ws_rows(const dl_attn_params_t *p) {
  return p->cu_seqlens_q ? p->total_q : (int64_t)p->b * p->s_q;
}

/* ---- kernels ------------------------------------------------------------------ */

enum { PREP_ROWS = 16 };

/* grid (ceil(s_q/16), h_q, b), 128 threads: a warp per row at a time. */
template <bool BF16>
__global__ void attn_bwd_prep_kernel(const dl_attn_params_t p, float *dq_acc, float *delta) {
  dl_pdl_release(); // the Hopper main kernel may start (its reads of D and the accumulator wait: B11)
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hq = blockIdx.y, bi = blockIdx.z;
  const attn_seq_t sq = attn_seq(p, bi);
  const int64_t rows = p.cu_seqlens_q ? p.total_q : (int64_t)p.b * p.s_q;
  for (int i = blockIdx.x * PREP_ROWS + warp; i < min((int)(blockIdx.x + 1) * PREP_ROWS, sq.q_len); i += 4) {
    const uint16_t *o = (const uint16_t *)p.out + attn_base(p.out_st, sq, bi, true) + i * p.out_st.s + hq * p.out_st.h;
    const uint16_t *d = (const uint16_t *)p.dout + attn_base(p.dout_st, sq, bi, true) + i * p.dout_st.s + hq * p.dout_st.h;
    float acc = 0;
    for (int c = 2 * lane; c < p.d_v; c += 64) {
      uint32_t x = *(const uint32_t *)(o + c), y = *(const uint32_t *)(d + c);
      acc += attn_unpack_lo<BF16>(x) * attn_unpack_lo<BF16>(y) + attn_unpack_hi<BF16>(x) * attn_unpack_hi<BF16>(y);
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) acc += attn_shfl_xor(acc, x);
    const int64_t row = hq * rows + attn_ws_row(p, sq, bi, i);
    if (lane == 0) delta[row] = acc;
    for (int c = lane; c < p.d_qk; c += 32) dq_acc[row * p.d_qk + c] = 0;
  }
}

template <bool BF16>
__global__ void attn_bwd_dq_kernel(const dl_attn_params_t p, const float *dq_acc) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hq = blockIdx.y, bi = blockIdx.z;
  const attn_seq_t sq = attn_seq(p, bi);
  const int64_t rows = p.cu_seqlens_q ? p.total_q : (int64_t)p.b * p.s_q;
  for (int i = blockIdx.x * PREP_ROWS + warp; i < min((int)(blockIdx.x + 1) * PREP_ROWS, sq.q_len); i += 4) {
    uint16_t *dq = (uint16_t *)p.dq + attn_base(p.dq_st, sq, bi, true) + i * p.dq_st.s + hq * p.dq_st.h;
    const float *a = dq_acc + (hq * rows + attn_ws_row(p, sq, bi, i)) * p.d_qk;
    for (int c = 2 * lane; c < p.d_qk; c += 64) {
      float x0 = a[c] * p.scale, x1 = a[c + 1] * p.scale;
      if (p.accumulate_grads) {
        uint32_t old = *(uint32_t *)(dq + c);
        x0 += attn_unpack_lo<BF16>(old), x1 += attn_unpack_hi<BF16>(old);
      }
      *(uint32_t *)(dq + c) = attn_pack2<BF16>(x0, x1);
    }
  }
}

/* Writes (or adds) a warp's 16 rows of dK or dV: columns c0 + 8*t of acc. */
template <int TILES, bool BF16>
ATTN_DEV void attn_bwd_store_rows(const dl_attn_params_t &p, uint16_t *g, int64_t row_stride,
                                  int rows, int c0, int cols, float acc[][4], float mul, int lane) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int j = (lane >> 2) + r * 8;
    if (j >= rows) continue;
#pragma unroll
    for (int t = 0; t < TILES; t++) {
      const int c = c0 + t * 8 + (lane & 3) * 2;
      if (c >= cols) continue;
      uint32_t *dst = (uint32_t *)(g + j * row_stride + c);
      float x0 = acc[t][2 * r] * mul, x1 = acc[t][2 * r + 1] * mul;
      if (p.accumulate_grads) {
        uint32_t old = *dst;
        x0 += attn_unpack_lo<BF16>(old), x1 += attn_unpack_hi<BF16>(old);
      }
      *dst = attn_pack2<BF16>(x0, x1);
    }
  }
}

/* Loads the Q, dO, lse and D rows of block m0 of head hq into stage st. */
template <class C>
ATTN_DEV void attn_bwd_load_stage(const dl_attn_params_t &p, const attn_seq_t &sq, int bi, int hq,
                                  int m0, uint16_t *sQ, uint16_t *sdO, float *sL, float *sD,
                                  const float *delta, int64_t ws_rows, int tid) {
  const uint16_t *gq = (const uint16_t *)p.q + attn_base(p.q_st, sq, bi, true) + hq * p.q_st.h + m0 * p.q_st.s;
  const uint16_t *gd = (const uint16_t *)p.dout + attn_base(p.dout_st, sq, bi, true) + hq * p.dout_st.h + m0 * p.dout_st.s;
  load_tile<C::BM, C::D_QK, C::NT>(sQ, gq, p.q_st.s, sq.q_len - m0, p.d_qk, p.q, tid);
  load_tile<C::BM, C::D_V, C::NT>(sdO, gd, p.dout_st.s, sq.q_len - m0, p.d_v, p.dout, tid);
  if (tid < C::BM) {
    const int i = m0 + tid;
    const bool ok = i < sq.q_len;
    const float *l = p.lse + attn_base(p.lse_st, sq, bi, true) + (int64_t)i * p.lse_st.s + hq * p.lse_st.h;
    cp_async4(sL + tid, ok ? (const void *)l : (const void *)p.lse, ok);
    cp_async4(sD + tid, ok ? (const void *)(delta + hq * ws_rows + attn_ws_row(p, sq, bi, i)) : (const void *)delta, ok);
  }
}

template <class C, bool BF16>
__global__ void __launch_bounds__(C::NT) attn_bwd_kernel(const dl_attn_params_t p, float *dq_acc,
                                                         const float *delta) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int sp = blockIdx.x % C::NSPLIT, n_block = blockIdx.x / C::NSPLIT;
  const int hk = blockIdx.y, bi = blockIdx.z, group = p.h_q / p.h_kv;
  const attn_seq_t sq = attn_seq(p, bi);
  const int n0 = n_block * C::BN;
  if (n0 >= sq.kv_len) return;
  int m_lo, m_hi;
  attn_query_range(p, sq, n0, min(n0 + C::BN, sq.kv_len) - 1, &m_lo, &m_hi);
  const int mb_lo = m_lo / C::BM, n_mb = m_lo < m_hi ? (m_hi + C::BM - 1) / C::BM - mb_lo : 0;
  const int n_iter = group * n_mb;
  const int64_t ws_rows = p.cu_seqlens_q ? p.total_q : (int64_t)p.b * p.s_q;

  uint16_t *sK = (uint16_t *)attn_smem(), *sV = sK + C::BN * C::D_QK, *sQ = sV + C::BN * C::D_V;
  uint16_t *sdO = sQ + 2 * C::SQ, *sdS = sdO + 2 * C::SDO;
  float *sL = (float *)(sdS + C::BN * C::BM), *sD = sL + 2 * C::BM;
  const attn_lane la(lane, false), lb(lane, true);
  const uint32_t uK = attn_smem_u32(sK), uV = attn_smem_u32(sV), udS = attn_smem_u32(sdS);
  const uint32_t uQ = attn_smem_u32(sQ), udO = attn_smem_u32(sdO);
  const attn_mask_t mask(p, sq);
  const float sl2 = p.scale * ATTN_LOG2E;
  const int wkey = warp * 16, mq = warp % C::MQ, cg = warp / C::MQ;

  float dk[C::DKS / 8][4], dv[C::DVS / 8][4];
#pragma unroll
  for (int t = 0; t < C::DKS / 8; t++) dk[t][0] = dk[t][1] = dk[t][2] = dk[t][3] = 0;
#pragma unroll
  for (int t = 0; t < C::DVS / 8; t++) dv[t][0] = dv[t][1] = dv[t][2] = dv[t][3] = 0;

  if (n_iter > 0) {
    const uint16_t *gk = (const uint16_t *)p.k + attn_base(p.k_st, sq, bi, false) + hk * p.k_st.h + n0 * p.k_st.s;
    const uint16_t *gv = (const uint16_t *)p.v + attn_base(p.v_st, sq, bi, false) + hk * p.v_st.h + n0 * p.v_st.s;
    load_tile<C::BN, C::D_QK, C::NT>(sK, gk, p.k_st.s, sq.kv_len - n0, p.d_qk, p.k, tid);
    load_tile<C::BN, C::D_V, C::NT>(sV, gv, p.v_st.s, sq.kv_len - n0, p.d_v, p.v, tid);
    attn_bwd_load_stage<C>(p, sq, bi, hk * group, mb_lo * C::BM, sQ, sdO, sL, sD, delta, ws_rows, tid);
    cp_async_commit();
  }
  for (int it = 0; it < n_iter; it++) {
    const int hq = hk * group + it / n_mb, m0 = (mb_lo + it % n_mb) * C::BM, st = it & 1;
    if (it + 1 < n_iter) {
      const int nx = (it + 1) & 1;
      attn_bwd_load_stage<C>(p, sq, bi, hk * group + (it + 1) / n_mb, (mb_lo + (it + 1) % n_mb) * C::BM,
                             sQ + nx * C::SQ, sdO + nx * C::SDO, sL + nx * C::BM, sD + nx * C::BM,
                             delta, ws_rows, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    attn_sync(); /* stage st (and K, V) landed */
    const uint32_t uQs = uQ + st * C::SQ * 2, udOs = udO + st * C::SDO * 2;
    const float *sLs = sL + st * C::BM, *sDs = sD + st * C::BM;

    /* S^T = K Q^T and P^T = exp2(S^T scale log2e - lse log2e) for the warp's 16 keys */
    float pt[C::QT][4], dpt[C::QT][4];
#pragma unroll
    for (int t = 0; t < C::QT; t++) pt[t][0] = pt[t][1] = pt[t][2] = pt[t][3] = dpt[t][0] = dpt[t][1] = dpt[t][2] = dpt[t][3] = 0;
#pragma unroll
    for (int kk = 0; kk < C::D_QK / 16; kk++) {
      uint32_t a[4];
      ldmatrix_x4(a, la.at<C::D_QK>(uK, wkey, kk));
#pragma unroll
      for (int qp = 0; qp < C::QT / 2; qp++) {
        uint32_t b[4];
        ldmatrix_x4(b, lb.at<C::D_QK>(uQs, qp * 16, kk));
        mma_16816<BF16>(pt[2 * qp], a, b[0], b[1]);
        mma_16816<BF16>(pt[2 * qp + 1], a, b[2], b[3]);
      }
    }
    const bool masked = attn_tile_masked(p, sq, m0, m0 + C::BM - 1, n0, n0 + C::BN - 1);
#pragma unroll
    for (int t = 0; t < C::QT; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = t * 8 + (lane & 3) * 2 + (e & 1);
        const float L = sLs[col], L2 = L == ATTN_NEG_INF ? -ATTN_NEG_INF : L * ATTN_LOG2E;
        float x = attn_exp2(pt[t][e] * sl2 - L2);
        if (masked && !mask.visible(m0 + col, n0 + wkey + (lane >> 2) + (e >> 1) * 8)) x = 0;
        pt[t][e] = x;
      }
    /* dP^T = V dO^T */
#pragma unroll
    for (int kk = 0; kk < C::D_V / 16; kk++) {
      uint32_t a[4];
      ldmatrix_x4(a, la.at<C::D_V>(uV, wkey, kk));
#pragma unroll
      for (int qp = 0; qp < C::QT / 2; qp++) {
        uint32_t b[4];
        ldmatrix_x4(b, lb.at<C::D_V>(udOs, qp * 16, kk));
        mma_16816<BF16>(dpt[2 * qp], a, b[0], b[1]);
        mma_16816<BF16>(dpt[2 * qp + 1], a, b[2], b[3]);
      }
    }
    /* dV += P^T dO over this split's columns */
#pragma unroll
    for (int kq = 0; kq < C::BM / 16; kq++) {
      uint32_t a[4];
      a[0] = attn_pack2<BF16>(pt[2 * kq][0], pt[2 * kq][1]);
      a[1] = attn_pack2<BF16>(pt[2 * kq][2], pt[2 * kq][3]);
      a[2] = attn_pack2<BF16>(pt[2 * kq + 1][0], pt[2 * kq + 1][1]);
      a[3] = attn_pack2<BF16>(pt[2 * kq + 1][2], pt[2 * kq + 1][3]);
#pragma unroll
      for (int dp = 0; dp < C::DVS / 16; dp++) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, la.at_rt<C::D_V>(udOs, kq * 16, sp * (C::DVS / 16) + dp));
        mma_16816<BF16>(dv[2 * dp], a, b[0], b[1]);
        mma_16816<BF16>(dv[2 * dp + 1], a, b[2], b[3]);
      }
    }
    /* dS^T = P^T (dP^T - D), kept in dpt */
#pragma unroll
    for (int t = 0; t < C::QT; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) dpt[t][e] = pt[t][e] * (dpt[t][e] - sDs[t * 8 + (lane & 3) * 2 + (e & 1)]);
    /* dK += dS^T Q over this split's columns; dS^T to shared memory for dQ */
#pragma unroll
    for (int kq = 0; kq < C::BM / 16; kq++) {
      uint32_t a[4];
      a[0] = attn_pack2<BF16>(dpt[2 * kq][0], dpt[2 * kq][1]);
      a[1] = attn_pack2<BF16>(dpt[2 * kq][2], dpt[2 * kq][3]);
      a[2] = attn_pack2<BF16>(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]);
      a[3] = attn_pack2<BF16>(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
      const int r = wkey + (lane >> 2), c = kq * 2;
      *(uint32_t *)(sdS + swz<C::BM>(r, c) + (lane & 3) * 2) = a[0];
      *(uint32_t *)(sdS + swz<C::BM>(r + 8, c) + (lane & 3) * 2) = a[1];
      *(uint32_t *)(sdS + swz<C::BM>(r, c + 1) + (lane & 3) * 2) = a[2];
      *(uint32_t *)(sdS + swz<C::BM>(r + 8, c + 1) + (lane & 3) * 2) = a[3];
#pragma unroll
      for (int dp = 0; dp < C::DKS / 16; dp++) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, la.at_rt<C::D_QK>(uQs, kq * 16, sp * (C::DKS / 16) + dp));
        mma_16816<BF16>(dk[2 * dp], a, b[0], b[1]);
        mma_16816<BF16>(dk[2 * dp + 1], a, b[2], b[3]);
      }
    }
    attn_sync(); /* dS^T complete */

    /* dQ(16 rows mq, column group cg) = dS K, added to the fp32 accumulator,
     * in passes of at most 64 columns (fewer live registers) */
#pragma unroll
    for (int pass = 0; pass < C::DQT / C::DQP; pass++) {
      const int col0 = sp * C::DKS + cg * C::DQC + pass * C::DQP * 8;
      float dq[C::DQP][4];
#pragma unroll
      for (int t = 0; t < C::DQP; t++) dq[t][0] = dq[t][1] = dq[t][2] = dq[t][3] = 0;
#pragma unroll
      for (int kk = 0; kk < C::BN / 16; kk++) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, lb.at_rt<C::BM>(udS, kk * 16, mq));
#pragma unroll
        for (int dp = 0; dp < C::DQP / 2; dp++) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, la.at_rt<C::D_QK>(uK, kk * 16, col0 / 16 + dp));
          mma_16816<BF16>(dq[2 * dp], a, b[0], b[1]);
          mma_16816<BF16>(dq[2 * dp + 1], a, b[2], b[3]);
        }
      }
      /* lanes 2k and 2k+1 swap halves so each adds 4 consecutive columns of one row */
      const bool odd = lane & 1;
      const int i = m0 + mq * 16 + (lane >> 2) + (odd ? 8 : 0);
      float *row = dq_acc + (hq * ws_rows + attn_ws_row(p, sq, bi, i)) * p.d_qk;
#pragma unroll
      for (int t = 0; t < C::DQP; t++) {
        const float s0 = attn_shfl_xor(odd ? dq[t][0] : dq[t][2], 1);
        const float s1 = attn_shfl_xor(odd ? dq[t][1] : dq[t][3], 1);
        const int c = col0 + t * 8 + ((lane & 3) >> 1) * 4;
        if (i < sq.q_len && c < p.d_qk) {
          if (odd)
            attn_atomic_add4(row + c, s0, s1, dq[t][2], dq[t][3]);
          else
            attn_atomic_add4(row + c, dq[t][0], dq[t][1], s0, s1);
        }
      }
    }
    /* no barrier here: the next prefetch refills stage st, last read before
     * the barrier above, and dS^T is rewritten only after the next one */
  }

  const int keys = sq.kv_len - n0 - wkey;
  if (p.accumulate_grads && n_iter == 0) return;
  uint16_t *gdk = (uint16_t *)p.dk + attn_base(p.dk_st, sq, bi, false) + hk * p.dk_st.h + (int64_t)(n0 + wkey) * p.dk_st.s;
  uint16_t *gdv = (uint16_t *)p.dv + attn_base(p.dv_st, sq, bi, false) + hk * p.dv_st.h + (int64_t)(n0 + wkey) * p.dv_st.s;
  attn_bwd_store_rows<C::DKS / 8, BF16>(p, gdk, p.dk_st.s, keys, sp * C::DKS, p.d_qk, dk, p.scale, lane);
  attn_bwd_store_rows<C::DVS / 8, BF16>(p, gdv, p.dv_st.s, keys, sp * C::DVS, p.d_v, dv, 1.f, lane);
}

/* ---- launchers ------------------------------------------------------------------ */

template <class C>
static int attn_bwd_run(const dl_attn_params_t *p, void *stream, int *ran_hopper) {
  const int64_t rows = attn_ws_rows(p);
  float *dq_acc = (float *)p->workspace;
  float *delta = (float *)((char *)p->workspace + (((size_t)rows * p->h_q * p->d_qk * 4 + 255) & ~(size_t)255));
  /* D: [h][rows] here; the Hopper backward's own prep lays out D, then lse log2(e), in rows padded per
   * sequence (dl_attn_bwd_workspace_bytes) */
  dim3 rgrid((p->s_q + PREP_ROWS - 1) / PREP_ROWS, p->h_q, p->b);
  dim3 grid(((p->s_kv + C::BN - 1) / C::BN) * C::NSPLIT, p->h_kv, p->b);
  const bool bf16 = p->dtype == DL_BF16;
  int hopper = 0; /* the main kernel on wgmma and TMA (kernels/attn/hopper/), and its dQ conversion */
  DL_TRY(dl_attn_bwd_hopper_usable(p, &hopper));
  if (p->s_q > 0 && !(hopper && dl_attn_bwd_hopper_preps(p)))
    DL_TRY(attn_launch("attn_bwd_prep_kernel", bf16 ? attn_bwd_prep_kernel<true> : attn_bwd_prep_kernel<false>,
                       rgrid, dim3(128), 0, stream, *p, dq_acc, delta));
  if (hopper) {
    if (ran_hopper) *ran_hopper = 1;
    return dl_attn_bwd_hopper_cuda(p, dq_acc, delta, stream);
  }
  if (p->s_kv > 0)
    DL_TRY(attn_launch("attn_bwd_kernel", bf16 ? attn_bwd_kernel<C, true> : attn_bwd_kernel<C, false>, grid,
                       dim3(C::NT), C::SMEM, stream, *p, dq_acc, (const float *)delta));
  if (p->s_q > 0)
    DL_TRY(attn_launch("attn_bwd_dq_kernel", bf16 ? attn_bwd_dq_kernel<true> : attn_bwd_dq_kernel<false>, rgrid,
                       dim3(128), 0, stream, *p, (const float *)dq_acc));
  return 0;
}

extern "C" int dl_attn_bwd_cuda(const dl_attn_params_t *p, void *stream, int *ran_hopper) {
  if (ran_hopper) *ran_hopper = 0;
  DL_TRY(dl_attn_validate(p, 1, 1));
  if (p->b == 0 || (p->s_q == 0 && p->s_kv == 0)) return 0;
  DL_CHECK_ARG(p->s_q <= 65535 * PREP_ROWS && p->s_kv <= 65535 * 32 && p->h_q <= 65535 && p->b <= 65535,
               "attn bwd: grid too large (s_q=%d s_kv=%d h_q=%d b=%d)", p->s_q, p->s_kv, p->h_q, p->b);
  switch (attn_dims_config(p->d_qk, p->d_v)) {
    case 0: return attn_bwd_run<attn_bwd_cfg<64, 64, 8, 1>>(p, stream, ran_hopper);
    case 1: return attn_bwd_run<attn_bwd_cfg<128, 128, DL_ATTN_BWD128_NW, 1>>(p, stream, ran_hopper);
    case 2: return attn_bwd_run<attn_bwd_cfg<192, 128, 8, 2>>(p, stream, ran_hopper);
    case 3: return attn_bwd_run<attn_bwd_cfg<256, 256, 4, 2>>(p, stream, ran_hopper);
  }
  return DL_ERR(DL_EINVAL, "attn bwd: no kernel for head dims %d/%d", p->d_qk, p->d_v);
}
