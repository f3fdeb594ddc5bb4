/*
 * devop.c — the device-op lifecycle (devop.h): identity, failure record,
 * symmetric buffer, peer watch, failure, launch, stream wait, release.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/common/devop.h"
#include "base/device.h"

/* ---- lifetime ------------------------------------------------------------ */

static int new_status(dl_devop_t *op) {
  const size_t n = op->kind->status_bytes;
  if (!n) return DL_OK;
#ifdef DL_WITH_CUDA
  if (op->dev_type == DL_CUDA) {
    void *h = NULL, *d = NULL;
    DL_TRY(dl_cuda_use(op->dev_index));
    DL_CUDA_CHECK(cudaHostAlloc(&h, n, cudaHostAllocMapped));
    memset(h, 0, n);
    op->status = h;
    DL_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    if (d != h) return DL_ERR(DL_EUNSUPPORTED, "%s: mapped host memory without UVA", op->kind->name);
    return DL_OK;
  }
#endif
  op->status = calloc(1, n);
  return op->status ? DL_OK : DL_ERR(DL_ENOMEM, "%s: out of host memory", op->kind->name);
}

static void free_status(dl_devop_t *op) {
  if (!op->status) return;
#ifdef DL_WITH_CUDA
  if (op->dev_type == DL_CUDA) {
    cudaFreeHost(op->status);
    op->status = NULL;
    return;
  }
#endif
  free(op->status);
  op->status = NULL;
}

int dl_devop_open(dl_devop_t *op, const dl_devop_kind_t *kind, dl_comm_t *c, const dl_comm_info_t *ci) {
  op->magic = kind->magic;
  op->kind = kind;
  op->comm = c;
  snprintf(op->comm_name, sizeof op->comm_name, "%s", ci->name);
  op->rank = ci->rank;
  op->size = ci->size;
  op->dev_type = ci->dev_type;
  op->dev_index = ci->dev_index;
  op->share = ci->share > 1 ? ci->share : 1;
  op->timeout_s = ci->timeout_s;
  pthread_mutex_init(&op->mu, NULL);
  for (int p = 0; p < op->size && p < DL_SIGNAL_MAX_RANKS && op->dev_type != DL_META; p++)
    op->pids[p] = dl_comm_peer_pid(c, p);
  return new_status(op);
}

int dl_devop_map(dl_devop_t *op, int64_t nbytes) {
  DL_TRY(dl_symm_alloc(&op->symm, op->comm, nbytes));
  for (int p = 0; p < op->size && op->dev_type != DL_META; p++) {
    void *ptr;
    DL_TRY(dl_symm_peer_ptr(op->symm, p, &ptr));
    op->bufs[p] = ptr;
  }
  return DL_OK;
}

int dl_devop_watch(dl_devop_t *op, uint32_t *word) {
  if (op->dev_type == DL_META) return DL_OK;
  DL_TRY(dl_comm_watch(op->comm, word));
  op->gone = word;
  return DL_OK;
}

void dl_devop_free(dl_devop_t *op, const dl_devop_kind_t *kind) {
  if (!op || op->magic != kind->magic) return;
  dl_graph_release_user(op, kind->what);
  if (kind->fini) kind->fini(op);
  if (op->gone) dl_comm_unwatch(op->gone);
  dl_symm_free(op->symm);
  free_status(op);
  pthread_mutex_destroy(&op->mu);
  op->magic = 0;
  free(op);
}

int dl_devop_sms(const dl_devop_t *op, int *sms) {
  *sms = 0;
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(op->dev_index));
  DL_CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, op->dev_index));
  if (op->share > 1) *sms = *sms / (2 * op->share) > 0 ? *sms / (2 * op->share) : 1;
  return DL_OK;
#else
  return DL_ERR(DL_EUNSUPPORTED, "%s: the multiprocessors of a GPU need a CUDA build", op->kind->name);
#endif
}

/* ---- names --------------------------------------------------------------- */

int dl_devop_live(const dl_devop_t *op, const dl_devop_kind_t *kind, const char *fn) {
  if (!op || op->magic != kind->magic)
    return DL_ERR(DL_ESTATE, "%s: not a live %s (NULL or freed)", fn, kind->name);
  return DL_OK;
}

void dl_devop_identity(const dl_devop_t *op, int32_t *rank, int32_t *size, int32_t *dev_type, int32_t *dev_index) {
  *rank = op->rank;
  *size = op->size;
  *dev_type = op->dev_type;
  *dev_index = op->dev_index;
}

int dl_devop_describe(const dl_devop_t *op, const char *what, char *buf, size_t len) {
  return snprintf(buf, len, "%s on rank %d of %d (comm '%s', %s:%d)", what, op->rank, op->size,
                  op->comm_name, dl_device_type_name(op->dev_type), op->dev_index);
}

uint32_t dl_devop_gone(const dl_devop_t *op) {
  return op->gone ? __atomic_load_n(op->gone, __ATOMIC_ACQUIRE) : 0;
}

int dl_devop_gone_str(const dl_devop_t *op, uint32_t gone, char *buf, size_t len) {
  const int r = (int)gone - 1;
  return snprintf(buf, len, "rank %d (pid %d) has exited", r,
                  r >= 0 && r < DL_SIGNAL_MAX_RANKS ? op->pids[r] : 0);
}

/* ---- failure ------------------------------------------------------------- */

void dl_devop_fail_locked(dl_devop_t *op, const char *why) {
  if (op->failed) return;
  snprintf(op->failure, sizeof op->failure, "%s", why);
  __atomic_store_n(&op->failed, 1, __ATOMIC_RELEASE);
}

void dl_devop_fail(dl_devop_t *op, const char *why) {
  pthread_mutex_lock(&op->mu);
  dl_devop_fail_locked(op, why);
  pthread_mutex_unlock(&op->mu);
}

void dl_devop_set_failed(dl_devop_t *op) { dl_devop_fail(op, dl_last_error()); }

int dl_devop_refused(dl_devop_t *op) {
  if (!__atomic_load_n(&op->failed, __ATOMIC_ACQUIRE)) return DL_OK;
  pthread_mutex_lock(&op->mu);
  int rc = DL_ERR(DL_ESTATE, "this %s failed earlier and refuses work (make a new one): %s",
                  op->kind->name, op->failure);
  pthread_mutex_unlock(&op->mu);
  return rc;
}

int dl_devop_recorded_failure(dl_devop_t *op) {
  DL_TRY(dl_devop_refused(op));
  if (!op->status || !op->kind->recorded) return DL_OK;
  int fatal = 1;
  const int rc = op->kind->recorded(op, &fatal);
  if (rc < 0 && fatal) dl_devop_set_failed(op);
  return rc;
}

/* ---- running ------------------------------------------------------------- */

int dl_devop_launch(dl_devop_t *op, const void *args, void *stream) {
  dl_graph_note_user(op); /* a graph being captured now uses this op's buffers */
  if (op->dev_type == DL_CPU) {
    const int rc = op->kind->cpu(args, stream);
    const int rec = dl_devop_recorded_failure(op); /* the twin's failure, worded from its record */
    return rec < 0 ? rec : rc;
  }
#ifdef DL_WITH_CUDA
  if (op->kind->cuda) {
    DL_TRY(dl_cuda_use(op->dev_index));
    return op->kind->cuda(args, stream);
  }
#endif
  return DL_ERR(DL_EUNSUPPORTED, "%s kernels on cuda need a CUDA build", op->kind->name);
}

int dl_devop_wait_stream(dl_devop_t *op, dl_stream_t *s, const char *what, int (*poll)(dl_devop_t *op)) {
#ifdef DL_WITH_CUDA
  if (op->dev_type == DL_CUDA) {
    void *h = NULL;
    DL_TRY(dl_stream_for(s, DL_CUDA, op->dev_index, &h));
    DL_TRY(dl_cuda_use(op->dev_index));
    const double t0 = dl_now_us(), most_s = 2 * op->timeout_s + 1;
    char who[300];
    cudaError_t q;
    while ((q = cudaStreamQuery((cudaStream_t)h)) == cudaErrorNotReady) {
      if (poll) DL_TRY(poll(op));
      if (dl_now_us() - t0 > most_s * 1e6) {
        dl_devop_describe(op, what, who, sizeof who);
        return DL_ERR(DL_ETIMEOUT, "%s: the stream did not finish within %.1f s", who, most_s);
      }
      dl_wait_pause(t0);
    }
    if (q != cudaSuccess) {
      (void)cudaGetLastError();
      dl_devop_describe(op, what, who, sizeof who);
      const uint32_t g = dl_devop_gone(op);
      if (g) { /* the memory a dead peer exported went with it */
        char dead[96];
        dl_devop_gone_str(op, g, dead, sizeof dead);
        return DL_ERR(DL_EPEER, "%s: %s, and the stream failed: %s", who, dead, cudaGetErrorString(q));
      }
      return DL_ERR(DL_ECUDA, "%s: the stream failed: %s", who, cudaGetErrorString(q));
    }
  }
#else
  (void)s, (void)what, (void)poll;
#endif
  return DL_OK;
}
