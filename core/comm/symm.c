/*
 * symm.c — symmetric buffers: nbytes on every rank of a communicator (one
 * host), each rank's buffer mapped by all, with a signal pad behind each.
 *
 * They are what custom all-reduce, EP dispatch and all-gather+GEMM kernels
 * read and write directly: a kernel on rank r loads from and stores to rank
 * q's buffer and synchronises through the pads (kernels/common/signal_pad.h).
 *   cuda: cudaMalloc, cudaIpcGetMemHandle, handles exchanged through the
 *         store, cudaIpcOpenMemHandle on the peers. Never NVLink multicast.
 *   cpu:  one POSIX shm segment per rank, /distlab-<job>-<comm>-y<k>-r<rank>,
 *         mapped by all; each name is unlinked once every rank has mapped it.
 *   meta: one meta allocation (so memory accounting sees it); nothing moves.
 * Layout of each rank's allocation: the data, rounded up to 4 KiB, then the
 * pad (zeroed before anyone can see it).
 *
 * Tensor views of a peer's buffer sit on storages that wrap the mapping
 * (dl_storage_wrap) and hold a reference to the buffer: dl_symm_free drops
 * the owner's reference, and the memory is unmapped when the last view goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mem/alloc.h"
#include "comm_internal.h"
#include "base/device.h"
#include "common/signal_pad.h"

enum { SYMM_MAGIC = 0x5e11b0f };

struct dl_symm {
  uint32_t magic;
  int rank, size, dev_type, dev_index;
  int failed;
  double timeout_s;
  char comm_name[DL_COMM_NAME];
  int64_t nbytes, data_bytes;
  size_t total;
  char *base[DL_SIGNAL_MAX_RANKS]; /* each rank's allocation as mapped here */
  dl_signal_peers_t peers;
  int32_t pids[DL_SIGNAL_MAX_RANKS]; /* each rank's process on this host (0: unknown), for messages */
  uint32_t *gone;    /* the peers' word (peers.c) the waits poll: gone_cpu, or pinned and mapped */
  uint32_t gone_cpu;
  int refs;   /* the owner's, plus one per live view storage */
  int closed; /* dl_symm_free was called: no new use */
  dl_tensor_t *meta; /* meta: the one allocation */
};

static int symm_check(const dl_symm_t *b, const char *fn) {
  if (!b || b->magic != SYMM_MAGIC || b->closed)
    return DL_ERR(DL_ESTATE, "%s: not a live symmetric buffer (NULL or freed)", fn);
  return DL_OK;
}

static int peer_arg(const dl_symm_t *b, int peer, const char *fn) {
  DL_CHECK_ARG(peer >= 0 && peer < b->size, "%s: peer %d is not a rank of 0..%d", fn, peer,
               b->size - 1);
  return DL_OK;
}

/* ---- cpu ---------------------------------------------------------------- */

static int map_cpu(dl_symm_t *b, dl_comm_t *c, int k) {
  char name[200], key[200];
  snprintf(name, sizeof name, "/distlab-%s-%s-y%d-r%d", dl_store_job(c->store), c->name, k,
           b->rank);
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) { /* left by a crashed job with this id */
    shm_unlink(name);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return DL_ERR(DL_EIO, "shm_open(%s): %s", name, strerror(errno));
  int rc = DL_OK;
  if (ftruncate(fd, (off_t)b->total) != 0)
    rc = DL_ERR(DL_EIO, "ftruncate(%s, %zu): %s (is /dev/shm full?)", name, b->total,
                strerror(errno));
  void *p = rc ? MAP_FAILED : mmap(NULL, b->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (rc == DL_OK && p == MAP_FAILED) rc = DL_ERR(DL_EIO, "mmap(%s): %s", name, strerror(errno));
  if (rc == DL_OK) {
    b->base[b->rank] = p;
    snprintf(key, sizeof key, "y%d/%d", k, b->rank);
    rc = dl_comm_store_set(c, key, "", 0);
  }
  for (int r = 0; r < b->size && rc == DL_OK; r++) {
    if (r == b->rank) continue;
    char peer[200];
    snprintf(key, sizeof key, "%s/y%d/%d", c->name, k, r);
    snprintf(peer, sizeof peer, "/distlab-%s-%s-y%d-r%d", dl_store_job(c->store), c->name, k, r);
    rc = dl_store_wait(c->store, key);
    int pfd = rc ? -1 : shm_open(peer, O_RDWR, 0600);
    if (rc == DL_OK && pfd < 0) rc = DL_ERR(DL_EIO, "shm_open(%s): %s", peer, strerror(errno));
    if (rc) break;
    void *q = mmap(NULL, b->total, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
    close(pfd);
    if (q == MAP_FAILED) rc = DL_ERR(DL_EIO, "mmap(%s): %s", peer, strerror(errno));
    else b->base[r] = q;
  }
  char bar[32];
  snprintf(bar, sizeof bar, "y%d", k);
  if (rc == DL_OK) rc = dl_comm_store_barrier(c, bar); /* everyone mapped everything */
  snprintf(key, sizeof key, "y%d/%d", k, b->rank);
  if (rc == DL_OK) rc = dl_comm_store_delete(c, key); /* read by all: the store keeps no keys */
  shm_unlink(name);
  return rc;
}

/* ---- cuda --------------------------------------------------------------- */

#ifdef DL_WITH_CUDA
static int map_cuda(dl_symm_t *b, dl_comm_t *c, int k) {
  DL_TRY(dl_cuda_use(b->dev_index));
  void *p = NULL;
  DL_CUDA_CHECK(cudaMalloc(&p, (size_t)dl_symm_mapped_bytes(DL_CUDA, b->nbytes)));
  b->base[b->rank] = p;
  DL_CUDA_CHECK(cudaMemset((char *)p + b->data_bytes, 0, sizeof(dl_signal_pad_t)));
  DL_CUDA_CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  DL_CUDA_CHECK(cudaIpcGetMemHandle(&h, p));
  char key[64];
  snprintf(key, sizeof key, "y%d/%d", k, b->rank);
  DL_TRY(dl_comm_store_set(c, key, &h, sizeof h));
  for (int r = 0; r < b->size; r++) {
    if (r == b->rank) continue;
    snprintf(key, sizeof key, "y%d/%d", k, r);
    DL_TRY(dl_comm_store_get(c, key, &h, sizeof h));
    void *q = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&q, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return DL_ERR(DL_ECUDA,
                    "cudaIpcOpenMemHandle of rank %d's buffer failed: %s (are all ranks on one "
                    "host, each on its own GPU?)",
                    r, cudaGetErrorString(e));
    }
    b->base[r] = q;
  }
  snprintf(key, sizeof key, "y%d", k);
  DL_TRY(dl_comm_store_barrier(c, key)); /* everyone opened every handle */
  snprintf(key, sizeof key, "y%d/%d", k, b->rank);
  return dl_comm_store_delete(c, key); /* read by all: the store keeps no keys */
}
#endif

static void unmap(dl_symm_t *b) {
  for (int r = 0; r < b->size; r++) {
    if (!b->base[r]) continue;
    if (b->dev_type == DL_CPU) munmap(b->base[r], b->total);
#ifdef DL_WITH_CUDA
    else if (b->dev_type == DL_CUDA && r == b->rank) cudaFree(b->base[r]);
    else if (b->dev_type == DL_CUDA) cudaIpcCloseMemHandle(b->base[r]);
#endif
    b->base[r] = NULL;
  }
}

static void free_gone(dl_symm_t *b) {
  if (!b->gone) return;
  dl_comm_unwatch(b->gone);
#ifdef DL_WITH_CUDA
  if (b->gone != &b->gone_cpu) cudaFreeHost(b->gone);
#endif
  b->gone = NULL;
}

/* The word the waits poll, watched: pinned host memory the device reads on
 * cuda (with UVA its address is the same on both sides). */
static int new_gone(dl_symm_t *b, dl_comm_t *c) {
  b->gone = &b->gone_cpu;
#ifdef DL_WITH_CUDA
  if (b->dev_type == DL_CUDA) {
    void *h = NULL, *d = NULL;
    b->gone = NULL;
    DL_TRY(dl_cuda_use(b->dev_index));
    DL_CUDA_CHECK(cudaHostAlloc(&h, sizeof(uint32_t), cudaHostAllocMapped));
    b->gone = h;
    DL_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    if (d != h) return DL_ERR(DL_EUNSUPPORTED, "symm: mapped host memory without UVA");
  }
#endif
  return dl_comm_watch(c, b->gone);
}

/* ---- lifetime ----------------------------------------------------------- */

int dl_comm_next_symm_id(const dl_comm_t *c) { return c->nsymm; }

/* cuda: a whole number of 2 MiB pages. cudaMalloc packs small allocations
 * into one page, an IPC handle names the page, and a peer that already
 * opened a handle on it (an earlier small buffer of this rank) is refused
 * the second with "resource already mapped". */
int64_t dl_symm_mapped_bytes(int dev_type, int64_t nbytes) {
  const int64_t page = (int64_t)2 << 20;
  const int64_t total = ((nbytes + 4095) & ~(int64_t)4095) + (int64_t)sizeof(dl_signal_pad_t);
  return dev_type == DL_CUDA ? (total + page - 1) / page * page : total;
}

/* Larger sizes are no memory any host has, and would overflow the rounding. */
#define SYMM_MAX_BYTES ((int64_t)1 << 56)

int dl_symm_alloc(dl_symm_t **out, dl_comm_t *c, int64_t nbytes) {
  return dl_symm_alloc_desc(out, c, nbytes, NULL);
}

int dl_symm_alloc_desc(dl_symm_t **out, dl_comm_t *c, int64_t nbytes, const char *desc) {
  DL_CHECK_ARG(out, "dl_symm_alloc: out is NULL");
  *out = NULL;
  dl_comm_info_t ci;
  DL_TRY(dl_comm_info(c, &ci));
  DL_CHECK_ARG(nbytes >= 0 && nbytes <= SYMM_MAX_BYTES,
               "dl_symm_alloc: size %lld bytes is not in 0..2^56", (long long)nbytes);
  DL_CHECK_ARG(!desc || strlen(desc) < 200, "dl_symm_alloc: a description of %zu bytes (under 200)",
               strlen(desc));
  DL_CHECK_ARG(c->size <= DL_SIGNAL_MAX_RANKS,
               "symmetric buffers span one host of at most %d ranks; comm '%s' has %d (split it "
               "by host first)",
               DL_SIGNAL_MAX_RANKS, c->name, c->size);
  DL_CHECK_ARG(!c->failed, "dl_symm_alloc: comm '%s' failed earlier", c->name);
  /* a peer that maps a larger buffer than ours would write past our end (a
   * SIGBUS on cpu, corrupt memory on cuda): every rank checks every other
   * rank's size before anything is mapped, so all fail alike */
  char sig[256];
  snprintf(sig, sizeof sig, "%lld bytes%s%s", (long long)nbytes, desc ? ", " : "", desc ? desc : "");
  char what[64];
  snprintf(what, sizeof what, "symmetric buffers (symm_alloc #%d)", c->nsymm);
  int arc = dl_comm_agree(c, what, sig);
  if (arc < 0) {
    c->nsymm++; /* every rank counted this allocation: keep their ids in step */
    return dl_error_context(arc, "symm_alloc on rank %d of %d", c->rank, c->size);
  }
  dl_symm_t *b = calloc(1, sizeof *b);
  if (!b) return DL_ERR(DL_ENOMEM, "dl_symm_alloc: out of memory");
  b->magic = SYMM_MAGIC;
  b->refs = 1;
  b->rank = c->rank;
  b->size = c->size;
  b->dev_type = c->dev_type;
  b->dev_index = c->dev_index;
  b->timeout_s = c->timeout_s;
  snprintf(b->comm_name, sizeof b->comm_name, "%s", c->name);
  b->nbytes = nbytes;
  b->data_bytes = (nbytes + 4095) & ~(int64_t)4095;
  b->total = (size_t)b->data_bytes + sizeof(dl_signal_pad_t);
  int k = c->nsymm++, rc;
  if (c->dev_type == DL_META) {
    int64_t n = nbytes;
    rc = dl_tensor_empty(&b->meta, DL_U8, 1, &n, DL_META, 0, NULL);
  } else if (c->dev_type == DL_CPU) {
    rc = map_cpu(b, c, k);
  } else {
#ifdef DL_WITH_CUDA
    rc = map_cuda(b, c, k);
#else
    rc = DL_ERR(DL_EUNSUPPORTED, "symmetric buffers on cuda need a CUDA build");
#endif
  }
  if (rc < 0) {
    dl_error_context(rc, "symm_alloc of %lld bytes on rank %d of %d (comm '%s')",
                     (long long)nbytes, c->rank, c->size, c->name);
    dl_symm_free(b);
    return rc;
  }
  for (int r = 0; r < b->size; r++) {
    b->peers.pads[r] = b->base[r] ? (dl_signal_pad_t *)(b->base[r] + b->data_bytes) : NULL;
    b->pids[r] = dl_comm_peer_pid(c, r);
  }
  if (c->dev_type != DL_META && (rc = new_gone(b, c)) < 0) {
    dl_error_context(rc, "symm_alloc on rank %d of %d (comm '%s')", c->rank, c->size, c->name);
    dl_symm_free(b);
    return rc;
  }
  *out = b;
  return DL_OK;
}

static void symm_unref(void *ctx) {
  dl_symm_t *b = ctx;
  if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  free_gone(b);
  unmap(b);
  dl_tensor_free(b->meta);
  b->magic = 0;
  free(b);
}

void dl_symm_free(dl_symm_t *b) {
  if (!b || b->magic != SYMM_MAGIC || b->closed) return;
  b->closed = 1;
  symm_unref(b);
}

int64_t dl_symm_nbytes(const dl_symm_t *b) {
  return symm_check(b, "dl_symm_nbytes") == DL_OK ? b->nbytes : -1;
}

int dl_symm_peer_ptr(const dl_symm_t *b, int peer, void **ptr) {
  DL_TRY(symm_check(b, "dl_symm_peer_ptr"));
  DL_TRY(peer_arg(b, peer, "dl_symm_peer_ptr"));
  *ptr = b->base[peer];
  return DL_OK;
}

int dl_symm_signal_pad(const dl_symm_t *b, int peer, void **pad) {
  DL_TRY(symm_check(b, "dl_symm_signal_pad"));
  DL_TRY(peer_arg(b, peer, "dl_symm_signal_pad"));
  *pad = b->peers.pads[peer];
  return DL_OK;
}

/* A new storage (one reference) over peer's mapping that keeps b alive. */
static int view_storage(dl_symm_t *b, int peer, dl_storage_t **out) {
  if (b->dev_type == DL_META) {
    dl_storage_retain(b->meta->storage);
    *out = b->meta->storage;
    return DL_OK;
  }
  DL_TRY(dl_storage_wrap(b->dev_type, b->dev_index, b->base[peer], b->nbytes, symm_unref, b, out));
  __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
  return DL_OK;
}

int dl_symm_tensor(dl_tensor_t **out, dl_symm_t *b, int peer, int64_t offset, int dtype,
                   int ndim, const int64_t *shape) {
  DL_CHECK_ARG(out, "dl_symm_tensor: out is NULL");
  *out = NULL;
  DL_TRY(symm_check(b, "dl_symm_tensor"));
  DL_TRY(peer_arg(b, peer, "dl_symm_tensor"));
  DL_CHECK_ARG(dtype >= 0 && dtype < DL_NUM_DTYPES, "dl_symm_tensor: unknown dtype %d", dtype);
  DL_CHECK_ARG(ndim >= 0 && ndim <= DL_MAX_DIMS && (ndim == 0 || shape),
               "dl_symm_tensor: bad shape (%d dims)", ndim);
  int esz = dl_dtype_size(dtype);
  int64_t strides[DL_MAX_DIMS], numel = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    DL_CHECK_ARG(shape[d] >= 0, "dl_symm_tensor: negative size in dimension %d", d + 1);
    strides[d] = numel;
    numel *= shape[d];
  }
  DL_CHECK_ARG(offset >= 0 && offset % esz == 0 && offset + numel * esz <= b->nbytes,
               "symm view of %lld bytes at offset %lld does not fit the buffer of %lld bytes "
               "(or the offset is not a multiple of %d)",
               (long long)(numel * esz), (long long)offset, (long long)b->nbytes, esz);
  /* a tensor with no memory, moved onto the view's storage, gives the view */
  dl_tensor_t *tmp;
  int64_t zero = 0;
  DL_TRY(dl_tensor_empty(&tmp, dtype, 1, &zero, b->dev_type, b->dev_index, NULL));
  dl_storage_t *s = NULL;
  int vrc = view_storage(b, peer, &s);
  if (vrc) {
    dl_tensor_free(tmp);
    return vrc;
  }
  dl_storage_release(tmp->storage);
  tmp->storage = s;
  int rc = dl_tensor_as_strided(out, tmp, ndim, shape, strides, offset / esz);
  dl_tensor_free(tmp);
  return rc;
}

/* ---- signals ------------------------------------------------------------ */

static int signal_stream(dl_symm_t *b, dl_stream_t *s, void **h) {
  *h = NULL;
  return b->dev_type == DL_CUDA ? dl_stream_for(s, DL_CUDA, b->dev_index, h) : DL_OK;
}

static int signal_ctx(dl_symm_t *b, int rc, const char *what) {
  if (rc >= 0) return rc;
  b->failed = 1;
  return dl_error_context(rc, "symm %s on rank %d of %d (comm '%s')", what, b->rank, b->size,
                          b->comm_name);
}

/* The death that dead rank d's own pad records, if its last wait ended at
 * one (it gave up because another rank died first): that rank, or -1. The
 * watchdog names the lowest of several ranks it finds dead at one look, so
 * a survivor that failed and exited a millisecond after the real death can
 * be the one named; its record names the first. Read from host memory on
 * cpu; on cuda by a copy that may fail with the dead rank's memory (then
 * -1). */
static int cause_of(dl_symm_t *b, uint32_t d) {
  if (d >= (uint32_t)b->size || !b->peers.pads[d] || (int)d == b->rank) return -1;
  uint32_t rec[4] = {0, 0, 0, 0};
  if (b->dev_type == DL_CPU) {
    for (int i = 0; i < 4; i++) rec[i] = __atomic_load_n(&b->peers.pads[d]->error[i], __ATOMIC_ACQUIRE);
  } else {
#ifdef DL_WITH_CUDA
    if (cudaMemcpy(rec, b->peers.pads[d]->error, sizeof rec, cudaMemcpyDeviceToHost) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
#else
    return -1;
#endif
  }
  return rec[0] == DL_SIGNAL_ERR_DEAD && rec[1] < (uint32_t)b->size && rec[1] != d ? (int)rec[1] : -1;
}

/* The message of a death the pad records (kind DL_SIGNAL_ERR_DEAD), with
 * the words the launcher and the specs look for: "rank R (pid P) has exited",
 * and, where R gave up because another rank died first, that rank too. */
static int dead_error(dl_symm_t *b, const uint32_t *err) {
  const uint32_t d = err[1];
  const int first = cause_of(b, d);
  if (first >= 0)
    return DL_ERR(DL_EPEER,
                  "rank %u (pid %d) has exited (a wait of this rank for %u saw %u); it gave up "
                  "after rank %d (pid %d) has exited",
                  d, d < DL_SIGNAL_MAX_RANKS ? b->pids[d] : 0, err[2], err[3], first, b->pids[first]);
  return DL_ERR(DL_EPEER, "rank %u (pid %d) has exited (a wait of this rank for %u saw %u)", d,
                d < DL_SIGNAL_MAX_RANKS ? b->pids[d] : 0, err[2], err[3]);
}

/* cpu: a wait that ended at a death says so in those words (the pid is ours to add). */
static int dead_pid(dl_symm_t *b, int rc) {
  const uint32_t *err = b->peers.pads[b->rank]->error;
  return rc == DL_EPEER && err[0] == DL_SIGNAL_ERR_DEAD ? dead_error(b, err) : rc;
}

static int flag_arg(dl_symm_t *b, int flag, const char *fn) {
  DL_TRY(symm_check(b, fn));
  DL_CHECK_ARG(flag >= 0 && flag < DL_SIGNAL_FLAGS, "%s: flag %d is not in 0..%d", fn, flag,
               DL_SIGNAL_FLAGS - 1);
  DL_CHECK_ARG(!b->failed, "%s: this symmetric buffer failed earlier (a wait timed out)", fn);
  return DL_OK;
}

int dl_symm_flag_set(dl_symm_t *b, int peer, int flag, uint32_t value, dl_stream_t *s) {
  DL_TRY(flag_arg(b, flag, "dl_symm_flag_set"));
  DL_TRY(peer_arg(b, peer, "dl_symm_flag_set"));
  if (b->dev_type == DL_META) return DL_OK;
  void *h;
  DL_TRY(signal_stream(b, s, &h));
  if (b->dev_type == DL_CPU) return dl_signal_set_cpu(b->peers.pads[peer], flag, value, h);
#ifdef DL_WITH_CUDA
  return dl_signal_set_cuda(b->peers.pads[peer], flag, value, h);
#endif
  return DL_EUNSUPPORTED;
}

int dl_symm_flag_wait(dl_symm_t *b, int flag, uint32_t value, dl_stream_t *s) {
  DL_TRY(flag_arg(b, flag, "dl_symm_flag_wait"));
  if (b->dev_type == DL_META) return DL_OK;
  void *h;
  DL_TRY(signal_stream(b, s, &h));
  dl_signal_pad_t *self = b->peers.pads[b->rank];
  if (b->dev_type == DL_CPU)
    return signal_ctx(b, dead_pid(b, dl_signal_wait_cpu(self, flag, value, b->timeout_s, b->gone, h)),
                      "flag wait");
#ifdef DL_WITH_CUDA
  return dl_signal_wait_cuda(self, flag, value, b->timeout_s, b->gone, h);
#endif
  return DL_EUNSUPPORTED;
}

int dl_symm_flag_get(dl_symm_t *b, int peer, int flag, uint32_t *value) {
  DL_TRY(symm_check(b, "dl_symm_flag_get"));
  DL_TRY(peer_arg(b, peer, "dl_symm_flag_get"));
  DL_CHECK_ARG(flag >= 0 && flag < DL_SIGNAL_FLAGS && value, "dl_symm_flag_get: bad flag %d",
               flag);
  *value = 0;
  if (b->dev_type == DL_META) return DL_OK;
  uint32_t *p = &b->peers.pads[peer]->flags[flag];
  if (b->dev_type == DL_CPU) {
    *value = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    return DL_OK;
  }
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(b->dev_index));
  DL_CUDA_CHECK(cudaMemcpy(value, p, sizeof *value, cudaMemcpyDeviceToHost));
#endif
  return DL_OK;
}

int dl_symm_barrier(dl_symm_t *b, dl_stream_t *s) {
  DL_TRY(flag_arg(b, 0, "dl_symm_barrier"));
  if (b->dev_type == DL_META) return DL_OK;
  void *h;
  DL_TRY(signal_stream(b, s, &h));
  if (b->dev_type == DL_CPU)
    return signal_ctx(b, dead_pid(b, dl_signal_barrier_cpu(b->peers, b->rank, b->size, b->timeout_s,
                                                           b->gone, h)),
                      "barrier");
#ifdef DL_WITH_CUDA
  return dl_signal_barrier_cuda(b->peers, b->rank, b->size, b->timeout_s, b->gone, h);
#endif
  return DL_EUNSUPPORTED;
}

int dl_symm_check(dl_symm_t *b, dl_stream_t *s) {
  DL_TRY(symm_check(b, "dl_symm_check"));
  if (b->dev_type == DL_META) return DL_OK;
  uint32_t err[4] = {0, 0, 0, 0};
  const uint32_t *rec = b->peers.pads[b->rank]->error;
  if (b->dev_type == DL_CPU) {
    memcpy(err, rec, sizeof err);
  } else {
#ifdef DL_WITH_CUDA
    void *h;
    DL_TRY(signal_stream(b, s, &h));
    /* device waits end by themselves within the timeout; allow twice that */
    const double t0 = dl_now_us();
    cudaError_t q;
    while ((q = cudaStreamQuery((cudaStream_t)h)) == cudaErrorNotReady) {
      if (dl_now_us() - t0 > (2 * b->timeout_s + 1) * 1e6)
        return signal_ctx(b, DL_ERR(DL_ETIMEOUT, "the stream did not finish within %.1f s",
                                    2 * b->timeout_s + 1), "check");
      dl_wait_pause(t0);
    }
    if (q != cudaSuccess) {
      (void)cudaGetLastError();
      /* a peer's death can take the memory it exported with it */
      const uint32_t g = __atomic_load_n(b->gone, __ATOMIC_ACQUIRE);
      if (g)
        return signal_ctx(b, DL_ERR(DL_EPEER, "rank %u (pid %d) has exited, and the stream failed: %s",
                                    g - 1, g - 1 < DL_SIGNAL_MAX_RANKS ? b->pids[g - 1] : 0,
                                    cudaGetErrorString(q)), "check");
      return signal_ctx(b, DL_ERR(DL_ECUDA, "the stream failed: %s", cudaGetErrorString(q)),
                        "check");
    }
    DL_CUDA_CHECK(cudaMemcpy(err, rec, sizeof err, cudaMemcpyDeviceToHost));
#endif
  }
  if (err[0] == DL_SIGNAL_ERR_FLAG)
    return signal_ctx(b, DL_ERR(DL_ETIMEOUT, "flag %u did not reach %u within %.1f s (it is %u)",
                                err[1], err[2], b->timeout_s, err[3]), "flag wait");
  if (err[0] == DL_SIGNAL_ERR_DEAD) return signal_ctx(b, dead_error(b, err), "wait");
  if (err[0] == DL_SIGNAL_ERR_BARRIER)
    return signal_ctx(b, DL_ERR(DL_ETIMEOUT,
                                "barrier %u: rank %u did not arrive within %.1f s (its count "
                                "here is %u)",
                                err[2], err[1], b->timeout_s, err[3]), "barrier");
  return DL_OK;
}
