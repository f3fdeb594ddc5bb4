/*
 * attn_common.cuh — what the flash forward and backward kernels share:
 * where a sequence lives (bshd/sbhd/thd with padded offsets), the mask
 * predicate of dl_attn_params_t, the swizzled shared-memory tile layout and
 * its cp.async loader, and the choice of padded head dims. Device code is
 * built only from attn_device.cuh, so it also runs on the lab's emulator.
 */
#ifndef DISTLAB_KERNELS_ATTN_COMMON_CUH
#define DISTLAB_KERNELS_ATTN_COMMON_CUH

#include "attn.h"
#include "attn_device.cuh"

#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_NEG_INF (-__int_as_float(0x7f800000))

struct attn_seq_t {
  int q_len, kv_len;
  int64_t q_start, kv_start; /* thd: first row of the sequence */
  bool thd;
};

ATTN_DEV attn_seq_t attn_seq(const dl_attn_params_t &p, int bi) {
  attn_seq_t s;
  s.thd = p.cu_seqlens_q != nullptr;
  s.q_len = p.s_q, s.kv_len = p.s_kv, s.q_start = s.kv_start = 0;
  if (s.thd) {
    const int32_t *qp = p.cu_seqlens_q_padded ? p.cu_seqlens_q_padded : p.cu_seqlens_q;
    const int32_t *kp = p.cu_seqlens_kv_padded ? p.cu_seqlens_kv_padded : p.cu_seqlens_kv;
    s.q_len = p.cu_seqlens_q[bi + 1] - p.cu_seqlens_q[bi];
    s.kv_len = p.cu_seqlens_kv[bi + 1] - p.cu_seqlens_kv[bi];
    s.q_start = qp[bi], s.kv_start = kp[bi];
  }
  return s;
}

/* Offset of position 0 of sequence bi in an operand (q side or kv side). */
ATTN_DEV int64_t attn_base(const dl_attn_strides_t &st, const attn_seq_t &s, int bi, bool q_side) {
  return s.thd ? (q_side ? s.q_start : s.kv_start) * st.s : (int64_t)bi * st.b;
}

/* The visible keys of rows [i0, i1] lie in [*lo, *hi) (maybe empty). */
ATTN_DEV void attn_key_range(const dl_attn_params_t &p, const attn_seq_t &s, int i0, int i1,
                             int *lo, int *hi) {
  int shift = p.bottom_right ? s.kv_len - s.q_len : 0;
  *lo = 0, *hi = s.kv_len;
  if (p.window_left >= 0) *lo = max(0, i0 + shift - p.window_left);
  if (p.window_right >= 0) *hi = min(s.kv_len, i1 + shift + p.window_right + 1);
}

/* The rows that see some key of [j0, j1] lie in [*lo, *hi) (maybe empty). */
ATTN_DEV void attn_query_range(const dl_attn_params_t &p, const attn_seq_t &s, int j0, int j1,
                               int *lo, int *hi) {
  int shift = p.bottom_right ? s.kv_len - s.q_len : 0;
  *lo = 0, *hi = s.q_len;
  if (p.window_right >= 0) *lo = max(0, j0 - shift - p.window_right);
  if (p.window_left >= 0) *hi = min(s.q_len, j1 - shift + p.window_left + 1);
}

/* Does the tile rows [i0, i1] x keys [j0, j1] need element masking? (rows
 * past q_len are masked too, so their garbage never counts.) */
ATTN_DEV bool attn_tile_masked(const dl_attn_params_t &p, const attn_seq_t &s, int i0, int i1,
                               int j0, int j1) {
  int shift = p.bottom_right ? s.kv_len - s.q_len : 0;
  return j1 >= s.kv_len || i1 >= s.q_len ||
         (p.window_right >= 0 && j1 > i0 + shift + p.window_right) ||
         (p.window_left >= 0 && j0 < i1 + shift - p.window_left);
}

/* The mask as bounds on j - i, for the element loops. */
struct attn_mask_t {
  int q_len, kv_len, lo, hi; /* visible iff i < q_len, j < kv_len, lo <= j - i <= hi */
  ATTN_DEV attn_mask_t(const dl_attn_params_t &p, const attn_seq_t &s) {
    const int shift = p.bottom_right ? s.kv_len - s.q_len : 0;
    q_len = s.q_len, kv_len = s.kv_len;
    lo = p.window_left >= 0 ? shift - p.window_left : -0x7fffffff;
    hi = p.window_right >= 0 ? shift + p.window_right : 0x7fffffff;
  }
  ATTN_DEV bool visible(int i, int j) const {
    return (i < q_len) & (j < kv_len) & (j - i >= lo) & (j - i <= hi);
  }
};

/* Shared tiles are [rows][COLS] b16, COLS a multiple of 64; the 16-byte chunk
 * c of row r sits at chunk c ^ (r % 8), so the 8 row addresses of an
 * ldmatrix hit 8 different bank groups. Returns the element offset. */
template <int COLS>
ATTN_DEV int swz(int r, int chunk) {
  return r * COLS + ((chunk ^ (r & 7)) << 3);
}

/* One lane's part of an ldmatrix on a swizzled tile: it addresses row
 * r0 + rows (r0 its row in a 16-row group, rows a multiple of 8) and chunk
 * 2k + h (h its half). (2k + h) ^ (r0 % 8) = 8(k/4) + (2(k%4) ^ t) with
 * t = h ^ (r0 % 8), so four per-lane offsets cover every k and the rest is
 * compile-time when rows and k are. Two patterns occur: A operands and
 * transposed B operands take r0 = l%8 + 8((l/8)%2), h = l/16; B operands
 * and transposed A operands take r0 = l%8 + 8(l/16), h = (l/8)%2. */
struct attn_lane {
  int r0, t;
  uint32_t x[4];
  ATTN_DEV attn_lane(int lane, bool b_pattern) {
    r0 = (lane & 7) + (b_pattern ? lane >> 4 : (lane >> 3) & 1) * 8;
    t = (b_pattern ? (lane >> 3) & 1 : lane >> 4) ^ (lane & 7);
#pragma unroll
    for (int k = 0; k < 4; k++) x[k] = (uint32_t)((2 * k) ^ t) << 4;
  }
  /* k known at compile time */
  template <int COLS>
  ATTN_DEV uint32_t at(uint32_t tile, int rows, int k) const {
    return tile + (uint32_t)(r0 + rows) * (COLS * 2) + x[k & 3] + (uint32_t)(k >> 2) * 128;
  }
  /* k known at run time only (a register array must not be indexed by it) */
  template <int COLS>
  ATTN_DEV uint32_t at_rt(uint32_t tile, int rows, int k) const {
    return tile + (uint32_t)(r0 + rows) * (COLS * 2) + ((uint32_t)((2 * k) ^ t) << 4);
  }
};

/* cp.async a [ROWS][COLS] tile from g (row stride `stride` elements); rows
 * >= rows and columns >= cols are zero-filled without being read. */
template <int ROWS, int COLS, int NT>
ATTN_DEV void load_tile(uint16_t *s, const uint16_t *g, int64_t stride, int rows, int cols,
                        const void *dummy, int tid) {
  constexpr int CH = COLS / 8, N = ROWS * CH;
#pragma unroll 1 /* rolled: unrolled, the hoisted 64-bit addresses cost ~30 registers */
  for (int idx = tid; idx < N; idx += NT) {
    int r = idx / CH, c = idx % CH;
    bool ok = r < rows && c * 8 < cols;
    cp_async16(s + swz<COLS>(r, c), ok ? (const void *)(g + r * stride + c * 8) : dummy, ok);
  }
}

/* Padded head dims that have kernels: the first pair with both dims >= the
 * request (64/64, 128/128, 192/128 for MLA, 256/256). -1 if none. */
static inline int attn_dims_config(int d_qk, int d_v) {
  static const int dq[4] = {64, 128, 192, 256}, dv[4] = {64, 128, 128, 256};
  for (int c = 0; c < 4; c++)
    if (d_qk <= dq[c] && d_v <= dv[c]) return c;
  return -1;
}

#endif
