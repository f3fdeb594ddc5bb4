/*
 * comm_internal.h — what the communicator files share (comm.c, comm_store.c,
 * comm_shm.c, comm_nccl.c, comm_meta.c, symm.c, store.c) and nothing else sees: the
 * communicator struct, the backend table every backend fills, and the
 * helpers for deadlines and error context. Operators see only comm_ops.h.
 *
 * comm.c owns argument checking and error context, comm_store.c the
 * debug-mode cross-rank checks; a backend gets contiguous views that already
 * agree in shape and dtype and only moves bytes.
 */
#ifndef DISTLAB_COMM_INTERNAL_H
#define DISTLAB_COMM_INTERNAL_H

#include "base/internal.h"
#include "comm/comm_ops.h"

enum { DL_COMM_MAX_RANKS = 4096, DL_COMM_NAME = 96 };

/* The operations as numbered in error messages and the debug signature. */
enum {
  DL_OP_ALL_REDUCE = 0,
  DL_OP_ALL_GATHER,
  DL_OP_REDUCE_SCATTER,
  DL_OP_ALL_TO_ALL,
  DL_OP_ALL_TO_ALLV,
  DL_OP_BROADCAST,
  DL_OP_SEND,
  DL_OP_RECV,
  DL_OP_BARRIER,
  DL_OP_SPLIT,
  DL_OP_SYMM,
  DL_OP_COUNT
};
const char *dl_comm_op_name(int op);

typedef struct dl_comm_backend dl_comm_backend_t;

struct dl_comm {
  uint32_t magic;
  int rank, size;
  int dev_type, dev_index;
  const dl_comm_backend_t *be;
  void *impl;              /* the backend's state */
  dl_store_t *store;       /* a reference; NULL on meta */
  char name[DL_COMM_NAME]; /* "w", "w.s1c0": namespaces store keys and shm names */
  int *world_ranks;        /* rank in the world comm of each member, for messages */
  double timeout_s;
  int debug;
  int64_t seq;             /* ops issued so far (names them in messages) */
  int nsplits, nsymm;      /* children made so far: name them identically on every rank */
  int nagree;              /* dl_comm_agree calls so far (their store keys) */
  int64_t nchecked;        /* collectives debug mode checked so far: their keys' numbers, one
                            * apart (seq counts p2p ops too), so each check deletes its last */
  int *pids;               /* each member's process on this host (0: elsewhere), read lazily */
  uint32_t gone;           /* 1 + a member whose process is gone (peers.c), polled by waits */
  int failed;              /* set once an op failed; later ops refuse */
  int dropped;             /* freed by dl_comm_drop (the collector): no collective teardown */
  int share;               /* ranks on this rank's GPU (dl_comm_info_t.share) */
  int in_group;            /* p2p ops queued since dl_comm_group_start */
  int self_sends, self_recvs; /* of the open group: to and from this rank, pairs only */
  struct dl_comm *group_next;
};

/* One call of a backend op. Views are contiguous, checked, same dtype. */
typedef struct dl_comm_call {
  int op;
  int red;                  /* DL_RED_* for reductions */
  int peer;                 /* root for broadcast, peer for send/recv */
  dl_view_t out, in;        /* in unused by broadcast/recv, out by send */
  const int64_t *send_counts, *recv_counts; /* all_to_allv, elements per rank */
  dl_stream_t *stream;
} dl_comm_call_t;

struct dl_comm_backend {
  const char *name;
  /* Rendezvous of c (rank, size, store, name set) and its state in c->impl. */
  int (*init)(dl_comm_t *c);
  /* Run (or, inside a group, queue) one op; DL_OP_BARRIER returns on the
   * host once every rank arrived. */
  int (*run)(dl_comm_t *c, const dl_comm_call_t *call);
  int (*group_start)(dl_comm_t *c);
  int (*group_end)(dl_comm_t *c);
  /* Host waits for the comm's work on s, polling for peer errors. */
  int (*synchronize)(dl_comm_t *c, dl_stream_t *s);
  /* Tell peers this rank gives up, so their waits end now (may be NULL). */
  void (*abort)(dl_comm_t *c, const char *why);
  /* Why a host wait on the store (a debug check) must stop now: a rank gave
   * up on the communicator (may be NULL; comm.c watches the processes). */
  int (*watch)(dl_comm_t *c);
  void (*destroy)(dl_comm_t *c);
  /* The backend's own handle for dl_comm_info (may be NULL). */
  void *(*native)(dl_comm_t *c);
};

extern const dl_comm_backend_t dl_comm_shm_backend;
extern const dl_comm_backend_t dl_comm_meta_backend;
extern const dl_comm_backend_t dl_comm_nccl_backend;
extern const dl_comm_backend_t dl_comm_ipc_backend;

/* All members of c meet at `name` through the store (used at setup only). */
int dl_comm_store_barrier(dl_comm_t *c, const char *name);
/* This member's pid and host, for its peers' dl_comm_peer_pid (peers.c). */
int dl_comm_publish_pid(dl_comm_t *c);
/* Waits until every member has published its pid (read into c->pids): a
 * member that gave up making c instead ends the wait at once (its failure
 * key), before the backend's rendezvous could wait for it the whole timeout. */
int dl_comm_await_members(dl_comm_t *c);
/* "rank R (pid P) has exited" for a watched word's value (1 + R). */
int dl_comm_gone_str(dl_comm_t *c, uint32_t gone, char *buf, size_t len);
/* Error helpers: "<op> #<seq> on rank R of N (comm NAME, BACKEND)". */
int dl_comm_describe(const dl_comm_t *c, int op, char *buf, size_t len);
int dl_comm_world_rank(const dl_comm_t *c, int rank);
/* An op as mismatch messages show it: "all_reduce(sum), dtype f32, 8 in,
 * 8 out", "broadcast from 0, ...", "barrier". */
int dl_comm_call_str(int op, int red, int dtype, int root, int64_t n_in, int64_t n_out, char *buf,
                     size_t len);
/* The entries ("a, b, c") that differ between two such strings, position by
 * position: "x vs y; ...". */
void dl_comm_diff(const char *mine, const char *theirs, char *out, size_t len);
/* Debug mode: this rank's call against every other rank's (DL_EINVAL on a
 * mismatch); point-to-point calls against their peer's. */
int dl_comm_debug_check(dl_comm_t *c, const dl_comm_call_t *call);

/* A store key "<prefix>!failed" (its value: why) fails every GET and WAIT
 * of a missing key under <prefix> (ending in '/'), parked or to come, with
 * that reason: a rank that gives up on a rendezvous (a communicator it
 * cannot create) ends its peers' waits at once. The first reason stays. */
#define DL_STORE_FAILED "!failed"

/* Store internals the communicator files use. dl_store_get_watched waits
 * like dl_store_get and every 100 ms asks watch(ctx) whether to go on: a
 * negative code ends the wait with that error (a dead peer, an abort). */
int dl_store_get_watched(dl_store_t *s, const char *key, void *buf, int64_t cap, int64_t *len,
                         int (*watch)(void *ctx), void *ctx);
double dl_store_timeout(const dl_store_t *s);
int dl_store_rank(const dl_store_t *s);
const char *dl_store_job(const dl_store_t *s);
void dl_store_retain(dl_store_t *s);
/* How many world communicators were made on this store before (0, 1, ...). */
int dl_store_next_comm(dl_store_t *s);

#endif
