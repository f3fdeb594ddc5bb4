/*
 * attn_args.c — the checks and conversions of core/ops/attn/attn_args.h: tensors of
 * an attention step or merge (dtype, device, shape per layout, contiguous
 * last dim) into kernel operands, cu_seqlens (contents checked wherever they
 * are read on the host), and outputs checked or allocated.
 */
#include "attn_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/alloc.h"

const char *dl_attn_layout_names[] = {"bshd", "sbhd", "thd"};

int dl_attn_arg_present(const char *op, const char *name, const dl_tensor_t *t) {
  if (!t) return DL_ERR(DL_EINVAL, "%s: %s is missing", op, name);
  int rc = dl_tensor_check(t);
  return rc ? dl_error_context(rc, "%s: %s", op, name) : 0;
}

void dl_attn_arg_shape_str(char *buf, size_t n, int nd, const int64_t *sz) {
  buf[0] = 0;
  for (int d = 0; d < nd; d++)
    snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", d ? ", " : "", (long long)sz[d]);
}

int dl_attn_arg_same_device(const char *op, const char *name, const dl_tensor_t *t,
                            const dl_tensor_t *ref, const char *ref_name) {
  if (t->dev_type == ref->dev_type && t->dev_index == ref->dev_index) return 0;
  return DL_ERR(DL_EINVAL, "%s: %s is on another device than %s", op, name, ref_name);
}

/* Sequence operand in `layout`: checks rank and the contiguous last dim. */
int dl_attn_arg_seq(const char *op, const char *name, const dl_tensor_t *t, int layout,
                    dl_attn_operand_t *x) {
  DL_TRY(dl_attn_arg_present(op, name, t));
  int thd = layout == DL_ATTN_THD, nd = thd ? 3 : 4;
  if (t->nd != nd)
    return DL_ERR(DL_EINVAL, "%s: %s must have %d dims [%s] for layout %s, got %d", op, name, nd,
                  thd                      ? "t, h, d"
                  : layout == DL_ATTN_BSHD ? "b, s, h, d"
                                           : "s, b, h, d",
                  dl_attn_layout_names[layout], t->nd);
  if (t->st[nd - 1] != 1 && t->sz[nd - 1] > 1)
    return DL_ERR(DL_EINVAL,
                  "%s: the last dim of %s must be contiguous (stride 1), got stride %lld", op, name,
                  (long long)t->st[nd - 1]);
  int bi = layout == DL_ATTN_SBHD ? 1 : 0, si = thd ? 0 : layout == DL_ATTN_SBHD ? 0 : 1;
  x->b = thd ? 0 : t->sz[bi];
  x->s = t->sz[si];
  x->h = t->sz[nd - 2];
  x->d = t->sz[nd - 1];
  x->st.b = thd ? 0 : t->st[bi];
  x->st.s = t->st[si];
  x->st.h = t->st[nd - 2];
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  x->ptr = v.data;
  return 0;
}

int dl_attn_arg_lse(const char *op, const char *name, const dl_tensor_t *t, int thd,
                    dl_attn_operand_t *x) {
  DL_TRY(dl_attn_arg_present(op, name, t));
  if (t->dtype_id != DL_F32)
    return DL_ERR(DL_EINVAL, "%s: %s must be f32, got %s", op, name, dl_dtype_name(t->dtype_id));
  if (t->nd != (thd ? 2 : 3))
    return DL_ERR(DL_EINVAL, "%s: %s must have %s, got %d dims", op, name,
                  thd ? "2 dims [h, t]" : "3 dims [b, h, s]", t->nd);
  x->b = thd ? 0 : t->sz[0];
  x->h = t->sz[thd ? 0 : 1];
  x->s = t->sz[thd ? 1 : 2];
  x->d = 0;
  x->st.b = thd ? 0 : t->st[0];
  x->st.h = t->st[thd ? 0 : 1];
  x->st.s = t->st[thd ? 1 : 2];
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  x->ptr = v.data;
  return 0;
}

/* The shape of a [b, s, h, d] operand in `layout` (thd: [s, h, d]); returns ndim. */
int dl_attn_layout_shape(int layout, int64_t b, int64_t s, int64_t h, int64_t d, int64_t *sz) {
  if (layout == DL_ATTN_THD) {
    sz[0] = s, sz[1] = h, sz[2] = d;
    return 3;
  }
  sz[0] = layout == DL_ATTN_BSHD ? b : s;
  sz[1] = layout == DL_ATTN_BSHD ? s : b;
  sz[2] = h, sz[3] = d;
  return 4;
}

int dl_attn_lse_shape(int thd, int64_t b, int64_t h, int64_t s, int64_t *sz) {
  if (thd) {
    sz[0] = h, sz[1] = s;
    return 2;
  }
  sz[0] = b, sz[1] = h, sz[2] = s;
  return 3;
}

int dl_attn_arg_expect_shape(const char *op, const char *name, const dl_tensor_t *t, int nd,
                             const int64_t *want) {
  int eq = t->nd == nd;
  for (int d = 0; eq && d < nd; d++) eq = t->sz[d] == want[d];
  if (eq) return 0;
  char a[160], b[160];
  dl_attn_arg_shape_str(a, sizeof a, t->nd, t->sz);
  dl_attn_arg_shape_str(b, sizeof b, nd, want);
  return DL_ERR(DL_EINVAL, "%s: %s has shape [%s], expected [%s]", op, name, a, b);
}

/* ---- cu_seqlens ------------------------------------------------------------------ */

int dl_attn_arg_cu(const char *op, const char *name, const dl_tensor_t *t, const dl_tensor_t *like,
                   const char *like_name, int64_t n, const int32_t **ptr) {
  DL_TRY(dl_attn_arg_present(op, name, t));
  DL_CHECK_ARG(t->dtype_id == DL_I32, "%s: %s must be i32, got %s", op, name,
               dl_dtype_name(t->dtype_id));
  DL_CHECK_ARG(t->nd == 1 && t->sz[0] >= 1 && (n < 0 || t->sz[0] == n),
               "%s: %s must be 1-D with %s entries (b+1), got %lld", op, name,
               n < 0 ? "at least 1" : "the same number of", (long long)dl_tensor_numel(t));
  DL_CHECK_ARG(t->st[0] == 1 || t->sz[0] == 1, "%s: %s must be contiguous", op, name);
  DL_TRY(dl_attn_arg_same_device(op, name, t, like, like_name));
  dl_view_t v;
  DL_TRY(dl_view_of(t, &v));
  *ptr = (const int32_t *)v.data;
  return 0;
}

/* A host copy of a cu_seqlens tensor (malloc'd; a sync on cuda). */
int dl_attn_arg_cu_host(const char *op, const char *name, const dl_tensor_t *t, dl_stream_t *s,
                        int32_t **out) {
  int64_t n = t->sz[0];
  int32_t *h = malloc(sizeof(int32_t) * n);
  if (!h) return DL_ERR(DL_ENOMEM, "%s: out of host memory reading %s", op, name);
  if (t->dev_type == DL_CPU) {
    dl_view_t v;
    dl_view_of(t, &v);
    memcpy(h, v.data, sizeof(int32_t) * n);
    *out = h;
    return 0;
  }
  dl_tensor_t *tmp;
  int rc = dl_tensor_empty(&tmp, DL_I32, 1, &n, DL_CPU, 0, NULL);
  if (!rc) {
    rc = dl_tensor_copy(tmp, t, s);
    if (!rc) memcpy(h, tmp->storage->ptr, sizeof(int32_t) * n);
    dl_tensor_free(tmp);
  }
  if (rc) {
    free(h);
    return dl_error_context(rc, "%s: reading %s", op, name);
  }
  *out = h;
  return 0;
}

/* Every sequence i (length cu[i+1]-cu[i] >= 0, first row start[i]) inside
 * `rows`, none reaching into the next; *max_len gets the largest length. */
int dl_attn_arg_check_seqs(const char *op, const char *name, const char *pname, const int32_t *cu,
                           const int32_t *start, int64_t b, int64_t rows, const char *tname,
                           int *max_len) {
  int m = 0;
  for (int64_t i = 0; i < b; i++) {
    int64_t len = (int64_t)cu[i + 1] - cu[i];
    if (len < 0)
      return DL_ERR(DL_EINVAL, "%s: %s decreases at entry %lld (%d after %d)", op, name,
                    (long long)i + 1, cu[i + 1], cu[i]);
    if (start[i] < 0 || start[i] + len > rows)
      return DL_ERR(DL_EINVAL,
                    "%s: sequence %lld (rows %lld..%lld by %s) lies outside the %lld rows of %s",
                    op, (long long)i, (long long)start[i], (long long)start[i] + len - 1, pname,
                    (long long)rows, tname);
    /* padded offsets that leave a sequence less room than its valid rows
     * would make two sequences share rows (each attending to the other's) */
    if (i + 1 < b && len > 0 && (int64_t)start[i] + len > start[i + 1])
      return DL_ERR(DL_EINVAL,
                    "%s: sequence %lld (rows %lld..%lld by %s) overlaps sequence %lld, which "
                    "starts at row %lld: %s gives it fewer rows than %s says it holds",
                    op, (long long)i, (long long)start[i], (long long)start[i] + len - 1, pname,
                    (long long)i + 1, (long long)start[i + 1], pname, name);
    if (len > m) m = (int)len;
  }
  *max_len = m;
  return 0;
}

/* ---- outputs ------------------------------------------------------------------- */

void dl_attn_made_undo(dl_attn_made_t *m) {
  for (int i = 0; i < m->n; i++) {
    dl_tensor_free(*m->slot[i]);
    *m->slot[i] = NULL;
  }
}

/* *slot: checked against (dtype, shape), or allocated like `like` and filled. */
int dl_attn_arg_output(const char *op, const char *name, dl_attn_made_t *m, dl_tensor_t **slot,
                       int dtype, int nd, const int64_t *shape, const dl_tensor_t *like, int fill,
                       double value, dl_stream_t *s) {
  if (*slot) {
    DL_TRY(dl_attn_arg_present(op, name, *slot));
    DL_TRY(dl_attn_arg_same_device(op, name, *slot, like, "q"));
    DL_CHECK_ARG((*slot)->dtype_id == dtype, "%s: %s must be %s, got %s", op, name,
                 dl_dtype_name(dtype), dl_dtype_name((*slot)->dtype_id));
    DL_TRY(dl_attn_arg_expect_shape(op, name, *slot, nd, shape));
    if ((*slot)->st[nd - 1] != 1 && shape[nd - 1] > 1)
      return DL_ERR(DL_EINVAL, "%s: the last dim of %s must be contiguous (stride 1)", op, name);
    return 0;
  }
  dl_tensor_t *t;
  int rc = dl_tensor_empty(&t, dtype, nd, shape, like->dev_type, like->dev_index, s);
  if (rc) return dl_error_context(rc, "%s: allocating %s", op, name);
  m->slot[m->n++] = slot;
  *slot = t;
  return fill ? dl_tensor_fill(t, value, s) : 0;
}

/* Operands that hold no element have no memory; the kernels want non-NULL
 * pointers and never read them, so lend them another operand's. */
void dl_attn_lend(void **ptrs[], int n) {
  void *any = NULL;
  for (int i = 0; i < n && !any; i++) any = *ptrs[i];
  for (int i = 0; i < n; i++)
    if (!*ptrs[i]) *ptrs[i] = any;
}
