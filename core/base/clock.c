/*
 * clock.c — host time and how host loops wait: the monotonic clock since the
 * library loaded (dl_now_us), the pause between polls of the GPU, the default
 * timeout of every blocking wait, and teardown tracing.
 */
#include <sched.h>
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

void dl_teardown_trace(const char *what, const void *p) {
  static int on = -1;
  if (on < 0) on = getenv("DISTLAB_TRACE_TEARDOWN") != NULL;
  if (on) fprintf(stderr, "distlab teardown [%.6f] %s %p\n", dl_now_us() * 1e-6, what, p);
}

__attribute__((constructor)) static void dl_clock_init(void) { (void)dl_now_us(); }
