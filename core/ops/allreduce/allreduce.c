/*
 * allreduce.c — the all-reduce object: a communicator, a symmetric buffer
 * laid out for the kernels (kernels/allreduce/allreduce.h), the choice of algorithm
 * per call, zero-copy detection, pieces for tensors larger than a slot,
 * grid sizing, and the failure record turned into errors.
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
#include <time.h>

#include "allreduce/allreduce.h"
#include "ops/common/devop.h"
#include "base/device.h"

/* cpu twin: one "thread" per block moving 8192 vectors (128 KiB) a round */
enum { CPU_THREADS = 1, CPU_UNROLL = 8192, CPU_MAX_BLOCKS = 4 };

struct dl_allreduce {
  dl_devop_t op; /* the lifecycle: identity, buffers, failure (core/ops/common/devop.h) */
  int sms, max_blocks, threads, unroll;
  int64_t round_max; /* vectors a block moves per round at most (0: the kernels' own) */
  int pdl;           /* launch with programmatic stream serialization (cuda) */
  uint32_t poll_ns;  /* the Lamport kernels' nap between polls */
  uint32_t long_poll_ns; /* their nap once a wait has polled long_poll_after times */
  uint32_t long_poll_after;
  uint32_t gone_gap_ns; /* a block's least time between reads of status->gone */
  int lamport_ahead; /* the Lamport kernels: grid steps pushed ahead of the reduction */
  int64_t tagged_max; /* one_shot_lamport calls up to this many bytes go tagged (tagged_fits) */
  int64_t slot;  /* bytes of the zero-copy region and of each staging slot */
  int64_t lslot; /* bytes of each lamport slot (kernels/allreduce/allreduce.h) */
  int64_t lstride; /* bytes from a lamport slot to the next: lslot + DISTLAB_AR_LAMPORT_PAD_KB */
  int64_t calls; /* kernel calls issued */
  int64_t runs;  /* dl_allreduce_run calls, for the debug check */
  int id;        /* which of the comm's symmetric buffers: names debug keys */
  dl_signal_pad_t *pad;
  dl_ar_status_t *status; /* op.status: host-mapped on cuda, so runs can read it for free */
};

/* By DL_AR_*, so a name cannot land on another algorithm's value; the
 * assertion below catches an algorithm added to the enum without a name
 * (spec/allreduce_spec.lua maps every name back to its DL_AR_* value). */
static const char *const algo_names[] = {
    [DL_AR_NCCL] = "nccl",
    [DL_AR_ONE_SHOT] = "one_shot",
    [DL_AR_ONE_SHOT_PUSH] = "one_shot_push",
    [DL_AR_TWO_SHOT] = "two_shot",
    [DL_AR_TWO_SHOT_PUSH] = "two_shot_push",
    [DL_AR_TWO_SHOT_WRITE] = "two_shot_write",
    [DL_AR_ONE_SHOT_LAMPORT] = "one_shot_lamport",
    [DL_AR_ONE_SHOT_PUSH_FLAT] = "one_shot_push_flat",
    [DL_AR_TWO_SHOT_LAMPORT] = "two_shot_lamport",
};
_Static_assert(sizeof algo_names / sizeof *algo_names == DL_AR_NUM_ALGOS,
               "every DL_AR_* algorithm needs a name in algo_names");

const char *dl_allreduce_algo_name(int algo) {
  return algo >= 0 && algo < DL_AR_NUM_ALGOS ? algo_names[algo] : NULL;
}

static int is_two_shot(int algo) {
  return algo == DL_AR_TWO_SHOT || algo == DL_AR_TWO_SHOT_PUSH || algo == DL_AR_TWO_SHOT_WRITE;
}

static int is_lamport(int algo) {
  return algo == DL_AR_ONE_SHOT_LAMPORT || algo == DL_AR_TWO_SHOT_LAMPORT;
}

/* For messages: "?" for a number that names no algorithm. */
static const char *algo_name(int algo) {
  const char *name = dl_allreduce_algo_name(algo);
  return name ? name : "?";
}

static const dl_devop_kind_t ar_kind;

static int ar_check(const dl_allreduce_t *ar, const char *fn) {
  return dl_devop_live(ar ? &ar->op : NULL, &ar_kind, fn);
}

/* "all_reduce two_shot on rank 1 of 2 (comm 'w', cuda:1)" */
static int describe(const dl_allreduce_t *ar, int algo, char *buf, size_t len) {
  char what[64];
  snprintf(what, sizeof what, "all_reduce %s", algo_name(algo));
  return dl_devop_describe(&ar->op, what, buf, len);
}

/* "one_shot on 100 f32 (1 block, rounds of 32 vectors, copy-in)", and for a
 * piece of a larger run "elements 4096.. of 10000 f32" */
static void call_str(const dl_ar_call_t *c, char *buf, size_t len) {
  char what[64];
  if (c->offset) snprintf(what, sizeof what, "elements %lld.. of ", (long long)c->offset);
  else what[0] = 0;
  snprintf(buf, len, "%s on %s%lld %s (%d block%s, rounds of %d vectors, %s%s)", algo_name(c->algo),
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
  DIFF(a->algo != b->algo, "algorithm %s vs %s", algo_name(a->algo), algo_name(b->algo));
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
 * peer's does. Read on the host: in the kernels' failure paths it cost every
 * kernel registers (10-26 more, and spills). */
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
static int recorded(dl_devop_t *op, int *fatal) {
  dl_allreduce_t *ar = (dl_allreduce_t *)op;
  volatile dl_ar_status_t *s = ar->status;
  *fatal = 1;
  if (s->kind == 0) return DL_OK;
  char what[256];
  describe(ar, (int)s->algo, what, sizeof what);
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
    else if (is_lamport((int)s->algo))
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
static void abort_peers(dl_allreduce_t *ar) {
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

/* ---- lifetime ------------------------------------------------------------ */

/* The bytes of a Lamport slot; the region holds 2 halves of one slot a rank,
 * 2 x size slots. At 2 ranks a quarter of max_bytes (at least 1 MiB): with
 * the default 64 MiB (cuda) 16 MiB slots, a region of 64 MiB, so an 8 or 16
 * MB call is one piece. At more ranks 2 / size of max_bytes, so that a
 * two_shot_lamport call of max_bytes is one piece (lamport_piece: size / 2
 * slots): 32 / 16 MiB slots, a region of 256 MiB a rank at 4 / 8 ranks,
 * beside (1 + 2 x size) x 64 MiB of zero-copy region and staging (576 /
 * 1088 MiB). A quarter of max_bytes at 4 ranks cut 48 and 64 MB in two
 * pieces of two_shot_lamport: 251.0 and 326.9 us on 4 H200s (eb0b3a4), where
 * 16 and 32 MB in one piece took 88.1 and 163.2 us. On cpu (8 MiB): 2 MiB
 * slots at 2 ranks, 4 MiB at 4. The fixed 32 MiB region of before gave 8 / 4
 * / 2 MiB slots and cut 8 MB in two at 4 ranks (allreduce-h200x4.md:
 * two_shot_lamport 58.1 us there against 27.2 at 4 MB). mb > 0
 * (DISTLAB_AR_LAMPORT_MB): a region of mb MiB in all instead, as before (32:
 * the old region, for the A/B; 128 at 4 ranks: the quarter of max_bytes). */
static int64_t lamport_slot(int64_t slot, int size, long mb) {
  int64_t ls = mb > 0 ? ((int64_t)mb << 20) / (2 * size) : size > 2 ? 2 * slot / size : slot / 4;
  if (mb <= 0 && ls < ((int64_t)1 << 20)) ls = (int64_t)1 << 20;
  ls &= ~(int64_t)4095;
  return ls > slot ? slot : ls;
}

/* The bytes of a Lamport call's largest piece: a slot (one_shot_lamport sends
 * the whole piece into a slot of every peer), or size / 2 slots for
 * two_shot_lamport, whose slots each hold two of a piece's size slices
 * (kernels/allreduce/lamport.cuh): max_bytes at more than 2 ranks. */
static int64_t lamport_piece(const dl_allreduce_t *ar, int algo) {
  return algo == DL_AR_TWO_SHOT_LAMPORT && ar->op.size > 2 ? ar->lslot / 2 * ar->op.size : ar->lslot;
}

static int64_t lamport_offset(const dl_allreduce_t *ar) {
  return DL_AR_CTRL_BYTES + ar->slot * (1 + 2 * (int64_t)ar->op.size);
}

/* Counters at zero, the Lamport region empty (every byte 0xff). */
static int zero_ctrl(dl_allreduce_t *ar) {
  char *lam = ar->op.bufs[ar->op.rank] + lamport_offset(ar);
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
  /* knobs for experiments (scripts/gpu/allreduce.sh variants,
   * allreduce-h200x2-knobs.md); every rank of a job must see the same:
   * DISTLAB_AR_ROUND_KB a block's round length (0: the kernels' own),
   * DISTLAB_AR_PDL=0 no programmatic dependent launch, DISTLAB_AR_POLL_NS
   * the Lamport kernels' nap between polls, DISTLAB_AR_LAMPORT_AHEAD their
   * grid steps pushed ahead of the reduction (default 2; 0: all first),
   * DISTLAB_AR_LAMPORT_MB the Lamport region's MiB in all (unset: sized
   * from max_bytes, below; 32: the fixed region of before),
   * DISTLAB_AR_LAMPORT_PAD_KB unused KiB after every Lamport slot (default
   * 0), so that the slots are not a power of two apart: since 4d9f6e2 every
   * peer's sums land at the same offset of slots 16-32 MiB apart, and
   * two_shot_lamport lost 0.4-0.7 us at 3-16 MB on 4 H200s (the A/B to run),
   * DISTLAB_AR_LONG_POLL_NS their nap once a wait has polled
   * DISTLAB_AR_LONG_POLL_AFTER times (default 1000 ns after 128 polls; 128
   * ns, the nap of before 2026-11-27, keeps one nap). On 4 H200s (d3b93ff)
   * 1024 polls before the long nap changed nothing measured: two_shot_lamport
   * and one_shot_lamport at 1-32 MB within 0.1 us of 128 (the 0.4-0.7 us
   * two_shot_lamport lost at 3-16 MB since 5339a0a is not the nap), and the
   * stall cases alike at 2 ranks (allreduce-stall-h200.md),
   * DISTLAB_AR_GONE_GAP_US the least time between two reads of the
   * watchdog's host word by one block's waits (0: every wait's every
   * check, as before 2026-11-27; allreduce_device.cuh, ar_stop_kind),
   * DISTLAB_AR_TAGGED_MAX_BYTES the largest one_shot_lamport call sent as
   * tagged vectors, whose tags say which call sent them, so that no
   * thread waits for a peer's call before its data (at most half a Lamport
   * slot; 0: never, every call waits for the peers' calls as before;
   * kernels/allreduce/allreduce.h). Default 64 KiB at 2 ranks, 0 at more:
   * on 4 H100s (927fc83) tagged one_shot_lamport gained 0.1-0.2 us at 2
   * ranks to 32 KB and lost from 128 KB, and at 4 ranks lost at every size
   * (8 KB 6.7 against 6.0 us, 256 KB 17.6 against 8.4: twice the bytes to
   * three peers) */
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
  int rc = dl_devop_open(&ar->op, &ar_kind, c, &ci);
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

void dl_allreduce_free(dl_allreduce_t *ar) {
  if (!ar || ar->op.magic != ar_kind.magic) return;
  dl_devop_release(&ar->op, "the all-reduce object (its symmetric buffers)");
  dl_devop_close(&ar->op);
  free(ar);
}

int dl_allreduce_info(const dl_allreduce_t *ar, dl_allreduce_info_t *out) {
  DL_TRY(ar_check(ar, "dl_allreduce_info"));
  DL_CHECK_ARG(out, "dl_allreduce_info: out is NULL");
  memset(out, 0, sizeof *out);
  out->rank = ar->op.rank;
  out->size = ar->op.size;
  out->dev_type = ar->op.dev_type;
  out->dev_index = ar->op.dev_index;
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
  DL_TRY(ar_check(ar, "dl_allreduce_buffer"));
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

/* ---- running --------------------------------------------------------------- */

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
  DL_TRY(ar_check(ar, "dl_allreduce_region_offset"));
  dl_view_t v;
  DL_TRY(tensor_arg(ar, t, "tensor", &v));
  if (ar->op.dev_type == DL_META) return DL_OK;
  const int64_t zc = zc_offset(ar, v.data, v.numel * dl_dtype_size(v.dtype));
  if (zc % DL_AR_VEC_BYTES == 0) *offset = zc; /* run() reads it in place only then */
  return DL_OK;
}

/* Grid and rounds for len vectors per block set (of the tensor or of a
 * slice): enough blocks for one step each, up to one per multiprocessor;
 * rounds of at most one step per block (a block's threads hold one step's
 * loads in flight; DISTLAB_AR_ROUND_KB sets another length), at most a few
 * for the two-shot and flat kernels (a barrier each) and up to 64 for the
 * pipelined one-shot kernels (one role per half block; their rounds are
 * what lets the halves overlap). The vectors are spread evenly over blocks
 * and rounds: a size just past a whole number of full rounds would
 * otherwise leave most blocks idle in its last round while a few do it at
 * full length (3 MB on 132 blocks took as long as 4 MB). */
static void shape_for(const dl_allreduce_t *ar, int64_t len, int blocks, int algo,
                      dl_ar_args_t *a) {
  const int pipelined = algo == DL_AR_ONE_SHOT_PUSH || (algo == DL_AR_ONE_SHOT && !a->zero_copy);
  const int half = ar->op.dev_type == DL_CUDA && pipelined;
  const int64_t per_step = (int64_t)ar->threads / (half ? 2 : 1) * ar->unroll;
  const int64_t max_rounds = half ? 64 : 4;
  /* the vectors a block gets before the grid grows. The Lamport kernels
   * have no rounds and their latency is one vector's trip: one a thread.
   * The pushes on a GPU: 256 (4 KiB). On 2 H200s (allreduce-h200x2-tune.csv)
   * the grids this gives were within 1% of the best one tried from 32 KiB to
   * 256 KiB and were the best from 1 MiB (all multiprocessors; 128 blocks at
   * 512 KiB, where 132 was best), while a block a step (1024 or 2048
   * vectors) cost 16-43% below 1 MiB. */
  const int push = algo == DL_AR_ONE_SHOT_PUSH || algo == DL_AR_ONE_SHOT_PUSH_FLAT;
  const int64_t fill = is_lamport(algo)                              ? ar->threads
                       : push && ar->op.dev_type == DL_CUDA ? 256
                                                         : per_step;
  int64_t g = blocks;
  if (g <= 0) {
    int cap = ar->op.dev_type == DL_CUDA ? (ar->sms > 0 ? ar->sms : 1) : ar->max_blocks;
    g = (len + fill - 1) / fill;
    g = g < 1 ? 1 : g > cap ? cap : g;
  }
  int64_t step = ar->round_max > 0 ? ar->round_max : per_step;
  /* a pipelined kernel whose blocks need at most two steps does it in one
   * round: a round costs a fence and a flag, which its overlap only repays
   * from three rounds on (2 H200s: 3 MB 16.7 us in one round, 17.2 in two) */
  if (!ar->round_max && half && len <= g * 2 * per_step) step = 2 * per_step;
  int64_t rounds = (len + g * step - 1) / (g * step);
  if (rounds > max_rounds) rounds = max_rounds;
  if (rounds < 1) rounds = 1;
  int64_t r = (len + g * rounds - 1) / (g * rounds);
  r = (r + 31) / 32 * 32; /* whole warps of vectors: rounds start 512-byte aligned */
  a->blocks = (int)g;
  a->round_vecs = (int)r;
  /* The Lamport kernels give thread t of block b position b*T + t of each
   * grid step (T threads a block): so that g blocks share the positions
   * evenly, T is the positions a block gets, in whole warps, at most
   * ar->threads. A small call then runs on g multiprocessors, not on the
   * first few (2 H200s, tagged one_shot_lamport: a multiprocessor's remote
   * stores are what a call of one or a few blocks waits for). */
  if (is_lamport(algo) && ar->op.dev_type == DL_CUDA) {
    int64_t t = (len + g - 1) / g;
    t = (t + 31) / 32 * 32;
    a->threads = (int)(t > ar->threads ? ar->threads : t < 32 ? 32 : t);
  }
}

/* Whether a one_shot_lamport call of nbytes goes as tagged vectors: up to
 * DISTLAB_AR_TAGGED_MAX_BYTES, and twice its whole vectors fit a Lamport
 * slot (kernels/allreduce/allreduce.h), so it is one piece. */
static int tagged_fits(const dl_allreduce_t *ar, int algo, int64_t nbytes) {
  const int64_t whole = (nbytes + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES * DL_AR_VEC_BYTES;
  return algo == DL_AR_ONE_SHOT_LAMPORT && nbytes <= ar->tagged_max && 2 * whole <= ar->lslot;
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
  DL_CHECK_ARG(algo >= 0 && algo < DL_AR_NUM_ALGOS, "all_reduce: unknown algorithm %d", algo);
  DL_CHECK_ARG(blocks <= ar->max_blocks, "all_reduce: %d blocks (at most %d)", blocks,
               ar->max_blocks);
  if (algo == DL_AR_NCCL) return dl_comm_all_reduce(ar->op.comm, out, in, DL_RED_SUM, s);
  /* a grid from a table made for a GPU of one's own: no more than our share */
  if (ar->op.share > 1 && ar->op.dev_type == DL_CUDA && blocks > ar->sms) blocks = ar->sms;
  if (vi.dtype != DL_F32 && vi.dtype != DL_F16 && vi.dtype != DL_BF16)
    return DL_ERR(DL_EUNSUPPORTED, "all_reduce %s: dtype %s (f32, f16 and bf16; algo nccl "
                  "takes the others)", algo_name(algo), dl_dtype_name(vi.dtype));
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
  a.lamport_off = lamport_offset(ar);
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
  a.tagged = tagged_fits(ar, algo, nbytes);
  a.total_n = vi.numel;
  /* zero copy: the input already in our region, the output where the
   * algorithm can write it while peers read the inputs */
  int64_t zc = zc_offset(ar, vi.data, nbytes);
  const int overlap = vo.data < vi.data + nbytes && vi.data < vo.data + nbytes;
  if (zc >= 0 && zc % DL_AR_VEC_BYTES == 0 &&
      ((algo == DL_AR_ONE_SHOT && !overlap) ||
       (is_two_shot(algo) && vo.data == vi.data))) {
    const int64_t nv = (nbytes + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES;
    a.zero_copy = 1;
    a.zc_off = DL_AR_CTRL_BYTES + zc;
    a.n = vi.numel;
    a.in = vi.data;
    a.out = vo.data;
    shape_for(ar, algo == DL_AR_ONE_SHOT ? nv : (nv + ar->op.size - 1) / ar->op.size, blocks, algo, &a);
    return launch(ar, &a, stream);
  }
  /* copy-in (or push): pieces of at most one slot each (two_shot_lamport: size / 2
   * Lamport slots, lamport_piece), as even as whole vectors allow (48 MB in pieces
   * of 32 MiB: 24 + 24 MB, not 32 + 16) */
  const int64_t most = (is_lamport(algo) ? lamport_piece(ar, algo) : ar->slot) / es;
  const int64_t npieces = (vi.numel + most - 1) / most, ve = DL_AR_VEC_BYTES / es;
  const int64_t piece = npieces <= 1 ? most : ((vi.numel + npieces - 1) / npieces + ve - 1) / ve * ve;
  for (int64_t off = 0; off < vi.numel; off += piece) {
    a.n = vi.numel - off < piece ? vi.numel - off : piece;
    a.offset = off;
    a.in = vi.data + off * es;
    a.out = vo.data + off * es;
    const int64_t nv = (a.n * es + DL_AR_VEC_BYTES - 1) / DL_AR_VEC_BYTES;
    const int sliced = is_two_shot(algo) || algo == DL_AR_TWO_SHOT_LAMPORT;
    shape_for(ar, sliced ? (nv + ar->op.size - 1) / ar->op.size : nv, blocks, algo, &a);
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
  return snprintf(buf, len, "runs %s, %lld elements, dtype %s, blocks %d, %s", algo_name(s->algo),
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
  DL_TRY(ar_check(ar, "dl_allreduce_run"));
  DL_TRY(dl_devop_recorded_failure(&ar->op));
  if (dl_comm_debug(ar->op.comm)) {
    int rc = debug_check(ar, out, in, algo, blocks);
    ar->runs++;
    if (rc < 0) {
      char what[256];
      describe(ar, algo, what, sizeof what);
      dl_error_context(rc, "%s", what);
      /* a peer that never made the call: the calls are out of step for good */
      if (rc == DL_ETIMEOUT || rc == DL_EPEER) {
        dl_devop_set_failed(&ar->op);
        abort_peers(ar);
      }
      return rc;
    }
  }
  int rc = run(ar, out, in, algo, blocks, s);
  if (rc < 0 && algo != DL_AR_NCCL && rc != DL_EINVAL && rc != DL_EUNSUPPORTED && !ar->op.failed) {
    char what[256];
    describe(ar, algo, what, sizeof what);
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

int dl_allreduce_check(dl_allreduce_t *ar, dl_stream_t *s) {
  DL_TRY(ar_check(ar, "dl_allreduce_check"));
  DL_TRY(dl_devop_wait_stream(&ar->op, s, "all_reduce check", NULL));
  return dl_devop_recorded_failure(&ar->op);
}

/* ---- the lifecycle's hooks (core/ops/common/devop.h) --------------------------- */

static int twin(const void *a, void *stream) { return dl_allreduce_cpu(a, stream); }
#ifdef DL_WITH_CUDA
static int kernels(const void *a, void *stream) { return dl_allreduce_cuda(a, stream); }
#endif

static const dl_devop_kind_t ar_kind = {
    .name = "all-reduce",
    .magic = 0xa11ed0ce,
    .status_bytes = sizeof(dl_ar_status_t),
    .recorded = recorded,
    .cpu = twin,
#ifdef DL_WITH_CUDA
    .cuda = kernels,
#endif
};
