/*
 * allreduce_int.h — the all-reduce object as its files share it:
 * allreduce.c (lifetime, buffers, info, the lifecycle's hooks),
 * allreduce_run.c (a call: zero copy, pieces, grids, the debug check) and
 * allreduce_failure.c (the kernels' failure record worded, aborts).
 */
#ifndef DISTLAB_ALLREDUCE_INT_H
#define DISTLAB_ALLREDUCE_INT_H

#include "allreduce/allreduce.h"
#include "ops/common/devop.h"

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

/* The all-reduce's kind of device op (allreduce.c). */
extern const dl_devop_kind_t dl_ar_kind;

/* DL_OK if ar is a live all-reduce, else DL_ESTATE naming fn. */
static inline int dl_ar_live(const dl_allreduce_t *ar, const char *fn) {
  return dl_devop_live(ar ? &ar->op : NULL, &dl_ar_kind, fn);
}
/* An algorithm's name for messages: "?" for a number that names none. */
const char *dl_ar_name(int algo);
/* "all_reduce two_shot on rank 1 of 2 (comm 'w', cuda:1)" */
int dl_ar_describe(const dl_allreduce_t *ar, int algo, char *buf, size_t len);
/* The byte offset of the Lamport region in every rank's buffer. */
int64_t dl_ar_lamport_offset(const dl_allreduce_t *ar);

/* allreduce_failure.c. The failure the kernels recorded, worded
 * (dl_devop_kind_t.recorded); a failure found on the host: every peer's
 * kernels told to give up. */
int dl_ar_recorded(dl_devop_t *op, int *fatal);
void dl_ar_abort_peers(dl_allreduce_t *ar);

#endif
