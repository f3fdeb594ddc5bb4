/*
 * error.c — the per-thread last error.
 *
 * Every fallible function returns a negative DL_E* code and leaves a message
 * here; the Lua bindings read it with dl_last_error() and raise it. The
 * message ends with " at file:line" of the place that detected the problem.
 * (The clock, the pause of host waits, timeouts and teardown tracing are in
 * clock.c.)
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { DL_ERRBUF = 2048 };
static __thread char errbuf[DL_ERRBUF];
static __thread int errcode;

static const char *basename_of(const char *path) {
  const char *p = strrchr(path, '/');
  if (!p) return path;
  /* keep one directory, e.g. "core/mem/tensor.c" */
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
