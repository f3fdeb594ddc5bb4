/*
 * attn_rows.c — the arithmetic of distlab.bench.attn_rows: attention in
 * fp64 at sampled rows, the reference the benches check dl.attn against.
 *
 * Plain loops over host f64 rows that Lua copied out of the tensors (any
 * layout, dtype and device are its business): a query row's full softmax,
 * out, lse and dq; a key row's dk and dv summed over every query that sees
 * it. It is written apart from dl.attn's kernels and their cpu twin
 * (kernels/attn/cpu/) and calls neither: it checks them.
 *
 * Rows are independent, so threads take them one at a time (the costliest
 * first; a row's arithmetic is the same whichever thread runs it, so the
 * results do not depend on the thread count): DISTLAB_CHECK_THREADS of
 * them, else one per core this process may run on. Sums keep the order of
 * the LuaJIT loops this replaced (a dot product in four interleaved partial
 * sums): on spec/attn_ref.lua's cases and three sampled shapes its results
 * were theirs to the last bit.
 */
#define _GNU_SOURCE
#include "distlab.h"
#include "base/internal.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- the fp64 loops --------------------------------------------------------------

static double dot(const double *a, const double *b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t n4 = n - n % 4;
  for (int64_t c = 0; c < n4; c += 4) {
    s0 += a[c] * b[c];
    s1 += a[c + 1] * b[c + 1];
    s2 += a[c + 2] * b[c + 2];
    s3 += a[c + 3] * b[c + 3];
  }
  for (int64_t c = n4; c < n; c++) s0 += a[c] * b[c];
  return (s0 + s1) + (s2 + s3);
}

static void axpy(double *y, double alpha, const double *x, int64_t n) {
  for (int64_t c = 0; c < n; c++) y[c] += alpha * x[c];
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t shift(const dl_attn_ref_slice_t *g) { return g->bottom_right ? g->kl - g->ql : 0; }

// keys [*lo, *hi] that query i sees
static void key_range(const dl_attn_ref_slice_t *g, int64_t i, int64_t *lo, int64_t *hi) {
  int64_t sh = shift(g);
  *lo = g->wl < 0 ? 0 : max64(0, i + sh - g->wl);
  *hi = g->wr < 0 ? g->kl - 1 : min64(g->kl - 1, i + sh + g->wr);
}

// queries [*lo, *hi] that see key j
static void query_range(const dl_attn_ref_slice_t *g, int64_t j, int64_t *lo, int64_t *hi) {
  int64_t sh = shift(g);
  *lo = g->wr < 0 ? 0 : max64(0, j - sh - g->wr);
  *hi = g->wl < 0 ? g->ql - 1 : min64(g->ql - 1, j - sh + g->wl);
}

typedef struct {
  const dl_attn_ref_slice_t *g;
  const int64_t *rows;
  const double *q, *dout, *k, *v;
  double *out, *lse, *dq;
} query_job_t;

// Query row m (rows[m]): out, lse and (with dout) dq; P from the row's own
// softmax, dq's D = dout . out from its own out. S: scratch of kl doubles.
static void query_row(const query_job_t *J, int64_t m, double *S) {
  const dl_attn_ref_slice_t *g = J->g;
  int64_t d = g->dqk, dv = g->dv, i = J->rows[m];
  double scale = g->scale;
  const double *q = J->q + m * d;
  double *o = J->out + m * dv, *dq = J->dq ? J->dq + m * d : NULL;
  memset(o, 0, sizeof(double) * dv);
  if (dq) memset(dq, 0, sizeof(double) * d);
  int64_t lo, hi;
  key_range(g, i, &lo, &hi);
  if (hi < lo) {
    J->lse[m] = -INFINITY;
    return;
  }
  double mx = -INFINITY;
  for (int64_t j = lo; j <= hi; j++) {
    double s = scale * dot(q, J->k + j * d, d);
    S[j] = s;
    if (s > mx) mx = s;
  }
  double l = 0;
  for (int64_t j = lo; j <= hi; j++) {
    double p = exp(S[j] - mx);
    S[j] = p;
    l += p;
  }
  double inv = 1 / l;
  for (int64_t j = lo; j <= hi; j++) axpy(o, S[j] * inv, J->v + j * dv, dv);
  if (dq) {
    const double *dO = J->dout + m * dv;
    double D = dot(dO, o, dv);
    for (int64_t j = lo; j <= hi; j++) {
      double p = S[j] * inv;
      axpy(dq, scale * p * (dot(dO, J->v + j * dv, dv) - D), J->k + j * d, d);
    }
  }
  J->lse[m] = mx + log(l);
}

typedef struct {
  const dl_attn_ref_slice_t *g;
  const int64_t *rows;
  const double *k, *v;
  int nheads;
  const double *const *q, *const *dout, *const *out, *const *lse;
  double **D; // per head: dout . out of every query
  double *dk, *dv;
  char *bad; // per key row: it needed an lse that is not finite
} key_job_t;

// Key row m (rows[m]): dk and dv summed over the queries of every head that see it.
static void key_row(const key_job_t *J, int64_t m) {
  const dl_attn_ref_slice_t *g = J->g;
  int64_t d = g->dqk, dv = g->dv;
  double scale = g->scale;
  const double *k = J->k + m * d, *v = J->v + m * dv;
  double *rk = J->dk + m * d, *rv = J->dv + m * dv;
  memset(rk, 0, sizeof(double) * d);
  memset(rv, 0, sizeof(double) * dv);
  int64_t lo, hi;
  query_range(g, J->rows[m], &lo, &hi);
  char bad = 0;
  for (int h = 0; h < J->nheads; h++) {
    const double *Q = J->q[h], *dO = J->dout[h], *L = J->lse[h], *D = J->D[h];
    for (int64_t i = lo; i <= hi; i++) {
      double li = L[i];
      if (!isfinite(li)) {
        bad = 1;
        continue;
      }
      double p = exp(scale * dot(Q + i * d, k, d) - li);
      double ds = p * (dot(dO + i * dv, v, dv) - D[i]);
      axpy(rv, p, dO + i * dv, dv);
      axpy(rk, scale * ds, Q + i * d, d);
    }
  }
  J->bad[m] = bad;
}

// ---- threads ------------------------------------------------------------------------

// Items order[0..n) (all of 0..n when order is NULL), taken one at a time by
// every worker; a worker that needs scratch and cannot get it stops the rest.
typedef struct {
  int64_t n, next;
  const int64_t *order;
  int64_t scratch; // doubles a worker needs
  void (*fn)(const void *job, int64_t item, double *scratch);
  const void *job;
  int failed;
} pool_t;

static void *worker(void *arg) {
  pool_t *P = arg;
  double *scratch = P->scratch > 0 ? malloc(sizeof(double) * P->scratch) : NULL;
  if (P->scratch > 0 && !scratch) {
    __atomic_store_n(&P->failed, 1, __ATOMIC_RELAXED);
    return NULL;
  }
  for (;;) {
    if (__atomic_load_n(&P->failed, __ATOMIC_RELAXED)) break;
    int64_t t = __atomic_fetch_add(&P->next, 1, __ATOMIC_RELAXED);
    if (t >= P->n) break;
    P->fn(P->job, P->order ? P->order[t] : t, scratch);
  }
  free(scratch);
  return NULL;
}

static int threads_wanted(const char *fn, long *out) {
  long cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (cores < 1) cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  return dl_env_int(fn, "DISTLAB_CHECK_THREADS", cores, 1, 1024, out);
}

// Runs fn over the n items on the threads wanted (the caller is one of them;
// fewer where the system gives no more).
static int run_pool(const char *fn, pool_t *P) {
  long want;
  DL_TRY(threads_wanted(fn, &want));
  if (want > P->n) want = P->n > 0 ? P->n : 1;
  pthread_t *th = want > 1 ? malloc(sizeof(pthread_t) * (want - 1)) : NULL;
  long started = 0;
  if (th)
    while (started < want - 1 && pthread_create(&th[started], NULL, worker, P) == 0) started++;
  worker(P);
  for (long t = 0; t < started; t++) pthread_join(th[t], NULL);
  free(th);
  if (P->failed) return DL_ERR(DL_ENOMEM, "%s: no memory for a thread's scratch of %lld doubles", fn,
                               (long long)P->scratch);
  return DL_OK;
}

// ---- the calls ------------------------------------------------------------------------

static int check_slice(const char *fn, const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows) {
  DL_CHECK_ARG(g, "%s: no slice", fn);
  DL_CHECK_ARG(g->ql >= 0 && g->kl >= 0 && g->dqk > 0 && g->dv > 0 && n >= 0,
               "%s: ql %lld, kl %lld, dqk %lld, dv %lld, %lld rows", fn, (long long)g->ql,
               (long long)g->kl, (long long)g->dqk, (long long)g->dv, (long long)n);
  DL_CHECK_ARG(n == 0 || rows, "%s: no rows", fn);
  return DL_OK;
}

typedef struct {
  int64_t cost, item;
} ranked_t;

static int by_cost(const void *a, const void *b) {
  int64_t x = ((const ranked_t *)a)->cost, y = ((const ranked_t *)b)->cost;
  return x > y ? -1 : x < y;
}

// The n rows, the costliest (most keys, or queries, to visit) first: NULL
// when out of memory. ranges(g, row, lo, hi): what row visits.
static int64_t *costliest_first(const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows,
                                void (*ranges)(const dl_attn_ref_slice_t *, int64_t, int64_t *,
                                               int64_t *)) {
  ranked_t *r = malloc(sizeof(ranked_t) * (n > 0 ? n : 1));
  int64_t *order = malloc(sizeof(int64_t) * (n > 0 ? n : 1));
  if (!r || !order) {
    free(r);
    free(order);
    return NULL;
  }
  for (int64_t m = 0; m < n; m++) {
    int64_t lo, hi;
    ranges(g, rows[m], &lo, &hi);
    r[m].cost = hi - lo;
    r[m].item = m;
  }
  qsort(r, n, sizeof(ranked_t), by_cost);
  for (int64_t m = 0; m < n; m++) order[m] = r[m].item;
  free(r);
  return order;
}

static void query_item(const void *job, int64_t m, double *scratch) { query_row(job, m, scratch); }

int dl_attn_ref_queries(const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows, const double *q,
                       const double *dout, const double *k, const double *v, double *out, double *lse,
                       double *dq) {
  const char *fn = "dl_attn_ref_queries";
  DL_TRY(check_slice(fn, g, n, rows));
  DL_CHECK_ARG(n == 0 || (q && out && lse && (!dout == !dq)), "%s: q, out, lse, and dout with dq, are needed",
               fn);
  DL_CHECK_ARG(g->kl == 0 || (k && v), "%s: no keys or values", fn);
  for (int64_t m = 0; m < n; m++)
    DL_CHECK_ARG(rows[m] >= 0 && rows[m] < g->ql, "%s: row %lld of a slice of %lld queries", fn,
                 (long long)rows[m], (long long)g->ql);
  int64_t *order = costliest_first(g, n, rows, key_range);
  if (!order) return DL_ERR(DL_ENOMEM, "%s: no memory for the order of %lld rows", fn, (long long)n);
  query_job_t J = {g, rows, q, dout, k, v, out, lse, dq};
  pool_t P = {.n = n, .order = order, .scratch = g->kl > 0 ? g->kl : 1, .fn = query_item, .job = &J};
  int rc = run_pool(fn, &P);
  free(order);
  return rc;
}

typedef struct {
  const key_job_t *J;
  int64_t chunk, chunks; // queries a D item covers, items a head
} d_job_t;

static void d_item(const void *job, int64_t item, double *scratch) {
  const d_job_t *A = job;
  const key_job_t *J = A->J;
  int64_t h = item / A->chunks, lo = item % A->chunks * A->chunk, dv = J->g->dv;
  int64_t hi = min64(J->g->ql, lo + A->chunk);
  for (int64_t i = lo; i < hi; i++) J->D[h][i] = dot(J->dout[h] + i * dv, J->out[h] + i * dv, dv);
}

static void key_item(const void *job, int64_t m, double *scratch) { key_row(job, m); }

int dl_attn_ref_keys(const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows, const double *k,
                     const double *v, int nheads, const double *const *q, const double *const *dout,
                     const double *const *out, const double *const *lse, double *dk, double *dv,
                     int64_t *n_bad) {
  const char *fn = "dl_attn_ref_keys";
  DL_TRY(check_slice(fn, g, n, rows));
  DL_CHECK_ARG(n_bad && nheads >= 0 && (n == 0 || (k && v && dk && dv)), "%s: k, v, dk, dv, n_bad are needed",
               fn);
  DL_CHECK_ARG(nheads == 0 || g->ql == 0 || (q && dout && out && lse), "%s: the heads' q, dout, out, lse", fn);
  for (int h = 0; h < nheads && g->ql > 0; h++)
    DL_CHECK_ARG(q[h] && dout[h] && out[h] && lse[h], "%s: head %d lacks q, dout, out or lse", fn, h);
  for (int64_t m = 0; m < n; m++)
    DL_CHECK_ARG(rows[m] >= 0 && rows[m] < g->kl, "%s: row %lld of a slice of %lld keys", fn,
                 (long long)rows[m], (long long)g->kl);
  *n_bad = 0;
  if (g->ql == 0) nheads = 0;
  double **D = calloc(nheads > 0 ? nheads : 1, sizeof(double *));
  char *bad = calloc(n > 0 ? n : 1, 1);
  int64_t *order = costliest_first(g, n, rows, query_range);
  int rc = DL_OK;
  for (int h = 0; D && h < nheads; h++)
    if (!(D[h] = malloc(sizeof(double) * g->ql))) rc = DL_ENOMEM;
  if (!D || !bad || !order || rc)
    rc = DL_ERR(DL_ENOMEM, "%s: no memory for %d heads of %lld queries", fn, nheads, (long long)g->ql);
  key_job_t J = {g, rows, k, v, nheads, q, dout, out, lse, D, dk, dv, bad};
  if (!rc && nheads > 0) { // every query's D = dout . out first (the handed out, as the backward's)
    d_job_t A = {&J, 4096, (g->ql + 4095) / 4096};
    pool_t P = {.n = nheads * A.chunks, .fn = d_item, .job = &A};
    rc = run_pool(fn, &P);
  }
  if (!rc) {
    pool_t P = {.n = n, .order = order, .fn = key_item, .job = &J};
    rc = run_pool(fn, &P);
  }
  for (int64_t m = 0; !rc && m < n; m++) *n_bad += bad[m];
  for (int h = 0; D && h < nheads; h++) free(D[h]);
  free(D);
  free(bad);
  free(order);
  return rc;
}
