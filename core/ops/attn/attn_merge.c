/*
 * attn_merge.c — the merges of partial attention results that CP schedules
 * use (lse merge, incremental / post-loop output merge, gradient correction),
 * over whole tensors or one half of every sequence: checks the tensors
 * (core/ops/attn/attn_args.h) and runs the merge kernel or its CPU twin.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_args.h"
#include "base/device.h"

/* ---- merges ---------------------------------------------------------------------- */

/* A part shorter than its target holds the selected half only (bshd/sbhd:
 * exactly half the positions; thd: checked against cu_seqlens_padded). */
static int part_rows(const char *op, const char *name, int64_t n, const char *tname, int64_t tn,
                     int half, int thd) {
  if (n == tn || (half && (thd ? n < tn : 2 * n == tn))) return 0;
  return DL_ERR(DL_EINVAL,
                "%s: %s has %lld %s but %s has %lld; a shorter part needs rows = "
                "first or second half and %s",
                op, name, (long long)n, thd ? "rows" : "positions", tname, (long long)tn,
                thd ? "fewer rows" : "half the positions");
}

/* what: 0 lse merge, 1 dl_attn_arg_output merge, 2 gradient; main = lse (0) or out/grad. */
static int merge(const char *op, const dl_attn_merge_opts_t *o, int what, int mode,
                 dl_tensor_t *out, dl_tensor_t *lse, const dl_tensor_t *part,
                 const dl_tensor_t *part_lse, dl_stream_t *s) {
  DL_CHECK_ARG(o, "%s: opts is NULL", op);
  DL_CHECK_ARG(o->layout >= DL_ATTN_BSHD && o->layout <= DL_ATTN_THD,
               "%s: layout %d is not bshd (0), sbhd (1) or thd (2)", op, o->layout);
  DL_CHECK_ARG(o->rows >= DL_ATTN_ROWS_ALL && o->rows <= DL_ATTN_ROWS_SECOND_HALF,
               "%s: rows %d is not all (0), first half (1) or second half (2)", op, o->rows);
  int thd = o->layout == DL_ATTN_THD, half = o->rows != DL_ATTN_ROWS_ALL;
  const char *oname = what == 2 ? "grad" : "out";
  dl_attn_merge_params_t p;
  memset(&p, 0, sizeof p);
  dl_attn_operand_t mo = {0}, ml = {0}, po = {0}, pl = {0};
  const dl_tensor_t *main = what == 0 ? lse : out;
  if (what != 0) {
    DL_TRY(dl_attn_arg_seq(op, oname, out, o->layout, &mo));
    DL_TRY(dl_attn_arg_seq(op, "part", part, o->layout, &po));
    DL_TRY(dl_attn_arg_same_device(op, "part", part, out, oname));
    int dts[2] = {out->dtype_id, part->dtype_id};
    for (int i = 0; i < 2; i++)
      DL_CHECK_ARG(dts[i] == DL_F32 || dts[i] == DL_BF16 || dts[i] == DL_F16,
                   "%s: %s must be f32, bf16 or f16, got %s", op, i ? "part" : oname,
                   dl_dtype_name(dts[i]));
    DL_CHECK_ARG((thd || po.b == mo.b) && po.h == mo.h && po.d == mo.d,
                 "%s: part's batch, heads or head dim differ from %s's", op, oname);
    p.out = mo.ptr, p.out_st = mo.st, p.out_dtype = out->dtype_id;
    p.part = po.ptr, p.part_st = po.st, p.part_dtype = part->dtype_id;
    p.d = (int)mo.d;
  }
  if (what != 2) {
    DL_TRY(dl_attn_arg_lse(op, "lse", lse, thd, &ml));
    DL_TRY(dl_attn_arg_lse(op, "part_lse", part_lse, thd, &pl));
    DL_TRY(dl_attn_arg_same_device(op, "part_lse", part_lse, lse, "lse"));
    if (what == 1) {
      DL_TRY(dl_attn_arg_same_device(op, "lse", lse, out, "out"));
      int64_t want[3];
      DL_TRY(dl_attn_arg_expect_shape(op, "lse", lse,
                                      dl_attn_lse_shape(thd, mo.b, mo.h, mo.s, want), want));
    }
    DL_CHECK_ARG((thd || pl.b == ml.b) && pl.h == ml.h,
                 "%s: part_lse's batch or heads differ from lse's", op);
    p.lse = ml.ptr, p.lse_st = ml.st;
    p.part_lse = pl.ptr, p.part_lse_st = pl.st;
  }
  dl_attn_operand_t *mn = what == 0 ? &ml : &mo, *pn = what == 0 ? &pl : &po;
  int packed = pn->s != mn->s;
  DL_TRY(part_rows(op, what == 0 ? "part_lse" : "part", pn->s, what == 0 ? "lse" : oname, mn->s,
                   half, thd));
  if (what == 1) {
    DL_TRY(part_rows(op, "part_lse", pl.s, "lse", ml.s, half, thd));
    DL_CHECK_ARG((pl.s != ml.s) == packed,
                 "%s: part and part_lse disagree on holding one half only", op);
  }
  p.half = o->rows;
  p.part_is_half = packed;
  p.b = (int)mn->b;
  p.h = (int)mn->h;
  p.s = thd ? 0 : (int)mn->s;
  p.total = thd ? mn->s : 0;
  p.skip_zero_rows = o->skip_zero_rows != 0;
  static const int out_modes[] = {DL_ATTN_MERGE_INCR, DL_ATTN_MERGE_INIT, DL_ATTN_MERGE_ADD};
  static const int grad_modes[] = {DL_ATTN_GRAD_COPY, DL_ATTN_GRAD_ADD};
  if (what == 1) {
    DL_CHECK_ARG(mode >= DL_ATTN_OUT_INCREMENTAL && mode <= DL_ATTN_OUT_ADD,
                 "%s: mode %d is not incremental (0), init (1) or add (2)", op, mode);
    p.mode = out_modes[mode];
  } else if (what == 2) {
    DL_CHECK_ARG(mode == DL_ATTN_GRAD_SET || mode == DL_ATTN_GRAD_ACCUMULATE,
                 "%s: mode %d is not set (0) or accumulate (1)", op, mode);
    p.mode = grad_modes[mode];
  }
  int32_t *host = NULL;
  if (thd) {
    DL_TRY(dl_attn_arg_cu(op, "cu_seqlens_padded", o->cu_seqlens_padded, main, what ? oname : "lse",
                          -1, &p.cu_seqlens_padded));
    p.b = (int)(o->cu_seqlens_padded->sz[0] - 1);
    if (main->dev_type == DL_CPU) {
      DL_TRY(dl_attn_arg_cu_host(op, "cu_seqlens_padded", o->cu_seqlens_padded, s, &host));
      int rc = 0;
      for (int i = 0; i < p.b && !rc; i++) {
        int64_t len = (int64_t)host[i + 1] - host[i];
        if (len < 0 || host[i] < 0 || host[i + 1] > mn->s)
          rc = DL_ERR(DL_EINVAL,
                      "%s: cu_seqlens_padded: sequence %d (rows %d..%d) is not inside "
                      "the %lld rows",
                      op, i, host[i], host[i + 1] - 1, (long long)mn->s);
        else if (half && len % 2)
          rc = DL_ERR(DL_EINVAL,
                      "%s: cu_seqlens_padded: sequence %d has odd length %lld; a "
                      "half needs even lengths",
                      op, i, (long long)len);
      }
      if (!rc && packed && p.b > 0 && (host[p.b] - host[0]) / 2 > pn->s)
        rc = DL_ERR(DL_EINVAL, "%s: the packed half needs %d rows, part has %lld", op,
                    (host[p.b] - host[0]) / 2, (long long)pn->s);
      free(host);
      DL_TRY(rc);
    }
  }
  if (main->dev_type == DL_META || mn->s == 0 || (thd ? p.b : mn->b) == 0) return 0;
  void **ptrs[] = {&p.out, (void **)&p.lse, (void **)&p.part, (void **)&p.part_lse};
  dl_attn_lend(ptrs, 4);
  if (main->dev_type == DL_CPU)
    return what == 0   ? dl_attn_merge_lse_cpu(&p, NULL)
           : what == 1 ? dl_attn_merge_out_cpu(&p, NULL)
                       : dl_attn_merge_grad_cpu(&p, NULL);
#ifdef DL_WITH_CUDA
  void *h;
  DL_TRY(dl_cuda_use(main->dev_index));
  DL_TRY(dl_stream_for(s, main->dev_type, main->dev_index, &h));
  return what == 0   ? dl_attn_merge_lse_cuda(&p, h)
         : what == 1 ? dl_attn_merge_out_cuda(&p, h)
                     : dl_attn_merge_grad_cuda(&p, h);
#else
  return DL_ERR(DL_ENODEV, "attn: cpu-only build");
#endif
}

int dl_attn_merge_lse(const dl_attn_merge_opts_t *o, dl_tensor_t *lse, const dl_tensor_t *part_lse,
                      dl_stream_t *s) {
  return merge("attn.merge_lse", o, 0, 0, NULL, lse, NULL, part_lse, s);
}

int dl_attn_merge_out(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *out, dl_tensor_t *lse,
                      const dl_tensor_t *part, const dl_tensor_t *part_lse, dl_stream_t *s) {
  return merge("attn.merge_out", o, 1, mode, out, lse, part, part_lse, s);
}

int dl_attn_merge_grad(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *grad,
                       const dl_tensor_t *part, dl_stream_t *s) {
  return merge("attn.correct_grad", o, 2, mode, grad, NULL, part, NULL, s);
}
