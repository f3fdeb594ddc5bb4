/*
 * peers.c — whether the processes of a communicator's members still run, so
 * that every wait on a peer ends within a fraction of a second of its death
 * instead of at the timeout.
 *
 * Every member publishes its pid and host name through the store when the
 * communicator is made (before the backend's rendezvous, so all are there
 * once it is done); dl_comm_peer_pid reads them (once). One watchdog thread
 * per process looks at the watched members' processes every TICK_MS
 * (kill(pid, 0), and /proc/<pid>/stat for a zombie its parent has not
 * reaped yet, which kill calls alive: a rank that died under a launcher busy
 * elsewhere) and writes 1 + the member's rank into each word that watches
 * it. The waits poll those words: host waits with a load, kernels through
 * mapped memory (a word in pinned host memory mapped for the device), so no
 * wait makes a system call and no kernel needs the host to end it. Members
 * on other hosts are not seen (pid 0): their deaths end at the timeout.
 *
 * The thread runs while something is watched and is joined when the last
 * word goes; an atexit hook stops it before the CUDA runtime frees pinned
 * words (it is registered after CUDA's, so it runs first).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int dl_comm_peer_pid(dl_comm_t *c, int rank) {
  if (!c || !c->store || rank < 0 || rank >= c->size) return 0;
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

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  entry_t *list;
  int n, cap;
  pthread_t thread;
  int running, hooked;
  unsigned gen; /* a thread runs while gen is what it was at its start */
} dog = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* One look at every watched process (each once, however many words watch
 * it); mu held. */
static void tick(void) {
  int32_t dead[64];
  int ndead = 0;
  int32_t alive[64];
  int nalive = 0;
  for (int i = 0; i < dog.n; i++) {
    entry_t *e = &dog.list[i];
    if (__atomic_load_n(e->word, __ATOMIC_RELAXED)) continue;
    for (int r = 0; r < e->n; r++) {
      const int32_t pid = e->pids[r];
      if (pid <= 0) continue;
      int known = -1; /* 1 alive, 0 dead, -1 not looked at in this tick */
      for (int k = 0; k < ndead && known < 0; k++) known = dead[k] == pid ? 0 : -1;
      for (int k = 0; k < nalive && known < 0; k++) known = alive[k] == pid ? 1 : -1;
      if (known < 0) {
        known = dl_host_pid_alive(pid);
        if (known && nalive < 64) alive[nalive++] = pid;
        if (!known && ndead < 64) dead[ndead++] = pid;
      }
      if (!known) {
        __atomic_store_n(e->word, (uint32_t)r + 1, __ATOMIC_RELEASE);
        break;
      }
    }
  }
}

static void *watch_main(void *arg) {
  const unsigned gen = (unsigned)(uintptr_t)arg;
  pthread_mutex_lock(&dog.mu);
  while (dog.gen == gen) {
    tick();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TICK_MS * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&dog.cv, &dog.mu, &ts);
  }
  pthread_mutex_unlock(&dog.mu);
  return NULL;
}

/* Tell the thread to end; mu held. Returns whether one ran (then join
 * *thread with mu released). */
static int stop_locked(pthread_t *thread) {
  if (!dog.running) return 0;
  dog.gen++;
  dog.running = 0;
  *thread = dog.thread;
  pthread_cond_broadcast(&dog.cv);
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
  if (ran) pthread_join(t, NULL);
}

int dl_comm_gone_str(dl_comm_t *c, uint32_t gone, char *buf, size_t len) {
  const int r = (int)gone - 1, wr = dl_comm_world_rank(c, r);
  if (wr == r)
    return snprintf(buf, len, "rank %d (pid %d) has exited", r, dl_comm_peer_pid(c, r));
  return snprintf(buf, len, "rank %d (pid %d) has exited (rank %d of comm '%s')", wr,
                  dl_comm_peer_pid(c, r), r, c->name);
}
