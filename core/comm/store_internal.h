/*
 * store_internal.h — what the store's client (store.c) and its server
 * (store_server.c) share: the wire protocol and the client's handle.
 *
 * Protocol (little endian, one request then one reply per connection turn):
 *   request  {u8 op, u8 pad[3], u32 keylen, i64 vallen} key val
 *   reply    {i32 status, i32 pad, i64 len} payload
 */
#ifndef DISTLAB_COMM_STORE_INTERNAL_H
#define DISTLAB_COMM_STORE_INTERNAL_H

#include "comm_internal.h"

enum { OP_SET = 1, OP_GET, OP_WAIT, OP_ADD, OP_CHECK, OP_DEL, OP_DEL_PREFIX };
/* ST_FAILED: the payload is the reason a failure key holds (comm_internal.h) */
enum { ST_OK = 0, ST_MISSING = 1, ST_BADREQ = 2, ST_FAILED = 3 };

typedef struct req_hdr {
  uint8_t op, pad[3];
  uint32_t keylen;
  int64_t vallen;
} req_hdr_t;

typedef struct rep_hdr {
  int32_t status, pad;
  int64_t len;
} rep_hdr_t;

struct dl_store {
  int refs;
  int fd;
  char host[256];
  int port, rank, world_size;
  char job[64];
  double timeout_s;
  int ncomms;       /* world communicators made on it so far */
  struct store_server *server; /* rank 0 only (store_server.c) */
};

/* Sends all n bytes (0), or fails (-1): the connection is then unusable. */
int dl_store_send_all(int fd, const void *buf, int64_t n);
/* Rank 0: serve the store on st's port (0: any free one, written back into
 * st->port), from a thread of this process; st is its own client. */
int dl_store_serve(dl_store_t *st);
/* Stop st's server (none: nothing to do) and free it. */
void dl_store_serve_end(dl_store_t *st);

#endif
