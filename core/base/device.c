/*
 * device.c — devices, streams and events.
 *
 * CUDA is touched lazily: loading the library never initialises it, so it
 * loads on machines with the toolkit but no driver (developer machines, CI),
 * where dl_cuda_device_count() answers 0 with the reason. A cpu or meta
 * stream is a tag (ops there run synchronously); cpu and meta events record
 * host time so timing code is the same on every device.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "device.h"

struct dl_stream {
  int dev_type;
  int dev_index;
  int priority;
#ifdef DL_WITH_CUDA
  cudaStream_t cu;
#endif
};

struct dl_event {
  int dev_type;
  int dev_index;
  int recorded;
  double host_us;
#ifdef DL_WITH_CUDA
  cudaEvent_t cu;
#endif
};

/* ---- CUDA availability ------------------------------------------------- */

static int cuda_count = -1;
static const char *cuda_reason = "";

int dl_cuda_device_count(int *count, const char **reason) {
#ifdef DL_WITH_CUDA
  if (cuda_count < 0) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      cuda_reason = e == cudaErrorInsufficientDriver ? "no CUDA driver (libcuda.so) on this machine"
                    : e == cudaErrorNoDevice        ? "no CUDA device on this machine"
                                                    : cudaGetErrorString(e);
      n = 0;
    } else if (n == 0) {
      cuda_reason = "no CUDA device on this machine";
    }
    cuda_count = n;
  }
#else
  cuda_count = 0;
  cuda_reason = "this libdistlab was built without CUDA (no nvcc at build time)";
#endif
  if (count) *count = cuda_count;
  if (reason) *reason = cuda_reason;
  return DL_OK;
}

int dl_device_check(int dev_type, int dev_index) {
  if (dev_type == DL_CPU || dev_type == DL_META) {
    DL_CHECK_ARG(dev_index == 0, "device index %d on %s (only 0 exists)", dev_index,
                 dev_type == DL_CPU ? "cpu" : "meta");
    return DL_OK;
  }
  DL_CHECK_ARG(dev_type == DL_CUDA, "unknown device type %d", dev_type);
  int n;
  const char *why;
  dl_cuda_device_count(&n, &why);
  if (n == 0) return DL_ERR(DL_ENODEV, "cuda:%d requested but %s", dev_index, why);
  if (dev_index < 0 || dev_index >= n)
    return DL_ERR(DL_ENODEV, "cuda:%d requested but this machine has %d CUDA device(s)", dev_index,
                  n);
  return DL_OK;
}

#ifdef DL_WITH_CUDA
static __thread int current_cuda = -1;
int dl_cuda_use(int dev_index) {
  if (current_cuda != dev_index) {
    DL_CUDA_CHECK(cudaSetDevice(dev_index));
    current_cuda = dev_index;
  }
  return DL_OK;
}
#endif

int dl_cuda_device_name(int index, char *buf, int64_t buflen) {
  DL_TRY(dl_device_check(DL_CUDA, index));
  DL_CHECK_ARG(buf && buflen > 0, "no buffer for the device name");
#ifdef DL_WITH_CUDA
  struct cudaDeviceProp prop;
  DL_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  snprintf(buf, (size_t)buflen, "%s", prop.name);
#endif
  return DL_OK;
}

int dl_cuda_device_id(int index, char *buf, int64_t buflen) {
  DL_CHECK_ARG(buf && buflen > 0, "dl_cuda_device_id: no buffer");
  buf[0] = 0;
  DL_TRY(dl_device_check(DL_CUDA, index));
#ifdef DL_WITH_CUDA
  char host[256] = "?", bus[64] = "?";
  gethostname(host, sizeof host - 1);
  DL_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, index));
  snprintf(buf, (size_t)buflen, "%s/%s", host, bus);
#endif
  return DL_OK;
}

int dl_device_synchronize(int dev_type, int dev_index) {
  DL_TRY(dl_device_check(dev_type, dev_index));
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) {
    DL_TRY(dl_cuda_use(dev_index));
    DL_CUDA_CHECK(cudaDeviceSynchronize());
  }
#endif
  return DL_OK;
}

/* ---- streams ------------------------------------------------------------ */

/* CUDA streams are never destroyed, only pooled (as PyTorch does): the
 * allocator keeps raw stream handles (a block's pool, record_stream's users)
 * that may outlive the Lua object of the stream, and an event recorded on a
 * destroyed stream crashes the driver. A freed stream goes back to the pool
 * of its device and priority. */
enum { POOL_MAX = 256 };
#ifdef DL_WITH_CUDA
typedef struct pooled {
  int dev_index, priority;
  cudaStream_t cu;
} pooled_t;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pooled_t pool[POOL_MAX];
static int pool_n;

static cudaStream_t pool_take(int dev_index, int priority) {
  cudaStream_t cu = NULL;
  pthread_mutex_lock(&pool_mu);
  for (int i = pool_n - 1; i >= 0; i--)
    if (pool[i].dev_index == dev_index && pool[i].priority == priority) {
      cu = pool[i].cu;
      pool[i] = pool[--pool_n];
      break;
    }
  pthread_mutex_unlock(&pool_mu);
  return cu;
}

/* 0 when the pool is full (the caller then keeps the stream alive unpooled). */
static int pool_put(int dev_index, int priority, cudaStream_t cu) {
  pthread_mutex_lock(&pool_mu);
  int ok = pool_n < POOL_MAX;
  if (ok) pool[pool_n++] = (pooled_t){dev_index, priority, cu};
  pthread_mutex_unlock(&pool_mu);
  return ok;
}
#endif

int dl_stream_new(dl_stream_t **out, int dev_type, int dev_index, int priority) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_TRY(dl_device_check(dev_type, dev_index));
  dl_stream_t *s = calloc(1, sizeof *s);
  if (!s) return DL_ERR(DL_ENOMEM, "out of host memory for a stream");
  s->dev_type = dev_type;
  s->dev_index = dev_index;
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) {
    int rc = dl_cuda_use(dev_index);
    if (rc == DL_OK) {
      int lo, hi;
      cudaError_t e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
      if (e == cudaSuccess) {
        int p = priority < hi ? hi : priority > lo ? lo : priority;
        s->priority = p;
        s->cu = pool_take(dev_index, p);
        if (!s->cu) e = cudaStreamCreateWithPriority(&s->cu, cudaStreamNonBlocking, p);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        rc = DL_ERR(DL_ECUDA, "cudaStreamCreateWithPriority on cuda:%d: %s", dev_index,
                    cudaGetErrorString(e));
      }
    }
    if (rc) {
      free(s);
      return rc;
    }
  }
#endif
  *out = s;
  return DL_OK;
}

void dl_stream_free(dl_stream_t *s) {
  if (!s) return;
#ifdef DL_WITH_CUDA
  if (s->dev_type == DL_CUDA && s->cu) (void)pool_put(s->dev_index, s->priority, s->cu);
#endif
  free(s);
}

void *dl_stream_handle(dl_stream_t *s) {
#ifdef DL_WITH_CUDA
  if (s && s->dev_type == DL_CUDA) return (void *)s->cu;
#endif
  return NULL;
}

int dl_stream_for(dl_stream_t *s, int dev_type, int dev_index, void **handle) {
  *handle = NULL;
  if (!s || dev_type != DL_CUDA) return DL_OK;
  if (s->dev_type != DL_CUDA || s->dev_index != dev_index)
    return DL_ERR(DL_EINVAL, "the current stream belongs to %s:%d but the tensor is on cuda:%d",
                  dl_device_type_name(s->dev_type),
                  s->dev_index, dev_index);
  *handle = dl_stream_handle(s);
  return DL_OK;
}

int dl_stream_synchronize(dl_stream_t *s, int dev_type, int dev_index) {
  if (s) {
    dev_type = s->dev_type;
    dev_index = s->dev_index;
  }
  DL_TRY(dl_device_check(dev_type, dev_index));
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) { /* polled, so that a stuck stream ends in an error, not a hang */
    DL_TRY(dl_cuda_use(dev_index));
    cudaStream_t h = s ? s->cu : 0;
    const double t0 = dl_now_us(), limit = dl_timeout_s();
    cudaError_t q;
    while ((q = cudaStreamQuery(h)) == cudaErrorNotReady) {
      if (dl_now_us() - t0 > limit * 1e6)
        return DL_ERR(DL_ETIMEOUT, "stream on cuda:%d did not finish within %.1f s (a kernel is "
                      "stuck, or waits for a peer that never came; DISTLAB_TIMEOUT sets the limit)",
                      dev_index, limit);
      dl_wait_pause(t0);
    }
    DL_CUDA_CHECK(q);
  }
#endif
  return DL_OK;
}

int dl_stream_wait_event(dl_stream_t *s, dl_event_t *e) {
  DL_CHECK_ARG(e, "event is NULL");
  if (!e->recorded) return DL_ERR(DL_ESTATE, "waiting on an event that was never recorded");
#ifdef DL_WITH_CUDA
  if (e->dev_type == DL_CUDA) {
    int dev = s ? s->dev_index : e->dev_index;
    if (s && s->dev_type != DL_CUDA) return DL_OK; /* cpu work is already ordered */
    DL_TRY(dl_cuda_use(dev));
    DL_CUDA_CHECK(cudaStreamWaitEvent(s ? s->cu : 0, e->cu, 0));
  }
#endif
  return DL_OK;
}

/* ---- events ------------------------------------------------------------- */

int dl_event_new(dl_event_t **out, int dev_type, int dev_index) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_TRY(dl_device_check(dev_type, dev_index));
  dl_event_t *e = calloc(1, sizeof *e);
  if (!e) return DL_ERR(DL_ENOMEM, "out of host memory for an event");
  e->dev_type = dev_type;
  e->dev_index = dev_index;
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) {
    int rc = dl_cuda_use(dev_index);
    if (rc == DL_OK) {
      cudaError_t err = cudaEventCreate(&e->cu);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        rc = DL_ERR(DL_ECUDA, "cudaEventCreate on cuda:%d: %s", dev_index, cudaGetErrorString(err));
      }
    }
    if (rc) {
      free(e);
      return rc;
    }
  }
#endif
  *out = e;
  return DL_OK;
}

void dl_event_free(dl_event_t *e) {
  if (!e) return;
#ifdef DL_WITH_CUDA
  if (e->dev_type == DL_CUDA && e->cu) cudaEventDestroy(e->cu);
#endif
  free(e);
}

int dl_event_record(dl_event_t *e, dl_stream_t *s) {
  DL_CHECK_ARG(e, "event is NULL");
  e->host_us = dl_now_us();
  e->recorded = 1;
#ifdef DL_WITH_CUDA
  if (e->dev_type == DL_CUDA) {
    if (s && (s->dev_type != DL_CUDA || s->dev_index != e->dev_index))
      return DL_ERR(DL_EINVAL, "event of cuda:%d recorded on a stream of another device",
                    e->dev_index);
    DL_TRY(dl_cuda_use(e->dev_index));
    DL_CUDA_CHECK(cudaEventRecord(e->cu, s ? s->cu : 0));
  }
#endif
  return DL_OK;
}

int dl_event_query(dl_event_t *e, int *done) {
  DL_CHECK_ARG(e && done, "event or out is NULL");
  *done = 1;
#ifdef DL_WITH_CUDA
  if (e->dev_type == DL_CUDA && e->recorded) {
    cudaError_t err = cudaEventQuery(e->cu);
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      *done = 0;
    } else {
      DL_CUDA_CHECK(err);
    }
  }
#endif
  return DL_OK;
}

int dl_event_synchronize(dl_event_t *e, double timeout_s) {
  DL_CHECK_ARG(e, "event is NULL");
  double t0 = dl_now_us();
  int done = 0;
  for (;;) {
    DL_TRY(dl_event_query(e, &done));
    if (done) return DL_OK;
    if (timeout_s > 0 && dl_now_us() - t0 > timeout_s * 1e6)
      return DL_ERR(DL_ETIMEOUT, "event on cuda:%d not reached after %.1f s (a kernel is stuck "
                    "or a peer never arrived)", e->dev_index, timeout_s);
    dl_wait_pause(t0);
  }
}

int dl_event_elapsed_ms(dl_event_t *start, dl_event_t *end, double *ms) {
  DL_CHECK_ARG(start && end && ms, "NULL argument");
  if (!start->recorded || !end->recorded)
    return DL_ERR(DL_ESTATE, "elapsed time between events that were not both recorded");
#ifdef DL_WITH_CUDA
  if (start->dev_type == DL_CUDA && end->dev_type == DL_CUDA) {
    float f;
    DL_TRY(dl_event_synchronize(end, dl_timeout_s()));
    DL_CUDA_CHECK(cudaEventElapsedTime(&f, start->cu, end->cu));
    *ms = f;
    return DL_OK;
  }
#endif
  *ms = (end->host_us - start->host_us) * 1e-3;
  return DL_OK;
}
