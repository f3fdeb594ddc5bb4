/*
 * peers.c — whether the processes of a communicator's members still run, so
 * that every wait on a peer ends within a fraction of a second of its death
 * instead of at the timeout.
 *
 * Every member publishes its pid and host name through the store when the
 * communicator is made and waits for the others' (dl_comm_await_members,
 * before the backend's rendezvous: a member that gave up instead ends that
 * wait at once); dl_comm_peer_pid reads them. One watchdog thread
 * per process waits in poll() on a pidfd of every watched member's process,
 * which the kernel makes readable the moment the process exits (also while
 * it is a zombie its parent has not reaped: a rank that died under a
 * launcher busy elsewhere), and writes 1 + the member's rank into each word
 * that watches it. So it sees deaths in the order they happen: a survivor
 * that fails because of the death and exits a millisecond later is not
 * named instead. Where pidfd_open fails (kernels before 5.3) it looks every
 * TICK_MS (kill(pid, 0), and /proc/<pid>/stat, which shows a zombie).
 *
 * The waits poll those words: host waits with a load, kernels through
 * mapped memory (a word in pinned host memory mapped for the device), so no
 * wait makes a system call and no kernel needs the host to end it. Members
 * on other hosts are not seen (pid 0): their deaths end at the timeout.
 *
 * The thread runs while something is watched and is joined when the last
 * word goes (an eventfd wakes it for changes); an atexit hook stops it
 * before the CUDA runtime frees pinned words (it is registered after
 * CUDA's, so it runs first).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434 /* the same number on every architecture */
#endif

#include "comm_internal.h"
#include "common/cpu/host_wait.h"

enum { TICK_MS = 25 };

/* ---- who the members are ------------------------------------------------------ */

typedef struct proc_id {
  int32_t pid, pad;
  char host[64];
} proc_id_t;

static void this_proc(proc_id_t *p) {
  memset(p, 0, sizeof *p);
  p->pid = (int32_t)getpid();
  gethostname(p->host, sizeof p->host - 1);
}

int dl_comm_publish_pid(dl_comm_t *c) {
  proc_id_t me;
  this_proc(&me);
  char key[32];
  snprintf(key, sizeof key, "pid/%d", c->rank);
  return dl_comm_store_set(c, key, &me, sizeof me);
}

int dl_comm_await_members(dl_comm_t *c) {
  int *pids = calloc((size_t)c->size, sizeof *pids);
  if (!pids) return DL_ERR(DL_ENOMEM, "communicator: out of host memory");
  proc_id_t me, them;
  this_proc(&me);
  char key[DL_COMM_NAME + 32];
  int rc = DL_OK;
  for (int r = 0; r < c->size && rc == DL_OK; r++) {
    if (r == c->rank) continue;
    snprintf(key, sizeof key, "%s/pid/%d", c->name, r);
    int64_t len = 0;
    rc = dl_store_get(c->store, key, &them, sizeof them, &len);
    if (rc == DL_ETIMEOUT)
      rc = dl_error_context(rc, "rank %d did not come to make communicator '%s'", r, c->name);
    if (rc == DL_OK && len == (int64_t)sizeof them && strcmp(them.host, me.host) == 0) pids[r] = them.pid;
  }
  if (rc < 0) {
    free(pids);
    return rc;
  }
  free(c->pids);
  c->pids = pids;
  return DL_OK;
}

int dl_comm_peer_pid(dl_comm_t *c, int rank) {
  /* a communicator of one rank has no peers and published nothing */
  if (!c || !c->store || c->size < 2 || rank < 0 || rank >= c->size) return 0;
  if (!c->pids) {
    int *pids = calloc((size_t)c->size, sizeof *pids);
    if (!pids) return 0;
    proc_id_t me, them;
    this_proc(&me);
    char key[32];
    for (int r = 0; r < c->size; r++) {
      snprintf(key, sizeof key, "pid/%d", r);
      /* published before the rendezvous that made c, so there: a failure
       * only leaves the member unknown (never seen to die) */
      if (dl_comm_store_get(c, key, &them, sizeof them) == DL_OK && strcmp(them.host, me.host) == 0)
        pids[r] = them.pid;
      else
        dl_clear_error();
    }
    c->pids = pids;
  }
  return c->pids[rank];
}

/* ---- the watchdog ---------------------------------------------------------------- */

typedef struct entry {
  uint32_t *word;
  int n;
  int32_t *pids; /* member r's process (0: unknown or this one) */
} entry_t;

/* A watched process: its pidfd (-1: none, looked at each tick instead). */
typedef struct proc {
  int32_t pid;
  int fd;
  int dead;
} proc_t;

static struct {
  pthread_mutex_t mu;
  entry_t *list;
  int n, cap;
  proc_t *procs; /* every pid some entry watches, each once */
  int nprocs, capprocs;
  int wake;      /* eventfd: a write ends the thread's poll (a change, a stop) */
  pthread_t thread;
  int running, hooked;
  unsigned gen; /* a thread runs while gen is what it was at its start */
} dog = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = -1};

static void wake_thread(void) {
  const uint64_t one = 1;
  if (dog.wake >= 0 && write(dog.wake, &one, sizeof one) < 0) { /* a full counter wakes it too */
  }
}

/* The processes every entry still waiting for a death watches, each with
 * its pidfd (opened once: readable from the moment the process exits, also
 * while it is a zombie); those no entry needs are closed. mu held. */
static void sync_procs(void) {
  int keep = 0;
  for (int k = 0; k < dog.nprocs; k++) {
    int used = 0;
    for (int i = 0; i < dog.n && !used; i++)
      for (int r = 0; r < dog.list[i].n && !used; r++) used = dog.list[i].pids[r] == dog.procs[k].pid;
    if (used) dog.procs[keep++] = dog.procs[k];
    else if (dog.procs[k].fd >= 0) close(dog.procs[k].fd);
  }
  dog.nprocs = keep;
  for (int i = 0; i < dog.n; i++)
    for (int r = 0; r < dog.list[i].n; r++) {
      const int32_t pid = dog.list[i].pids[r];
      int known = pid <= 0;
      for (int k = 0; k < dog.nprocs && !known; k++) known = dog.procs[k].pid == pid;
      if (known) continue;
      if (dog.nprocs == dog.capprocs) {
        int cap = dog.capprocs ? 2 * dog.capprocs : 16;
        proc_t *p = realloc(dog.procs, sizeof *p * (size_t)cap);
        if (!p) continue; /* not watched: it ends at the timeout */
        dog.procs = p;
        dog.capprocs = cap;
      }
      const int fd = (int)syscall(SYS_pidfd_open, pid, 0);
      dog.procs[dog.nprocs++] = (proc_t){pid, fd, fd < 0 && errno == ESRCH};
    }
}

/* Every entry that watches a dead process: its word := 1 + that member's
 * rank (the lowest of several dead in one look: they died within one wake
 * of this thread). mu held. */
static void mark(void) {
  for (int i = 0; i < dog.n; i++) {
    entry_t *e = &dog.list[i];
    if (__atomic_load_n(e->word, __ATOMIC_RELAXED)) continue;
    for (int r = 0; r < e->n; r++) {
      int dead = 0;
      for (int k = 0; k < dog.nprocs && !dead; k++) dead = dog.procs[k].pid == e->pids[r] && dog.procs[k].dead;
      if (dead) {
        __atomic_store_n(e->word, (uint32_t)r + 1, __ATOMIC_RELEASE);
        break;
      }
    }
  }
}

/* Wait for a death (pidfds: woken at once; the others looked at every
 * TICK_MS), or a change. Deaths are recorded as the thread sees them, so
 * a peer that dies after it saw the first is not named instead. */
static void *watch_main(void *arg) {
  const unsigned gen = (unsigned)(uintptr_t)arg;
  struct pollfd *pf = NULL;
  int cap = 0;
  pthread_mutex_lock(&dog.mu);
  while (dog.gen == gen) {
    sync_procs();
    if (cap < dog.nprocs + 1) {
      struct pollfd *q = realloc(pf, sizeof *q * (size_t)(dog.nprocs + 1));
      if (q) {
        pf = q;
        cap = dog.nprocs + 1;
      }
    }
    int n = 0;
    if (cap > 0) pf[n++] = (struct pollfd){dog.wake, POLLIN, 0};
    for (int k = 0; k < dog.nprocs && n < cap; k++)
      if (dog.procs[k].fd >= 0 && !dog.procs[k].dead) pf[n++] = (struct pollfd){dog.procs[k].fd, POLLIN, 0};
    pthread_mutex_unlock(&dog.mu);
    const int ready = n > 0 ? poll(pf, (nfds_t)n, TICK_MS) : (usleep(TICK_MS * 1000), 0);
    pthread_mutex_lock(&dog.mu);
    if (dog.gen != gen) break;
    if (ready > 0 && (pf[0].revents & POLLIN)) {
      uint64_t v;
      if (read(dog.wake, &v, sizeof v) < 0) { /* nothing to drain */
      }
    }
    /* the processes whose pidfd fired (only this thread changes procs, so
     * the fds are those polled), and those without a pidfd */
    for (int i = 1; i < n && ready > 0; i++)
      if (pf[i].revents)
        for (int k = 0; k < dog.nprocs; k++)
          if (dog.procs[k].fd == pf[i].fd) dog.procs[k].dead = 1;
    for (int k = 0; k < dog.nprocs; k++)
      if (dog.procs[k].fd < 0 && !dog.procs[k].dead && !dl_host_pid_alive(dog.procs[k].pid))
        dog.procs[k].dead = 1;
    mark();
  }
  pthread_mutex_unlock(&dog.mu);
  free(pf);
  return NULL;
}

/* Tell the thread to end; mu held. Returns whether one ran (then join
 * *thread with mu released). */
static int stop_locked(pthread_t *thread) {
  if (!dog.running) return 0;
  dog.gen++;
  dog.running = 0;
  *thread = dog.thread;
  wake_thread();
  return 1;
}

static void stop_at_exit(void) {
  pthread_t t;
  pthread_mutex_lock(&dog.mu);
  const int ran = stop_locked(&t);
  pthread_mutex_unlock(&dog.mu);
  if (ran) pthread_join(t, NULL);
}

int dl_comm_watch(dl_comm_t *c, uint32_t *word) {
  DL_CHECK_ARG(c && word, "dl_comm_watch: comm and word must be given");
  __atomic_store_n(word, 0u, __ATOMIC_RELEASE);
  if (!c->store || c->size < 2) return DL_OK;
  int32_t *pids = calloc((size_t)c->size, sizeof *pids);
  if (!pids) return DL_ERR(DL_ENOMEM, "watching the peers: out of host memory");
  int any = 0;
  for (int r = 0; r < c->size; r++) {
    pids[r] = r == c->rank ? 0 : dl_comm_peer_pid(c, r);
    any |= pids[r] > 0;
  }
  if (!any) { /* every peer elsewhere (or unknown): nothing to look at */
    free(pids);
    return DL_OK;
  }
  pthread_mutex_lock(&dog.mu);
  int rc = DL_OK;
  if (dog.n == dog.cap) {
    int cap = dog.cap ? 2 * dog.cap : 16;
    entry_t *l = realloc(dog.list, sizeof *l * (size_t)cap);
    if (l) {
      dog.list = l;
      dog.cap = cap;
    } else {
      rc = DL_ERR(DL_ENOMEM, "watching the peers: out of host memory");
    }
  }
  if (rc == DL_OK) dog.list[dog.n++] = (entry_t){word, c->size, pids};
  if (rc == DL_OK && dog.wake < 0 && (dog.wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
    rc = DL_ERR(DL_EIO, "watching the peers: eventfd: %s", strerror(errno));
  if (rc < 0 && dog.n > 0 && dog.list[dog.n - 1].word == word) dog.n--;
  if (rc == DL_OK && dog.running) wake_thread(); /* it picks the new pids up now */
  if (rc == DL_OK && !dog.running) {
    if (!dog.hooked) dog.hooked = atexit(stop_at_exit) == 0;
    int e = pthread_create(&dog.thread, NULL, watch_main, (void *)(uintptr_t)dog.gen);
    if (e) {
      dog.n--;
      rc = DL_ERR(DL_ENOMEM, "watching the peers: cannot start a thread: %s", strerror(e));
    } else {
      dog.running = 1;
    }
  }
  pthread_mutex_unlock(&dog.mu);
  if (rc < 0) free(pids);
  return rc;
}

void dl_comm_unwatch(uint32_t *word) {
  if (!word) return;
  pthread_t t;
  int ran = 0;
  pthread_mutex_lock(&dog.mu);
  for (int i = 0; i < dog.n; i++)
    if (dog.list[i].word == word) {
      free(dog.list[i].pids);
      dog.list[i] = dog.list[--dog.n];
      break;
    }
  if (dog.n == 0) {
    ran = stop_locked(&t);
    free(dog.list);
    dog.list = NULL;
    dog.cap = 0;
  }
  pthread_mutex_unlock(&dog.mu);
  if (!ran) return;
  pthread_join(t, NULL);
  pthread_mutex_lock(&dog.mu);
  if (dog.n == 0 && !dog.running) { /* no new thread took over meanwhile */
    for (int k = 0; k < dog.nprocs; k++)
      if (dog.procs[k].fd >= 0) close(dog.procs[k].fd);
    free(dog.procs);
    dog.procs = NULL;
    dog.nprocs = dog.capprocs = 0;
  }
  pthread_mutex_unlock(&dog.mu);
}

int dl_comm_gone_str(dl_comm_t *c, uint32_t gone, char *buf, size_t len) {
  const int r = (int)gone - 1, wr = dl_comm_world_rank(c, r);
  if (wr == r)
    return snprintf(buf, len, "rank %d (pid %d) has exited", r, dl_comm_peer_pid(c, r));
  return snprintf(buf, len, "rank %d (pid %d) has exited (rank %d of comm '%s')", wr,
                  dl_comm_peer_pid(c, r), r, c->name);
}
