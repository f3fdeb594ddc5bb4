/*
 * grouped_run.c — dl_gemm_grouped's GEMMs on cuda (grouped.c describes the
 * backends and AUTO's choice): the loop's batches, its side streams, the
 * cuBLAS grouped call, the counter dl.gemm.stats reports.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "gemm_cublas.h"
#include "gemm_lt.h"
#include "grouped_int.h"
#include "mem/alloc.h"
#include "tensor/elementwise.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t n_loop;

/* Whether g continues u's batch: one shape and scalars, each operand laid out
 * alike and the next of u's evenly spaced ones (step: the strides then). */
static int joins(const dl_gemm_args_t *u, const dl_gemm_args_t *g, int64_t step[3]) {
  if (g->m != u->m || g->n != u->n || g->k != u->k || g->alpha != u->alpha || g->beta != u->beta)
    return 0;
  const dl_gemm_mat_t *um[3] = {&u->a, &u->b, &u->d}, *gm[3] = {&g->a, &g->b, &g->d};
  const int64_t batch = u->batch > 1 ? u->batch : 1, st[3] = {u->sa, u->sb, u->sd};
  for (int i = 0; i < 3; i++) {
    if (um[i]->rs != gm[i]->rs || um[i]->cs != gm[i]->cs || um[i]->dtype != gm[i]->dtype) return 0;
    const int64_t bytes = (int64_t)((char *)gm[i]->data - (char *)um[i]->data);
    const int es = dl_dtype_size(um[i]->dtype);
    if (bytes <= 0 || bytes % es || bytes / es % batch) return 0;
    step[i] = bytes / es / batch;
    if (batch > 1 && step[i] != st[i]) return 0;
  }
  return 1;
}

/* The loop's GEMMs: consecutive experts of one shape and evenly spaced
 * operands as one strided-batched GEMM (uniform counts: all of them). */
int64_t dl_grouped_coalesce(const plan_t *p, dl_gemm_args_t *u) {
  int64_t n = 0, step[3];
  for (int64_t i = 0; i < p->n; i++) {
    if (n > 0 && joins(&u[n - 1], &p->g[i], step)) {
      dl_gemm_args_t *v = &u[n - 1];
      if (v->batch <= 1) v->sa = step[0], v->sb = step[1], v->sd = v->sc = step[2];
      v->batch = (v->batch > 1 ? v->batch : 1) + 1;
      continue;
    }
    u[n] = p->g[i];
    u[n].batch = 1;
    n++;
  }
  return n;
}

#ifdef DL_WITH_CUDA
enum { MAX_DEVS = 16 };
static struct side {
  cudaStream_t s[DL_GEMM_GROUPED_MAX_STREAMS];
  cudaEvent_t fork, join[DL_GEMM_GROUPED_MAX_STREAMS];
} sides[MAX_DEVS];

/* dev's side streams and events, made at the first use. Called with mu held. */
static int side_of(int dev, int streams, struct side **out) {
  DL_CHECK_ARG(dev >= 0 && dev < MAX_DEVS, "grouped gemm: cuda:%d is beyond the %d devices "
               "handled", dev, MAX_DEVS);
  struct side *sd = &sides[dev];
  if (!sd->fork) DL_CUDA_CHECK(cudaEventCreateWithFlags(&sd->fork, cudaEventDisableTiming));
  for (int i = 0; i < streams; i++) {
    if (!sd->s[i]) DL_CUDA_CHECK(cudaStreamCreateWithFlags(&sd->s[i], cudaStreamNonBlocking));
    if (!sd->join[i]) DL_CUDA_CHECK(cudaEventCreateWithFlags(&sd->join[i], cudaEventDisableTiming));
  }
  *out = sd;
  return DL_OK;
}

static double flops_of(const dl_gemm_args_t *g) {
  return 2.0 * (double)g->m * (double)g->n * (double)g->k * (double)(g->batch > 1 ? g->batch : 1);
}

typedef struct order { double flops; int64_t i; } order_t;
static int by_flops(const void *x, const void *y) {
  const order_t *a = x, *b = y;
  return a->flops < b->flops ? 1 : a->flops > b->flops ? -1 : (a->i > b->i) - (a->i < b->i);
}

/* The GEMMs u[0..n) on the calling stream st, or over `streams` side streams:
 * the largest first, each to the stream with the least work so far (longest
 * processing time first), each stream with its slice of the workspace. */
static int run_loop(const dl_gemm_args_t *u, int64_t n, int dev, struct side *sd, int streams,
                    char *ws, int64_t ws_bytes, cudaStream_t st) {
  if (streams <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; i++) DL_TRY(dl_gemm_lt_run(&u[i], dev, ws, ws_bytes, st));
    return DL_OK;
  }
  order_t *ord = malloc(sizeof *ord * (size_t)n);
  if (!ord) return DL_ERR(DL_ENOMEM, "grouped gemm: out of host memory");
  for (int64_t i = 0; i < n; i++) ord[i] = (order_t){flops_of(&u[i]), i};
  qsort(ord, (size_t)n, sizeof *ord, by_flops);
  const int64_t slice = ws_bytes / streams / PTR_ALIGN * PTR_ALIGN;
  const int used = (int)(n < streams ? n : streams);
  double load[DL_GEMM_GROUPED_MAX_STREAMS] = {0};
  int rc = cudaEventRecord(sd->fork, st) == cudaSuccess ? DL_OK : DL_ECUDA;
  for (int j = 0; j < used && !rc; j++)
    if (cudaStreamWaitEvent(sd->s[j], sd->fork, 0) != cudaSuccess) rc = DL_ECUDA;
  if (rc) rc = DL_ERR(DL_ECUDA, "grouped gemm: forking the side streams: %s",
                      cudaGetErrorString(cudaGetLastError()));
  for (int64_t o = 0; o < n && !rc; o++) {
    int j = 0;
    for (int q = 1; q < used; q++)
      if (load[q] < load[j]) j = q;
    load[j] += ord[o].flops;
    rc = dl_gemm_lt_run(&u[ord[o].i], dev, ws + j * slice, slice, sd->s[j]);
  }
  free(ord);
  /* joined even after a failure, so the calling stream never runs ahead of the side work */
  for (int j = 0; j < used; j++) {
    DL_CUDA_CHECK(cudaEventRecord(sd->join[j], sd->s[j]));
    DL_CUDA_CHECK(cudaStreamWaitEvent(st, sd->join[j], 0));
  }
  return rc;
}

int dl_grouped_run_cuda(dl_gemm_grouped_opts_t *o, const plan_t *p, const dl_tensor_t *a,
                    const dl_view_t *dw, int64_t E, dl_stream_t *s) {
  const char *fn = dl_grouped_op_name(o->op);
  const int dev = a->dev_index;
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, dev, &h));
  DL_TRY(dl_cuda_use(dev));
  const int64_t need = dl_gemm_grouped_workspace_bytes(E);
  char *ws = NULL;
  dl_storage_t *st = NULL;
  if (o->workspace) {
    dl_view_t vw;
    DL_TRY(dl_tensor_arg(o->workspace, "workspace", DL_CUDA, dev, fn, &vw));
    const int64_t bytes = vw.numel * dl_dtype_size(vw.dtype);
    DL_CHECK_ARG(bytes >= need, "%s: the workspace holds %lld bytes, %lld experts need %lld "
                 "(dl.gemm.grouped_workspace_bytes)", fn, (long long)bytes, (long long)E,
                 (long long)need);
    DL_CHECK_ARG((uintptr_t)vw.data % PTR_ALIGN == 0, "%s: the workspace must start %d-byte "
                 "aligned", fn, PTR_ALIGN);
    ws = vw.data;
  } else {
    DL_TRY(dl_mem_tag_push("gemm_workspace"));
    int rc = dl_storage_new(DL_CUDA, dev, need, h, &st);
    dl_mem_tag_pop();
    if (rc) return dl_error_context(rc, "%s: allocating the workspace", fn);
    ws = st->ptr;
  }
  char *lt_ws = ws + (need - DL_GEMM_WORKSPACE_BYTES);
  int rc = DL_OK;
  /* the weight gradient of an expert without rows: no GEMM writes it */
  for (int64_t i = 0; i < p->n_empty && !rc && !o->accumulate; i++) {
    const dl_view_t z = dl_grouped_expert_view(dw, p->empty[i]);
    rc = dl_fill_cuda(&z, 0, h);
  }
  dl_gemm_args_t *u = NULL;
  int64_t nu = 0;
  if (!rc && p->n > 0 && !(u = malloc(sizeof *u * (size_t)p->n)))
    rc = DL_ERR(DL_ENOMEM, "%s: out of host memory", fn);
  if (!rc && p->n > 0) {
    nu = dl_grouped_coalesce(p, u);
    pthread_mutex_lock(&mu);
    struct side *sd = NULL;
    const int streams = o->streams > 1 ? o->streams : 1;
    rc = side_of(dev, streams, &sd);
    int backend = o->backend;
    if (!rc && backend == DL_GEMM_GROUPED_AUTO) backend = DL_GEMM_GROUPED_LOOP; /* the header says why */
    if (!rc && backend == DL_GEMM_GROUPED_CUBLAS) {
      rc = dl_gemm_cublas_grouped(p->g, p->n, dev, (void **)ws, lt_ws, DL_GEMM_WORKSPACE_BYTES, h);
    }
    if (!rc && backend == DL_GEMM_GROUPED_LOOP) {
      rc = run_loop(u, nu, dev, sd, streams, lt_ws, DL_GEMM_WORKSPACE_BYTES, (cudaStream_t)h);
      if (!rc) n_loop++;
    }
    if (!rc) o->chosen = backend;
    pthread_mutex_unlock(&mu);
  }
  free(u);
  if (st) dl_storage_release(st); /* stream-ordered: the next user of the block queues after us */
  return rc;
}
#endif

void dl_gemm_grouped_stats(dl_gemm_stats_t *out) {
  pthread_mutex_lock(&mu);
  out->grouped_loop = n_loop;
  pthread_mutex_unlock(&mu);
}
