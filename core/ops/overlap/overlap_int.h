/*
 * overlap_int.h — the overlap object (dl_overlap_t) as its files share it:
 * core/ops/overlap/overlap.c (lifetime, views, cpu flags, copies),
 * overlap_flags.c (the control words in host shared memory) and
 * overlap_watch.c (cuda: stream memory operations and the watchdog thread).
 *
 * Each rank's data lives in a symmetric buffer (device memory on cuda);
 * its control words in host memory every rank of the node maps:
 * [flags: DL_OVERLAP_MAX_FLAGS words, set by peers, cleared by their owner]
 * [active: 1 word][progress: DL_OVERLAP_MAX_WAITS words][ended: 1 word, cpu:
 * the id of the last run this rank ended, which its peers read when it
 * dies: a rank that ended their run owes them nothing]. active holds the
 * run's id (nonzero) from its begin to its end and 0 between runs;
 * progress[i] becomes the run's id when its wait i has passed. Only the
 * owner writes active and progress: they are what the watchdog reads to see
 * whether a run still moves, and it can write any flag of its own at any
 * time, which is what ends a stuck wait (overlap_flags.c says why).
 */
#ifndef DISTLAB_OVERLAP_INT_H
#define DISTLAB_OVERLAP_INT_H

#include "ops/common/devop.h"

/* One wait of the current run, as issued (for a timeout's message). */
typedef struct wait_rec {
  int flag, peer, step;
  char what[24];
  void *stream; /* cudaStream_t: the stuck wait of a stream is its first not passed */
} wait_rec_t;

typedef struct watch watch_t; /* overlap_watch.c */

enum { DL_OVERLAP_ENDED = DL_OVERLAP_MAX_FLAGS + 1 + DL_OVERLAP_MAX_WAITS,
       DL_OVERLAP_CTL_WORDS = DL_OVERLAP_ENDED + 1 };

struct dl_overlap {
  dl_devop_t op;  /* the lifecycle: identity, buffer, failure; its mu guards log, nlog too */
  char what[200]; /* the call that made it: "ag_gemm p2p get ce ..." */
  int sms, nflags;
  int64_t nbytes;
  /* every rank's control words as mapped here: for the host (flags) and for
   * this process's stream memory operations (dflags; the same on cpu) */
  uint32_t *flags[DL_SIGNAL_MAX_RANKS];
  uint32_t *dflags[DL_SIGNAL_MAX_RANKS];
  uint32_t *state, *dstate; /* this rank's [active][progress...], both ways */
  size_t ctl_bytes;
  int registered[DL_SIGNAL_MAX_RANKS]; /* cuda: flags[r] is registered with CUDA */
  char ctl_name[64];                   /* our segment's name until it is unlinked */
  wait_rec_t log[DL_OVERLAP_MAX_WAITS];
  int nlog;
  int64_t runs;
  uint32_t run_id; /* the run being issued: what its begin and waits write */
  watch_t *watch;
  uint32_t gone; /* op.gone: 1 + a rank whose process died (peers.c) */
};

/* overlap_flags.c. Collective: every rank's control words mapped here (ours
 * zeroed), names published under store keys of call seq. */
int dl_overlap_ctl_map(dl_overlap_t *o, dl_comm_t *c, int64_t seq);
/* Once every rank has mapped every segment: our name and key go. */
int dl_overlap_ctl_unlink(dl_overlap_t *o, dl_comm_t *c, int64_t seq);
/* The mappings go (and our name, if still there). The GPU must be done with them. */
void dl_overlap_ctl_unmap(dl_overlap_t *o);

#ifdef DL_WITH_CUDA
int dl_overlap_cu_init(dl_overlap_t *o);
/* Waits until the device has run everything queued, the watchdog still
 * ending stuck runs meanwhile (so this ends), then stops the watchdog. */
void dl_overlap_cu_fini(dl_overlap_t *o);
int dl_overlap_cu_begin(dl_overlap_t *o, void *stream);
int dl_overlap_cu_signal(dl_overlap_t *o, uint32_t *flag, void *stream);
int dl_overlap_cu_wait(dl_overlap_t *o, uint32_t *flag, int idx, void *stream);
int dl_overlap_cu_end(dl_overlap_t *o, void *stream);
#endif

#endif
