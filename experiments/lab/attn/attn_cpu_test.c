/*
 * attn_cpu_test.c — checks the CPU twins (kernels/attn/cpu/attn*.c), which the
 * GPU checker trusts, without a GPU:
 *   1. fwd and bwd against a full-matrix double implementation written here
 *      (scores matrix, mask matrix, softmax, and the analytic gradients) on
 *      bshd, sbhd and thd (offsets not at 0, gaps of NaN that must be neither
 *      read nor written), masks and windows in both alignments, GQA, MLA dims,
 *      lengths 0 and 1, max_logit, accumulate_grads;
 *   2. the analytic gradients of the full-matrix implementation against
 *      central finite differences of sum(dO * O);
 *   3. merges: attention over keys [0,a) and [a,n) merged (incremental, lse
 *      merge + init/add, fused accumulate, thd halves) equals attention over
 *      [0,n).
 * Build and run: make -C experiments/lab/attn cpu
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/cpu/attn_cpu.h"

static int n_pass, n_fail;
static uint64_t rng = 88172645463325252ull;

static double urand(void) { /* [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) * 0x1p-52 - 1.0;
}

static void check(const char *what, double err, double tol) {
  int ok = err <= tol;
  n_pass += ok, n_fail += !ok;
  printf("%-4s %-70s err %.3e tol %.1e\n", ok ? "ok" : "FAIL", what, err, tol);
}

/* ---- full-matrix reference (one sequence, one head) ---------------------- */

typedef struct mask {
  int wl, wr, br;
} mask_t;

static int vis(mask_t m, int i, int j, int sq, int skv) {
  int shift = m.br ? skv - sq : 0, d = j - (i + shift);
  return (m.wl < 0 || d >= -m.wl) && (m.wr < 0 || d <= m.wr);
}

/* O [sq][dv], L [sq], rowmax of scaled logits [sq]. */
static void ref_fwd(const double *Q, const double *K, const double *V, int sq, int skv, int dqk,
                    int dv, double scale, mask_t mk, double *O, double *L, double *M) {
  double *S = calloc((size_t)sq * skv + 1, sizeof(double));
  for (int i = 0; i < sq; i++) {
    double m = -INFINITY, l = 0;
    for (int j = 0; j < skv; j++) {
      double s = 0;
      for (int c = 0; c < dqk; c++) s += Q[i * dqk + c] * K[j * dqk + c];
      S[i * skv + j] = vis(mk, i, j, sq, skv) ? s * scale : -INFINITY;
      if (S[i * skv + j] > m) m = S[i * skv + j];
    }
    for (int j = 0; j < skv; j++) l += m > -INFINITY ? exp(S[i * skv + j] - m) : 0;
    M[i] = m;
    L[i] = l > 0 ? m + log(l) : -INFINITY;
    for (int c = 0; c < dv; c++) {
      double o = 0;
      for (int j = 0; j < skv; j++) o += l > 0 ? exp(S[i * skv + j] - L[i]) * V[j * dv + c] : 0;
      O[i * dv + c] = o;
    }
  }
  free(S);
}

/* Gradients of sum(dO*O) given the forward's O and L (accumulated into). */
static void ref_bwd(const double *Q, const double *K, const double *V, const double *O,
                    const double *L, const double *dO, int sq, int skv, int dqk, int dv,
                    double scale, mask_t mk, double *dQ, double *dK, double *dV) {
  for (int i = 0; i < sq; i++) {
    double D = 0;
    for (int c = 0; c < dv; c++) D += dO[i * dv + c] * O[i * dv + c];
    for (int j = 0; j < skv; j++) {
      if (!vis(mk, i, j, sq, skv) || L[i] == -INFINITY) continue;
      double s = 0, dp = 0;
      for (int c = 0; c < dqk; c++) s += Q[i * dqk + c] * K[j * dqk + c];
      for (int c = 0; c < dv; c++) dp += dO[i * dv + c] * V[j * dv + c];
      double P = exp(s * scale - L[i]), dS = P * (dp - D);
      for (int c = 0; c < dqk; c++) {
        dQ[i * dqk + c] += scale * dS * K[j * dqk + c];
        dK[j * dqk + c] += scale * dS * Q[i * dqk + c];
      }
      for (int c = 0; c < dv; c++) dV[j * dv + c] += P * dO[i * dv + c];
    }
  }
}

static void finite_differences(void) {
  enum { SQ = 5, SKV = 7, DQ = 4, DV = 3 };
  double Q[SQ * DQ], K[SKV * DQ], V[SKV * DV], dO[SQ * DV], O[SQ * DV], L[SQ], M[SQ];
  double dQ[SQ * DQ] = {0}, dK[SKV * DQ] = {0}, dV[SKV * DV] = {0};
  mask_t mk = {2, 1, 1};
  for (int x = 0; x < SQ * DQ; x++) Q[x] = urand();
  for (int x = 0; x < SKV * DQ; x++) K[x] = urand();
  for (int x = 0; x < SKV * DV; x++) V[x] = urand();
  for (int x = 0; x < SQ * DV; x++) dO[x] = urand();
  ref_fwd(Q, K, V, SQ, SKV, DQ, DV, 0.7, mk, O, L, M);
  ref_bwd(Q, K, V, O, L, dO, SQ, SKV, DQ, DV, 0.7, mk, dQ, dK, dV);
  double *xs[3] = {Q, K, V}, *gs[3] = {dQ, dK, dV}, err = 0;
  int ns[3] = {SQ * DQ, SKV * DQ, SKV * DV};
  for (int t = 0; t < 3; t++)
    for (int x = 0; x < ns[t]; x++) {
      double keep = xs[t][x], f[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        xs[t][x] = keep + (sgn ? -1e-5 : 1e-5);
        ref_fwd(Q, K, V, SQ, SKV, DQ, DV, 0.7, mk, O, L, M);
        f[sgn] = 0;
        for (int y = 0; y < SQ * DV; y++) f[sgn] += dO[y] * O[y];
      }
      xs[t][x] = keep;
      double e = fabs((f[0] - f[1]) / 2e-5 - gs[t][x]);
      if (e > err) err = e;
    }
  check("full-matrix gradients vs finite differences (window 2,1 bottom-right)", err, 1e-7);
}

/* ---- the twins against the full-matrix reference ------------------------- */

enum { BSHD = 0, SBHD = 1, THD = 2, MAXB = 6 };
static const char *layout_name[3] = {"bshd", "sbhd", "thd"};

typedef struct prob {
  int layout, b, hq, hkv, dqk, dv, dtype, acc_grads;
  int qlen[MAXB], kvlen[MAXB], sq, skv;
  mask_t mk;
  double scale;
  int32_t cu_q[MAXB + 1], cu_kv[MAXB + 1], pad_q[MAXB + 1], pad_kv[MAXB + 1];
  int64_t tq, tkv;
} prob_t;

static uint16_t sentinel(int dtype) { return dtype == DL_BF16 ? 0x7fc1 : 0x7e01; }

/* A [rows, heads, d] operand in the problem's layout, every element set to
 * the sentinel NaN; st gets its strides. */
static void *tensor(const prob_t *pr, int q_side, int heads, int d, dl_attn_strides_t *st,
                    int64_t *n) {
  int64_t s = q_side ? pr->sq : pr->skv, t = q_side ? pr->tq : pr->tkv;
  if (pr->layout == BSHD) *st = (dl_attn_strides_t){s * heads * d, (int64_t)heads * d, d};
  if (pr->layout == SBHD) *st = (dl_attn_strides_t){(int64_t)heads * d, (int64_t)pr->b * heads * d, d};
  if (pr->layout == THD) *st = (dl_attn_strides_t){0, (int64_t)heads * d, d};
  *n = (pr->layout == THD ? t : s * pr->b) * heads * d;
  uint16_t *x = malloc(sizeof(uint16_t) * (*n + 1));
  for (int64_t e = 0; e < *n; e++) x[e] = sentinel(pr->dtype);
  return x;
}

static int64_t off(const prob_t *pr, const dl_attn_strides_t *st, int q_side, int bi, int i,
                   int h) {
  int64_t start = q_side ? pr->pad_q[bi] : pr->pad_kv[bi];
  return attn_base(st, pr->layout == THD, bi, start) + (int64_t)i * st->s + (int64_t)h * st->h;
}

/* Logical values: X[((bi*heads + h)*len_max + i)*d + c], rounded to dtype. */
static double *values(const prob_t *pr, int q_side, int heads, int d) {
  size_t n = (size_t)pr->b * heads * (q_side ? pr->sq : pr->skv) * d;
  double *x = malloc(sizeof(double) * (n + 1));
  for (size_t e = 0; e < n; e++) {
    uint16_t h = pr->dtype == DL_BF16 ? dl_f32_to_bf16((float)urand()) : dl_f32_to_f16((float)urand());
    x[e] = pr->dtype == DL_BF16 ? dl_bf16_to_f32(h) : dl_f16_to_f32(h);
  }
  return x;
}

static void scatter(const prob_t *pr, void *t, const dl_attn_strides_t *st, const double *x,
                    int q_side, int heads, int d) {
  int smax = q_side ? pr->sq : pr->skv;
  for (int bi = 0; bi < pr->b; bi++)
    for (int h = 0; h < heads; h++)
      for (int i = 0; i < (q_side ? pr->qlen[bi] : pr->kvlen[bi]); i++)
        for (int c = 0; c < d; c++)
          attn_st(t, pr->dtype, off(pr, st, q_side, bi, i, h) + c,
                  x[(((size_t)bi * heads + h) * smax + i) * d + c]);
}

/* Max relative error of t against x on valid rows; NaN-sentinels elsewhere
 * must be untouched (returns inf otherwise). */
static double compare(const prob_t *pr, const void *t, const dl_attn_strides_t *st,
                      const double *x, int q_side, int heads, int d, int64_t n) {
  int smax = q_side ? pr->sq : pr->skv;
  double err = 0;
  char *valid = calloc(n + 1, 1);
  for (int bi = 0; bi < pr->b; bi++)
    for (int h = 0; h < heads; h++)
      for (int i = 0; i < (q_side ? pr->qlen[bi] : pr->kvlen[bi]); i++)
        for (int c = 0; c < d; c++) {
          int64_t o = off(pr, st, q_side, bi, i, h) + c;
          double a = attn_ld(t, pr->dtype, o), b = x[(((size_t)bi * heads + h) * smax + i) * d + c];
          double e = a == b ? 0 : fabs(a - b) / (fabs(b) + 1e-3);
          if (!(e <= err)) err = isnan(e) ? INFINITY : e;
          valid[o] = 1;
        }
  for (int64_t e = 0; e < n; e++)
    if (!valid[e] && ((const uint16_t *)t)[e] != sentinel(pr->dtype)) err = INFINITY;
  free(valid);
  return err;
}

static void layout_offsets(prob_t *pr) {
  pr->sq = pr->skv = 0;
  pr->cu_q[0] = pr->cu_kv[0] = 0;
  pr->pad_q[0] = 3, pr->pad_kv[0] = 5; /* offsets that do not start at 0 */
  for (int bi = 0; bi < pr->b; bi++) {
    if (pr->qlen[bi] > pr->sq) pr->sq = pr->qlen[bi];
    if (pr->kvlen[bi] > pr->skv) pr->skv = pr->kvlen[bi];
    pr->cu_q[bi + 1] = pr->cu_q[bi] + pr->qlen[bi];
    pr->cu_kv[bi + 1] = pr->cu_kv[bi] + pr->kvlen[bi];
    pr->pad_q[bi + 1] = pr->pad_q[bi] + pr->qlen[bi] + (bi % 3) * 2; /* gaps */
    pr->pad_kv[bi + 1] = pr->pad_kv[bi] + pr->kvlen[bi] + (bi % 2) * 3;
  }
  pr->tq = pr->pad_q[pr->b] + 4;
  pr->tkv = pr->pad_kv[pr->b] + 1;
  if (pr->layout != THD) pr->pad_q[0] = pr->pad_kv[0] = 0;
}

static void run_twins(prob_t pr, const char *name) {
  layout_offsets(&pr);
  int thd = pr.layout == THD, g = pr.hq / pr.hkv;
  double *Q = values(&pr, 1, pr.hq, pr.dqk), *K = values(&pr, 0, pr.hkv, pr.dqk);
  double *V = values(&pr, 0, pr.hkv, pr.dv), *dO = values(&pr, 1, pr.hq, pr.dv);
  double *G0[3] = {values(&pr, 1, pr.hq, pr.dqk), values(&pr, 0, pr.hkv, pr.dqk),
                   values(&pr, 0, pr.hkv, pr.dv)};
  size_t nq = (size_t)pr.b * pr.hq * pr.sq, nk = (size_t)pr.b * pr.hkv * pr.skv;
  double *O = calloc(nq * pr.dv + 1, 8), *L = calloc(nq + 1, 8), *M = calloc(nq + 1, 8);
  double *dQ = calloc(nq * pr.dqk + 1, 8), *dK = calloc(nk * pr.dqk + 1, 8);
  double *dV = calloc(nk * pr.dv + 1, 8), *Ot = calloc(nq * pr.dv + 1, 8);
  dl_attn_params_t p = {0};
  int64_t n_q, n_k, n_v, n_o, n_dq, n_dk, n_dv, n_do;
  p.dtype = pr.dtype, p.b = pr.b, p.h_q = pr.hq, p.h_kv = pr.hkv, p.s_q = pr.sq, p.s_kv = pr.skv;
  p.d_qk = pr.dqk, p.d_v = pr.dv, p.scale = (float)pr.scale;
  p.window_left = pr.mk.wl, p.window_right = pr.mk.wr, p.bottom_right = pr.mk.br;
  if (thd) {
    p.cu_seqlens_q = pr.cu_q, p.cu_seqlens_kv = pr.cu_kv;
    p.cu_seqlens_q_padded = pr.pad_q, p.cu_seqlens_kv_padded = pr.pad_kv;
    p.total_q = pr.tq, p.total_kv = pr.tkv;
  }
  void *q = tensor(&pr, 1, pr.hq, pr.dqk, &p.q_st, &n_q), *k = tensor(&pr, 0, pr.hkv, pr.dqk, &p.k_st, &n_k);
  void *v = tensor(&pr, 0, pr.hkv, pr.dv, &p.v_st, &n_v), *out = tensor(&pr, 1, pr.hq, pr.dv, &p.out_st, &n_o);
  void *dout = tensor(&pr, 1, pr.hq, pr.dv, &p.dout_st, &n_do);
  void *dq = tensor(&pr, 1, pr.hq, pr.dqk, &p.dq_st, &n_dq), *dk = tensor(&pr, 0, pr.hkv, pr.dqk, &p.dk_st, &n_dk);
  void *dv = tensor(&pr, 0, pr.hkv, pr.dv, &p.dv_st, &n_dv);
  scatter(&pr, q, &p.q_st, Q, 1, pr.hq, pr.dqk), scatter(&pr, k, &p.k_st, K, 0, pr.hkv, pr.dqk);
  scatter(&pr, v, &p.v_st, V, 0, pr.hkv, pr.dv), scatter(&pr, dout, &p.dout_st, dO, 1, pr.hq, pr.dv);
  int64_t n_l = (int64_t)pr.hq * (thd ? pr.tq : (int64_t)pr.b * pr.sq);
  float *lse = malloc(sizeof(float) * n_l), maxl[64];
  for (int64_t e = 0; e < n_l; e++) lse[e] = NAN;
  for (int h = 0; h < pr.hq; h++) maxl[h] = -INFINITY;
  p.lse_st = thd ? (dl_attn_strides_t){0, 1, pr.tq} : (dl_attn_strides_t){(int64_t)pr.hq * pr.sq, 1, pr.sq};
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse, p.max_logit = maxl;
  p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv, p.accumulate_grads = pr.acc_grads;
  if (pr.acc_grads) {
    scatter(&pr, dq, &p.dq_st, G0[0], 1, pr.hq, pr.dqk), scatter(&pr, dk, &p.dk_st, G0[1], 0, pr.hkv, pr.dqk);
    scatter(&pr, dv, &p.dv_st, G0[2], 0, pr.hkv, pr.dv);
  }
  int rc = dl_attn_fwd_cpu(&p, NULL);
  /* reference, per (sequence, head); bwd from the twin's rounded output */
  double merr = 0, lerr = 0;
  for (int bi = 0; bi < pr.b; bi++)
    for (int h = 0; h < pr.hq; h++) {
      size_t qo = ((size_t)bi * pr.hq + h) * pr.sq, ko = ((size_t)bi * pr.hkv + h / g) * pr.skv;
      ref_fwd(Q + qo * pr.dqk, K + ko * pr.dqk, V + ko * pr.dv, pr.qlen[bi], pr.kvlen[bi], pr.dqk,
              pr.dv, (float)pr.scale, pr.mk, O + qo * pr.dv, L + qo, M + qo);
      for (int i = 0; i < pr.qlen[bi]; i++) {
        int64_t lo = attn_base(&p.lse_st, thd, bi, pr.pad_q[bi]) + (int64_t)i * p.lse_st.s + h * p.lse_st.h;
        double e = lse[lo] == L[qo + i] ? 0 : fabs(lse[lo] - L[qo + i]);
        if (!(e <= lerr)) lerr = isnan(e) ? INFINITY : e;
        for (int c = 0; c < pr.dv; c++)
          Ot[(qo + i) * pr.dv + c] = attn_ld(out, pr.dtype, off(&pr, &p.out_st, 1, bi, i, h) + c);
      }
      ref_bwd(Q + qo * pr.dqk, K + ko * pr.dqk, V + ko * pr.dv, Ot + qo * pr.dv, L + qo, dO + qo * pr.dv,
              pr.qlen[bi], pr.kvlen[bi], pr.dqk, pr.dv, (float)pr.scale, pr.mk, dQ + qo * pr.dqk,
              dK + ko * pr.dqk, dV + ko * pr.dv);
    }
  for (int h = 0; h < pr.hq; h++) {
    double m = -INFINITY;
    for (int bi = 0; bi < pr.b; bi++)
      for (int i = 0; i < pr.qlen[bi]; i++)
        if (M[((size_t)bi * pr.hq + h) * pr.sq + i] > m) m = M[((size_t)bi * pr.hq + h) * pr.sq + i];
    double e = (float)m == maxl[h] ? 0 : fabs(m - maxl[h]);
    if (!(e <= merr)) merr = isnan(e) ? INFINITY : e;
  }
  for (int64_t e = 0; e < n_l && thd; e++) { /* lse gap rows stay NaN */
    int64_t row = e % pr.tq, valid = 0;
    for (int bi = 0; bi < pr.b; bi++) valid |= row >= pr.pad_q[bi] && row < pr.pad_q[bi] + pr.qlen[bi];
    if (!valid && !isnan(lse[e])) lerr = INFINITY;
  }
  char what[160];
  double tol = pr.dtype == DL_BF16 ? 4e-3 : 5e-4;
  snprintf(what, sizeof what, "%s %s fwd out", name, layout_name[pr.layout]);
  check(what, rc ? INFINITY : compare(&pr, out, &p.out_st, O, 1, pr.hq, pr.dv, n_o), tol);
  snprintf(what, sizeof what, "%s %s fwd lse, max_logit", name, layout_name[pr.layout]);
  check(what, lerr > merr ? lerr : merr, 1e-5);
  if (pr.acc_grads)
    for (size_t e = 0; e < nq * pr.dqk; e++) dQ[e] += G0[0][e];
  if (pr.acc_grads)
    for (size_t e = 0; e < nk * pr.dqk; e++) dK[e] += G0[1][e];
  if (pr.acc_grads)
    for (size_t e = 0; e < nk * pr.dv; e++) dV[e] += G0[2][e];
  rc = dl_attn_bwd_cpu(&p, NULL);
  double ge = compare(&pr, dq, &p.dq_st, dQ, 1, pr.hq, pr.dqk, n_dq);
  double e2 = compare(&pr, dk, &p.dk_st, dK, 0, pr.hkv, pr.dqk, n_dk);
  double e3 = compare(&pr, dv, &p.dv_st, dV, 0, pr.hkv, pr.dv, n_dv);
  ge = ge > e2 ? ge : e2, ge = ge > e3 ? ge : e3;
  snprintf(what, sizeof what, "%s %s bwd dq dk dv%s", name, layout_name[pr.layout],
           pr.acc_grads ? " (accumulate)" : "");
  check(what, rc ? INFINITY : ge, tol);
  free(Q), free(K), free(V), free(dO), free(G0[0]), free(G0[1]), free(G0[2]);
  free(O), free(L), free(M), free(dQ), free(dK), free(dV), free(Ot);
  free(q), free(k), free(v), free(out), free(dout), free(dq), free(dk), free(dv), free(lse);
}

/* ---- merges --------------------------------------------------------------- */

/* bshd [B, SQ, H, D] q; keys [0,N) = [0,A) unmasked + [A,N) bottom-right causal. */
enum { MB = 2, MSQ = 9, MN = 13, MA = 4, MH = 3, MD = 16 };

typedef struct step {
  uint16_t out[MB * MSQ * MH * MD];
  float lse[MB * MH * MSQ];
} step_t;

static dl_attn_params_t merge_params(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                     int n_keys, int causal) {
  dl_attn_params_t p = {0};
  p.dtype = DL_BF16, p.b = MB, p.h_q = p.h_kv = MH, p.s_q = MSQ, p.s_kv = n_keys;
  p.d_qk = p.d_v = MD, p.scale = 0.25f, p.window_left = -1, p.window_right = causal ? 0 : -1;
  p.bottom_right = 1, p.q = q, p.k = k, p.v = v;
  p.q_st = p.out_st = p.acc_out_st = (dl_attn_strides_t){MSQ * MH * MD, MH * MD, MD};
  p.k_st = p.v_st = (dl_attn_strides_t){MN * MH * MD, MH * MD, MD};
  p.lse_st = p.acc_lse_st = (dl_attn_strides_t){MH * MSQ, 1, MSQ};
  return p;
}

static dl_attn_merge_params_t out_merge(void *out, int out_dtype, float *lse, const step_t *st,
                                        int mode) {
  dl_attn_merge_params_t m = {0};
  m.b = MB, m.h = MH, m.s = MSQ, m.d = MD, m.mode = mode;
  m.out = out, m.out_dtype = out_dtype, m.lse = lse, m.part = st->out, m.part_dtype = DL_BF16;
  m.part_lse = st->lse;
  m.out_st = m.part_st = (dl_attn_strides_t){MSQ * MH * MD, MH * MD, MD};
  m.lse_st = m.part_lse_st = (dl_attn_strides_t){MH * MSQ, 1, MSQ};
  return m;
}

static double max_err(const void *a, int dta, const uint16_t *b, int n, double atol) {
  double err = 0;
  for (int e = 0; e < n; e++) {
    double x = attn_ld(a, dta, e), y = dl_bf16_to_f32(b[e]), d = fabs(x - y) / (atol + fabs(y));
    if (!(d <= err)) err = isnan(d) ? INFINITY : d;
  }
  return err;
}

static double lse_err(const float *a, const float *b, int n) {
  double err = 0;
  for (int e = 0; e < n; e++) {
    double d = a[e] == b[e] ? 0 : fabs(a[e] - b[e]);
    if (!(d <= err)) err = isnan(d) ? INFINITY : d;
  }
  return err;
}

static void merges(void) {
  static uint16_t q[MB * MSQ * MH * MD], k[MB * MN * MH * MD], v[MB * MN * MH * MD];
  static step_t full, part[2];
  static float acc[MB * MSQ * MH * MD], acc_lse[MB * MH * MSQ];
  static uint16_t post[MB * MSQ * MH * MD];
  int no = MB * MSQ * MH * MD, nl = MB * MH * MSQ, rc = 0;
  for (int e = 0; e < no; e++) q[e] = dl_f32_to_bf16((float)urand());
  for (int e = 0; e < MB * MN * MH * MD; e++) k[e] = dl_f32_to_bf16((float)urand() * 2);
  for (int e = 0; e < MB * MN * MH * MD; e++) v[e] = dl_f32_to_bf16((float)urand());
  dl_attn_params_t pf = merge_params(q, k, v, MN, 1);
  dl_attn_params_t p0 = merge_params(q, k, v, MA, 0);
  dl_attn_params_t p1 = merge_params(q, k + MA * MH * MD, v + MA * MH * MD, MN - MA, 1);
  pf.out = full.out, pf.lse = full.lse, p0.out = part[0].out, p0.lse = part[0].lse;
  p1.out = part[1].out, p1.lse = part[1].lse;
  rc |= dl_attn_fwd_cpu(&pf, NULL) | dl_attn_fwd_cpu(&p0, NULL) | dl_attn_fwd_cpu(&p1, NULL);
  /* incremental, fp32 accumulator */
  for (int e = 0; e < no; e++) acc[e] = 0;
  for (int e = 0; e < nl; e++) acc_lse[e] = -INFINITY;
  for (int i = 0; i < 2; i++) {
    dl_attn_merge_params_t m = out_merge(acc, DL_F32, acc_lse, &part[i], DL_ATTN_MERGE_INCR);
    rc |= dl_attn_merge_out_cpu(&m, NULL);
  }
  check("merge incremental (fp32 acc) of 2 key ranges = full: out", rc ? INFINITY : max_err(acc, DL_F32, full.out, no, 0.1), 3e-2);
  check("merge incremental (fp32 acc) of 2 key ranges = full: lse", lse_err(acc_lse, full.lse, nl), 1e-5);
  /* post-loop: lse merge, then init + add */
  for (int e = 0; e < nl; e++) acc_lse[e] = -INFINITY;
  for (int i = 0; i < 2; i++) {
    dl_attn_merge_params_t m = out_merge(NULL, 0, acc_lse, &part[i], 0);
    rc |= dl_attn_merge_lse_cpu(&m, NULL);
  }
  for (int i = 0; i < 2; i++) {
    dl_attn_merge_params_t m = out_merge(post, DL_BF16, acc_lse, &part[i], i ? DL_ATTN_MERGE_ADD : DL_ATTN_MERGE_INIT);
    rc |= dl_attn_merge_out_cpu(&m, NULL);
  }
  check("merge post-loop (lse merge, init, add; bf16) = full: out", rc ? INFINITY : max_err(post, DL_BF16, full.out, no, 0.1), 3e-2);
  check("merge post-loop lse = full lse", lse_err(acc_lse, full.lse, nl), 1e-5);
  /* fused accumulate in the forward epilogue */
  for (int e = 0; e < no; e++) acc[e] = 0;
  for (int e = 0; e < nl; e++) acc_lse[e] = -INFINITY;
  p0.out = p1.out = NULL, p0.lse = p1.lse = NULL;
  p0.acc_out = p1.acc_out = acc, p0.acc_dtype = p1.acc_dtype = DL_F32;
  p0.acc_lse = p1.acc_lse = acc_lse;
  rc |= dl_attn_fwd_cpu(&p0, NULL) | dl_attn_fwd_cpu(&p1, NULL);
  check("fused merge (fp32 acc) in the fwd epilogue of 2 key ranges = full: out", rc ? INFINITY : max_err(acc, DL_F32, full.out, no, 0.1), 3e-2);
  check("fused merge lse = full lse", lse_err(acc_lse, full.lse, nl), 1e-5);
}

/* thd halves: sequences of padded lengths 8, 12, 6 from row 0 of a [t, h, d]
 * tensor; parts given full-size or as the packed half. */
static void thd_halves(void) {
  enum { T = 26, H = 2, D = 8, NB = 3 };
  static const int32_t cu[NB + 1] = {0, 8, 20, 26};
  static float o[T * H * D], l[H * T], ref_o[T * H * D], ref_l[H * T], pl[H * T], hl[H * T / 2];
  static uint16_t po[T * H * D], ho[T / 2 * H * D];
  for (int e = 0; e < T * H * D; e++) ref_o[e] = o[e] = (float)urand();
  for (int e = 0; e < H * T; e++) ref_l[e] = l[e] = e % 7 ? (float)urand() : -INFINITY;
  for (int e = 0; e < T * H * D; e++) po[e] = dl_f32_to_bf16((float)urand());
  for (int e = 0; e < H * T; e++) pl[e] = e % 5 ? (float)urand() : -INFINITY;
  for (int r = 0; r < T * H * D; r += 37) po[r] = 0;
  int zero_row = 9; /* part row 9, head 1: exactly zero with a finite lse: skipped */
  for (int c = 0; c < D; c++) po[(zero_row * H + 1) * D + c] = 0;
  pl[1 * T + zero_row] = 3.0f;
  /* packed second halves of the part */
  for (int bi = 0, hr = 0; bi < NB; bi++)
    for (int i = (cu[bi + 1] - cu[bi]) / 2; i < cu[bi + 1] - cu[bi]; i++, hr++)
      for (int h = 0; h < H; h++) {
        hl[h * (T / 2) + hr] = pl[h * T + cu[bi] + i];
        for (int c = 0; c < D; c++) ho[(hr * H + h) * D + c] = po[((cu[bi] + i) * H + h) * D + c];
      }
  /* expected: every row merged, except the skipped one */
  for (int r = 0; r < T; r++)
    for (int h = 0; h < H; h++) {
      double L = ref_l[h * T + r], Lp = pl[h * T + r], Ln = attn_logaddexp(L, Lp);
      if (Lp == -INFINITY || (r == zero_row && h == 1)) continue;
      for (int c = 0; c < D; c++) {
        double x = ref_o[(r * H + h) * D + c] * (L == -INFINITY ? 0 : exp(L - Ln)) +
                   dl_bf16_to_f32(po[(r * H + h) * D + c]) * exp(Lp - Ln);
        ref_o[(r * H + h) * D + c] = (float)x;
      }
      ref_l[h * T + r] = (float)Ln;
    }
  dl_attn_merge_params_t m = {0};
  m.b = NB, m.h = H, m.d = D, m.cu_seqlens_padded = cu, m.total = T, m.skip_zero_rows = 1;
  m.mode = DL_ATTN_MERGE_INCR, m.out = o, m.out_dtype = DL_F32, m.lse = l;
  m.out_st = (dl_attn_strides_t){0, H * D, D}, m.lse_st = (dl_attn_strides_t){0, 1, T};
  m.part = po, m.part_dtype = DL_BF16, m.part_lse = pl, m.part_st = m.out_st, m.part_lse_st = m.lse_st;
  m.half = DL_ATTN_HALF_FIRST;
  int rc = dl_attn_merge_out_cpu(&m, NULL);
  m.half = DL_ATTN_HALF_SECOND, m.part_is_half = 1, m.part = ho, m.part_lse = hl;
  m.part_lse_st = (dl_attn_strides_t){0, 1, T / 2};
  rc |= dl_attn_merge_out_cpu(&m, NULL);
  double e = 0;
  for (int x = 0; x < T * H * D; x++) e = fmax(e, fabs(o[x] - ref_o[x]));
  check("thd incremental merge: first half full-size part + second half packed, skip zero rows", rc ? INFINITY : fmax(e, lse_err(l, ref_l, H * T)), 1e-6);
  /* lse merge of the second half only */
  for (int x = 0; x < H * T; x++) l[x] = ref_l[x];
  rc = dl_attn_merge_lse_cpu(&m, NULL);
  e = 0;
  for (int bi = 0; bi < NB; bi++)
    for (int i = 0; i < cu[bi + 1] - cu[bi]; i++)
      for (int h = 0; h < H; h++) {
        int r = cu[bi] + i, second = i >= (cu[bi + 1] - cu[bi]) / 2;
        double want = second ? attn_logaddexp(ref_l[h * T + r], pl[h * T + r]) : ref_l[h * T + r];
        e = fmax(e, (float)want == l[h * T + r] ? 0 : fabs(want - l[h * T + r]));
      }
  check("thd lse merge of the second halves (packed part)", rc ? INFINITY : e, 1e-6);
  /* gradient correction: copy the packed half into second halves, add full-size into first */
  static uint16_t g[T * H * D], g0[T * H * D];
  for (int x = 0; x < T * H * D; x++) g0[x] = g[x] = dl_f32_to_bf16((float)urand());
  m.out = g, m.out_dtype = DL_BF16, m.mode = DL_ATTN_GRAD_COPY;
  rc = dl_attn_merge_grad_cpu(&m, NULL);
  m.half = DL_ATTN_HALF_FIRST, m.part_is_half = 0, m.part = po, m.mode = DL_ATTN_GRAD_ADD;
  rc |= dl_attn_merge_grad_cpu(&m, NULL);
  e = 0;
  for (int bi = 0; bi < NB; bi++)
    for (int i = 0; i < cu[bi + 1] - cu[bi]; i++)
      for (int x = 0; x < H * D; x++) {
        int r = cu[bi] + i, second = i >= (cu[bi + 1] - cu[bi]) / 2;
        double want = second ? dl_bf16_to_f32(po[r * H * D + x])
                             : dl_bf16_to_f32(g0[r * H * D + x]) + dl_bf16_to_f32(po[r * H * D + x]);
        want = dl_bf16_to_f32(dl_f32_to_bf16((float)want));
        e = fmax(e, fabs(want - dl_bf16_to_f32(g[r * H * D + x])));
      }
  check("thd gradient correction: add first halves, copy packed second halves", rc ? INFINITY : e, 0);
}

int main(void) {
  finite_differences();
  static const mask_t masks[] = {{-1, -1, 0}, {-1, 0, 0}, {-1, 0, 1}, {3, 2, 0}, {4, 0, 1}, {0, -1, 1}};
  static const char *mask_names[] = {"none", "causal", "causal-br", "window(3,2)", "window-br(4,0)", "window-br(0,-1)"};
  for (int layout = 0; layout < 3; layout++)
    for (int mi = 0; mi < 6; mi++) {
      prob_t pr = {0};
      pr.layout = layout, pr.b = layout == THD ? 5 : 2, pr.hq = 4, pr.hkv = 2, pr.dqk = 24, pr.dv = 16;
      pr.dtype = mi % 2 ? DL_F16 : DL_BF16, pr.acc_grads = mi >= 3, pr.mk = masks[mi], pr.scale = 0.3;
      static const int ql[5] = {7, 0, 1, 12, 5}, kl[5] = {9, 3, 0, 12, 2};
      for (int bi = 0; bi < pr.b; bi++) {
        pr.qlen[bi] = layout == THD ? ql[bi] : 6;
        pr.kvlen[bi] = layout == THD ? kl[bi] : 10;
      }
      char name[80];
      snprintf(name, sizeof name, "%s %s gqa 4/2 d 24/16", mask_names[mi], pr.dtype == DL_BF16 ? "bf16" : "fp16");
      run_twins(pr, name);
    }
  prob_t mla = {THD, 2, 2, 1, 192, 128, DL_BF16, 0, {5, 9}, {9, 4}, 0, 0, {-1, 0, 1}, 0.1, {0}, {0}, {0}, {0}, 0, 0};
  run_twins(mla, "MLA 192/128 mqa causal-br");
  merges();
  thd_halves();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
