/*
 * store.c — the bootstrap key-value store: rank 0 serves it over TCP, every
 * rank (rank 0 too) is a client.
 *
 * Ranks rendezvous through it before any communicator exists (NCCL unique
 * ids, shared-memory names, CUDA IPC handles, debug-mode op signatures), so
 * it is what a torchrun/Slurm-style launch on several hosts needs: rank 0
 * listens on MASTER_ADDR:MASTER_PORT, the others connect.
 *
 * Protocol (little endian, one request then one reply per connection turn):
 *   request  {u8 op, u8 pad[3], u32 keylen, i64 vallen} key val
 *   reply    {i32 status, i32 pad, i64 len} payload
 * GET and WAIT are answered only once the key exists; the client bounds the
 * wait with its timeout and, when it expires, drops the connection (the
 * server forgets the waiter with it) and reconnects on its next call, so a
 * late answer can never be read as the answer to another request.
 * Keys are prefixed with "<job>/" so jobs sharing a port cannot mix.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm_internal.h"

enum { OP_SET = 1, OP_GET, OP_WAIT, OP_ADD, OP_CHECK, OP_DEL, OP_DEL_PREFIX };
enum { ST_OK = 0, ST_MISSING = 1, ST_BADREQ = 2 };
enum { NBUCKETS = 1024, MAX_CLIENTS = 4096 };

typedef struct req_hdr {
  uint8_t op, pad[3];
  uint32_t keylen;
  int64_t vallen;
} req_hdr_t;

typedef struct rep_hdr {
  int32_t status, pad;
  int64_t len;
} rep_hdr_t;

/* ---- server ------------------------------------------------------------- */

typedef struct kv {
  struct kv *next;
  char *key;
  char *val;
  int64_t len;
} kv_t;

typedef struct conn {
  int fd;
  char *buf; /* bytes of the request being read */
  int64_t have, cap;
  int waiting; /* a GET/WAIT parked until its key is set */
} conn_t;

typedef struct server {
  int64_t last_us; /* when a request was last served (dl_now_us), for the linger at exit */
  int listen_fd;
  int wake[2]; /* a byte on wake[1] stops the thread */
  pthread_t thread;
  kv_t *buckets[NBUCKETS];
  conn_t *conns;
  int nconns;
} server_t;

struct dl_store {
  int refs;
  int fd;
  char host[256];
  int port, rank, world_size;
  char job[64];
  double timeout_s;
  int ncomms;       /* world communicators made on it so far */
  server_t *server; /* rank 0 only */
};

static uint32_t hash_key(const char *k, int64_t n) {
  uint32_t h = 2166136261u;
  for (int64_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 16777619u;
  return h % NBUCKETS;
}

static kv_t *kv_find(server_t *sv, const char *key, int64_t n, kv_t ***link) {
  kv_t **p = &sv->buckets[hash_key(key, n)];
  for (; *p; p = &(*p)->next)
    if ((int64_t)strlen((*p)->key) == n && memcmp((*p)->key, key, n) == 0) break;
  if (link) *link = p;
  return *p;
}

/* A new empty entry for key at *link (where kv_find stopped); NULL if out of memory. */
static kv_t *kv_insert(kv_t **link, const char *key, int64_t n) {
  kv_t *e = calloc(1, sizeof *e);
  if (!e || !(e->key = strndup(key, (size_t)n))) {
    free(e);
    return NULL;
  }
  *link = e;
  return e;
}

static int send_all(int fd, const void *buf, int64_t n) {
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

static int reply(int fd, int status, const void *payload, int64_t len) {
  rep_hdr_t h = {status, 0, len};
  if (send_all(fd, &h, sizeof h) < 0) return -1;
  return len > 0 ? send_all(fd, payload, len) : 0;
}

/* Answer the parked waiters of key now that it exists. */
static void wake_waiters(server_t *sv, const kv_t *e) {
  int64_t klen = (int64_t)strlen(e->key);
  for (int i = 0; i < sv->nconns; i++) {
    conn_t *c = &sv->conns[i];
    if (!c->waiting) continue;
    req_hdr_t *h = (req_hdr_t *)c->buf;
    if ((int64_t)h->keylen != klen || memcmp(c->buf + sizeof *h, e->key, klen) != 0) continue;
    c->waiting = 0;
    c->have = 0;
    reply(c->fd, ST_OK, h->op == OP_GET ? e->val : NULL, h->op == OP_GET ? e->len : 0);
  }
}

/* Handle the complete request in c->buf; may park it. */
static void serve_request(server_t *sv, conn_t *c) {
  __atomic_store_n(&sv->last_us, (int64_t)dl_now_us(), __ATOMIC_RELAXED);
  req_hdr_t *h = (req_hdr_t *)c->buf;
  const char *key = c->buf + sizeof *h;
  const char *val = key + h->keylen;
  kv_t **link;
  kv_t *e = kv_find(sv, key, h->keylen, &link);
  c->have = 0;
  switch (h->op) {
  case OP_SET: {
    if (!e && !(e = kv_insert(link, key, h->keylen))) {
      reply(c->fd, ST_BADREQ, NULL, 0);
      return;
    }
    free(e->val);
    e->val = malloc(h->vallen > 0 ? (size_t)h->vallen : 1);
    if (e->val) memcpy(e->val, val, (size_t)h->vallen);
    e->len = e->val ? h->vallen : 0;
    reply(c->fd, ST_OK, NULL, 0);
    wake_waiters(sv, e);
    return;
  }
  case OP_ADD: {
    int64_t delta = 0, v = 0;
    if (h->vallen == 8) memcpy(&delta, val, 8);
    if (e && e->len == 8) memcpy(&v, e->val, 8);
    v += delta;
    if (!e && !(e = kv_insert(link, key, h->keylen))) {
      reply(c->fd, ST_BADREQ, NULL, 0);
      return;
    }
    if (e->len != 8) {
      free(e->val);
      e->val = malloc(8);
      e->len = e->val ? 8 : 0;
    }
    if (e->val) memcpy(e->val, &v, 8);
    reply(c->fd, ST_OK, &v, 8);
    wake_waiters(sv, e);
    return;
  }
  case OP_GET:
  case OP_WAIT:
    if (!e) {
      c->have = (int64_t)sizeof *h + h->keylen; /* keep the request: parked */
      c->waiting = 1;
      return;
    }
    reply(c->fd, ST_OK, h->op == OP_GET ? e->val : NULL, h->op == OP_GET ? e->len : 0);
    return;
  case OP_CHECK: {
    int64_t exists = e != NULL;
    reply(c->fd, ST_OK, &exists, 8);
    return;
  }
  case OP_DEL:
    if (e) {
      *link = e->next;
      free(e->key);
      free(e->val);
      free(e);
    }
    reply(c->fd, ST_OK, NULL, 0);
    return;
  case OP_DEL_PREFIX: { /* the keys of a communicator that is gone: "<job>/w/..." */
    int64_t n = 0;
    for (int b = 0; b < NBUCKETS; b++) {
      for (kv_t **p = &sv->buckets[b]; *p;) {
        kv_t *x = *p;
        if (strncmp(x->key, key, h->keylen) != 0) {
          p = &x->next;
          continue;
        }
        *p = x->next;
        free(x->key);
        free(x->val);
        free(x);
        n++;
      }
    }
    reply(c->fd, ST_OK, &n, 8);
    return;
  }
  default:
    reply(c->fd, ST_BADREQ, NULL, 0);
  }
}

static void close_conn(server_t *sv, int i) {
  close(sv->conns[i].fd);
  free(sv->conns[i].buf);
  sv->conns[i] = sv->conns[--sv->nconns];
}

/* Read what is there; serve once a request is complete. 0, or -1 to drop. */
static int read_conn(server_t *sv, conn_t *c) {
  if (c->waiting) { /* a parked client sends nothing: data or EOF means it gave up */
    char b;
    return recv(c->fd, &b, 1, MSG_DONTWAIT) == 0 ? -1 : 0;
  }
  for (;;) {
    int64_t need = (int64_t)sizeof(req_hdr_t);
    if (c->have >= need) {
      req_hdr_t *h = (req_hdr_t *)c->buf;
      if (h->vallen < 0 || h->keylen > (1u << 20)) return -1;
      need += h->keylen + h->vallen;
    }
    if (c->cap < need) {
      int64_t cap = need < 256 ? 256 : need;
      char *nb = realloc(c->buf, (size_t)cap);
      if (!nb) return -1;
      c->buf = nb;
      c->cap = cap;
    }
    if (c->have == need && need > (int64_t)sizeof(req_hdr_t)) {
      serve_request(sv, c);
      if (c->waiting) return 0;
      continue;
    }
    if (c->have == need) { /* a header with empty key and value */
      serve_request(sv, c);
      continue;
    }
    ssize_t r = recv(c->fd, c->buf + c->have, (size_t)(need - c->have), MSG_DONTWAIT);
    if (r == 0) return -1;
    if (r < 0) return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    c->have += r;
  }
}

static void *server_main(void *arg) {
  server_t *sv = arg;
  struct pollfd *pf = malloc(sizeof *pf * (MAX_CLIENTS + 2));
  if (!pf) return NULL;
  for (;;) {
    int n = 0;
    pf[n++] = (struct pollfd){sv->wake[0], POLLIN, 0};
    pf[n++] = (struct pollfd){sv->listen_fd, POLLIN, 0};
    for (int i = 0; i < sv->nconns; i++) pf[n++] = (struct pollfd){sv->conns[i].fd, POLLIN, 0};
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pf[0].revents) break;
    int nold = sv->nconns;
    /* walk backwards: close_conn moves the last entry into the hole */
    for (int i = nold - 1; i >= 0; i--) {
      short ev = pf[2 + i].revents;
      if (!ev) continue;
      if ((ev & (POLLERR | POLLNVAL)) || read_conn(sv, &sv->conns[i]) < 0) close_conn(sv, i);
    }
    if (pf[1].revents & POLLIN) {
      int fd = accept(sv->listen_fd, NULL, NULL);
      if (fd >= 0 && sv->nconns < MAX_CLIENTS) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        sv->conns[sv->nconns++] = (conn_t){.fd = fd};
      } else if (fd >= 0) {
        close(fd);
      }
    }
  }
  free(pf);
  return NULL;
}

/* Rank 0 serves the store from inside its process: when it exits (an error
 * it reports, or plain os.exit) while peers are about to read keys it or
 * others set (their half of the same check), they would get "the store
 * closed the connection" instead of their own error. So the process that
 * serves lingers at exit while clients are connected and the store is in
 * use: a request parked, or one served in the last 200 ms; at most
 * DISTLAB_STORE_LINGER seconds (default 5). A peer blocked elsewhere does
 * not hold the exit up. */
static double now_s(void);
static server_t *serving;    /* the live server of this process, if any */
static dl_store_t *serving_client; /* rank 0's own client of it */

static void linger_at_exit(void) {
  server_t *sv = __atomic_load_n(&serving, __ATOMIC_ACQUIRE);
  if (!sv) return;
  if (serving_client && serving_client->fd >= 0) { /* our own connection counts as none */
    close(serving_client->fd);
    serving_client->fd = -1;
  }
  const char *e = getenv("DISTLAB_STORE_LINGER");
  double limit = e && *e ? atof(e) : 5, t0 = now_s();
  __atomic_store_n(&sv->last_us, (int64_t)dl_now_us(), __ATOMIC_RELAXED);
  while (__atomic_load_n(&sv->nconns, __ATOMIC_ACQUIRE) > 0 && now_s() - t0 < limit) {
    int parked = 0;
    for (int i = 0; i < __atomic_load_n(&sv->nconns, __ATOMIC_ACQUIRE); i++)
      parked |= __atomic_load_n(&sv->conns[i].waiting, __ATOMIC_RELAXED);
    if (!parked && dl_now_us() - __atomic_load_n(&sv->last_us, __ATOMIC_RELAXED) > 2e5) break;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
}

static void server_free(server_t *sv) {
  if (!sv) return;
  if (sv->thread) {
    char b = 1;
    ssize_t w = write(sv->wake[1], &b, 1);
    (void)w;
    pthread_join(sv->thread, NULL);
  }
  for (int i = 0; i < sv->nconns; i++) {
    close(sv->conns[i].fd);
    free(sv->conns[i].buf);
  }
  for (int b = 0; b < NBUCKETS; b++)
    for (kv_t *e = sv->buckets[b], *n; e; e = n) {
      n = e->next;
      free(e->key);
      free(e->val);
      free(e);
    }
  if (sv->listen_fd >= 0) close(sv->listen_fd);
  if (sv->wake[0] >= 0) close(sv->wake[0]);
  if (sv->wake[1] >= 0) close(sv->wake[1]);
  free(sv->conns);
  free(sv);
}

static int is_loopback(const char *host) {
  return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0;
}

/* Listen on port: on loopback only when host is a loopback name, else on all
 * interfaces (the address the others dial may be any of this host's). */
static int server_start(dl_store_t *st) {
  server_t *sv = calloc(1, sizeof *sv);
  if (!sv) return DL_ERR(DL_ENOMEM, "store server: out of memory");
  sv->listen_fd = sv->wake[0] = sv->wake[1] = -1;
  st->server = sv;
  sv->conns = calloc(MAX_CLIENTS, sizeof *sv->conns);
  if (!sv->conns || pipe(sv->wake) < 0) return DL_ERR(DL_EIO, "store server: out of resources");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)st->port)};
  a.sin_addr.s_addr = htonl(is_loopback(st->host) ? INADDR_LOOPBACK : INADDR_ANY);
  sv->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  if (sv->listen_fd < 0) return DL_ERR(DL_EIO, "store server: socket: %s", strerror(errno));
  setsockopt(sv->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(sv->listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(sv->listen_fd, 1024) < 0)
    return DL_ERR(DL_EIO,
                  "rank 0 cannot serve the store on %s:%d: %s (is another job on this port? "
                  "set MASTER_PORT to a free one)",
                  st->host, st->port, strerror(errno));
  if (st->port == 0) { /* a world of one: any free port will do */
    socklen_t len = sizeof a;
    getsockname(sv->listen_fd, (struct sockaddr *)&a, &len);
    st->port = ntohs(a.sin_port);
  }
  if (pthread_create(&sv->thread, NULL, server_main, sv) != 0) {
    sv->thread = 0;
    return DL_ERR(DL_EIO, "store server: cannot start its thread");
  }
  static int registered;
  if (!registered++) atexit(linger_at_exit);
  serving_client = st;
  __atomic_store_n(&serving, sv, __ATOMIC_RELEASE);
  return DL_OK;
}

/* ---- client ------------------------------------------------------------- */

static double now_s(void) { return dl_now_us() * 1e-6; }

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
  if (send_all(s->fd, &h, sizeof h) < 0 || send_all(s->fd, full, klen) < 0 ||
      (vallen > 0 && send_all(s->fd, val, vallen) < 0)) {
    store_drop(s);
    store_where(s, where, sizeof where);
    return DL_ERR(DL_EPEER, "store %s of key '%s': sending failed: %s (%s; did rank 0 exit?)",
                  what, key, strerror(errno), where);
  }
  rep_hdr_t r;
  DL_TRY(recv_all(s, &r, sizeof r, deadline, what, key, watch));
  int64_t keep = out ? (r.len < cap ? r.len : cap) : 0;
  if (keep > 0) DL_TRY(recv_all(s, out, keep, deadline, what, key, NULL));
  for (int64_t rest = r.len - keep; rest > 0;) { /* drain what did not fit */
    char sink[4096];
    int64_t n = rest < (int64_t)sizeof sink ? rest : (int64_t)sizeof sink;
    DL_TRY(recv_all(s, sink, n, deadline, what, key, NULL));
    rest -= n;
  }
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
  int rc = rank == 0 ? server_start(s) : DL_OK;
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
  if (s->server && __atomic_load_n(&serving, __ATOMIC_ACQUIRE) == s->server) {
    __atomic_store_n(&serving, NULL, __ATOMIC_RELEASE);
    serving_client = NULL;
  }
  server_free(s->server);
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
