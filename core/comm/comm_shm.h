/*
 * comm_shm.h — what the CPU communicator's files share (comm_shm.c: the
 * segment, barriers and collectives; comm_shm_p2p.c: the mailboxes): the
 * segment's layout, this rank's state, and the wait on a peer.
 *
 * Layout: a control block (barrier counters, the abort record, op
 * signatures, all_to_allv count matrices, mailbox counters), then one slot
 * per rank for collectives, then one mailbox per (src, dst) pair for
 * point-to-point.
 */
#ifndef DISTLAB_COMM_SHM_H
#define DISTLAB_COMM_SHM_H

#include "comm_internal.h"

enum { SHM_MAX = 64 };

typedef struct line {
  _Alignas(64) uint64_t v;
} line_t;

typedef struct shm_sig {
  int32_t op, red, dtype, root;
  int64_t n_in, n_out;
} shm_sig_t;

typedef struct shm_ctl {
  uint32_t magic;
  int32_t size;
  int64_t slot_bytes, box_bytes;
  _Alignas(64) int32_t aborted;
  int32_t abort_rank;
  uint64_t abort_passed; /* barriers the rank that gave up had passed */
  char abort_msg[768];
  int32_t left[SHM_MAX];
  line_t arrive[SHM_MAX];
  shm_sig_t sig[2][SHM_MAX];
  int64_t sendc[2][SHM_MAX][SHM_MAX]; /* all_to_allv: [parity][src][dst] */
  int64_t recvc[2][SHM_MAX][SHM_MAX]; /* [parity][dst][src] */
  line_t posted[SHM_MAX * SHM_MAX];   /* bytes written into box [src][dst] */
  line_t consumed[SHM_MAX * SHM_MAX];
} shm_ctl_t;

/* What a message starts with: its size and dtype, so that a recv that
 * expects another size or dtype is an error on arrival, not bytes
 * reinterpreted. */
typedef struct p2p_hdr {
  int64_t nbytes;
  int32_t dtype, pad;
} p2p_hdr_t;
enum { HDR = sizeof(p2p_hdr_t) };

typedef struct p2p {
  int send, peer;
  char *data;
  int64_t nbytes, done; /* done counts the header too */
  int32_t dtype;
  p2p_hdr_t hdr;
} p2p_t;

typedef struct shm {
  shm_ctl_t *ctl;
  size_t map_bytes;
  char *slots, *boxes;
  char name[160];
  uint64_t bar;    /* barriers issued */
  uint64_t passed; /* barriers passed (every rank arrived) */
  int64_t *mat; /* this op's send-count matrix, size x size */
  p2p_t *ops;
  int nops, capops;
} shm_t;

static inline shm_t *impl(dl_comm_t *c) { return c->impl; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A wait on a peer: dl_shm_wait_begin starts its deadline, dl_shm_wait_step
 * runs between polls (a pause; nonzero: stop, with the error set). */
typedef struct waiter {
  int64_t iter;
  double deadline, last_check;
} waiter_t;
void dl_shm_wait_begin(dl_comm_t *c, waiter_t *w);
int dl_shm_wait_step(dl_comm_t *c, waiter_t *w, int peer, const char *what);

/* Point-to-point (comm_shm_p2p.c): queue a send (or recv) of v to (from)
 * peer; progress every queued op until all are done. */
int dl_shm_p2p_queue(dl_comm_t *c, int send, const dl_view_t *v, int peer);
int dl_shm_p2p_run(dl_comm_t *c);

#endif
