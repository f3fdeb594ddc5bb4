/*
 * error.c — the per-thread last error, and the library's identity.
 *
 * Every fallible function returns a negative DL_E* code and leaves a message
 * here; the Lua bindings read it with dl_last_error() and raise it. The
 * message ends with " at file:line" of the place that detected the problem.
 */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum { DL_ERRBUF = 2048 };
static __thread char errbuf[DL_ERRBUF];
static __thread int errcode;

static const char *basename_of(const char *path) {
  const char *p = strrchr(path, '/');
  if (!p) return path;
  /* keep one directory, e.g. "core/tensor.c" */
  for (const char *q = p - 1; q > path; q--)
    if (*q == '/') return q + 1;
  return path;
}

int dl_set_error(int code, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(errbuf, DL_ERRBUF, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (n < DL_ERRBUF) snprintf(errbuf + n, DL_ERRBUF - n, ", at %s:%d", basename_of(file), line);
  errcode = code;
  return code;
}

int dl_error_context(int code, const char *fmt, ...) {
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  char old[DL_ERRBUF];
  memcpy(old, errbuf, DL_ERRBUF);
  snprintf(errbuf, DL_ERRBUF, "%s: %.*s", prefix, (int)(DL_ERRBUF - strlen(prefix) - 3), old);
  errcode = code;
  return code;
}

const char *dl_last_error(void) { return errcode ? errbuf : ""; }
int dl_last_error_code(void) { return errcode; }
void dl_clear_error(void) {
  errcode = 0;
  errbuf[0] = 0;
}

int dl_abi_version(void) { return DL_ABI_VERSION; }

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
