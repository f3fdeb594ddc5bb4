/*
 * store_server.c — the store's server, a thread of rank 0's process: the
 * keys in a hash table, every client's connection polled by that one
 * thread, a GET or WAIT parked until its key is set (store_internal.h has
 * the protocol), and a linger at exit while peers still use the store.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store_internal.h"

enum { NBUCKETS = 1024, MAX_CLIENTS = 4096 };

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

typedef struct store_server {
  int64_t last_us; /* when a request was last served (dl_now_us), for the linger at exit */
  int listen_fd;
  int wake[2]; /* a byte on wake[1] stops the thread */
  pthread_t thread;
  kv_t *buckets[NBUCKETS];
  conn_t *conns;
  int nconns;
  int world_size, accepted; /* clients expected, connections taken: the linger after a failure */
  int failed;               /* a failure key was set */
} server_t;

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

static double now_s(void) { return dl_now_us() * 1e-6; }

static int reply(int fd, int status, const void *payload, int64_t len) {
  rep_hdr_t h = {status, 0, len};
  if (dl_store_send_all(fd, &h, sizeof h) < 0) return -1;
  return len > 0 ? dl_store_send_all(fd, payload, len) : 0;
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

static const size_t FAILED_LEN = sizeof DL_STORE_FAILED - 1;

/* The failure key that covers key (a "<prefix>!failed" for a prefix of it
 * ending in '/'), or NULL. */
static kv_t *failure_of(server_t *sv, const char *key, int64_t n) {
  if (!sv->failed) return NULL;
  char buf[1100];
  for (int64_t i = 0; i < n; i++) {
    if (key[i] != '/' || i + 1 + (int64_t)FAILED_LEN >= (int64_t)sizeof buf) continue;
    memcpy(buf, key, (size_t)i + 1);
    memcpy(buf + i + 1, DL_STORE_FAILED, FAILED_LEN);
    kv_t *e = kv_find(sv, buf, i + 1 + (int64_t)FAILED_LEN, NULL);
    if (e) return e;
  }
  return NULL;
}

/* Answer the parked waiters under failure key f's prefix with its reason. */
static void fail_waiters(server_t *sv, const kv_t *f) {
  const int64_t plen = (int64_t)strlen(f->key) - (int64_t)FAILED_LEN;
  for (int i = 0; i < sv->nconns; i++) {
    conn_t *c = &sv->conns[i];
    if (!c->waiting) continue;
    req_hdr_t *h = (req_hdr_t *)c->buf;
    if ((int64_t)h->keylen < plen || memcmp(c->buf + sizeof *h, f->key, (size_t)plen) != 0) continue;
    c->waiting = 0;
    c->have = 0;
    reply(c->fd, ST_FAILED, f->val, f->len);
  }
}

static int is_failure_key(const char *key, int64_t n) {
  return n > (int64_t)FAILED_LEN && key[n - (int64_t)FAILED_LEN - 1] == '/' &&
         memcmp(key + n - (int64_t)FAILED_LEN, DL_STORE_FAILED, FAILED_LEN) == 0;
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
    const int failure = is_failure_key(key, h->keylen);
    if (failure && e) { /* the first reason stays */
      reply(c->fd, ST_OK, NULL, 0);
      return;
    }
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
    if (failure) {
      __atomic_store_n(&sv->failed, 1, __ATOMIC_RELEASE);
      fail_waiters(sv, e);
    }
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
    if (!e && (e = failure_of(sv, key, h->keylen)) != NULL) {
      reply(c->fd, ST_FAILED, e->val, e->len);
      return;
    }
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
        __atomic_fetch_add(&sv->accepted, 1, __ATOMIC_RELEASE);
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
 * serves lingers before its server stops while clients are connected and
 * the store is in use: a request parked, or one served in the last 200 ms;
 * at most DISTLAB_STORE_LINGER seconds (default 5). A peer blocked
 * elsewhere does not hold the exit up.
 *
 * Two ways out, both linger: os.exit runs the exit handler below; an
 * uncaught Lua error ends in lua_close, whose finalizers free the store
 * (dl_store_serve_end) before any exit handler runs. */
static server_t *serving;    /* the live server of this process, if any */
static dl_store_t *serving_client; /* rank 0's own client of it */

static void linger(void) {
  server_t *sv = __atomic_load_n(&serving, __ATOMIC_ACQUIRE);
  if (!sv) return;
  if (serving_client && serving_client->fd >= 0) { /* our own connection counts as none */
    close(serving_client->fd);
    serving_client->fd = -1;
  }
  const char *e = getenv("DISTLAB_STORE_LINGER");
  double limit = e && *e ? atof(e) : 5, t0 = now_s();
  __atomic_store_n(&sv->last_us, (int64_t)dl_now_us(), __ATOMIC_RELAXED);
  /* after a failure, the peers that have not connected yet are still to
   * be told (their waits end at its key, not at the timeout) */
  while ((__atomic_load_n(&sv->nconns, __ATOMIC_ACQUIRE) > 0 ||
          (__atomic_load_n(&sv->failed, __ATOMIC_ACQUIRE) &&
           __atomic_load_n(&sv->accepted, __ATOMIC_ACQUIRE) < sv->world_size)) &&
         now_s() - t0 < limit) {
    /* after a failure, a connected peer too is still to be told: its next request gets the
     * failure's key (an idle gap of 200 ms closed it before, and it read "store closed") */
    int parked = __atomic_load_n(&sv->failed, __ATOMIC_ACQUIRE) &&
                 (__atomic_load_n(&sv->accepted, __ATOMIC_ACQUIRE) < sv->world_size ||
                  __atomic_load_n(&sv->nconns, __ATOMIC_ACQUIRE) > 0);
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
int dl_store_serve(dl_store_t *st) {
  server_t *sv = calloc(1, sizeof *sv);
  if (!sv) return DL_ERR(DL_ENOMEM, "store server: out of memory");
  sv->listen_fd = sv->wake[0] = sv->wake[1] = -1;
  sv->world_size = st->world_size;
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
  if (!registered++) atexit(linger);
  serving_client = st;
  __atomic_store_n(&serving, sv, __ATOMIC_RELEASE);
  return DL_OK;
}

void dl_store_serve_end(dl_store_t *st) {
  if (st->server && __atomic_load_n(&serving, __ATOMIC_ACQUIRE) == st->server) {
    linger();
    __atomic_store_n(&serving, NULL, __ATOMIC_RELEASE);
    serving_client = NULL;
  }
  server_free(st->server);
}
