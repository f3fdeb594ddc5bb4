/*
 * ep.c — CPU twin of the expert-parallel dispatch/combine kernels
 * (kernels/ep/ep_dispatch.cu, ep_combine.cu): the same four phases over
 * symmetric buffers in POSIX shared memory, one process per rank, with the
 * same buffer layout, message formats, routing, epochs and handshakes
 * (kernels/ep/ep.h). The blocks of a kernel run one after another here,
 * each with the same share of the work as on the GPU (a contiguous chunk of
 * tokens on dispatch_send), and each adds its share to every peer's count as
 * each block does there: so the specs exercise the protocol itself
 * (back-to-back calls, a fast rank running into the next call, graph
 * replays, timeouts) on a machine without a GPU, and cpu and cuda give the
 * same bits (row order, fp8 codes, sums in fp32 with fmaf in k order).
 * The stream argument is unused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep.h"
#include "ep/fp8.h"
#include "common/cpu/host_wait.h"

static uint32_t *ctrl_of(const dl_ep_args_t *a, int r) { return (uint32_t *)a->bufs[r]; }

static void record(const dl_ep_args_t *a, uint32_t kind, uint32_t peer, uint32_t expected,
                   uint32_t seen, int block, uint32_t epoch) {
  dl_ep_status_t *s = a->status;
  uint32_t none = 0;
  if (!__atomic_compare_exchange_n(&s->claim, &none, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  s->phase = (uint32_t)a->phase;
  s->peer = peer;
  s->expected = expected;
  s->seen = seen;
  s->block = (uint32_t)block;
  s->epoch = epoch;
  __atomic_store_n(&s->kind, kind, __ATOMIC_RELEASE);
}

/* Whether a wait of this phase for `peer` in call `epoch` must stop, as the
 * kernels' ep_stop (kernels/ep/ep_device.cuh): the peer died (status.gone,
 * the watchdog's word), it started the other kind of call as this call (ep.h),
 * or the deadline passed; recorded (a timeout with the call waited for, e,
 * and the calls the peer's count x held). A process can be descheduled
 * between its wait's last look at the word and this test, for longer than a
 * peer takes to finish the call and exit (ep_faults_spec's 3 ranks on a
 * loaded 2-core machine): so before a death or a timeout is recorded, the
 * word p is read again, and a wait it already ends is not stopped; and a
 * death is reported as the call out of step that any peer announced, where
 * one did (the dead peer's announcement stays in this rank's words). */
static int stop(const dl_ep_args_t *a, int peer, int block, uint32_t epoch, uint32_t e, uint32_t x,
                double deadline, const uint32_t *p, uint32_t v) {
  const uint32_t *self = ctrl_of(a, a->rank);
  const uint32_t call = dl_ep_call(self, a->nranks, a->rank, a->phase, epoch);
  const uint32_t ann = __atomic_load_n(&self[dl_ep_ann(a->nranks, peer)], __ATOMIC_ACQUIRE);
  if (ann == dl_ep_ann_word(call, !dl_ep_is_dispatch(a->phase))) { /* first: it may have exited since */
    record(a, DL_EP_ERR_CALL, (uint32_t)peer, call, call | DL_EP_TAG_OTHER, block, epoch);
    return DL_ERR(DL_ESTATE, "ep: rank %d made another call", peer);
  }
  const uint32_t gone = __atomic_load_n(&a->status->gone, __ATOMIC_ACQUIRE);
  if ((gone || dl_host_now_s() > deadline) && DL_SIGNAL_REACHED(__atomic_load_n(p, __ATOMIC_ACQUIRE), v)) return DL_OK;
  if (gone) {
    /* a peer that started the other kind of call, the dead one included (its word is here), is the cause */
    for (int q = 0; q < a->nranks; q++)
      if (q != peer && __atomic_load_n(&self[dl_ep_ann(a->nranks, q)], __ATOMIC_ACQUIRE) ==
                           dl_ep_ann_word(call, !dl_ep_is_dispatch(a->phase))) {
        record(a, DL_EP_ERR_CALL, (uint32_t)q, call, call | DL_EP_TAG_OTHER, block, epoch);
        return DL_ERR(DL_ESTATE, "ep: rank %d made another call", q);
      }
    record(a, DL_EP_ERR_GONE, gone - 1, epoch, 0, block, epoch);
    return DL_ERR(DL_EPEER, "ep: rank %u has exited", gone - 1);
  }
  if (dl_host_now_s() > deadline) {
    record(a, DL_EP_ERR_TIMEOUT, (uint32_t)peer, e, dl_ep_calls_of(x), block, epoch);
    return DL_ERR(DL_ETIMEOUT, "ep: rank %d did not arrive", peer);
  }
  return DL_OK;
}

/* Until ctrl word w of this rank counts call e whole; an error (recorded,
 * the core words the message) once stop() says so. */
static int wait_word(const dl_ep_args_t *a, int64_t w, uint32_t e, int peer, int block,
                     uint32_t epoch) {
  const uint32_t *p = ctrl_of(a, a->rank) + w, v = dl_ep_count_of(e);
  const double deadline = dl_host_now_s() + a->timeout_ns * 1e-9;
  uint32_t x;
  for (long i = 0; !DL_SIGNAL_REACHED(x = __atomic_load_n(p, __ATOMIC_ACQUIRE), v); i++) {
    dl_host_pause(i);
    if (i % 16 == 0 && i > 0) DL_TRY(stop(a, peer, block, epoch, e, x, deadline, p, v));
  }
  return DL_OK;
}

/* A receive's wait for `peer`'s messages of call e, then the check that they
 * are of this call: the peer's tag of this kind is ours (ep.h). */
static int wait_sent(const dl_ep_args_t *a, int64_t w, uint32_t e, int peer, int block) {
  DL_TRY(wait_word(a, w, e, peer, block, e));
  const uint32_t *self = ctrl_of(a, a->rank);
  const uint32_t call = dl_ep_call(self, a->nranks, a->rank, a->phase, e);
  const uint32_t tag = __atomic_load_n(&self[dl_ep_tag_same(a->nranks, a->phase, peer)], __ATOMIC_ACQUIRE);
  if (tag == call) return DL_OK;
  record(a, DL_EP_ERR_CALL, (uint32_t)peer, call, tag, block, e);
  return DL_ERR(DL_ESTATE, "ep: rank %d made another call", peer);
}

/* A send's tag of call e (ep.h) into every receiver's word for us. */
static void send_tag(const dl_ep_args_t *a, uint32_t e) {
  const uint32_t call = dl_ep_call(ctrl_of(a, a->rank), a->nranks, a->rank, a->phase, e);
  for (int q = 0; q < a->nranks; q++)
    __atomic_store_n(&ctrl_of(a, q)[dl_ep_tag_same(a->nranks, a->phase, a->rank)], call, __ATOMIC_RELAXED);
}

/* The epoch of block `block` of a phase, from the counter its blocks add to
 * here (ep.h), read before the block adds its share. */
static uint32_t epoch_of(const dl_ep_args_t *a, int64_t (*flag)(int, int)) {
  return dl_ep_calls_of(__atomic_load_n(&ctrl_of(a, a->rank)[flag(a->nranks, a->rank)], __ATOMIC_ACQUIRE)) + 1;
}

/* A send's start: the call it starts (ep.h) into every rank's ann word for us. */
static void announce(const dl_ep_args_t *a) {
  const uint32_t e = epoch_of(a, dl_ep_is_dispatch(a->phase) ? dl_ep_disp_flag : dl_ep_comb_flag);
  const uint32_t w = dl_ep_ann_word(dl_ep_call(ctrl_of(a, a->rank), a->nranks, a->rank, a->phase, e),
                                    dl_ep_is_dispatch(a->phase));
  for (int q = 0; q < a->nranks; q++) __atomic_store_n(&ctrl_of(a, q)[dl_ep_ann(a->nranks, a->rank)], w, __ATOMIC_RELAXED);
}

/* The end of block `block` of a phase: it adds its share to word `flag(rank)`
 * of every rank (release), as each block does on the GPU. */
static void finish_block(const dl_ep_args_t *a, int block, int64_t (*flag)(int, int)) {
  for (int q = 0; q < a->nranks; q++)
    __atomic_fetch_add(&ctrl_of(a, q)[flag(a->nranks, a->rank)], dl_ep_share(block, a->blocks), __ATOMIC_RELEASE);
}

static int64_t row_bytes(const dl_ep_args_t *a) { return a->fp8 ? a->hidden : 2 * (int64_t)a->hidden; }

/* ---- routing and payloads ------------------------------------------------------ */

/* A block's routing of its chunk of tokens: per entry (t, k) the expert (-1:
 * none), the token's slot at the destination rank (its position among our
 * tokens for that rank), its position among our tokens for the expert, and
 * the mask of the token's selections on that rank. */
typedef struct route {
  int e, slot, pos;
  uint32_t kmask;
} route_t;

/* Selection k of token t: its expert, or -1 for an id of -1, one out of
 * range, or an expert that an earlier k of the token picked already (a
 * second row for one (token, expert) could overflow the B rows that every
 * (expert, source) has in the receive slots and expert-major outputs). */
static int expert_of(const dl_ep_args_t *a, int t, int k) {
  const int32_t *row = a->idx + (int64_t)t * a->topk;
  const int e = row[k];
  if (e < 0 || e >= a->experts) return -1;
  for (int j = 0; j < k; j++)
    if (row[j] == e) return -1;
  return e;
}

/* hist_e / hist_r: selections per expert and tokens per rank of rows [0, t0)
 * (the scan every block does), then rows [t0, t1) walked in order. */
static void route_chunk(const dl_ep_args_t *a, int t0, int t1, int *hist_e, int *hist_r,
                        route_t *rt, int block, uint32_t epoch) {
  const int K = a->topk, L = a->local;
  memset(hist_e, 0, sizeof(int) * (size_t)a->experts);
  memset(hist_r, 0, sizeof(int) * (size_t)a->nranks);
  for (int t = 0; t < t0; t++) {
    uint32_t ranks = 0;
    for (int k = 0; k < K; k++) {
      const int e = expert_of(a, t, k);
      if (e < 0) continue;
      hist_e[e]++;
      if (!(ranks >> (e / L) & 1u)) hist_r[e / L]++;
      ranks |= 1u << (e / L);
    }
  }
  for (int t = t0; t < t1; t++) {
    route_t *r = rt + (int64_t)(t - t0) * K;
    for (int k = 0; k < K; k++) {
      const int raw = a->idx[(int64_t)t * K + k];
      r[k].e = expert_of(a, t, k);
      if (r[k].e < 0 && raw != -1) /* out of range, or repeated */
        record(a, DL_EP_ERR_BAD_ID, (uint32_t)t, (uint32_t)k, (uint32_t)raw, block, epoch);
    }
    /* every selection reads the counts before its row advances them, as the
     * lanes of the kernel's warp do */
    for (int k = 0; k < K; k++) {
      const int e = r[k].e;
      if (e < 0) continue;
      int before_e = 0;
      uint32_t kmask = 0;
      for (int j = 0; j < K; j++) {
        if (r[j].e >= 0 && r[j].e / L == e / L) kmask |= 1u << j;
        if (j < k && r[j].e == e) before_e++;
      }
      r[k].kmask = kmask;
      r[k].slot = hist_r[e / L];
      r[k].pos = hist_e[e] + before_e;
    }
    for (int k = 0; k < K; k++) {
      const int e = r[k].e;
      if (e < 0) continue;
      if ((r[k].kmask & ((1u << k) - 1u)) == 0) hist_r[e / L]++; /* the rank's first selection */
      hist_e[e]++;
    }
  }
}

/* The fp8 payload of one row: codes [H] then scales [H/128]. */
static void quantize_row(const uint16_t *x, int h, uint8_t *codes, float *scales) {
  for (int g = 0; g < h / DL_EP_FP8_GROUP; g++) {
    const uint16_t *xg = x + (int64_t)g * DL_EP_FP8_GROUP;
    float amax = DL_EP_FP8_AMIN;
    for (int i = 0; i < DL_EP_FP8_GROUP; i++) amax = fmaxf(amax, fabsf(dl_bf16_to_f32(xg[i])));
    const float inv = DL_EP_FP8_MAX / amax;
    for (int i = 0; i < DL_EP_FP8_GROUP; i++)
      codes[(int64_t)g * DL_EP_FP8_GROUP + i] = dl_f32_to_e4m3(dl_bf16_to_f32(xg[i]) * inv);
    scales[g] = amax / DL_EP_FP8_MAX;
  }
}

static void write_payload(const dl_ep_args_t *a, int t, char *msg) {
  const uint16_t *x = (const uint16_t *)a->x + (int64_t)t * a->hidden;
  if (a->fp8) quantize_row(x, a->hidden, (uint8_t *)msg, (float *)(msg + a->hidden));
  else memcpy(msg, x, 2 * (size_t)a->hidden);
}

/* ---- the layouts' twins (kernels/ep/ep_per_expert.cuh, ep_per_rank.cuh) ---------- */

/* per_expert: a message per selection, header (token, row, k | kmask << 8, weight). */
static char *send_per_expert(const dl_ep_args_t *a, int t, const route_t *r, int k) {
  const int K = a->topk, q = r[k].e / a->local, le = r[k].e % a->local;
  char *msg = a->bufs[q] + a->drecv_off + (((int64_t)le * a->nranks + a->rank) * a->max_tokens + r[k].pos) * a->msg_d;
  int32_t *h = (int32_t *)msg;
  h[0] = t;
  h[1] = r[k].slot;
  h[2] = (int32_t)((uint32_t)k | r[k].kmask << 8);
  memcpy(&h[3], &a->w[(int64_t)t * K + k], 4);
  return msg;
}

/* per_rank: a message per rank, its first selection's; the header carries
 * every selection of the token on that rank. */
static char *send_per_rank(const dl_ep_args_t *a, int t, const route_t *r, int k) {
  const int K = a->topk, L = a->local, q = r[k].e / L;
  if (r[k].kmask & ((1u << k) - 1u)) return NULL;
  char *msg = a->bufs[q] + a->drecv_off + ((int64_t)a->rank * a->max_tokens + r[k].slot) * a->msg_d;
  int32_t *h = (int32_t *)msg;
  memset(msg, 0, (size_t)a->hdr);
  h[0] = t;
  for (int j = 0; j < K; j++) {
    const int on = r[j].e >= 0 && r[j].e / L == q;
    const uint32_t lp = on ? ((uint32_t)(r[j].e % L) & 0xffffu) | ((uint32_t)r[j].pos << 16) : 0xffffu;
    memcpy(msg + 4 + 8 * j, &lp, 4);
    const float w = on ? a->w[(int64_t)t * K + j] : 0.0f;
    memcpy(msg + 8 + 8 * j, &w, 4);
  }
  return msg;
}

static void copy_payload(const dl_ep_args_t *a, const char *payload, int64_t row) {
  const int64_t rb = row_bytes(a);
  memcpy((char *)a->rx + row * rb, payload, (size_t)rb);
  if (a->fp8)
    memcpy(a->rscales + row * (a->hidden / DL_EP_FP8_GROUP), payload + a->hidden,
           sizeof(float) * (size_t)(a->hidden / DL_EP_FP8_GROUP));
}

/* off[le * N + s]: the row where source s's tokens for expert le start */
static void expert_offsets(const dl_ep_args_t *a, const uint32_t *self, int64_t *off) {
  const int N = a->nranks, L = a->local;
  for (int le = 0; le < L; le++) {
    int64_t sum = 0;
    for (int s = 0; s < N; s++) {
      off[le * N + s] = sum;
      sum += self[dl_ep_cnt(N, L, s, le)];
    }
  }
}

static void recv_per_rank_row(const dl_ep_args_t *a, const int64_t *off, int s, int j) {
  const int K = a->topk, N = a->nranks, B = a->max_tokens;
  const char *msg = a->bufs[a->rank] + a->drecv_off + ((int64_t)s * B + j) * a->msg_d;
  const int32_t t = *(const int32_t *)msg;
  const char *payload = msg + a->hdr;
  int kfirst = -1;
  for (int k = 0; k < K; k++) {
    uint32_t lp;
    float w;
    memcpy(&lp, msg + 4 + 8 * k, 4);
    memcpy(&w, msg + 8 + 8 * k, 4);
    const int le = (int16_t)(lp & 0xffffu), pos = (int)(lp >> 16);
    if (a->output == DL_EP_RANK_MAJOR) {
      const int64_t at = ((int64_t)s * B + j) * K + k;
      a->rids[at] = le;
      a->rweights[at] = le >= 0 ? w : 0.0f;
      if (le >= 0 && kfirst < 0) {
        kfirst = k;
        a->rsrc[((int64_t)s * B + j) * 2] = t;
        a->rsrc[((int64_t)s * B + j) * 2 + 1] = dl_ep_src_pack(s, k, le);
      }
    } else if (le >= 0) {
      const int64_t row = (int64_t)le * N * B + off[le * N + s] + pos;
      copy_payload(a, payload, row);
      a->rsrc[row * 2] = t;
      a->rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
    }
  }
  if (a->output == DL_EP_RANK_MAJOR) copy_payload(a, payload, (int64_t)s * B + j);
}

static void recv_per_expert_row(const dl_ep_args_t *a, const int64_t *off, int le, int s, int j) {
  const int K = a->topk, N = a->nranks, B = a->max_tokens;
  const char *msg =
      a->bufs[a->rank] + a->drecv_off + (((int64_t)le * N + s) * B + j) * a->msg_d;
  const int32_t *h = (const int32_t *)msg;
  const int t = h[0], row_q = h[1], k = (int)((uint32_t)h[2] & 0xffu);
  const uint32_t kmask = (uint32_t)h[2] >> 8;
  float w;
  memcpy(&w, &h[3], 4);
  if (a->output == DL_EP_EXPERT_MAJOR) {
    const int64_t row = (int64_t)le * N * B + off[le * N + s] + j;
    copy_payload(a, msg + a->hdr, row);
    a->rsrc[row * 2] = t;
    a->rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
    return;
  }
  const int64_t row = (int64_t)s * B + row_q;
  if ((kmask & ((1u << k) - 1u)) == 0) { /* the token's first selection here: the row's owner */
    copy_payload(a, msg + a->hdr, row);
    for (int kk = 0; kk < K; kk++)
      if (!(kmask >> kk & 1u)) {
        a->rids[row * K + kk] = -1;
        a->rweights[row * K + kk] = 0.0f;
      }
    a->rsrc[row * 2] = t;
    a->rsrc[row * 2 + 1] = dl_ep_src_pack(s, k, le);
  }
  a->rids[row * K + k] = le;
  a->rweights[row * K + k] = w;
}

/* Block b's messages (of G): i = b, b + G, ... in the order the kernel numbers them. */
static void recv_per_rank(const dl_ep_args_t *a, const uint32_t *self, const int64_t *off, int b) {
  int64_t i = 0;
  for (int s = 0; s < a->nranks; s++)
    for (int j = 0; j < (int)self[dl_ep_ntok(a->nranks, s)]; j++, i++)
      if (i % a->blocks == b) recv_per_rank_row(a, off, s, j);
}

static void recv_per_expert(const dl_ep_args_t *a, const uint32_t *self, const int64_t *off, int b) {
  const int N = a->nranks, L = a->local;
  int64_t i = 0;
  for (int le = 0; le < L; le++)
    for (int s = 0; s < N; s++)
      for (int j = 0; j < (int)self[dl_ep_cnt(N, L, s, le)]; j++, i++)
        if (i % a->blocks == b) recv_per_expert_row(a, off, le, s, j);
}

/* The combine slot of a token's selection k, expert e: one per expert, or one per k. */
static int64_t slot_per_expert(int k, int64_t e) { return e; }
static int64_t slot_per_rank(int k, int64_t e) { return k; }

/* The layouts' twins (the kernels' policies: ep_per_expert.cuh, ep_per_rank.cuh). */
static const struct layout_twin {
  /* the message of selection k (an expert) of token t, written but for its
   * payload: where the payload goes (NULL: k sends none) */
  char *(*send)(const dl_ep_args_t *a, int t, const route_t *r, int k);
  /* block b's messages into the outputs */
  void (*recv)(const dl_ep_args_t *a, const uint32_t *self, const int64_t *off, int b);
  int64_t (*combine_slot)(int k, int64_t e);
} layouts[] = {
    [DL_EP_PER_EXPERT] = {send_per_expert, recv_per_expert, slot_per_expert},
    [DL_EP_PER_RANK] = {send_per_rank, recv_per_rank, slot_per_rank},
};

/* ---- dispatch, both halves ------------------------------------------------------- */

/* Token t's messages, as its layout writes them, each with its payload. */
static void send_messages(const dl_ep_args_t *a, int t, const route_t *r) {
  for (int k = 0; k < a->topk; k++) {
    if (r[k].e < 0) continue;
    char *msg = layouts[a->layout].send(a, t, r, k);
    if (msg) write_payload(a, t, msg + a->hdr);
  }
}

static int dispatch_send(const dl_ep_args_t *a) {
  const int G = a->blocks, K = a->topk, T = a->tokens, L = a->local;
  const int C = T > 0 ? (T + G - 1) / G : 0;
  int *hist_e = malloc(sizeof(int) * ((size_t)a->experts + (size_t)a->nranks));
  route_t *rt = malloc(sizeof(route_t) * ((size_t)C * K + 1));
  if (!hist_e || !rt) {
    free(hist_e);
    free(rt);
    return DL_ERR(DL_ENOMEM, "ep dispatch: out of host memory");
  }
  int *hist_r = hist_e + a->experts, rc = DL_OK;
  announce(a);
  for (int b = 0; b < G && rc == DL_OK; b++) {
    const uint32_t e = epoch_of(a, dl_ep_disp_flag);
    /* the receivers have read our previous messages */
    for (int q = 0; q < a->nranks && rc == DL_OK; q++)
      rc = wait_word(a, dl_ep_disp_done(a->nranks, q), e - 1, q, b, e);
    if (rc) break;
    const int t0 = b * C < T ? b * C : T, t1 = t0 + C < T ? t0 + C : T;
    route_chunk(a, t0, t1, hist_e, hist_r, rt, b, e);
    for (int t = t0; t < t1; t++) {
      const route_t *r = rt + (int64_t)(t - t0) * K;
      send_messages(a, t, r);
      for (int k = 0; k < K; k++) {
        a->hidx[(int64_t)t * K + k] = r[k].e;
        a->hw[(int64_t)t * K + k] = a->w[(int64_t)t * K + k];
      }
    }
    if (b == G - 1) send_tag(a, e); /* the call's tag (ep.h), with the counts */
    if (b == G - 1) /* its scan and walk covered every token: the counts */
      for (int q = 0; q < a->nranks; q++) {
        uint32_t *c = ctrl_of(a, q);
        for (int le = 0; le < L; le++)
          c[dl_ep_cnt(a->nranks, L, a->rank, le)] = (uint32_t)hist_e[q * L + le];
        c[dl_ep_ntok(a->nranks, a->rank)] = (uint32_t)hist_r[q];
      }
    finish_block(a, b, dl_ep_disp_flag);
  }
  free(hist_e);
  free(rt);
  return rc;
}

static int dispatch_recv(const dl_ep_args_t *a) {
  const int N = a->nranks, L = a->local, G = a->blocks;
  uint32_t *self = ctrl_of(a, a->rank);
  int64_t *off = malloc(sizeof(int64_t) * (size_t)N * L);
  if (!off) return DL_ERR(DL_ENOMEM, "ep dispatch: out of host memory");
  int rc = DL_OK;
  for (int b = 0; b < G && rc == DL_OK; b++) {
    const uint32_t e = epoch_of(a, dl_ep_disp_done);
    for (int s = 0; s < N && rc == DL_OK; s++) rc = wait_sent(a, dl_ep_disp_flag(N, s), e, s, b);
    if (rc) break;
    expert_offsets(a, self, off);
    if (b == 0) {
      if (a->output == DL_EP_EXPERT_MAJOR)
        for (int le = 0; le < L; le++) {
          int32_t sum = 0;
          for (int s = 0; s < N; s++) sum += (int32_t)self[dl_ep_cnt(N, L, s, le)];
          a->rcounts[le] = sum;
        }
      else
        for (int s = 0; s < N; s++) a->rcounts[s] = (int32_t)self[dl_ep_ntok(N, s)];
    }
    layouts[a->layout].recv(a, self, off, b);
    finish_block(a, b, dl_ep_disp_done);
  }
  free(off);
  return rc;
}

/* ---- combine ---------------------------------------------------------------------- */

/* Where the output of row `row` goes: its owner and the slot there. */
static char *combine_dst(const dl_ep_args_t *a, int64_t row) {
  const int t = a->rsrc[row * 2];
  const uint32_t p = (uint32_t)a->rsrc[row * 2 + 1];
  const int s = (int)(p & 0xffu), k = (int)((p >> 8) & 0xffu), le = (int)(p >> 16);
  const int64_t slot = a->layout == DL_EP_PER_RANK ? k : (int64_t)a->rank * a->local + le;
  return a->bufs[s] + a->crecv_off + (slot * a->max_tokens + t) * a->msg_c;
}

static int combine_send(const dl_ep_args_t *a) {
  const int N = a->nranks, B = a->max_tokens, G = a->blocks, H = a->hidden;
  const int groups = a->output == DL_EP_EXPERT_MAJOR ? a->local : N;
  const int64_t per_group = a->output == DL_EP_EXPERT_MAJOR ? (int64_t)N * B : B;
  int rc = DL_OK;
  announce(a);
  for (int b = 0; b < G && rc == DL_OK; b++) {
    const uint32_t e = epoch_of(a, dl_ep_comb_flag);
    for (int s = 0; s < N && rc == DL_OK; s++) rc = wait_word(a, dl_ep_comb_done(N, s), e - 1, s, b, e);
    if (rc) break;
    if (b == 0) send_tag(a, e); /* the call's tag (ep.h), ahead of block 0's count */
    int64_t i = 0;
    for (int g = 0; g < groups; g++)
      for (int64_t r = 0; r < a->rcounts[g]; r++, i++)
        if (i % G == b) {
          const int64_t row = g * per_group + r;
          memcpy(combine_dst(a, row), (const uint16_t *)a->y + row * H, 2 * (size_t)H);
        }
    finish_block(a, b, dl_ep_comb_flag);
  }
  return rc;
}

static int combine_recv(const dl_ep_args_t *a) {
  const int N = a->nranks, K = a->topk, B = a->max_tokens, G = a->blocks, H = a->hidden;
  const char *base = a->bufs[a->rank] + a->crecv_off;
  int rc = DL_OK;
  float *acc = malloc(sizeof(float) * (size_t)(H > 0 ? H : 1));
  if (!acc) return DL_ERR(DL_ENOMEM, "ep combine: out of host memory");
  for (int b = 0; b < G && rc == DL_OK; b++) {
    const uint32_t e = epoch_of(a, dl_ep_comb_done);
    for (int q = 0; q < N && rc == DL_OK; q++) rc = wait_sent(a, dl_ep_comb_flag(N, q), e, q, b);
    if (rc) break;
    for (int t = b; t < a->tokens; t += G) {
      for (int i = 0; i < H; i++) acc[i] = 0.0f;
      for (int k = 0; k < K; k++) {
        const int ex = a->hidx[(int64_t)t * K + k];
        if (ex < 0) continue;
        float w = a->hw[(int64_t)t * K + k];
        if (a->output == DL_EP_RANK_MAJOR) { /* one row per rank, already weighted */
          int first = 1;
          for (int j = 0; j < k; j++)
            if (a->hidx[(int64_t)t * K + j] >= 0 && a->hidx[(int64_t)t * K + j] / a->local == ex / a->local)
              first = 0;
          if (!first) continue;
          w = 1.0f;
        }
        const int64_t slot = layouts[a->layout].combine_slot(k, ex);
        const uint16_t *y = (const uint16_t *)(base + (slot * B + t) * a->msg_c);
        for (int i = 0; i < H; i++) acc[i] = fmaf(w, dl_bf16_to_f32(y[i]), acc[i]);
      }
      uint16_t *o = (uint16_t *)a->out + (int64_t)t * H;
      for (int i = 0; i < H; i++) o[i] = dl_f32_to_bf16(acc[i]);
    }
    finish_block(a, b, dl_ep_comb_done);
  }
  free(acc);
  return rc;
}

/* A send and its receive in one call (DL_EP_DISPATCH / DL_EP_COMBINE, one
 * kernel on cuda): each half counts and records as its own phase; a bad
 * expert id the send reports (DL_EINVAL) does not stop the receive. */
static int fused(const dl_ep_args_t *a, int send_phase, int (*send)(const dl_ep_args_t *),
                 int (*recv)(const dl_ep_args_t *)) {
  dl_ep_args_t b = *a;
  b.phase = send_phase;
  const int rc = send(&b);
  if (rc < 0 && rc != DL_EINVAL) return rc;
  b.phase = send_phase + 1;
  const int rc2 = recv(&b);
  return rc2 < 0 ? rc2 : rc;
}

int dl_ep_cpu(const dl_ep_args_t *a, void *stream) {
  (void)stream;
  switch (a->phase) {
  case DL_EP_DISPATCH_SEND: return dispatch_send(a);
  case DL_EP_DISPATCH_RECV: return dispatch_recv(a);
  case DL_EP_COMBINE_SEND: return combine_send(a);
  case DL_EP_COMBINE_RECV: return combine_recv(a);
  case DL_EP_DISPATCH: return fused(a, DL_EP_DISPATCH_SEND, dispatch_send, dispatch_recv);
  case DL_EP_COMBINE: return fused(a, DL_EP_COMBINE_SEND, combine_send, combine_recv);
  default: return DL_ERR(DL_EINVAL, "ep: unknown phase %d", a->phase);
  }
}
