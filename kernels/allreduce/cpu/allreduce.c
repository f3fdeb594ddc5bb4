/*
 * allreduce.c — CPU twin of the all-reduce kernels (kernels/allreduce/:
 * one_shot.cu and two_shot.cu, launched by allreduce_launch.cu): the same
 * one-shot (pull, push, push_flat), two-shot (pull, push, write) and Lamport
 * (one-shot, two-shot) all-reduces over symmetric buffers in POSIX shared
 * memory, one process per rank, with the same buffer layout, rounds,
 * per-block barriers, device-style counters, double-buffered staging and
 * failure record (kernels/allreduce/allreduce.h). So the specs exercise the protocol
 * itself on a machine without a GPU: a fast rank running ahead into the next
 * call, zero-copy regions rewritten right after a call, timeouts.
 *
 * The blocks of the kernel run one after another here (round k of block 0,
 * then of block 1, ...); every rank walks them in the same order, so a
 * block's barrier always meets the same block of the other ranks. The
 * pipelined one-shot kernels (producer warps copying or pushing round k+1
 * while consumer warps reduce round k) become, one thread per rank, copy or
 * push round k, signal it, wait for it, reduce it: the same flags and counts;
 * one_shot_push_flat, the push without roles, has the same twin. Sums are in
 * fp32 in rank order, rounding as the kernels do (dtype.h), so cpu and
 * cuda results are bit-identical. The stream argument is unused.
 */
#include <stdio.h>
#include <string.h>

#include "allreduce/allreduce.h"
#include "common/dtype.h"
#include "common/cpu/host_wait.h"


static dl_ar_ctrl_t *ctrl_of(char *buf) { return (dl_ar_ctrl_t *)buf; }

static char *staging(const dl_ar_args_t *a, int rank, int half, int slot) {
  return a->bufs[rank] + a->staging_off + ((int64_t)half * a->nranks + slot) * a->slot_bytes;
}

/* ---- elements ------------------------------------------------------------ */

static float ld(const void *p, int64_t i, int dt) {
  if (dt == DL_F32) return ((const float *)p)[i];
  if (dt == DL_F16) return dl_f16_to_f32(((const uint16_t *)p)[i]);
  return dl_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void st(void *p, int64_t i, int dt, float v) {
  if (dt == DL_F32) ((float *)p)[i] = v;
  else if (dt == DL_F16) ((uint16_t *)p)[i] = dl_f32_to_f16(v);
  else ((uint16_t *)p)[i] = dl_f32_to_bf16(v);
}

/* dst[e0, e1) = src[e0, e1), raw bytes. */
static void copy_range(void *dst, const void *src, int64_t e0, int64_t e1, int es) {
  if (e1 > e0) memcpy((char *)dst + e0 * es, (const char *)src + e0 * es, (size_t)((e1 - e0) * es));
}

/* out[e0, e1) = sum over p of src[p][e0, e1), in rank order, fp32. */
static void sum_range(void *out, char *const *src, int nr, int64_t e0, int64_t e1, int dt) {
  for (int64_t i = e0; i < e1; i++) {
    float acc = ld(src[0], i, dt);
    for (int p = 1; p < nr; p++) acc += ld(src[p], i, dt);
    st(out, i, dt, acc);
  }
}

/* ---- synchronisation -------------------------------------------------------- */

/* Record the first failure of this rank (status and pad, as the kernels do)
 * and, unless it is a peer's abort, tell every peer to give up too. */
static int ar_fail(const dl_ar_args_t *a, uint32_t kind, int block, int peer, uint32_t expected,
                   uint32_t seen, uint32_t seq, const dl_ar_call_t *mine, const dl_ar_call_t *theirs) {
  uint32_t none = 0;
  if (__atomic_compare_exchange_n(&a->pad->error[0], &none, kind, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    a->pad->error[1] = (uint32_t)peer;
    a->pad->error[2] = expected;
    a->pad->error[3] = seen;
    dl_ar_status_t *s = a->status;
    s->peer = (uint32_t)peer;
    s->expected = expected;
    s->seen = seen;
    s->block = (uint32_t)block;
    s->algo = (uint32_t)a->algo;
    s->seq = seq;
    if (mine) s->mine = *mine;
    if (theirs) s->theirs = *theirs;
    __atomic_store_n(&s->kind, kind, __ATOMIC_RELEASE);
    if (kind != DL_AR_FAIL_ABORT)
      for (int p = 0; p < a->nranks; p++)
        if (p != a->rank)
          __atomic_store_n(&ctrl_of(a->bufs[p])->abort, (uint32_t)a->rank + 1, __ATOMIC_RELEASE);
  }
  /* the core words the error from the status record, as on cuda */
  return DL_ERR(kind == DL_AR_FAIL_TIMEOUT ? DL_ETIMEOUT : kind == DL_AR_FAIL_MISMATCH ? DL_EINVAL : DL_EPEER,
                "allreduce (cpu): failure %u with rank %d", kind, peer);
}

/* A wait: its deadline. */
typedef struct watch {
  double deadline;
} watch_t;

static watch_t watch_begin(const dl_ar_args_t *a) {
  return (watch_t){dl_host_now_s() + a->timeout_ns * 1e-9};
}

/* Between polls number i of a wait on `peer`: why it must end now
 * (DL_AR_FAIL_*, *who the rank to name), or 0: a peer gave up (unless
 * heed_abort is 0), a rank's process is gone (status.gone, which the
 * host's watchdog sets), or the timeout expired. */
static uint32_t watch_step(const dl_ar_args_t *a, watch_t *w, long i, int peer, int *who,
                           int heed_abort) {
  dl_host_pause(i);
  if (i % 16) return 0;
  const uint32_t ab = __atomic_load_n(&ctrl_of(a->bufs[a->rank])->abort, __ATOMIC_ACQUIRE);
  *who = peer;
  if (ab && heed_abort) {
    *who = (int)ab - 1;
    return DL_AR_FAIL_ABORT;
  }
  const uint32_t gone = __atomic_load_n(&a->status->gone, __ATOMIC_ACQUIRE);
  if (gone) {
    *who = (int)gone - 1;
    return DL_AR_FAIL_DEAD;
  }
  return dl_host_now_s() > w->deadline ? DL_AR_FAIL_TIMEOUT : 0;
}

/* The same, recording why. */
static int watch_fail(const dl_ar_args_t *a, watch_t *w, long i, int block, int peer,
                      uint32_t expected, uint32_t seen, uint32_t seq) {
  int who;
  const uint32_t kind = watch_step(a, w, i, peer, &who, 1);
  return kind ? ar_fail(a, kind, block, who, expected, seen, seq, NULL, NULL) : DL_OK;
}

/* Block b of this rank meets block b of every other rank (kernel: ar_barrier). */
static int ar_barrier(const dl_ar_args_t *a, dl_ar_ctrl_t *self, int b, uint32_t seq) {
  uint32_t e[DL_SIGNAL_MAX_RANKS];
  for (int p = 0; p < a->nranks; p++) {
    if (p == a->rank) continue;
    e[p] = self->counts[b][p] + 1;
    self->counts[b][p] = e[p];
    __atomic_store_n(&ctrl_of(a->bufs[p])->flags[b][a->rank], e[p], __ATOMIC_RELEASE);
  }
  for (int p = 0; p < a->nranks; p++) {
    if (p == a->rank) continue;
    watch_t w = watch_begin(a);
    uint32_t x;
    for (long i = 0; !DL_SIGNAL_REACHED(x = __atomic_load_n(&self->flags[b][p], __ATOMIC_ACQUIRE), e[p]);
         i++)
      DL_TRY(watch_fail(a, &w, i, b, p, e[p], x, seq));
  }
  return DL_OK;
}

/* This call as the descriptor says it (dl_ar_call_t). */
static dl_ar_call_t call_of(const dl_ar_args_t *a, uint32_t seq) {
  dl_ar_call_t c = dl_ar_call_of(a);
  c.seq = seq + 1; /* 0: the zeroed entry, before any call */
  return c;
}

/* Peer p's entry for call seq, read once: 1 once every word carries tag (1 + seq;
 * dl_ar_call_wire_t), the call then in *theirs; *x the tag of the first word that did not. */
static int call_read(const dl_ar_ctrl_t *self, int p, uint32_t seq, uint32_t tag, dl_ar_call_t *theirs,
                     uint32_t *x) {
  const dl_ar_call_wire_t *in = &self->calls[seq & 1][p];
  uint32_t w[8];
  for (int i = 0; i < 8; i++) {
    const uint64_t v = __atomic_load_n(&in->w[i], __ATOMIC_ACQUIRE);
    if ((uint32_t)(v >> 32) != tag) {
      *x = (uint32_t)(v >> 32);
      return 0;
    }
    w[i] = (uint32_t)v;
  }
  memcpy(theirs, w, sizeof w);
  return 1;
}

/* Our call into every peer's ctrl, and a copy into ours, each word tagged with its seq
 * (no order among the stores; kernels: ar_announce). */
static void ar_announce(const dl_ar_args_t *a, uint32_t seq) {
  const dl_ar_call_t mine = call_of(a, seq);
  uint32_t mw[8];
  memcpy(mw, &mine, sizeof mw);
  for (int p = 0; p < a->nranks; p++) {
    dl_ar_call_wire_t *slot = &ctrl_of(a->bufs[p])->calls[seq & 1][a->rank];
    for (int i = 0; i < 8; i++) __atomic_store_n(&slot->w[i], dl_ar_call_wire_word(mine.seq, mw[i]), __ATOMIC_RELAXED);
  }
}

/* Our call announced, then every peer's call, once it is there, compared with ours
 * (kernels: ar_announce, ar_agree). */
static int ar_agree(const dl_ar_args_t *a, dl_ar_ctrl_t *self, uint32_t seq) {
  const dl_ar_call_t mine = call_of(a, seq);
  ar_announce(a, seq);
  /* every peer's slot at each poll, so that a mismatched call that is there is named even when
   * another peer is late or gone (in order, waiting on rank 1 first, rank 0 reported the death
   * of a rank 2 that had published a mismatched call and exited) */
  int left = a->nranks - 1, who = -1, gave_up = -1;
  uint32_t kind = 0, aborted = 0, x = 0;
  uint8_t seen[DL_SIGNAL_MAX_RANKS] = {0};
  watch_t w = watch_begin(a);
  for (long i = 0; left > 0; i++) {
    int late = -1;
    for (int p = 0; p < a->nranks; p++) {
      if (p == a->rank || seen[p]) continue;
      dl_ar_call_t theirs;
      uint32_t got = 0;
      if (!call_read(self, p, seq, mine.seq, &theirs, &got)) {
        if (late < 0) late = p, x = got;
        continue;
      }
      if (memcmp(&theirs, &mine, sizeof mine) != 0)
        return ar_fail(a, DL_AR_FAIL_MISMATCH, 0, p, seq, seq, seq, &mine, &theirs);
      seen[p] = 1;
      left--;
    }
    if (left == 0) break;
    if (kind) return ar_fail(a, kind, DL_AR_BLOCK_CALL, who, mine.seq, x, seq, NULL, NULL);
    kind = watch_step(a, &w, i, late, &who, !aborted);
    /* another rank gave up (it saw a mismatch, most likely): a late call, if it comes within a
     * second, says more than the abort */
    if (kind == DL_AR_FAIL_ABORT) {
      aborted = 1;
      gave_up = who;
      if (w.deadline > dl_host_now_s() + 1) w.deadline = dl_host_now_s() + 1;
      kind = 0;
    }
    if (kind == DL_AR_FAIL_TIMEOUT && aborted) kind = DL_AR_FAIL_ABORT, who = gave_up;
    /* kind set: one more look at every slot (above) before failing with it */
  }
  return DL_OK;
}

/* ---- the algorithms ------------------------------------------------------------ */

typedef struct job {
  const dl_ar_args_t *a;
  dl_ar_ctrl_t *self;
  uint32_t seq;
  int h, es, L;
  int64_t nv, chunk; /* vectors; vectors per block and round (round_vecs) */
} job_t;

/* Elements of vectors [v0, v1), clipped to the tensor. */
static int64_t el(const job_t *j, int64_t v) {
  int64_t e = v * j->L;
  return e < j->a->n ? e : j->a->n;
}

/* one_shot (kernels: allreduce_one_shot_kernel, and
 * allreduce_one_shot_zero_copy_kernel for a zero-copy input). */
static int one_shot(const job_t *j) {
  const dl_ar_args_t *a = j->a;
  const int G = a->blocks;
  char *src[DL_SIGNAL_MAX_RANKS];
  for (int p = 0; p < a->nranks; p++)
    src[p] = a->zero_copy ? a->bufs[p] + a->zc_off : staging(a, p, j->h, 0);
  for (int b = 0; b < G && a->zero_copy; b++) DL_TRY(ar_barrier(a, j->self, b, j->seq));
  for (int64_t k = 0; k * G * j->chunk < j->nv; k++) {
    for (int b = 0; b < G; b++) {
      int64_t v0 = (k * G + b) * j->chunk, v1 = v0 + j->chunk;
      if (v0 >= j->nv) break;
      if (!a->zero_copy) {
        copy_range(src[a->rank], a->in, el(j, v0), el(j, v1), j->es);
        DL_TRY(ar_barrier(a, j->self, b, j->seq));
      }
      sum_range(a->out, src, a->nranks, el(j, v0), el(j, v1), a->dtype);
    }
  }
  for (int b = 0; b < G && a->zero_copy; b++) DL_TRY(ar_barrier(a, j->self, b, j->seq));
  return DL_OK;
}

/* one_shot_push and one_shot_push_flat (kernels: allreduce_one_shot_push_kernel,
 * allreduce_one_shot_push_flat_kernel). */
static int one_shot_push(const job_t *j) {
  const dl_ar_args_t *a = j->a;
  const int G = a->blocks, me = a->rank;
  char *src[DL_SIGNAL_MAX_RANKS];
  for (int p = 0; p < a->nranks; p++) src[p] = p == me ? (char *)a->in : staging(a, me, j->h, p);
  for (int64_t k = 0; k * G * j->chunk < j->nv; k++) {
    for (int b = 0; b < G; b++) {
      int64_t v0 = (k * G + b) * j->chunk, v1 = v0 + j->chunk;
      if (v0 >= j->nv) break;
      for (int p = 0; p < a->nranks; p++)
        if (p != me) copy_range(staging(a, p, j->h, me), a->in, el(j, v0), el(j, v1), j->es);
      DL_TRY(ar_barrier(a, j->self, b, j->seq));
      sum_range(a->out, src, a->nranks, el(j, v0), el(j, v1), a->dtype);
    }
  }
  return DL_OK;
}

/* two_shot, two_shot_push, two_shot_write (kernels: allreduce_two_shot_kernel,
 * allreduce_two_shot_push_kernel, allreduce_two_shot_write_kernel).
 * push: the all-gather writes into every peer; write (push too, not zero
 * copy): the reduce-scatter's inputs are written into their owners' staging
 * (slice q of rank p into rank q's slot p), so nothing is copied in. */
static int two_shot(const job_t *j, int push, int write) {
  const dl_ar_args_t *a = j->a;
  const int G = a->blocks, me = a->rank, nr = a->nranks;
  const int64_t sv = (j->nv + nr - 1) / nr;
  char *buf[DL_SIGNAL_MAX_RANKS], *rs[DL_SIGNAL_MAX_RANKS];
  write = write && !a->zero_copy;
  for (int p = 0; p < nr; p++) {
    buf[p] = a->zero_copy ? a->bufs[p] + a->zc_off : staging(a, p, j->h, 0);
    rs[p] = !write ? buf[p] : p == me ? (char *)a->in : staging(a, me, j->h, p);
  }
  void *out = a->zero_copy ? buf[me] : a->out;
  for (int64_t k = 0; k * G * j->chunk < sv; k++) {
    for (int b = 0; b < G; b++) {
      int64_t j0 = (k * G + b) * j->chunk, j1 = j0 + j->chunk < sv ? j0 + j->chunk : sv;
      if (j0 >= sv) break;
      if (!a->zero_copy)
        for (int q = 0; q < nr; q++) {
          if (!write) copy_range(buf[me], a->in, el(j, q * sv + j0), el(j, q * sv + j1), j->es);
          else if (q != me)
            copy_range(staging(a, q, j->h, me), a->in, el(j, q * sv + j0), el(j, q * sv + j1), j->es);
        }
      if (!a->zero_copy || k == 0) DL_TRY(ar_barrier(a, j->self, b, j->seq));
      /* reduce-scatter: our slice into the output; for pull also into our
       * buffer, for push into every peer's */
      int64_t e0 = el(j, me * sv + j0), e1 = el(j, me * sv + j1);
      sum_range(out, rs, nr, e0, e1, a->dtype);
      if (!a->zero_copy && !push) copy_range(buf[me], out, e0, e1, j->es);
      if (push)
        for (int p = 0; p < nr; p++)
          if (p != me) copy_range(buf[p], out, e0, e1, j->es);
      DL_TRY(ar_barrier(a, j->self, b, j->seq));
      if (push && a->zero_copy) continue;
      for (int q = 0; q < nr; q++)
        if (q != me)
          copy_range(out, push ? buf[me] : buf[q], el(j, q * sv + j0), el(j, q * sv + j1), j->es);
    }
  }
  for (int b = 0; b < G && a->zero_copy && !push; b++) DL_TRY(ar_barrier(a, j->self, b, j->seq));
  return DL_OK;
}

/* Lamport one-shot (kernel: allreduce_one_shot_lamport_kernel): push the input,
 * cleaned and padded to whole vectors as the kernel sends it, into slot
 * `rank` of every peer's lamport half; put our own cleaned copy in our slot
 * `rank`; wait until every word of every peer's slot is filled; sum in rank
 * order; empty the slots again. */
static char *lamport(const dl_ar_args_t *a, int rank, int half, int slot) {
  return a->bufs[rank] + a->lamport_off + ((int64_t)half * a->nranks + slot) * a->lamport_stride;
}

/* Words [w0, w1) of src (nbytes of data, zeros past them), cleaned as the
 * kernels send them, into the same words of dst. */
static void lamport_put(uint32_t *dst, const void *src, int64_t nbytes, int64_t w0, int64_t w1) {
  const uint32_t *s = (const uint32_t *)src;
  const int64_t data_words = nbytes / 4, tail = nbytes % 4;
  for (int64_t w = w0; w < w1; w++) {
    uint32_t x = 0;
    if (w < data_words) memcpy(&x, s + w, 4);
    else if (w == data_words && tail) memcpy(&x, s + w, (size_t)tail);
    __atomic_store_n(dst + w, x == DL_AR_LAMPORT_EMPTY ? DL_AR_LAMPORT_NAN : x, __ATOMIC_RELAXED);
  }
}

/* Wait until words [w0, w1) of peer's slot `src` are all filled. */
static int lamport_poll(const job_t *j, const char *src, int64_t w0, int64_t w1, watch_t *wt, int peer) {
  const uint32_t *w = (const uint32_t *)src;
  for (int64_t i = w0; i < w1; i++)
    for (long k = 0; __atomic_load_n(w + i, __ATOMIC_ACQUIRE) == DL_AR_LAMPORT_EMPTY; k++)
      DL_TRY(watch_fail(j->a, wt, k, 0, peer, (uint32_t)(i / (DL_AR_VEC_BYTES / 4)), 0, j->seq));
  return DL_OK;
}

static int one_shot_lamport(const job_t *j) {
  const dl_ar_args_t *a = j->a;
  const int me = a->rank, nr = a->nranks;
  const int64_t nw = j->nv * (DL_AR_VEC_BYTES / 4);
  for (int p = 0; p < nr; p++) lamport_put((uint32_t *)lamport(a, p, j->h, me), a->in, a->n * j->es, 0, nw);
  char *src[DL_SIGNAL_MAX_RANKS];
  watch_t wt = watch_begin(a);
  for (int p = 0; p < nr; p++) {
    src[p] = lamport(a, me, j->h, p);
    DL_TRY(lamport_poll(j, src[p], 0, nw, &wt, p));
  }
  sum_range(a->out, src, nr, 0, a->n, a->dtype);
  for (int p = 0; p < nr; p++) memset(src[p], 0xff, (size_t)(nw * 4));
  return DL_OK;
}

/* The tagged form (a->tagged; kernels/allreduce/allreduce.h): payload word k
 * of the input (zeros past nbytes) travels in 64-bit word k of the slot,
 * below the seq's tag (even k) or the call's hash (odd k), and the reader
 * takes it once its tag is there; no word is cleaned. Kernel: lamport_push,
 * lamport_wait_tagged, lamport_tagged_fail. */
static uint32_t tag_of(int64_t k, uint32_t tseq, uint32_t hash) { return k & 1 ? hash : tseq; }

static void tagged_put(uint64_t *dst, const void *src, int64_t nbytes, int64_t nw, uint32_t tseq, uint32_t hash) {
  for (int64_t k = 0; k < nw; k++) {
    uint32_t x = 0;
    if ((k + 1) * 4 <= nbytes) memcpy(&x, (const char *)src + k * 4, 4);
    else if (k * 4 < nbytes) memcpy(&x, (const char *)src + k * 4, (size_t)(nbytes - k * 4));
    __atomic_store_n(dst + k, (uint64_t)tag_of(k, tseq, hash) << 32 | x, __ATOMIC_RELAXED);
  }
}

/* A peer gave up (it saw a mismatch, most likely): a peer whose call is here and
 * differs from ours is named rather than the abort. */
static int tagged_abort(const dl_ar_args_t *a, dl_ar_ctrl_t *self, uint32_t seq, int gave_up) {
  const dl_ar_call_t mine = call_of(a, seq);
  for (int q = 0; q < a->nranks; q++) {
    dl_ar_call_t theirs;
    uint32_t x;
    if (q != a->rank && call_read(self, q, seq, mine.seq, &theirs, &x) && memcmp(&theirs, &mine, sizeof mine))
      return ar_fail(a, DL_AR_FAIL_MISMATCH, 0, q, seq, seq, seq, &mine, &theirs);
  }
  return ar_fail(a, DL_AR_FAIL_ABORT, 0, gave_up, 0, 0, seq, NULL, NULL);
}

/* A tagged word of peer p said another call: p's call (announced first),
 * once here, against ours; a mismatch either way. */
static int tagged_mismatch(const dl_ar_args_t *a, dl_ar_ctrl_t *self, uint32_t seq, int p) {
  const dl_ar_call_t mine = call_of(a, seq);
  dl_ar_call_t theirs;
  uint32_t x = 0;
  watch_t w = watch_begin(a);
  for (long i = 0; !call_read(self, p, seq, mine.seq, &theirs, &x); i++) {
    int who;
    const uint32_t kind = watch_step(a, &w, i, p, &who, 1);
    if (kind == DL_AR_FAIL_ABORT) return tagged_abort(a, self, seq, who);
    if (kind) return ar_fail(a, kind, DL_AR_BLOCK_CALL, who, mine.seq, x, seq, NULL, NULL);
  }
  return ar_fail(a, DL_AR_FAIL_MISMATCH, 0, p, seq, seq, seq, &mine, &theirs);
}

/* Element i of a tagged slot. */
static float ld_tagged(const char *slot, int64_t i, int dt) {
  const int es = dt == DL_F32 ? 4 : 2;
  const int64_t b = i * es;
  const char *at = slot + b / 4 * 8 + b % 4;
  uint32_t w = 0;
  memcpy(&w, at, (size_t)es);
  if (dt == DL_F32) return dl_bits_f32(w);
  return dt == DL_F16 ? dl_f16_to_f32((uint16_t)w) : dl_bf16_to_f32((uint16_t)w);
}

/* one_shot_lamport, tagged: our input into slot `rank` of every peer's half,
 * every peer's words polled until their tags are there (another call's tag:
 * a mismatch), summed with our input in rank order, emptied. */
static int one_shot_lamport_tagged(const job_t *j) {
  const dl_ar_args_t *a = j->a;
  const int me = a->rank, nr = a->nranks;
  const int64_t nw = j->nv * (DL_AR_VEC_BYTES / 4); /* payload words = 64-bit words of the slot */
  const uint32_t tseq = dl_ar_tag_seq(j->seq), hash = a->call_hash;
  for (int p = 0; p < nr; p++)
    if (p != me) tagged_put((uint64_t *)lamport(a, p, j->h, me), a->in, a->n * j->es, nw, tseq, hash);
  const char *src[DL_SIGNAL_MAX_RANKS];
  watch_t wt = watch_begin(a);
  for (int p = 0; p < nr; p++) {
    if (p == me) continue;
    src[p] = lamport(a, me, j->h, p);
    const uint64_t *w = (const uint64_t *)src[p];
    for (int64_t k = 0; k < nw; k++) {
      const uint32_t want = tag_of(k, tseq, hash);
      uint32_t t;
      for (long i = 0; (t = (uint32_t)(__atomic_load_n(w + k, __ATOMIC_ACQUIRE) >> 32)) != want; i++) {
        if (t != DL_AR_LAMPORT_EMPTY) return tagged_mismatch(a, j->self, j->seq, p);
        int who;
        const uint32_t kind = watch_step(a, &wt, i, p, &who, 1);
        if (kind == DL_AR_FAIL_ABORT) return tagged_abort(a, j->self, j->seq, who);
        if (kind) return ar_fail(a, kind, 0, who, (uint32_t)(k / (DL_AR_VEC_BYTES / 4)), 0, j->seq, NULL, NULL);
      }
    }
  }
  for (int64_t i = 0; i < a->n; i++) {
    float acc = 0;
    for (int p = 0; p < nr; p++) {
      const float x = p == me ? ld(a->in, i, a->dtype) : ld_tagged(src[p], i, a->dtype);
      acc = p == 0 ? x : acc + x;
    }
    st(a->out, i, a->dtype, acc);
  }
  for (int p = 0; p < nr; p++)
    if (p != me) memset((char *)src[p], 0xff, (size_t)(nw * 8));
  return DL_OK;
}

/* Lamport two-shot (kernel: allreduce_two_shot_lamport_kernel): slice q of
 * the input into slot `rank` of rank q's half, in its first sv vectors (our
 * own slice into our own slot, as the one-shot twin does), wait for our slice
 * from everyone, sum it into out, clean it as the kernel does and push it
 * into slot `rank` of every peer, in its next sv vectors; wait for every
 * other slice's sum, copy it out; empty every word read. */
static int two_shot_lamport(const job_t *j) {
  const dl_ar_args_t *a = j->a;
  const int me = a->rank, nr = a->nranks;
  const int W = DL_AR_VEC_BYTES / 4;
  const int64_t sv = (j->nv + nr - 1) / nr, nbytes = a->n * j->es;
  int64_t w0[DL_SIGNAL_MAX_RANKS] = {0}, w1[DL_SIGNAL_MAX_RANKS] = {0}; /* each slice's words in the tensor */
  for (int q = 0; q < nr; q++) {
    w0[q] = (q * sv < j->nv ? q * sv : j->nv) * W;
    w1[q] = ((q + 1) * sv < j->nv ? (q + 1) * sv : j->nv) * W;
    /* the slice's words, at the slot's start */
    lamport_put((uint32_t *)lamport(a, q, j->h, me) - w0[q], a->in, nbytes, w0[q], w1[q]);
  }
  watch_t wt = watch_begin(a);
  const int64_t gather = sv * DL_AR_VEC_BYTES; /* where a slot's sums start */
  char *src[DL_SIGNAL_MAX_RANKS], *mine[DL_SIGNAL_MAX_RANKS]; /* slots; ours at the tensor's positions */
  for (int p = 0; p < nr; p++) {
    src[p] = lamport(a, me, j->h, p);
    mine[p] = src[p] - w0[me] * 4;
    if (p != me) DL_TRY(lamport_poll(j, src[p], 0, w1[me] - w0[me], &wt, p));
  }
  const int64_t e0 = w0[me] * 4 / j->es, e1 = w1[me] * 4 / j->es < a->n ? w1[me] * 4 / j->es : a->n;
  sum_range(a->out, mine, nr, e0, e1, a->dtype);
  /* the sum as it is sent: cleaned, the same bits on every rank (whole
   * words; a tensor's last half word is sent padded and kept as it is) */
  for (int64_t w = w0[me]; w < w1[me] && (w + 1) * 4 <= nbytes; w++) {
    uint32_t x;
    memcpy(&x, (char *)a->out + w * 4, 4);
    if (x == DL_AR_LAMPORT_EMPTY) memcpy((char *)a->out + w * 4, &(uint32_t){DL_AR_LAMPORT_NAN}, 4);
  }
  for (int p = 0; p < nr; p++) {
    memset(src[p], 0xff, (size_t)((w1[me] - w0[me]) * 4));
    if (p != me)
      lamport_put((uint32_t *)(lamport(a, p, j->h, me) + gather) - w0[me], a->out, nbytes, w0[me], w1[me]);
  }
  for (int q = 0; q < nr; q++) {
    if (q == me) continue;
    char *sums = src[q] + gather;
    DL_TRY(lamport_poll(j, sums, 0, w1[q] - w0[q], &wt, q));
    const int64_t b0 = w0[q] * 4, b1 = w1[q] * 4 < nbytes ? w1[q] * 4 : nbytes;
    if (b1 > b0) memcpy((char *)a->out + b0, sums, (size_t)(b1 - b0));
    memset(sums, 0xff, (size_t)((w1[q] - w0[q]) * 4));
  }
  return DL_OK;
}

int dl_allreduce_cpu(const dl_ar_args_t *a, void *stream) {
  (void)stream;
  if (a->blocks < 1 || a->blocks > DL_AR_MAX_BLOCKS || a->threads < 1 || a->unroll < 1 || a->round_vecs < 1 ||
      a->nranks < 2 || a->nranks > DL_SIGNAL_MAX_RANKS)
    return DL_ERR(DL_EINVAL, "allreduce (cpu): bad shape (%d blocks, %d x %d vectors, %d ranks)",
                  a->blocks, a->threads, a->unroll, a->nranks);
  if (a->dtype != DL_F32 && a->dtype != DL_F16 && a->dtype != DL_BF16)
    return DL_ERR(DL_EUNSUPPORTED, "allreduce (cpu): dtype %s (f32, f16, bf16 only)",
                  dl_dtype_name(a->dtype));
  const dl_ar_algo_t *row = dl_ar_algo(a->algo);
  if (!row || row->family == DL_AR_FAMILY_NCCL)
    return DL_ERR(DL_EINVAL, "allreduce (cpu): algorithm %d has no twin", a->algo);
  job_t j;
  j.a = a;
  j.self = ctrl_of(a->bufs[a->rank]);
  j.seq = __atomic_load_n(&j.self->seq, __ATOMIC_ACQUIRE);
  j.h = j.seq & 1;
  j.es = dl_dtype_size(a->dtype);
  j.L = DL_AR_VEC_BYTES / j.es;
  j.nv = (a->n + j.L - 1) / j.L;
  j.chunk = a->round_vecs;
  /* every call is compared first, also when a peer gave up already (it saw
   * a mismatch: say which); then a peer's abort voids it. Tagged calls are
   * only announced: their data says which call sent it. */
  const int tagged = a->tagged && row->tagged;
  int rc = DL_OK;
  if (tagged) ar_announce(a, j.seq);
  else rc = ar_agree(a, j.self, j.seq);
  const uint32_t ab = __atomic_load_n(&j.self->abort, __ATOMIC_ACQUIRE);
  if (rc == DL_OK && ab)
    rc = tagged ? tagged_abort(a, j.self, j.seq, (int)ab - 1)
                : ar_fail(a, DL_AR_FAIL_ABORT, 0, (int)ab - 1, 0, 0, j.seq, NULL, NULL);
  if (rc == DL_OK && tagged) rc = one_shot_lamport_tagged(&j);
  /* the twin of the row's traits (algos.h); no roles on the cpu, so the
   * pipelined and the flat push share one */
  else if (rc == DL_OK)
    rc = row->lamport  ? (row->sliced ? two_shot_lamport(&j) : one_shot_lamport(&j))
         : row->sliced ? two_shot(&j, row->push >= 1, row->push == 2)
         : row->push   ? one_shot_push(&j)
                       : one_shot(&j);
  /* a peer that gave up while we passed its last signal: this call is void */
  const uint32_t late = __atomic_load_n(&j.self->abort, __ATOMIC_ACQUIRE);
  if (rc == DL_OK && late) rc = ar_fail(a, DL_AR_FAIL_ABORT, 0, (int)late - 1, 0, 0, j.seq, NULL, NULL);
  __atomic_store_n(&j.self->seq, j.seq + 1, __ATOMIC_RELEASE);
  return rc;
}
