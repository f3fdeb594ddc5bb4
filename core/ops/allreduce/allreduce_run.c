/*
 * allreduce_run.c — one all-reduce call: the arguments checked, zero copy
 * where the input lies in the region, pieces of at most a slot, the grid
 * and rounds of each piece, and debug mode's cross-rank check of the call.
 */
#include <stdio.h>
#include <string.h>

#include "allreduce_int.h"
#include "base/device.h"

/* ---- running --------------------------------------------------------------- */

/* The bytes of a Lamport call's largest piece: a slot (one_shot_lamport sends
 * the whole piece into a slot of every peer), or size / 2 slots for
 * two_shot_lamport, whose slots each hold two of a piece's size slices
 * (kernels/allreduce/lamport.cuh): max_bytes at more than 2 ranks. */
static int64_t lamport_piece(const dl_allreduce_t *ar, const dl_ar_algo_t *row) {
  return row->sliced && ar->op.size > 2 ? ar->lslot / 2 * ar->op.size : ar->lslot;
}

static int tensor_arg(const dl_allreduce_t *ar, const dl_tensor_t *t, const char *what,
                      dl_view_t *v) {
  int rc = dl_tensor_arg(t, what, ar->op.dev_type, ar->op.dev_index, "the all-reduce", v);
  return rc < 0 ? dl_error_context(rc, "all_reduce") : rc;
}

/* Byte offset of p in this rank's zero-copy region, or -1. */
static int64_t zc_offset(const dl_allreduce_t *ar, const char *p, int64_t nbytes) {
  const char *zc = ar->op.bufs[ar->op.rank] + DL_AR_CTRL_BYTES;
  if (p < zc || p + nbytes > zc + ar->slot) return -1;
  return p - zc;
}

int dl_allreduce_region_offset(const dl_allreduce_t *ar, const dl_tensor_t *t, int64_t *offset) {
  DL_CHECK_ARG(offset, "dl_allreduce_region_offset: offset is NULL");
  *offset = -1;
  DL_TRY(dl_ar_live(ar, "dl_allreduce_region_offset"));
  dl_view_t v;
  DL_TRY(tensor_arg(ar, t, "tensor", &v));
  if (ar->op.dev_type == DL_META) return DL_OK;
  const int64_t zc = zc_offset(ar, v.data, v.numel * dl_dtype_size(v.dtype));
  if (zc % DL_AR_VEC_BYTES == 0) *offset = zc; /* run() reads it in place only then */
  return DL_OK;
}

/* Grid and rounds for len vectors per block set (of the tensor, or of a
 * slice): enough blocks for `fill` vectors each, up to the multiprocessors;
 * rounds of one step a block (a block's threads hold one step's loads in
 * flight; DISTLAB_AR_ROUND_KB: another length), at most 4 (a barrier each),
 * or 64 for the pipelined kernels, whose rounds let their two halves
 * overlap. Vectors are spread evenly over blocks and rounds, so that a size
 * just past whole rounds does not idle most blocks in its last round. The
 * measurements behind fill and the rounds: experiments/results/allreduce/NOTES.md. */
static void shape_for(const dl_allreduce_t *ar, int64_t len, int blocks, const dl_ar_algo_t *row,
                      dl_ar_args_t *a) {
  const int half = ar->op.dev_type == DL_CUDA && row->pipelined && !a->zero_copy; /* a role a half block */
  const int64_t per_step = (int64_t)ar->threads / (half ? 2 : 1) * ar->unroll;
  const int64_t max_rounds = half ? 64 : 4;
  /* the vectors a block gets before the grid grows: the Lamport kernels have
   * no rounds and wait for one vector's trip, so one a thread; the one-shot
   * pushes on a GPU 256 (4 KiB); the others a step */
  const int64_t fill = row->lamport                                                  ? ar->threads
                       : row->push && !row->sliced && ar->op.dev_type == DL_CUDA ? 256
                                                                                 : per_step;
  int64_t g = blocks;
  if (g <= 0) {
    int cap = ar->op.dev_type == DL_CUDA ? (ar->sms > 0 ? ar->sms : 1) : ar->max_blocks;
    g = (len + fill - 1) / fill;
    g = g < 1 ? 1 : g > cap ? cap : g;
  }
  int64_t step = ar->round_max > 0 ? ar->round_max : per_step;
  /* a pipelined kernel whose blocks need at most two steps does it in one
   * round: a round costs a fence and a flag, which the overlap repays only
   * from three rounds on */
  if (!ar->round_max && half && len <= g * 2 * per_step) step = 2 * per_step;
  int64_t rounds = (len + g * step - 1) / (g * step);
  if (rounds > max_rounds) rounds = max_rounds;
  if (rounds < 1) rounds = 1;
  int64_t r = (len + g * rounds - 1) / (g * rounds);
  r = (r + 31) / 32 * 32; /* whole warps of vectors: rounds start 512-byte aligned */
  a->blocks = (int)g;
  a->round_vecs = (int)r;
  /* The Lamport kernels give thread t of block b position b*T + t of each
   * grid step (T threads a block): T is the positions a block gets, in whole
   * warps, at most ar->threads, so that a small call runs on g
   * multiprocessors (whose remote stores it waits for), not on the first few. */
  if (row->lamport && ar->op.dev_type == DL_CUDA) {
    int64_t t = (len + g - 1) / g;
    t = (t + 31) / 32 * 32;
    a->threads = (int)(t > ar->threads ? ar->threads : t < 32 ? 32 : t);
  }
}

/* Whether a call of nbytes of a tagging algorithm (one_shot_lamport) goes as tagged vectors: up to
 * DISTLAB_AR_TAGGED_MAX_BYTES, and twice its whole vectors fit a Lamport
 * slot (kernels/allreduce/allreduce.h), so it is one piece. */
static int tagged_fits(const dl_allreduce_t *ar, const dl_ar_algo_t *row, int64_t nbytes) {
  const int64_t whole = (nbytes + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES * DL_AR_VEC_BYTES;
  return row->tagged && nbytes <= ar->tagged_max && 2 * whole <= ar->lslot;
}

static int launch(dl_allreduce_t *ar, dl_ar_args_t *a, void *stream) {
  ar->calls++;
  /* the hash a tagged call's vectors carry, once a piece for the kernel and the twin */
  a->call_hash = dl_ar_args_hash(a);
  return dl_devop_launch(&ar->op, a, stream);
}

static int run(dl_allreduce_t *ar, dl_tensor_t *out, const dl_tensor_t *in, int algo,
               int blocks, dl_stream_t *s) {
  dl_view_t vo, vi;
  DL_TRY(tensor_arg(ar, out, "output", &vo));
  DL_TRY(tensor_arg(ar, in, "input", &vi));
  DL_CHECK_ARG(vo.dtype == vi.dtype && vo.numel == vi.numel,
               "all_reduce: output (%s, %lld elements) and input (%s, %lld) differ",
               dl_dtype_name(vo.dtype), (long long)vo.numel, dl_dtype_name(vi.dtype),
               (long long)vi.numel);
  const dl_ar_algo_t *row = dl_ar_algo(algo);
  DL_CHECK_ARG(row, "all_reduce: unknown algorithm %d", algo);
  DL_CHECK_ARG(blocks <= ar->max_blocks, "all_reduce: %d blocks (at most %d)", blocks,
               ar->max_blocks);
  if (row->family == DL_AR_FAMILY_NCCL) return dl_comm_all_reduce(ar->op.comm, out, in, DL_RED_SUM, s);
  /* a grid from a table made for a GPU of one's own: no more than our share */
  if (ar->op.share > 1 && ar->op.dev_type == DL_CUDA && blocks > ar->sms) blocks = ar->sms;
  if (vi.dtype != DL_F32 && vi.dtype != DL_F16 && vi.dtype != DL_BF16)
    return DL_ERR(DL_EUNSUPPORTED, "all_reduce %s: dtype %s (f32, f16 and bf16; algo nccl "
                  "takes the others)", dl_ar_name(algo), dl_dtype_name(vi.dtype));
  if (vi.numel == 0 || ar->op.dev_type == DL_META) return DL_OK;
  if (ar->op.size == 1) return vo.data == vi.data ? DL_OK : dl_tensor_copy(out, in, s);
  void *stream = NULL;
  DL_TRY(dl_stream_for(s, ar->op.dev_type, ar->op.dev_index, &stream));
#ifdef DL_WITH_CUDA
  if (ar->op.dev_type == DL_CUDA) DL_TRY(dl_cuda_use(ar->op.dev_index));
#endif
  const int es = dl_dtype_size(vi.dtype);
  const int64_t nbytes = vi.numel * es;
  dl_ar_args_t a;
  memset(&a, 0, sizeof a);
  a.algo = algo;
  a.dtype = vi.dtype;
  a.rank = ar->op.rank;
  a.nranks = ar->op.size;
  a.threads = ar->threads;
  a.unroll = ar->unroll;
  for (int p = 0; p < ar->op.size; p++) a.bufs[p] = ar->op.bufs[p];
  a.staging_off = DL_AR_CTRL_BYTES + ar->slot;
  a.slot_bytes = ar->slot;
  a.lamport_off = dl_ar_lamport_offset(ar);
  a.lamport_stride = ar->lstride;
  a.pad = ar->pad;
  a.status = ar->status;
  a.timeout_ns = (uint64_t)(ar->op.timeout_s * 1e9);
  a.pdl = ar->pdl;
  a.poll_ns = ar->poll_ns;
  a.long_poll_ns = ar->long_poll_ns;
  a.long_poll_after = ar->long_poll_after;
  a.gone_gap_ns = ar->gone_gap_ns;
  a.lamport_ahead = ar->lamport_ahead;
  a.tagged = tagged_fits(ar, row, nbytes);
  a.total_n = vi.numel;
  /* zero copy: the input already in our region, the output where the
   * algorithm can write it while peers read the inputs */
  int64_t zc = zc_offset(ar, vi.data, nbytes);
  const int overlap = vo.data < vi.data + nbytes && vi.data < vo.data + nbytes;
  if (zc >= 0 && zc % DL_AR_VEC_BYTES == 0 &&
      ((row->zero_copy == DL_AR_ZC_APART && !overlap) ||
       (row->zero_copy == DL_AR_ZC_IN_PLACE && vo.data == vi.data))) {
    const int64_t nv = (nbytes + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES;
    a.zero_copy = 1;
    a.zc_off = DL_AR_CTRL_BYTES + zc;
    a.n = vi.numel;
    a.in = vi.data;
    a.out = vo.data;
    shape_for(ar, row->sliced ? (nv + ar->op.size - 1) / ar->op.size : nv, blocks, row, &a);
    return launch(ar, &a, stream);
  }
  /* copy-in (or push): pieces of at most one slot each (two_shot_lamport: size / 2
   * Lamport slots, lamport_piece), as even as whole vectors allow (48 MB in pieces
   * of 32 MiB: 24 + 24 MB, not 32 + 16) */
  const int64_t most = (row->lamport ? lamport_piece(ar, row) : ar->slot) / es;
  const int64_t npieces = (vi.numel + most - 1) / most, ve = DL_AR_VEC_BYTES / es;
  const int64_t piece = npieces <= 1 ? most : ((vi.numel + npieces - 1) / npieces + ve - 1) / ve * ve;
  for (int64_t off = 0; off < vi.numel; off += piece) {
    a.n = vi.numel - off < piece ? vi.numel - off : piece;
    a.offset = off;
    a.in = vi.data + off * es;
    a.out = vo.data + off * es;
    const int64_t nv = (a.n * es + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES;
    shape_for(ar, row->sliced ? (nv + ar->op.size - 1) / ar->op.size : nv, blocks, row, &a);
    DL_TRY(launch(ar, &a, stream));
  }
  return DL_OK;
}

/* The communicator's debug mode: every rank's call (algorithm, dtype,
 * elements, grid, zero copy) is compared with everyone's through the store,
 * so a mismatch is an error instead of a hang or wrong sums. */
typedef struct ar_sig {
  int32_t algo, dtype, blocks, zero_copy;
  int64_t n;
} ar_sig_t;

/* "runs two_shot, 100 elements, dtype f32, blocks 0, copy-in" (dl_comm_check_same:
 * one entry a comma, so that the message says which differ) */
static int sig_runs(const void *sig, char *buf, size_t len) {
  const ar_sig_t *s = sig;
  return snprintf(buf, len, "runs %s, %lld elements, dtype %s, blocks %d, %s", dl_ar_name(s->algo),
                  (long long)s->n, dl_dtype_name(s->dtype), s->blocks,
                  s->zero_copy ? "zero copy" : "copy-in");
}

static int debug_check(dl_allreduce_t *ar, dl_tensor_t *out, const dl_tensor_t *in, int algo,
                       int blocks) {
  dl_view_t vi, vo;
  DL_TRY(dl_view_of(in, &vi));
  DL_TRY(dl_view_of(out, &vo));
  int64_t nbytes = vi.numel * dl_dtype_size(vi.dtype);
  ar_sig_t me = {algo, vi.dtype, blocks, 0, vi.numel};
  if (ar->op.dev_type != DL_META) me.zero_copy = zc_offset(ar, vi.data, nbytes) >= 0;
  char key[32];
  snprintf(key, sizeof key, "ar%d", ar->id);
  return dl_comm_check_same(ar->op.comm, key, ar->runs, &me, sizeof me, "all-reduce calls", sig_runs);
}

int dl_allreduce_run(dl_allreduce_t *ar, dl_tensor_t *out, const dl_tensor_t *in, int algo,
                     int blocks, dl_stream_t *s) {
  DL_TRY(dl_ar_live(ar, "dl_allreduce_run"));
  DL_TRY(dl_devop_recorded_failure(&ar->op));
  if (dl_comm_debug(ar->op.comm)) {
    int rc = debug_check(ar, out, in, algo, blocks);
    ar->runs++;
    if (rc < 0) {
      char what[256];
      dl_ar_describe(ar, algo, what, sizeof what);
      dl_error_context(rc, "%s", what);
      /* a peer that never made the call: the calls are out of step for good */
      if (rc == DL_ETIMEOUT || rc == DL_EPEER) {
        dl_devop_set_failed(&ar->op);
        dl_ar_abort_peers(ar);
      }
      return rc;
    }
  }
  int rc = run(ar, out, in, algo, blocks, s);
  if (rc < 0 && algo != DL_AR_NCCL && rc != DL_EINVAL && rc != DL_EUNSUPPORTED && !ar->op.failed) {
    char what[256];
    dl_ar_describe(ar, algo, what, sizeof what);
    dl_error_context(rc, "%s", what);
    /* a CUDA error after a peer's death (the memory it exported went with it) */
    const uint32_t g = dl_devop_gone(&ar->op);
    if (rc == DL_ECUDA && g) {
      char dead[96];
      dl_devop_gone_str(&ar->op, g, dead, sizeof dead);
      rc = dl_error_context(DL_EPEER, "%s", dead);
    }
    dl_devop_set_failed(&ar->op);
  }
  return rc;
}
