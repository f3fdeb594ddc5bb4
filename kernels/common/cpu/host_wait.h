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

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Whether process pid (of this host) still runs: 0 once it exited, also
 * while it is a zombie its parent has not reaped yet (a rank that died
 * under a launcher busy elsewhere, or under none), which kill(pid, 0) alone
 * calls alive. pid <= 0 (unknown) counts as alive. */
static inline int dl_host_pid_alive(int pid) {
  if (pid <= 0) return 1;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[32], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces */
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

#endif
