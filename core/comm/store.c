/*
 * store.c — the bootstrap key-value store: rank 0 serves it over TCP
 * (store_server.c), every rank (rank 0 too) is a client (this file).
 *
 * Ranks rendezvous through it before any communicator exists (NCCL unique
 * ids, shared-memory names, CUDA IPC handles, debug-mode op signatures), so
 * it is what a torchrun/Slurm-style launch on several hosts needs: rank 0
 * listens on MASTER_ADDR:MASTER_PORT, the others connect.
 *
 * GET and WAIT are answered only once the key exists (the protocol:
 * store_internal.h); the client bounds the wait with its timeout and, when
 * it expires, drops the connection (the server forgets the waiter with it)
 * and reconnects on its next call, so a late answer can never be read as
 * the answer to another request. Keys are prefixed with "<job>/" so jobs
 * sharing a port cannot mix.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store_internal.h"

/* ---- client ------------------------------------------------------------- */

static double now_s(void) { return dl_now_us() * 1e-6; }

int dl_store_send_all(int fd, const void *buf, int64_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pf = {fd, POLLOUT, 0};
      if (poll(&pf, 1, 1000) <= 0) return -1;
      continue;
    }
    if (w <= 0) return -1;
    p += w;
    n -= w;
  }
  return 0;
}

static int store_where(const dl_store_t *s, char *buf, size_t n) {
  return snprintf(buf, n, "rank %d, store %s:%d, job '%s'", s->rank, s->host, s->port, s->job);
}

/* Connect, retrying until the deadline (rank 0 may not be listening yet). */
static int store_connect(dl_store_t *s, double deadline) {
  char portstr[16], where[400];
  snprintf(portstr, sizeof portstr, "%d", s->port);
  store_where(s, where, sizeof where);
  const char *last = "no attempt";
  char lastbuf[128];
  double pause = 0.005;
  do {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(s->host, portstr, &hints, &res);
    if (gai != 0) {
      snprintf(lastbuf, sizeof lastbuf, "cannot resolve host: %s", gai_strerror(gai));
      last = lastbuf;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        freeaddrinfo(res);
        s->fd = fd;
        return DL_OK;
      }
      snprintf(lastbuf, sizeof lastbuf, "%s", strerror(errno));
      last = lastbuf;
      close(fd);
    }
    if (res) freeaddrinfo(res);
    struct timespec ts = {0, (long)(pause * 1e9)};
    nanosleep(&ts, NULL);
    if (pause < 0.2) pause *= 2;
  } while (now_s() < deadline);
  return DL_ERR(DL_ETIMEOUT, "could not reach the store within %.1f s (%s): %s", s->timeout_s,
                where, last);
}

static void store_drop(dl_store_t *s) {
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* Who waits on a key another rank sets may watch that rank: every 100 ms of
 * waiting, watch(ctx) says whether to go on (DL_OK) or why not. */
typedef struct store_watch {
  int (*fn)(void *ctx);
  void *ctx;
} store_watch_t;

static int recv_all(dl_store_t *s, void *buf, int64_t n, double deadline, const char *what,
                    const char *key, const store_watch_t *watch) {
  char *p = buf;
  char where[400];
  int sig0 = dl_sigint_pending();
  while (n > 0) {
    double left = deadline - now_s();
    if (left <= 0) {
      store_drop(s);
      store_where(s, where, sizeof where);
      return DL_ERR(DL_ETIMEOUT, "store %s of key '%s' timed out after %.1f s (%s)", what, key,
                    s->timeout_s, where);
    }
    if (sig0 >= 0 && dl_sigint_pending() >= sig0 + 2) {
      dl_sigint_take();
      store_drop(s);
      store_where(s, where, sizeof where);
      return DL_ERR(DL_EINTR, "store %s of key '%s' stopped by Ctrl-C (twice) (%s)", what, key,
                    where);
    }
    struct pollfd pf = {s->fd, POLLIN, 0};
    int pr = poll(&pf, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
    if (pr < 0 && errno != EINTR) break;
    if (pr == 0 && watch) {
      int rc = watch->fn(watch->ctx);
      if (rc < 0) {
        store_drop(s); /* the server forgets the parked request with the connection */
        return dl_error_context(rc, "store %s of key '%s'", what, key);
      }
    }
    if (pr <= 0) continue;
    ssize_t r = recv(s->fd, p, (size_t)n, 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
      store_drop(s);
      store_where(s, where, sizeof where);
      return DL_ERR(DL_EPEER,
                    "store %s of key '%s': the store closed the connection (%s; did rank 0 exit?)",
                    what, key, where);
    }
    if (r > 0) {
      p += r;
      n -= r;
    }
  }
  return n == 0 ? DL_OK : DL_ERR(DL_EIO, "store %s of key '%s': %s", what, key, strerror(errno));
}

/* One request/reply turn. payload_out (may be NULL) gets min(cap, len) bytes. */
static int store_call(dl_store_t *s, int op, const char *what, const char *key, const void *val,
                      int64_t vallen, void *out, int64_t cap, int64_t *outlen,
                      const store_watch_t *watch) {
  DL_CHECK_ARG(s && key, "store %s: store and key must be given", what);
  double deadline = now_s() + s->timeout_s;
  if (s->fd < 0) DL_TRY(store_connect(s, deadline));
  char full[1024];
  int klen = snprintf(full, sizeof full, "%s/%s", s->job, key);
  DL_CHECK_ARG(klen < (int)sizeof full, "store %s: key '%s' is too long", what, key);
  req_hdr_t h = {(uint8_t)op, {0}, (uint32_t)klen, vallen};
  char where[400];
  if (dl_store_send_all(s->fd, &h, sizeof h) < 0 || dl_store_send_all(s->fd, full, klen) < 0 ||
      (vallen > 0 && dl_store_send_all(s->fd, val, vallen) < 0)) {
    store_drop(s);
    store_where(s, where, sizeof where);
    return DL_ERR(DL_EPEER, "store %s of key '%s': sending failed: %s (%s; did rank 0 exit?)",
                  what, key, strerror(errno), where);
  }
  rep_hdr_t r;
  DL_TRY(recv_all(s, &r, sizeof r, deadline, what, key, watch));
  char why[512] = "";
  if (r.status == ST_FAILED) { /* the reason, not the caller's value */
    out = why;
    cap = (int64_t)sizeof why - 1;
  }
  int64_t keep = out ? (r.len < cap ? r.len : cap) : 0;
  if (keep > 0) DL_TRY(recv_all(s, out, keep, deadline, what, key, NULL));
  for (int64_t rest = r.len - keep; rest > 0;) { /* drain what did not fit */
    char sink[4096];
    int64_t n = rest < (int64_t)sizeof sink ? rest : (int64_t)sizeof sink;
    DL_TRY(recv_all(s, sink, n, deadline, what, key, NULL));
    rest -= n;
  }
  if (r.status == ST_FAILED)
    return DL_ERR(DL_EPEER, "store %s of key '%s' ended: %s", what, key, why);
  if (outlen) *outlen = r.len;
  if (r.status != ST_OK) {
    store_where(s, where, sizeof where);
    return DL_ERR(DL_EIO, "store %s of key '%s': the server refused it (%s)", what, key, where);
  }
  return DL_OK;
}

/* ---- public ------------------------------------------------------------- */

int dl_store_new(dl_store_t **out, const char *host, int port, int rank, int world_size,
                 const char *job, double timeout_s) {
  DL_CHECK_ARG(out, "dl_store_new: out is NULL");
  *out = NULL;
  DL_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size,
               "dl_store_new: rank %d is not in a world of size %d", rank, world_size);
  DL_CHECK_ARG((port > 0 && port < 65536) || (port == 0 && world_size == 1),
               "dl_store_new: port %d is not in 1..65535 (0, any free port, only for a world of 1)",
               port);
  dl_store_t *s = calloc(1, sizeof *s);
  if (!s) return DL_ERR(DL_ENOMEM, "dl_store_new: out of memory");
  s->refs = 1;
  s->fd = -1;
  snprintf(s->host, sizeof s->host, "%s", host && *host ? host : "127.0.0.1");
  snprintf(s->job, sizeof s->job, "%s", job ? job : "");
  s->port = port;
  s->rank = rank;
  s->world_size = world_size;
  s->timeout_s = timeout_s > 0 ? timeout_s : dl_timeout_s();
  int rc = rank == 0 ? dl_store_serve(s) : DL_OK;
  if (rc == DL_OK) rc = store_connect(s, now_s() + s->timeout_s);
  if (rc < 0) {
    dl_store_free(s);
    return rc;
  }
  *out = s;
  return DL_OK;
}

void dl_store_retain(dl_store_t *s) {
  if (s) s->refs++;
}

void dl_store_free(dl_store_t *s) {
  if (!s || --s->refs > 0) return;
  store_drop(s);
  dl_store_serve_end(s);
  free(s);
}

int dl_store_set_timeout(dl_store_t *s, double timeout_s) {
  DL_CHECK_ARG(s, "dl_store_set_timeout: store is NULL");
  s->timeout_s = timeout_s > 0 ? timeout_s : dl_timeout_s();
  return DL_OK;
}

double dl_store_timeout(const dl_store_t *s) { return s->timeout_s; }
int dl_store_next_comm(dl_store_t *s) { return s->ncomms++; }
int dl_store_rank(const dl_store_t *s) { return s->rank; }
const char *dl_store_job(const dl_store_t *s) { return s->job; }

int dl_store_set(dl_store_t *s, const char *key, const void *value, int64_t len) {
  DL_CHECK_ARG(len >= 0 && (value || len == 0), "store set of key '%s': bad value",
               key ? key : "?");
  return store_call(s, OP_SET, "set", key, value, len, NULL, 0, NULL, NULL);
}

int dl_store_get(dl_store_t *s, const char *key, void *buf, int64_t cap, int64_t *len) {
  return store_call(s, OP_GET, "get", key, NULL, 0, buf, buf ? cap : 0, len, NULL);
}

int dl_store_get_watched(dl_store_t *s, const char *key, void *buf, int64_t cap, int64_t *len,
                         int (*watch)(void *ctx), void *ctx) {
  store_watch_t w = {watch, ctx};
  return store_call(s, OP_GET, "get", key, NULL, 0, buf, buf ? cap : 0, len, watch ? &w : NULL);
}

int dl_store_wait(dl_store_t *s, const char *key) {
  return store_call(s, OP_WAIT, "wait", key, NULL, 0, NULL, 0, NULL, NULL);
}

int dl_store_add(dl_store_t *s, const char *key, int64_t delta, int64_t *value) {
  int64_t v = 0;
  DL_TRY(store_call(s, OP_ADD, "add", key, &delta, 8, &v, 8, NULL, NULL));
  if (value) *value = v;
  return DL_OK;
}

int dl_store_check(dl_store_t *s, const char *key, int *exists) {
  int64_t v = 0;
  DL_TRY(store_call(s, OP_CHECK, "check", key, NULL, 0, &v, 8, NULL, NULL));
  if (exists) *exists = (int)v;
  return DL_OK;
}

int dl_store_delete(dl_store_t *s, const char *key) {
  return store_call(s, OP_DEL, "delete", key, NULL, 0, NULL, 0, NULL, NULL);
}

int dl_store_delete_prefix(dl_store_t *s, const char *prefix, int64_t *count) {
  DL_CHECK_ARG(prefix && prefix[0], "store delete_prefix: an empty prefix would delete every key");
  int64_t n = 0;
  DL_TRY(store_call(s, OP_DEL_PREFIX, "delete_prefix", prefix, NULL, 0, &n, 8, NULL, NULL));
  if (count) *count = n;
  return DL_OK;
}
