/*
 * comm_store.c — what a communicator does through the store: keys in its
 * namespace ("<name>/k"), waits that end when a member dies or gives up, the
 * setup barrier, and the cross-rank checks that every rank made the same
 * call (debug mode's check of every op, dl_comm_check_same for operators),
 * whose mismatch messages say which entries differ.
 */
#include <stdio.h>
#include <string.h>

#include "comm_internal.h"

static const char *red_names[] = {"sum", "avg", "max", "min"};

/* ---- store helpers ------------------------------------------------------ */

int dl_comm_store_set(dl_comm_t *c, const char *key, const void *val, int64_t len) {
  char full[256];
  snprintf(full, sizeof full, "%s/%s", c->name, key);
  return dl_store_set(c->store, full, val, len);
}

/* A store wait ends within 100 ms of a member's death or of an abort. */
static int store_watch(void *ctx) {
  dl_comm_t *c = ctx;
  const uint32_t gone = __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
  if (gone) {
    char who[160];
    dl_comm_gone_str(c, gone, who, sizeof who);
    return DL_ERR(DL_EPEER, "%s", who);
  }
  return c->be->watch ? c->be->watch(c) : DL_OK;
}

int dl_comm_store_get(dl_comm_t *c, const char *key, void *buf, int64_t len) {
  char full[256];
  int64_t got = 0;
  snprintf(full, sizeof full, "%s/%s", c->name, key);
  DL_TRY(dl_store_get_watched(c->store, full, buf, len, &got, store_watch, c));
  if (got != len)
    return DL_ERR(DL_EPEER, "store key '%s' holds %lld bytes, expected %lld", full,
                  (long long)got, (long long)len);
  return DL_OK;
}

int dl_comm_store_delete(dl_comm_t *c, const char *key) {
  char full[256];
  snprintf(full, sizeof full, "%s/%s", c->name, key);
  return dl_store_delete(c->store, full);
}

int dl_comm_store_barrier(dl_comm_t *c, const char *name) {
  char key[200], done[220];
  int64_t n = 0;
  snprintf(key, sizeof key, "%s/bar/%s", c->name, name);
  snprintf(done, sizeof done, "%s/done", key);
  DL_TRY(dl_store_add(c->store, key, 1, &n));
  if (n == c->size) DL_TRY(dl_store_set(c->store, done, "", 0));
  DL_TRY(dl_store_wait(c->store, done));
  /* the last rank out deletes the barrier's keys: a communicator that makes buffer after
   * buffer would otherwise grow rank 0's store by three keys a barrier */
  char left[230];
  snprintf(left, sizeof left, "%s/left", key);
  DL_TRY(dl_store_add(c->store, left, 1, &n));
  if (n < c->size) return DL_OK;
  DL_TRY(dl_store_delete(c->store, done));
  DL_TRY(dl_store_delete(c->store, key));
  return dl_store_delete(c->store, left);
}

/* ---- every rank made the same call ------------------------------------ */

typedef struct sig {
  int32_t op, red, dtype, peer;
  int64_t n_in, n_out;
} call_sig_t;

int dl_comm_call_str(int op, int red, int dtype, int root, int64_t n_in, int64_t n_out, char *buf,
                     size_t len) {
  const int reduces = op == DL_OP_ALL_REDUCE || op == DL_OP_REDUCE_SCATTER;
  char head[64];
  if (reduces) snprintf(head, sizeof head, "%s(%s)", dl_comm_op_name(op), red_names[red & 3]);
  else if (op == DL_OP_BROADCAST) snprintf(head, sizeof head, "broadcast from %d", root);
  else snprintf(head, sizeof head, "%s", dl_comm_op_name(op));
  if (op == DL_OP_BARRIER) return snprintf(buf, len, "%s", head);
  return snprintf(buf, len, "%s, dtype %s, %lld in, %lld out", head,
                  dtype < 0 ? "-" : dl_dtype_name(dtype), (long long)n_in, (long long)n_out);
}

static int sig_str(const call_sig_t *s, char *buf, size_t len) {
  return dl_comm_call_str(s->op, s->red, s->dtype, s->peer, s->n_in, s->n_out, buf, len);
}

/* "calls all_reduce(sum), dtype f32, 10 in, 10 out" (dl_comm_check_same) */
static int sig_calls(const void *s, char *buf, size_t len) {
  char sig[160];
  sig_str(s, sig, sizeof sig);
  return snprintf(buf, len, "calls %s", sig);
}

/* Debug mode: every rank publishes its call; each compares with all others.
 * p2p ops compare pairwise (n-th send from a to b against the n-th recv). */
int dl_comm_debug_check(dl_comm_t *c, const dl_comm_call_t *call) {
  const dl_view_t *v = call->op == DL_OP_SEND || call->op == DL_OP_ALL_TO_ALLV ||
                               call->op == DL_OP_ALL_TO_ALL || call->op == DL_OP_ALL_GATHER ||
                               call->op == DL_OP_ALL_REDUCE || call->op == DL_OP_REDUCE_SCATTER
                           ? &call->in
                           : &call->out;
  call_sig_t me = {call->op, call->red, v->dtype, call->peer, call->in.numel, call->out.numel};
  if (call->op == DL_OP_ALL_TO_ALLV) me.n_in = me.n_out = 0; /* may differ; counts are checked */
  char key[96], a[160];
  if (call->op == DL_OP_SEND || call->op == DL_OP_RECV) {
    int src = call->op == DL_OP_SEND ? c->rank : call->peer;
    int dst = call->op == DL_OP_SEND ? call->peer : c->rank;
    int64_t nth = 0;
    snprintf(key, sizeof key, "dbg/p2p/%d-%d/%s", src, dst, call->op == DL_OP_SEND ? "ns" : "nr");
    char full[200];
    snprintf(full, sizeof full, "%s/%s", c->name, key);
    DL_TRY(dl_store_add(c->store, full, 1, &nth));
    snprintf(key, sizeof key, "dbg/p2p/%d-%d/%lld", src, dst, (long long)nth);
    if (call->op == DL_OP_SEND) return dl_comm_store_set(c, key, &me, sizeof me);
    call_sig_t other;
    DL_TRY(dl_comm_store_get(c, key, &other, sizeof other));
    /* the n-th send's key has one reader, this receive: gone once read, or a long job's p2p
     * calls pile up in rank 0's store (the soak: +46 MiB of malloc in 10 min at 4 ranks) */
    DL_TRY(dl_comm_store_delete(c, key));
    if (other.dtype != me.dtype || other.n_in != me.n_out) {
      sig_str(&other, a, sizeof a);
      return DL_ERR(DL_EINVAL,
                    "mismatched point-to-point: rank %d receives %lld elements of %s from rank "
                    "%d, which sends %s",
                    c->rank, (long long)me.n_out, dl_dtype_name(me.dtype), call->peer, a);
    }
    return DL_OK;
  }
  /* numbered by collectives, not by c->seq: a p2p op between two collectives left a gap, so the
   * next check deleted the key the op skipped, not the last check's (the soak: rank 0's malloc
   * grew ~270 bytes a step, a collective's keys left on every step with p2p ops) */
  return dl_comm_check_same(c, "dbg", c->nchecked++, &me, sizeof me, "calls", sig_calls);
}

/* The entries ("a, b, c") of `theirs` that differ from `mine`, position by
 * position, as "x vs y; ..." into out: what a mismatch message must say. */
void dl_comm_diff(const char *mine, const char *theirs, char *out, size_t len) {
  size_t n = 0;
  out[0] = 0;
  while ((*mine || *theirs) && n + 1 < len) {
    size_t a = strcspn(mine, ","), b = strcspn(theirs, ",");
    if (a != b || strncmp(mine, theirs, a) != 0) {
      int w = snprintf(out + n, len - n, "%s%.*s vs %.*s", n ? "; " : "", (int)a, mine, (int)b,
                       theirs);
      n = w < 0 ? len : n + (size_t)w < len ? n + (size_t)w : len - 1;
    }
    mine += a + (mine[a] == ',');
    theirs += b + (theirs[b] == ',');
    while (*mine == ' ') mine++;
    while (*theirs == ' ') theirs++;
  }
}

int dl_comm_check_same(dl_comm_t *c, const char *key, int64_t seq, const void *sig, size_t len,
                       const char *what, int (*describe)(const void *sig, char *buf, size_t len)) {
  char k[160], mine[300], theirs[300], other[256], diff[400];
  DL_CHECK_ARG(len <= sizeof other, "dl_comm_check_same: a signature of %zu bytes (at most %zu)", len,
               sizeof other);
  snprintf(k, sizeof k, "%s/%lld/%d", key, (long long)seq, c->rank);
  int rc = dl_comm_store_set(c, k, sig, (int64_t)len);
  for (int r = 0; r < c->size && rc == DL_OK; r++) {
    if (r == c->rank) continue;
    snprintf(k, sizeof k, "%s/%lld/%d", key, (long long)seq, r);
    rc = dl_comm_store_get(c, k, other, (int64_t)len);
    if (rc == DL_ETIMEOUT)
      rc = dl_error_context(rc, "rank %d did not arrive within %.1f s (it never made this call, or "
                            "went away; the debug check waits for every rank's call)",
                            r, dl_store_timeout(c->store));
    if (rc == DL_OK && memcmp(other, sig, len) != 0) {
      describe(sig, mine, sizeof mine);
      describe(other, theirs, sizeof theirs);
      /* the verb both start with ("calls", "has") says nothing */
      const char *a = strchr(mine, ' '), *b = strchr(theirs, ' ');
      dl_comm_diff(a ? a + 1 : mine, b ? b + 1 : theirs, diff, sizeof diff);
      rc = DL_ERR(DL_EINVAL, "mismatched %s: rank %d %s but rank %d %s (differs: %s)", what,
                  c->rank, mine, r, theirs, diff);
    }
  }
  DL_TRY(rc);
  /* everyone has read our key of the previous call once they published this one */
  if (seq > 0) {
    snprintf(k, sizeof k, "%s/%lld/%d", key, (long long)seq - 1, c->rank);
    DL_TRY(dl_comm_store_delete(c, k));
  }
  return DL_OK;
}
