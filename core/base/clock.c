/*
 * clock.c — host time and how host loops wait: the monotonic clock since the
 * library loaded (dl_now_us), the pause between polls of the GPU, the default
 * timeout of every blocking wait, and teardown tracing.
 */
#include <sched.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

static double t0_us = -1;
double dl_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double now = ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
  if (t0_us < 0) t0_us = now;
  return now - t0_us;
}
void dl_wait_pause(double since_us) {
  const double waited = dl_now_us() - since_us;
  if (waited < 100) return;
  if (waited < 2000) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 50000};
  nanosleep(&ts, NULL);
}

double dl_timeout_s(void) {
  static double t = -1;
  if (t < 0) {
    const char *e = getenv("DISTLAB_TIMEOUT");
    double v = e ? atof(e) : 0;
    t = v > 0 ? v : 120.0;
  }
  return t;
}

int dl_env_int(const char *fn, const char *name, long dflt, long lo, long hi, long *out) {
  const char *e = getenv(name);
  *out = dflt;
  if (!e || !*e) return DL_OK;
  char *end;
  errno = 0;
  long v = strtol(e, &end, 10);
  if (errno || *end || v < lo || v > hi)
    return DL_ERR(DL_EINVAL, "%s: %s=%s (an integer from %ld to %ld)", fn, name, e, lo, hi);
  *out = v;
  return DL_OK;
}

void dl_teardown_trace(const char *what, const void *p) {
  static int on = -1;
  if (on < 0) on = getenv("DISTLAB_TRACE_TEARDOWN") != NULL;
  if (on) fprintf(stderr, "distlab teardown [%.6f] %s %p\n", dl_now_us() * 1e-6, what, p);
}

__attribute__((constructor)) static void dl_clock_init(void) { (void)dl_now_us(); }
