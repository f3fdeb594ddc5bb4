/*
 * distlab.h — the whole C ABI of libdistlab.
 *
 * The Lua bindings read this file at load time, drop every preprocessor line,
 * every comment and the C++ guard, and hand the rest to ffi.cdef. So: plain C
 * only — no macros that must expand, no CUDA or NCCL types (streams are opaque),
 * sizes as int64_t, array bounds as literals.
 *
 * Conventions: every fallible function returns int (DL_OK = 0, or a negative
 * DL_E* code) and leaves a per-thread message "what, at file:line" that
 * dl_last_error() returns. Nothing here aborts or exits the process.
 * Objects are dl_<object>_t, functions dl_<object>_<verb>. Dimensions and
 * indices are 0-based in C (the Lua layer is 1-based, as Torch7).
 */
#ifndef DISTLAB_H
#define DISTLAB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DL_ABI_VERSION = 3 };

/* ---- status codes ------------------------------------------------------ */
enum {
  DL_OK = 0,
  DL_EINVAL = -1,       /* bad argument: shape, dtype, range, option        */
  DL_ENOMEM = -2,       /* allocation failed after emptying the cache       */
  DL_ECUDA = -3,        /* a CUDA runtime call failed                       */
  DL_ENODEV = -4,       /* no such device / no CUDA device / no driver      */
  DL_ENCCL = -5,        /* an NCCL call failed                              */
  DL_ETIMEOUT = -6,     /* a wait ran past its timeout                      */
  DL_ESTATE = -7,       /* use of a freed or ill-formed object              */
  DL_EUNSUPPORTED = -8, /* valid request this build or device cannot do     */
  DL_EIO = -9,          /* socket, file or shared-memory failure            */
  DL_EPEER = -10,       /* a peer rank failed or went away                  */
  DL_EINTR = -11        /* a wait stopped by the user (Ctrl-C twice)        */
};

const char *dl_last_error(void);
int dl_last_error_code(void);
void dl_clear_error(void);
int dl_abi_version(void);
/* One line: version, CUDA runtime it was built with (or "cpu-only"), archs. */
const char *dl_build_info(void);
/* Host time in microseconds (CLOCK_MONOTONIC) since the library loaded. */
double dl_now_us(void);
/* Ctrl-C in an interactive session: on = 1 makes SIGINT only count (no
 * exit, no Lua code in the handler), on = 0 restores the handler there was.
 * dl_sigint_take returns the SIGINTs counted since its last call, and
 * clears them; the REPL polls it between instructions and at its prompt.
 * While armed, Ctrl-C twice during one of the library's store waits (a rank
 * inside a collective whose peers never come) ends it with DL_EINTR. */
int dl_sigint_arm(int on);
int dl_sigint_take(void);

/* ---- dtypes and devices ------------------------------------------------ */
enum {
  DL_F32 = 0,
  DL_F16 = 1,
  DL_BF16 = 2,
  DL_I32 = 3,
  DL_I64 = 4,
  DL_U8 = 5,
  DL_F64 = 6,
  DL_NUM_DTYPES = 7
};

enum { DL_CPU = 0, DL_CUDA = 1, DL_META = 2 };

int dl_dtype_size(int dtype);
const char *dl_dtype_name(int dtype);

/* Number of usable CUDA devices. 0 with DL_OK when the build has CUDA but
 * the machine has no driver or no GPU; *reason then says why (static text). */
int dl_cuda_device_count(int *count, const char **reason);
int dl_cuda_device_name(int index, char *buf, int64_t buflen);
/* The physical GPU behind an index, "<host>/<PCI bus id>": the same string in
 * every process of the host that uses it, whatever CUDA_VISIBLE_DEVICES says
 * (ranks compare them to find the GPUs they share). */
int dl_cuda_device_id(int index, char *buf, int64_t buflen);
int dl_device_synchronize(int dev_type, int dev_index);

/* ---- streams and events ------------------------------------------------
 * A stream belongs to one device. NULL wherever a stream is taken means the
 * device's default stream. On cpu and meta, ops run synchronously; events
 * record host time, so the same timing code works everywhere.            */
typedef struct dl_stream dl_stream_t;
typedef struct dl_event dl_event_t;

int dl_stream_new(dl_stream_t **out, int dev_type, int dev_index, int priority);
void dl_stream_free(dl_stream_t *s);
int dl_stream_synchronize(dl_stream_t *s, int dev_type, int dev_index);
int dl_stream_wait_event(dl_stream_t *s, dl_event_t *e);
/* The cudaStream_t behind a stream (NULL for the default or a cpu stream). */
void *dl_stream_handle(dl_stream_t *s);

int dl_event_new(dl_event_t **out, int dev_type, int dev_index);
void dl_event_free(dl_event_t *e);
int dl_event_record(dl_event_t *e, dl_stream_t *s);
int dl_event_synchronize(dl_event_t *e, double timeout_s);
int dl_event_query(dl_event_t *e, int *done);
int dl_event_elapsed_ms(dl_event_t *start, dl_event_t *end, double *ms);

/* ---- tensors ------------------------------------------------------------
 * Fields are for reading; change a tensor only through these functions.
 * The short field names leave shape/dtype/device free for Lua properties.
 * sz (shape), st (strides) and offset are in elements.
 * A tensor owns one reference to its storage; views share it.          */
typedef struct dl_storage dl_storage_t;

typedef struct dl_tensor {
  uint32_t magic;
  int32_t dtype_id;
  int32_t nd;          /* number of dimensions, 0..8 */
  int32_t dev_type;
  int32_t dev_index;
  int32_t flags;
  int64_t sz[8];       /* shape */
  int64_t st[8];       /* strides */
  int64_t offset;
  dl_storage_t *storage; /* NULL once released */
} dl_tensor_t;

/* stream: where the memory is first used (NULL: the device's default stream).
 * A cuda block returns to that stream's cache when freed and is reused there
 * without a sync; use on another stream needs dl_tensor_record_stream. */
int dl_tensor_empty(dl_tensor_t **out, int dtype, int ndim, const int64_t *shape,
                    int dev_type, int dev_index, dl_stream_t *stream);
/* A new tensor on base's storage: any shape/strides/offset that stays inside it. */
int dl_tensor_as_strided(dl_tensor_t **out, const dl_tensor_t *base, int ndim,
                         const int64_t *shape, const int64_t *strides, int64_t offset);
/* Drop the struct and its storage reference (the Lua finalizer). NULL is a no-op. */
void dl_tensor_free(dl_tensor_t *t);
/* Drop the storage reference now; later use of t is an error naming it freed. */
int dl_tensor_release(dl_tensor_t *t);
int dl_tensor_check(const dl_tensor_t *t);
int dl_tensor_data_ptr(const dl_tensor_t *t, void **ptr);
int64_t dl_tensor_numel(const dl_tensor_t *t);
int dl_tensor_is_contiguous(const dl_tensor_t *t);
/* Bytes of the storage and how many tensors share it. */
int dl_tensor_storage_info(const dl_tensor_t *t, int64_t *nbytes, int32_t *refs);
/* Ask the allocator not to reuse t's memory until work queued on s so far is done. */
int dl_tensor_record_stream(dl_tensor_t *t, dl_stream_t *s);

/* Element-wise ops. Shapes must match exactly (no broadcasting); dtypes may
 * differ (values convert with round-to-nearest-even); devices must match
 * except in copy, which moves data between any two of cpu and cuda:N.     */
int dl_tensor_copy(dl_tensor_t *dst, const dl_tensor_t *src, dl_stream_t *s);
int dl_tensor_fill(dl_tensor_t *t, double value, dl_stream_t *s);
/* dst = dst*beta + alpha*src */
int dl_tensor_axpby(dl_tensor_t *dst, double beta, const dl_tensor_t *src, double alpha,
                    dl_stream_t *s);
/* dst = dst*a + b */
int dl_tensor_scale_shift(dl_tensor_t *dst, double a, double b, dl_stream_t *s);
/* dst = dst*src */
int dl_tensor_mul(dl_tensor_t *dst, const dl_tensor_t *src, dl_stream_t *s);

enum { DL_RAND_UNIFORM = 0, DL_RAND_NORMAL = 1 };
/* Counter-based (Philox4x32-10): element i of the row-major order gets the
 * same value on every device for the same (seed, offset + i). uniform in
 * [a, b); normal with mean a and std b. */
int dl_tensor_random(dl_tensor_t *t, int dist, uint64_t seed, uint64_t offset, double a,
                     double b, dl_stream_t *s);

/* Comparison, in fp64, of two cpu tensors of the same shape (any dtypes). */
typedef struct dl_compare {
  double sum_sq_diff;    /* sum (a-b)^2 over finite pairs */
  double sum_sq_ref;     /* sum b^2 */
  double max_abs_diff;
  int64_t n_nonfinite_a; /* NaN or Inf in a */
  int64_t n_nonfinite_b;
  int64_t n_not_close;   /* |a-b| > atol + rtol*|b|, or non-finite mismatch */
  int64_t first_not_close; /* row-major index, -1 if none */
} dl_compare_t;
int dl_tensor_compare(const dl_tensor_t *a, const dl_tensor_t *b, double atol, double rtol,
                      dl_compare_t *out);

/* The math a reference needs (core/mem/tensor_math.c; kernels/tensor/tensor_math.h),
 * along dimension dim (0-based) of tensors with any strides, on cpu (the
 * twins compute in fp64: the reference the specs trust) and cuda; meta
 * checks and runs nothing. Index tensors are i64 or i32. An index out of
 * range fails the call naming the first one (on cuda the call then waits
 * for the stream, to read the kernel's record). */
/* out := softmax(x) along dim, or log_softmax with log = 1. Float dtypes;
 * out may be x, or have another float dtype. cuda sums in fp32 (fp64 for
 * f64). A row of only -inf gives NaN, as torch. */
int dl_tensor_softmax(dl_tensor_t *out, const dl_tensor_t *x, int dim, int log, dl_stream_t *s);
/* indices := the permutation that sorts x along dim: stable (equal values
 * keep their order), ascending or descending; NaN is above +inf and -0
 * equals +0. indices has x's shape. */
int dl_tensor_argsort(dl_tensor_t *indices, const dl_tensor_t *x, int dim, int descending,
                      dl_stream_t *s);
/* The k largest (largest = 1) or smallest values of x along dim and their
 * indices, in that order (ties: the lower index first); values or indices
 * may be NULL. Shapes: x's with size k at dim. Through argsort (its
 * workspace and an i64 permutation of x's shape, freed on return). */
int dl_tensor_topk(dl_tensor_t *values, dl_tensor_t *indices, const dl_tensor_t *x, int64_t k, int dim,
                   int largest, dl_stream_t *s);
/* torch.gather: out[i] := x[i with i[dim] = index[i]]; out has index's
 * shape and x's dtype; index's sizes at most x's in the other dims. */
int dl_tensor_gather(dl_tensor_t *out, const dl_tensor_t *x, int dim, const dl_tensor_t *index,
                     dl_stream_t *s);
/* torch.scatter_add_: dst[i with i[dim] = index[i]] += src[i] for every i of
 * index (sizes at most src's, and dst's outside dim); dst and src of one
 * dtype, each add rounded to it. cuda adds atomically, in no fixed order. */
int dl_tensor_scatter_add(dl_tensor_t *dst, int dim, const dl_tensor_t *index, const dl_tensor_t *src,
                          dl_stream_t *s);
/* out[v] += 1, or += weights[i], for every value v = x[i] in [0, numel(out));
 * other values (-1: "none") are skipped. x an integer tensor, out 1-D and
 * not cleared first: i64/i32 without weights, f32/f64 with them
 * (weights shaped like x). */
int dl_tensor_bincount(dl_tensor_t *out, const dl_tensor_t *x, const dl_tensor_t *weights, dl_stream_t *s);

/* ---- the benches' fp64 attention at sampled rows (core/bench/attn_rows.c) ---
 * The arithmetic of distlab.bench.attn_rows, the reference the benches check
 * dl.attn against: plain fp64 loops over rows that the caller copied to the
 * host as f64, apart from dl.attn's kernels and their cpu twin. Rows are
 * shared among DISTLAB_CHECK_THREADS threads (else one a core this process
 * may run on); the results do not depend on how many.
 * One (sequence, head) slice: ql queries, kl keys; query i sees the keys
 * j in [0, kl) with i + sh - wl <= j <= i + sh + wr (wl or wr < 0: no bound
 * that side; sh = kl - ql when bottom_right, else 0).                     */
typedef struct dl_attn_ref_slice {
  int64_t ql, kl;
  int64_t dqk, dv;      /* head dims of q and k, of v */
  int64_t wl, wr;
  int32_t bottom_right;
  int32_t pad;
  double scale;         /* of q k^T */
} dl_attn_ref_slice_t;
/* Query rows rows[0..n) (0-based in the slice), row m's q at q + m dqk and
 * its dout at dout + m dv, the slice's keys k [kl, dqk] and values v
 * [kl, dv]: out [n, dv] and lse [n] from the row's full softmax (a row that
 * sees no key: lse -inf, out 0), and with dout, dq [n, dqk] from them
 * (dout and dq both NULL: none). */
int dl_attn_ref_queries(const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows, const double *q,
                        const double *dout, const double *k, const double *v, double *out, double *lse,
                        double *dq);
/* Key rows rows[0..n), row m's k at k + m dqk and v at v + m dv: dk [n, dqk]
 * and dv [n, dv] summed over the queries that see it of nheads query heads,
 * head h given q[h] [ql, dqk], dout[h] [ql, dv], and the out[h] [ql, dv] and
 * lse[h] [ql] that its backward was handed, of every query of the slice.
 * *n_bad: the key rows that needed an lse that is not finite (those terms
 * left out). */
int dl_attn_ref_keys(const dl_attn_ref_slice_t *g, int64_t n, const int64_t *rows, const double *k,
                     const double *v, int nheads, const double *const *q, const double *const *dout,
                     const double *const *out, const double *const *lse, double *dk, double *dv,
                     int64_t *n_bad);

/* ---- a tensor's bytes, in memory and in files (core/mem/tensor_io.c) ------
 * Its elements in row-major order as the device holds them (little-endian),
 * the tensor contiguous. cpu reads and writes its storage directly; cuda
 * goes through two pinned host buffers of up to 8 MiB in turn and returns
 * once the stream has done the copies; meta checks sizes and moves nothing.
 * dl.load / dl.save (bindings/distlab/io.lua) parse the file formats.    */
/* t := the nbytes bytes at src (nbytes: t's own count). */
int dl_tensor_from_host(dl_tensor_t *t, const void *src, int64_t nbytes, dl_stream_t *s);
/* dst := t's nbytes bytes (not on meta). */
int dl_tensor_to_host(const dl_tensor_t *t, void *dst, int64_t nbytes, dl_stream_t *s);
/* t := its count of bytes from byte `offset` of the file at path; swap = 1
 * reverses each element's bytes (a big-endian file). meta: checks that the
 * file holds them. */
int dl_tensor_read_file(dl_tensor_t *t, const char *path, int64_t offset, int swap, dl_stream_t *s);
/* Appends t's bytes to the file at path (created when missing). */
int dl_tensor_append_file(const dl_tensor_t *t, const char *path, dl_stream_t *s);

/* ---- allocator and memory accounting ------------------------------------
 * One caching allocator per device. Every allocation is charged to the tag
 * on top of the tag stack when it is made (tag 0, "untagged", when empty).
 * On meta nothing is stored but everything is counted, in exact bytes.  */
typedef struct dl_mem_stats {
  int64_t allocated;      /* bytes held by live tensors                    */
  int64_t allocated_peak;
  int64_t reserved;       /* bytes taken from the device (cached included) */
  int64_t reserved_peak;
  int64_t n_allocs;
  int64_t n_frees;
  int64_t n_cache_hits;
  int64_t n_device_allocs; /* cudaMalloc / malloc calls                     */
  int64_t driver_free;     /* cuda: cudaMemGetInfo; else -1                */
  int64_t driver_total;
  int64_t untracked;       /* cuda: used on the device outside our reserve  */
} dl_mem_stats_t;

int dl_mem_stats(int dev_type, int dev_index, dl_mem_stats_t *out);
int dl_mem_reset_peak(int dev_type, int dev_index);
int dl_mem_empty_cache(int dev_type, int dev_index);

int dl_mem_tag_push(const char *name);
int dl_mem_tag_pop(void);
int dl_mem_tag_count(void);
const char *dl_mem_tag_name(int tag);
/* current: bytes the tag holds now; peak: the most it held; at_peak: what it
 * held when the device's allocated_peak was reached. */
int dl_mem_tag_stats(int dev_type, int dev_index, int tag, int64_t *current, int64_t *peak,
                     int64_t *at_peak);

typedef struct dl_mem_event {
  double t_us;       /* since the library loaded */
  int32_t dev_type;
  int32_t dev_index;
  int32_t tag;
  int32_t pad;
  int64_t bytes;     /* +allocated, -freed */
  int64_t allocated; /* device total after the event */
} dl_mem_event_t;
/* Keep the last `capacity` events (0 turns tracing off and clears it). */
int dl_mem_trace_enable(int64_t capacity);
/* Copy up to max events, oldest first; *n gets how many. */
int dl_mem_trace_read(dl_mem_event_t *buf, int64_t max, int64_t *n);

/* ---- communicators, store, symmetric buffers ----------------------------
 * The store is a job's rendezvous: a TCP key-value store that rank 0 serves
 * on host:port; keys live in the job's namespace. A communicator is one
 * interface over three backends (NCCL on cuda, shared memory between the
 * processes of one host on cpu, and meta, which moves nothing). Ops are
 * ordered on the stream given (cpu ops run synchronously); bf16/fp16
 * reductions accumulate in fp32. Every wait ends within the timeout (seconds;
 * <= 0 means DISTLAB_TIMEOUT, else 120) with an error naming the operation,
 * this rank and the peer. Counts are elements.                            */
typedef struct dl_store dl_store_t;
typedef struct dl_comm dl_comm_t;
typedef struct dl_symm dl_symm_t;

/* Rank 0 serves on host:port and every rank (0 too) connects, retrying until
 * the timeout. job namespaces the keys ("" for none). Port 0 (a world of
 * one only) takes any free port. */
int dl_store_new(dl_store_t **out, const char *host, int port, int rank, int world_size,
                 const char *job, double timeout_s);
/* Drop one reference; the server stops with rank 0's last one. NULL is a no-op. */
void dl_store_free(dl_store_t *s);
int dl_store_set_timeout(dl_store_t *s, double timeout_s);
int dl_store_set(dl_store_t *s, const char *key, const void *value, int64_t len);
/* Waits until key exists; copies min(cap, size) bytes; *len gets its size. */
int dl_store_get(dl_store_t *s, const char *key, void *buf, int64_t cap, int64_t *len);
int dl_store_wait(dl_store_t *s, const char *key);
/* Atomic add to an int64 counter (missing = 0); *value gets the new value. */
int dl_store_add(dl_store_t *s, const char *key, int64_t delta, int64_t *value);
int dl_store_check(dl_store_t *s, const char *key, int *exists);
int dl_store_delete(dl_store_t *s, const char *key);
/* Deletes every key that begins with prefix (not empty); *count (may be NULL)
 * gets how many: what a communicator that is gone left (dl.comm.world{new = true}). */
int dl_store_delete_prefix(dl_store_t *s, const char *prefix, int64_t *count);

/* ipc: ranks of one host over CUDA IPC, no library (what ranks sharing a
 * GPU use, since NCCL refuses two ranks on one device; core/comm/comm_ipc.c) */
enum { DL_COMM_SHM = 0, DL_COMM_NCCL = 1, DL_COMM_META = 2, DL_COMM_IPC = 3 };
enum { DL_RED_SUM = 0, DL_RED_AVG = 1, DL_RED_MAX = 2, DL_RED_MIN = 3 };

typedef struct dl_comm_info {
  int32_t rank;
  int32_t size;
  int32_t backend;   /* DL_COMM_* */
  int32_t dev_type;  /* DL_CPU, DL_CUDA or DL_META */
  int32_t dev_index;
  int32_t debug;
  int32_t failed;    /* an op failed: the communicator refuses further ops */
  int32_t share;     /* ranks of this communicator on this rank's GPU (1: one of
                        its own; more where ranks share a GPU: the ipc backend) */
  int64_t seq;       /* ops issued so far */
  double timeout_s;
  char name[96];     /* "w" for the world, "w.s1c0" for split 1, color 0 */
  void *native;      /* the backend's own handle: the ncclComm_t of an nccl
                        communicator (to call NCCL on it directly); else NULL */
} dl_comm_info_t;

/* Collective over the store's ranks: rank/size are this communicator's
 * (meta needs no store: any size, this process is `rank`). dev_index picks
 * the GPU for nccl. */
int dl_comm_new(dl_comm_t **out, int backend, dl_store_t *store, int rank, int size,
                int dev_index, double timeout_s);
/* Collective on nccl (ncclCommDestroy waits for the peers): every rank frees
 * its communicators in one order. */
void dl_comm_free(dl_comm_t *c);
/* The collector's free (Lua's finalizer): as dl_comm_free, but local: an NCCL
 * communicator is aborted, not destroyed, since the ranks' collectors free
 * their communicators in different orders (two ranks each in the destroy of
 * another communicator wait for each other for good). */
void dl_comm_drop(dl_comm_t *c);
int dl_comm_info(const dl_comm_t *c, dl_comm_info_t *out);
int dl_comm_set_timeout(dl_comm_t *c, double timeout_s);
/* Debug mode: before each op, check through the store that every rank calls
 * the same op with the same dtype and sizes. Slow; for finding bugs. */
int dl_comm_set_debug(dl_comm_t *c, int on);
/* Ranks with the same color form a communicator, ordered by key then rank;
 * color < 0 takes part but gets *out = NULL. Collective. Not on meta. */
int dl_comm_split(dl_comm_t **out, dl_comm_t *c, int color, int key);
/* The same, with every rank's color and key given (size entries each): needs
 * no exchange, so it works on meta, where the peers are imaginary. */
int dl_comm_split_table(dl_comm_t **out, dl_comm_t *c, const int32_t *colors,
                        const int32_t *keys);
/* Give up: peers waiting on this rank fail now with `why`. */
int dl_comm_abort(dl_comm_t *c, const char *why);
/* Every rank describes an object it creates on c (a CP schedule, an EP
 * buffer layout): desc is "key=value, key=value" (under 256 bytes). Fails
 * on every rank when two ranks differ, with "mismatched <what>: rank R has
 * <desc> but rank Q has <desc> (differs: <their differing entries>)".
 * Collective, through the store (so for creation, not per call); no-op on
 * meta, whose peers are imaginary. */
int dl_comm_agree(dl_comm_t *c, const char *what, const char *desc);

/* out may be in (in place). Sizes: all_gather out = size*in, reduce_scatter
 * in = size*out, all_to_all in = out and divisible by size. */
int dl_comm_all_reduce(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, int op,
                       dl_stream_t *s);
int dl_comm_all_gather(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, dl_stream_t *s);
int dl_comm_reduce_scatter(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, int op,
                           dl_stream_t *s);
int dl_comm_all_to_all(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, dl_stream_t *s);
/* send_counts[j] elements of in go to rank j and recv_counts[j] of out come
 * from rank j, each packed in rank order. */
int dl_comm_all_to_allv(dl_comm_t *c, dl_tensor_t *out, const int64_t *recv_counts,
                        const dl_tensor_t *in, const int64_t *send_counts, dl_stream_t *s);
int dl_comm_broadcast(dl_comm_t *c, dl_tensor_t *t, int root, dl_stream_t *s);
int dl_comm_send(dl_comm_t *c, const dl_tensor_t *t, int peer, dl_stream_t *s);
int dl_comm_recv(dl_comm_t *c, dl_tensor_t *t, int peer, dl_stream_t *s);
/* Point-to-point ops between start and end (of this thread) are issued
 * together, so a ring exchange cannot deadlock. Groups nest. */
int dl_comm_group_start(void);
int dl_comm_group_end(void);
/* Host returns once every rank arrived. */
int dl_comm_barrier(dl_comm_t *c, dl_stream_t *s);
/* Host waits for the communicator's work queued on s, within the timeout;
 * on nccl a hang or an async error aborts the communicator. */
int dl_comm_synchronize(dl_comm_t *c, dl_stream_t *s);

/* Symmetric buffers: nbytes on every rank of c (one host), each mapped by
 * all: CUDA IPC on cuda, POSIX shared memory on cpu. Every rank must ask
 * for the same size: checked through the store, an error on every rank. Each buffer has a
 * signal pad of DL_SIGNAL_FLAGS flags (uint32) and a barrier for
 * flag-based synchronisation; counts only grow, so back-to-back uses
 * cannot mistake an old signal for a new one. Collective. */
enum { DL_SIGNAL_FLAGS = 64, DL_SIGNAL_MAX_RANKS = 8, DL_SIGNAL_MAX_BLOCKS = 64 };
int dl_symm_alloc(dl_symm_t **out, dl_comm_t *c, int64_t nbytes);
/* The same, with what the buffer holds ("bf16[16, 32]", under 200 bytes):
 * every rank must ask for the same nbytes and desc (dl_comm_agree; on a
 * mismatch every rank fails, before anything is mapped). */
int dl_symm_alloc_desc(dl_symm_t **out, dl_comm_t *c, int64_t nbytes, const char *desc);
void dl_symm_free(dl_symm_t *b);
int64_t dl_symm_nbytes(const dl_symm_t *b);
/* Rank `peer`'s buffer as mapped here, and its signal pad. */
int dl_symm_peer_ptr(const dl_symm_t *b, int peer, void **ptr);
int dl_symm_signal_pad(const dl_symm_t *b, int peer, void **pad);
/* A tensor view of rank peer's buffer: byte offset, dtype, shape (row-major). */
int dl_symm_tensor(dl_tensor_t **out, dl_symm_t *b, int peer, int64_t offset, int dtype,
                   int ndim, const int64_t *shape);
/* flag `flag` of peer's pad := value (after this rank's prior writes). */
int dl_symm_flag_set(dl_symm_t *b, int peer, int flag, uint32_t value, dl_stream_t *s);
/* Wait until this rank's flag reaches value (counts compare modulo 2^32). */
int dl_symm_flag_wait(dl_symm_t *b, int flag, uint32_t value, dl_stream_t *s);
int dl_symm_flag_get(dl_symm_t *b, int peer, int flag, uint32_t *value);
/* All ranks meet; writes before it are visible to every rank after it. */
int dl_symm_barrier(dl_symm_t *b, dl_stream_t *s);
/* On cuda, device-side waits that time out record it in the pad: wait for s
 * and turn such a record into an error naming the flag, the rank and the peer. */
int dl_symm_check(dl_symm_t *b, dl_stream_t *s);

/* ---- attention ------------------------------------------------------------
 * One attention step (flash kernel on cuda, its fp64 twin on cpu) and the
 * merges of partial results that context-parallel schedules use.
 * Layouts: bshd [b, s, h, d], sbhd [s, b, h, d], thd [t, h, d] with
 * cu_seqlens (int32 [b+1], prefix sums of the valid lengths) and optional
 * cu_seqlens_padded (int32 [b+1], the row where each sequence starts; need
 * not start at 0). lse is fp32 [b, h, s], or [h, t] for thd. The last dim of
 * every operand is contiguous; other strides are free.
 * Outputs are passed as dl_tensor_t **: one that holds NULL is allocated
 * (charged to the current memory tag; for thd, out/dq/dk/dv are zeroed and
 * lse set to -inf first, so rows outside the sequences are defined), one
 * that holds a tensor is checked and written in place, rows outside the
 * sequences untouched. On meta, outputs and the workspace are allocated and
 * nothing runs.                                                           */
enum { DL_ATTN_BSHD = 0, DL_ATTN_SBHD = 1, DL_ATTN_THD = 2 };
/* Backends: ours (the flash kernel, its cpu twin), cuDNN's fused attention
 * (cuda; cuDNN's frontend, libcudnn opened at run time: see
 * core/ops/attn/cudnn_sdpa.cpp), or auto: cuDNN where it takes the call, else
 * ours. cuDNN's workspace is charged to the memory tag "cudnn_workspace". */
enum { DL_ATTN_OURS = 0, DL_ATTN_CUDNN = 1, DL_ATTN_AUTO = 2 };

typedef struct dl_attn_opts {
  int32_t layout;        /* DL_ATTN_BSHD, DL_ATTN_SBHD or DL_ATTN_THD               */
  int32_t window_left;   /* key j is visible to query i iff                          */
  int32_t window_right;  /*   i + shift - left <= j <= i + shift + right, -1 = no bound */
  int32_t bottom_right;  /* shift = s_kv - s_q of each sequence (else 0)             */
  double scale;          /* softmax scale; 0 = 1/sqrt(d_qk)                          */
  int32_t max_seqlen_q;  /* thd: the largest valid lengths; 0 = read cu_seqlens      */
  int32_t max_seqlen_kv; /*   (a device-to-host copy on cuda)                        */
  int32_t accumulate_grads; /* bwd: add into the given dq, dk, dv                    */
  int32_t backend;       /* DL_ATTN_OURS (0), DL_ATTN_CUDNN or DL_ATTN_AUTO             */
  const dl_tensor_t *cu_seqlens_q, *cu_seqlens_kv;               /* thd              */
  const dl_tensor_t *cu_seqlens_q_padded, *cu_seqlens_kv_padded; /* thd, or NULL     */
} dl_attn_opts_t;

/* out, lse: the step's result (ignored when accumulating); out is q's dtype,
 * or a given f32 out for 16-bit q (a partial kept in fp32: written by the
 * fused merge into (0, -inf), so whole, rows outside the sequences 0 and
 * lse -inf; "ours" only, as the fused merge). max_logit: NULL,
 * or fp32 [h_q] max of the scaled logits over visible keys (allocated as
 * -inf, or a given running max). acc_out, acc_lse: NULL, or a running
 * (O, L) the step is merged into in the kernel's epilogue (fused merge). */
int dl_attn_fwd(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_tensor_t *k,
                const dl_tensor_t *v, dl_tensor_t **out, dl_tensor_t **lse,
                dl_tensor_t **max_logit, dl_tensor_t *acc_out, dl_tensor_t *acc_lse,
                dl_stream_t *s);
/* Gradients of sum(dout * out); out and lse may be merged ones (CP). */
int dl_attn_bwd(const dl_attn_opts_t *o, const dl_tensor_t *dout, const dl_tensor_t *q,
                const dl_tensor_t *k, const dl_tensor_t *v, const dl_tensor_t *out,
                const dl_tensor_t *lse, dl_tensor_t **dq, dl_tensor_t **dk, dl_tensor_t **dv,
                dl_stream_t *s);

/* Which backend a fwd (bwd = 0) or bwd call on these operands would run,
 * without running it: *chosen DL_ATTN_OURS or DL_ATTN_CUDNN, or -1 when
 * o->backend is DL_ATTN_CUDNN and cuDNN cannot take it; why (whylen bytes)
 * says why. accumulate: -1, or the dtype (DL_F32, DL_BF16, DL_F16) of the
 * accumulate.out the fwd call would have; max_logit: the fwd call would ask
 * for it. May build and cache cuDNN's plan (that is how cuDNN says what it
 * supports). */
int dl_attn_backend(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_tensor_t *k,
                    const dl_tensor_t *v, int bwd, int accumulate, int max_logit, int *chosen,
                    char *why, int64_t whylen);
/* The attention steps each kernel has run in this process: out[bwd * 4 +
 * kind] (DL_ATTN_RUNS entries), kind 0 the cpu twin, 1 our portable CUDA
 * kernel, 2 our Hopper kernel, 3 cuDNN's. A step with no rows to compute
 * counts nowhere. For telling which kernel a schedule's steps really took. */
enum { DL_ATTN_RUNS = 8 };
int dl_attn_runs(int64_t *out);
typedef struct dl_attn_cudnn_info {
  int64_t version;          /* cudnnGetVersion() of the library opened; 0: none yet        */
  int64_t header_version;   /* CUDNN_VERSION built against; 0: built without the frontend  */
  int64_t frontend_version; /* CUDNN_FRONTEND_VERSION built with                           */
  int64_t plans;            /* plans in the cache now                                      */
  int64_t builds;           /* plans built (cache misses), unsupported ones included       */
  int64_t hits;             /* calls served from the cache                                 */
  double build_ms;          /* time spent building plans, all and the last one             */
  double last_build_ms;
  int64_t max_workspace;    /* the largest workspace a plan asked for, bytes               */
  char path[512];           /* the file opened, or why none could be                       */
  char pick[1024];          /* why that file (or which it will take), and every candidate  */
} dl_attn_cudnn_info_t;
int dl_attn_cudnn_info(dl_attn_cudnn_info_t *out);

/* Merges. rows picks the rows of every sequence that take part (thd: of its
 * padded extent [p[i], p[i+1]), whose length must then be even). part and
 * part_lse hold the same rows as out and lse, or, when a half is picked and
 * their sequence dim is shorter, only that half, packed (thd: sequence i
 * at row (p[i] - p[0]) / 2).                                             */
enum { DL_ATTN_ROWS_ALL = 0, DL_ATTN_ROWS_FIRST_HALF = 1, DL_ATTN_ROWS_SECOND_HALF = 2 };
/* incremental: O <- O e^(L-L') + P e^(Lp-L'), L <- L' = logaddexp(L, Lp);
 * init: O = P e^(Lp-L) and add: O += P e^(Lp-L), with L the final lse.     */
enum { DL_ATTN_OUT_INCREMENTAL = 0, DL_ATTN_OUT_INIT = 1, DL_ATTN_OUT_ADD = 2 };
enum { DL_ATTN_GRAD_SET = 0, DL_ATTN_GRAD_ACCUMULATE = 1 }; /* G = P, G += P */

typedef struct dl_attn_merge_opts {
  int32_t layout;         /* DL_ATTN_BSHD, DL_ATTN_SBHD or DL_ATTN_THD             */
  int32_t rows;           /* DL_ATTN_ROWS_*                                        */
  int32_t skip_zero_rows; /* merge_out: a part row that is exactly 0 adds nothing   */
  int32_t pad;
  const dl_tensor_t *cu_seqlens_padded; /* thd: int32 [b+1]                        */
} dl_attn_merge_opts_t;

/* lse <- logaddexp(lse, part_lse) */
int dl_attn_merge_lse(const dl_attn_merge_opts_t *o, dl_tensor_t *lse,
                      const dl_tensor_t *part_lse, dl_stream_t *s);
int dl_attn_merge_out(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *out,
                      dl_tensor_t *lse, const dl_tensor_t *part, const dl_tensor_t *part_lse,
                      dl_stream_t *s);
int dl_attn_merge_grad(const dl_attn_merge_opts_t *o, int mode, dl_tensor_t *grad,
                       const dl_tensor_t *part, dl_stream_t *s);

/* ---- all-reduce and graphs ----------------------------------------------
 * A sum all-reduce of one communicator (one host, up to 8 ranks) with a
 * choice of algorithm: the communicator's own (NCCL on cuda), or kernels
 * over a symmetric buffer the object owns (kernels/allreduce/; no NVLink
 * multicast): one-shot (every rank reads every input), one-shot push (every
 * rank writes its input into every peer), both pipelined so that NVLink
 * traffic overlaps the local reduction, two-shot (reduce-scatter by
 * reading, all-gather by reading or by writing), and a Lamport one-shot
 * (pushes like one-shot push into a region kept at a sentinel value, and
 * the receiver polls the data itself: no flags, no fences). f32, f16 and
 * bf16 (summed in fp32), any size (sizes above max_bytes run in pieces), in
 * place or not, on the given stream, and safe inside CUDA graphs: the
 * kernels keep their counters in device memory. Memory: (1 + 2 x size) x
 * max_bytes per rank, plus 2 x size Lamport slots of max_bytes / 4 at 2
 * ranks, 2 / size of max_bytes at more (at least 1 MiB, at most max_bytes;
 * DISTLAB_AR_LAMPORT_MB: that region's MiB in all instead). An input that lies in this rank's zero-copy region
 * (dl_allreduce_buffer; same offset on every rank) is read where it is by
 * one-shot (out must be elsewhere) and two-shot (in place). A device-side
 * wait that times out ends its kernel; the next run or check on this rank
 * fails with an error naming the op, the rank and the peer, and the object
 * refuses further work. blocks <= 0: a grid sized from the tensor. */
typedef struct dl_allreduce dl_allreduce_t;
/* The name of algorithm number algo (0: "nccl", 1: "one_shot", ...; the
 * table of algorithms and their traits is kernels/allreduce/algos.h), NULL
 * past the last. The one list of names (the bindings read it). */
const char *dl_allreduce_algo_name(int algo);
typedef struct dl_allreduce_info {
  int32_t rank;
  int32_t size;
  int32_t dev_type;
  int32_t dev_index;
  int32_t sms;        /* multiprocessors a grid may use: the GPU's, or their share  */
                      /* where ranks share it (0 on cpu and meta)                 */
  int32_t max_blocks; /* the largest grid a run may ask for                       */
  int32_t threads;    /* per block, and 16-byte vectors per thread and step: a     */
  int32_t unroll;     /* block's step covers threads x unroll vectors (half that */
                      /* for the pipelined one-shot kernels, one role a half)    */
  int32_t failed;
  int32_t pad;
  int64_t max_bytes;  /* bytes of one piece (the zero-copy region's size)         */
  int64_t calls;      /* kernel calls issued so far                               */
  int64_t lamport_bytes; /* bytes of a Lamport slot: one_shot_lamport's largest
                            piece (two_shot_lamport's: size / 2 slots at 3+ ranks) */
} dl_allreduce_info_t;

/* Collective over c's ranks. max_bytes <= 0: 64 MiB on cuda, 8 MiB on cpu. */
int dl_allreduce_new(dl_allreduce_t **out, dl_comm_t *c, int64_t max_bytes);
void dl_allreduce_free(dl_allreduce_t *ar);
int dl_allreduce_info(const dl_allreduce_t *ar, dl_allreduce_info_t *out);
/* out = sum over ranks of in (out may be in); algo: an algorithm's number
 * (dl_allreduce_algo_name). */
int dl_allreduce_run(dl_allreduce_t *ar, dl_tensor_t *out, const dl_tensor_t *in, int algo,
                     int blocks, dl_stream_t *s);
/* A view of this rank's zero-copy region at a byte offset (a multiple of 16). */
int dl_allreduce_buffer(dl_allreduce_t *ar, dl_tensor_t **out, int64_t offset, int dtype,
                        int ndim, const int64_t *shape);
/* The byte offset of t in this rank's zero-copy region when all of t lies
 * there at a multiple of 16 (a zero-copy input), else -1 (meta: -1). */
int dl_allreduce_region_offset(const dl_allreduce_t *ar, const dl_tensor_t *t, int64_t *offset);
/* Wait for s (within twice the timeout) and report a device-side timeout. */
int dl_allreduce_check(dl_allreduce_t *ar, dl_stream_t *s);

/* CUDA graphs: capture the work issued on stream s (a stream of its own,
 * not the default one) between begin and end, then replay it on any stream
 * of that device. Tensors the captured work uses must outlive the graph. A
 * graph that captured NCCL work of a communicator is released when that
 * communicator is freed; a released graph's replay fails, saying why. */
typedef struct dl_graph dl_graph_t;
int dl_graph_begin(dl_graph_t **out, dl_stream_t *s);
/* Ends the capture (also after a failure inside it) and instantiates. */
int dl_graph_end(dl_graph_t *g);
int dl_graph_replay(dl_graph_t *g, dl_stream_t *s);
/* Kernel and other nodes captured. */
int dl_graph_nodes(const dl_graph_t *g, int64_t *nodes);
void dl_graph_free(dl_graph_t *g);

/* ---- expert parallelism: low-latency MoE dispatch and combine -----------
 * Each rank sends each of its T <= B tokens (x bf16 [T, H]) to the experts
 * topk_idx (int32 [T, K], -1 = none) picked, weighted by topk_weights (f32
 * [T, K]), through a symmetric buffer the object owns (one host, up to 8
 * ranks; NVLink or shared memory, no multicast; kernels/ep/ep.h has the
 * layout); combine brings the expert outputs back and sums them in fp32.
 * Layouts: per_expert, a message per (token, k) into slots [L][N][B]
 * (dispatch) and [E][B] (combine), O(E B H); per_rank, one message per
 * (token, destination rank) whose header carries the token's expert ids and
 * weights for that rank, slots [N][B] and [K][B], O((N + K) B H). Outputs,
 * the object's own tensors, valid until the next dispatch (dl_ep_tensor):
 * expert_major x [L, N*B, H] and counts [L] (rows per local expert), or
 * rank_major x [N, B, H], counts [N] (rows per source), expert ids and
 * weights [N, B, K] (the token's selection k if on this rank, else -1 / 0).
 * The fp8 option sends e4m3 codes (x u8) with one f32 scale per 128 values
 * (scales [.., H/128]). Combine takes y bf16 shaped like x: expert_major,
 * each row's expert output, summed as out[t] = sum_k w[t,k] y_k(t);
 * rank_major, each row's output already weighted over its selections on
 * that rank, summed over ranks. Each call is a send and a receive phase, so
 * a caller can do other work between them; every rank makes the same calls
 * in the same order, on one stream. Completion is counted by epochs in the
 * buffer that the kernels advance themselves: no zeroing between calls,
 * back to back and inside CUDA graphs alike. A wait that times out ends its
 * kernel; the next call or dl_ep_check names the phase, this rank and the
 * peer, and the object refuses further work. An expert id outside -1..E-1
 * drops that selection and is reported the same way (cpu: by the call).
 * On meta the object counts its bytes (any world size) and moves nothing. */
typedef struct dl_ep dl_ep_t;
enum { DL_EP_PER_EXPERT = 0, DL_EP_PER_RANK = 1 };
enum { DL_EP_EXPERT_MAJOR = 0, DL_EP_RANK_MAJOR = 1 };
typedef struct dl_ep_config {
  int32_t max_tokens; /* B: tokens a rank sends per call at most            */
  int32_t hidden;     /* H: a multiple of 8 (of 128 with fp8)               */
  int32_t experts;    /* E: a multiple of the ranks                         */
  int32_t topk;       /* K                                                  */
  int32_t layout;     /* DL_EP_PER_EXPERT or DL_EP_PER_RANK                 */
  int32_t output;     /* DL_EP_EXPERT_MAJOR or DL_EP_RANK_MAJOR             */
  int32_t fp8;        /* dispatch fp8 e4m3 + scales instead of bf16         */
  int32_t blocks;     /* grid size; <= 0: from the device (its share where
                         ranks share a GPU)                                 */
} dl_ep_config_t;
/* Bytes per rank by part (dl_ep_info_t.bytes): the symmetric buffer's
 * dispatch and combine send and receive regions, its control words with the
 * buffer's rounding (4 KiB; whole 2 MiB pages on cuda) and signal pad
 * (signals), their total, and the output tensors (not symmetric). The
 * allocator charges each part to the memory tag "ep_<name>" (names:
 * dl_ep_part_name). */
enum {
  DL_EP_DISPATCH_SEND_BYTES = 0,
  DL_EP_DISPATCH_RECV_BYTES = 1,
  DL_EP_COMBINE_SEND_BYTES = 2,
  DL_EP_COMBINE_RECV_BYTES = 3,
  DL_EP_SIGNALS_BYTES = 4,
  DL_EP_TOTAL_BYTES = 5,
  DL_EP_OUTPUTS_BYTES = 6,
  DL_EP_NUM_PARTS = 7
};
const char *dl_ep_part_name(int part); /* "dispatch_send", ...; NULL past the last */
typedef struct dl_ep_info {
  int32_t rank;
  int32_t size;
  int32_t dev_type;
  int32_t dev_index;
  int32_t local_experts; /* L = E / N                                       */
  int32_t blocks;        /* grid of every phase (cpu: blocks run in turn)  */
  int32_t threads;
  int32_t failed;
  int32_t tokens;        /* T of the last dispatch                         */
  int32_t pad;
  int64_t msg_dispatch;  /* bytes of a dispatch message (header + payload) */
  int64_t msg_combine;
  int64_t bytes[7];      /* by DL_EP_*_BYTES                               */
  int64_t dispatches;    /* dispatch_send calls so far                     */
  int64_t combines;
} dl_ep_info_t;
/* The object's tensors (dl_ep_tensor): x, scales (fp8), counts, expert ids
 * and weights (rank_major), and out [B, H] bf16 where combine writes by
 * default. */
enum { DL_EP_X = 0, DL_EP_SCALES = 1, DL_EP_COUNTS = 2, DL_EP_EXPERT_IDS = 3, DL_EP_WEIGHTS = 4,
       DL_EP_OUT = 5, DL_EP_NUM_TENSORS = 6 };

/* Collective over c's ranks (every rank the same configuration). */
int dl_ep_new(dl_ep_t **out, dl_comm_t *c, const dl_ep_config_t *cfg);
void dl_ep_free(dl_ep_t *ep);
int dl_ep_info(const dl_ep_t *ep, dl_ep_info_t *out);
/* A new view of tensor `which`; *out = NULL for one the configuration lacks. */
int dl_ep_tensor(dl_ep_t *ep, int which, dl_tensor_t **out);
int dl_ep_dispatch_send(dl_ep_t *ep, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                        const dl_tensor_t *topk_weights, dl_stream_t *s);
int dl_ep_dispatch_recv(dl_ep_t *ep, dl_stream_t *s);
/* y: bf16 shaped like x; out: bf16 [T, H] (T of the dispatch). */
int dl_ep_combine_send(dl_ep_t *ep, const dl_tensor_t *y, dl_stream_t *s);
int dl_ep_combine_recv(dl_ep_t *ep, dl_tensor_t *out, dl_stream_t *s);
/* A send and its receive in one launch (one kernel on cuda): the same
 * results as the two calls, without the overlap they allow. */
int dl_ep_dispatch(dl_ep_t *ep, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                   const dl_tensor_t *topk_weights, dl_stream_t *s);
int dl_ep_combine(dl_ep_t *ep, const dl_tensor_t *y, dl_tensor_t *out, dl_stream_t *s);
/* Wait for s (within twice the timeout) and report what the kernels recorded. */
int dl_ep_check(dl_ep_t *ep, dl_stream_t *s);

/* ---- expert parallelism through NVIDIA's NCCL EP --------------------------
 * The same calls as dl_ep_* over NCCL EP (libnccl_ep.so of the pinned
 * nccl-extensions 0.1.0, NCCL EP 0.2; opened at run time by the first
 * dl_ep_nccl_new: core/ops/ep/nccl_ep_lib.c says which file and which NCCL),
 * on an NCCL communicator (cuda, one rank a GPU). Its two algorithms:
 *  - low latency: outputs expert_major (x [L, N*B, H], counts [L]) and
 *    rank_major (x [N, B, H], counts [N], expert ids and weights [N, B, K];
 *    the weight of a selection on another rank is the token's, not 0), and
 *    combine as dl_ep's; fp8 through its DeepSeek recipe (e4m3 codes, an f32
 *    scale a 128 values; H a multiple of 512); H a multiple of 128. Its
 *    buffer is per source rank (our per_rank). dispatch_send / combine_send
 *    are its send_only calls, the receives its ncclEpComplete.
 *  - high throughput (bf16): outputs expert_major, a row per (token, local
 *    expert) in x [S, H], S = N*B*min(K, L), expert e's counts[e] rows from
 *    row offsets[e], weights [S] each row's routing weight; and flat
 *    (DL_EP_FLAT), a row per token in x [S, H], S = N*B, counts [1] the rows
 *    received, expert ids and weights [S, K]. Combine takes y shaped like x,
 *    each row already weighted by the caller, and sums the rows of each
 *    token. No send-only phase.
 * topk_idx (and, expert_major of low latency, topk_weights) are read again
 * by the combine: the object keeps a view of them until the next dispatch,
 * and they must not change before the combine. NCCL EP's own checks abort
 * the process (C++ asserts), so every shape and option is checked here
 * first. Waits: the comm's timeout; a low-latency wait past it masks the
 * late peer and is reported by the next call or dl_ep_nccl_check (a
 * high-throughput one traps the kernel: the CUDA context is lost). */
typedef struct dl_ep_nccl dl_ep_nccl_t;
enum { DL_EP_NCCL_LOW_LATENCY = 0, DL_EP_NCCL_HIGH_THROUGHPUT = 1 };
enum { DL_EP_FLAT = 2 }; /* an output of high throughput */
typedef struct dl_ep_nccl_config {
  int32_t max_tokens; /* B                                                    */
  int32_t hidden;     /* H                                                    */
  int32_t experts;    /* E: a multiple of the ranks                           */
  int32_t topk;       /* K: 1..min(32, E)                                     */
  int32_t algorithm;  /* DL_EP_NCCL_LOW_LATENCY or _HIGH_THROUGHPUT           */
  int32_t output;     /* DL_EP_EXPERT_MAJOR, DL_EP_RANK_MAJOR or DL_EP_FLAT   */
  int32_t fp8;        /* low latency only                                     */
  int32_t sms;        /* NCCL EP's max_num_sms; 0: its default                */
} dl_ep_nccl_config_t;
/* Bytes by part (dl_ep_nccl_info_t.bytes): handle, its routing buffers
 * (ncclEpHandleMemSize); library, what it allocated through the allocator
 * hooks it offers (its workspace, the handle's, high throughput's buffers);
 * window, the rest of what the GPU lost while the group and handle were
 * made (the driver's free memory before and after: its NCCL-registered
 * buffer, NCCL's device communicator); total, library + window, charged to
 * the memory tag "ep_nccl"; outputs, the tensors (tag ep_outputs). */
enum {
  DL_EP_NCCL_HANDLE_BYTES = 0,
  DL_EP_NCCL_LIBRARY_BYTES = 1,
  DL_EP_NCCL_WINDOW_BYTES = 2,
  DL_EP_NCCL_TOTAL_BYTES = 3,
  DL_EP_NCCL_OUTPUTS_BYTES = 4,
  DL_EP_NCCL_NUM_PARTS = 5
};
const char *dl_ep_nccl_part_name(int part); /* "handle", ...; NULL past the last */
typedef struct dl_ep_nccl_info {
  int32_t rank;
  int32_t size;
  int32_t dev_index;
  int32_t local_experts;
  int32_t failed;
  int32_t tokens;        /* T of the last dispatch                          */
  int32_t version;       /* NCCL EP's, MAJOR*10000 + MINOR*100 + PATCH       */
  int32_t nccl_version;  /* the NCCL it runs on, the same coding            */
  int64_t slots;         /* rows of x: L*N*B, N*B or S                       */
  int64_t bytes[5];      /* by DL_EP_NCCL_*_BYTES                            */
  int64_t dispatches;
  int64_t combines;
  char path[512];        /* the libnccl_ep.so opened                        */
} dl_ep_nccl_info_t;
/* dl_ep_nccl_tensor's tensors: dl_ep_tensor's and, high throughput's
 * expert_major, offsets [L]. */
enum { DL_EP_OFFSETS = 6 };

/* Collective over c's ranks (every rank the same configuration). */
int dl_ep_nccl_new(dl_ep_nccl_t **out, dl_comm_t *c, const dl_ep_nccl_config_t *cfg);
void dl_ep_nccl_free(dl_ep_nccl_t *e);
int dl_ep_nccl_info(const dl_ep_nccl_t *e, dl_ep_nccl_info_t *out);
int dl_ep_nccl_tensor(dl_ep_nccl_t *e, int which, dl_tensor_t **out);
int dl_ep_nccl_dispatch_send(dl_ep_nccl_t *e, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                             const dl_tensor_t *topk_weights, dl_stream_t *s);
int dl_ep_nccl_dispatch_recv(dl_ep_nccl_t *e, dl_stream_t *s);
/* out: where combine_send wrote (NCCL EP names the output at the send). */
int dl_ep_nccl_combine_send(dl_ep_nccl_t *e, const dl_tensor_t *y, dl_stream_t *s);
int dl_ep_nccl_combine_recv(dl_ep_nccl_t *e, dl_tensor_t *out, dl_stream_t *s);
int dl_ep_nccl_dispatch(dl_ep_nccl_t *e, const dl_tensor_t *x, const dl_tensor_t *topk_idx,
                        const dl_tensor_t *topk_weights, dl_stream_t *s);
int dl_ep_nccl_combine(dl_ep_nccl_t *e, const dl_tensor_t *y, dl_tensor_t *out, dl_stream_t *s);
/* Wait for s (within twice the timeout) and report a masked peer or a trap. */
int dl_ep_nccl_check(dl_ep_nccl_t *e, dl_stream_t *s);

/* ---- GEMM -----------------------------------------------------------------
 * out = alpha * a @ b + beta * c for matrices: a [m, k], b [k, n], out and c
 * [m, n]. a and b both bf16 or both f16; the products are summed in fp32
 * (fp64 in the cpu twin); out is a's dtype or f32. Any strides with a unit
 * stride in one dimension of each matrix: a transposed view is op T, no
 * copy. cuda: cuBLASLt, opened at run time (core/ops/gemm/cublaslt.c says
 * which files, in what order, and how the algorithm is chosen and cached),
 * so libdistlab loads and everything else works without it. *out NULL: out
 * is allocated (out_dtype, current memory tag); workspace NULL: one of
 * DL_GEMM_WORKSPACE_BYTES comes from the allocator under the memory tag
 * "gemm_workspace" and goes back stream-ordered after the call. c NULL:
 * out itself; c is not read when beta is 0 (NaNs there do not spread). On
 * meta out and the workspace are allocated and nothing runs.            */
enum { DL_GEMM_WORKSPACE_BYTES = 33554432 };
typedef struct dl_gemm_opts {
  double alpha, beta;
  int32_t out_dtype;       /* of an allocated out: DL_BF16, DL_F16, DL_F32; -1: a's */
  int32_t pad;
  const dl_tensor_t *c;    /* the addend (out's dtype and shape), or NULL */
  dl_tensor_t *workspace;  /* cuda: contiguous, >= DL_GEMM_WORKSPACE_BYTES bytes, or NULL */
} dl_gemm_opts_t;
int dl_gemm(const dl_gemm_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
            dl_tensor_t **out, dl_stream_t *s);
typedef struct dl_gemm_stats {
  int64_t calls;      /* GEMMs given to cuBLASLt                                   */
  int64_t heuristics; /* cublasLtMatmulAlgoGetHeuristic queries (algorithm cache misses) */
  int64_t cached;     /* configurations in the cache now                           */
  int64_t version;    /* cublasLtGetVersion() of the library loaded; 0: none yet   */
  int64_t grouped_cublas; /* grouped calls run by cublasGemmGroupedBatchedEx            */
  int64_t grouped_loop;   /* grouped calls run as one cuBLASLt GEMM per group           */
  int64_t cublas_version; /* cuBLAS (major*10000 + minor*100 + patch) loaded; 0: none yet */
} dl_gemm_stats_t;
int dl_gemm_stats(dl_gemm_stats_t *out);

/* ---- grouped GEMM: one GEMM per expert ----------------------------------
 * The expert GEMMs of a MoE layer on what ep:dispatch hands over: rows of x
 * grouped by expert, counts[e] rows for expert e of E, either expert-major
 * ([E, R, .]: rows r < counts[e] of x[e]; rows past the count are neither
 * read nor written) or packed ([T, .]: expert e's rows follow those of the
 * experts before it; rows past the sum are neither read nor written).
 *   DL_GEMM_FWD    a = x [.., K], b = w [E, K, N]    out [.., N]: Y_e = X_e W_e
 *   DL_GEMM_DGRAD  a = dy [.., N], b = w [E, K, N]   out [.., K]: dX_e = dY_e W_e^T
 *   DL_GEMM_WGRAD  a = x [.., K], b = dy [.., N]     out [E, K, N]: dW_e = X_e^T dY_e
 *                  (an expert with no rows: dW_e = 0, or unchanged when accumulating)
 * out has a's rows layout (fwd, dgrad). Inputs both bf16 or both f16,
 * products summed in fp32 (fp64 in the cpu twin), out their dtype or f32;
 * each matrix any strides with a unit stride in one of its two dimensions
 * (w of [E, N, K] transposed is fine). counts: host_counts (E values) when
 * not NULL, else the tensor counts (int32 or int64 [E], on cpu or on a's
 * device: read back to the host, a wait for the stream, refused inside a
 * graph capture). Backends on cuda: DL_GEMM_GROUPED_CUBLAS, cuBLAS's
 * cublasGemmGroupedBatchedEx (one launch; libcublas opened at run time as
 * cuBLASLt is); DL_GEMM_GROUPED_LOOP, one cuBLASLt GEMM per expert (dl_gemm's
 * algorithm cache) spread over `streams` side streams joined back to s (0: 1,
 * the calling stream alone); DL_GEMM_GROUPED_AUTO picks (core/ops/gemm/grouped.c
 * says how). workspace NULL: DL_GEMM_WORKSPACE_BYTES plus the pointer arrays
 * from the allocator under "gemm_workspace", given back stream-ordered (on
 * meta charged and given back; nothing runs). accumulate: out += the products
 * (out must be given). *out NULL: allocated (out_dtype, current memory tag). */
enum { DL_GEMM_FWD = 0, DL_GEMM_DGRAD = 1, DL_GEMM_WGRAD = 2 };
enum { DL_GEMM_GROUPED_AUTO = 0, DL_GEMM_GROUPED_CUBLAS = 1, DL_GEMM_GROUPED_LOOP = 2 };
enum { DL_GEMM_GROUPED_MAX = 4096, DL_GEMM_GROUPED_MAX_STREAMS = 8 };
typedef struct dl_gemm_grouped_opts {
  int32_t op;              /* DL_GEMM_FWD, DL_GEMM_DGRAD or DL_GEMM_WGRAD               */
  int32_t backend;         /* DL_GEMM_GROUPED_*                                          */
  int32_t streams;         /* loop: side streams, 0..DL_GEMM_GROUPED_MAX_STREAMS         */
  int32_t out_dtype;       /* of an allocated out: DL_BF16, DL_F16, DL_F32; -1: a's       */
  int32_t accumulate;      /* out += the products                                        */
  int32_t chosen;          /* set by the call: the backend that ran (cpu/meta: AUTO)     */
  int64_t groups;          /* E; with host_counts, its length                            */
  const int64_t *host_counts; /* E counts on the host, or NULL                          */
  const dl_tensor_t *counts;  /* else int32/int64 [E]                                   */
  dl_tensor_t *workspace;  /* cuda: contiguous, >= dl_gemm_grouped_workspace_bytes(E)   */
} dl_gemm_grouped_opts_t;
int dl_gemm_grouped(dl_gemm_grouped_opts_t *o, const dl_tensor_t *a, const dl_tensor_t *b,
                    dl_tensor_t **out, dl_stream_t *s);
/* Bytes of the workspace a grouped call over `groups` experts takes. */
int64_t dl_gemm_grouped_workspace_bytes(int64_t groups);

/* ---- overlap: symmetric workspace and flags for comm + GEMM schedules ------
 * What the schedules of distlab.overlap (all-gather + GEMM, GEMM +
 * reduce-scatter) run on: a symmetric buffer of nbytes on every rank of c,
 * and nflags flags per rank, in host memory that every rank of the node
 * maps, that peers set (signal: := 1 once the work queued before it on the
 * stream is done) and their owner waits on (wait: until it is 1, then
 * := 0). Set-and-clear, not counts: a CUDA graph replays a captured write
 * with the value it captured. On cuda both are stream memory operations
 * (cuStreamWriteValue32, cuStreamWaitValue32: no kernel, no multiprocessor
 * spins; graphs capture them), and a watchdog thread of the object fails it
 * when a run between begin and end has made no progress for the timeout: it
 * prints and keeps the waits that had not passed (step, peer, flag) for the
 * next call to report, and sets the object's flags from the host so the
 * streams drain. On cpu a wait polls and fails at its timeout. A failed
 * object refuses further runs. Freeing it waits for the device's queued
 * work (which ends: see the watchdog).                                    */
typedef struct dl_overlap dl_overlap_t;
enum { DL_OVERLAP_MAX_FLAGS = 64, DL_OVERLAP_MAX_WAITS = 256 };
typedef struct dl_overlap_info {
  int32_t rank, size, dev_type, dev_index;
  int32_t share;    /* ranks of c on this GPU                                  */
  int32_t sms;      /* multiprocessors an SM copy may use: the GPU's, or half   */
                    /* of them split among the ranks where ranks share it       */
  int32_t nflags;
  int32_t failed;
  int64_t nbytes;
  int64_t runs;     /* dl_overlap_begin calls                                   */
  int64_t waits;    /* waits issued since the last begin                        */
  void *base;       /* this rank's buffer, the same for the object's life       */
} dl_overlap_info_t;
/* Collective. what: the call, which every rank must make the same (compared
 * through the store; a mismatch fails on every rank, naming both sides).
 * initial: nflags starting values (NULL: 0). */
int dl_overlap_new(dl_overlap_t **out, dl_comm_t *c, const char *what, int64_t nbytes,
                   int nflags, const uint32_t *initial);
void dl_overlap_free(dl_overlap_t *o);
int dl_overlap_info(const dl_overlap_t *o, dl_overlap_info_t *out);
/* A view of rank peer's buffer: byte offset, dtype, shape (row-major). */
int dl_overlap_tensor(dl_tensor_t **out, dl_overlap_t *o, int peer, int64_t offset, int dtype,
                      int ndim, const int64_t *shape);
/* A run: begin on the stream it starts on, signals and waits on any streams
 * forked from it, end on that stream once they joined it. */
int dl_overlap_begin(dl_overlap_t *o, dl_stream_t *s);
int dl_overlap_signal(dl_overlap_t *o, int peer, int flag, dl_stream_t *s);
/* step, peer and what ("ready", "free") name the wait in a timeout's message. */
int dl_overlap_wait(dl_overlap_t *o, int flag, int peer, int step, const char *what,
                    dl_stream_t *s);
int dl_overlap_end(dl_overlap_t *o, dl_stream_t *s);
/* Host waits for s (twice the timeout at most); the watchdog's failure, if any. */
int dl_overlap_check(dl_overlap_t *o, dl_stream_t *s);
/* dst := src, both contiguous, same dtype and size: blocks 0 by the copy
 * engine (cudaMemcpyAsync), else by a copy kernel of that many blocks. */
int dl_overlap_copy(dl_tensor_t *dst, const dl_tensor_t *src, int blocks, dl_stream_t *s);
/* out := srcs[0] + ... + srcs[n-1] (n <= 8; bf16/f16 summed in fp32, rounded once). */
int dl_overlap_reduce(dl_tensor_t *out, dl_tensor_t *const *srcs, int n, dl_stream_t *s);

#ifdef __cplusplus
}
#endif
#endif
