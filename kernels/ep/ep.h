/*
 * ep.h — what core/ops/ep/ep.c hands the expert-parallel dispatch/combine
 * kernels (kernels/ep/ep_dispatch.cu, ep_combine.cu) and their CPU twin
 * (kernels/ep/cpu/ep.c): the argument block, the layout of every rank's
 * symmetric buffer, the message formats and the failure record.
 *
 * Notation: N ranks, E experts, L = E/N local experts (expert e lives on rank
 * e / L as local expert e % L), K selections per token, B max tokens a rank
 * sends, H hidden size, T <= B this rank's tokens of the call.
 *
 * Every rank's buffer (offsets the same on every rank):
 *
 *   [ctrl: dl_ep_ctrl_words(N, L) uint32, rounded up to 4 KiB]
 *   [dispatch receive: slots x msg_d][combine receive: slots x msg_c]
 *
 *   layout      dispatch slots            combine slots
 *   per_expert  [L][N][B]: one message    [E][B]: expert e's output for
 *               per (token, k), slot       token t at [e][t]
 *               [le][source][position of
 *               the token among the
 *               source's tokens for e]
 *   per_rank    [N][B]: one message per    [K][B]: the output of selection
 *               (token, destination        k of token t at [k][t]; Lamport
 *               rank), slot [source][its   slots (below): [2][K][B], half
 *               position among the         e & 1 in call e
 *               source's tokens for that
 *               rank]; its header carries
 *               the token's selections on
 *               that rank; Lamport slots:
 *               [2][N][B], half e & 1 in
 *               call e, then the sources'
 *               count words [N]
 *
 * Messages are written by the sender straight into the receiver's slots
 * (NVLink, or shared memory on cpu): no send buffers. Dispatch message =
 * header + payload (each padded to 128 bytes, DL_EP_LINE, so that the
 * payloads' lines are whole; the header's padding is written too):
 *   per_expert header (16 B): int32 token, int32 row (the token's position
 *     among the source's tokens for this rank: its rank-major row), uint32
 *     k | kmask << 8 (kmask: the token's selections on this rank), f32 weight
 *   per_rank header (align16(4 + 8K) B): int32 token (in Lamport slots: the
 *     token | the call's tag (dl_ep_call) << 16), then per selection k:
 *     int16 local expert (-1: not on this rank), int16 position of the token
 *     among the source's tokens for that expert, f32 weight
 *   payload: bf16 [H], or fp8 e4m3 [H] bytes then f32 scales [H/128]
 * Combine message = the bf16 output row [H].
 *
 * Lamport slots (per_rank's combine with rank_major output on cuda, where
 * a.lamport: buffers whose receive is at most DL_EP_LAMPORT_MAX_ROWS rows,
 * N B, DISTLAB_EP_LAMPORT_MAX_ROWS to change it; larger ones and expert_major
 * output keep the flag and one half; the dispatch of the same buffers, below):
 * every 32-bit word of both
 * halves is DL_EP_EMPTY except while a call uses it (the buffer starts so).
 * The sender writes its rows with any word equal to DL_EP_EMPTY sent as
 * DL_EP_NAN (both NaN pairs in bf16), and no flag: its count (comb_flag) is
 * a relaxed add, kept for the epochs and a timeout's record. The owner
 * knows from its handle which slots the call fills; it polls each 16-byte
 * vector until none of its words is empty, sums, and empties the words
 * again. So a row is summed as soon as it has arrived, and the send's
 * system fence and the receive's wait for every rank's count are gone. The
 * emptying of call e's half needs no fence either: a sender writes that
 * half again in call e + 2, after the owner's comb_done of call e + 1,
 * which a later kernel adds once call e's kernels have ended (and their
 * stores with them). The cpu twin keeps the flags and the first half. The
 * emptying costs stores as many as the rows read, so the bound is on the
 * rows a rank receives, N B (measured: experiments/ep/NOTES.md).
 *
 * The dispatch of the same buffers with bf16 payloads (dl_ep_dispatch_lamport)
 * in Lamport slots too, where the receiver does not know how many rows come.
 * The sender's last block (its walk covers every token) writes each
 * receiver's count of the call as one word tagged with the call
 * (dl_ep_count_word), right after its wait for the receivers' disp_done; the
 * messages (header and payload, every word as above) follow, with no fence,
 * and disp_flag is a relaxed add. The receive deals the rows without the
 * counts: a warp takes row j of a peer and polls it; only where the row is
 * not there at the first poll does it poll the source's count word for the
 * call's tag, to learn whether row j comes at all (j < n). Rows are copied
 * out and emptied by their one reader; the count words are never emptied
 * (the word a slot held before carries another call's tag, and the next
 * call's comes only after this call's disp_done); the outputs' counts are
 * the last block's. This rank's own rows go straight to the outputs as before
 * (no slot), their words cleaned the same way, so that every row of the
 * output reads alike (a word equal to DL_EP_EMPTY, two bf16 NaNs, arrives as
 * DL_EP_NAN). The halves' argument is the combine's, with disp_done: a sender
 * writes half e & 1 again in call e + 2, after the receivers' disp_done of
 * call e + 1. Messages are padded to lines (DL_EP_LINE). fp8 payloads keep
 * the flag, which was faster for them (experiments/ep/NOTES.md).
 *
 * Control words (uint32; "from q" = written by rank q into this rank's buffer):
 *   disp_flag[N]  from source q: a counter; each block of q's dispatch send
 *                 adds its share once its messages (and, for the last block,
 *                 the counts) to us are written (release): the shares of a
 *                 call sum to DL_EP_SHARES, so call e has fully arrived when
 *                 the counter reaches e * DL_EP_SHARES
 *   disp_done[N]  from receiver q: the same count of its receive blocks that
 *                 have read our messages
 *   comb_flag[N]  from expert host q: the same count of its combine send
 *   comb_done[N]  from owner q: the same count of its combine receive
 *   ntok[N]       from source q: its messages (per_rank) / distinct tokens
 *                 (per_expert) to us in the call of disp_flag[q] (not in
 *                 Lamport slots: the count words above)
 *   dtag[N]       from source q: the call tag of its last dispatch to us
 *   ctag[N]       from expert host q: the call tag of its last combine to us
 *   ann[N]        from rank q: the call it has started, and its kind
 *                 (dl_ep_ann_word), written as its send starts
 *   cnt[N][L]     from source q: its selections of each of our experts
 * The call tag (dl_ep_call) numbers a rank's dispatches and combines
 * together: call s of every rank must be the same kind. Each phase's epoch
 * pairs calls of one kind by their count, so a rank with an extra or a
 * missing call would pair its calls with the wrong ones; it stops instead:
 * a receive finds the peer's tag of its kind unequal to its own (the counts
 * arrived from another call), and a wait that lasts finds the peer's started
 * call (ann) to be its own call with the other kind (both would wait for
 * ever otherwise). Both are recorded (DL_EP_ERR_CALL), as is
 * a dead peer (status.gone, the process's watchdog: DL_EP_ERR_GONE).
 * No election of a last block and no grid-wide count on the way to a peer:
 * every block signals every rank itself, one release add a rank, so a
 * receiver waits for exactly the writes it needs. Each phase's epoch (calls
 * finished + 1) is read from the counter its own blocks add to at this rank
 * (disp_flag[rank] for dispatch send, disp_done[rank] for dispatch receive,
 * ...): a block reads it before adding its own share, so it sees the
 * previous call complete (a kernel boundary) and this one incomplete, and
 * counter / DL_EP_SHARES + 1 is the epoch. Counters only grow and are
 * compared as "reached" (modulo 2^32; epochs wrap at 2^22 calls): no word
 * is ever reset. A sender writes into a peer's slots only once that peer's
 * blocks have all read the previous call's (disp_done / comb_done): so
 * calls are safe back to back in any order, under graph replay as eagerly.
 * The grid size must not change over a buffer's life (it is the object's).
 *
 * Outputs (the object's own tensors, core/ops/ep/ep.c):
 *   expert_major  x [L][N*B][H] (bf16; fp8: u8 codes and scales
 *                 [L][N*B][H/128]), counts [L]; rows of expert le ordered by
 *                 source, then by the token order at the source
 *   rank_major    x [N][B][H], counts [N] (tokens from each source),
 *                 ids [N][B][K] (the local expert of the token's selection
 *                 k, or -1 if it lives elsewhere), weights [N][B][K]
 *   src           per output row {token, source | k << 8 | le << 16}: where
 *                 combine sends the row's output (rank_major: the token's
 *                 first selection on this rank)
 *   hidx, hw      the owner's copy of topk_idx / topk_weights (combine)
 */
#ifndef DISTLAB_EP_H
#define DISTLAB_EP_H

#include <stdint.h>

#include "common/signal_pad.h"

enum {
  DL_EP_MAX_TOPK = 24,     /* kmask fits the per_expert header's 24 bits     */
  DL_EP_MAX_TOKENS = 32767, /* positions are int16 in the per_rank header     */
  DL_EP_THREADS = 512,
  DL_EP_MAX_BLOCKS = 1024,
  DL_EP_CTRL_ALIGN = 4096,
  DL_EP_LINE = 128,        /* messages and payloads start on a line (dl_ep_hdr_bytes) */
  DL_EP_FP8_GROUP = 128,   /* values per fp8 scale (kernels/ep/fp8.h)          */
  DL_EP_LAMPORT_MAX_ROWS = 256, /* per_rank combines in Lamport slots up to N B rows */
  DL_EP_SHARE_SHIFT = 10,  /* the shares of a call's blocks sum to 2^10         */
  DL_EP_SHARES = 1 << DL_EP_SHARE_SHIFT /* >= DL_EP_MAX_BLOCKS: every share >= 1 */
};

#define DL_EP_EMPTY 0xffffffffu /* a Lamport slot's empty word (bf16: two NaNs) */
#define DL_EP_NAN 0x7fffffffu   /* what a row's word equal to DL_EP_EMPTY is sent as */

/* every block's share of a call's count is at least 1 (dl_ep_share) */
typedef char dl_ep_shares_cover_blocks[DL_EP_SHARES >= DL_EP_MAX_BLOCKS ? 1 : -1];

/* phases, as the epochs and the failure record number them; DL_EP_DISPATCH
 * and DL_EP_COMBINE run a send and its receive in one launch (one kernel on
 * cuda), each half counting and recording as its own phase */
enum { DL_EP_DISPATCH_SEND = 0, DL_EP_DISPATCH_RECV = 1, DL_EP_COMBINE_SEND = 2, DL_EP_COMBINE_RECV = 3,
       DL_EP_DISPATCH = 4, DL_EP_COMBINE = 5 };

/* failure kinds; all but a bad id end the buffer (and every wait of it) */
enum { DL_EP_ERR_TIMEOUT = 1, DL_EP_ERR_BAD_ID = 2, DL_EP_ERR_CALL = 3, DL_EP_ERR_GONE = 4 };

/* What a kernel leaves for the host (host-mapped on cuda, so the next call
 * reads it for free). The first failure wins. */
typedef struct dl_ep_status {
  uint32_t kind;     /* 0 or DL_EP_ERR_*                                   */
  uint32_t phase;    /* DL_EP_DISPATCH_SEND ...                            */
  uint32_t peer;     /* the rank waited for (gone: the dead one); bad id:
                        the token                                          */
  uint32_t expected; /* timeout: the call waited for; call: this rank's
                        call tag; bad id: k                                */
  uint32_t seen;     /* timeout: the calls the peer's count held whole;
                        call: the peer's tag (| DL_EP_TAG_OTHER: of the
                        other kind); bad id: the id                        */
  uint32_t block;
  uint32_t epoch;    /* the call, counted by the kernels of this phase      */
  uint32_t claim;    /* taken by the first failure, which then fills the
                        fields and sets kind last (the host reads kind first) */
  uint32_t gone;     /* 1 + a dead peer's rank: the watchdog's word
                        (core/comm/peers.c), polled by waits that last     */
} dl_ep_status_t;

/* status.seen of DL_EP_ERR_CALL: the tag was the peer's other kind of call */
#define DL_EP_TAG_OTHER 0x80000000u

typedef struct dl_ep_args {
  int phase;       /* DL_EP_*_SEND / _RECV                                  */
  int layout;      /* DL_EP_PER_EXPERT or DL_EP_PER_RANK (distlab.h)        */
  int output;      /* DL_EP_EXPERT_MAJOR or DL_EP_RANK_MAJOR                */
  int fp8;         /* dispatch payload: fp8 e4m3 + scales (else bf16)       */
  int rank, nranks, experts, local, topk, hidden, max_tokens;
  int tokens;      /* this rank's T of the last dispatch_send              */
  int blocks;      /* grid size (cpu: the blocks run one after another)     */
  int threads;     /* per block                                            */
  int lamport;     /* per_rank's combine slots are Lamport slots (above)    */
  int pdl;         /* cuda: launch with programmatic stream serialization
                      (common/pdl.cuh): the grid is scheduled while the one
                      before it finishes, and waits for it before any access */
  int64_t hdr, msg_d, msg_c; /* bytes: dispatch header, messages            */
  int64_t drecv_off, crecv_off; /* byte offsets of the receive regions      */
  char *bufs[DL_SIGNAL_MAX_RANKS]; /* every rank's buffer, as mapped here    */
  /* dispatch_send */
  const void *x;        /* bf16 [T][H]                                     */
  const int32_t *idx;   /* [T][K]                                          */
  const float *w;       /* [T][K]                                          */
  int32_t *hidx;        /* the handle's copies [B][K]                      */
  float *hw;
  /* dispatch_recv (combine_send reads counts and src) */
  void *rx;             /* bf16, or u8 codes with fp8                      */
  float *rscales;       /* fp8 only                                        */
  int32_t *rcounts;
  int32_t *rids;        /* rank_major only                                 */
  float *rweights;      /* rank_major only                                 */
  int32_t *rsrc;        /* [rows][2]                                       */
  /* combine */
  const void *y;        /* bf16, shaped like rx                            */
  void *out;            /* bf16 [T][H]                                     */
  dl_ep_status_t *status;
  uint64_t timeout_ns;
} dl_ep_args_t;

/* ---- layout (host and device) ----------------------------------------------- */

#if defined(__CUDACC__)
#define DL_EP_HD __host__ __device__ __forceinline__
#else
#define DL_EP_HD static inline
#endif

DL_EP_HD int64_t dl_ep_align(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/* control word offsets (uint32 index into a rank's buffer) */
DL_EP_HD int64_t dl_ep_disp_flag(int n, int q) { (void)n; return (int64_t)q; }
DL_EP_HD int64_t dl_ep_disp_done(int n, int q) { return (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_comb_flag(int n, int q) { return 2 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_comb_done(int n, int q) { return 3 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_ntok(int n, int q) { return 4 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_dtag(int n, int q) { return 5 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_ctag(int n, int q) { return 6 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_ann(int n, int q) { return 7 * (int64_t)n + q; }
DL_EP_HD int64_t dl_ep_cnt(int n, int l, int q, int le) { return 8 * (int64_t)n + (int64_t)q * l + le; }
DL_EP_HD int64_t dl_ep_ctrl_words(int n, int l) { return 8 * (int64_t)n + (int64_t)n * l; }
DL_EP_HD int64_t dl_ep_ctrl_bytes(int n, int l) {
  return dl_ep_align(dl_ep_ctrl_words(n, l) * 4, DL_EP_CTRL_ALIGN);
}
/* block b's share of a call's count (of g blocks): they sum to DL_EP_SHARES */
DL_EP_HD uint32_t dl_ep_share(int b, int g) {
  return (uint32_t)(((int64_t)(b + 1) * DL_EP_SHARES) / g - ((int64_t)b * DL_EP_SHARES) / g);
}
/* the count at which call e has arrived, and the calls a count holds */
DL_EP_HD uint32_t dl_ep_count_of(uint32_t e) { return e << DL_EP_SHARE_SHIFT; }
DL_EP_HD uint32_t dl_ep_calls_of(uint32_t count) { return count >> DL_EP_SHARE_SHIFT; }
/* A phase's kind: dispatch (phases 0, 1) or combine (2, 3). */
DL_EP_HD int dl_ep_is_dispatch(int phase) { return phase == DL_EP_DISPATCH_SEND || phase == DL_EP_DISPATCH_RECV; }
/* The call tag of call `epoch` of phase's kind at a rank whose control words
 * are `self`: the epoch plus the calls of the other kind this rank finished
 * (its own receive's count here: the kernels before this one have ended). */
DL_EP_HD uint32_t dl_ep_call(const uint32_t *self, int n, int rank, int phase, uint32_t epoch) {
  const int64_t done = dl_ep_is_dispatch(phase) ? dl_ep_comb_done(n, rank) : dl_ep_disp_done(n, rank);
  return epoch + dl_ep_calls_of(*(const volatile uint32_t *)(self + done));
}
/* Peer q's tag word here of phase's kind. */
DL_EP_HD int64_t dl_ep_tag_same(int n, int phase, int q) {
  return dl_ep_is_dispatch(phase) ? dl_ep_dtag(n, q) : dl_ep_ctag(n, q);
}
/* An ann word: call tag `call` started, a dispatch (dispatch = 1) or a combine. */
DL_EP_HD uint32_t dl_ep_ann_word(uint32_t call, int dispatch) { return call << 1 | (dispatch ? 0u : 1u); }

/* The layouts (DL_EP_PER_EXPERT, DL_EP_PER_RANK; their kernels
 * ep_per_expert.cuh, ep_per_rank.cuh, their twins cpu/ep.c): names (NULL
 * for a number that names none), whether they have Lamport slots (with
 * rank_major output), and their sizes. */
static inline const char *dl_ep_layout_name(int layout) {
  return layout == DL_EP_PER_EXPERT ? "per_expert" : layout == DL_EP_PER_RANK ? "per_rank" : (const char *)0;
}
DL_EP_HD int dl_ep_layout_lamport(int layout) { return layout == DL_EP_PER_RANK; }

/* dispatch header: per_expert 16 B; per_rank the token and K (le, pos, w);
 * padded to DL_EP_LINE so that every payload starts a line (a warp's 512
 * bytes of a row then cross NVLink as four whole 128-byte lines, not five) */
DL_EP_HD int64_t dl_ep_hdr_bytes(int layout, int k) {
  return dl_ep_align(layout == DL_EP_PER_RANK ? 4 + 8 * (int64_t)k : 16, DL_EP_LINE);
}
/* payload: bf16 [H], or fp8 [H] and f32 scales [H/128] */
DL_EP_HD int64_t dl_ep_payload_bytes(int fp8, int h) {
  return dl_ep_align(fp8 ? (int64_t)h + 4 * (int64_t)(h / DL_EP_FP8_GROUP) : 2 * (int64_t)h, 16);
}
DL_EP_HD int64_t dl_ep_msg_d(int layout, int fp8, int k, int h) {
  return dl_ep_align(dl_ep_hdr_bytes(layout, k) + dl_ep_payload_bytes(fp8, h), DL_EP_LINE);
}
DL_EP_HD int64_t dl_ep_msg_c(int h) { return dl_ep_align(2 * (int64_t)h, DL_EP_LINE); }
/* slots of the receive regions */
DL_EP_HD int64_t dl_ep_dispatch_slots(int layout, int n, int e, int b) {
  return (layout == DL_EP_PER_RANK ? (int64_t)n : (int64_t)e) * b;
}
/* per_rank's dispatch in Lamport slots: a.lamport with rank_major output and
 * bf16 payloads (fp8's keeps the flag: above) */
DL_EP_HD int dl_ep_dispatch_lamport(int layout, int lamport, int output, int fp8) {
  return dl_ep_layout_lamport(layout) && lamport && output == DL_EP_RANK_MAJOR && !fp8;
}
/* bytes of the dispatch receive region: its slots; in Lamport slots both
 * halves [2][N][B], then the sources' count words [N] (to a line) */
DL_EP_HD int64_t dl_ep_dispatch_bytes(int layout, int lamport_d, int n, int e, int b, int64_t msg_d) {
  return lamport_d ? 2 * (int64_t)n * b * msg_d + dl_ep_align(4 * (int64_t)n, DL_EP_LINE)
                   : dl_ep_dispatch_slots(layout, n, e, b) * msg_d;
}
/* the first dispatch slot of call `epoch` (Lamport slots: its half), and the
 * byte offset in the region of source q's count word */
DL_EP_HD int64_t dl_ep_dispatch_half(int lamport_d, int n, int b, uint32_t epoch) {
  return lamport_d ? (int64_t)(epoch & 1u) * n * b : 0;
}
DL_EP_HD int64_t dl_ep_dispatch_count_off(int n, int b, int64_t msg_d, int q) {
  return 2 * (int64_t)n * b * msg_d + 4 * (int64_t)q;
}
/* a count word: the call's tag (dl_ep_call, its low 16 bits) over the count
 * (<= B <= DL_EP_MAX_TOKENS, so the empty word is never one) */
DL_EP_HD uint32_t dl_ep_count_word(uint32_t tag, uint32_t n) { return (tag & 0xffffu) << 16 | n; }
DL_EP_HD int dl_ep_count_word_is(uint32_t w, uint32_t tag) {
  return (w >> 16) == (tag & 0xffffu) && (w & 0xffffu) <= DL_EP_MAX_TOKENS;
}
DL_EP_HD int64_t dl_ep_combine_slots(int layout, int lamport, int e, int k, int b) {
  return (layout == DL_EP_PER_RANK ? (lamport ? 2 : 1) * (int64_t)k : (int64_t)e) * b;
}
/* the first combine slot of call `epoch` (Lamport slots: its half) */
DL_EP_HD int64_t dl_ep_combine_half(int lamport, int k, int b, uint32_t epoch) {
  return lamport ? (int64_t)(epoch & 1u) * k * b : 0;
}

/* src word 1: source | k << 8 | local expert << 16 */
DL_EP_HD int32_t dl_ep_src_pack(int s, int k, int le) { return s | k << 8 | le << 16; }

#ifdef __cplusplus
extern "C" {
#endif
/* One phase (a->phase) of a dispatch or combine. cuda: kernels on `stream`
 * (asynchronous; a timeout or a bad expert id shows up in *a->status). cpu:
 * runs to the end, DL_ETIMEOUT naming the peer and the phase if one did not
 * arrive; a bad expert id is recorded and the call still completes. Same
 * arguments for both. */
int dl_ep_cuda(const dl_ep_args_t *a, void *stream);
int dl_ep_cpu(const dl_ep_args_t *a, void *stream);
/* Dynamic shared memory a cuda phase needs (the core checks the limit). */
int64_t dl_ep_cuda_smem(const dl_ep_args_t *a);
#ifdef __cplusplus
}
#endif

#endif
