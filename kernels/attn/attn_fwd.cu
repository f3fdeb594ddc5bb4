/*
 * attn_fwd.cu — flash attention forward (FA2 algorithm) for one attention
 * step: out = softmax(scale * q k^T + mask) v and lse = log-sum-exp per row,
 * never materialising the scores. Variants (all runtime): bshd/sbhd/thd with
 * padded offsets, windows in both alignments, GQA, max_logit, and the fused
 * merge epilogue that folds the step into a running (acc_out, acc_lse)
 * instead of writing out/lse.
 *
 * A CTA owns BM query rows of one (sequence, head); each warp owns 16*MT of
 * them. Q stays in shared memory; K and V tiles of BN keys stream through
 * one buffer each with cp.async, V[j] loading under S = Q K[j]^T and K[j-1]
 * under O += P V[j]. Key blocks run from the last to the first, so the
 * masked blocks come first. S lives in registers (mma.sync m16n8k16, fp32),
 * the online softmax runs on it in place with exp2, and P is repacked to
 * bf16/fp16 as the A operand of the P V mma. Fully masked rows give out 0,
 * lse -inf, and no NaN.
 *
 * On an sm_90 device, bf16 at head dims 64/64 or 128/128 runs the Hopper forward
 * instead (kernels/attn/hopper/: wgmma, TMA; dl_attn_fwd_hopper_fits).
 *
 * Requires: head dims multiples of 8 up to 256 (padded to 64/128/192/256
 * with zero-filled loads), 16-byte aligned operands with strides multiple of
 * 8 elements (dl_attn_validate). Checked against dl_attn_fwd_cpu by
 * experiments/lab/attn/attn_check.cu (on a GPU, and on the CPU emulator).
 */
#include "attn_common.cuh"

/* Lab knobs: the tile of d=128 (query rows BM, keys BN, warps NW with
 * BM = 16 * NW * m16 tiles per warp, K/V STAGES), so experiments/lab/attn
 * can compare shapes in one GPU session. */
#ifndef DL_ATTN_FWD128_BM
#define DL_ATTN_FWD128_BM 128
#endif
#ifndef DL_ATTN_FWD128_BN
#define DL_ATTN_FWD128_BN 64
#endif
#ifndef DL_ATTN_FWD128_NW
#define DL_ATTN_FWD128_NW 4
#endif
#ifndef DL_ATTN_FWD128_STAGES
#define DL_ATTN_FWD128_STAGES 1
#endif

/* STAGES = 1: one K and one V buffer, V[j] loading under S, K[j-1] under PV
 * (FA2; two barriers per key block). STAGES = 2: K and V double-buffered,
 * block j-1 loading under all of block j (one barrier per key block). */
template <int D_QK_, int D_V_, int BM_, int BN_, int NW_, int STAGES_ = 1>
struct attn_fwd_cfg {
  static constexpr int D_QK = D_QK_, D_V = D_V_, BM = BM_, BN = BN_, NW = NW_, NT = 32 * NW;
  static constexpr int STAGES = STAGES_;
  static constexpr int MT = BM / (16 * NW); /* m16 tiles per warp */
  static constexpr int ST = BN / 8;         /* n8 tiles of S per m16 tile */
  static constexpr int OT = D_V / 8;        /* n8 tiles of O */
  static constexpr size_t SMEM = (size_t)(BM * D_QK + STAGES * (BN * D_QK + BN * D_V)) * 2;
  static_assert(MT >= 1 && BM == 16 * NW * MT && BN % 16 == 0 && (STAGES == 1 || STAGES == 2), "tile shape");
};

/* ---- kernels ------------------------------------------------------------------ */

/* Folds the normalised step output (x0, x1 at columns c, c+1) into acc_out. */
ATTN_DEV void attn_acc_update(const dl_attn_params_t &p, int64_t o, float keep, float take,
                              float x0, float x1) {
  if (p.acc_dtype == DL_F32) {
    float *a = (float *)p.acc_out + o;
    a[0] = a[0] * keep + x0 * take, a[1] = a[1] * keep + x1 * take;
  } else if (p.acc_dtype == DL_BF16) {
    uint32_t *a = (uint32_t *)((uint16_t *)p.acc_out + o);
    uint32_t v = *a;
    *a = attn_pack2<true>(attn_unpack_lo<true>(v) * keep + x0 * take,
                          attn_unpack_hi<true>(v) * keep + x1 * take);
  } else {
    uint32_t *a = (uint32_t *)((uint16_t *)p.acc_out + o);
    uint32_t v = *a;
    *a = attn_pack2<false>(attn_unpack_lo<false>(v) * keep + x0 * take,
                           attn_unpack_hi<false>(v) * keep + x1 * take);
  }
}

template <class C, bool BF16>
__global__ void __launch_bounds__(C::NT) attn_fwd_kernel(const dl_attn_params_t p) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int m_block = gridDim.x - 1 - blockIdx.x, hq = blockIdx.y, bi = blockIdx.z;
  const int hk = hq / (p.h_q / p.h_kv);
  const attn_seq_t sq = attn_seq(p, bi);
  const int m0 = m_block * C::BM;
  if (m0 >= sq.q_len) return;
  int n_lo, n_hi;
  attn_key_range(p, sq, m0, min(m0 + C::BM, sq.q_len) - 1, &n_lo, &n_hi);

  const uint16_t *gq = (const uint16_t *)p.q + attn_base(p.q_st, sq, bi, true) + hq * p.q_st.h;
  const uint16_t *gk = (const uint16_t *)p.k + attn_base(p.k_st, sq, bi, false) + hk * p.k_st.h;
  const uint16_t *gv = (const uint16_t *)p.v + attn_base(p.v_st, sq, bi, false) + hk * p.v_st.h;
  /* Q, then per stage K and V */
  uint16_t *sQ = (uint16_t *)attn_smem(), *sK = sQ + C::BM * C::D_QK, *sV = sK + C::BN * C::D_QK;
  constexpr int STAGE = C::BN * (C::D_QK + C::D_V); /* elements */
  const int wrow = warp * 16 * C::MT; /* first row of this warp in the tile */
  const float sl2 = p.scale * ATTN_LOG2E;
  const attn_mask_t mask(p, sq);
  const attn_lane la(lane, false), lb(lane, true);
  const uint32_t uQ = attn_smem_u32(sQ), uK = attn_smem_u32(sK), uV = attn_smem_u32(sV);

  float acc[C::MT][C::OT][4], row_m[C::MT][2], row_l[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; mt++) {
#pragma unroll
    for (int ot = 0; ot < C::OT; ot++) acc[mt][ot][0] = acc[mt][ot][1] = acc[mt][ot][2] = acc[mt][ot][3] = 0;
    row_m[mt][0] = row_m[mt][1] = ATTN_NEG_INF, row_l[mt][0] = row_l[mt][1] = 0;
  }

  if (n_lo < n_hi) {
    const int nb_lo = n_lo / C::BN, nb_hi = (n_hi + C::BN - 1) / C::BN;
    load_tile<C::BM, C::D_QK, C::NT>(sQ, gq + m0 * p.q_st.s, p.q_st.s, sq.q_len - m0, p.d_qk, p.q, tid);
    load_tile<C::BN, C::D_QK, C::NT>(sK, gk + (int64_t)(nb_hi - 1) * C::BN * p.k_st.s, p.k_st.s,
                                     sq.kv_len - (nb_hi - 1) * C::BN, p.d_qk, p.k, tid);
    if (C::STAGES == 2)
      load_tile<C::BN, C::D_V, C::NT>(sV, gv + (int64_t)(nb_hi - 1) * C::BN * p.v_st.s, p.v_st.s,
                                      sq.kv_len - (nb_hi - 1) * C::BN, p.d_v, p.v, tid);
    cp_async_commit();
    for (int nb = nb_hi - 1; nb >= nb_lo; nb--) {
      const int n0 = nb * C::BN, st = C::STAGES == 2 ? (nb_hi - 1 - nb) & 1 : 0;
      const uint32_t uKs = uK + st * STAGE * 2, uVs = uV + st * STAGE * 2;
      cp_async_wait<0>();
      attn_sync(); /* K[nb] (and V[nb]) landed; every warp is done with block nb+1 */
      if (C::STAGES == 1) {
        load_tile<C::BN, C::D_V, C::NT>(sV, gv + (int64_t)n0 * p.v_st.s, p.v_st.s, sq.kv_len - n0, p.d_v, p.v, tid);
        cp_async_commit();
      } else if (nb > nb_lo) {
        uint16_t *nK = sK + (st ^ 1) * STAGE, *nV = sV + (st ^ 1) * STAGE;
        load_tile<C::BN, C::D_QK, C::NT>(nK, gk + (int64_t)(n0 - C::BN) * p.k_st.s, p.k_st.s,
                                         sq.kv_len - (n0 - C::BN), p.d_qk, p.k, tid);
        load_tile<C::BN, C::D_V, C::NT>(nV, gv + (int64_t)(n0 - C::BN) * p.v_st.s, p.v_st.s,
                                        sq.kv_len - (n0 - C::BN), p.d_v, p.v, tid);
        cp_async_commit();
      }

      float s[C::MT][C::ST][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int st = 0; st < C::ST; st++) s[mt][st][0] = s[mt][st][1] = s[mt][st][2] = s[mt][st][3] = 0;
#pragma unroll
      for (int kk = 0; kk < C::D_QK / 16; kk++) {
        uint32_t a[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
          ldmatrix_x4(a[mt], la.at<C::D_QK>(uQ, wrow + mt * 16, kk));
#pragma unroll
        for (int np = 0; np < C::ST / 2; np++) {
          uint32_t b[4];
          ldmatrix_x4(b, lb.at<C::D_QK>(uKs, np * 16, kk));
#pragma unroll
          for (int mt = 0; mt < C::MT; mt++) {
            mma_16816<BF16>(s[mt][2 * np], a[mt], b[0], b[1]);
            mma_16816<BF16>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }

      /* rows past q_len need no mask: their q is zero, so they stay finite, and are never written */
      if (attn_tile_masked(p, sq, m0, min(m0 + C::BM, sq.q_len) - 1, n0, n0 + C::BN - 1)) {
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
          for (int st = 0; st < C::ST; st++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              int i = m0 + wrow + mt * 16 + (lane >> 2) + (e >> 1) * 8;
              int j = n0 + st * 8 + (lane & 3) * 2 + (e & 1);
              if (!mask.visible(i, j)) s[mt][st][e] = ATTN_NEG_INF;
            }
      }

      /* online softmax; rows g and g+8 of each m16 tile, shared by a quad.
       * O and l are rescaled only when some row max of the warp moved (rare
       * once the maxima settle), decided by a warp vote so the branch is uniform. */
      float mnew[C::MT][2];
      bool moved = false;
#pragma unroll
      for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          float mx = row_m[mt][r];
#pragma unroll
          for (int st = 0; st < C::ST; st++) mx = fmaxf(mx, fmaxf(s[mt][st][2 * r], s[mt][st][2 * r + 1]));
          mx = fmaxf(mx, attn_shfl_xor(mx, 1));
          mnew[mt][r] = fmaxf(mx, attn_shfl_xor(mx, 2));
          moved |= mnew[mt][r] != row_m[mt][r];
        }
      if (!attn_all(!moved)) {
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
          for (int r = 0; r < 2; r++) {
            const float ms = mnew[mt][r] == ATTN_NEG_INF ? 0.f : mnew[mt][r] * sl2;
            const float alpha = attn_exp2(row_m[mt][r] * sl2 - ms); /* 0 from -inf, 1 if unmoved */
            row_l[mt][r] *= alpha;
#pragma unroll
            for (int ot = 0; ot < C::OT; ot++) acc[mt][ot][2 * r] *= alpha, acc[mt][ot][2 * r + 1] *= alpha;
          }
      }
#pragma unroll
      for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          row_m[mt][r] = mnew[mt][r];
          const float ms = mnew[mt][r] == ATTN_NEG_INF ? 0.f : mnew[mt][r] * sl2;
          float l = row_l[mt][r];
#pragma unroll
          for (int st = 0; st < C::ST; st++) {
            s[mt][st][2 * r] = attn_exp2(s[mt][st][2 * r] * sl2 - ms);
            s[mt][st][2 * r + 1] = attn_exp2(s[mt][st][2 * r + 1] * sl2 - ms);
            l += s[mt][st][2 * r] + s[mt][st][2 * r + 1];
          }
          row_l[mt][r] = l;
        }

      if (C::STAGES == 1) {
        cp_async_wait<0>();
        attn_sync(); /* V[nb] landed; every warp is done with K[nb] */
      }
      if (C::STAGES == 1 && nb > nb_lo) {
        load_tile<C::BN, C::D_QK, C::NT>(sK, gk + (int64_t)(n0 - C::BN) * p.k_st.s, p.k_st.s,
                                         sq.kv_len - (n0 - C::BN), p.d_qk, p.k, tid);
        cp_async_commit();
      }

#pragma unroll
      for (int kk = 0; kk < C::BN / 16; kk++) {
        uint32_t a[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++) {
          a[mt][0] = attn_pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = attn_pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = attn_pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = attn_pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < C::OT / 2; dp++) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, la.at<C::D_V>(uVs, kk * 16, dp));
#pragma unroll
          for (int mt = 0; mt < C::MT; mt++) {
            mma_16816<BF16>(acc[mt][2 * dp], a[mt], b[0], b[1]);
            mma_16816<BF16>(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }

  /* ---- epilogue: normalise, then write (out, lse) or merge into the accumulator */
  const bool fused = p.acc_out != nullptr;
  float maxl = ATTN_NEG_INF, lse[C::MT][2], acc_l[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float l = row_l[mt][r];
      l += attn_shfl_xor(l, 1);
      l += attn_shfl_xor(l, 2);
      const int i = m0 + wrow + mt * 16 + (lane >> 2) + r * 8;
      const float inv = l > 0 ? 1.f / l : 0.f;
      lse[mt][r] = l > 0 ? row_m[mt][r] * p.scale + logf(l) : ATTN_NEG_INF;
      if (i < sq.q_len && l > 0) maxl = fmaxf(maxl, row_m[mt][r] * p.scale);
#pragma unroll
      for (int ot = 0; ot < C::OT; ot++) acc[mt][ot][2 * r] *= inv, acc[mt][ot][2 * r + 1] *= inv;
      acc_l[mt][r] = ATTN_NEG_INF;
      if (fused && i < sq.q_len)
        acc_l[mt][r] = p.acc_lse[attn_base(p.acc_lse_st, sq, bi, true) + i * p.acc_lse_st.s + hq * p.acc_lse_st.h];
    }
  if (fused) attn_syncwarp(); /* all lanes have read acc_lse before lane 0 of a quad writes it */

#pragma unroll
  for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int i = m0 + wrow + mt * 16 + (lane >> 2) + r * 8;
      if (i >= sq.q_len) continue;
      if (!fused) {
        uint16_t *o = (uint16_t *)p.out + attn_base(p.out_st, sq, bi, true) + i * p.out_st.s + hq * p.out_st.h;
#pragma unroll
        for (int ot = 0; ot < C::OT; ot++) {
          const int c = ot * 8 + (lane & 3) * 2;
          if (c < p.d_v) *(uint32_t *)(o + c) = attn_pack2<BF16>(acc[mt][ot][2 * r], acc[mt][ot][2 * r + 1]);
        }
        if ((lane & 3) == 0) p.lse[attn_base(p.lse_st, sq, bi, true) + i * p.lse_st.s + hq * p.lse_st.h] = lse[mt][r];
        continue;
      }
      const float L = acc_l[mt][r], Ln = lse[mt][r];
      if (Ln == ATTN_NEG_INF) continue; /* nothing visible: the running state stays */
      const float mx = fmaxf(L, Ln), mn = fminf(L, Ln);
      const float Lm = L == ATTN_NEG_INF ? Ln : mx + log1pf(expf(mn - mx));
      const float keep = L == ATTN_NEG_INF ? 0.f : expf(L - Lm), take = expf(Ln - Lm);
      const int64_t o = attn_base(p.acc_out_st, sq, bi, true) + i * p.acc_out_st.s + hq * p.acc_out_st.h;
#pragma unroll
      for (int ot = 0; ot < C::OT; ot++) {
        const int c = ot * 8 + (lane & 3) * 2;
        if (c < p.d_v) attn_acc_update(p, o + c, keep, take, acc[mt][ot][2 * r], acc[mt][ot][2 * r + 1]);
      }
      if ((lane & 3) == 0)
        p.acc_lse[attn_base(p.acc_lse_st, sq, bi, true) + i * p.acc_lse_st.s + hq * p.acc_lse_st.h] = Lm;
    }

  if (p.max_logit) {
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) maxl = fmaxf(maxl, attn_shfl_xor(maxl, x));
    if (lane == 0 && maxl > ATTN_NEG_INF) attn_atomic_max(p.max_logit + hq, maxl);
  }
}

/* ---- launchers ------------------------------------------------------------------ */

template <class C>
static int attn_fwd_run(const dl_attn_params_t *p, void *stream) {
  dim3 grid((p->s_q + C::BM - 1) / C::BM, p->h_q, p->b);
  if (p->dtype == DL_BF16)
    return attn_launch("attn_fwd_kernel", attn_fwd_kernel<C, true>, grid, dim3(C::NT), C::SMEM, stream, *p);
  return attn_launch("attn_fwd_kernel", attn_fwd_kernel<C, false>, grid, dim3(C::NT), C::SMEM, stream, *p);
}

extern "C" int dl_attn_fwd_cuda(const dl_attn_params_t *p, void *stream, int *ran_hopper) {
  if (ran_hopper) *ran_hopper = 0;
  DL_TRY(dl_attn_validate(p, 0, 1));
  if (p->b == 0 || p->s_q == 0) return 0;
  DL_CHECK_ARG(p->s_q <= 65535 * 128 && p->h_q <= 65535 && p->b <= 65535, /* both kernels: 128-row blocks */
               "attn fwd: grid too large (s_q=%d h_q=%d b=%d)", p->s_q, p->h_q, p->b);
  int hopper = 0;
  DL_TRY(dl_attn_fwd_hopper_usable(p, &hopper));
  if (hopper) {
    if (ran_hopper) *ran_hopper = 1;
    return dl_attn_fwd_hopper_cuda(p, stream);
  }
  switch (attn_dims_config(p->d_qk, p->d_v)) {
    case 0: return attn_fwd_run<attn_fwd_cfg<64, 64, 128, 64, 4>>(p, stream);
    case 1:
      return attn_fwd_run<attn_fwd_cfg<128, 128, DL_ATTN_FWD128_BM, DL_ATTN_FWD128_BN, DL_ATTN_FWD128_NW,
                                       DL_ATTN_FWD128_STAGES>>(p, stream);
    case 2: return attn_fwd_run<attn_fwd_cfg<192, 128, 128, 64, 4>>(p, stream);
    case 3: return attn_fwd_run<attn_fwd_cfg<256, 256, 128, 64, 8>>(p, stream);
  }
  return DL_ERR(DL_EINVAL, "attn fwd: no kernel for head dims %d/%d", p->d_qk, p->d_v);
}
