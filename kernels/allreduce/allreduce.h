/*
 * allreduce.h — what core/ops/allreduce/allreduce.c hands the all-reduce
 * kernels (kernels/allreduce/, launched by allreduce_launch.cu) and their CPU twin
 * (kernels/allreduce/cpu/allreduce.c): the argument block, the layout of each
 * rank's symmetric buffer, and the failure record a timed-out wait leaves.
 *
 * Each rank's symmetric buffer (one dl_symm_t, mapped by every rank):
 *
 *   [ctrl: dl_ar_ctrl_t, 64 KiB][zero-copy input: slot][staging: 2 halves x n slots]
 *   [lamport: 2 halves x n lamport slots]
 *
 * ctrl holds the barrier flags peers write (flags[block][from rank]), this
 * rank's own barrier counts (counts[block][peer]; counts[block][rank] counts
 * the rounds a pipelined kernel's producer warps finished, which they also
 * publish in progress[block] for the block's consumer warps), the call
 * counter `seq` and the count of blocks that finished the current call. All of them live in device memory and are
 * advanced by the kernels themselves (as vLLM's custom all-reduce keeps its
 * counters), so a CUDA graph replays correctly any number of times, mixed
 * with eager calls, other algorithms and other sizes.
 *
 * Staging slots: one-shot push writes rank p's input into slot p of every
 * peer; two_shot_write writes slice q of rank p's input into slot p of rank
 * q (at slice q's positions) and the reduced slice q into slot 0 of every
 * peer (at slice q's positions: free, since rank 0 writes its share of the
 * owner's slice only into the owner's own slice positions).
 *
 * Double buffering: a call with counter seq uses staging half seq & 1. A
 * rank rewrites half h two calls later; by then it has met every peer in a
 * barrier of the call in between, and a peer that reached that call had
 * finished this one. So copy-in and push variants need no closing barrier.
 * Zero-copy variants read the caller's region, which the caller may rewrite
 * as soon as the call returns: they end with a barrier.
 *
 * Lamport region: every 32-bit word is DL_AR_LAMPORT_EMPTY except while a
 * call uses it. one_shot_lamport writes rank p's input into slot p of every
 * peer's half (seq & 1), with any word equal to DL_AR_LAMPORT_EMPTY sent as
 * DL_AR_LAMPORT_NAN (both are NaNs in every dtype, so no value changes);
 * the receiver polls each vector until none of its words is empty, reduces,
 * and empties the words again. two_shot_lamport does the same with slices:
 * slice q of rank p's input into slot p of rank q's half, and rank q's sum
 * of slice q into slot q of every peer's half, each at the slice's own
 * positions (in one half, slot p holds p's share of the owner's slice at
 * the owner's positions and p's sum at p's: they never overlap). A peer
 * writes that half again two calls later, after it has received this rank's
 * data of the call in between, which this rank sends only after this call
 * (its emptying included) ended. The region serves no other algorithms, so
 * nothing else leaves data there.
 *
 * Tagged vectors (one_shot_lamport up to DISTLAB_AR_TAGGED_MAX_BYTES, a.tagged):
 * each 16-byte vector of the region carries 8 bytes of the input and says
 * itself which call sent it, so no thread waits for a peer's call before its
 * data. The vector is two 64-bit words, each stored and loaded whole (a GPU
 * moves an aligned 64-bit word in one piece; ar_call_read relies on it too),
 * each a 32-bit payload word below a 32-bit tag: word 0's tag is
 * dl_ar_tag_seq(seq), word 1's dl_ar_call_hash of the call. Input vector v
 * (16 bytes) travels as region vectors 2v and 2v + 1, so a slot holds half
 * the input it holds untagged. No tag equals DL_AR_LAMPORT_EMPTY: a word is
 * there once its tag is, whatever its payload (no input word is changed). A
 * word whose tag is neither empty nor this call's is a peer running another
 * call: the reader compares the peer's call (announced as above) with its
 * own and fails with a mismatch naming both. The reader empties both
 * vectors, and the halves alternate as above.
 */
#ifndef DISTLAB_ALLREDUCE_H
#define DISTLAB_ALLREDUCE_H

#include <stdint.h>
#include <string.h> /* memset, memcpy: dl_ar_call_of, dl_ar_call_hash */

#include "allreduce/algos.h"
#include "common/dtype.h" /* DL_HD */
#include "common/signal_pad.h"

enum {
  DL_AR_MAX_BLOCKS = 512,
  DL_AR_CTRL_BYTES = 65536, /* sizeof(dl_ar_ctrl_t) rounded up */
  DL_AR_VEC_BYTES = 16
};
#define DL_AR_LAMPORT_EMPTY 0xffffffffu /* a NaN as f32, two NaNs as f16/bf16 */
#define DL_AR_LAMPORT_NAN 0x7fffffffu   /* what an input word equal to EMPTY is sent as */

/* A call as one rank runs it. Block 0 of every rank writes its call into
 * every peer's ctrl (calls[seq & 1][from]) as it starts; before any block
 * touches a peer's data it waits until that peer's entry is the one of this
 * call and compares it with its own, so ranks that call differently (size,
 * dtype, algorithm, grid) fail instead of summing garbage. On the wire
 * (dl_ar_call_wire_t) each 32-bit word of the call travels in a 64-bit word
 * whose high half is the call's seq, so every word says by itself which call
 * it belongs to: the writer stores them without a fence or an order (a
 * system fence before a seq written last sat on every call's critical path)
 * and the reader takes the entry once every word carries its seq. It costs
 * 64 bytes stored into each peer and a poll of local memory that the peer's
 * first flag or data would have been waited for anyway. The entry of call s
 * is rewritten at call s + 2, which its writer starts only after this rank
 * took part in call s + 1 (the double buffering of the staging halves). */
typedef struct dl_ar_call {
  uint32_t seq;        /* 1 + the writer's ctrl.seq at this call (0: none yet) */
  uint8_t algo, dtype, zero_copy, tagged; /* tagged: the Lamport vectors carry tags (above) */
  int32_t blocks, round_vecs;
  int64_t n;           /* elements of the whole run (a large one runs in pieces) */
  int64_t offset;      /* this piece's first element */
} dl_ar_call_t;        /* 32 bytes, no padding: compared word by word */
#ifdef __cplusplus
static_assert(sizeof(dl_ar_call_t) == 32, "dl_ar_call_t is 8 words");
#else
_Static_assert(sizeof(dl_ar_call_t) == 32, "dl_ar_call_t is 8 words");
#endif

/* Word i of a dl_ar_call_t c as stored in a peer: dl_ar_call_wire_word(c.seq, word i). */
typedef struct dl_ar_call_wire {
  uint64_t w[8];
} __attribute__((aligned(64))) dl_ar_call_wire_t; /* one 64-byte piece of a line: read in 4 vector loads */

/* A word of a call as it travels: the call's seq above it (the reader takes
 * the word once the high half is its own call's seq). */
DL_HD uint64_t dl_ar_call_wire_word(uint32_t seq, uint32_t word) { return (uint64_t)seq << 32 | word; }

typedef struct dl_ar_ctrl {
  uint32_t flags[DL_AR_MAX_BLOCKS][DL_SIGNAL_MAX_RANKS];  /* [block][from rank], peers write */
  uint32_t counts[DL_AR_MAX_BLOCKS][DL_SIGNAL_MAX_RANKS]; /* [block][peer], this rank's */
  uint32_t progress[DL_AR_MAX_BLOCKS]; /* pipelined kernels: rounds block b produced */
  uint32_t seq;  /* calls finished on this rank                          */
  uint32_t done; /* blocks of the running call that finished             */
  dl_ar_call_wire_t calls[2][DL_SIGNAL_MAX_RANKS]; /* [seq & 1][from rank], peers write */
  /* 1 + the rank that gave up (its wait timed out, it saw mismatched calls,
   * a peer of its died): written by that rank into every peer's ctrl, read by
   * every wait here, so no rank completes a call against an abandoned one */
  uint32_t abort;
} dl_ar_ctrl_t;
#ifdef __cplusplus
static_assert(sizeof(dl_ar_ctrl_t) <= DL_AR_CTRL_BYTES, "ctrl fits its region");
#else
_Static_assert(sizeof(dl_ar_ctrl_t) <= DL_AR_CTRL_BYTES, "ctrl fits its region");
#endif

/* Failure kinds (status.kind and the pad's error[0]). A timed-out wait is
 * the pad's barrier kind. */
enum {
  DL_AR_FAIL_TIMEOUT = DL_SIGNAL_ERR_BARRIER,
  DL_AR_FAIL_MISMATCH = 16, /* a peer's call differs: mine and theirs below   */
  DL_AR_FAIL_ABORT = 17,    /* peer gave up (its ctrl.abort reached ours)     */
  DL_AR_FAIL_DEAD = 18      /* a rank's process is gone (status.gone)          */
};

/* status.block of a wait for a peer's call descriptor (not a block's flag) */
#define DL_AR_BLOCK_CALL 0xffffffffu

/* What a failed wait leaves for the host (host-mapped memory on cuda, so
 * the next call sees it without a synchronisation). The first failure wins;
 * the same kind also goes to the signal pad's error[] (signal.h). */
typedef struct dl_ar_status {
  uint32_t kind;     /* 0: none; DL_AR_FAIL_* */
  uint32_t peer;     /* the rank that did not arrive, differs, gave up or died */
  uint32_t expected; /* the count waited for (one_shot_lamport: the vector) */
  uint32_t seen;     /* the count found (one_shot_lamport: 0) */
  uint32_t block;
  uint32_t algo;
  uint32_t seq; /* the call, counted by the kernels of this buffer */
  uint32_t gone; /* 1 + a rank whose process is gone, written by the host's watchdog
                    (core/comm/peers.c); every wait that lasts polls it */
  dl_ar_call_t mine, theirs; /* DL_AR_FAIL_MISMATCH */
} dl_ar_status_t;

typedef struct dl_ar_args {
  int algo;      /* DL_AR_* (algos.h), not DL_AR_NCCL                             */
  int dtype;     /* DL_F32, DL_F16 or DL_BF16                                      */
  int rank, nranks;
  int blocks;    /* grid size, 1..DL_AR_MAX_BLOCKS                                 */
  int threads;   /* per block; >= nranks                                           */
  int unroll;    /* 16-byte vectors per thread per step                            */
  int round_vecs; /* vectors per block per round (of the tensor, or of each slice
                     for two-shot); rounds are separated by barriers or flags    */
  int zero_copy; /* the input is at zc_off in every rank's buffer (see above)      */
  int tagged;    /* one_shot_lamport: tagged vectors (above; 2 x the input's
                    bytes fit a lamport slot)                                  */
  uint32_t call_hash; /* dl_ar_call_hash of this call: set by the core (launch) */
  int pdl;       /* cuda: launch with programmatic stream serialization (sm_90),
                    so the grid can be scheduled while the kernel before it in
                    the stream finishes; the kernels wait for it before any
                    memory access (griddepcontrol.wait)                          */
  int64_t n;     /* elements                                                       */
  const void *in;  /* this rank's input (not read when zero_copy)                  */
  void *out;       /* this rank's output; may equal in                             */
  char *bufs[DL_SIGNAL_MAX_RANKS]; /* every rank's symmetric buffer, mapped here   */
  char *ring[DL_SIGNAL_MAX_RANKS]; /* ring[i]: rank (rank + i) % nranks's buffer,
                                      set by the launcher (dl_ar_args_ring)       */
  int64_t zc_off;      /* byte offset of the zero-copy input in every buffer       */
  int64_t staging_off; /* byte offset of staging half 0, slot 0                    */
  int64_t slot_bytes;  /* bytes of one staging slot (a multiple of 16)             */
  int64_t lamport_off;  /* byte offset of lamport half 0, slot 0                     */
  int64_t lamport_stride; /* bytes from a lamport slot to the next (a multiple of 16;
                             the slot's bytes, the core's lslot, plus any pad)      */
  dl_signal_pad_t *pad;    /* this rank's signal pad: failure records             */
  dl_ar_status_t *status;  /* this rank's status, writable by the kernel           */
  uint64_t timeout_ns;     /* every wait ends after this                            */
  uint32_t poll_ns;        /* nap between polls after the 8th (Lamport, call check) */
  uint32_t long_poll_ns;   /* the Lamport waits' nap after long_poll_after polls   */
  uint32_t long_poll_after; /* polls of a Lamport wait before its naps grow long   */
  uint32_t gone_gap_ns;    /* a block reads status->gone (host memory) at most once
                              per this, in waits past 100 us (0: every check)      */
  int lamport_ahead;       /* Lamport kernels: grid steps pushed before the first
                              is reduced (0: all of them)                          */
  int64_t total_n;         /* elements of the whole run, and this piece's first:    */
  int64_t offset;          /* what the call descriptor says (dl_ar_call_t)          */
} dl_ar_args_t;

/* The buffers in the order the kernels write to the peers (peer_after:
 * from the next rank on), so that a kernel takes peer i's buffer with i
 * known when it compiles, not by a search over bufs at run time. */
DL_HD void dl_ar_args_ring(dl_ar_args_t *a) {
  for (int i = 0; i < DL_SIGNAL_MAX_RANKS; i++)
    a->ring[i] = i < a->nranks ? a->bufs[(a->rank + i) % a->nranks] : (char *)0;
}

/* This call as every rank describes it to the others (dl_ar_call_t), with
 * seq 0 (the kernels and the twin put 1 + their seq there). */
DL_HD dl_ar_call_t dl_ar_call_of(const dl_ar_args_t *a) {
  dl_ar_call_t c;
  memset(&c, 0, sizeof c);
  c.algo = (uint8_t)a->algo;
  c.dtype = (uint8_t)a->dtype;
  c.zero_copy = (uint8_t)a->zero_copy;
  c.tagged = (uint8_t)a->tagged;
  c.blocks = a->blocks;
  c.round_vecs = a->round_vecs;
  c.n = a->total_n;
  c.offset = a->offset;
  return c;
}

/* The tags of a tagged Lamport vector (above): the call's seq, and a hash
 * (FNV-1a over words 1..7: whatever differs in one word changes it) of the
 * call; neither is ever DL_AR_LAMPORT_EMPTY. */
DL_HD uint32_t dl_ar_tag_seq(uint32_t seq) { return seq & 0x7fffffffu; }
DL_HD uint32_t dl_ar_call_hash(const dl_ar_call_t *c) {
  uint32_t w[8], x = 2166136261u;
  memcpy(w, c, sizeof w);
  for (int i = 1; i < 8; i++) x = (x ^ w[i]) * 16777619u;
  return x == DL_AR_LAMPORT_EMPTY ? DL_AR_LAMPORT_NAN : x;
}
/* dl_ar_args_t.call_hash for a: the hash of the call it describes. */
DL_HD uint32_t dl_ar_args_hash(const dl_ar_args_t *a) {
  const dl_ar_call_t c = dl_ar_call_of(a);
  return dl_ar_call_hash(&c);
}

/* Two calls for call seq as block 0s announce them (a rank's own copy and a
 * peer's, from its ctrl): 1 when both are there (every word tagged 1 + seq)
 * and differ, the two then in *a and *b. The host's report of a peer that
 * gave up names that mismatch instead (core/ops/allreduce: a rank whose wait
 * could not end saw the abort before it compared calls). */
DL_HD int dl_ar_calls_differ(const dl_ar_call_wire_t *x, const dl_ar_call_wire_t *y, uint32_t seq, dl_ar_call_t *a,
                             dl_ar_call_t *b) {
  uint32_t u[8], v[8];
  int same = 1;
  for (int i = 0; i < 8; i++) {
    if ((uint32_t)(x->w[i] >> 32) != seq + 1 || (uint32_t)(y->w[i] >> 32) != seq + 1) return 0;
    u[i] = (uint32_t)x->w[i];
    v[i] = (uint32_t)y->w[i];
    if (i > 0 && u[i] != v[i]) same = 0;
  }
  if (same) return 0;
  memcpy(a, u, sizeof u);
  memcpy(b, v, sizeof v);
  return 1;
}

#ifdef __cplusplus
extern "C" {
#endif
/* One all-reduce of a->n elements. cuda: kernels on `stream` (asynchronous;
 * a timeout shows up in *a->status). cpu: runs to the end, DL_ETIMEOUT with
 * a message naming the peer if one did not arrive. Same arguments for both. */
int dl_allreduce_cuda(const dl_ar_args_t *a, void *stream);
int dl_allreduce_cpu(const dl_ar_args_t *a, void *stream);
/* The launch configuration the cuda launcher uses (threads, unroll) for a
 * world size, so the core can size grids and rounds. */
void dl_allreduce_cuda_shape(int nranks, int *threads, int *unroll);
#ifdef __cplusplus
}
#endif

#endif
