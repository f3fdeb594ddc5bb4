/*
 * allreduce_failure.c — what the all-reduce kernels (and the twin) record
 * when a call fails (kernels/allreduce/allreduce.h: dl_ar_status_t), worded
 * as an error naming the call, the rank and the peer; and the abort a rank
 * sends its peers when it gives up on the host.
 */
#include <stdio.h>
#include <string.h>

#include "allreduce_int.h"
#include "base/device.h"

/* "all_reduce two_shot on rank 1 of 2 (comm 'w', cuda:1)" */
int dl_ar_describe(const dl_allreduce_t *ar, int algo, char *buf, size_t len) {
  char what[64];
  snprintf(what, sizeof what, "all_reduce %s", dl_ar_name(algo));
  return dl_devop_describe(&ar->op, what, buf, len);
}

/* "one_shot on 100 f32 (1 block, rounds of 32 vectors, copy-in)", and for a
 * piece of a larger run "elements 4096.. of 10000 f32" */
static void call_str(const dl_ar_call_t *c, char *buf, size_t len) {
  char what[64];
  if (c->offset) snprintf(what, sizeof what, "elements %lld.. of ", (long long)c->offset);
  else what[0] = 0;
  snprintf(buf, len, "%s on %s%lld %s (%d block%s, rounds of %d vectors, %s%s)", dl_ar_name(c->algo),
           what, (long long)c->n, dl_dtype_name(c->dtype), c->blocks, c->blocks == 1 ? "" : "s",
           c->round_vecs, c->zero_copy ? "zero copy" : "copy-in", c->tagged ? ", tagged" : "");
}

/* What differs between two calls: "algorithm one_shot vs two_shot; ...". */
static void call_diff(const dl_ar_call_t *a, const dl_ar_call_t *b, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
#define DIFF(cond, ...)                                                          \
  if ((cond) && n < len) {                                                       \
    int w = snprintf(buf + n, len - n, "%s", n ? "; " : "");                     \
    n += w > 0 ? (size_t)w : 0;                                                  \
    if (n < len) {                                                               \
      w = snprintf(buf + n, len - n, __VA_ARGS__);                               \
      n += w > 0 ? (size_t)w : 0;                                                \
    }                                                                            \
  }
  DIFF(a->algo != b->algo, "algorithm %s vs %s", dl_ar_name(a->algo), dl_ar_name(b->algo));
  DIFF(a->dtype != b->dtype, "dtype %s vs %s", dl_dtype_name(a->dtype), dl_dtype_name(b->dtype));
  DIFF(a->n != b->n, "elements %lld vs %lld", (long long)a->n, (long long)b->n);
  DIFF(a->offset != b->offset, "piece at element %lld vs %lld", (long long)a->offset,
       (long long)b->offset);
  DIFF(a->blocks != b->blocks, "blocks %d vs %d", a->blocks, b->blocks);
  DIFF(a->round_vecs != b->round_vecs, "rounds of %d vs %d vectors", a->round_vecs, b->round_vecs);
  DIFF(a->zero_copy != b->zero_copy, "zero copy %d vs %d", a->zero_copy, b->zero_copy);
  DIFF(a->tagged != b->tagged, "tagged %d vs %d (the size limit, or DISTLAB_AR_TAGGED_MAX_BYTES differs)",
       a->tagged, b->tagged);
#undef DIFF
}

/* Peer q gave up on call seq (an abort record): its call and ours as block 0s
 * announced them into our ctrl (ar_announce keeps a copy of ours), read here
 * (the kernels are done): 1 when both are there and differ, the two in *mine
 * and *theirs. A rank whose wait could not end (a peer running another
 * algorithm sends no flag or data it waits for) saw the abort first; the
 * mismatch that made the peer give up is what its error names then, as the
 * peer's does. Read on the host, not in the kernels' failure paths, where
 * it cost every kernel registers (experiments/results/allreduce/NOTES.md). */
static int abort_was_mismatch(dl_allreduce_t *ar, uint32_t q, uint32_t seq, dl_ar_call_t *mine,
                              dl_ar_call_t *theirs) {
  if (q >= (uint32_t)ar->op.size || (int)q == ar->op.rank || !ar->op.bufs[ar->op.rank]) return 0;
  dl_ar_call_wire_t row[DL_SIGNAL_MAX_RANKS]; /* every rank's entry for seq, as this rank's ctrl holds them */
  const dl_ar_call_wire_t *src = ((const dl_ar_ctrl_t *)ar->op.bufs[ar->op.rank])->calls[seq & 1];
  if (ar->op.dev_type == DL_CPU) {
    for (int r = 0; r < ar->op.size; r++)
      for (int i = 0; i < 8; i++) row[r].w[i] = __atomic_load_n(&src[r].w[i], __ATOMIC_ACQUIRE);
  }
#ifdef DL_WITH_CUDA
  else if (ar->op.dev_type == DL_CUDA) {
    if (dl_cuda_use(ar->op.dev_index) != DL_OK ||
        cudaMemcpy(row, src, sizeof row, cudaMemcpyDeviceToHost) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
  }
#endif
  else return 0;
  return dl_ar_calls_differ(&row[ar->op.rank], &row[q], seq, mine, theirs);
}

/* A failure the kernels recorded, as an error; the object is dead after it
 * (dl_devop_recorded_failure). */
int dl_ar_recorded(dl_devop_t *op, int *fatal) {
  dl_allreduce_t *ar = (dl_allreduce_t *)op;
  volatile dl_ar_status_t *s = ar->status;
  *fatal = 1;
  if (s->kind == 0) return DL_OK;
  char what[256];
  dl_ar_describe(ar, (int)s->algo, what, sizeof what);
  int rc;
  dl_ar_call_t mine, theirs;
  const int named = s->kind == DL_AR_FAIL_ABORT && abort_was_mismatch(ar, s->peer, s->seq, &mine, &theirs);
  if (s->kind == DL_AR_FAIL_MISMATCH || named) {
    if (!named) mine = s->mine, theirs = s->theirs;
    char a[160], b[160], d[256];
    call_str(&mine, a, sizeof a);
    call_str(&theirs, b, sizeof b);
    call_diff(&mine, &theirs, d, sizeof d);
    rc = DL_ERR(DL_EINVAL, "%s: mismatched calls (the buffer's call %u): rank %d runs %s but rank %u "
                "runs %s (differs: %s)", what, s->seq, ar->op.rank, a, s->peer, b, d);
  } else if (s->kind == DL_AR_FAIL_ABORT) {
    rc = DL_ERR(DL_EPEER, "%s: rank %u gave up on this all-reduce (a wait of its timed out, it saw "
                "mismatched calls or a dead peer: its own error says which), so the buffer's call "
                "%u is void here", what, s->peer, s->seq);
  } else if (s->kind == DL_AR_FAIL_DEAD) {
    rc = DL_ERR(DL_EPEER, "%s: rank %u (pid %d) has exited (this rank waited for it in the "
                "buffer's call %u)", what, s->peer, s->peer < DL_SIGNAL_MAX_RANKS ? ar->op.pids[s->peer] : 0,
                s->seq);
  } else {
    char waited[96]; /* its call, or the Lamport kernels its data, the others a count */
    if (s->block == DL_AR_BLOCK_CALL)
      snprintf(waited, sizeof waited, "it never started the buffer's call %u", s->seq);
    else if (dl_ar_algo((int)s->algo) && dl_ar_algo((int)s->algo)->lamport)
      snprintf(waited, sizeof waited, "block %u waited for its data at vector %u, in the buffer's "
               "call %u", s->block, s->expected, s->seq);
    else
      snprintf(waited, sizeof waited, "block %u waited for count %u and saw %u, in the buffer's "
               "call %u", s->block, s->expected, s->seen, s->seq);
    rc = DL_ERR(DL_ETIMEOUT,
                "%s: rank %u did not arrive within %.1f s (%s); did every rank call the same "
                "all-reduce?", what, s->peer, ar->op.timeout_s, waited);
  }
  return rc;
}

/* A failure found on the host (a debug check that timed out): tell every
 * peer's kernels to give up, as a kernel's own failure does, so that no
 * peer completes a call against this rank's abandoned one. */
void dl_ar_abort_peers(dl_allreduce_t *ar) {
  const uint32_t word = (uint32_t)ar->op.rank + 1;
  for (int p = 0; p < ar->op.size; p++) {
    if (p == ar->op.rank || !ar->op.bufs[p]) continue;
    uint32_t *dst = &((dl_ar_ctrl_t *)ar->op.bufs[p])->abort;
    if (ar->op.dev_type == DL_CPU) __atomic_store_n(dst, word, __ATOMIC_RELEASE);
#ifdef DL_WITH_CUDA
    else if (ar->op.dev_type == DL_CUDA && dl_cuda_use(ar->op.dev_index) == DL_OK &&
             cudaMemcpy(dst, &word, sizeof word, cudaMemcpyHostToDevice) != cudaSuccess)
      (void)cudaGetLastError(); /* best effort: the peer still times out by itself */
#endif
  }
}
