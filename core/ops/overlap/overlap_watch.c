/*
 * overlap_watch.c — the overlap object's flags on cuda, and its watchdog.
 *
 * Signals and waits are stream memory operations on the control words in
 * host memory (overlap_flags.c): cuStreamWriteValue32 (with its default
 * memory barrier, so the work before it on the stream is visible before
 * the flag) and cuStreamWaitValue32 (EQ 1) followed by a write of 0, then a
 * write of the run's id into the run's progress word for that wait. No
 * kernel runs and no multiprocessor spins; CUDA graphs capture them as
 * memory-operation nodes. The driver functions come from the runtime
 * (cudaGetDriverEntryPointByVersion), so nothing links against libcuda.
 *
 * A stream wait has no timeout of its own, so a thread per object watches,
 * with plain loads and stores of host memory and no CUDA call (nothing it
 * does can queue behind a stuck stream): every TICK it reads the active and
 * progress words. While a run is active and they have not changed for the
 * timeout, the run is stuck: the object fails with a message naming, for
 * each stream, the first wait that has not passed (step, flag, peer, the
 * flag's value), printed at once and returned by the next begin or check.
 * From then on, on every tick while a run of the object is active, the
 * watchdog sets all of its flags to 1, so every wait of its streams (and of
 * graph replays already queued) passes and they drain instead of hanging
 * the process. A peer's death (o->gone, set by the process's watchdog of
 * peers, core/comm/peers.c) fails the active run at the next tick the same
 * way, without waiting for the timeout. Results of a failed object are garbage; it refuses further
 * runs. Freeing the object waits for the device's queued work with the
 * watchdog still at it, so no queued run outlives the flags.
 */
#ifdef DL_WITH_CUDA

#include <cuda.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "overlap_int.h"
#include "base/device.h"

enum { TICK_MS = 50 };

typedef CUresult (*value32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*errstr_fn)(CUresult, const char **);

static struct {
  pthread_once_t once;
  int rc;
  char why[256];
  value32_fn write32, wait32;
  errstr_fn errname;
} drv = {PTHREAD_ONCE_INIT};

struct watch {
  pthread_t thread;
  pthread_cond_t cv;
  int started, stop;
  uint32_t last[1 + DL_OVERLAP_MAX_WAITS]; /* [active][progress...] at the last change */
  int last_n;                              /* words of last that hold one (0: none) */
  double since;
};

static void *entry(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return q == cudaDriverEntryPointSuccess ? fn : NULL;
}

static void load_driver(void) {
  drv.write32 = (value32_fn)entry("cuStreamWriteValue32");
  drv.wait32 = (value32_fn)entry("cuStreamWaitValue32");
  drv.errname = (errstr_fn)entry("cuGetErrorName");
  if (!drv.write32 || !drv.wait32) {
    drv.rc = DL_EUNSUPPORTED;
    snprintf(drv.why, sizeof drv.why, "the CUDA driver gave no cuStreamWriteValue32/"
             "cuStreamWaitValue32 (driver older than CUDA 12?)");
  }
}

static int drv_error(CUresult r, const char *what) {
  const char *name = NULL;
  if (!drv.errname || drv.errname(r, &name) != CUDA_SUCCESS || !name) name = "?";
  return DL_ERR(DL_ECUDA, "%s failed: %s (CUresult %d)", what, name, (int)r);
}

static int write32(void *stream, uint32_t *addr, uint32_t v, const char *what) {
  CUresult r = drv.write32((CUstream)stream, (CUdeviceptr)(uintptr_t)addr, v,
                           CU_STREAM_WRITE_VALUE_DEFAULT);
  return r == CUDA_SUCCESS ? DL_OK : drv_error(r, what);
}

static double now_s(void) { return dl_now_us() * 1e-6; }

/* ---- the watchdog ------------------------------------------------------------------ */

/* The message: for each stream, its first wait that has not passed. mu held. */
static void diagnose(dl_overlap_t *o, const uint32_t *snap, char *buf, size_t len) {
  char who[300], dead[96];
  dl_devop_describe(&o->op, o->what, who, sizeof who);
  const uint32_t gone = dl_devop_gone(&o->op);
  if (gone) dl_devop_gone_str(&o->op, gone, dead, sizeof dead);
  int used = gone ? snprintf(buf, len, "%s: %s; waits that had not passed:", who, dead)
                  : snprintf(buf, len, "%s: no progress for %.1f s:", who, o->op.timeout_s);
  void *seen[DL_OVERLAP_MAX_WAITS];
  int nseen = 0;
  for (int i = 0; i < o->nlog && used < (int)len; i++) {
    const wait_rec_t *r = &o->log[i];
    int dup = 0;
    for (int j = 0; j < nseen; j++) dup |= seen[j] == r->stream;
    if (snap[1 + i] == snap[0] || dup) continue;
    seen[nseen++] = r->stream;
    used += snprintf(buf + used, len - (size_t)used, " step %d waits for '%s' from rank %d (flag %d is %u);",
                     r->step, r->what, r->peer, r->flag,
                     __atomic_load_n(&o->flags[o->op.rank][r->flag], __ATOMIC_ACQUIRE));
  }
  if (used < (int)len && !gone)
    snprintf(buf + used, len - (size_t)used, " did every rank run this op?");
}

/* Every flag of ours := 1: each wait of a queued run passes, its streams drain. */
static void release(dl_overlap_t *o) {
  for (int f = 0; f < o->nflags; f++) __atomic_store_n(&o->flags[o->op.rank][f], 1u, __ATOMIC_RELEASE);
}

static void tick(dl_overlap_t *o) {
  watch_t *w = o->watch;
  uint32_t snap[1 + DL_OVERLAP_MAX_WAITS];
  pthread_mutex_lock(&o->op.mu);
  const int n = o->nlog;
  const uint32_t gone = dl_devop_gone(&o->op);
  for (int i = 0; i <= n; i++) snap[i] = __atomic_load_n(&o->state[i], __ATOMIC_ACQUIRE);
  if (!snap[0]) { /* idle */
    w->last_n = 0;
  } else if (o->op.failed) {
    release(o);
  } else if (!gone && (w->last_n != n + 1 || memcmp(w->last, snap, (size_t)(n + 1) * 4))) {
    memcpy(w->last, snap, (size_t)(n + 1) * 4);
    w->last_n = n + 1;
    w->since = now_s();
  } else if (gone || now_s() - w->since > o->op.timeout_s) {
    char why[sizeof o->op.failure];
    diagnose(o, snap, why, sizeof why);
    dl_devop_fail_locked(&o->op, why);
    fprintf(stderr, "distlab: %s\n", why);
    release(o);
  }
  pthread_mutex_unlock(&o->op.mu);
}

static void *watch_main(void *arg) {
  dl_overlap_t *o = arg;
  watch_t *w = o->watch;
  pthread_mutex_lock(&o->op.mu);
  while (!w->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TICK_MS * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&w->cv, &o->op.mu, &ts);
    if (w->stop) break;
    pthread_mutex_unlock(&o->op.mu);
    tick(o);
    pthread_mutex_lock(&o->op.mu);
  }
  pthread_mutex_unlock(&o->op.mu);
  return NULL;
}

/* ---- the object's side ------------------------------------------------------------- */

int dl_overlap_cu_init(dl_overlap_t *o) {
  pthread_once(&drv.once, load_driver);
  if (drv.rc) return DL_ERR(drv.rc, "overlap flags: %s", drv.why);
  watch_t *w = calloc(1, sizeof *w);
  if (!w) return DL_ERR(DL_ENOMEM, "overlap: out of host memory for the watchdog");
  o->watch = w;
  pthread_cond_init(&w->cv, NULL);
  int e = pthread_create(&w->thread, NULL, watch_main, o);
  if (e) return DL_ERR(DL_ENOMEM, "overlap: cannot start the watchdog thread: %s", strerror(e));
  w->started = 1;
  return DL_OK;
}

void dl_overlap_cu_fini(dl_overlap_t *o) {
  watch_t *w = o->watch;
  if (!w) return;
  /* a run still queued (eager or a graph replay) would touch the flags after
   * they go: wait for the device; a stuck run among them is ended by the
   * watchdog within the timeout */
  if (o->runs > 0 && dl_cuda_use(o->op.dev_index) == DL_OK && cudaDeviceSynchronize() != cudaSuccess)
    (void)cudaGetLastError();
  if (w->started) {
    pthread_mutex_lock(&o->op.mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&o->op.mu);
    pthread_join(w->thread, NULL);
  }
  pthread_cond_destroy(&w->cv);
  free(w);
  o->watch = NULL;
}

int dl_overlap_cu_begin(dl_overlap_t *o, void *stream) {
  return write32(stream, o->dstate, o->run_id, "overlap begin: cuStreamWriteValue32");
}

int dl_overlap_cu_end(dl_overlap_t *o, void *stream) {
  return write32(stream, o->dstate, 0, "overlap end: cuStreamWriteValue32");
}

int dl_overlap_cu_signal(dl_overlap_t *o, uint32_t *flag, void *stream) {
  (void)o;
  return write32(stream, flag, 1, "overlap signal: cuStreamWriteValue32");
}

int dl_overlap_cu_wait(dl_overlap_t *o, uint32_t *flag, int idx, void *stream) {
  CUresult r = drv.wait32((CUstream)stream, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_EQ);
  if (r != CUDA_SUCCESS) return drv_error(r, "overlap wait: cuStreamWaitValue32");
  DL_TRY(write32(stream, flag, 0, "overlap wait: cuStreamWriteValue32 (clear)"));
  return write32(stream, o->dstate + 1 + idx, o->run_id,
                 "overlap wait: cuStreamWriteValue32 (progress)");
}

#endif
