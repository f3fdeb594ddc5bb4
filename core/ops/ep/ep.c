/*
 * ep.c — the expert-parallel dispatch/combine object: a communicator, a
 * symmetric buffer laid out for the kernels (kernels/ep/ep.h), the output
 * and handle tensors, its lifetime and the failure record turned into
 * errors (the hooks of the device-op lifecycle, core/ops/common/devop.h).
 * The phases and their order: ep_run.c.
 *
 * Memory: the symmetric buffer is mapped outside the allocator, so each part
 * is charged to its tag (ep_dispatch_recv, ...; dl_mem_charge) and the
 * reports see it; on meta nothing is mapped and the bytes a cpu rank would
 * map are charged, for any world size (on cuda the buffer is in whole 2 MiB
 * pages, at most 2 MiB more, charged to signals). The outputs come from the
 * allocator under ep_outputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_int.h"
#include "mem/alloc.h"
#include "base/device.h"

enum { CPU_BLOCKS = 4 };

static const char *const part_names[] = {
    [DL_EP_DISPATCH_SEND_BYTES] = "dispatch_send", [DL_EP_DISPATCH_RECV_BYTES] = "dispatch_recv",
    [DL_EP_COMBINE_SEND_BYTES] = "combine_send",   [DL_EP_COMBINE_RECV_BYTES] = "combine_recv",
    [DL_EP_SIGNALS_BYTES] = "signals",             [DL_EP_TOTAL_BYTES] = "total",
    [DL_EP_OUTPUTS_BYTES] = "outputs",
};
_Static_assert(sizeof part_names / sizeof *part_names == DL_EP_NUM_PARTS, "every part needs a name");

const char *dl_ep_part_name(int part) {
  return part >= 0 && part < DL_EP_NUM_PARTS ? part_names[part] : NULL;
}

static const char *const phase_names[] = {"dispatch send", "dispatch recv", "combine send",
                                          "combine recv", "dispatch", "combine"};
/* what each phase's waits wait for, for messages */
static const char *const phase_waits[] = {
    "to finish reading this rank's previous dispatch", "for its dispatch messages",
    "to finish reading this rank's previous combine", "for its combine messages"};

static const char *layout_name(int l) { return dl_ep_layout_name(l) ? dl_ep_layout_name(l) : "?"; }
static const char *output_name(int o) { return o == DL_EP_RANK_MAJOR ? "rank_major" : "expert_major"; }

/* "ep dispatch recv (per_rank, expert_major, bf16) on rank 1 of 4 (comm 'w', cpu:0)" */
int dl_ep_describe(const dl_ep_t *ep, int phase, char *buf, size_t len) {
  char what[96];
  snprintf(what, sizeof what, "ep %s (%s, %s, %s)", phase_names[phase], layout_name(ep->cfg.layout),
           output_name(ep->cfg.output), ep->cfg.fp8 ? "fp8" : "bf16");
  return dl_devop_describe(&ep->op, what, buf, len);
}

/* A call out of step (DL_EP_ERR_CALL, kernels/ep/ep.h): the peer's tag of
 * the other kind equal to this call's, or its tag of this kind another. */
static int called(const dl_ep_t *ep, const volatile dl_ep_status_t *s, const char *what, int phase) {
  const int dispatch = phase < DL_EP_COMBINE_SEND, other = (s->seen & DL_EP_TAG_OTHER) != 0;
  const char *mine = dispatch ? "dispatch" : "combine", *theirs = dispatch != other ? "dispatch" : "combine";
  const unsigned tag = s->seen & ~DL_EP_TAG_OTHER;
  if (other)
    return DL_ERR(DL_ESTATE,
                  "%s: rank %u made a %s as its ep call %u where this rank made %s %u (its call %u): every "
                  "rank must make the same ep calls (dispatch, combine) in the same order",
                  what, s->peer, theirs, tag, mine, s->epoch, s->expected);
  return DL_ERR(DL_ESTATE,
                "%s: rank %u's %s %u was its ep call %u, this rank's %s %u is its call %u: every rank "
                "must make the same ep calls (dispatch, combine) in the same order",
                what, s->peer, mine, s->epoch, tag, mine, s->epoch, s->expected);
}

/* What the kernels recorded, as an error (dl_devop_recorded_failure): a
 * timeout kills the object, a bad expert id is reported once. */
static int recorded(dl_devop_t *op, int *fatal) {
  dl_ep_t *ep = (dl_ep_t *)op;
  volatile dl_ep_status_t *s = ep->status;
  *fatal = 1;
  if (s->kind == 0) return DL_OK;
  char what[256];
  const int phase = s->phase < 4 ? (int)s->phase : 0;
  dl_ep_describe(ep, phase, what, sizeof what);
  if (s->kind == DL_EP_ERR_BAD_ID) {
    /* an id in range was recorded because an earlier k of the token picked it */
    const int repeated = (int)s->seen >= 0 && (int)s->seen < ep->cfg.experts;
    int rc = repeated
                 ? DL_ERR(DL_EINVAL,
                          "%s, call %u: topk_idx[%u][%u] = %d picks an expert that token %u "
                          "picked already (a token's top-k experts must differ); that selection "
                          "was dropped",
                          what, s->epoch, s->peer, s->expected, (int)s->seen, s->peer)
                 : DL_ERR(DL_EINVAL,
                          "%s, call %u: topk_idx[%u][%u] = %d is not an expert id (-1 or 0..%d); "
                          "that selection was dropped",
                          what, s->epoch, s->peer, s->expected, (int)s->seen, ep->cfg.experts - 1);
    s->kind = 0;
    s->claim = 0; /* reported: the next failure may record itself */
    *fatal = 0;
    return rc;
  }
  if (s->kind == DL_EP_ERR_GONE) {
    char dead[96];
    dl_devop_gone_str(&ep->op, s->peer + 1, dead, sizeof dead);
    return DL_ERR(DL_EPEER, "%s: %s (block %u waited %s, call %u)", what, dead, s->block, phase_waits[phase],
                  s->epoch);
  }
  if (s->kind == DL_EP_ERR_CALL)
    return called(ep, s, what, phase);
  return DL_ERR(DL_ETIMEOUT,
                "%s: rank %u did not arrive within %.1f s (block %u waited %s, call %u; its "
                "count here is %u); did every rank make the same ep calls?",
                what, s->peer, ep->op.timeout_s, s->block, phase_waits[phase], s->expected, s->seen);
}

/* ---- lifetime -------------------------------------------------------------------- */

static int check_config(const dl_ep_config_t *c, const dl_comm_info_t *ci) {
  DL_CHECK_ARG(c, "dl_ep_new: config is NULL");
  DL_CHECK_ARG(c->max_tokens >= 1 && c->max_tokens <= DL_EP_MAX_TOKENS,
               "ep: max_tokens %d is not in 1..%d", c->max_tokens, DL_EP_MAX_TOKENS);
  DL_CHECK_ARG(c->hidden >= 8 && c->hidden % 8 == 0,
               "ep: hidden %d is not a positive multiple of 8 (16-byte rows)", c->hidden);
  DL_CHECK_ARG(!c->fp8 || c->hidden % DL_EP_FP8_GROUP == 0,
               "ep: hidden %d is not a multiple of 128, which fp8 dispatch needs (one scale per 128 "
               "values)", c->hidden);
  DL_CHECK_ARG(c->experts >= 1 && c->experts % ci->size == 0,
               "ep: experts %d is not a positive multiple of the %d ranks", c->experts, ci->size);
  DL_CHECK_ARG(c->experts / ci->size <= DL_EP_MAX_TOKENS,
               "ep: %d local experts (at most %d)", c->experts / ci->size, DL_EP_MAX_TOKENS);
  DL_CHECK_ARG(c->topk >= 1 && c->topk <= DL_EP_MAX_TOPK && c->topk <= c->experts,
               "ep: topk %d is not in 1..min(%d, experts %d)", c->topk, DL_EP_MAX_TOPK, c->experts);
  DL_CHECK_ARG(dl_ep_layout_name(c->layout), "ep: unknown layout %d", c->layout);
  DL_CHECK_ARG(c->output == DL_EP_EXPERT_MAJOR || c->output == DL_EP_RANK_MAJOR,
               "ep: unknown output %d", c->output);
  DL_CHECK_ARG(c->blocks >= 0 && c->blocks <= DL_EP_MAX_BLOCKS,
               "ep: blocks %d is not in 1..%d (0: the default grid)", c->blocks, DL_EP_MAX_BLOCKS);
  DL_CHECK_ARG(ci->dev_type == DL_META || ci->size <= DL_SIGNAL_MAX_RANKS,
               "ep: comm '%s' has %d ranks; the kernels span one host of at most %d (meta counts "
               "bytes for any size)", ci->name, ci->size, DL_SIGNAL_MAX_RANKS);
  return DL_OK;
}

/* A store wait of agree() for rank r that failed: a rank that made no such
 * buffer (an extra one here) times out there. */
static int absent(const dl_ep_t *ep, int rc, int r, int id) {
  if (rc != DL_ETIMEOUT) return rc;
  return DL_ERR(DL_ETIMEOUT,
                "ep: rank %d did not make this ep buffer within %.1f s (rank %d's symmetric object %d on comm "
                "'%s'): every rank must make the same ep buffers, in the same order",
                r, ep->op.timeout_s, ep->op.rank, id, ep->op.comm_name);
}

/* Every rank was given the same configuration: a mismatch fails on every
 * rank, naming the options that differ (then the Lamport slots, which follow
 * from them and DISTLAB_EP_LAMPORT_MAX_ROWS). */
static int agree(dl_ep_t *ep, int id) {
  if (ep->op.dev_type == DL_META || ep->op.size == 1) return DL_OK;
  char key[64];
  dl_ep_config_t mine = ep->cfg, theirs;
  mine.blocks = 0; /* grids are each rank's own */
  snprintf(key, sizeof key, "ep%d/cfg/%d", id, ep->op.rank);
  DL_TRY(dl_comm_store_set(ep->op.comm, key, &mine, sizeof mine));
  int32_t lamport = ep->base.lamport, their_lamport = 0;
  snprintf(key, sizeof key, "ep%d/lamport/%d", id, ep->op.rank);
  DL_TRY(dl_comm_store_set(ep->op.comm, key, &lamport, sizeof lamport));
  for (int r = 0; r < ep->op.size; r++) {
    snprintf(key, sizeof key, "ep%d/cfg/%d", id, r);
    DL_TRY(absent(ep, dl_comm_store_get(ep->op.comm, key, &theirs, sizeof theirs), r, id));
    theirs.blocks = 0;
    if (memcmp(&mine, &theirs, sizeof mine) != 0)
      return DL_ERR(DL_EINVAL,
                    "ep: ranks disagree on the buffer: rank %d has max_tokens %d, hidden %d, "
                    "experts %d, topk %d, %s, %s, %s; rank %d has %d, %d, %d, %d, %s, %s, %s",
                    ep->op.rank, mine.max_tokens, mine.hidden, mine.experts, mine.topk,
                    layout_name(mine.layout), output_name(mine.output), mine.fp8 ? "fp8" : "bf16", r,
                    theirs.max_tokens, theirs.hidden, theirs.experts, theirs.topk,
                    layout_name(theirs.layout), output_name(theirs.output), theirs.fp8 ? "fp8" : "bf16");
  }
  for (int r = 0; r < ep->op.size; r++) {
    snprintf(key, sizeof key, "ep%d/lamport/%d", id, r);
    DL_TRY(absent(ep, dl_comm_store_get(ep->op.comm, key, &their_lamport, sizeof their_lamport), r, id));
    if (their_lamport != lamport)
      return DL_ERR(DL_EINVAL,
                    "ep: ranks disagree on the dispatch's and combine's slots: rank %d %s Lamport slots, rank %d %s "
                    "(DISTLAB_EP_LAMPORT_MAX_ROWS differs between them: set it alike on every rank)",
                    ep->op.rank, lamport ? "uses" : "does not use", r, their_lamport ? "does" : "does not");
  }
  return DL_OK;
}

/* agree()'s keys of this rank, once every rank read them (they all passed
 * symm's barrier): the store keeps no keys of a buffer. */
static int forget(dl_ep_t *ep, int id) {
  if (ep->op.dev_type == DL_META || ep->op.size == 1) return DL_OK;
  char key[64];
  snprintf(key, sizeof key, "ep%d/cfg/%d", id, ep->op.rank);
  DL_TRY(dl_comm_store_delete(ep->op.comm, key));
  snprintf(key, sizeof key, "ep%d/lamport/%d", id, ep->op.rank);
  return dl_comm_store_delete(ep->op.comm, key);
}

/* Part sizes and the offsets of the regions (kernels/ep/ep.h). */
static void lay_out(dl_ep_t *ep) {
  const dl_ep_config_t *c = &ep->cfg;
  dl_ep_args_t *a = &ep->base;
  a->hdr = dl_ep_hdr_bytes(c->layout, c->topk);
  a->msg_d = dl_ep_msg_d(c->layout, c->fp8, c->topk, c->hidden);
  a->msg_c = dl_ep_msg_c(c->hidden);
  const int64_t drecv = dl_ep_dispatch_bytes(c->layout, dl_ep_dispatch_lamport(c->layout, a->lamport, c->output, c->fp8),
                                             ep->op.size, c->experts, c->max_tokens, a->msg_d);
  const int64_t crecv = dl_ep_combine_slots(c->layout, a->lamport, c->experts, c->topk, c->max_tokens) * a->msg_c;
  a->drecv_off = dl_ep_ctrl_bytes(ep->op.size, ep->local);
  a->crecv_off = a->drecv_off + drecv;
  /* what the symmetric buffer maps: its rounding and signal pad (on cuda
   * whole 2 MiB pages) count as signals */
  const int64_t mapped = dl_symm_mapped_bytes(ep->op.dev_type, a->crecv_off + crecv);
  ep->bytes[DL_EP_DISPATCH_SEND_BYTES] = 0; /* messages go straight into the peers' slots */
  ep->bytes[DL_EP_DISPATCH_RECV_BYTES] = drecv;
  ep->bytes[DL_EP_COMBINE_SEND_BYTES] = 0;
  ep->bytes[DL_EP_COMBINE_RECV_BYTES] = crecv;
  ep->bytes[DL_EP_SIGNALS_BYTES] = mapped - drecv - crecv;
  ep->bytes[DL_EP_TOTAL_BYTES] = mapped;
}

/* Charge each symmetric part to its tag ep_<part>. */
static int charge_parts(dl_ep_t *ep) {
  for (int p = 0; p < DL_EP_TOTAL_BYTES; p++) {
    char tag[64];
    snprintf(tag, sizeof tag, "ep_%s", part_names[p]);
    DL_TRY(dl_mem_tag_push(tag));
    int rc = dl_mem_charge(ep->op.dev_type, ep->op.dev_index, ep->bytes[p], &ep->tags[p]);
    dl_mem_tag_pop();
    DL_TRY(rc);
    ep->charged = p + 1;
  }
  return DL_OK;
}

int dl_ep_output(dl_tensor_t **t, int64_t *bytes, int dev_type, int dev_index, int dtype, int ndim, int64_t d0,
                 int64_t d1, int64_t d2) {
  const int64_t shape[3] = {d0, d1, d2};
  DL_TRY(dl_tensor_empty(t, dtype, ndim, shape, dev_type, dev_index, NULL));
  int64_t n;
  dl_tensor_storage_info(*t, &n, NULL);
  *bytes += n;
  return DL_OK;
}

static int new_tensor(dl_ep_t *ep, int which, int dtype, int ndim, int64_t d0, int64_t d1,
                      int64_t d2) {
  return dl_ep_output(&ep->t[which], &ep->bytes[DL_EP_OUTPUTS_BYTES], ep->op.dev_type, ep->op.dev_index, dtype, ndim,
                      d0, d1, d2);
}

static int new_tensors(dl_ep_t *ep) {
  const dl_ep_config_t *c = &ep->cfg;
  const int64_t N = ep->op.size, B = c->max_tokens, H = c->hidden, K = c->topk, L = ep->local;
  const int em = c->output == DL_EP_EXPERT_MAJOR;
  const int64_t g = em ? L : N, rows = em ? N * B : B; /* [g][rows] */
  DL_TRY(new_tensor(ep, DL_EP_X, c->fp8 ? DL_U8 : DL_BF16, 3, g, rows, H));
  if (c->fp8) DL_TRY(new_tensor(ep, DL_EP_SCALES, DL_F32, 3, g, rows, H / DL_EP_FP8_GROUP));
  DL_TRY(new_tensor(ep, DL_EP_COUNTS, DL_I32, 1, g, 0, 0));
  if (!em) {
    DL_TRY(new_tensor(ep, DL_EP_EXPERT_IDS, DL_I32, 3, N, B, K));
    DL_TRY(new_tensor(ep, DL_EP_WEIGHTS, DL_F32, 3, N, B, K));
  }
  DL_TRY(new_tensor(ep, DL_EP_OUT, DL_BF16, 2, B, H, 0));
  DL_TRY(new_tensor(ep, T_SRC, DL_I32, 3, g, rows, 2));
  DL_TRY(new_tensor(ep, T_HIDX, DL_I32, 2, B, K, 0));
  DL_TRY(new_tensor(ep, T_HW, DL_F32, 2, B, K, 0));
  return DL_OK;
}

/* Grid of every phase: the multiprocessors a rank may fill (dl_devop_sms). */
static int grid(dl_ep_t *ep) {
  if (ep->op.dev_type != DL_CUDA) {
    ep->blocks = ep->cfg.blocks > 0 ? ep->cfg.blocks : CPU_BLOCKS;
    if (ep->blocks > DL_EP_MAX_BLOCKS) ep->blocks = DL_EP_MAX_BLOCKS; /* every block's share >= 1 (ep.h) */
    ep->threads = 1;
    return DL_OK;
  }
#ifdef DL_WITH_CUDA
  int sms;
  DL_TRY(dl_devop_sms(&ep->op, &sms));
  /* a block an SM by default; up to two on request (the kernels' launch
   * bounds hold two resident, as the fused kernels need every block resident) */
  ep->blocks = ep->cfg.blocks > 0 ? (ep->cfg.blocks < 2 * sms ? ep->cfg.blocks : 2 * sms) : sms;
  if (ep->blocks > DL_EP_MAX_BLOCKS) ep->blocks = DL_EP_MAX_BLOCKS;
  ep->threads = DL_EP_THREADS;
  int optin = 0;
  DL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ep->op.dev_index));
  dl_ep_args_t a = ep->base;
  a.blocks = ep->blocks;
  a.tokens = ep->cfg.max_tokens;
  for (a.phase = 0; a.phase <= DL_EP_COMBINE; a.phase++)
    if (dl_ep_cuda_smem(&a) > optin)
      return DL_ERR(DL_EUNSUPPORTED, "ep: %s needs %lld bytes of shared memory per block (the GPU has "
                    "%d): fewer experts or more blocks", phase_names[a.phase],
                    (long long)dl_ep_cuda_smem(&a), optin);
#endif
  return DL_OK;
}

static int init(dl_ep_t *ep, dl_comm_t *c) {
  const int id = dl_comm_next_symm_id(c);
  lay_out(ep);
  DL_TRY(agree(ep, id));
  DL_TRY(charge_parts(ep));
  DL_TRY(dl_mem_tag_push("ep_outputs"));
  int rc = new_tensors(ep);
  dl_mem_tag_pop();
  DL_TRY(rc);
  DL_TRY(grid(ep));
  if (ep->op.dev_type == DL_META) return DL_OK;
  /* the buffer: what symm maps is exactly the total charged above */
  DL_TRY(dl_devop_map(&ep->op, ep->base.crecv_off + ep->bytes[DL_EP_COMBINE_RECV_BYTES]));
  DL_TRY(forget(ep, id));
  memcpy(ep->base.bufs, ep->op.bufs, sizeof ep->base.bufs);
  /* epochs at zero before anyone signals into them; Lamport slots empty
   * (kernels/ep/ep.h; the cpu twin ignores them) */
  const size_t ctrl = (size_t)dl_ep_ctrl_bytes(ep->op.size, ep->local);
  char *disp = ep->base.bufs[ep->op.rank] + ep->base.drecv_off, *comb = ep->base.bufs[ep->op.rank] + ep->base.crecv_off;
  const size_t disp_bytes = dl_ep_dispatch_lamport(ep->cfg.layout, ep->base.lamport, ep->cfg.output,
                                                   ep->cfg.fp8)
                                ? (size_t)ep->bytes[DL_EP_DISPATCH_RECV_BYTES] : 0;
  const size_t comb_bytes = ep->base.lamport ? (size_t)ep->bytes[DL_EP_COMBINE_RECV_BYTES] : 0;
  if (ep->op.dev_type == DL_CPU) {
    memset(ep->base.bufs[ep->op.rank], 0, ctrl);
    memset(disp, 0xff, disp_bytes);
    memset(comb, 0xff, comb_bytes);
  } else {
#ifdef DL_WITH_CUDA
    DL_TRY(dl_cuda_use(ep->op.dev_index));
    DL_CUDA_CHECK(cudaMemset(ep->base.bufs[ep->op.rank], 0, ctrl));
    if (disp_bytes) DL_CUDA_CHECK(cudaMemset(disp, 0xff, disp_bytes));
    if (comb_bytes) DL_CUDA_CHECK(cudaMemset(comb, 0xff, comb_bytes));
    DL_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  }
  return ep->op.size > 1 ? dl_comm_barrier(c, NULL) : DL_OK;
}

int dl_ep_new(dl_ep_t **out, dl_comm_t *c, const dl_ep_config_t *cfg) {
  DL_CHECK_ARG(out, "dl_ep_new: out is NULL");
  *out = NULL;
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  DL_TRY(check_config(cfg, &ci));
  dl_ep_t *ep = calloc(1, sizeof *ep);
  if (!ep) return DL_ERR(DL_ENOMEM, "dl_ep_new: out of host memory");
  int rc = dl_devop_open(&ep->op, &dl_ep_kind, c, &ci);
  ep->status = ep->op.status;
  ep->cfg = *cfg;
  ep->local = cfg->experts / ci.size;
  dl_ep_args_t *a = &ep->base;
  a->layout = cfg->layout;
  a->output = cfg->output;
  a->fp8 = cfg->fp8;
  a->rank = ci.rank;
  a->nranks = ci.size;
  a->experts = cfg->experts;
  a->local = ep->local;
  a->topk = cfg->topk;
  a->hidden = cfg->hidden;
  a->max_tokens = cfg->max_tokens;
  a->timeout_ns = (uint64_t)(ci.timeout_s * 1e9);
  /* Programmatic dependent launch (common/pdl.cuh) for every buffer; each
   * block releases the next grid as it starts. DISTLAB_EP_PDL=0 turns it off
   * (an A/B knob; ranks may differ: it changes when a grid is scheduled, not
   * what it does). Measured: experiments/ep/NOTES.md (PDL). */
  long pdl = 1, lamport_max = DL_EP_LAMPORT_MAX_ROWS;
  if (rc == DL_OK) rc = dl_env_int("dl_ep_new", "DISTLAB_EP_PDL", 1, 0, 1, &pdl);
  a->pdl = (int)pdl;
  /* per_rank's combine with rank_major output in Lamport slots (kernels/ep/
   * ep.h) up to this many rows received, N B, and its dispatch
   * (dl_ep_dispatch_lamport): their emptying costs stores as many as the
   * rows, the flag's fence a fixed cost. expert_major output sends K rows a
   * token, not one a rank, and keeps the flag (experiments/ep/NOTES.md,
   * Lamport slots). Ranks must agree (agree() checks it: it sets the layout). */
  if (rc == DL_OK)
    rc = dl_env_int("dl_ep_new", "DISTLAB_EP_LAMPORT_MAX_ROWS", DL_EP_LAMPORT_MAX_ROWS, 0,
                    (long)DL_SIGNAL_MAX_RANKS * DL_EP_MAX_TOKENS, &lamport_max);
  a->lamport = dl_ep_layout_lamport(cfg->layout) && cfg->output == DL_EP_RANK_MAJOR &&
               (int64_t)ci.size * cfg->max_tokens <= lamport_max;
  /* every wait that lasts reads the peers' death from status.gone (ep.h) */
  if (rc == DL_OK) rc = dl_devop_watch(&ep->op, &ep->status->gone);
  if (rc == DL_OK) rc = init(ep, c);
  if (rc < 0) {
    dl_error_context(rc, "dl_ep_new on rank %d of %d (comm '%s', %lld bytes a rank)", ci.rank,
                     ci.size, ci.name, (long long)ep->bytes[DL_EP_TOTAL_BYTES]);
    dl_ep_free(ep);
    return rc;
  }
  a->blocks = ep->blocks;
  a->threads = ep->threads;
  a->status = ep->status;
  *out = ep;
  return DL_OK;
}

void dl_ep_free(dl_ep_t *ep) { dl_devop_free(ep ? &ep->op : NULL, &dl_ep_kind); }

int dl_ep_info(const dl_ep_t *ep, dl_ep_info_t *out) {
  DL_TRY(dl_ep_live(ep, "dl_ep_info"));
  DL_CHECK_ARG(out, "dl_ep_info: out is NULL");
  memset(out, 0, sizeof *out);
  dl_devop_identity(&ep->op, &out->rank, &out->size, &out->dev_type, &out->dev_index);
  out->local_experts = ep->local;
  out->blocks = ep->blocks;
  out->threads = ep->threads;
  const uint32_t kind = ep->status ? ((volatile dl_ep_status_t *)ep->status)->kind : 0u;
  out->failed = ep->op.failed || (kind != 0u && kind != DL_EP_ERR_BAD_ID);
  out->tokens = ep->tokens;
  out->msg_dispatch = ep->base.msg_d;
  out->msg_combine = ep->base.msg_c;
  memcpy(out->bytes, ep->bytes, sizeof out->bytes);
  out->dispatches = ep->dispatches;
  out->combines = ep->combines;
  return DL_OK;
}

int dl_ep_tensor(dl_ep_t *ep, int which, dl_tensor_t **out) {
  DL_CHECK_ARG(out, "dl_ep_tensor: out is NULL");
  *out = NULL;
  DL_TRY(dl_ep_live(ep, "dl_ep_tensor"));
  DL_CHECK_ARG(which >= 0 && which < DL_EP_NUM_TENSORS, "dl_ep_tensor: no tensor %d", which);
  const dl_tensor_t *t = ep->t[which];
  if (!t) return DL_OK;
  return dl_tensor_as_strided(out, t, t->nd, t->sz, t->st, t->offset);
}

/* ---- the lifecycle's hooks (core/ops/common/devop.h) ----------------------------------- */

/* The charged parts and the outputs go (dl_devop_free). */
static void fini(dl_devop_t *op) {
  dl_ep_t *ep = (dl_ep_t *)op;
  for (int p = 0; p < ep->charged; p++)
    dl_mem_uncharge(ep->op.dev_type, ep->op.dev_index, ep->tags[p], ep->bytes[p]);
  for (int i = 0; i < N_TENSORS; i++) dl_tensor_free(ep->t[i]);
}

static int twin(const void *a, void *stream) { return dl_ep_cpu(a, stream); }
#ifdef DL_WITH_CUDA
static int kernels(const void *a, void *stream) { return dl_ep_cuda(a, stream); }
#endif

const dl_devop_kind_t dl_ep_kind = {
    .name = "ep buffer",
    .magic = 0xe9e9e9e9u,
    .status_bytes = sizeof(dl_ep_status_t),
    .recorded = recorded,
    .cpu = twin,
#ifdef DL_WITH_CUDA
    .cuda = kernels,
#endif
    .what = "the ep buffer (its symmetric buffer and outputs)",
    .fini = fini,
};
