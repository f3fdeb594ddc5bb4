/*
 * ep_nccl.c — the nccl_ep backend of the EP buffer: NVIDIA's NCCL EP
 * (libnccl_ep.so, opened by nccl_ep_lib.c) behind dl_ep's calls. This file
 * checks the options (NCCL EP's own checks are asserts that abort the
 * process, so nothing it would refuse may reach it), makes the group and
 * the handle, the output tensors, counts the bytes, and takes it all down;
 * the calls are ep_nccl_run.c.
 *
 * Mapping (distlab.h has it for users): low latency = NCCL EP's LL mode,
 * whose buffer is per source rank (our per_rank layout: seed 004, merged
 * there), outputs expert_major and rank_major as ours, fp8 as its
 * DS_FP8E3M4 recipe; high throughput = its HT mode, outputs expert_major
 * (its EXPERT_MAJOR, rows packed per expert with offsets, unpadded) and flat.
 *
 * Memory: NCCL EP allocates through hooks it offers (alloc_fn/free_fn):
 * they cudaMalloc and count ("library"); its NCCL-registered buffer comes
 * from ncclMemAlloc, outside them, so the GPU's free memory is read before
 * the group and after the handle and the rest counted as "window". The
 * total is charged to the memory tag ep_nccl (mem reports see it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ep_nccl_int.h"
#include "base/device.h"
#include "comm/comm_ops.h"
#include "mem/alloc.h"

enum { MAGIC = 0xe9cc1e9d, MAX_TOPK = 32, HT_MAX_TOKENS = 8192 };

static const char *const part_names[DL_EP_NCCL_NUM_PARTS] = {"handle", "library", "window", "total", "outputs"};

const char *dl_ep_nccl_part_name(int part) {
  return part >= 0 && part < DL_EP_NCCL_NUM_PARTS ? part_names[part] : NULL;
}

static const char *const call_names[] = {"dispatch send", "dispatch recv", "combine send", "combine recv",
                                         "dispatch",      "combine",       "setup",        "check"};

static const char *algo_name(int a) { return a == DL_EP_NCCL_HIGH_THROUGHPUT ? "high_throughput" : "low_latency"; }
static const char *output_name(int o) {
  return o == DL_EP_RANK_MAJOR ? "rank_major" : o == DL_EP_FLAT ? "flat" : "expert_major";
}

void dl_ep_nccl_describe(const dl_ep_nccl_t *e, int call, char *buf, size_t len) {
  snprintf(buf, len, "nccl_ep %s (%s, %s, %s) on rank %d of %d (comm '%s', cuda:%d)", call_names[call],
           algo_name(e->cfg.algorithm), output_name(e->cfg.output), e->cfg.fp8 ? "fp8" : "bf16", e->rank, e->size,
           e->comm_name, e->dev);
}

int dl_ep_nccl_live(const dl_ep_nccl_t *e, const char *fn) {
  if (!e || e->magic != MAGIC) return DL_ERR(DL_ESTATE, "%s: not a live nccl_ep buffer (freed?)", fn);
  return DL_OK;
}

void dl_nccl_desc(dl_nccl_desc_t *d, int dtype, void *data, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  memset(d, 0, sizeof *d);
  d->sizes[0] = (size_t)d0, d->sizes[1] = (size_t)d1, d->sizes[2] = (size_t)d2;
  d->t.size = sizeof d->t;
  d->t.magic = NCCL_EP_TENSOR_MAGIC;
  d->t.ndim = (unsigned)ndim;
  d->t.datatype = dtype;
  d->t.data = data;
  d->t.sizes = d->sizes;
}

int dl_ep_nccl_error(const dl_ep_nccl_t *e, int call, const char *fn, int result) {
  char what[256];
  dl_ep_nccl_describe(e, call, what, sizeof what);
  const char *words = e->api && e->api->NcclErrorString ? e->api->NcclErrorString(result) : "?";
  return DL_ERR(DL_ENCCL, "%s: %s failed: %s (%d; NCCL EP printed its reason on stderr)", what, fn, words, result);
}

/* ---- the options -------------------------------------------------------------------- */

static int check_config(const dl_ep_nccl_config_t *c, const dl_comm_info_t *ci) {
  DL_CHECK_ARG(ci->dev_type == DL_CUDA,
               "nccl_ep: comm '%s' is on %s; NCCL EP is GPU code and runs on cuda only (on cpu and meta: "
               "backend = \"ours\")", ci->name, dl_device_type_name(ci->dev_type));
  DL_CHECK_ARG(ci->backend == DL_COMM_NCCL && ci->native,
               "nccl_ep: comm '%s' is not an NCCL communicator (ranks sharing a GPU talk over ipc, and NCCL, on "
               "which NCCL EP runs, refuses two ranks on one GPU): NCCL EP needs one rank per GPU", ci->name);
  const int ht = c->algorithm == DL_EP_NCCL_HIGH_THROUGHPUT;
  DL_CHECK_ARG(c->algorithm == DL_EP_NCCL_LOW_LATENCY || ht, "nccl_ep: unknown algorithm %d", c->algorithm);
  DL_CHECK_ARG(ht ? c->output == DL_EP_EXPERT_MAJOR || c->output == DL_EP_FLAT
                  : c->output == DL_EP_EXPERT_MAJOR || c->output == DL_EP_RANK_MAJOR,
               "nccl_ep: %s has no output %s (its outputs: %s)", algo_name(c->algorithm), output_name(c->output),
               ht ? "expert_major, flat" : "expert_major, rank_major");
  DL_CHECK_ARG(c->max_tokens >= 1 && (!ht || c->max_tokens <= HT_MAX_TOKENS),
               "nccl_ep: max_tokens %d is not in 1..%d", c->max_tokens, ht ? HT_MAX_TOKENS : 0x7fffffff);
  DL_CHECK_ARG(c->experts >= 1 && c->experts % ci->size == 0,
               "nccl_ep: experts %d is not a positive multiple of the %d ranks", c->experts, ci->size);
  DL_CHECK_ARG(c->topk >= 1 && c->topk <= MAX_TOPK && c->topk <= c->experts,
               "nccl_ep: topk %d is not in 1..min(%d, experts %d)", c->topk, MAX_TOPK, c->experts);
  DL_CHECK_ARG(c->sms >= 0, "nccl_ep: blocks %d is negative", c->sms);
  if (ht) {
    DL_CHECK_ARG(!c->fp8,
                 "nccl_ep: high_throughput has no fp8 dispatch (NCCL EP's DS_FP8E3M4 recipe is low-latency only): "
                 "algorithm = \"low_latency\", or dtype = \"bf16\"");
    DL_CHECK_ARG(c->hidden >= 8 && c->hidden % 8 == 0,
                 "nccl_ep: hidden %d is not a positive multiple of 8 (high_throughput moves 16-byte rows)", c->hidden);
    /* NCCL EP asserts (a process abort) that its dispatch's bulk copies move a multiple of 4 of
     * max_tokens x an inner size, "even num_tokens_per_rank" where an NVLink team has 3 ranks or
     * fewer (seen at max_tokens 1 on 2 H200s, both outputs; a dispatch of fewer tokens runs) */
    DL_CHECK_ARG(ci->size > 3 || c->max_tokens % 2 == 0,
                 "nccl_ep: high_throughput on %d ranks needs an even max_tokens (NCCL EP's dispatch on 3 ranks or "
                 "fewer moves its buffer's tokens in pairs), got %d", ci->size, c->max_tokens);
    DL_CHECK_ARG(c->experts % 4 == 0,
                 "nccl_ep: high_throughput needs experts %d to be a multiple of 4 (its routing probabilities of an "
                 "NVLink domain travel as 16-byte rows)", c->experts);
  } else {
    DL_CHECK_ARG(c->hidden >= 128 && c->hidden % (c->fp8 ? 512 : 128) == 0,
                 "nccl_ep: hidden %d is not a positive multiple of %d (%s)", c->hidden, c->fp8 ? 512 : 128,
                 c->fp8 ? "low_latency's fp8 recipe quantizes 512 values a step"
                        : "low_latency's combine moves 128 values a step");
    /* Its buffers come in 16-byte units: NCCL EP asserts it (common.hpp, LowLatencyLayout), and its
     * assertion is a C++ exception that would reach the caller as nothing but "C++ exception". A
     * combine message is the bf16 row and an f32 a 128 values: 2 hidden + hidden / 32 bytes, sent
     * into a slot a rank (rank_major) or an expert (expert_major) and received topk a token. */
    const int64_t msg = 2 * (int64_t)c->hidden + 4 * (c->hidden / 128), B = c->max_tokens;
    const int64_t slots = c->output == DL_EP_RANK_MAJOR ? ci->size : c->experts;
    DL_CHECK_ARG((slots * B * msg) % 16 == 0 && (B * c->topk * msg) % 16 == 0,
                 "nccl_ep: low_latency %s with hidden %d, max_tokens %d, topk %d and %lld %s: NCCL EP needs its "
                 "combine buffers in 16-byte units, max_tokens x topk and max_tokens x %lld times its %lld-byte "
                 "message (2 hidden + hidden / 32): hidden a multiple of 512 always fits, else max_tokens a "
                 "multiple of 4", output_name(c->output), c->hidden, c->max_tokens, c->topk, (long long)slots,
                 c->output == DL_EP_RANK_MAJOR ? "ranks" : "experts", (long long)slots, (long long)msg);
  }
  return DL_OK;
}

#ifdef DL_WITH_CUDA

/* ---- every rank ready, with the same options ------------------------------------------
 * NCCL EP's group creation is a collective of blocking NCCL calls with no
 * timeout: a rank that does not reach it (its library would not load, its
 * options differ) would leave the others in it for good. So the ranks meet
 * in the store first, each saying whether it is ready and with what, and
 * all fail alike, naming the rank. The keys carry a sequence number of this
 * process's buffers (the same on every rank: they make them in one order). */

typedef struct {
  int32_t ready, version, nccl_version, pad;
  dl_ep_nccl_config_t cfg;
} offer_t;

static int agree(dl_ep_nccl_t *e, int ready, int64_t seq) {
  if (e->size == 1) return DL_OK;
  offer_t mine, theirs;
  memset(&mine, 0, sizeof mine);
  mine.ready = ready;
  mine.cfg = e->cfg;
  mine.cfg.sms = 0; /* each rank's own */
  if (e->api) mine.version = e->api->version, mine.nccl_version = e->api->nccl_version;
  char key[64];
  snprintf(key, sizeof key, "nccl_ep%lld/%d", (long long)seq, e->rank);
  DL_TRY(dl_comm_store_set(e->comm, key, &mine, sizeof mine));
  for (int r = 0; r < e->size; r++) {
    snprintf(key, sizeof key, "nccl_ep%lld/%d", (long long)seq, r);
    int rc = dl_comm_store_get(e->comm, key, &theirs, sizeof theirs);
    if (rc == DL_ETIMEOUT)
      return DL_ERR(DL_ETIMEOUT, "nccl_ep: rank %d did not make this nccl_ep buffer within %.1f s (every rank "
                                 "makes the same buffers in the same order)", r, e->timeout_s);
    DL_TRY(rc);
    if (!ready) continue; /* this rank's own error stands */
    if (!theirs.ready)
      return DL_ERR(DL_EPEER, "nccl_ep: rank %d could not make its nccl_ep buffer (its error says why)", r);
    theirs.cfg.sms = 0;
    if (memcmp(&mine.cfg, &theirs.cfg, sizeof mine.cfg) != 0)
      return DL_ERR(DL_EINVAL,
                    "nccl_ep: ranks disagree on the buffer: rank %d has max_tokens %d, hidden %d, experts %d, topk "
                    "%d, %s, %s, %s; rank %d has %d, %d, %d, %d, %s, %s, %s",
                    e->rank, mine.cfg.max_tokens, mine.cfg.hidden, mine.cfg.experts, mine.cfg.topk,
                    algo_name(mine.cfg.algorithm), output_name(mine.cfg.output), mine.cfg.fp8 ? "fp8" : "bf16", r,
                    theirs.cfg.max_tokens, theirs.cfg.hidden, theirs.cfg.experts, theirs.cfg.topk,
                    algo_name(theirs.cfg.algorithm), output_name(theirs.cfg.output), theirs.cfg.fp8 ? "fp8" : "bf16");
    if (theirs.version != mine.version || theirs.nccl_version != mine.nccl_version)
      return DL_ERR(DL_EINVAL, "nccl_ep: rank %d runs NCCL EP %d on NCCL %d, rank %d NCCL EP %d on NCCL %d", e->rank,
                    mine.version, mine.nccl_version, r, theirs.version, theirs.nccl_version);
  }
  return DL_OK;
}

/* ---- NCCL EP's allocations, through its hooks ---------------------------------------- */

static int hook_alloc(void **p, size_t n, void *ctx) {
  dl_ep_nccl_t *e = ctx;
  if (e->nblocks == e->cap) {
    const int cap = e->cap ? 2 * e->cap : 16;
    void *grown = realloc(e->blocks, (size_t)cap * sizeof *e->blocks);
    if (!grown) return (int)cudaErrorMemoryAllocation;
    e->blocks = grown, e->cap = cap;
  }
  cudaError_t err = cudaMalloc(p, n);
  if (err != cudaSuccess) return (int)err;
  e->blocks[e->nblocks].p = *p, e->blocks[e->nblocks].n = n;
  e->nblocks++;
  e->hooked += (int64_t)n;
  return (int)cudaSuccess;
}

static int hook_free(void *p, void *ctx) {
  dl_ep_nccl_t *e = ctx;
  for (int i = 0; i < e->nblocks; i++)
    if (e->blocks[i].p == p) {
      e->hooked -= (int64_t)e->blocks[i].n;
      e->blocks[i] = e->blocks[--e->nblocks];
      break;
    }
  return (int)cudaFree(p);
}

/* ---- lifetime ----------------------------------------------------------------------- */

static int new_tensor(dl_ep_nccl_t *e, int which, int dtype, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  return dl_ep_output(&e->t[which], &e->bytes[DL_EP_NCCL_OUTPUTS_BYTES], DL_CUDA, e->dev, dtype, ndim, d0, d1, d2);
}

/* x, scales, counts, ids, weights, offsets and out, as NCCL EP wants them
 * for the algorithm and output (distlab.h). */
static int new_tensors(dl_ep_nccl_t *e) {
  const dl_ep_nccl_config_t *c = &e->cfg;
  const int64_t N = e->size, B = c->max_tokens, H = c->hidden, K = c->topk, L = e->local, S = e->slots;
  const int x_dtype = c->fp8 ? DL_U8 : DL_BF16;
  if (c->algorithm == DL_EP_NCCL_LOW_LATENCY) {
    const int em = c->output == DL_EP_EXPERT_MAJOR;
    const int64_t g = em ? L : N, rows = em ? N * B : B;
    DL_TRY(new_tensor(e, DL_EP_X, x_dtype, 3, g, rows, H));
    if (c->fp8) DL_TRY(new_tensor(e, DL_EP_SCALES, DL_F32, 3, g, rows, H / 128));
    DL_TRY(new_tensor(e, DL_EP_COUNTS, DL_I32, 1, g, 0, 0));
    if (!em) {
      DL_TRY(new_tensor(e, DL_EP_EXPERT_IDS, DL_I32, 3, N, B, K));
      DL_TRY(new_tensor(e, DL_EP_WEIGHTS, DL_F32, 3, N, B, K));
    }
  } else if (c->output == DL_EP_EXPERT_MAJOR) {
    DL_TRY(new_tensor(e, DL_EP_X, x_dtype, 2, S, H, 0));
    DL_TRY(new_tensor(e, DL_EP_COUNTS, DL_I32, 1, L, 0, 0));
    DL_TRY(new_tensor(e, T_OFFSETS, DL_I32, 1, L, 0, 0));
    DL_TRY(new_tensor(e, DL_EP_WEIGHTS, DL_F32, 1, S, 0, 0));
  } else {
    DL_TRY(new_tensor(e, DL_EP_X, x_dtype, 2, S, H, 0));
    DL_TRY(new_tensor(e, DL_EP_COUNTS, DL_I32, 1, 1, 0, 0));
    DL_TRY(new_tensor(e, DL_EP_EXPERT_IDS, DL_I64, 2, S, K, 0)); /* NCCL EP's high throughput asserts int64 */
    DL_TRY(new_tensor(e, DL_EP_WEIGHTS, DL_F32, 2, S, K, 0));
  }
  return new_tensor(e, DL_EP_OUT, DL_BF16, 2, B, H, 0);
}

/* The group and the handle, and the GPU memory they took. */
static int open_group(dl_ep_nccl_t *e, void *comm) {
  const dl_ep_nccl_config_t *c = &e->cfg;
  const int ht = c->algorithm == DL_EP_NCCL_HIGH_THROUGHPUT;
  ncclEpGroupConfig_t g;
  memset(&g, 0, sizeof g);
  g.size = sizeof g, g.magic = NCCL_EP_MAGIC, g.version = NCCL_EP_API_VERSION;
  g.algorithm = ht ? NCCL_EP_ALGO_HIGH_THROUGHPUT : NCCL_EP_ALGO_LOW_LATENCY;
  g.num_experts = (unsigned)c->experts;
  g.max_dispatch_tokens_per_rank = (unsigned)c->max_tokens;
  g.max_recv_tokens_per_rank = ht ? (unsigned)e->slots : 0; /* fixed: graphs may capture dispatch */
  g.max_token_bytes = (unsigned)(2 * c->hidden);             /* the bf16 row; fp8 codes + scales are less */
  g.max_num_sms = (unsigned)c->sms;
  g.alloc.alloc_fn = hook_alloc, g.alloc.free_fn = hook_free, g.alloc.context = e;
  g.enable_mask = !ht; /* LL: a late peer is masked and reported instead of trapping the kernel */
  g.timeout_ns = (uint64_t)(e->timeout_s * 1e9);
  g.num_topk = (unsigned)c->topk;
  size_t free0, free1, total;
  DL_CUDA_CHECK(cudaDeviceSynchronize());
  DL_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  int r = e->api->CreateGroup(&e->group, comm, &g);
  if (r != 0) {
    e->group = NULL;
    return dl_ep_nccl_error(e, C_SETUP, "ncclEpCreateGroup", r);
  }
  ncclEpHandleConfig_t hc = {sizeof hc, NCCL_EP_MAGIC, 0};
  size_t handle_bytes = 0;
  r = e->api->HandleMemSize(e->group, e->layout, &hc, &handle_bytes, c->topk);
  if (r != 0) return dl_ep_nccl_error(e, C_SETUP, "ncclEpHandleMemSize", r);
  r = e->api->InitHandle(&e->handle, e->group, e->layout, &hc, c->topk, NULL);
  if (r != 0) {
    e->handle = NULL;
    return dl_ep_nccl_error(e, C_SETUP, "ncclEpInitHandle", r);
  }
  DL_CUDA_CHECK(cudaDeviceSynchronize());
  DL_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  const int64_t lost = free0 > free1 ? (int64_t)(free0 - free1) : 0;
  e->bytes[DL_EP_NCCL_HANDLE_BYTES] = (int64_t)handle_bytes;
  e->bytes[DL_EP_NCCL_LIBRARY_BYTES] = e->hooked;
  e->bytes[DL_EP_NCCL_WINDOW_BYTES] = lost > e->hooked ? lost - e->hooked : 0;
  e->bytes[DL_EP_NCCL_TOTAL_BYTES] = e->hooked + e->bytes[DL_EP_NCCL_WINDOW_BYTES];
  return DL_OK;
}

static int init(dl_ep_nccl_t *e, const dl_comm_info_t *ci) {
  DL_TRY(dl_cuda_use(e->dev));
  DL_TRY(open_group(e, ci->native));
  DL_TRY(dl_mem_tag_push("ep_nccl"));
  int rc = dl_mem_charge(DL_CUDA, e->dev, e->bytes[DL_EP_NCCL_TOTAL_BYTES], &e->tag);
  dl_mem_tag_pop();
  DL_TRY(rc);
  e->charged = 1;
  DL_TRY(dl_mem_tag_push("ep_outputs"));
  rc = new_tensors(e);
  dl_mem_tag_pop();
  return rc;
}

int dl_ep_nccl_new(dl_ep_nccl_t **out, dl_comm_t *c, const dl_ep_nccl_config_t *cfg) {
  static int64_t seq; /* this process's buffers so far (agree's keys) */
  DL_CHECK_ARG(out, "dl_ep_nccl_new: out is NULL");
  *out = NULL;
  DL_CHECK_ARG(cfg, "dl_ep_nccl_new: config is NULL");
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  DL_TRY(check_config(cfg, &ci));
  dl_ep_nccl_t *e = calloc(1, sizeof *e);
  if (!e) return DL_ERR(DL_ENOMEM, "dl_ep_nccl_new: out of host memory");
  e->magic = MAGIC;
  e->comm = c;
  e->cfg = *cfg;
  e->rank = ci.rank, e->size = ci.size, e->dev = ci.dev_index;
  e->local = cfg->experts / ci.size;
  e->timeout_s = ci.timeout_s;
  snprintf(e->comm_name, sizeof e->comm_name, "%s", ci.name);
  const int64_t NB = (int64_t)ci.size * cfg->max_tokens;
  if (cfg->algorithm == DL_EP_NCCL_LOW_LATENCY) {
    e->layout = cfg->output == DL_EP_RANK_MAJOR ? NCCL_EP_LAYOUT_RANK_MAJOR : NCCL_EP_LAYOUT_EXPERT_MAJOR;
    e->slots = cfg->output == DL_EP_RANK_MAJOR ? NB : e->local * NB;
  } else {
    /* a token sends one row a local expert it picked (expert_major), or one (flat) */
    e->layout = cfg->output == DL_EP_FLAT ? NCCL_EP_LAYOUT_FLAT : NCCL_EP_LAYOUT_EXPERT_MAJOR;
    e->slots = cfg->output == DL_EP_FLAT ? NB : NB * (cfg->topk < e->local ? cfg->topk : e->local);
  }
  const int64_t id = seq++;
  int rc = dl_nccl_ep_load(&e->api);
  if (rc == DL_OK && e->slots > 0x7fffffff)
    rc = DL_ERR(DL_EINVAL, "nccl_ep: %lld rows received at most: more than NCCL EP counts", (long long)e->slots);
  const int ready = rc == DL_OK;
  int agreed = agree(e, ready, id);
  if (rc == DL_OK) rc = agreed;
  if (rc == DL_OK) rc = init(e, &ci);
  if (rc == DL_OK && e->size > 1) {
    char key[64];
    snprintf(key, sizeof key, "nccl_ep%lld/%d", (long long)id, e->rank);
    rc = dl_comm_store_delete(c, key); /* every rank read it: the group was a collective */
  }
  if (rc < 0) {
    dl_error_context(rc, "dl_ep_nccl_new on rank %d of %d (comm '%s')", ci.rank, ci.size, ci.name);
    dl_ep_nccl_free(e);
    return rc;
  }
  *out = e;
  return DL_OK;
}

/* NCCL EP's group destroy deregisters its NCCL window, a collective: every
 * rank frees its buffer together, the communicator still alive (where it
 * was freed first, as at a process's end, the group is left to the exit). */
void dl_ep_nccl_free(dl_ep_nccl_t *e) {
  if (!e || e->magic != MAGIC) return;
  dl_graph_release_user(e, "the nccl_ep buffer");
  for (int i = 0; i < N_T; i++) dl_tensor_free(e->t[i]);
  if (e->charged) dl_mem_uncharge(DL_CUDA, e->dev, e->tag, e->bytes[DL_EP_NCCL_TOTAL_BYTES]);
  dl_comm_info_t ci;
  if (dl_comm_info(e->comm, &ci) == DL_OK && dl_cuda_use(e->dev) == DL_OK) {
    int r = e->handle ? e->api->HandleDestroy(e->handle) : 0;
    if (r != 0) fprintf(stderr, "distlab: nccl_ep on rank %d: ncclEpHandleDestroy failed (%d)\n", e->rank, r);
    r = e->group ? e->api->GroupDestroy(e->group) : 0;
    if (r != 0) fprintf(stderr, "distlab: nccl_ep on rank %d: ncclEpGroupDestroy failed (%d)\n", e->rank, r);
  }
  free(e->blocks);
  e->magic = 0;
  free(e);
}

#else

int dl_ep_nccl_new(dl_ep_nccl_t **out, dl_comm_t *c, const dl_ep_nccl_config_t *cfg) {
  DL_CHECK_ARG(out && cfg, "dl_ep_nccl_new: out or config is NULL");
  *out = NULL;
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  DL_TRY(check_config(cfg, &ci));
  return DL_ERR(DL_EUNSUPPORTED, "nccl_ep: this libdistlab was built without CUDA (no nvcc at build time)");
}

void dl_ep_nccl_free(dl_ep_nccl_t *e) { (void)e; }

#endif

int dl_ep_nccl_info(const dl_ep_nccl_t *e, dl_ep_nccl_info_t *out) {
  DL_TRY(dl_ep_nccl_live(e, "dl_ep_nccl_info"));
  DL_CHECK_ARG(out, "dl_ep_nccl_info: out is NULL");
  memset(out, 0, sizeof *out);
  out->rank = e->rank, out->size = e->size, out->dev_index = e->dev;
  out->local_experts = e->local;
  out->failed = e->failed;
  out->tokens = e->tokens;
  out->version = e->api->version, out->nccl_version = e->api->nccl_version;
  out->slots = e->slots;
  memcpy(out->bytes, e->bytes, sizeof out->bytes);
  out->dispatches = e->dispatches, out->combines = e->combines;
  snprintf(out->path, sizeof out->path, "%s", e->api->path);
  return DL_OK;
}

int dl_ep_nccl_tensor(dl_ep_nccl_t *e, int which, dl_tensor_t **out) {
  DL_CHECK_ARG(out, "dl_ep_nccl_tensor: out is NULL");
  *out = NULL;
  DL_TRY(dl_ep_nccl_live(e, "dl_ep_nccl_tensor"));
  DL_CHECK_ARG(which >= 0 && which <= DL_EP_OFFSETS, "dl_ep_nccl_tensor: no tensor %d", which);
  const dl_tensor_t *t = e->t[which];
  if (!t) return DL_OK;
  return dl_tensor_as_strided(out, t, t->nd, t->sz, t->st, t->offset);
}
