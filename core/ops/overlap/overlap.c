/*
 * overlap.c — the overlap object: a symmetric buffer and set-and-clear
 * flags for the schedules of distlab.overlap (all-gather + GEMM and GEMM +
 * reduce-scatter, bindings/distlab/overlap/), which issue its signals,
 * waits and copies step by step on their streams. Here: making it (every
 * rank must describe the same call; the flags start where the schedule says,
 * before any peer can signal), views of any rank's buffer, the cpu flags
 * (a wait polls and fails at its timeout), the copies and the reduction the
 * schedules move data with. Where the flags live (host shared memory):
 * overlap_flags.c; the cuda flags and the watchdog: overlap_watch.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "overlap_int.h"
#include "comm/comm_ops.h"
#include "base/device.h"
#include "common/cpu/host_wait.h"
#include "comm/reduce.h"
#include "overlap/overlap.h"

/* Its flags go once no queued run can touch them (dl_devop_free). */
static void fini(dl_devop_t *op) {
  dl_overlap_t *o = (dl_overlap_t *)op;
#ifdef DL_WITH_CUDA
  dl_overlap_cu_fini(o); /* after it, no queued run touches the flags */
#endif
  dl_overlap_ctl_unmap(o);
}

static const dl_devop_kind_t overlap_kind = {
    .name = "overlap op",
    .magic = 0x0e71a9,
    .what = "the overlap op (its symmetric buffer and flags)",
    .fini = fini,
};

static int live(const dl_overlap_t *o, const char *fn) {
  return dl_devop_live(o ? &o->op : NULL, &overlap_kind, fn);
}

/* A peer's death fails the op when the host next looks (its waits are
 * stream operations and host polls, which record nothing), then
 * dl_devop_refused. */
static int refused(dl_devop_t *op) {
  const dl_overlap_t *o = (const dl_overlap_t *)op;
  const uint32_t gone = dl_devop_gone(op);
  if (gone && !__atomic_load_n(&op->failed, __ATOMIC_ACQUIRE)) { /* no run can complete without that rank */
    char who[300], dead[96], why[512];
    dl_devop_describe(op, o->what, who, sizeof who);
    dl_devop_gone_str(op, gone, dead, sizeof dead);
    snprintf(why, sizeof why, "%s: %s", who, dead);
    dl_devop_fail(op, why);
  }
  return dl_devop_refused(op);
}

/* ---- lifetime ------------------------------------------------------------------- */

static int sig_text(const void *sig, char *buf, size_t len) {
  return snprintf(buf, len, "makes %s", (const char *)sig);
}

/* Calls of dl_overlap_new per communicator (by name, the same on its
 * ranks): a mismatch fails on every rank at once, so every rank counts the
 * same calls, and a retry never reads a signature left by the failed one. */
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char comm[96];
  int64_t n;
} calls[64];

static int64_t next_call(const char *comm) {
  pthread_mutex_lock(&calls_mu);
  int i = 0;
  while (i < 63 && calls[i].comm[0] && strcmp(calls[i].comm, comm)) i++;
  if (!calls[i].comm[0] || strcmp(calls[i].comm, comm)) {
    snprintf(calls[i].comm, sizeof calls[i].comm, "%s", comm);
    calls[i].n = 0;
  }
  const int64_t n = calls[i].n++;
  pthread_mutex_unlock(&calls_mu);
  return n;
}

/* Every rank describes the same call, else every rank fails naming both. */
static int same_call(dl_overlap_t *o, dl_comm_t *c, int64_t seq) {
  char sig[sizeof o->what];
  memcpy(sig, o->what, sizeof sig); /* bytewise compared: every byte set (what is 0-padded) */
  return dl_comm_check_same(c, "ov", seq, sig, sizeof sig, "overlap ops", sig_text);
}

/* Our flags at their starting values, active and progress at 0 (host
 * memory no stream has touched yet: plain stores, then a fence). */
static void init_flags(dl_overlap_t *o, const uint32_t *initial) {
  memset(o->flags[o->op.rank], 0, DL_OVERLAP_CTL_WORDS * sizeof(uint32_t));
  for (int f = 0; f < o->nflags && initial; f++) o->flags[o->op.rank][f] = initial[f];
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int dl_overlap_new(dl_overlap_t **out, dl_comm_t *c, const char *what, int64_t nbytes,
                   int nflags, const uint32_t *initial) {
  DL_CHECK_ARG(out, "dl_overlap_new: out is NULL");
  *out = NULL;
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  DL_CHECK_ARG(what && *what, "dl_overlap_new: what is empty");
  DL_CHECK_ARG(nbytes >= 0, "dl_overlap_new: negative size %lld", (long long)nbytes);
  DL_CHECK_ARG(nflags >= 0 && nflags <= DL_OVERLAP_MAX_FLAGS,
               "dl_overlap_new: %d flags (at most %d)", nflags, DL_OVERLAP_MAX_FLAGS);
  dl_overlap_t *o = calloc(1, sizeof *o);
  if (!o) return DL_ERR(DL_ENOMEM, "dl_overlap_new: out of host memory");
  snprintf(o->what, sizeof o->what, "%s", what);
  o->nflags = nflags;
  o->nbytes = nbytes;
  int rc = dl_devop_open(&o->op, &overlap_kind, c, &ci);
  const int meta = ci.dev_type == DL_META; /* no flags: nothing runs */
  const int64_t seq = meta ? 0 : next_call(ci.name);
  if (rc == DL_OK && !meta) rc = same_call(o, c, seq);
  if (rc == DL_OK) rc = dl_devop_map(&o->op, nbytes);
  if (rc == DL_OK && !meta) rc = dl_overlap_ctl_map(o, c, seq);
  if (rc == DL_OK && !meta) init_flags(o, initial);
  /* a wait (the cpu's polls, the cuda watchdog's ticks) ends at a peer's death */
  if (rc == DL_OK) rc = dl_devop_watch(&o->op, &o->gone);
#ifdef DL_WITH_CUDA
  if (rc == DL_OK && o->op.dev_type == DL_CUDA) rc = dl_devop_sms(&o->op, &o->sms);
  if (rc == DL_OK && o->op.dev_type == DL_CUDA) rc = dl_overlap_cu_init(o);
#endif
  /* nobody signals into flags before their owner set them; then everyone
   * has read every signature and mapped every segment, and ours can go (the
   * next call's check would delete the signature too, but the last one's
   * would stay) */
  if (rc == DL_OK && !meta && o->op.size > 1) rc = dl_comm_barrier(c, NULL);
  if (rc == DL_OK && !meta) {
    char key[48];
    snprintf(key, sizeof key, "ov/%lld/%d", (long long)seq, o->op.rank);
    rc = dl_comm_store_delete(c, key);
    if (rc == DL_OK) rc = dl_overlap_ctl_unlink(o, c, seq);
  }
  if (rc < 0) {
    dl_error_context(rc, "dl_overlap_new (%s) on rank %d of %d (comm '%s')", what, ci.rank, ci.size,
                     ci.name);
    dl_overlap_free(o);
    return rc;
  }
  *out = o;
  return DL_OK;
}

void dl_overlap_free(dl_overlap_t *o) { dl_devop_free(o ? &o->op : NULL, &overlap_kind); }

int dl_overlap_info(const dl_overlap_t *o, dl_overlap_info_t *out) {
  DL_TRY(live(o, "dl_overlap_info"));
  DL_CHECK_ARG(out, "dl_overlap_info: out is NULL");
  memset(out, 0, sizeof *out);
  dl_overlap_t *m = (dl_overlap_t *)o;
  pthread_mutex_lock(&m->op.mu);
  dl_devop_identity(&o->op, &out->rank, &out->size, &out->dev_type, &out->dev_index);
  out->share = o->op.share;
  out->sms = o->sms;
  out->nflags = o->nflags;
  out->failed = o->op.failed;
  out->nbytes = o->nbytes;
  out->runs = o->runs;
  out->waits = o->nlog;
  out->base = o->op.bufs[o->op.rank];
  pthread_mutex_unlock(&m->op.mu);
  return DL_OK;
}

int dl_overlap_tensor(dl_tensor_t **out, dl_overlap_t *o, int peer, int64_t offset, int dtype,
                      int ndim, const int64_t *shape) {
  DL_CHECK_ARG(out, "dl_overlap_tensor: out is NULL");
  *out = NULL;
  DL_TRY(live(o, "dl_overlap_tensor"));
  int64_t n = 1;
  for (int d = 0; d < ndim && shape; d++) n *= shape[d] > 0 ? shape[d] : 0;
  DL_CHECK_ARG(offset >= 0 && offset + n * dl_dtype_size(dtype) <= o->nbytes,
               "dl_overlap_tensor: %lld bytes at offset %lld do not fit the op's %lld",
               (long long)(n * dl_dtype_size(dtype)), (long long)offset, (long long)o->nbytes);
  return dl_symm_tensor(out, o->op.symm, peer, offset, dtype, ndim, shape);
}

/* ---- a run ----------------------------------------------------------------------- */

static int stream_of(const dl_overlap_t *o, dl_stream_t *s, void **h) {
  *h = NULL;
  if (o->op.dev_type != DL_CUDA) return DL_OK;
  DL_TRY(dl_stream_for(s, DL_CUDA, o->op.dev_index, h));
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(o->op.dev_index));
#endif
  return DL_OK;
}

static int flag_args(const dl_overlap_t *o, int peer, int flag, const char *fn) {
  DL_TRY(live(o, fn));
  DL_CHECK_ARG(peer >= 0 && peer < o->op.size, "%s: peer %d is not a rank of 0..%d", fn, peer,
               o->op.size - 1);
  DL_CHECK_ARG(flag >= 0 && flag < o->nflags, "%s: flag %d is not in 0..%d", fn, flag,
               o->nflags - 1);
  return DL_OK;
}

int dl_overlap_begin(dl_overlap_t *o, dl_stream_t *s) {
  DL_TRY(live(o, "dl_overlap_begin"));
  DL_TRY(refused(&o->op));
  void *h;
  DL_TRY(stream_of(o, s, &h));
  pthread_mutex_lock(&o->op.mu);
  o->nlog = 0;
  o->runs++;
  o->run_id = (uint32_t)o->runs ? (uint32_t)o->runs : 1; /* 0 means "no run" */
  pthread_mutex_unlock(&o->op.mu);
  dl_graph_note_user(&o->op); /* a graph being captured now waits on this object's flags */
#ifdef DL_WITH_CUDA
  if (o->op.dev_type == DL_CUDA) return dl_overlap_cu_begin(o, h);
#endif
  return DL_OK;
}

int dl_overlap_end(dl_overlap_t *o, dl_stream_t *s) {
  DL_TRY(live(o, "dl_overlap_end"));
  void *h;
  DL_TRY(stream_of(o, s, &h));
  if (o->op.dev_type == DL_CPU) __atomic_store_n(&o->flags[o->op.rank][DL_OVERLAP_ENDED], o->run_id, __ATOMIC_RELEASE);
#ifdef DL_WITH_CUDA
  if (o->op.dev_type == DL_CUDA) return dl_overlap_cu_end(o, h);
#endif
  return DL_OK;
}

int dl_overlap_signal(dl_overlap_t *o, int peer, int flag, dl_stream_t *s) {
  DL_TRY(flag_args(o, peer, flag, "dl_overlap_signal"));
  void *h;
  DL_TRY(stream_of(o, s, &h));
  if (o->op.dev_type == DL_CPU) __atomic_store_n(&o->flags[peer][flag], 1u, __ATOMIC_RELEASE);
#ifdef DL_WITH_CUDA
  if (o->op.dev_type == DL_CUDA) return dl_overlap_cu_signal(o, &o->dflags[peer][flag], h);
#endif
  return DL_OK;
}

/* The death the wait must end at (1 + a rank), or 0. The first dead rank
 * (the peers' watch) counts unless it ended this run (then it owes us
 * nothing: it finished and exited, its peers still finishing); then the
 * peer we wait for, looked at itself, since the watch names one death only. */
static uint32_t blocking_death(dl_overlap_t *o, const wait_rec_t *w, int64_t it) {
  const uint32_t gone = dl_devop_gone(&o->op);
  if (!gone) return 0;
  const int dead = (int)gone - 1;
  if (__atomic_load_n(&o->flags[dead][DL_OVERLAP_ENDED], __ATOMIC_ACQUIRE) != o->run_id) return gone;
  const int pid = o->op.pids[w->peer];
  return (it & 255) == 0 && pid > 0 && !dl_host_pid_alive(pid) ? (uint32_t)w->peer + 1 : 0;
}

/* cpu: poll until the flag is 1 (a peer's process sets it), then clear
 * it; a peer's death that blocks it or the timeout fails the object. */
static int wait_cpu(dl_overlap_t *o, const wait_rec_t *w) {
  uint32_t *f = &o->flags[o->op.rank][w->flag];
  const double t0 = dl_host_now_s();
  for (int64_t it = 0; __atomic_load_n(f, __ATOMIC_ACQUIRE) != 1u; it++) {
    uint32_t gone = (it & 15) == 0 ? blocking_death(o, w, it) : 0;
    if (gone && __atomic_load_n(f, __ATOMIC_ACQUIRE) == 1u) break; /* it signalled, then died */
    if (gone || ((it & 255) == 0 && dl_host_now_s() - t0 > o->op.timeout_s)) {
      char who[300], dead[96] = "", why[1024];
      dl_devop_describe(&o->op, o->what, who, sizeof who);
      if (gone) dl_devop_gone_str(&o->op, gone, dead, sizeof dead);
      if (gone)
        snprintf(why, sizeof why, "%s: %s (step %d waited for '%s' from rank %d)", who, dead,
                 w->step, w->what, w->peer);
      else
        snprintf(why, sizeof why, "%s: step %d waited %.1f s for '%s' from rank %d (flag %d is %u, "
                 "wants 1); did every rank run this op?", who, w->step, o->op.timeout_s, w->what,
                 w->peer, w->flag, __atomic_load_n(f, __ATOMIC_ACQUIRE));
      pthread_mutex_lock(&o->op.mu);
      dl_devop_fail_locked(&o->op, why);
      pthread_mutex_unlock(&o->op.mu);
      return DL_ERR(gone ? DL_EPEER : DL_ETIMEOUT, "%s", why);
    }
    dl_host_pause(it);
  }
  __atomic_store_n(f, 0u, __ATOMIC_RELEASE);
  return DL_OK;
}

int dl_overlap_wait(dl_overlap_t *o, int flag, int peer, int step, const char *what,
                    dl_stream_t *s) {
  DL_TRY(flag_args(o, peer, flag, "dl_overlap_wait"));
  void *h;
  DL_TRY(stream_of(o, s, &h));
  if (o->op.dev_type == DL_META) return DL_OK;
  pthread_mutex_lock(&o->op.mu);
  const int idx = o->nlog;
  if (idx < DL_OVERLAP_MAX_WAITS) {
    wait_rec_t *w = &o->log[o->nlog++];
    w->flag = flag;
    w->peer = peer;
    w->step = step;
    w->stream = h;
    snprintf(w->what, sizeof w->what, "%s", what ? what : "flag");
  }
  const wait_rec_t rec = idx < DL_OVERLAP_MAX_WAITS ? o->log[idx] : (wait_rec_t){0};
  pthread_mutex_unlock(&o->op.mu);
  DL_CHECK_ARG(idx < DL_OVERLAP_MAX_WAITS, "dl_overlap_wait: more than %d waits in one run",
               DL_OVERLAP_MAX_WAITS);
  if (o->op.dev_type == DL_CPU) return wait_cpu(o, &rec);
#ifdef DL_WITH_CUDA
  return dl_overlap_cu_wait(o, &o->dflags[o->op.rank][flag], idx, h);
#endif
  return DL_EUNSUPPORTED;
}

/* A run that completed needs no peer any more: a peer that finished too and
 * exited is no failure (its death fails a run still waiting: wait_cpu, and
 * the cuda watchdog while a run is active), so only a recorded one counts. */
int dl_overlap_check(dl_overlap_t *o, dl_stream_t *s) {
  DL_TRY(live(o, "dl_overlap_check"));
  /* the watchdog fails a stuck run within the timeout (dl_devop_refused says so) */
  DL_TRY(dl_devop_wait_stream(&o->op, s, o->what, dl_devop_refused));
  return dl_devop_refused(&o->op);
}

/* ---- moving data --------------------------------------------------------------------- */

static int pair_args(const char *op, const dl_tensor_t *dst, const dl_tensor_t *src, dl_view_t *vd,
                     dl_view_t *vs) {
  DL_CHECK_ARG(dst && src, "%s: a tensor is NULL", op);
  DL_TRY(dl_tensor_arg(dst, "destination", dst->dev_type, dst->dev_index, op, vd));
  DL_TRY(dl_tensor_arg(src, "source", dst->dev_type, dst->dev_index, op, vs));
  DL_CHECK_ARG(vd->dtype == vs->dtype && vd->numel == vs->numel,
               "%s: destination (%s, %lld elements) and source (%s, %lld) differ", op,
               dl_dtype_name(vd->dtype), (long long)vd->numel, dl_dtype_name(vs->dtype),
               (long long)vs->numel);
  return DL_OK;
}

int dl_overlap_copy(dl_tensor_t *dst, const dl_tensor_t *src, int blocks, dl_stream_t *s) {
  dl_view_t vd, vs;
  DL_TRY(pair_args("overlap copy", dst, src, &vd, &vs));
  DL_CHECK_ARG(blocks >= 0, "overlap copy: %d blocks", blocks);
  const int64_t bytes = vd.numel * dl_dtype_size(vd.dtype);
  if (dst->dev_type == DL_META || bytes == 0) return DL_OK;
  if (dst->dev_type == DL_CPU) return dl_overlap_copy_cpu(vd.data, vs.data, bytes, blocks, NULL);
#ifdef DL_WITH_CUDA
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, dst->dev_index, &h));
  DL_TRY(dl_cuda_use(dst->dev_index));
  if (blocks > 0) return dl_overlap_copy_cuda(vd.data, vs.data, bytes, blocks, h);
  DL_CUDA_CHECK(cudaMemcpyAsync(vd.data, vs.data, (size_t)bytes, cudaMemcpyDeviceToDevice,
                                (cudaStream_t)h));
  return DL_OK;
#else
  return DL_ERR(DL_EUNSUPPORTED, "overlap copy on cuda needs a CUDA build");
#endif
}

int dl_overlap_reduce(dl_tensor_t *out, dl_tensor_t *const *srcs, int n, dl_stream_t *s) {
  DL_CHECK_ARG(srcs && n >= 1 && n <= DL_REDUCE_MAX_SRCS, "overlap reduce: %d sources (1 to %d)",
               n, DL_REDUCE_MAX_SRCS);
  dl_view_t vo, vs;
  char *ptrs[DL_REDUCE_MAX_SRCS];
  for (int i = 0; i < n; i++) {
    DL_TRY(pair_args("overlap reduce", out, srcs[i], &vo, &vs));
    ptrs[i] = vs.data;
  }
  DL_CHECK_ARG(vo.dtype == DL_F32 || vo.dtype == DL_F16 || vo.dtype == DL_BF16,
               "overlap reduce: dtype %s (f32, f16 or bf16)", dl_dtype_name(vo.dtype));
  if (out->dev_type == DL_META || vo.numel == 0) return DL_OK;
  if (out->dev_type == DL_CPU)
    return dl_reduce_cpu(vo.data, ptrs, n, vo.numel, vo.dtype, DL_RED_SUM, NULL);
#ifdef DL_WITH_CUDA
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, out->dev_index, &h));
  DL_TRY(dl_cuda_use(out->dev_index));
  return dl_reduce_cuda(vo.data, ptrs, n, vo.numel, vo.dtype, DL_RED_SUM, h);
#else
  return DL_ERR(DL_EUNSUPPORTED, "overlap reduce on cuda needs a CUDA build");
#endif
}
