/*
 * attn.c — CPU twins of the attention step (kernels/attn/attn_fwd.cu and
 * kernels/attn/attn_bwd.cu): plain loops in double over every (sequence, head,
 * query row), with exactly the semantics of dl_attn_params_t in attn.h —
 * bshd/sbhd/thd addressing with padded offsets, windows in both alignments,
 * GQA, max_logit, the fused merge into (acc_out, acc_lse), and the backward
 * from the given out and lse with accumulate_grads. Results are rounded
 * double -> float -> output dtype. These are the reference the checkers use;
 * experiments/lab/attn/attn_cpu_test.c checks them against a full-matrix
 * implementation and finite differences.
 */
#include <stdlib.h>

#include "attn_cpu.h"

typedef struct seq {
  int q_len, kv_len;
  int64_t q_start, kv_start;
} seq_t;

static seq_t seq_of(const dl_attn_params_t *p, int bi) {
  seq_t s = {p->s_q, p->s_kv, 0, 0};
  if (p->cu_seqlens_q) {
    const int32_t *qp = p->cu_seqlens_q_padded ? p->cu_seqlens_q_padded : p->cu_seqlens_q;
    const int32_t *kp = p->cu_seqlens_kv_padded ? p->cu_seqlens_kv_padded : p->cu_seqlens_kv;
    s.q_len = p->cu_seqlens_q[bi + 1] - p->cu_seqlens_q[bi];
    s.kv_len = p->cu_seqlens_kv[bi + 1] - p->cu_seqlens_kv[bi];
    s.q_start = qp[bi];
    s.kv_start = kp[bi];
  }
  return s;
}

/* Offset of (bi, position i, head hh) in an operand. */
static int64_t at(const dl_attn_params_t *p, const dl_attn_strides_t *st, int bi, int64_t start,
                  int64_t i, int hh) {
  return attn_base(st, p->cu_seqlens_q != NULL, bi, start) + i * st->s + (int64_t)hh * st->h;
}

static int max_kv_len(const dl_attn_params_t *p) {
  int m = 0;
  for (int bi = 0; bi < p->b; bi++) {
    int l = seq_of(p, bi).kv_len;
    if (l > m) m = l;
  }
  return m;
}

static double dot(const void *a, int64_t ia, const void *b, int64_t ib, int dtype, int n) {
  double s = 0;
  for (int c = 0; c < n; c++) s += attn_ld(a, dtype, ia + c) * attn_ld(b, dtype, ib + c);
  return s;
}

/* ---- forward ------------------------------------------------------------ */

int dl_attn_fwd_cpu(const dl_attn_params_t *p, void *stream) {
  (void)stream;
  DL_TRY(dl_attn_validate(p, 0, 0));
  int dt = p->dtype, group = p->h_q / p->h_kv, nkv = max_kv_len(p);
  double *sc = malloc(sizeof(double) * (nkv + 1));
  double *o = malloc(sizeof(double) * p->d_v);
  if (!sc || !o) {
    free(sc);
    free(o);
    return DL_ERR(DL_ENOMEM, "attn fwd cpu: out of host memory");
  }
  for (int bi = 0; bi < p->b; bi++) {
    seq_t s = seq_of(p, bi);
    for (int hq = 0; hq < p->h_q; hq++) {
      int hk = hq / group;
      for (int64_t i = 0; i < s.q_len; i++) {
        int64_t qo = at(p, &p->q_st, bi, s.q_start, i, hq);
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < s.kv_len; j++) {
          if (!attn_visible(p, i, j, s.q_len, s.kv_len)) continue;
          sc[j] = p->scale * dot(p->q, qo, p->k, at(p, &p->k_st, bi, s.kv_start, j, hk), dt, p->d_qk);
          if (sc[j] > m) m = sc[j];
        }
        for (int c = 0; c < p->d_v; c++) o[c] = 0;
        for (int64_t j = 0; j < s.kv_len && m > -INFINITY; j++) {
          if (!attn_visible(p, i, j, s.q_len, s.kv_len)) continue;
          double e = exp(sc[j] - m);
          int64_t vo = at(p, &p->v_st, bi, s.kv_start, j, hk);
          l += e;
          for (int c = 0; c < p->d_v; c++) o[c] += e * attn_ld(p->v, dt, vo + c);
        }
        double lse = m > -INFINITY ? m + log(l) : -INFINITY;
        for (int c = 0; c < p->d_v; c++) o[c] = l > 0 ? o[c] / l : 0;
        if (p->max_logit && m > -INFINITY && (float)m > p->max_logit[hq]) p->max_logit[hq] = (float)m;
        if (!p->acc_out) {
          int64_t oo = at(p, &p->out_st, bi, s.q_start, i, hq);
          for (int c = 0; c < p->d_v; c++) attn_st(p->out, dt, oo + c, o[c]);
          p->lse[at(p, &p->lse_st, bi, s.q_start, i, hq)] = (float)lse;
          continue;
        }
        if (lse == -INFINITY) continue;
        int64_t ao = at(p, &p->acc_out_st, bi, s.q_start, i, hq);
        int64_t al = at(p, &p->acc_lse_st, bi, s.q_start, i, hq);
        double L = p->acc_lse[al], Ln = attn_logaddexp(L, lse);
        double a = L == -INFINITY ? 0 : exp(L - Ln), bn = exp(lse - Ln);
        for (int c = 0; c < p->d_v; c++)
          attn_st(p->acc_out, p->acc_dtype, ao + c,
                  attn_ld(p->acc_out, p->acc_dtype, ao + c) * a + o[c] * bn);
        p->acc_lse[al] = (float)Ln;
      }
    }
  }
  free(sc);
  free(o);
  return 0;
}

/* ---- backward ----------------------------------------------------------- */

int dl_attn_bwd_cpu(const dl_attn_params_t *p, void *stream) {
  (void)stream;
  DL_TRY(dl_attn_validate(p, 1, 0));
  int dt = p->dtype, group = p->h_q / p->h_kv, nkv = max_kv_len(p);
  size_t nk = (size_t)nkv * p->d_qk, nv = (size_t)nkv * p->d_v;
  double *dk = malloc(sizeof(double) * (nk + 1)), *dv = malloc(sizeof(double) * (nv + 1));
  double *dq = malloc(sizeof(double) * p->d_qk);
  if (!dk || !dv || !dq) {
    free(dk), free(dv), free(dq);
    return DL_ERR(DL_ENOMEM, "attn bwd cpu: out of host memory");
  }
  for (int bi = 0; bi < p->b; bi++) {
    seq_t s = seq_of(p, bi);
    for (int hk = 0; hk < p->h_kv; hk++) {
      for (size_t x = 0; x < nk; x++) dk[x] = 0;
      for (size_t x = 0; x < nv; x++) dv[x] = 0;
      for (int hq = hk * group; hq < (hk + 1) * group; hq++) {
        for (int64_t i = 0; i < s.q_len; i++) {
          int64_t qo = at(p, &p->q_st, bi, s.q_start, i, hq);
          int64_t doo = at(p, &p->dout_st, bi, s.q_start, i, hq);
          double L = p->lse[at(p, &p->lse_st, bi, s.q_start, i, hq)];
          double D = dot(p->dout, doo, p->out, at(p, &p->out_st, bi, s.q_start, i, hq), dt, p->d_v);
          for (int c = 0; c < p->d_qk; c++) dq[c] = 0;
          for (int64_t j = 0; j < s.kv_len && L > -INFINITY; j++) {
            if (!attn_visible(p, i, j, s.q_len, s.kv_len)) continue;
            int64_t ko = at(p, &p->k_st, bi, s.kv_start, j, hk);
            int64_t vo = at(p, &p->v_st, bi, s.kv_start, j, hk);
            double P = exp(p->scale * dot(p->q, qo, p->k, ko, dt, p->d_qk) - L);
            double dS = P * (dot(p->dout, doo, p->v, vo, dt, p->d_v) - D);
            for (int c = 0; c < p->d_qk; c++) {
              dq[c] += p->scale * dS * attn_ld(p->k, dt, ko + c);
              dk[j * p->d_qk + c] += p->scale * dS * attn_ld(p->q, dt, qo + c);
            }
            for (int c = 0; c < p->d_v; c++) dv[j * p->d_v + c] += P * attn_ld(p->dout, dt, doo + c);
          }
          int64_t dqo = at(p, &p->dq_st, bi, s.q_start, i, hq);
          for (int c = 0; c < p->d_qk; c++)
            attn_st(p->dq, dt, dqo + c, dq[c] + (p->accumulate_grads ? attn_ld(p->dq, dt, dqo + c) : 0));
        }
      }
      for (int64_t j = 0; j < s.kv_len; j++) {
        int64_t dko = at(p, &p->dk_st, bi, s.kv_start, j, hk);
        int64_t dvo = at(p, &p->dv_st, bi, s.kv_start, j, hk);
        for (int c = 0; c < p->d_qk; c++)
          attn_st(p->dk, dt, dko + c,
                  dk[j * p->d_qk + c] + (p->accumulate_grads ? attn_ld(p->dk, dt, dko + c) : 0));
        for (int c = 0; c < p->d_v; c++)
          attn_st(p->dv, dt, dvo + c,
                  dv[j * p->d_v + c] + (p->accumulate_grads ? attn_ld(p->dv, dt, dvo + c) : 0));
      }
    }
  }
  free(dk), free(dv), free(dq);
  return 0;
}
