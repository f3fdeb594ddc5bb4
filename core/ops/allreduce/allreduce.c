/*
 * allreduce.c — the all-reduce object: a communicator and a symmetric
 * buffer laid out for the kernels (kernels/allreduce/allreduce.h), its
 * lifetime, info and zero-copy views, and the hooks of the device-op
 * lifecycle (core/ops/common/devop.h). A call: allreduce_run.c; the failure
 * record worded: allreduce_failure.c.
 *
 * The algorithm and grid come from the caller (distlab.allreduce picks them
 * from the dispatch table for "auto"); every rank must make the same call,
 * as with any collective. Kernel counters live in the buffer, so nothing on
 * the host changes from call to call except the launch arguments: that is
 * what lets a CUDA graph replay the calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allreduce_int.h"
#include "base/device.h"

/* The algorithms and their traits: kernels/allreduce/algos.h. */
const char *dl_allreduce_algo_name(int algo) {
  const dl_ar_algo_t *row = dl_ar_algo(algo);
  return row ? row->name : NULL;
}

/* For messages: "?" for a number that names no algorithm. */
const char *dl_ar_name(int algo) {
  const char *name = dl_allreduce_algo_name(algo);
  return name ? name : "?";
}

/* ---- lifetime ------------------------------------------------------------ */

/* The bytes of a Lamport slot; the region holds 2 halves of one slot a rank,
 * 2 x size slots. At 2 ranks a quarter of max_bytes; at more 2 / size of it,
 * so that a two_shot_lamport call of max_bytes is one piece (lamport_piece);
 * at least 1 MiB, at most a staging slot. mb > 0 (DISTLAB_AR_LAMPORT_MB): a
 * region of mb MiB in all instead. Why these sizes:
 * experiments/results/allreduce/NOTES.md (Lamport slots). */
static int64_t lamport_slot(int64_t slot, int size, long mb) {
  int64_t ls = mb > 0 ? ((int64_t)mb << 20) / (2 * size) : size > 2 ? 2 * slot / size : slot / 4;
  if (mb <= 0 && ls < ((int64_t)1 << 20)) ls = (int64_t)1 << 20;
  ls &= ~(int64_t)4095;
  return ls > slot ? slot : ls;
}

int64_t dl_ar_lamport_offset(const dl_allreduce_t *ar) {
  return DL_AR_CTRL_BYTES + ar->slot * (1 + 2 * (int64_t)ar->op.size);
}

/* Counters at zero, the Lamport region empty (every byte 0xff). */
static int zero_ctrl(dl_allreduce_t *ar) {
  char *lam = ar->op.bufs[ar->op.rank] + dl_ar_lamport_offset(ar);
  const size_t lam_bytes = (size_t)(ar->lstride * 2 * ar->op.size);
  if (ar->op.dev_type == DL_CPU) {
    memset(ar->op.bufs[ar->op.rank], 0, DL_AR_CTRL_BYTES);
    memset(lam, 0xff, lam_bytes);
    return DL_OK;
  }
#ifdef DL_WITH_CUDA
  if (ar->op.dev_type == DL_CUDA) {
    DL_TRY(dl_cuda_use(ar->op.dev_index));
    DL_CUDA_CHECK(cudaMemset(ar->op.bufs[ar->op.rank], 0, DL_AR_CTRL_BYTES));
    DL_CUDA_CHECK(cudaMemset(lam, 0xff, lam_bytes));
    DL_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  return DL_OK;
}

/* The launch shape: the multiprocessors a rank may fill (dl_devop_sms) and
 * the kernels' threads and unroll on cuda, the twin's elsewhere. */
static int launch_shape(dl_allreduce_t *ar) {
#ifdef DL_WITH_CUDA
  if (ar->op.dev_type == DL_CUDA) {
    DL_TRY(dl_devop_sms(&ar->op, &ar->sms));
    dl_allreduce_cuda_shape(ar->op.size, &ar->threads, &ar->unroll);
    ar->max_blocks = DL_AR_MAX_BLOCKS;
    return DL_OK;
  }
#endif
  ar->threads = CPU_THREADS;
  ar->unroll = CPU_UNROLL;
  ar->max_blocks = CPU_MAX_BLOCKS;
  return DL_OK;
}

int dl_allreduce_new(dl_allreduce_t **out, dl_comm_t *c, int64_t max_bytes) {
  DL_CHECK_ARG(out, "dl_allreduce_new: out is NULL");
  *out = NULL;
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  /* cpu buffers live in /dev/shm, which containers keep small */
  if (max_bytes <= 0) max_bytes = (int64_t)(ci.dev_type == DL_CPU ? 8 : 64) << 20;
  DL_CHECK_ARG(ci.size <= DL_SIGNAL_MAX_RANKS,
               "dl_allreduce_new: comm '%s' has %d ranks; the all-reduce kernels span one host "
               "of at most %d (split the communicator by host)",
               ci.name, ci.size, DL_SIGNAL_MAX_RANKS);
  /* Knobs for experiments (scripts/gpu/allreduce.sh variants); every rank
   * of a job must see the same. What each changed, measured:
   * experiments/results/allreduce/NOTES.md (knobs).
   *   DISTLAB_AR_ROUND_KB          a block's round length (0: the kernels' own)
   *   DISTLAB_AR_PDL=0             no programmatic dependent launch
   *   DISTLAB_AR_POLL_NS           the Lamport kernels' nap between polls
   *   DISTLAB_AR_LONG_POLL_NS      their nap once a wait has polled
   *   DISTLAB_AR_LONG_POLL_AFTER   this many times
   *   DISTLAB_AR_LAMPORT_AHEAD     their grid steps pushed ahead of the reduction (0: all first)
   *   DISTLAB_AR_LAMPORT_MB        the Lamport region's MiB in all (unset: from max_bytes)
   *   DISTLAB_AR_LAMPORT_PAD_KB    unused KiB after every Lamport slot (slots not a power of two apart)
   *   DISTLAB_AR_GONE_GAP_US       the least time between a block's reads of the watchdog's host
   *                                word (0: every check; allreduce_device.cuh, ar_stop_kind)
   *   DISTLAB_AR_TAGGED_MAX_BYTES  the largest one_shot_lamport call sent as tagged vectors, which
   *                                say which call sent them (allreduce.h; at most half a Lamport
   *                                slot; 0: never). 64 KiB at 2 ranks, 0 at more */
  long round_kb, pdl, poll_ns, long_poll_ns, long_poll_after, ahead, lamport_mb, lamport_pad_kb, gone_gap_us, tagged_max;
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_ROUND_KB", 0, 0, 1 << 20, &round_kb));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_PDL", 1, 0, 1, &pdl));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_POLL_NS", 128, 0, 100000, &poll_ns));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_LONG_POLL_NS", 1000, 0, 100000, &long_poll_ns));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_LONG_POLL_AFTER", 128, 8, 1 << 30, &long_poll_after));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_LAMPORT_AHEAD", 2, 0, 1 << 20, &ahead));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_LAMPORT_MB", 0, 1, 1 << 16, &lamport_mb));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_LAMPORT_PAD_KB", 0, 0, 1 << 16, &lamport_pad_kb));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_GONE_GAP_US", 200, 0, 1000000, &gone_gap_us));
  DL_TRY(dl_env_int("dl_allreduce_new", "DISTLAB_AR_TAGGED_MAX_BYTES", ci.size == 2 ? 64 << 10 : 0, 0, 1 << 30,
                     &tagged_max));
  dl_allreduce_t *ar = calloc(1, sizeof *ar);
  if (!ar) return DL_ERR(DL_ENOMEM, "dl_allreduce_new: out of host memory");
  ar->round_max = (int64_t)round_kb * 1024 / DL_AR_VEC_BYTES;
  ar->pdl = (int)pdl;
  ar->poll_ns = (uint32_t)poll_ns;
  ar->long_poll_ns = (uint32_t)long_poll_ns;
  ar->long_poll_after = (uint32_t)long_poll_after;
  ar->gone_gap_ns = (uint32_t)gone_gap_us * 1000u;
  ar->lamport_ahead = (int)ahead;
  ar->tagged_max = tagged_max;
  ar->slot = (max_bytes + 4095) & ~(int64_t)4095;
  ar->lslot = lamport_slot(ar->slot, ci.size, lamport_mb);
  ar->lstride = ar->lslot + ((int64_t)lamport_pad_kb << 10);
  int64_t total = DL_AR_CTRL_BYTES + ar->slot * (1 + 2 * (int64_t)ci.size) +
                  ar->lstride * 2 * (int64_t)ci.size;
  ar->id = dl_comm_next_symm_id(c);
  int rc = dl_devop_open(&ar->op, &dl_ar_kind, c, &ci);
  ar->status = ar->op.status;
  if (rc == DL_OK) rc = launch_shape(ar);
  if (rc == DL_OK) rc = dl_devop_map(&ar->op, total);
  if (rc == DL_OK && ar->op.dev_type != DL_META) {
    void *pad;
    rc = dl_symm_signal_pad(ar->op.symm, ar->op.rank, &pad);
    ar->pad = pad;
  }
  if (rc == DL_OK && ar->op.dev_type != DL_META) rc = zero_ctrl(ar);
  /* every wait of the kernels polls status->gone: a dead peer ends them at once */
  if (rc == DL_OK) rc = dl_devop_watch(&ar->op, &ar->status->gone);
  /* nobody signals into a control block before its owner zeroed it */
  if (rc == DL_OK && ar->op.dev_type != DL_META && ar->op.size > 1) rc = dl_comm_barrier(c, NULL);
  if (rc < 0) {
    dl_error_context(rc, "dl_allreduce_new on rank %d of %d (comm '%s', %lld bytes a rank)",
                     ci.rank, ci.size, ci.name, (long long)total);
    dl_allreduce_free(ar);
    return rc;
  }
  *out = ar;
  return DL_OK;
}

void dl_allreduce_free(dl_allreduce_t *ar) { dl_devop_free(ar ? &ar->op : NULL, &dl_ar_kind); }

int dl_allreduce_info(const dl_allreduce_t *ar, dl_allreduce_info_t *out) {
  DL_TRY(dl_ar_live(ar, "dl_allreduce_info"));
  DL_CHECK_ARG(out, "dl_allreduce_info: out is NULL");
  memset(out, 0, sizeof *out);
  dl_devop_identity(&ar->op, &out->rank, &out->size, &out->dev_type, &out->dev_index);
  out->sms = ar->sms;
  out->max_blocks = ar->max_blocks;
  out->threads = ar->threads;
  out->unroll = ar->unroll;
  out->failed = ar->op.failed || (ar->status && ((volatile dl_ar_status_t *)ar->status)->kind != 0);
  out->max_bytes = ar->slot;
  out->calls = ar->calls;
  out->lamport_bytes = ar->lslot;
  return DL_OK;
}

int dl_allreduce_buffer(dl_allreduce_t *ar, dl_tensor_t **out, int64_t offset, int dtype,
                        int ndim, const int64_t *shape) {
  DL_CHECK_ARG(out, "dl_allreduce_buffer: out is NULL");
  *out = NULL;
  DL_TRY(dl_ar_live(ar, "dl_allreduce_buffer"));
  DL_CHECK_ARG(offset >= 0 && offset % DL_AR_VEC_BYTES == 0,
               "dl_allreduce_buffer: offset %lld is not a non-negative multiple of %d",
               (long long)offset, DL_AR_VEC_BYTES);
  DL_CHECK_ARG(ndim >= 0 && ndim <= DL_MAX_DIMS && (ndim == 0 || shape),
               "dl_allreduce_buffer: bad shape (%d dims)", ndim);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d] > 0 ? shape[d] : 0;
  int64_t bytes = n * dl_dtype_size(dtype);
  DL_CHECK_ARG(dl_dtype_size(dtype) > 0 && offset + bytes <= ar->slot,
               "dl_allreduce_buffer: %lld bytes at offset %lld do not fit the zero-copy region "
               "of %lld bytes (make the all-reduce with a larger max_bytes)",
               (long long)bytes, (long long)offset, (long long)ar->slot);
  return dl_symm_tensor(out, ar->op.symm, ar->op.rank, DL_AR_CTRL_BYTES + offset, dtype, ndim, shape);
}

int dl_allreduce_check(dl_allreduce_t *ar, dl_stream_t *s) {
  DL_TRY(dl_ar_live(ar, "dl_allreduce_check"));
  DL_TRY(dl_devop_wait_stream(&ar->op, s, "all_reduce check", NULL));
  return dl_devop_recorded_failure(&ar->op);
}

/* ---- the lifecycle's hooks (core/ops/common/devop.h) --------------------------- */

static int twin(const void *a, void *stream) { return dl_allreduce_cpu(a, stream); }
#ifdef DL_WITH_CUDA
static int kernels(const void *a, void *stream) { return dl_allreduce_cuda(a, stream); }
#endif

const dl_devop_kind_t dl_ar_kind = {
    .name = "all-reduce",
    .magic = 0xa11ed0ce,
    .status_bytes = sizeof(dl_ar_status_t),
    .recorded = dl_ar_recorded,
    .cpu = twin,
#ifdef DL_WITH_CUDA
    .cuda = kernels,
#endif
    .what = "the all-reduce object (its symmetric buffers)",
};
