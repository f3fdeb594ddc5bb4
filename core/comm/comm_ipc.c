/*
 * comm_ipc.c — the communicator of ranks on one host that reach each other's
 * GPU memory through CUDA IPC, with no library in between. dl.comm.world()
 * picks it when ranks share a GPU (NCCL refuses two ranks on one device), so
 * every multi-rank schedule and kernel can be checked on a machine with one
 * GPU; DISTLAB_COMM_BACKEND=ipc picks it anywhere on one host. A
 * correctness mode: it moves data with plain copies and small kernels.
 *
 * It stands on a symmetric buffer of its own (symm.c: every rank's buffer
 * mapped by all, a signal pad behind each) laid out as
 *   [slot: 2 halves of SLOT_HALF] [mailboxes: one per source rank, 2 halves of BOX_HALF]
 * Everything is ordered on the caller's stream, so ops compose with the
 * rest of a schedule and CUDA graphs capture them; no host thread waits.
 *
 * Collectives work like the shared-memory communicator's (comm_shm.c), on
 * the device: each rank copies its chunk into half (b & 1) of its own slot,
 * where b counts the barriers this communicator issued, all meet in a
 * barrier (the signal pad's barrier kernel), then each reads the peers'
 * halves: copies, or a reduction kernel that takes the ranks in order
 * (kernels/comm/reduce.cu), so all ranks get bitwise the same sums. A half
 * written before barrier b+1 is read before barrier b+2 on every stream, and
 * written again only after it: one barrier per chunk is enough, also across
 * back-to-back ops.
 *
 * Point-to-point goes through the receiver's mailbox for the sender, chunk
 * by chunk into alternating halves. Flags in the pads count chunks and only
 * grow (signal_pad.h): the receiver's flag[src] counts chunks posted to it
 * from src, the sender's flag[MAX_RANKS + dst] chunks dst has taken. The
 * sender of chunk t waits until chunk t-2 was taken, copies, posts t; the
 * receiver waits for t, copies, marks it taken. A group issues one chunk of
 * every op a round, all the sends of a round before its receives, so no
 * cycle of waits can form; messages between two ranks keep their order.
 *
 * Waits are kernels with a timeout (the GPU's clock): one that expires
 * records which flag or peer in the pad and ends, and the next op, a
 * synchronize or a barrier turns the record into an error naming the wait,
 * the rank and the peer (dl_symm_check); the communicator then refuses work.
 * Mismatched calls (op, dtype, sizes, counts) are errors on every rank: this
 * backend always runs the communicator's debug checks through the store
 * (comm.c), and all_to_allv exchanges its count matrix there.
 *
 * Kernels of processes that share a GPU run one context at a time unless
 * MPS runs; the waits spin on one thread and still make progress as the
 * contexts take turns (scripts/gpu/shared.sh starts MPS where it can).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#ifndef DL_WITH_CUDA

static int ipc_init(dl_comm_t *c) {
  return DL_ERR(DL_EUNSUPPORTED, "the ipc communicator needs a CUDA build of libdistlab");
}
static int ipc_none(dl_comm_t *c) { return DL_EUNSUPPORTED; }
static int ipc_run(dl_comm_t *c, const dl_comm_call_t *call) { return DL_EUNSUPPORTED; }
static int ipc_synchronize(dl_comm_t *c, dl_stream_t *s) { return DL_EUNSUPPORTED; }
static void ipc_destroy(dl_comm_t *c) { c->impl = NULL; }
#define ipc_group_start ipc_none
#define ipc_group_end ipc_none

#else

#include "base/device.h"
#include "comm/reduce.h"
#include "common/signal_pad.h"

enum {
  N_MAX = DL_SIGNAL_MAX_RANKS,
  FLAG_TAKEN = DL_SIGNAL_MAX_RANKS, /* flag[FLAG_TAKEN + dst]: chunks dst took from us */
};
static const int64_t SLOT_HALF = (int64_t)4 << 20, BOX_HALF = (int64_t)1 << 20;

typedef struct ipc_op {
  int send, peer;
  char *data;
  int64_t nbytes, done;
  dl_stream_t *stream;
} ipc_op_t;

typedef struct ipc {
  dl_symm_t *buf;
  char *base[N_MAX];        /* each rank's buffer as mapped here */
  uint64_t bar;             /* barriers issued on this communicator */
  uint32_t sent[N_MAX];     /* chunks posted to each peer's mailbox */
  uint32_t taken[N_MAX];    /* chunks taken from each peer */
  ipc_op_t *ops;            /* queued point-to-point ops */
  int nops, capops;
  int64_t a2av_prev;        /* seq of the last all_to_allv (its store keys), or -1 */
  cudaStream_t probe;       /* reads the pad's error record beside the work */
  uint32_t *err;            /* pinned: the record, as last read */
} ipc_t;

static ipc_t *impl(dl_comm_t *c) { return c->impl; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static char *slot(ipc_t *m, int r, uint64_t b) { return m->base[r] + (b & 1) * SLOT_HALF; }
static char *box(ipc_t *m, int at, int src, uint32_t chunk) {
  return m->base[at] + 2 * SLOT_HALF + ((int64_t)src * 2 + (chunk & 1)) * BOX_HALF;
}

static int stream_of(dl_comm_t *c, dl_stream_t *s, cudaStream_t *out) {
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, c->dev_index, &h));
  *out = (cudaStream_t)h;
  return DL_OK;
}

/* A device wait that timed out earlier: the error it recorded. Reads the
 * record on a stream of its own, so work still queued is not waited for
 * (and nothing is read while the stream is being captured). */
static int earlier_failure(dl_comm_t *c, dl_stream_t *s, cudaStream_t st) {
  ipc_t *m = impl(c);
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  DL_CUDA_CHECK(cudaStreamIsCapturing(st, &cap));
  if (cap != cudaStreamCaptureStatusNone) return DL_OK;
  void *pad;
  DL_TRY(dl_symm_signal_pad(m->buf, c->rank, &pad));
  DL_CUDA_CHECK(cudaMemcpyAsync(m->err, ((dl_signal_pad_t *)pad)->error, 4 * sizeof(uint32_t),
                                cudaMemcpyDeviceToHost, m->probe));
  const double t0 = dl_now_us();
  cudaError_t q;
  while ((q = cudaStreamQuery(m->probe)) == cudaErrorNotReady) {
    if (dl_now_us() - t0 > c->timeout_s * 1e6)
      return DL_ERR(DL_ETIMEOUT, "reading the ipc communicator's error record took over %.1f s",
                    c->timeout_s);
    dl_wait_pause(t0);
  }
  DL_CUDA_CHECK(q);
  /* the record's wait ended (it timed out), so the check does not wait long */
  return m->err[0] ? dl_symm_check(m->buf, s) : DL_OK;
}

static int copy(void *dst, const void *src, int64_t bytes, cudaStream_t st) {
  if (bytes <= 0) return DL_OK;
  DL_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, st));
  return DL_OK;
}

static int barrier(dl_comm_t *c, dl_stream_t *s) {
  impl(c)->bar++;
  return dl_symm_barrier(impl(c)->buf, s);
}

/* ---- collectives ----------------------------------------------------------- */

static int all_reduce(dl_comm_t *c, const dl_comm_call_t *call, cudaStream_t st) {
  ipc_t *m = impl(c);
  const int esz = dl_dtype_size(call->in.dtype);
  const int64_t per = SLOT_HALF / esz, n = call->in.numel;
  char *srcs[N_MAX];
  for (int64_t off = 0; off < n; off += per) {
    const int64_t k = min64(per, n - off);
    DL_TRY(copy(slot(m, c->rank, m->bar), call->in.data + off * esz, k * esz, st));
    DL_TRY(barrier(c, call->stream));
    for (int j = 0; j < c->size; j++) srcs[j] = slot(m, j, m->bar - 1);
    DL_TRY(dl_reduce_cuda(call->out.data + off * esz, srcs, c->size, k, call->in.dtype, call->red,
                          st));
  }
  return DL_OK;
}

static int all_gather(dl_comm_t *c, const dl_comm_call_t *call, cudaStream_t st) {
  ipc_t *m = impl(c);
  const int esz = dl_dtype_size(call->in.dtype);
  const int64_t per = SLOT_HALF / esz, n = call->in.numel;
  for (int64_t off = 0; off < n; off += per) {
    const int64_t k = min64(per, n - off);
    DL_TRY(copy(slot(m, c->rank, m->bar), call->in.data + off * esz, k * esz, st));
    DL_TRY(barrier(c, call->stream));
    for (int j = 0; j < c->size; j++)
      DL_TRY(copy(call->out.data + (j * n + off) * esz, slot(m, j, m->bar - 1), k * esz, st));
  }
  return DL_OK;
}

static int reduce_scatter(dl_comm_t *c, const dl_comm_call_t *call, cudaStream_t st) {
  ipc_t *m = impl(c);
  const int esz = dl_dtype_size(call->in.dtype);
  const int64_t per = SLOT_HALF / ((int64_t)esz * c->size), n = call->out.numel;
  char *srcs[N_MAX];
  for (int64_t off = 0; off < n; off += per) {
    const int64_t k = min64(per, n - off);
    /* rank j's part of this chunk to row j of our half */
    DL_CUDA_CHECK(cudaMemcpy2DAsync(slot(m, c->rank, m->bar), (size_t)(k * esz),
                                    call->in.data + off * esz, (size_t)(n * esz), (size_t)(k * esz),
                                    (size_t)c->size, cudaMemcpyDeviceToDevice, st));
    DL_TRY(barrier(c, call->stream));
    for (int j = 0; j < c->size; j++) srcs[j] = slot(m, j, m->bar - 1) + c->rank * k * esz;
    DL_TRY(dl_reduce_cuda(call->out.data + off * esz, srcs, c->size, k, call->in.dtype, call->red,
                          st));
  }
  return DL_OK;
}

static int broadcast(dl_comm_t *c, const dl_comm_call_t *call, cudaStream_t st) {
  ipc_t *m = impl(c);
  const int esz = dl_dtype_size(call->out.dtype), root = call->peer;
  const int64_t per = SLOT_HALF / esz, n = call->out.numel;
  for (int64_t off = 0; off < n; off += per) {
    const int64_t k = min64(per, n - off);
    if (c->rank == root) DL_TRY(copy(slot(m, root, m->bar), call->out.data + off * esz, k * esz, st));
    DL_TRY(barrier(c, call->stream));
    if (c->rank != root)
      DL_TRY(copy(call->out.data + off * esz, slot(m, root, m->bar - 1), k * esz, st));
  }
  return DL_OK;
}

/* The count matrix goes through the store: every rank reads all of it and
 * checks that what i sends to j is what j expects from i, so mismatched
 * counts fail on every rank alike. Then rounds of one barrier each move a
 * section of at most `per` elements for every (source, destination). */
static int all_to_allv(dl_comm_t *c, const dl_comm_call_t *call, cudaStream_t st) {
  ipc_t *m = impl(c);
  const int n = c->size, me = c->rank, esz = dl_dtype_size(call->in.dtype);
  const int64_t per = SLOT_HALF / ((int64_t)esz * n);
  int64_t row[2 * N_MAX], sends[N_MAX][N_MAX], wants[N_MAX][N_MAX], sdisp[N_MAX], rdisp[N_MAX];
  for (int j = 0; j < n; j++) {
    row[j] = call->send_counts[j];
    row[n + j] = call->recv_counts[j];
    sdisp[j] = j ? sdisp[j - 1] + call->send_counts[j - 1] : 0;
    rdisp[j] = j ? rdisp[j - 1] + call->recv_counts[j - 1] : 0;
  }
  char key[64];
  snprintf(key, sizeof key, "a2av/%lld/%d", (long long)c->seq, me);
  DL_TRY(dl_comm_store_set(c, key, row, (int64_t)sizeof row[0] * 2 * n));
  for (int i = 0; i < n; i++) {
    snprintf(key, sizeof key, "a2av/%lld/%d", (long long)c->seq, i);
    DL_TRY(dl_comm_store_get(c, key, row, (int64_t)sizeof row[0] * 2 * n));
    for (int j = 0; j < n; j++) {
      sends[i][j] = row[j];
      wants[i][j] = row[n + j];
    }
  }
  /* everyone read our previous rows before publishing these */
  if (m->a2av_prev >= 0) {
    char full[200];
    snprintf(full, sizeof full, "%s/a2av/%lld/%d", c->name, (long long)m->a2av_prev, me);
    DL_TRY(dl_store_delete(c->store, full));
  }
  m->a2av_prev = c->seq;
  int64_t rounds = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      if (sends[i][j] != wants[j][i])
        return DL_ERR(DL_EINVAL,
                      "mismatched counts: rank %d sends %lld elements to rank %d, which expects "
                      "%lld",
                      i, (long long)sends[i][j], j, (long long)wants[j][i]);
      if ((sends[i][j] + per - 1) / per > rounds) rounds = (sends[i][j] + per - 1) / per;
    }
  for (int64_t t = 0; t < rounds; t++) {
    for (int j = 0; j < n; j++) {
      const int64_t k = min64(per, sends[me][j] - t * per);
      if (k > 0)
        DL_TRY(copy(slot(m, me, m->bar) + j * per * esz, call->in.data + (sdisp[j] + t * per) * esz,
                    k * esz, st));
    }
    DL_TRY(barrier(c, call->stream));
    for (int j = 0; j < n; j++) {
      const int64_t k = min64(per, sends[j][me] - t * per);
      if (k > 0)
        DL_TRY(copy(call->out.data + (rdisp[j] + t * per) * esz,
                    slot(m, j, m->bar - 1) + me * per * esz, k * esz, st));
    }
  }
  return DL_OK;
}

/* ---- point-to-point ---------------------------------------------------------- */

/* One chunk of a send: wait until the chunk two back was taken (its half is
 * free), copy into the peer's mailbox for us, post it. */
static int send_chunk(dl_comm_t *c, ipc_op_t *op) {
  ipc_t *m = impl(c);
  dl_stream_t *s = op->stream;
  cudaStream_t st;
  DL_TRY(stream_of(c, s, &st));
  const uint32_t t = ++m->sent[op->peer];
  const int64_t len = min64(BOX_HALF, op->nbytes - op->done);
  if (t > 2) DL_TRY(dl_symm_flag_wait(m->buf, FLAG_TAKEN + op->peer, t - 2, s));
  DL_TRY(copy(box(m, op->peer, c->rank, t), op->data + op->done, len, st));
  DL_TRY(dl_symm_flag_set(m->buf, op->peer, c->rank, t, s));
  op->done += len;
  return DL_OK;
}

/* One chunk of a receive: wait until it was posted, copy it out, mark it taken. */
static int recv_chunk(dl_comm_t *c, ipc_op_t *op) {
  ipc_t *m = impl(c);
  dl_stream_t *s = op->stream;
  cudaStream_t st;
  DL_TRY(stream_of(c, s, &st));
  const uint32_t t = ++m->taken[op->peer];
  const int64_t len = min64(BOX_HALF, op->nbytes - op->done);
  DL_TRY(dl_symm_flag_wait(m->buf, op->peer, t, s));
  DL_TRY(copy(op->data + op->done, box(m, c->rank, op->peer, t), len, st));
  DL_TRY(dl_symm_flag_set(m->buf, op->peer, FLAG_TAKEN + c->rank, t, s));
  op->done += len;
  return DL_OK;
}

static int p2p_queue(dl_comm_t *c, int send, const dl_view_t *v, int peer, dl_stream_t *s) {
  ipc_t *m = impl(c);
  if (m->nops == m->capops) {
    int cap = m->capops ? 2 * m->capops : 16;
    ipc_op_t *ops = realloc(m->ops, sizeof *ops * (size_t)cap);
    if (!ops) return DL_ERR(DL_ENOMEM, "point-to-point: out of memory");
    m->ops = ops;
    m->capops = cap;
  }
  m->ops[m->nops++] = (ipc_op_t){send, peer, v->data, v->numel * dl_dtype_size(v->dtype), 0, s};
  return DL_OK;
}

/* Issue every queued op, a chunk of each a round: the round's sends, then its
 * receives (a send waits only for receives of earlier rounds, which every
 * rank issued before, so no wait can close a cycle). An op starts once the
 * earlier ones with the same peer in its direction are done. */
static int p2p_issue(dl_comm_t *c) {
  ipc_t *m = impl(c);
  int rc = DL_OK;
  for (int left = 1; rc == DL_OK && left;) {
    left = 0;
    for (int pass = 1; pass >= 0 && rc == DL_OK; pass--) { /* sends, then receives */
      uint32_t busy = 0;
      for (int i = 0; i < m->nops && rc == DL_OK; i++) {
        ipc_op_t *op = &m->ops[i];
        if (op->send != pass || op->done == op->nbytes) continue;
        if (!(busy & (1u << op->peer)))
          rc = op->send ? send_chunk(c, op) : recv_chunk(c, op);
        busy |= 1u << op->peer;
        left |= op->done < op->nbytes;
      }
    }
  }
  m->nops = 0;
  return rc;
}

/* ---- backend ------------------------------------------------------------------ */

static int ipc_synchronize(dl_comm_t *c, dl_stream_t *s) {
  DL_TRY(dl_cuda_use(c->dev_index));
  return dl_symm_check(impl(c)->buf, s); /* waits (with the timeout), then reads the record */
}

static int ipc_run(dl_comm_t *c, const dl_comm_call_t *call) {
  cudaStream_t st;
  DL_TRY(dl_cuda_use(c->dev_index));
  DL_TRY(stream_of(c, call->stream, &st));
  DL_TRY(earlier_failure(c, call->stream, st));
  dl_graph_note_user(c); /* a graph being captured now reads this communicator's buffers */
  switch (call->op) {
  case DL_OP_ALL_REDUCE: return all_reduce(c, call, st);
  case DL_OP_ALL_GATHER: return all_gather(c, call, st);
  case DL_OP_REDUCE_SCATTER: return reduce_scatter(c, call, st);
  case DL_OP_ALL_TO_ALL:
  case DL_OP_ALL_TO_ALLV: return all_to_allv(c, call, st);
  case DL_OP_BROADCAST: return broadcast(c, call, st);
  case DL_OP_SEND:
  case DL_OP_RECV:
    DL_TRY(p2p_queue(c, call->op == DL_OP_SEND, call->op == DL_OP_SEND ? &call->in : &call->out,
                     call->peer, call->stream));
    return c->in_group ? DL_OK : p2p_issue(c);
  case DL_OP_BARRIER:
    DL_TRY(barrier(c, call->stream));
    return ipc_synchronize(c, call->stream);
  default: return DL_ERR(DL_EUNSUPPORTED, "ipc: op %d", call->op);
  }
}

static int ipc_group_start(dl_comm_t *c) { return DL_OK; }
static int ipc_group_end(dl_comm_t *c) { return p2p_issue(c); }

static void ipc_destroy(dl_comm_t *c) {
  ipc_t *m = impl(c);
  if (!m) return;
  char what[160];
  snprintf(what, sizeof what, "the ipc communicator '%s' (its buffers)", c->name);
  dl_graph_release_user(c, what);
  if (m->buf) {
    /* work still queued reads the buffers: it ends (waits time out) first */
    if (!c->failed && ipc_synchronize(c, NULL) < 0) dl_clear_error();
    dl_symm_free(m->buf);
  }
  if (m->probe) cudaStreamDestroy(m->probe);
  if (m->err) cudaFreeHost(m->err);
  free(m->ops);
  free(m);
  c->impl = NULL;
}

static int ipc_init(dl_comm_t *c) {
  DL_CHECK_ARG(c->size <= N_MAX,
               "the ipc communicator spans one host of at most %d ranks; this one has %d", N_MAX,
               c->size);
  DL_TRY(dl_device_check(DL_CUDA, c->dev_index));
  ipc_t *m = calloc(1, sizeof *m);
  if (!m) return DL_ERR(DL_ENOMEM, "ipc communicator: out of memory");
  c->impl = m;
  m->a2av_prev = -1;
  /* mismatched calls must fail on every rank, not move the wrong bytes */
  c->debug = 1;
  DL_TRY(dl_cuda_use(c->dev_index));
  DL_CUDA_CHECK(cudaStreamCreateWithFlags(&m->probe, cudaStreamNonBlocking));
  void *err = NULL;
  DL_CUDA_CHECK(cudaHostAlloc(&err, 4 * sizeof(uint32_t), cudaHostAllocDefault));
  m->err = err;
  /* which ranks share our GPU (the all-reduce kernels size their grids by it) */
  char key[32], mine[256] = {0}, theirs[256];
  DL_TRY(dl_cuda_device_id(c->dev_index, mine, sizeof mine));
  snprintf(key, sizeof key, "ipc/dev/%d", c->rank);
  DL_TRY(dl_comm_store_set(c, key, mine, sizeof mine));
  c->share = 0;
  for (int r = 0; r < c->size; r++) {
    snprintf(key, sizeof key, "ipc/dev/%d", r);
    DL_TRY(dl_comm_store_get(c, key, theirs, sizeof theirs));
    c->share += strcmp(mine, theirs) == 0;
  }
  DL_TRY(dl_symm_alloc(&m->buf, c, 2 * SLOT_HALF + 2 * BOX_HALF * c->size));
  for (int r = 0; r < c->size; r++) {
    void *p;
    DL_TRY(dl_symm_peer_ptr(m->buf, r, &p));
    m->base[r] = p;
  }
  return DL_OK;
}

#endif

const dl_comm_backend_t dl_comm_ipc_backend = {
    .name = "ipc",
    .init = ipc_init,
    .run = ipc_run,
    .group_start = ipc_group_start,
    .group_end = ipc_group_end,
    .synchronize = ipc_synchronize,
    .abort = NULL,
    .destroy = ipc_destroy,
    .native = NULL,
};
