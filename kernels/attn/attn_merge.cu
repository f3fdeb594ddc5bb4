/*
 * attn_merge.cu — merges of partial attention results for context-parallel
 * schedules (see dl_attn_merge_params_t in attn.h for the row selection):
 *   attn_merge_lse_kernel   lse <- logaddexp(lse, part_lse)
 *   attn_merge_out_kernel   INCR: O <- O e^(L-L') + P e^(Lp-L'), L <- L'
 *                           INIT / ADD: O (=|+=) P e^(Lp-L) with the final L
 *   attn_merge_grad_kernel  gradient correction: O (=|+=) P
 * on all rows, or the first or second half of every sequence (bshd/sbhd via
 * s, thd via cu_seqlens_padded), with the part full-size or the packed half.
 * A part row with lse -inf, or exactly zero under skip_zero_rows, adds
 * nothing, so fully masked rows never produce NaN. fp32 math; out, part in
 * fp32/bf16/fp16. Memory-bound: a warp per (row, head) for the outputs,
 * 4 elements per lane when d, strides and bases allow (else 1), a thread
 * per (row, head) for lse. Checked against kernels/attn/cpu/attn_merge.c
 * by experiments/lab/attn/attn_check.cu.
 */
#include "attn_common.cuh"

/* ---- kernels ------------------------------------------------------------------ */

struct attn_merge_row_t {
  int64_t o, po, l, pl; /* offsets of out, part, lse, part_lse */
};

/* Row slot `idx` (thd: a row of out; else sequence * selected rows + j) and
 * head hh: false when the slot is not selected. */
ATTN_DEV bool attn_merge_row(const dl_attn_merge_params_t &p, int64_t idx, int hh,
                             attn_merge_row_t *m) {
  int64_t bo, pbo, i, lo, pi; /* batch offsets are in units of the b stride (fixed) */
  if (p.cu_seqlens_padded) {
    const int32_t *cu = p.cu_seqlens_padded;
    if (idx < cu[0] || idx >= cu[p.b]) return false;
    int a = 0, b = p.b; /* cu[a] <= idx < cu[b] */
    while (b - a > 1) {
      const int mid = (a + b) >> 1;
      if (cu[mid] <= idx) a = mid; else b = mid;
    }
    const int64_t len = cu[a + 1] - cu[a];
    i = idx - cu[a];
    lo = p.half == DL_ATTN_HALF_SECOND ? len / 2 : 0;
    const int64_t hi = p.half == DL_ATTN_HALF_FIRST ? len / 2 : len;
    if (i < lo || i >= hi) return false;
    bo = pbo = 0, i = idx;
    pi = p.part_is_half ? (cu[a] - cu[0]) / 2 + (idx - cu[a] - lo) : idx;
  } else {
    const int64_t sel = p.half == DL_ATTN_HALF_ALL ? p.s : p.s / 2;
    bo = pbo = idx / sel;
    lo = p.half == DL_ATTN_HALF_SECOND ? p.s / 2 : 0;
    i = lo + idx % sel;
    pi = p.part_is_half ? idx % sel : i;
  }
  m->o = bo * p.out_st.b + i * p.out_st.s + hh * p.out_st.h;
  m->l = bo * p.lse_st.b + i * p.lse_st.s + hh * p.lse_st.h;
  m->po = pbo * p.part_st.b + pi * p.part_st.s + hh * p.part_st.h;
  m->pl = pbo * p.part_lse_st.b + pi * p.part_lse_st.s + hh * p.part_lse_st.h;
  return true;
}

ATTN_DEV float attn_ld(const void *x, int dt, int64_t o) {
  if (dt == DL_F32) return ((const float *)x)[o];
  const uint32_t h = ((const uint16_t *)x)[o];
  return dt == DL_BF16 ? attn_unpack_lo<true>(h) : attn_unpack_lo<false>(h);
}

ATTN_DEV void attn_st(void *x, int dt, int64_t o, float v) {
  if (dt == DL_F32)
    ((float *)x)[o] = v;
  else
    ((uint16_t *)x)[o] = (uint16_t)(dt == DL_BF16 ? attn_pack2<true>(v, 0.f) : attn_pack2<false>(v, 0.f));
}

/* VEC consecutive elements at offset o (VEC = 4: aligned to 4 elements). */
template <int VEC>
ATTN_DEV void attn_ldv(const void *x, int dt, int64_t o, float v[VEC]) {
  if (VEC == 1) {
    v[0] = attn_ld(x, dt, o);
  } else if (dt == DL_F32) {
    uint32_t r[4];
    attn_ld_b128((const float *)x + o, r);
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = __uint_as_float(r[e]);
  } else {
    uint32_t r[2];
    attn_ld_b64((const uint16_t *)x + o, r);
    const bool bf = dt == DL_BF16;
    v[0] = bf ? attn_unpack_lo<true>(r[0]) : attn_unpack_lo<false>(r[0]);
    v[1] = bf ? attn_unpack_hi<true>(r[0]) : attn_unpack_hi<false>(r[0]);
    v[2] = bf ? attn_unpack_lo<true>(r[1]) : attn_unpack_lo<false>(r[1]);
    v[3] = bf ? attn_unpack_hi<true>(r[1]) : attn_unpack_hi<false>(r[1]);
  }
}

template <int VEC>
ATTN_DEV void attn_stv(void *x, int dt, int64_t o, const float v[VEC]) {
  if (VEC == 1) {
    attn_st(x, dt, o, v[0]);
  } else if (dt == DL_F32) {
    const uint32_t r[4] = {__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                           __float_as_uint(v[3])};
    attn_st_b128((float *)x + o, r);
  } else {
    const bool bf = dt == DL_BF16;
    const uint32_t r[2] = {bf ? attn_pack2<true>(v[0], v[1]) : attn_pack2<false>(v[0], v[1]),
                           bf ? attn_pack2<true>(v[2], v[3]) : attn_pack2<false>(v[2], v[3])};
    attn_st_b64((uint16_t *)x + o, r);
  }
}

__global__ void attn_merge_lse_kernel(const dl_attn_merge_params_t p, int64_t items) {
  for (int64_t it = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; it < items;
       it += (int64_t)gridDim.x * blockDim.x) {
    attn_merge_row_t m;
    if (!attn_merge_row(p, it / p.h, (int)(it % p.h), &m)) continue;
    const float L = p.lse[m.l], Lp = p.part_lse[m.pl];
    if (Lp == ATTN_NEG_INF) continue;
    p.lse[m.l] = L == ATTN_NEG_INF ? Lp : fmaxf(L, Lp) + log1pf(expf(fminf(L, Lp) - fmaxf(L, Lp)));
  }
}

template <int VEC>
__global__ void attn_merge_out_kernel(const dl_attn_merge_params_t p, int64_t items) {
  const int lane = threadIdx.x & 31;
  for (int64_t it = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; it < items;
       it += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    attn_merge_row_t m;
    if (!attn_merge_row(p, it / p.h, (int)(it % p.h), &m)) continue;
    const float L = p.lse[m.l], Lp = p.part_lse[m.pl];
    bool skip = Lp == ATTN_NEG_INF;
    if (p.skip_zero_rows) {
      bool zero = true;
      for (int c = lane * VEC; c < p.d; c += 32 * VEC) {
        float v[VEC];
        attn_ldv<VEC>(p.part, p.part_dtype, m.po + c, v);
#pragma unroll
        for (int e = 0; e < VEC; e++) zero &= v[e] == 0.f;
      }
      skip |= attn_all(zero);
    }
    float keep, take, Ln = L;
    if (p.mode == DL_ATTN_MERGE_INCR) {
      if (skip) continue;
      Ln = L == ATTN_NEG_INF ? Lp : fmaxf(L, Lp) + log1pf(expf(fminf(L, Lp) - fmaxf(L, Lp)));
      keep = L == ATTN_NEG_INF ? 0.f : expf(L - Ln);
      take = expf(Lp - Ln);
    } else {
      keep = p.mode == DL_ATTN_MERGE_ADD ? 1.f : 0.f;
      take = skip || L == ATTN_NEG_INF ? 0.f : expf(Lp - L);
    }
    for (int c = lane * VEC; c < p.d; c += 32 * VEC) {
      float o[VEC], x[VEC];
#pragma unroll
      for (int e = 0; e < VEC; e++) o[e] = x[e] = 0.f;
      if (keep != 0.f) attn_ldv<VEC>(p.out, p.out_dtype, m.o + c, o);
      if (take != 0.f) attn_ldv<VEC>(p.part, p.part_dtype, m.po + c, x);
#pragma unroll
      for (int e = 0; e < VEC; e++) o[e] = keep * o[e] + take * x[e];
      attn_stv<VEC>(p.out, p.out_dtype, m.o + c, o);
    }
    if (p.mode == DL_ATTN_MERGE_INCR) {
      attn_syncwarp(); /* every lane has read L */
      if (lane == 0) p.lse[m.l] = Ln;
    }
  }
}

template <int VEC>
__global__ void attn_merge_grad_kernel(const dl_attn_merge_params_t p, int64_t items) {
  const int lane = threadIdx.x & 31;
  for (int64_t it = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; it < items;
       it += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    attn_merge_row_t m;
    if (!attn_merge_row(p, it / p.h, (int)(it % p.h), &m)) continue;
    for (int c = lane * VEC; c < p.d; c += 32 * VEC) {
      float v[VEC], o[VEC];
      attn_ldv<VEC>(p.part, p.part_dtype, m.po + c, v);
      if (p.mode == DL_ATTN_GRAD_ADD) {
        attn_ldv<VEC>(p.out, p.out_dtype, m.o + c, o);
#pragma unroll
        for (int e = 0; e < VEC; e++) v[e] += o[e];
      }
      attn_stv<VEC>(p.out, p.out_dtype, m.o + c, v);
    }
  }
}

/* ---- launchers ------------------------------------------------------------------ */

/* (row slot, head) pairs, and a grid for `per_block` of them per 256 threads. */
static int64_t attn_merge_items(const dl_attn_merge_params_t *p) {
  const int64_t slots = p->cu_seqlens_padded ? p->total
                        : (int64_t)p->b * (p->half == DL_ATTN_HALF_ALL ? p->s : p->s / 2);
  return slots * p->h;
}

/* Can out and part move 4 elements at a time (d, strides, bases aligned)? */
static bool attn_merge_vec4(const dl_attn_merge_params_t *p) {
  const dl_attn_strides_t *st[2] = {&p->out_st, &p->part_st};
  const void *ptr[2] = {p->out, p->part};
  const int dt[2] = {p->out_dtype, p->part_dtype};
  if (p->d % 4) return false;
  for (int i = 0; i < 2; i++)
    if (st[i]->s % 4 || st[i]->h % 4 || (!p->cu_seqlens_padded && st[i]->b % 4) ||
        (uintptr_t)ptr[i] % (dt[i] == DL_F32 ? 16 : 8))
      return false;
  return true;
}

static dim3 attn_merge_grid(int64_t items, int per_block) {
  int64_t blocks = (items + per_block - 1) / per_block;
  return dim3((unsigned)(blocks < 65536 ? blocks : 65536));
}

extern "C" int dl_attn_merge_lse_cuda(const dl_attn_merge_params_t *p, void *stream) {
  DL_TRY(dl_attn_merge_validate(p, 0, 1));
  const int64_t items = attn_merge_items(p);
  if (items == 0) return 0;
  return attn_launch("attn_merge_lse_kernel", attn_merge_lse_kernel, attn_merge_grid(items, 256), dim3(256), 0,
                     stream, *p, items);
}

extern "C" int dl_attn_merge_out_cuda(const dl_attn_merge_params_t *p, void *stream) {
  DL_TRY(dl_attn_merge_validate(p, 1, 1));
  const int64_t items = attn_merge_items(p);
  if (items == 0) return 0;
  return attn_launch("attn_merge_out_kernel", attn_merge_vec4(p) ? attn_merge_out_kernel<4> : attn_merge_out_kernel<1>,
                     attn_merge_grid(items, 8), dim3(256), 0, stream, *p, items);
}

extern "C" int dl_attn_merge_grad_cuda(const dl_attn_merge_params_t *p, void *stream) {
  DL_TRY(dl_attn_merge_validate(p, 2, 1));
  const int64_t items = attn_merge_items(p);
  if (items == 0) return 0;
  return attn_launch("attn_merge_grad_kernel", attn_merge_vec4(p) ? attn_merge_grad_kernel<4> : attn_merge_grad_kernel<1>,
                     attn_merge_grid(items, 8), dim3(256), 0, stream, *p, items);
}
