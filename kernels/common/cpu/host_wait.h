/*
 * host_wait.h — the pause of a host loop that polls a flag in shared host
 * memory: the CPU twins' flag waits (signal.c, allreduce.c) and the
 * shared-memory communicator (core/comm/comm_shm.c). Spin first (a peer about to
 * write costs no wake-up), then yield (ranks may outnumber cores, as on a
 * 2-core CI machine), then sleep: 20 us naps, 200 us once the wait is long.
 * (Loops that poll the GPU use dl_wait_pause in the core, timed, not counted.)
 */
#ifndef DL_HOST_WAIT_H
#define DL_HOST_WAIT_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

static inline double dl_host_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Between polls number iter (0, 1, ...) of one wait. */
static inline void dl_host_pause(int64_t iter) {
  if (iter < 256) return;
  if (iter < 2048) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, iter < 20000 ? 20000 : 200000};
  nanosleep(&ts, NULL);
}

#endif
