/*
 * comm_shm_p2p.c — the CPU communicator's point-to-point: a mailbox per
 * (src, dst) pair in the segment (comm_shm.h).
 *
 * Mailboxes are byte rings with monotonic posted/consumed counters; each
 * message starts with its byte count and dtype, so a recv of the wrong size
 * or dtype is an error rather than a desynchronised stream or reinterpreted
 * bytes. Point-to-point ops are queued and progressed together (a group),
 * so ring exchanges cannot deadlock.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_shm.h"

/* Move what fits now through box src->dst; returns bytes moved. */
static int64_t box_io(dl_comm_t *c, p2p_t *op) {
  shm_t *m = impl(c);
  int src = op->send ? c->rank : op->peer, dst = op->send ? op->peer : c->rank;
  int64_t B = m->ctl->box_bytes, total = HDR + op->nbytes, moved = 0;
  char *box = m->boxes + ((int64_t)src * c->size + dst) * B;
  uint64_t *posted = &m->ctl->posted[src * SHM_MAX + dst].v;
  uint64_t *consumed = &m->ctl->consumed[src * SHM_MAX + dst].v;
  while (op->done < total) {
    uint64_t p = __atomic_load_n(posted, op->send ? __ATOMIC_RELAXED : __ATOMIC_ACQUIRE);
    uint64_t q = __atomic_load_n(consumed, op->send ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
    uint64_t at = op->send ? p : q;
    int64_t room = op->send ? B - (int64_t)(p - q) : (int64_t)(p - q);
    int64_t pos = (int64_t)(at % (uint64_t)B);
    char *user = op->done < HDR ? (char *)&op->hdr + op->done : op->data + (op->done - HDR);
    int64_t len = min64(min64(op->done < HDR ? HDR - op->done : total - op->done, room), B - pos);
    if (len <= 0) break;
    if (op->send) memcpy(box + pos, user, (size_t)len);
    else memcpy(user, box + pos, (size_t)len);
    __atomic_store_n(op->send ? posted : consumed, at + (uint64_t)len, __ATOMIC_RELEASE);
    op->done += len;
    moved += len;
    if (!op->send && op->done == HDR && (op->hdr.nbytes != op->nbytes || op->hdr.dtype != op->dtype)) {
      c->failed = 1; /* the byte stream from this peer is no longer in step */
      const int es = dl_dtype_size(op->dtype), hs = dl_dtype_size(op->hdr.dtype);
      return DL_ERR(DL_EINVAL,
                    "mismatched %s: rank %d receives %lld elements of %s (%lld bytes) from rank %d, "
                    "which sends %lld elements of %s (%lld bytes)",
                    op->hdr.nbytes != op->nbytes ? "sizes" : "dtypes", c->rank,
                    (long long)(op->nbytes / es), dl_dtype_name(op->dtype), (long long)op->nbytes,
                    op->peer, (long long)(hs > 0 ? op->hdr.nbytes / hs : 0),
                    dl_dtype_name(op->hdr.dtype), (long long)op->hdr.nbytes);
    }
  }
  return moved;
}

int dl_shm_p2p_queue(dl_comm_t *c, int send, const dl_view_t *v, int peer) {
  shm_t *m = impl(c);
  if (m->nops == m->capops) {
    int cap = m->capops ? 2 * m->capops : 16;
    p2p_t *ops = realloc(m->ops, sizeof *ops * (size_t)cap);
    if (!ops) return DL_ERR(DL_ENOMEM, "point-to-point: out of memory");
    m->ops = ops;
    m->capops = cap;
  }
  int64_t nbytes = v->numel * dl_dtype_size(v->dtype);
  p2p_hdr_t hdr = {send ? nbytes : 0, send ? v->dtype : -1, 0};
  m->ops[m->nops++] = (p2p_t){send, peer, v->data, nbytes, 0, v->dtype, hdr};
  return DL_OK;
}

/* Progress every queued op until all are done. */
int dl_shm_p2p_run(dl_comm_t *c) {
  shm_t *m = impl(c);
  waiter_t w;
  dl_shm_wait_begin(c, &w);
  int rc = DL_OK, peer_gone_checked = 0;
  for (;;) {
    int pending = -1;
    int64_t moved = 0;
    /* messages between two ranks arrive in the order they were queued: an op
     * waits until the earlier ones in its direction with the same peer are done */
    uint64_t busy[2] = {0, 0};
    for (int i = 0; i < m->nops && rc == DL_OK; i++) {
      p2p_t *op = &m->ops[i];
      if (op->done == HDR + op->nbytes) continue;
      uint64_t bit = (uint64_t)1 << op->peer;
      if (!(busy[op->send] & bit)) {
        int64_t r = box_io(c, op);
        if (r < 0) rc = (int)r;
        else moved += r;
      }
      if (op->done < HDR + op->nbytes) {
        busy[op->send] |= bit;
        if (pending < 0) pending = i;
      }
    }
    if (rc < 0 || pending < 0) break;
    if (moved) {
      dl_shm_wait_begin(c, &w);
      peer_gone_checked = 0;
      continue;
    }
    p2p_t *op = &m->ops[pending];
    char what[160];
    snprintf(what, sizeof what, "%s %lld bytes %s rank %d (%lld moved)",
             op->send ? "sending" : "receiving", (long long)op->nbytes, op->send ? "to" : "from",
             op->peer, (long long)(op->done > HDR ? op->done - HDR : 0));
    rc = dl_shm_wait_step(c, &w, op->peer, what);
    if (rc == DL_EPEER && !peer_gone_checked && !__atomic_load_n(&m->ctl->aborted, __ATOMIC_ACQUIRE)) {
      /* the peer may have posted its last message and then exited between
       * our poll and the check: poll once more before calling it gone */
      peer_gone_checked = 1;
      dl_clear_error();
      rc = DL_OK;
      continue;
    }
    if (rc < 0) break;
  }
  m->nops = 0;
  return rc;
}
