/*
 * comm_shm.c — the CPU communicator: the processes of one host meet in one
 * POSIX shared-memory segment, /distlab-<job>-<comm> (its layout:
 * comm_shm.h).
 *
 * Collectives move data in chunks through the slots, one barrier per chunk:
 * every rank writes its chunk into half (b & 1) of its own slot, where b is
 * the number of barriers it has passed, passes barrier b+1, then reads the
 * peers' halves. Data written before barrier k+1 is read only before barrier
 * k+2, and the next write to the same half comes after barrier k+2, so one
 * barrier per chunk is enough, also across back-to-back ops. Barrier
 * counters only grow (a rank waits for every peer's counter to reach its
 * own), so no reset can race. Every rank reduces the slots in rank order, so
 * all ranks get bitwise identical results; bf16/fp16 accumulate in fp32.
 *
 * Each op's first chunk carries a signature (op, dtype, sizes, root); after
 * the first barrier every rank compares all of them, so mismatched calls
 * fail on every rank at once, cheaply, in every mode.
 *
 * Point-to-point goes through a mailbox per (src, dst) pair
 * (comm_shm_p2p.c).
 *
 * Waits spin, then yield, then sleep, and every millisecond or so check the
 * deadline, the abort record (a rank that failed says why), the word the
 * process's watchdog sets when a member's process is gone (peers.c), and
 * whether the awaited peer has freed the communicator. A rank that gives up
 * records how many barriers it had passed: a late rank that then passes a
 * barrier the other never passed fails too, rather than completing the op
 * against an abandoned one; any op started after the abort fails at once.
 * Rank 0 unlinks the segment's name once every rank has mapped it, so a job
 * that crashes later leaves nothing in /dev/shm.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_shm.h"
#include "common/cpu/host_wait.h"
#include "comm/reduce.h"

enum { SHM_MAGIC = 0x5d15ab01 };

static int64_t half_bytes(const shm_ctl_t *ctl) { return ctl->slot_bytes / 2; }
static char *slot(shm_t *m, int r, uint64_t parity) {
  return m->slots + r * m->ctl->slot_bytes + (int64_t)(parity & 1) * half_bytes(m->ctl);
}

static int64_t env_bytes(const char *name, int64_t dflt) {
  const char *e = getenv(name);
  long long v = e ? atoll(e) : 0;
  return v >= 4096 ? (int64_t)(v & ~(int64_t)63) : dflt;
}

/* ---- waiting ------------------------------------------------------------ */

static double now_s(void) { return dl_now_us() * 1e-6; }

/* A rank gave up on the communicator (its abort record): why, or DL_OK.
 * Every op looks before it starts and every wait while it waits, so no
 * rank starts an op on a communicator a peer abandoned. */
static int check_abort(dl_comm_t *c, const char *what) {
  shm_ctl_t *ctl = impl(c)->ctl;
  if (!__atomic_load_n(&ctl->aborted, __ATOMIC_ACQUIRE)) return DL_OK;
  c->failed = 1;
  /* `what` is this rank's own wait: "rank 0 gave up ... while waiting for rank 0" read as if
   * rank 0 waited for itself */
  return DL_ERR(DL_EPEER, "rank %d gave up on the communicator (this rank was %s): %s",
                ctl->abort_rank, what, ctl->abort_msg);
}

/* Why the wait on peer must stop now, or DL_OK: an abort, the peer freed
 * the communicator, or a member's process is gone (peers.c). */
static int check_peer(dl_comm_t *c, int peer, const char *what) {
  shm_ctl_t *ctl = impl(c)->ctl;
  DL_TRY(check_abort(c, what));
  const uint32_t gone = __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
  if (gone) {
    char who[160];
    dl_comm_gone_str(c, gone, who, sizeof who);
    return DL_ERR(DL_EPEER, "%s: %s", what, who);
  }
  if (peer >= 0 && peer != c->rank && __atomic_load_n(&ctl->left[peer], __ATOMIC_ACQUIRE))
    return DL_ERR(DL_EPEER, "%s: rank %d has freed the communicator (it left early)", what, peer);
  return DL_OK;
}

void dl_shm_wait_begin(dl_comm_t *c, waiter_t *w) {
  w->iter = 0;
  w->last_check = now_s();
  w->deadline = w->last_check + c->timeout_s;
}

/* The abort record and the peers' word are read every millisecond. */
int dl_shm_wait_step(dl_comm_t *c, waiter_t *w, int peer, const char *what) {
  dl_host_pause(w->iter++);
  if (w->iter % 64) return DL_OK;
  double t = now_s();
  if (t - w->last_check < 1e-3) return DL_OK;
  w->last_check = t;
  DL_TRY(check_peer(c, peer, what));
  if (t > w->deadline)
    return DL_ERR(DL_ETIMEOUT,
                  "timed out after %.1f s %s (rank %d is alive but did not get there: did it "
                  "call the same op, or is it stuck?)",
                  c->timeout_s, what, peer);
  return DL_OK;
}

static int wait_ge(dl_comm_t *c, const uint64_t *word, uint64_t target, int peer,
                   const char *what) {
  waiter_t w;
  dl_shm_wait_begin(c, &w);
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < target) {
    int rc = dl_shm_wait_step(c, &w, peer, what);
    /* a peer that arrived and then left has still arrived */
    if (rc < 0 && __atomic_load_n(word, __ATOMIC_ACQUIRE) >= target) return DL_OK;
    if (rc < 0) return rc;
  }
  return DL_OK;
}

static int barrier(dl_comm_t *c, const char *opname) {
  shm_t *m = impl(c);
  uint64_t t = ++m->bar;
  __atomic_store_n(&m->ctl->arrive[c->rank].v, t, __ATOMIC_RELEASE);
  char what[96];
  for (int j = 0; j < c->size; j++) {
    if (j == c->rank) continue;
    snprintf(what, sizeof what, "waiting for rank %d at barrier %llu of %s", j,
             (unsigned long long)t, opname);
    DL_TRY(wait_ge(c, &m->ctl->arrive[j].v, t, j, what));
  }
  /* everyone arrived, but one may have given up before it passed this
   * barrier (it timed out waiting for a late peer): the op is void, or a
   * late rank would complete it against an abandoned one. A rank that gave
   * up after it passed here (at a later op) leaves this exchange whole. */
  shm_ctl_t *ctl = m->ctl;
  if (__atomic_load_n(&ctl->aborted, __ATOMIC_ACQUIRE) && ctl->abort_passed < t) {
    c->failed = 1;
    return DL_ERR(DL_EPEER, "rank %d gave up on the communicator before barrier %llu of %s: %s",
                  ctl->abort_rank, (unsigned long long)t, opname, ctl->abort_msg);
  }
  m->passed = t;
  return DL_OK;
}

/* ---- signatures --------------------------------------------------------- */

static void sig_write(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  shm_sig_t s = {call->op, call->red, call->op == DL_OP_BARRIER ? -1 : call->in.dtype,
                 call->peer, call->in.numel, call->out.numel};
  if (call->op == DL_OP_BROADCAST) s.n_in = 0;
  if (call->op == DL_OP_ALL_TO_ALLV) s.n_in = s.n_out = 0; /* sizes may differ; counts are checked */
  m->ctl->sig[m->bar & 1][c->rank] = s;
}

static int sig_check(dl_comm_t *c) {
  shm_t *m = impl(c);
  const shm_sig_t *sg = m->ctl->sig[(m->bar - 1) & 1];
  const shm_sig_t *me = &sg[c->rank];
  for (int j = 0; j < c->size; j++) {
    const shm_sig_t *o = &sg[j];
    if (memcmp(o, me, sizeof *me) == 0) continue;
    char a[160], b[160], d[200];
    dl_comm_call_str(me->op, me->red, me->dtype, me->root, me->n_in, me->n_out, a, sizeof a);
    dl_comm_call_str(o->op, o->red, o->dtype, o->root, o->n_in, o->n_out, b, sizeof b);
    dl_comm_diff(a, b, d, sizeof d);
    return DL_ERR(DL_EINVAL, "mismatched calls: rank %d calls %s but rank %d calls %s (differs: %s)",
                  c->rank, a, j, b, d);
  }
  return DL_OK;
}

/* ---- collectives -------------------------------------------------------- */

/* The first barrier of an op also checks the signatures. */
static int chunk_barrier(dl_comm_t *c, const char *opname, int *first) {
  DL_TRY(barrier(c, opname));
  if (*first) {
    *first = 0;
    DL_TRY(sig_check(c));
  }
  return DL_OK;
}

static int all_reduce(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  int esz = dl_dtype_size(call->in.dtype), first = 1;
  int64_t per = half_bytes(m->ctl) / esz, n = call->in.numel, off = 0;
  char *srcs[SHM_MAX];
  do {
    int64_t k = min64(per, n - off);
    memcpy(slot(m, c->rank, m->bar), call->in.data + off * esz, (size_t)(k * esz));
    if (first) sig_write(c, call);
    DL_TRY(chunk_barrier(c, "all_reduce", &first));
    for (int j = 0; j < c->size; j++) srcs[j] = slot(m, j, m->bar - 1);
    DL_TRY(dl_reduce_cpu(call->out.data + off * esz, srcs, c->size, k, call->in.dtype, call->red, NULL));
    off += k;
  } while (off < n);
  return DL_OK;
}

static int all_gather(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  int esz = dl_dtype_size(call->in.dtype), first = 1;
  int64_t per = half_bytes(m->ctl) / esz, n = call->in.numel, off = 0;
  do {
    int64_t k = min64(per, n - off);
    memcpy(slot(m, c->rank, m->bar), call->in.data + off * esz, (size_t)(k * esz));
    if (first) sig_write(c, call);
    DL_TRY(chunk_barrier(c, "all_gather", &first));
    for (int j = 0; j < c->size; j++)
      memcpy(call->out.data + (j * n + off) * esz, slot(m, j, m->bar - 1), (size_t)(k * esz));
    off += k;
  } while (off < n);
  return DL_OK;
}

static int reduce_scatter(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  int esz = dl_dtype_size(call->in.dtype), first = 1;
  int64_t per = half_bytes(m->ctl) / ((int64_t)esz * c->size), n = call->out.numel, off = 0;
  char *srcs[SHM_MAX];
  do {
    int64_t k = min64(per, n - off);
    char *mine = slot(m, c->rank, m->bar);
    for (int j = 0; j < c->size; j++)
      memcpy(mine + j * k * esz, call->in.data + (j * n + off) * esz, (size_t)(k * esz));
    if (first) sig_write(c, call);
    DL_TRY(chunk_barrier(c, "reduce_scatter", &first));
    for (int j = 0; j < c->size; j++) srcs[j] = slot(m, j, m->bar - 1) + c->rank * k * esz;
    DL_TRY(dl_reduce_cpu(call->out.data + off * esz, srcs, c->size, k, call->in.dtype, call->red, NULL));
    off += k;
  } while (off < n);
  return DL_OK;
}

static int broadcast(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  int esz = dl_dtype_size(call->out.dtype), first = 1, root = call->peer;
  int64_t per = half_bytes(m->ctl) / esz, n = call->out.numel, off = 0;
  do {
    int64_t k = min64(per, n - off);
    if (c->rank == root)
      memcpy(slot(m, root, m->bar), call->out.data + off * esz, (size_t)(k * esz));
    if (first) sig_write(c, call);
    DL_TRY(chunk_barrier(c, "broadcast", &first));
    if (c->rank != root)
      memcpy(call->out.data + off * esz, slot(m, root, m->bar - 1), (size_t)(k * esz));
    off += k;
  } while (off < n);
  return DL_OK;
}

/* Counts go out with the first round's data; every rank checks the whole
 * matrix (what i sends to j is what j expects from i), so all fail together. */
static int all_to_allv(dl_comm_t *c, const dl_comm_call_t *call) {
  shm_t *m = impl(c);
  int n = c->size, me = c->rank, esz = dl_dtype_size(call->in.dtype), first = 1;
  int64_t per = half_bytes(m->ctl) / ((int64_t)esz * n), sdisp[SHM_MAX], rdisp[SHM_MAX];
  for (int j = 0; j < n; j++) {
    sdisp[j] = j ? sdisp[j - 1] + call->send_counts[j - 1] : 0;
    rdisp[j] = j ? rdisp[j - 1] + call->recv_counts[j - 1] : 0;
    m->ctl->sendc[m->bar & 1][me][j] = call->send_counts[j];
    m->ctl->recvc[m->bar & 1][me][j] = call->recv_counts[j];
  }
  int64_t rounds = 1;
  for (int64_t t = 0; t < rounds; t++) {
    char *mine = slot(m, me, m->bar);
    for (int j = 0; j < n; j++) {
      int64_t k = min64(per, call->send_counts[j] - t * per);
      if (k > 0) memcpy(mine + j * per * esz, call->in.data + (sdisp[j] + t * per) * esz,
                        (size_t)(k * esz));
    }
    if (first) {
      sig_write(c, call);
      DL_TRY(chunk_barrier(c, dl_comm_op_name(call->op), &first));
      uint64_t p = (m->bar - 1) & 1;
      for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
          int64_t sent = m->ctl->sendc[p][i][j], want = m->ctl->recvc[p][j][i];
          if (sent != want)
            return DL_ERR(DL_EINVAL,
                          "mismatched counts: rank %d sends %lld elements to rank %d, which "
                          "expects %lld",
                          i, (long long)sent, j, (long long)want);
          m->mat[i * n + j] = sent;
          if ((sent + per - 1) / per > rounds) rounds = (sent + per - 1) / per;
        }
    } else {
      DL_TRY(barrier(c, dl_comm_op_name(call->op)));
    }
    for (int j = 0; j < n; j++) {
      int64_t k = min64(per, m->mat[j * n + me] - t * per);
      if (k > 0) memcpy(call->out.data + (rdisp[j] + t * per) * esz,
                        slot(m, j, m->bar - 1) + me * per * esz, (size_t)(k * esz));
    }
  }
  return DL_OK;
}

/* ---- backend ------------------------------------------------------------ */

static int shm_op(dl_comm_t *c, const dl_comm_call_t *call) {
  switch (call->op) {
  case DL_OP_ALL_REDUCE: return all_reduce(c, call);
  case DL_OP_ALL_GATHER: return all_gather(c, call);
  case DL_OP_REDUCE_SCATTER: return reduce_scatter(c, call);
  case DL_OP_ALL_TO_ALL:
  case DL_OP_ALL_TO_ALLV: return all_to_allv(c, call);
  case DL_OP_BROADCAST: return broadcast(c, call);
  case DL_OP_SEND:
  case DL_OP_RECV:
    DL_TRY(dl_shm_p2p_queue(c, call->op == DL_OP_SEND, call->op == DL_OP_SEND ? &call->in : &call->out,
                     call->peer));
    return c->in_group ? DL_OK : dl_shm_p2p_run(c);
  case DL_OP_BARRIER: {
    int first = 1;
    sig_write(c, call);
    return chunk_barrier(c, "barrier", &first);
  }
  default: return DL_ERR(DL_EUNSUPPORTED, "shm: op %d", call->op);
  }
}

static int shm_run(dl_comm_t *c, const dl_comm_call_t *call) {
  DL_TRY(check_abort(c, "this rank started the op"));
  return shm_op(c, call);
}

static int shm_watch(dl_comm_t *c) {
  shm_t *m = impl(c);
  return m && m->ctl ? check_abort(c, "this rank waited for the store") : DL_OK;
}

static int shm_group_start(dl_comm_t *c) { return DL_OK; }
static int shm_group_end(dl_comm_t *c) { return dl_shm_p2p_run(c); }
static int shm_synchronize(dl_comm_t *c, dl_stream_t *s) { return DL_OK; }

static void shm_abort(dl_comm_t *c, const char *why) {
  shm_ctl_t *ctl = impl(c)->ctl;
  int32_t none = -1;
  if (!__atomic_compare_exchange_n(&ctl->abort_rank, &none, c->rank, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  snprintf(ctl->abort_msg, sizeof ctl->abort_msg, "%s", why);
  ctl->abort_passed = impl(c)->passed;
  __atomic_store_n(&ctl->aborted, 1, __ATOMIC_RELEASE);
}

static void shm_destroy(dl_comm_t *c) {
  shm_t *m = impl(c);
  if (m->ctl) {
    __atomic_store_n(&m->ctl->left[c->rank], 1, __ATOMIC_RELEASE);
    munmap(m->ctl, m->map_bytes);
  }
  free(m->mat);
  free(m->ops);
  free(m);
  c->impl = NULL;
}

static int shm_map(shm_t *m, int fd, size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return DL_ERR(DL_EIO, "mmap of %s (%zu bytes): %s", m->name, bytes,
                                     strerror(errno));
  m->ctl = p;
  m->map_bytes = bytes;
  return DL_OK;
}

static int shm_attach(dl_comm_t *c, shm_t *m) {
  int64_t slot_b = env_bytes("DISTLAB_SHM_SLOT_BYTES", 4 << 20);
  int64_t box_b = env_bytes("DISTLAB_SHM_BOX_BYTES", 1 << 20);
  size_t ctl_b = (sizeof(shm_ctl_t) + 4095) & ~(size_t)4095;
  if (c->rank == 0) {
    size_t bytes = ctl_b + (size_t)c->size * slot_b + (size_t)c->size * c->size * box_b;
    int fd = shm_open(m->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) { /* left by a crashed job with this id */
      shm_unlink(m->name);
      fd = shm_open(m->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) return DL_ERR(DL_EIO, "shm_open(%s): %s", m->name, strerror(errno));
    int rc = ftruncate(fd, (off_t)bytes) == 0
                 ? shm_map(m, fd, bytes)
                 : DL_ERR(DL_EIO, "ftruncate(%s, %zu): %s (is /dev/shm full?)", m->name, bytes,
                          strerror(errno));
    close(fd);
    DL_TRY(rc);
    m->ctl->size = c->size;
    m->ctl->slot_bytes = slot_b;
    m->ctl->box_bytes = box_b;
    m->ctl->abort_rank = -1;
    __atomic_store_n(&m->ctl->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    DL_TRY(dl_comm_store_set(c, "shm", "", 0));
  } else {
    char key[200];
    snprintf(key, sizeof key, "%s/shm", c->name);
    DL_TRY(dl_store_wait(c->store, key)); /* rank 0 has created it */
    int fd = shm_open(m->name, O_RDWR, 0600);
    if (fd < 0) return DL_ERR(DL_EIO, "shm_open(%s): %s", m->name, strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? shm_map(m, fd, (size_t)st.st_size)
                                 : DL_ERR(DL_EIO, "fstat(%s): %s", m->name, strerror(errno));
    close(fd);
    DL_TRY(rc);
    if (m->ctl->magic != SHM_MAGIC || m->ctl->size != c->size)
      return DL_ERR(DL_EPEER, "%s holds a communicator of %d ranks, not %d", m->name,
                    m->ctl->size, c->size);
  }
  m->slots = (char *)m->ctl + ctl_b;
  m->boxes = m->slots + c->size * m->ctl->slot_bytes;
  m->mat = malloc(sizeof(int64_t) * (size_t)c->size * c->size);
  if (!m->mat) return DL_ERR(DL_ENOMEM, "shm communicator: out of memory");
  return barrier(c, "setup (every rank maps the segment)");
}

static int shm_init(dl_comm_t *c) {
  DL_CHECK_ARG(c->size <= SHM_MAX, "the shm backend takes at most %d ranks (asked for %d)",
               SHM_MAX, c->size);
  shm_t *m = calloc(1, sizeof *m);
  if (!m) return DL_ERR(DL_ENOMEM, "shm communicator: out of memory");
  c->impl = m;
  snprintf(m->name, sizeof m->name, "/distlab-%s-%s", dl_store_job(c->store), c->name);
  int rc = shm_attach(c, m);
  if (c->rank == 0) shm_unlink(m->name); /* all mapped it (or setup failed): name not needed */
  if (rc < 0) {
    if (m->ctl) shm_abort(c, dl_last_error());
    shm_destroy(c);
  }
  return rc;
}

const dl_comm_backend_t dl_comm_shm_backend = {
    .name = "shm",
    .init = shm_init,
    .run = shm_run,
    .group_start = shm_group_start,
    .group_end = shm_group_end,
    .synchronize = shm_synchronize,
    .abort = shm_abort,
    .watch = shm_watch,
    .destroy = shm_destroy,
};
