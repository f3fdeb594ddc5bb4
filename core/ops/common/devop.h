/*
 * devop.h — the lifecycle every device op shares: an operator that runs
 * kernels (or stream operations) across the ranks of one host over a
 * symmetric buffer (all-reduce, EP, overlap, and the next family).
 *
 * A family embeds a dl_devop_t as the first member of its object and names
 * its kind (a dl_devop_kind_t: its name in messages, its magic, its failure
 * record and how to word it, its CPU twin and CUDA launcher). From here it
 * gets: identity and the peers' pids (dl_devop_open), the failure record in
 * host memory the kernels write (mapped for the device on cuda, so the host
 * reads it without waiting), the symmetric buffer mapped from every rank,
 * the peer watch (core/comm/peers.c: a dead peer's rank lands in a word
 * that waits poll), "this X failed earlier" once an op has failed, the
 * launch on its device with the twin's failure worded as the kernels' is,
 * the wait for a stream in dl_*_check, and the release of graphs and memory.
 * The kernel side of the launch (PDL, the CPU emulators) is
 * kernels/common/launch.cuh.
 */
#ifndef DISTLAB_OPS_DEVOP_H
#define DISTLAB_OPS_DEVOP_H

#include <pthread.h>

#include "base/internal.h"
#include "comm/comm_ops.h"
#include "common/signal_pad.h"

typedef struct dl_devop dl_devop_t;

typedef struct dl_devop_kind {
  const char *name;    /* "all-reduce", "ep buffer", "overlap op": "this ep buffer failed earlier" */
  uint32_t magic;      /* marks a live object of the kind */
  size_t status_bytes; /* the kernels' failure record, zeroed (0: none) */
  /* The failure the kernels left in op->status as an error, DL_OK if none;
   * *fatal = 0 where the op goes on after it (the record is consumed). */
  int (*recorded)(dl_devop_t *op, int *fatal);
  /* One launch of the family's CPU twin, and of its kernels (NULL in a
   * build without CUDA): the family's argument block and the stream. */
  int (*cpu)(const void *args, void *stream);
  int (*cuda)(const void *args, void *stream);
  /* What graphs that captured its work name when it is freed ("the ep
   * buffer (its symmetric buffer and outputs)"), and the family's own
   * teardown, before the lifecycle's (may be NULL). */
  const char *what;
  void (*fini)(dl_devop_t *op);
} dl_devop_kind_t;

struct dl_devop {
  uint32_t magic; /* kind->magic while live */
  const dl_devop_kind_t *kind;
  dl_comm_t *comm;    /* borrowed: the caller keeps it alive */
  char comm_name[96]; /* its name, for messages */
  int rank, size, dev_type, dev_index;
  int share; /* ranks of the comm on this GPU (1: a GPU of its own) */
  double timeout_s;
  int32_t pids[DL_SIGNAL_MAX_RANKS]; /* the ranks' processes on this host, for messages */
  dl_symm_t *symm;
  char *bufs[DL_SIGNAL_MAX_RANKS]; /* every rank's symmetric buffer, mapped here */
  void *status;                    /* kind->status_bytes; host-mapped on cuda */
  uint32_t *gone;                  /* the watched word (1 + a dead rank), or NULL */
  pthread_mutex_t mu;              /* failed and failure; a family's own fields may share it */
  int failed;                      /* set once, read without mu first */
  char failure[1536];              /* why, once failed */
};

/* Identity from the communicator, the peers' pids (not on meta), the
 * failure record; the op is live from here (dl_devop_free undoes it). */
int dl_devop_open(dl_devop_t *op, const dl_devop_kind_t *kind, dl_comm_t *c, const dl_comm_info_t *ci);
/* The symmetric buffer of nbytes a rank, every rank's mapped in op->bufs
 * (meta: accounted, nothing mapped). Collective. */
int dl_devop_map(dl_devop_t *op, int64_t nbytes);
/* Peers' deaths land in *word (not on meta), until dl_devop_free. */
int dl_devop_watch(dl_devop_t *op, uint32_t *word);
/* Frees a live op of kind (anything else: nothing): graphs that captured its
 * work must not replay after it (kind->what names it in their error), the
 * family's teardown (kind->fini), then the watch, buffer, record and the
 * object itself (the dl_devop_t at its start). */
void dl_devop_free(dl_devop_t *op, const dl_devop_kind_t *kind);

/* cuda: the multiprocessors a rank's grids may fill. Ranks that share a GPU
 * (the ipc communicator) run their kernels at once (MPS) or in turns, and a
 * block spins until the same block of every peer has run: so every rank's
 * grid must be resident beside the others', and beside the next grid each
 * launches early (programmatic dependent launch). Half the multiprocessors
 * go to them, a share each (4 ranks on one H100 with a quarter each
 * deadlocked until the timeout: a rank's last block found none free). */
int dl_devop_sms(const dl_devop_t *op, int *sms);

/* DL_OK if op is a live op of kind, else DL_ESTATE naming fn. */
int dl_devop_live(const dl_devop_t *op, const dl_devop_kind_t *kind, const char *fn);
/* The identity every dl_*_info_t opens with. */
void dl_devop_identity(const dl_devop_t *op, int32_t *rank, int32_t *size, int32_t *dev_type, int32_t *dev_index);
/* "<what> on rank 1 of 2 (comm 'w', cuda:1)" */
int dl_devop_describe(const dl_devop_t *op, const char *what, char *buf, size_t len);
/* 1 + the rank whose death was seen, or 0. */
uint32_t dl_devop_gone(const dl_devop_t *op);
/* "rank R (pid P) has exited" for a value of the watched word. */
int dl_devop_gone_str(const dl_devop_t *op, uint32_t gone, char *buf, size_t len);

/* The op fails for good with why (the first reason stays); _locked with mu held. */
void dl_devop_fail(dl_devop_t *op, const char *why);
void dl_devop_fail_locked(dl_devop_t *op, const char *why);
/* ... with the calling thread's last error as the reason. */
void dl_devop_set_failed(dl_devop_t *op);
/* DL_ESTATE "this <kind> failed earlier and refuses work" once failed, else DL_OK. */
int dl_devop_refused(dl_devop_t *op);
/* dl_devop_refused, then the kernels' record worded (kind->recorded); a
 * fatal one fails the op. */
int dl_devop_recorded_failure(dl_devop_t *op);

/* One launch on op's device (not meta) with the family's arguments: the
 * kernels on cuda; the CPU twin on cpu, a failure it recorded worded as the
 * kernels' would be. A graph being captured now notes the op. */
int dl_devop_launch(dl_devop_t *op, const void *args, void *stream);
/* dl_*_check on cuda (elsewhere DL_OK at once): waits until stream s has
 * run everything queued, twice the timeout and a second at most (the
 * device's waits end by themselves), an error naming what if it failed or
 * did not finish. poll, if given, is asked meanwhile and ends the wait with
 * its error (an op that another thread fails while the stream runs:
 * overlap's watchdog). */
int dl_devop_wait_stream(dl_devop_t *op, dl_stream_t *s, const char *what, int (*poll)(dl_devop_t *op));

#endif
