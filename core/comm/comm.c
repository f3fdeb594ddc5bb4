/*
 * comm.c — the one communicator interface and its dispatch to a backend
 * (comm_shm.c, comm_nccl.c, comm_ipc.c, comm_meta.c).
 *
 * Everything that does not depend on how bytes move lives here, so every
 * backend behaves the same at its edges: argument checks (devices, dtypes,
 * sizes, contiguity) with the same messages; error context naming the
 * operation, its number, this rank and the communicator; the failed state
 * (after an op failed, later ops refuse at once instead of hanging); the
 * debug mode (comm_store.c compares the op signatures across ranks);
 * splitting; and the thread's point-to-point group.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "base/device.h"

enum { COMM_MAGIC = 0xc0333c0u };

static const char *op_names[DL_OP_COUNT] = {
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_allv", "broadcast",
    "send",       "recv",       "barrier",        "split",      "symm_alloc"};

const char *dl_comm_op_name(int op) { return op >= 0 && op < DL_OP_COUNT ? op_names[op] : "?"; }

static const dl_comm_backend_t *backend_of(int backend) {
  switch (backend) {
  case DL_COMM_SHM: return &dl_comm_shm_backend;
  case DL_COMM_NCCL: return &dl_comm_nccl_backend;
  case DL_COMM_META: return &dl_comm_meta_backend;
  case DL_COMM_IPC: return &dl_comm_ipc_backend;
  default: return NULL;
  }
}

static int backend_id(const dl_comm_t *c) {
  if (c->be == &dl_comm_nccl_backend) return DL_COMM_NCCL;
  if (c->be == &dl_comm_meta_backend) return DL_COMM_META;
  if (c->be == &dl_comm_ipc_backend) return DL_COMM_IPC;
  return DL_COMM_SHM;
}

int dl_comm_world_rank(const dl_comm_t *c, int rank) {
  return c->world_ranks && rank >= 0 && rank < c->size ? c->world_ranks[rank] : rank;
}

int dl_comm_describe(const dl_comm_t *c, int op, char *buf, size_t len) {
  int wr = dl_comm_world_rank(c, c->rank);
  char world[32] = "";
  if (wr != c->rank) snprintf(world, sizeof world, " (world rank %d)", wr);
  return snprintf(buf, len, "%s #%lld on rank %d of %d%s (comm '%s', %s)", dl_comm_op_name(op),
                  (long long)c->seq, c->rank, c->size, world, c->name, c->be->name);
}

/* ---- lifetime ----------------------------------------------------------- */

static int comm_check(const dl_comm_t *c, const char *fn) {
  if (!c || c->magic != COMM_MAGIC)
    return DL_ERR(DL_ESTATE, "%s: not a live communicator (NULL or freed)", fn);
  return DL_OK;
}

/* A rank that cannot create c tells its peers through the store, whose
 * waits under c's keys then end at once naming it (store_internal.h): else
 * they would wait for it the whole timeout. Best effort: the error stays. */
static void tell_failure(dl_comm_t *c) {
  if (!c->store || c->size < 2) return;
  char why[768];
  const int wr = c->world_ranks ? c->world_ranks[c->rank] : c->rank;
  int n = snprintf(why, sizeof why, "rank %d gave up creating communicator '%s': %s", wr, c->name,
                   dl_last_error());
  if (n >= (int)sizeof why) n = (int)sizeof why - 1;
  const int code = dl_last_error_code();
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", dl_last_error());
  const double t = dl_store_timeout(c->store);
  dl_store_set_timeout(c->store, 2); /* a store gone too: do not wait for it */
  const int rc = dl_comm_store_set(c, DL_STORE_FAILED, why, n);
  dl_store_set_timeout(c->store, t);
  if (rc < 0) (void)DL_ERR(code, "%s", saved); /* ours, not the store's */
}

/* A new comm with the given identity; runs the backend's rendezvous. */
static int comm_create(dl_comm_t **out, const dl_comm_backend_t *be, dl_store_t *store,
                       int rank, int size, int dev_index, double timeout_s, const char *name,
                       const int *world_ranks) {
  dl_comm_t *c = calloc(1, sizeof *c);
  if (!c) return DL_ERR(DL_ENOMEM, "communicator: out of memory");
  c->magic = COMM_MAGIC;
  c->be = be;
  c->rank = rank;
  c->size = size;
  const int on_cuda = be == &dl_comm_nccl_backend || be == &dl_comm_ipc_backend;
  c->dev_type = on_cuda ? DL_CUDA : be == &dl_comm_meta_backend ? DL_META : DL_CPU;
  c->dev_index = on_cuda ? dev_index : 0;
  c->timeout_s = timeout_s > 0 ? timeout_s : dl_timeout_s();
  c->share = 1;
  snprintf(c->name, sizeof c->name, "%s", name);
  if (world_ranks) {
    c->world_ranks = malloc(sizeof(int) * (size_t)size);
    if (!c->world_ranks) {
      free(c);
      return DL_ERR(DL_ENOMEM, "communicator: out of memory");
    }
    memcpy(c->world_ranks, world_ranks, sizeof(int) * (size_t)size);
  }
  if (store) {
    dl_store_retain(store);
    c->store = store;
  }
  /* a device that is not there fails at once on every rank, before any of
   * them waits on the store for a peer that already gave up */
  int rc = on_cuda ? dl_device_check(DL_CUDA, dev_index) : DL_OK;
  /* before the backend's rendezvous: once it is done, every member's pid is there */
  if (rc == DL_OK && store && size > 1) rc = dl_comm_publish_pid(c);
  if (rc == DL_OK && store && size > 1) rc = dl_comm_await_members(c);
  if (rc == DL_OK) rc = be->init(c);
  else c->impl = NULL;
  if (rc == DL_OK && (rc = dl_comm_watch(c, &c->gone)) < 0) be->destroy(c);
  if (rc < 0) {
    dl_error_context(rc, "creating %s communicator '%s' on rank %d of %d", be->name, c->name,
                     rank, size);
    tell_failure(c);
    c->impl = NULL;
    dl_comm_free(c);
    return rc;
  }
  *out = c;
  return DL_OK;
}

int dl_comm_new(dl_comm_t **out, int backend, dl_store_t *store, int rank, int size,
                int dev_index, double timeout_s) {
  DL_CHECK_ARG(out, "dl_comm_new: out is NULL");
  *out = NULL;
  const dl_comm_backend_t *be = backend_of(backend);
  DL_CHECK_ARG(be, "dl_comm_new: backend %d is not DL_COMM_SHM, DL_COMM_NCCL or DL_COMM_META",
               backend);
  DL_CHECK_ARG(size >= 1 && size <= DL_COMM_MAX_RANKS && rank >= 0 && rank < size,
               "dl_comm_new: rank %d is not in a world of size %d", rank, size);
  DL_CHECK_ARG(store || backend == DL_COMM_META,
               "dl_comm_new: the %s backend needs a store to rendezvous", be->name);
  /* "w", then "w1", "w2": every rank makes its worlds in the same order */
  static int n_meta_worlds;
  int nth = store ? dl_store_next_comm(store) : n_meta_worlds++;
  char name[16] = "w";
  if (nth > 0) snprintf(name, sizeof name, "w%d", nth);
  return comm_create(out, be, store, rank, size, dev_index, timeout_s, name, NULL);
}

void dl_comm_free(dl_comm_t *c) {
  if (!c || c->magic != COMM_MAGIC) return;
  dl_comm_unwatch(&c->gone);
  if (c->impl) c->be->destroy(c);
  dl_store_free(c->store);
  free(c->world_ranks);
  free(c->pids);
  c->magic = 0;
  free(c);
}

void dl_comm_drop(dl_comm_t *c) {
  if (!c || c->magic != COMM_MAGIC) return;
  c->dropped = 1;
  dl_comm_free(c);
}

int dl_comm_info(const dl_comm_t *c, dl_comm_info_t *out) {
  DL_TRY(comm_check(c, "dl_comm_info"));
  DL_CHECK_ARG(out, "dl_comm_info: out is NULL");
  memset(out, 0, sizeof *out);
  out->rank = c->rank;
  out->size = c->size;
  out->backend = backend_id(c);
  out->dev_type = c->dev_type;
  out->dev_index = c->dev_index;
  out->debug = c->debug;
  out->failed = c->failed;
  out->share = c->share;
  out->seq = c->seq;
  out->timeout_s = c->timeout_s;
  snprintf(out->name, sizeof out->name, "%s", c->name);
  out->native = c->be->native && c->impl ? c->be->native((dl_comm_t *)c) : NULL;
  return DL_OK;
}

int dl_comm_set_timeout(dl_comm_t *c, double timeout_s) {
  DL_TRY(comm_check(c, "dl_comm_set_timeout"));
  c->timeout_s = timeout_s > 0 ? timeout_s : dl_timeout_s();
  return DL_OK;
}

int dl_comm_debug(const dl_comm_t *c) { return c->debug && c->store; }

int dl_comm_set_debug(dl_comm_t *c, int on) {
  DL_TRY(comm_check(c, "dl_comm_set_debug"));
  DL_CHECK_ARG(!on || c->store, "dl_comm_set_debug: comm '%s' (%s) has no store to check through",
               c->name, c->be->name);
  c->debug = on != 0;
  return DL_OK;
}

int dl_comm_abort(dl_comm_t *c, const char *why) {
  DL_TRY(comm_check(c, "dl_comm_abort"));
  if (c->be->abort) c->be->abort(c, why ? why : "aborted by the user");
  c->failed = 1;
  return DL_OK;
}

/* ---- splitting ---------------------------------------------------------- */

int dl_comm_split_table(dl_comm_t **out, dl_comm_t *c, const int32_t *colors,
                        const int32_t *keys) {
  DL_CHECK_ARG(out, "dl_comm_split_table: out is NULL");
  *out = NULL;
  DL_TRY(comm_check(c, "dl_comm_split_table"));
  DL_CHECK_ARG(colors && keys, "dl_comm_split_table: colors and keys must be given");
  int split = c->nsplits++;
  int color = colors[c->rank];
  if (color < 0) return DL_OK;
  int *members = malloc(sizeof(int) * (size_t)c->size);
  if (!members) return DL_ERR(DL_ENOMEM, "split: out of memory");
  int n = 0;
  for (int r = 0; r < c->size; r++) { /* insertion sort by (key, rank): stable */
    if (colors[r] != color) continue;
    int i = n++;
    while (i > 0 && keys[members[i - 1]] > keys[r]) {
      members[i] = members[i - 1];
      i--;
    }
    members[i] = r;
  }
  int rank = 0;
  for (int i = 0; i < n; i++) {
    if (members[i] == c->rank) rank = i;
    members[i] = dl_comm_world_rank(c, members[i]);
  }
  char name[2 * DL_COMM_NAME];
  if (snprintf(name, sizeof name, "%s.s%dc%d", c->name, split, color) >= DL_COMM_NAME) {
    free(members);
    return DL_ERR(DL_EINVAL, "split of comm '%s': splits nest too deep for its name", c->name);
  }
  int rc = comm_create(out, c->be, c->store, rank, n, c->dev_index, c->timeout_s, name, members);
  free(members);
  if (rc == DL_OK) (*out)->debug = c->debug;
  return rc;
}

int dl_comm_split(dl_comm_t **out, dl_comm_t *c, int color, int key) {
  DL_CHECK_ARG(out, "dl_comm_split: out is NULL");
  *out = NULL;
  DL_TRY(comm_check(c, "dl_comm_split"));
  if (!c->store)
    return DL_ERR(DL_EUNSUPPORTED,
                  "split of comm '%s' (%s): its peers are imaginary, so nobody can tell their "
                  "colors; give every rank's color and key (dl_comm_split_table, or "
                  "comm:split(function(rank) return color, key end) in Lua)",
                  c->name, c->be->name);
  int32_t *tab = malloc(sizeof(int32_t) * 2 * (size_t)c->size);
  if (!tab) return DL_ERR(DL_ENOMEM, "split: out of memory");
  int32_t mine[2] = {color, key};
  char k[64];
  snprintf(k, sizeof k, "split%d/%d", c->nsplits, c->rank);
  int rc = dl_comm_store_set(c, k, mine, sizeof mine);
  for (int r = 0; r < c->size && rc == DL_OK; r++) {
    int32_t got[2];
    snprintf(k, sizeof k, "split%d/%d", c->nsplits, r);
    rc = dl_comm_store_get(c, k, got, sizeof got);
    tab[r] = got[0];
    tab[c->size + r] = got[1];
  }
  if (rc == DL_OK) rc = dl_comm_split_table(out, c, tab, tab + c->size);
  else dl_error_context(rc, "split of comm '%s' on rank %d", c->name, c->rank);
  free(tab);
  return rc;
}

/* ---- checks ------------------------------------------------------------- */

static int view_arg(const dl_comm_t *c, const dl_tensor_t *t, const char *what, dl_view_t *v) {
  char owner[DL_COMM_NAME + 32];
  snprintf(owner, sizeof owner, "comm '%s' (%s)", c->name, c->be->name);
  return dl_tensor_arg(t, what, c->dev_type, c->dev_index, owner, v);
}

/* "has algo=p2p, mask=causal" (dl_comm_agree's signature is the string) */
static int desc_has(const void *sig, char *buf, size_t len) {
  return snprintf(buf, len, "has %s", (const char *)sig);
}

int dl_comm_agree(dl_comm_t *c, const char *what, const char *desc) {
  DL_TRY(comm_check(c, "dl_comm_agree"));
  DL_CHECK_ARG(what && desc, "dl_comm_agree: what and desc must be given");
  char sig[256] = {0};
  DL_CHECK_ARG(strlen(desc) < sizeof sig, "dl_comm_agree: a description of %zu bytes (at most %zu)",
               strlen(desc), sizeof sig - 1);
  if (!c->store) return DL_OK;
  char whaton[256];
  snprintf(whaton, sizeof whaton, "%s on comm '%s'", what, c->name);
  if (c->failed)
    return DL_ERR(DL_ESTATE, "%s: the communicator failed earlier; make a new one", whaton);
  strcpy(sig, desc);
  return dl_comm_check_same(c, "agree", c->nagree++, sig, sizeof sig, whaton, desc_has);
}

/* ---- groups ------------------------------------------------------------- */

static __thread int group_depth;
static __thread dl_comm_t *group_head;

int dl_comm_group_start(void) {
  group_depth++;
  return DL_OK;
}

/* A send to this rank is received by this rank: both in the same group
 * (NCCL's rule, kept on every backend, so an unpaired one is an error
 * rather than a message left in the shm mailbox or a hang). */
static int self_paired(dl_comm_t *c, char *why, size_t len) {
  const int s = c->self_sends, r = c->self_recvs;
  c->self_sends = c->self_recvs = 0;
  if (s == r) return 1;
  snprintf(why, len, "rank %d sent %d message%s to itself but received %d from itself in one group: "
           "each send to self needs its recv from self in the same dl.comm.group",
           c->rank, s, s == 1 ? "" : "s", r);
  return 0;
}

int dl_comm_group_end(void) {
  DL_CHECK_ARG(group_depth > 0, "dl_comm_group_end without dl_comm_group_start");
  if (--group_depth > 0) return DL_OK;
  int rc = DL_OK;
  while (group_head) {
    dl_comm_t *c = group_head;
    group_head = c->group_next;
    c->group_next = NULL;
    c->in_group = 0;
    if (c->magic != COMM_MAGIC) continue;
    char why[256];
    int r;
    if (!self_paired(c, why, sizeof why)) { /* the group is void: its waits end now, here and at the peers */
      if (c->be->abort) c->be->abort(c, why);
      (void)c->be->group_end(c);
      r = DL_ERR(DL_EINVAL, "%s", why);
    } else {
      r = c->be->group_end(c);
    }
    if (r < 0 && rc == DL_OK) {
      char what[256];
      dl_comm_describe(c, DL_OP_SEND, what, sizeof what);
      rc = dl_error_context(r, "grouped point-to-point ending %s", what);
      c->failed = 1;
      if (c->be->abort) c->be->abort(c, dl_last_error());
    }
  }
  return rc;
}

/* ---- dispatch ----------------------------------------------------------- */

static int run(dl_comm_t *c, dl_comm_call_t *call) {
  DL_TRY(comm_check(c, dl_comm_op_name(call->op)));
  c->seq++;
  char what[256];
  if (c->failed) {
    dl_comm_describe(c, call->op, what, sizeof what);
    return DL_ERR(DL_ESTATE,
                  "%s: the communicator failed earlier (an op timed out or a peer failed); "
                  "make a new one",
                  what);
  }
  if (group_depth > 0 && !c->in_group) {
    DL_TRY(c->be->group_start(c));
    c->in_group = 1;
    c->group_next = group_head;
    group_head = c;
  }
  int rc = c->debug ? dl_comm_debug_check(c, call) : DL_OK;
  if (rc == DL_OK) rc = c->be->run(c, call);
  if (rc < 0) {
    dl_comm_describe(c, call->op, what, sizeof what);
    dl_error_context(rc, "%s", what);
    if (rc != DL_EINVAL || c->debug || c->failed) {
      c->failed = 1;
      if (c->be->abort) c->be->abort(c, dl_last_error());
    }
  }
  return rc;
}

static int red_arg(int op) {
  return op >= DL_RED_SUM && op <= DL_RED_MIN
             ? DL_OK
             : DL_ERR(DL_EINVAL, "reduction op %d is not DL_RED_SUM/AVG/MAX/MIN", op);
}

static int pair_args(dl_comm_t *c, int op, dl_tensor_t *out, const dl_tensor_t *in,
                     dl_comm_call_t *call) {
  DL_TRY(comm_check(c, dl_comm_op_name(op)));
  memset(call, 0, sizeof *call);
  call->op = op;
  char what[64];
  snprintf(what, sizeof what, "%s: output", dl_comm_op_name(op));
  DL_TRY(view_arg(c, out, what, &call->out));
  snprintf(what, sizeof what, "%s: input", dl_comm_op_name(op));
  DL_TRY(view_arg(c, in, what, &call->in));
  DL_CHECK_ARG(call->out.dtype == call->in.dtype, "%s: output is %s but input is %s",
               dl_comm_op_name(op), dl_dtype_name(call->out.dtype), dl_dtype_name(call->in.dtype));
  return DL_OK;
}

int dl_comm_all_reduce(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, int op,
                       dl_stream_t *s) {
  dl_comm_call_t call;
  DL_TRY(red_arg(op));
  DL_TRY(pair_args(c, DL_OP_ALL_REDUCE, out, in, &call));
  DL_CHECK_ARG(call.out.numel == call.in.numel,
               "all_reduce: output has %lld elements, input %lld", (long long)call.out.numel,
               (long long)call.in.numel);
  call.red = op;
  call.stream = s;
  return run(c, &call);
}

int dl_comm_all_gather(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, dl_stream_t *s) {
  dl_comm_call_t call;
  DL_TRY(pair_args(c, DL_OP_ALL_GATHER, out, in, &call));
  DL_CHECK_ARG(call.out.numel == call.in.numel * c->size,
               "all_gather: output has %lld elements, expected %d x %lld (size x input)",
               (long long)call.out.numel, c->size, (long long)call.in.numel);
  call.stream = s;
  return run(c, &call);
}

int dl_comm_reduce_scatter(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, int op,
                           dl_stream_t *s) {
  dl_comm_call_t call;
  DL_TRY(red_arg(op));
  DL_TRY(pair_args(c, DL_OP_REDUCE_SCATTER, out, in, &call));
  DL_CHECK_ARG(call.in.numel == call.out.numel * c->size,
               "reduce_scatter: input has %lld elements, expected %d x %lld (size x output)",
               (long long)call.in.numel, c->size, (long long)call.out.numel);
  call.red = op;
  call.stream = s;
  return run(c, &call);
}

int dl_comm_all_to_all(dl_comm_t *c, dl_tensor_t *out, const dl_tensor_t *in, dl_stream_t *s) {
  dl_comm_call_t call;
  DL_TRY(pair_args(c, DL_OP_ALL_TO_ALL, out, in, &call));
  DL_CHECK_ARG(call.out.numel == call.in.numel && call.in.numel % c->size == 0,
               "all_to_all: input and output need the same number of elements, divisible by "
               "the size %d (have %lld and %lld)",
               c->size, (long long)call.in.numel, (long long)call.out.numel);
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)c->size);
  if (!counts) return DL_ERR(DL_ENOMEM, "all_to_all: out of memory");
  for (int r = 0; r < c->size; r++) counts[r] = call.in.numel / c->size;
  call.send_counts = call.recv_counts = counts;
  call.stream = s;
  int rc = run(c, &call);
  free(counts);
  return rc;
}

int dl_comm_all_to_allv(dl_comm_t *c, dl_tensor_t *out, const int64_t *recv_counts,
                        const dl_tensor_t *in, const int64_t *send_counts, dl_stream_t *s) {
  dl_comm_call_t call;
  DL_TRY(pair_args(c, DL_OP_ALL_TO_ALLV, out, in, &call));
  DL_CHECK_ARG(recv_counts && send_counts, "all_to_allv: counts must be given");
  int64_t ns = 0, nr = 0;
  for (int r = 0; r < c->size; r++) {
    DL_CHECK_ARG(send_counts[r] >= 0 && recv_counts[r] >= 0,
                 "all_to_allv: negative count for rank %d", r);
    ns += send_counts[r];
    nr += recv_counts[r];
  }
  DL_CHECK_ARG(ns <= call.in.numel && nr <= call.out.numel,
               "all_to_allv: counts add up to %lld to send and %lld to receive, but the tensors "
               "hold %lld and %lld elements",
               (long long)ns, (long long)nr, (long long)call.in.numel, (long long)call.out.numel);
  call.send_counts = send_counts;
  call.recv_counts = recv_counts;
  call.stream = s;
  return run(c, &call);
}

int dl_comm_broadcast(dl_comm_t *c, dl_tensor_t *t, int root, dl_stream_t *s) {
  dl_comm_call_t call = {.op = DL_OP_BROADCAST, .peer = root, .stream = s};
  DL_TRY(comm_check(c, "broadcast"));
  DL_CHECK_ARG(root >= 0 && root < c->size, "broadcast: root %d is not a rank of 0..%d", root,
               c->size - 1);
  DL_TRY(view_arg(c, t, "broadcast", &call.out));
  call.in = call.out;
  return run(c, &call);
}

static int p2p(dl_comm_t *c, int op, const dl_tensor_t *t, int peer, dl_stream_t *s) {
  dl_comm_call_t call = {.op = op, .peer = peer, .stream = s};
  DL_TRY(comm_check(c, dl_comm_op_name(op)));
  DL_CHECK_ARG(peer >= 0 && peer < c->size, "%s: peer %d is not a rank of 0..%d",
               dl_comm_op_name(op), peer, c->size - 1);
  DL_TRY(view_arg(c, t, dl_comm_op_name(op), op == DL_OP_SEND ? &call.in : &call.out));
  if (peer == c->rank) {
    DL_CHECK_ARG(group_depth > 0, "%s: rank %d to itself outside a group: its %s could never be "
                 "posted (issue the send and the recv to self in one dl.comm.group)",
                 dl_comm_op_name(op), peer, op == DL_OP_SEND ? "recv" : "send");
  }
  const int rc = run(c, &call);
  if (rc == DL_OK && peer == c->rank) *(op == DL_OP_SEND ? &c->self_sends : &c->self_recvs) += 1;
  return rc;
}

int dl_comm_send(dl_comm_t *c, const dl_tensor_t *t, int peer, dl_stream_t *s) {
  return p2p(c, DL_OP_SEND, t, peer, s);
}

int dl_comm_recv(dl_comm_t *c, dl_tensor_t *t, int peer, dl_stream_t *s) {
  return p2p(c, DL_OP_RECV, t, peer, s);
}

int dl_comm_barrier(dl_comm_t *c, dl_stream_t *s) {
  DL_TRY(comm_check(c, "barrier"));
  dl_comm_call_t call = {.op = DL_OP_BARRIER, .stream = s};
  return run(c, &call);
}

int dl_comm_synchronize(dl_comm_t *c, dl_stream_t *s) {
  DL_TRY(comm_check(c, "dl_comm_synchronize"));
  int rc = c->be->synchronize(c, s);
  if (rc < 0) {
    c->failed = 1;
    if (c->be->abort) c->be->abort(c, dl_last_error());
  }
  return rc;
}
