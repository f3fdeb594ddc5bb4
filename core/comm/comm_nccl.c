/*
 * comm_nccl.c — the GPU communicator: NCCL, one process per GPU.
 *
 * NCCL is opened with dlopen("libnccl.so.2") when the first NCCL
 * communicator is made, so libdistlab loads (and its cpu/meta parts work)
 * where NCCL is absent. The unique id travels through the store. NCCL's own
 * environment variables apply as always; NVLink multicast (NVLS) is forced
 * off, since the lent GPU hosts forbid it.
 *
 * Nothing may hang. The communicator stays blocking (NCCL's default: in
 * non-blocking mode recent NCCL hands every op to a new thread, which would
 * cost microseconds per op), and hangs are caught around it instead:
 *  - before ncclCommInitRank the ranks meet through the store, so a rank
 *    that never comes is named by a store timeout;
 *  - a watchdog thread per communicator aborts it when the host has been
 *    inside one NCCL call for longer than the timeout (setup, or the lazy
 *    connection of a first op to a peer that never calls), when an op's
 *    event (recorded after each op) has not completed within the timeout,
 *    when NCCL reports an asynchronous error, or when a member's process
 *    on this host has died (core/comm/peers.c). The abort ends the stuck
 *    call or kernels; the reason goes to stderr and every later op and
 *    dl_comm_synchronize returns it;
 *  - dl_comm_synchronize polls the stream, the async error and the deadline
 *    instead of blocking.
 * With NCCL_COMM_BLOCKING=0 set by the user, ncclInProgress is polled too.
 * DISTLAB_NCCL_WATCHDOG=0 turns the thread off (the per-op event with it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#ifndef DL_WITH_CUDA

static int nccl_init(dl_comm_t *c) {
  return DL_ERR(DL_EUNSUPPORTED,
                "this libdistlab was built without CUDA (no nvcc at build time): the nccl "
                "backend needs a CUDA build");
}
static int nccl_none(dl_comm_t *c) { return DL_EUNSUPPORTED; }
static int nccl_run(dl_comm_t *c, const dl_comm_call_t *call) { return DL_EUNSUPPORTED; }
static int nccl_synchronize(dl_comm_t *c, dl_stream_t *s) { return DL_EUNSUPPORTED; }
static void nccl_destroy(dl_comm_t *c) { c->impl = NULL; }
#define nccl_native NULL
#define nccl_group_start nccl_none
#define nccl_group_end nccl_none
#define nccl_abort NULL

#else

#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "base/device.h"

/* ---- the library -------------------------------------------------------- */

static struct {
  void *lib;
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
} api;

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;

static int nccl_load(void) {
  pthread_mutex_lock(&load_mu);
  int rc = DL_OK;
  if (!api.lib) {
    void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      rc = DL_ERR(DL_ENCCL,
                  "cannot load NCCL: %s (install libnccl2, or put the directory of "
                  "libnccl.so.2 on LD_LIBRARY_PATH)",
                  dlerror());
    } else {
#define SYM(f)                                                                             \
  if (rc == DL_OK && !(*(void **)&api.f = dlsym(lib, "nccl" #f)))                          \
    rc = DL_ERR(DL_ENCCL, "libnccl.so.2 lacks nccl" #f " (NCCL too old? need 2.18 or newer)");
      SYM(GetVersion) SYM(GetUniqueId) SYM(CommInitRankConfig) SYM(CommDestroy)
      SYM(CommAbort) SYM(CommGetAsyncError) SYM(GetErrorString) SYM(GetLastError)
      SYM(AllReduce) SYM(AllGather) SYM(ReduceScatter) SYM(Broadcast) SYM(Send) SYM(Recv)
      SYM(GroupStart) SYM(GroupEnd)
#undef SYM
      if (rc == DL_OK) api.lib = lib;
      else dlclose(lib);
    }
  }
  pthread_mutex_unlock(&load_mu);
  return rc;
}

/* ---- state -------------------------------------------------------------- */

enum { RING = 256 };

typedef struct pending_op {
  cudaEvent_t ev;
  double t; /* when its clock started (0: not yet seen by the watchdog) */
  int64_t seq;
  int op;
} pending_op_t;

typedef struct nccl {
  ncclComm_t comm;
  int *sync_buf; /* one int on the device: what barrier all-reduces */
  pthread_mutex_t mu;
  pthread_t watchdog;
  int has_watchdog, stop;
  pending_op_t ring[RING];
  int head, tail; /* entries [tail, head) are pending, modulo RING */
  int since_watch;   /* ops since the last watched one */
  int want_watch;    /* set by the watchdog each tick: watch the next op */
  int failed, aborted, ready;
  int64_t in_call;   /* the id of the NCCL call the host is in; 0: none */
  int64_t calls;     /* NCCL calls entered so far (the ids) */
  int call_op;
  char failure[1024];
  int last_op;
  int64_t last_seq;
  cudaStream_t group_stream; /* where the current group's ops went */
} nccl_t;

static nccl_t *impl(dl_comm_t *c) { return c->impl; }

static double now_s(void) { return dl_now_us() * 1e-6; }

static int nccl_error(dl_comm_t *c, ncclResult_t r, const char *what) {
  nccl_t *m = impl(c);
  const char *detail = m && m->comm ? api.GetLastError(m->comm) : "";
  return DL_ERR(DL_ENCCL, "%s: %s%s%s", what, api.GetErrorString(r), detail && *detail ? ": " : "",
                detail ? detail : "");
}

/* Record why the comm is dead and abort it so stuck kernels end; once. */
static void fail_locked(dl_comm_t *c, const char *why) {
  nccl_t *m = impl(c);
  if (m->failed) return;
  snprintf(m->failure, sizeof m->failure, "%s", why);
  m->failed = 1;
  if (m->comm && !m->aborted) {
    m->aborted = 1;
    api.CommAbort(m->comm);
  }
}

static int failure_error(dl_comm_t *c) {
  return DL_ERR(DL_EPEER, "the NCCL communicator was aborted: %s", impl(c)->failure);
}

/* Wait out ncclInProgress on a non-blocking comm, within the timeout. */
static int settle(dl_comm_t *c, ncclResult_t r, const char *what) {
  nccl_t *m = impl(c);
  const double t0 = dl_now_us(), deadline = t0 * 1e-6 + c->timeout_s;
  while (r == ncclInProgress) {
    if (now_s() > deadline) {
      char why[512];
      snprintf(why, sizeof why, "%s did not complete within %.1f s on rank %d", what,
               c->timeout_s, c->rank);
      pthread_mutex_lock(&m->mu);
      fail_locked(c, why);
      pthread_mutex_unlock(&m->mu);
      return DL_ERR(DL_ETIMEOUT, "%s (did every rank of %d reach it? NCCL_DEBUG=INFO tells more)",
                    why, c->size);
    }
    dl_wait_pause(t0);
    ncclResult_t ar = ncclSuccess;
    api.CommGetAsyncError(m->comm, &ar);
    r = ar;
  }
  return r == ncclSuccess ? DL_OK : nccl_error(c, r, what);
}

/* Bracket every NCCL call that may block the host, for the watchdog, which
 * times a call id it sees twice (no clock read here: on the GPU hosts the
 * issue rate of small collectives is the host's, every 100 ns shows). */
static void call_enter(nccl_t *m, int op) {
  m->call_op = op;
  __atomic_store_n(&m->in_call, ++m->calls, __ATOMIC_RELEASE);
}

static int call_leave(dl_comm_t *c, ncclResult_t r, const char *what) {
  nccl_t *m = impl(c);
  __atomic_store_n(&m->in_call, 0, __ATOMIC_RELEASE);
  if (__atomic_load_n(&m->failed, __ATOMIC_ACQUIRE)) return failure_error(c);
  return settle(c, r, what);
}

/* ---- watchdog ----------------------------------------------------------- */

/* Drop finished ops from the tail. An op's clock starts when the watchdog
 * first sees it at the tail (enqueued with t = 0), or when the op before it
 * finished: a long queue of work ahead of it is not its hang. Caller holds
 * mu; the clock has the watchdog's tick (20 ms) as its grain. */
static void ring_retire(nccl_t *m) {
  int moved = 0;
  while (m->tail != m->head && cudaEventQuery(m->ring[m->tail].ev) != cudaErrorNotReady) {
    (void)cudaGetLastError();
    __atomic_store_n(&m->tail, (m->tail + 1) % RING, __ATOMIC_RELEASE);
    moved = 1;
  }
  double t = now_s();
  if (m->tail != m->head && (moved || m->ring[m->tail].t == 0)) m->ring[m->tail].t = t;
}

/* Watching an op costs an event record and a lock the watchdog thread also
 * takes: on every op that doubled the host cost of a small collective. A
 * hang stops everything queued after it, so a sample suffices: an op is
 * watched when none is pending, every 64 ops, or when the watchdog asked
 * for one (each of its ticks). (An op issued after the last watched one
 * finished and followed by nothing is left to the timeouts of synchronize
 * and of event waits.) */
static void watch_op(dl_comm_t *c, int op, cudaStream_t stream) {
  nccl_t *m = impl(c);
  m->last_op = op;
  m->last_seq = c->seq;
  if (!m->has_watchdog) return;
  int idle = __atomic_load_n(&m->tail, __ATOMIC_ACQUIRE) == m->head;
  if (!idle && ++m->since_watch < 64 && !__atomic_load_n(&m->want_watch, __ATOMIC_RELAXED)) return;
  enum cudaStreamCaptureStatus cap;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
    return; /* a graph being captured: its replays are not watched */
  pthread_mutex_lock(&m->mu);
  int next = (m->head + 1) % RING;
  if (next != m->tail && cudaEventRecord(m->ring[m->head].ev, stream) == cudaSuccess) {
    m->ring[m->head] = (pending_op_t){m->ring[m->head].ev, 0, c->seq, op};
    __atomic_store_n(&m->head, next, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&m->mu);
  m->since_watch = 0;
  __atomic_store_n(&m->want_watch, 0, __ATOMIC_RELAXED);
}

static void *watchdog_main(void *arg) {
  dl_comm_t *c = arg;
  nccl_t *m = impl(c);
  cudaSetDevice(c->dev_index);
  int64_t seen_call = 0; /* the NCCL call the host was in at the last tick, and since when */
  double seen_since = 0;
  for (;;) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&m->mu);
    if (m->stop || m->failed) {
      pthread_mutex_unlock(&m->mu);
      break;
    }
    __atomic_store_n(&m->want_watch, 1, __ATOMIC_RELAXED);
    if (m->ready) ring_retire(m);
    char why[512] = "";
    ncclResult_t ar = ncclSuccess;
    if (m->ready) api.CommGetAsyncError(m->comm, &ar);
    int64_t call = __atomic_load_n(&m->in_call, __ATOMIC_ACQUIRE);
    if (call != seen_call) {
      seen_call = call;
      seen_since = now_s();
    }
    const uint32_t gone = __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
    if (gone) { /* a member's process died (peers.c): its NCCL peers would hang */
      char who[160];
      dl_comm_gone_str(c, gone, who, sizeof who);
      snprintf(why, sizeof why, "%s on rank %d of %d (comm '%s'): %s",
               m->ready ? dl_comm_op_name(m->last_op) : "NCCL setup", c->rank, c->size, c->name,
               who);
    } else if (call != 0 && now_s() - seen_since > c->timeout_s) {
      snprintf(why, sizeof why,
               "%s on rank %d of %d (comm '%s') has been inside NCCL for more than %.1f s (a "
               "peer did not join it, died, or is stuck)",
               m->ready ? dl_comm_op_name(m->call_op) : "NCCL setup", c->rank, c->size, c->name,
               c->timeout_s);
    } else if (ar != ncclSuccess && ar != ncclInProgress) {
      snprintf(why, sizeof why, "NCCL reported %s on rank %d: %s", api.GetErrorString(ar),
               c->rank, api.GetLastError(m->comm));
    } else if (m->tail != m->head && now_s() - m->ring[m->tail].t > c->timeout_s) {
      pending_op_t *p = &m->ring[m->tail];
      snprintf(why, sizeof why,
               "%s #%lld on rank %d of %d (comm '%s') did not finish within %.1f s (a peer "
               "did not call it, died, or is stuck)",
               dl_comm_op_name(p->op), (long long)p->seq, c->rank, c->size, c->name,
               c->timeout_s);
    }
    if (*why) {
      fail_locked(c, why);
      fprintf(stderr, "distlab: %s; communicator aborted\n", why);
    }
    pthread_mutex_unlock(&m->mu);
  }
  return NULL;
}

/* ---- ops ---------------------------------------------------------------- */

static int dtype_of(int dt, ncclDataType_t *out) {
  static const ncclDataType_t map[DL_NUM_DTYPES] = {
      [DL_F32] = ncclFloat32, [DL_F16] = ncclFloat16, [DL_BF16] = ncclBfloat16,
      [DL_I32] = ncclInt32,   [DL_I64] = ncclInt64,   [DL_U8] = ncclUint8,
      [DL_F64] = ncclFloat64};
  DL_CHECK_ARG(dt >= 0 && dt < DL_NUM_DTYPES, "nccl: unknown dtype %d", dt);
  *out = map[dt];
  return DL_OK;
}

/* Grouped sends and receives; the first failure, or GroupEnd's result. */
static ncclResult_t a2av(dl_comm_t *c, const dl_comm_call_t *call, ncclDataType_t dt,
                         cudaStream_t st) {
  nccl_t *m = impl(c);
  int esz = dl_dtype_size(call->in.dtype);
  int64_t so = 0, ro = 0;
  ncclResult_t r = api.GroupStart();
  for (int j = 0; j < c->size && r == ncclSuccess; j++) {
    if (call->send_counts[j] > 0)
      r = api.Send(call->in.data + so * esz, (size_t)call->send_counts[j], dt, j, m->comm, st);
    if (r == ncclSuccess && call->recv_counts[j] > 0)
      r = api.Recv(call->out.data + ro * esz, (size_t)call->recv_counts[j], dt, j, m->comm, st);
    so += call->send_counts[j];
    ro += call->recv_counts[j];
  }
  ncclResult_t e = api.GroupEnd();
  return r != ncclSuccess ? r : e;
}

static int nccl_run(dl_comm_t *c, const dl_comm_call_t *call) {
  nccl_t *m = impl(c);
  if (m->failed) return failure_error(c);
  DL_TRY(dl_cuda_use(c->dev_index));
  void *h = NULL;
  DL_TRY(dl_stream_for(call->stream, DL_CUDA, c->dev_index, &h));
  cudaStream_t st = h;
  static const ncclRedOp_t reds[] = {ncclSum, ncclAvg, ncclMax, ncclMin};
  ncclDataType_t dt = ncclFloat32;
  if (call->op != DL_OP_BARRIER)
    DL_TRY(dtype_of(call->op == DL_OP_SEND ? call->in.dtype : call->out.dtype, &dt));
  if (c->in_group) {
    m->group_stream = st;
    m->last_op = call->op;
  }
  const dl_view_t *in = &call->in, *out = &call->out;
  ncclResult_t r;
  call_enter(m, call->op);
  switch (call->op) {
  case DL_OP_ALL_REDUCE:
    r = api.AllReduce(in->data, out->data, (size_t)in->numel, dt, reds[call->red], m->comm, st);
    break;
  case DL_OP_ALL_GATHER:
    r = api.AllGather(in->data, out->data, (size_t)in->numel, dt, m->comm, st);
    break;
  case DL_OP_REDUCE_SCATTER:
    r = api.ReduceScatter(in->data, out->data, (size_t)out->numel, dt, reds[call->red], m->comm,
                          st);
    break;
  case DL_OP_ALL_TO_ALL:
  case DL_OP_ALL_TO_ALLV: r = a2av(c, call, dt, st); break;
  case DL_OP_BROADCAST:
    r = api.Broadcast(out->data, out->data, (size_t)out->numel, dt, call->peer, m->comm, st);
    break;
  case DL_OP_SEND: r = api.Send(in->data, (size_t)in->numel, dt, call->peer, m->comm, st); break;
  case DL_OP_RECV: r = api.Recv(out->data, (size_t)out->numel, dt, call->peer, m->comm, st); break;
  default: /* DL_OP_BARRIER */
    r = api.AllReduce(m->sync_buf, m->sync_buf, 1, ncclInt32, ncclSum, m->comm, st);
  }
  DL_TRY(call_leave(c, r, dl_comm_op_name(call->op)));
  dl_graph_note_user(c); /* a graph being captured now holds NCCL work of c */
  if (!c->in_group) watch_op(c, call->op, st);
  return call->op == DL_OP_BARRIER ? c->be->synchronize(c, call->stream) : DL_OK;
}

static int nccl_group_start(dl_comm_t *c) {
  ncclResult_t r = api.GroupStart();
  return r == ncclSuccess ? DL_OK : nccl_error(c, r, "ncclGroupStart");
}

static int nccl_group_end(dl_comm_t *c) {
  nccl_t *m = impl(c);
  call_enter(m, m->last_op);
  DL_TRY(call_leave(c, api.GroupEnd(), "grouped point-to-point"));
  dl_graph_note_user(c);
  watch_op(c, m->last_op, m->group_stream);
  return DL_OK;
}

static int nccl_synchronize(dl_comm_t *c, dl_stream_t *s) {
  nccl_t *m = impl(c);
  if (m->failed) return failure_error(c);
  DL_TRY(dl_cuda_use(c->dev_index));
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, c->dev_index, &h));
  const double t0 = dl_now_us(), deadline = t0 * 1e-6 + c->timeout_s;
  for (;;) {
    cudaError_t q = cudaStreamQuery((cudaStream_t)h);
    if (q == cudaSuccess) return DL_OK;
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return DL_ERR(DL_ECUDA, "waiting for %s #%lld on rank %d: %s", dl_comm_op_name(m->last_op),
                    (long long)m->last_seq, c->rank, cudaGetErrorString(q));
    }
    ncclResult_t ar = ncclSuccess;
    api.CommGetAsyncError(m->comm, &ar);
    pthread_mutex_lock(&m->mu);
    int failed = m->failed;
    if (!failed && ar != ncclSuccess && ar != ncclInProgress) {
      char why[512];
      snprintf(why, sizeof why, "NCCL reported %s on rank %d: %s", api.GetErrorString(ar),
               c->rank, api.GetLastError(m->comm));
      fail_locked(c, why);
      failed = 1;
    } else if (!failed && now_s() > deadline) {
      char why[512];
      snprintf(why, sizeof why,
               "%s #%lld on rank %d of %d (comm '%s') did not finish within %.1f s (a peer did "
               "not call it, died, or is stuck)",
               dl_comm_op_name(m->last_op), (long long)m->last_seq, c->rank, c->size, c->name,
               c->timeout_s);
      fail_locked(c, why);
      failed = 1;
    }
    pthread_mutex_unlock(&m->mu);
    if (failed) return failure_error(c);
    dl_wait_pause(t0);
  }
}

static void nccl_abort(dl_comm_t *c, const char *why) {
  nccl_t *m = impl(c);
  pthread_mutex_lock(&m->mu);
  fail_locked(c, why);
  pthread_mutex_unlock(&m->mu);
}

/* Live watchdogs. A script that ends with os.exit() skips the finalizers:
 * exit() then tears the CUDA runtime down under a watchdog thread still
 * querying events (a segfault at exit). An atexit handler registered after
 * the runtime's (at the first watchdog, CUDA being initialised by then) runs
 * before it and stops them. */
enum { MAX_WATCHED = 64 };
static pthread_mutex_t dogs_mu = PTHREAD_MUTEX_INITIALIZER;
static nccl_t *dogs[MAX_WATCHED];
static int dogs_hooked;

static void stop_watchdog(nccl_t *m) {
  dl_teardown_trace("stop watchdog", m);
  pthread_mutex_lock(&m->mu);
  int running = m->has_watchdog;
  m->stop = 1;
  m->has_watchdog = 0;
  pthread_mutex_unlock(&m->mu);
  if (running) pthread_join(m->watchdog, NULL);
  dl_teardown_trace("watchdog stopped", m);
}

static void stop_watchdogs_at_exit(void) {
  dl_teardown_trace("at exit", NULL);
  pthread_mutex_lock(&dogs_mu);
  for (int i = 0; i < MAX_WATCHED; i++)
    if (dogs[i]) {
      stop_watchdog(dogs[i]);
      dogs[i] = NULL;
    }
  pthread_mutex_unlock(&dogs_mu);
}

static void dogs_add(nccl_t *m) {
  pthread_mutex_lock(&dogs_mu);
  if (!dogs_hooked) dogs_hooked = atexit(stop_watchdogs_at_exit) == 0;
  for (int i = 0; i < MAX_WATCHED; i++)
    if (!dogs[i]) {
      dogs[i] = m;
      break;
    }
  pthread_mutex_unlock(&dogs_mu);
}

static void dogs_remove(nccl_t *m) {
  pthread_mutex_lock(&dogs_mu);
  for (int i = 0; i < MAX_WATCHED; i++)
    if (dogs[i] == m) dogs[i] = NULL;
  pthread_mutex_unlock(&dogs_mu);
}

static void nccl_destroy(dl_comm_t *c) {
  nccl_t *m = impl(c);
  dogs_remove(m);
  stop_watchdog(m);
  if (m->comm) {
    /* graphs holding NCCL work of this communicator would make
     * ncclCommDestroy wait for them forever: they go first */
    char what[160];
    snprintf(what, sizeof what, "the NCCL communicator '%s'", c->name);
    dl_graph_release_user(c, what);
    /* work that cannot finish would block ncclCommDestroy: the wait aborts it */
    dl_teardown_trace("synchronize", m);
    if (!m->failed && nccl_synchronize(c, NULL) < 0) dl_clear_error();
    /* the collector's free is local: ncclCommDestroy would wait for the peers, whose
     * collectors free their communicators in another order (dl_comm_drop) */
    dl_teardown_trace(m->aborted ? "aborted before" : c->dropped ? "ncclCommAbort (collected)" : "ncclCommDestroy", m);
    if (!m->aborted) (c->dropped ? api.CommAbort : api.CommDestroy)(m->comm);
    dl_teardown_trace("comm gone", m);
  }
  if (m->sync_buf) cudaFree(m->sync_buf);
  for (int i = 0; i < RING; i++)
    if (m->ring[i].ev) cudaEventDestroy(m->ring[i].ev);
  pthread_mutex_destroy(&m->mu);
  free(m);
  c->impl = NULL;
}

static void *nccl_native(dl_comm_t *c) { return impl(c)->comm; }

static int nccl_setup(dl_comm_t *c, nccl_t *m) {
  DL_TRY(dl_cuda_use(c->dev_index));
  setenv("NCCL_NVLS_ENABLE", "0", 1); /* no NVLink multicast, whatever the caller set */
  const char *wd = getenv("DISTLAB_NCCL_WATCHDOG");
  if (!wd || strcmp(wd, "0") != 0) { /* before setup, so a hanging setup is caught too */
    for (int i = 0; i < RING; i++)
      DL_CUDA_CHECK(cudaEventCreateWithFlags(&m->ring[i].ev, cudaEventDisableTiming));
    if (pthread_create(&m->watchdog, NULL, watchdog_main, c) != 0)
      return DL_ERR(DL_EIO, "nccl: cannot start the watchdog thread");
    m->has_watchdog = 1;
    dogs_add(m);
  }
  ncclUniqueId id;
  if (c->rank == 0) {
    ncclResult_t r = api.GetUniqueId(&id);
    if (r != ncclSuccess) return nccl_error(c, r, "ncclGetUniqueId");
    DL_TRY(dl_comm_store_set(c, "ncclid", &id, sizeof id));
  } else {
    DL_TRY(dl_comm_store_get(c, "ncclid", &id, sizeof id));
  }
  DL_TRY(dl_comm_store_barrier(c, "nccl")); /* every rank is here: NCCL's setup can start */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  call_enter(m, DL_OP_BARRIER);
  ncclResult_t r = api.CommInitRankConfig(&m->comm, c->size, id, c->rank, &cfg);
  DL_TRY(call_leave(c, r, "ncclCommInitRankConfig"));
  m->ready = 1;
  DL_CUDA_CHECK(cudaMalloc((void **)&m->sync_buf, sizeof(int)));
  return DL_OK;
}

static int nccl_init(dl_comm_t *c) {
  DL_TRY(nccl_load());
  nccl_t *m = calloc(1, sizeof *m);
  if (!m) return DL_ERR(DL_ENOMEM, "nccl communicator: out of memory");
  pthread_mutex_init(&m->mu, NULL);
  c->impl = m;
  int rc = nccl_setup(c, m);
  if (rc < 0) {
    nccl_abort(c, dl_last_error());
    nccl_destroy(c);
  }
  return rc;
}

#endif

const dl_comm_backend_t dl_comm_nccl_backend = {
    .name = "nccl",
    .init = nccl_init,
    .run = nccl_run,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .synchronize = nccl_synchronize,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .native = nccl_native,
};
