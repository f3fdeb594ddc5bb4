/*
 * overlap_int.h — the overlap object (dl_overlap_t) as its two files share
 * it: core/ops/overlap/overlap.c (lifetime, views, cpu flags, copies) and
 * core/ops/overlap/overlap_watch.c (cuda: stream memory operations and the
 * watchdog thread).
 *
 * Each rank's symmetric buffer: [data, nbytes rounded up to 256]
 * [flags: DL_OVERLAP_MAX_FLAGS words, set by peers, cleared by their owner]
 * [active: 1 word][progress: DL_OVERLAP_MAX_WAITS words]. active is 1 from
 * a run's begin to its end; progress[i] becomes 1 when the run's wait i has
 * passed (begin zeroes them). Only the owner touches active and progress:
 * they are what the watchdog reads to see whether a run still moves.
 */
#ifndef DISTLAB_OVERLAP_INT_H
#define DISTLAB_OVERLAP_INT_H

#include <pthread.h>

#include "base/internal.h"

/* One wait of the current run, as issued (for a timeout's message). */
typedef struct wait_rec {
  int flag, peer, step;
  char what[24];
  void *stream; /* cudaStream_t: the stuck wait of a stream is its first not passed */
} wait_rec_t;

typedef struct watch watch_t; /* overlap_watch.c */

struct dl_overlap {
  uint32_t magic;
  char what[200];     /* the call that made it: "ag_gemm p2p get ce ..." */
  char comm_name[96];
  int rank, size, dev_type, dev_index, share, sms, nflags;
  double timeout_s;
  int64_t nbytes, data_bytes;
  dl_symm_t *symm;
  char *bufs[DL_SIGNAL_MAX_RANKS];
  uint32_t *flags[DL_SIGNAL_MAX_RANKS]; /* every rank's flags as mapped here */
  uint32_t *state;                      /* this rank's [active][progress...] */
  pthread_mutex_t mu;                   /* log, nlog, failed, failure */
  wait_rec_t log[DL_OVERLAP_MAX_WAITS];
  int nlog;
  int64_t runs;
  int failed;
  char failure[1536];
  watch_t *watch;
};

/* Record why the object failed (the first reason stays); mu held. */
void dl_overlap_fail_locked(dl_overlap_t *o, const char *why);
/* "ag_gemm p2p get ce on rank 1 of 2 (comm 'w', cuda:1)" */
int dl_overlap_describe(const dl_overlap_t *o, char *buf, size_t len);

#ifdef DL_WITH_CUDA
int dl_overlap_cu_init(dl_overlap_t *o);
void dl_overlap_cu_fini(dl_overlap_t *o);
int dl_overlap_cu_begin(dl_overlap_t *o, void *stream);
int dl_overlap_cu_signal(dl_overlap_t *o, uint32_t *flag, void *stream);
int dl_overlap_cu_wait(dl_overlap_t *o, uint32_t *flag, int idx, void *stream);
int dl_overlap_cu_end(dl_overlap_t *o, void *stream);
#endif

#endif
