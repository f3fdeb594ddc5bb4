/*
 * alloc.c — the caching allocator of each device, and memory accounting.
 *
 * cuda: blocks come from cudaMalloc, are rounded (512 B under 1 MiB, 2 MiB
 * above), and return to a free list of the stream they were allocated on
 * (a stream's work is ordered, so reuse there is safe without a sync). A block
 * that other streams used (dl_tensor_record_stream) waits for an event on each
 * of them before it can be reused, as in PyTorch's allocator. On a failed
 * cudaMalloc the cache is emptied and the call retried once; then DL_ENOMEM
 * carries a report of the device's memory.
 * cpu: malloc, 64-byte aligned, no cache. meta: no memory at all. On both,
 * the stats count the exact bytes requested.
 *
 * Stats per device: allocated/reserved, current and peak; per tag: current,
 * peak, and the bytes the tag held when the device peak was reached (so a
 * peak can be decomposed by tag). An optional bounded trace records every
 * allocation and free with its time and tag.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "base/device.h"

enum { MAX_TAGS = 256, MAX_TAG_DEPTH = 64, MAX_CUDA = 16, N_DEVS = 2 + MAX_CUDA };

typedef struct fblock {
  void *ptr;
  int64_t size;
  void *stream;
  int n_events;
  void *events[4]; /* cudaEvent_t, pending until all complete */
  struct fblock *next;
} fblock_t;

typedef struct devstate {
  dl_mem_stats_t st;
  int64_t tag_cur[MAX_TAGS];
  int64_t tag_peak[MAX_TAGS];
  int64_t tag_at_peak[MAX_TAGS];
  fblock_t *free_list; /* sorted by size */
  fblock_t *pending;   /* waiting for events of other streams */
} devstate_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static devstate_t devs[N_DEVS];
static char *tag_names[MAX_TAGS] = {"untagged"};
static int n_tags = 1;
static int tag_stack[MAX_TAG_DEPTH];
static int tag_depth;

static dl_mem_event_t *trace;
static int64_t trace_cap, trace_n, trace_head;

static devstate_t *dev_of(int dev_type, int dev_index) {
  if (dev_type == DL_CPU) return &devs[0];
  if (dev_type == DL_META) return &devs[1];
  return dev_index >= 0 && dev_index < MAX_CUDA ? &devs[2 + dev_index] : NULL;
}

/* ---- tags ----------------------------------------------------------------- */

int dl_mem_tag_push(const char *name) {
  DL_CHECK_ARG(name && *name, "memory tag name is empty");
  DL_CHECK_ARG(strlen(name) < 128, "memory tag name longer than 127 characters");
  pthread_mutex_lock(&mu);
  int rc = DL_OK, id = -1;
  for (int i = 0; i < n_tags; i++)
    if (strcmp(tag_names[i], name) == 0) id = i;
  if (tag_depth >= MAX_TAG_DEPTH) {
    rc = DL_ERR(DL_EINVAL, "memory tags nested deeper than %d (a tag pushed but never popped?)",
                MAX_TAG_DEPTH);
  } else if (id < 0) {
    if (n_tags >= MAX_TAGS) {
      rc = DL_ERR(DL_EINVAL, "more than %d distinct memory tag names", MAX_TAGS);
    } else {
      tag_names[n_tags] = strdup(name);
      if (!tag_names[n_tags]) rc = DL_ERR(DL_ENOMEM, "out of host memory for a tag name");
      else id = n_tags++;
    }
  }
  if (rc == DL_OK) tag_stack[tag_depth++] = id;
  pthread_mutex_unlock(&mu);
  return rc < 0 ? rc : id;
}

int dl_mem_tag_pop(void) {
  pthread_mutex_lock(&mu);
  int rc = tag_depth > 0 ? DL_OK : DL_ERR(DL_ESTATE, "memory tag pop without a push");
  if (tag_depth > 0) tag_depth--;
  pthread_mutex_unlock(&mu);
  return rc;
}

int dl_mem_tag_count(void) { return n_tags; }

const char *dl_mem_tag_name(int tag) { return tag >= 0 && tag < n_tags ? tag_names[tag] : NULL; }

/* ---- accounting (mu held) ---------------------------------------------- */

/* An allocation (alloc) of bytes >= 0, or a free of -bytes: a zero-sized
 * storage counts as an allocation and a free like any other. */
static void charge(devstate_t *d, int dev_type, int dev_index, int tag, int64_t bytes, int alloc) {
  d->st.allocated += bytes;
  d->tag_cur[tag] += bytes;
  if (d->tag_cur[tag] > d->tag_peak[tag]) d->tag_peak[tag] = d->tag_cur[tag];
  if (alloc) {
    d->st.n_allocs++;
    if (d->st.allocated > d->st.allocated_peak) {
      d->st.allocated_peak = d->st.allocated;
      memcpy(d->tag_at_peak, d->tag_cur, sizeof(int64_t) * (size_t)n_tags);
    }
  } else {
    d->st.n_frees++;
  }
  if (trace_cap > 0) {
    dl_mem_event_t *ev = &trace[trace_head];
    ev->t_us = dl_now_us();
    ev->dev_type = dev_type;
    ev->dev_index = dev_index;
    ev->tag = tag;
    ev->pad = 0;
    ev->bytes = bytes;
    ev->allocated = d->st.allocated;
    trace_head = (trace_head + 1) % trace_cap;
    if (trace_n < trace_cap) trace_n++;
  }
}

static void reserve(devstate_t *d, int64_t bytes) {
  d->st.reserved += bytes;
  if (d->st.reserved > d->st.reserved_peak) d->st.reserved_peak = d->st.reserved;
}

/* ---- cuda pools (mu held) ---------------------------------------------- */

#ifdef DL_WITH_CUDA
static int64_t round_cuda(int64_t n) {
  if (n <= 0) return 0;
  if (n < (1 << 20)) return (n + 511) & ~(int64_t)511;
  return (n + (2 << 20) - 1) & ~(int64_t)((2 << 20) - 1);
}

static void insert_free(devstate_t *d, fblock_t *b) {
  fblock_t **pp = &d->free_list;
  while (*pp && (*pp)->size < b->size) pp = &(*pp)->next;
  b->next = *pp;
  *pp = b;
}

/* Move pending blocks whose events have all completed to the free list. */
static void collect_pending(devstate_t *d) {
  fblock_t **pp = &d->pending;
  while (*pp) {
    fblock_t *b = *pp;
    int done = 1;
    for (int i = 0; i < b->n_events; i++) {
      cudaError_t e = cudaEventQuery((cudaEvent_t)b->events[i]);
      if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        done = 0;
      }
    }
    if (!done) {
      pp = &b->next;
      continue;
    }
    for (int i = 0; i < b->n_events; i++) cudaEventDestroy((cudaEvent_t)b->events[i]);
    b->n_events = 0;
    *pp = b->next;
    insert_free(d, b);
  }
}

/* A cached block of this stream, at least `size` and not much larger. */
static fblock_t *take_free(devstate_t *d, int64_t size, void *stream) {
  int64_t limit = size < (1 << 20) ? size : size + size / 8 + (2 << 20);
  for (fblock_t **pp = &d->free_list; *pp; pp = &(*pp)->next) {
    fblock_t *b = *pp;
    if (b->size > limit) break;
    if (b->size >= size && b->stream == stream) {
      *pp = b->next;
      return b;
    }
  }
  return NULL;
}

static void release_cached(devstate_t *d) {
  while (d->free_list) {
    fblock_t *b = d->free_list;
    d->free_list = b->next;
    cudaFree(b->ptr);
    d->st.reserved -= b->size;
    free(b);
  }
}
#endif

/* ---- storages ------------------------------------------------------------ */

/* A storage record with one reference and no memory yet. */
static int storage_record(int dev_type, int dev_index, int64_t nbytes, dl_storage_t **out) {
  DL_TRY(dl_device_check(dev_type, dev_index));
  dl_storage_t *s = calloc(1, sizeof *s);
  if (!s) return DL_ERR(DL_ENOMEM, "out of host memory for a storage");
  s->refs = 1;
  s->dev_type = dev_type;
  s->dev_index = dev_index;
  s->nbytes = nbytes;
  *out = s;
  return DL_OK;
}

int dl_storage_new(int dev_type, int dev_index, int64_t nbytes, void *stream, dl_storage_t **out) {
  DL_CHECK_ARG(nbytes >= 0, "negative allocation size %lld", (long long)nbytes);
  dl_storage_t *s = NULL;
  DL_TRY(storage_record(dev_type, dev_index, nbytes, &s));
  s->charged = nbytes;
  s->stream = stream;
  devstate_t *d = dev_of(dev_type, dev_index);
  if (!d) {
    free(s);
    return DL_ERR(DL_ENODEV, "cuda:%d is beyond the %d devices distlab tracks", dev_index, MAX_CUDA);
  }
  if (dev_type == DL_CPU && nbytes > 0) {
    s->ptr = aligned_alloc(64, (size_t)((nbytes + 63) & ~(int64_t)63));
    if (!s->ptr) {
      free(s);
      return DL_ERR(DL_ENOMEM, "out of host memory allocating %lld bytes on cpu", (long long)nbytes);
    }
    s->block = nbytes;
  }
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA && nbytes > 0) {
    int64_t size = round_cuda(nbytes);
    s->charged = (nbytes + 511) & ~(int64_t)511;
    pthread_mutex_lock(&mu);
    collect_pending(d);
    fblock_t *b = take_free(d, size, stream);
    if (b) d->st.n_cache_hits++;
    pthread_mutex_unlock(&mu);
    if (!b) {
      int rc = dl_cuda_use(dev_index);
      void *p = NULL;
      cudaError_t e = rc ? cudaSuccess : cudaMalloc(&p, (size_t)size);
      if (!rc && e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        pthread_mutex_lock(&mu);
        release_cached(d);
        pthread_mutex_unlock(&mu);
        e = cudaMalloc(&p, (size_t)size);
      }
      if (!rc && e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        rc = DL_ERR(e == cudaErrorMemoryAllocation ? DL_ENOMEM : DL_ECUDA,
                    "cudaMalloc of %lld bytes on cuda:%d failed (%s); allocated %.1f MiB, "
                    "reserved %.1f MiB, device free %.1f of %.1f MiB",
                    (long long)size, dev_index, cudaGetErrorString(e), d->st.allocated / 1048576.0,
                    d->st.reserved / 1048576.0, fr / 1048576.0, tot / 1048576.0);
      }
      if (!rc && !(b = calloc(1, sizeof *b))) {
        cudaFree(p);
        rc = DL_ERR(DL_ENOMEM, "out of host memory for a block record");
      }
      if (rc) {
        free(s);
        return rc;
      }
      b->ptr = p;
      b->size = size;
      b->stream = stream;
      pthread_mutex_lock(&mu);
      reserve(d, size);
      d->st.n_device_allocs++;
      pthread_mutex_unlock(&mu);
    }
    s->ptr = b->ptr;
    s->block = b->size;
    free(b);
  }
#endif
  pthread_mutex_lock(&mu);
  s->tag = tag_depth ? tag_stack[tag_depth - 1] : 0;
  if (dev_type != DL_CUDA) {
    reserve(d, s->charged);
    if (nbytes > 0) d->st.n_device_allocs++;
  }
  charge(d, dev_type, dev_index, s->tag, s->charged, 1);
  pthread_mutex_unlock(&mu);
  *out = s;
  return DL_OK;
}

int dl_storage_wrap(int dev_type, int dev_index, void *ptr, int64_t nbytes,
                    void (*release)(void *ctx), void *ctx, dl_storage_t **out) {
  DL_CHECK_ARG(nbytes >= 0 && release, "wrap: bad size or no release function");
  dl_storage_t *s = NULL;
  DL_TRY(storage_record(dev_type, dev_index, nbytes, &s));
  s->ptr = ptr;
  s->release = release;
  s->ctx = ctx;
  *out = s;
  return DL_OK;
}

void dl_storage_retain(dl_storage_t *s) {
  if (s) __atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
}

void dl_storage_release(dl_storage_t *s) {
  if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
  if (s->release) {
    s->release(s->ctx);
    free(s);
    return;
  }
  devstate_t *d = dev_of(s->dev_type, s->dev_index);
  pthread_mutex_lock(&mu);
  charge(d, s->dev_type, s->dev_index, s->tag, -s->charged, 0);
  if (s->dev_type != DL_CUDA) d->st.reserved -= s->charged;
  pthread_mutex_unlock(&mu);
  if (s->dev_type == DL_CPU) free(s->ptr);
#ifdef DL_WITH_CUDA
  if (s->dev_type == DL_CUDA && s->ptr) {
    fblock_t *b = calloc(1, sizeof *b);
    if (!b) { /* cannot cache it: give it back to the driver */
      cudaFree(s->ptr);
      pthread_mutex_lock(&mu);
      d->st.reserved -= s->block;
      pthread_mutex_unlock(&mu);
    } else {
      b->ptr = s->ptr;
      b->size = s->block;
      b->stream = s->stream;
      for (int i = 0; i < s->n_uses; i++) {
        cudaEvent_t ev;
        if (dl_cuda_use(s->dev_index) == DL_OK &&
            cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
            cudaEventRecord(ev, (cudaStream_t)s->uses[i]) == cudaSuccess)
          b->events[b->n_events++] = ev;
        else
          cudaDeviceSynchronize(); /* cannot fence: make the reuse safe the slow way */
      }
      pthread_mutex_lock(&mu);
      if (b->n_events) {
        b->next = d->pending;
        d->pending = b;
      } else {
        insert_free(d, b);
      }
      pthread_mutex_unlock(&mu);
    }
  }
#endif
  free(s);
}

int dl_storage_record_stream(dl_storage_t *s, void *stream) {
  if (s->dev_type != DL_CUDA || stream == s->stream) return DL_OK;
  for (int i = 0; i < s->n_uses; i++)
    if (s->uses[i] == stream) return DL_OK;
  if (s->n_uses == 4)
    return DL_ERR(DL_EINVAL, "a tensor recorded on more than 4 extra streams; synchronize instead");
  s->uses[s->n_uses++] = stream;
  return DL_OK;
}

int dl_mem_charge(int dev_type, int dev_index, int64_t bytes, int *tag) {
  DL_CHECK_ARG(bytes >= 0 && tag, "dl_mem_charge: bad arguments");
  DL_TRY(dl_device_check(dev_type, dev_index));
  devstate_t *d = dev_of(dev_type, dev_index);
  if (!d) return DL_ERR(DL_ENODEV, "cuda:%d is beyond the %d devices distlab tracks", dev_index, MAX_CUDA);
  pthread_mutex_lock(&mu);
  *tag = tag_depth ? tag_stack[tag_depth - 1] : 0;
  reserve(d, bytes);
  if (bytes > 0) charge(d, dev_type, dev_index, *tag, bytes, 1);
  pthread_mutex_unlock(&mu);
  return DL_OK;
}

void dl_mem_uncharge(int dev_type, int dev_index, int tag, int64_t bytes) {
  devstate_t *d = dev_of(dev_type, dev_index);
  if (!d || bytes <= 0 || tag < 0 || tag >= n_tags) return;
  pthread_mutex_lock(&mu);
  charge(d, dev_type, dev_index, tag, -bytes, 0);
  d->st.reserved -= bytes;
  pthread_mutex_unlock(&mu);
}

/* ---- stats ---------------------------------------------------------------- */

int dl_mem_stats(int dev_type, int dev_index, dl_mem_stats_t *out) {
  DL_CHECK_ARG(out, "out is NULL");
  DL_TRY(dl_device_check(dev_type, dev_index));
  devstate_t *d = dev_of(dev_type, dev_index);
  pthread_mutex_lock(&mu);
  *out = d->st;
  pthread_mutex_unlock(&mu);
  out->driver_free = out->driver_total = out->untracked = -1;
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) {
    size_t fr, tot;
    DL_TRY(dl_cuda_use(dev_index));
    DL_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    out->driver_free = (int64_t)fr;
    out->driver_total = (int64_t)tot;
    out->untracked = (int64_t)(tot - fr) - out->reserved;
  }
#endif
  return DL_OK;
}

int dl_mem_reset_peak(int dev_type, int dev_index) {
  DL_TRY(dl_device_check(dev_type, dev_index));
  devstate_t *d = dev_of(dev_type, dev_index);
  pthread_mutex_lock(&mu);
  d->st.allocated_peak = d->st.allocated;
  d->st.reserved_peak = d->st.reserved;
  memcpy(d->tag_peak, d->tag_cur, sizeof d->tag_peak);
  memcpy(d->tag_at_peak, d->tag_cur, sizeof d->tag_at_peak);
  pthread_mutex_unlock(&mu);
  return DL_OK;
}

int dl_mem_empty_cache(int dev_type, int dev_index) {
  DL_TRY(dl_device_check(dev_type, dev_index));
#ifdef DL_WITH_CUDA
  if (dev_type == DL_CUDA) {
    devstate_t *d = dev_of(dev_type, dev_index);
    DL_TRY(dl_cuda_use(dev_index));
    pthread_mutex_lock(&mu);
    collect_pending(d);
    release_cached(d);
    pthread_mutex_unlock(&mu);
  }
#endif
  return DL_OK;
}

int dl_mem_tag_stats(int dev_type, int dev_index, int tag, int64_t *current, int64_t *peak,
                     int64_t *at_peak) {
  DL_TRY(dl_device_check(dev_type, dev_index));
  DL_CHECK_ARG(tag >= 0 && tag < n_tags, "no memory tag with id %d", tag);
  devstate_t *d = dev_of(dev_type, dev_index);
  pthread_mutex_lock(&mu);
  if (current) *current = d->tag_cur[tag];
  if (peak) *peak = d->tag_peak[tag];
  if (at_peak) *at_peak = d->tag_at_peak[tag];
  pthread_mutex_unlock(&mu);
  return DL_OK;
}

int dl_mem_trace_enable(int64_t capacity) {
  DL_CHECK_ARG(capacity >= 0 && capacity <= (1 << 26), "trace capacity %lld out of [0, 2^26]",
               (long long)capacity);
  dl_mem_event_t *buf = NULL;
  if (capacity > 0 && !(buf = calloc((size_t)capacity, sizeof *buf)))
    return DL_ERR(DL_ENOMEM, "out of host memory for a trace of %lld events", (long long)capacity);
  pthread_mutex_lock(&mu);
  free(trace);
  trace = buf;
  trace_cap = capacity;
  trace_n = trace_head = 0;
  pthread_mutex_unlock(&mu);
  return DL_OK;
}

/* LuaJIT unloads the library when its state closes: give back what the
 * allocator keeps for the process's lifetime (tag names, the trace). */
__attribute__((destructor)) static void alloc_unload(void) {
  for (int i = 1; i < n_tags; i++) free(tag_names[i]);
  n_tags = 1;
  free(trace);
  trace = NULL;
  trace_cap = trace_n = trace_head = 0;
}

int dl_mem_trace_read(dl_mem_event_t *buf, int64_t max, int64_t *n) {
  DL_CHECK_ARG(n && (buf || max == 0), "NULL argument");
  pthread_mutex_lock(&mu);
  int64_t k = trace_n < max ? trace_n : max;
  int64_t start = (trace_head - trace_n + trace_cap) % (trace_cap ? trace_cap : 1);
  for (int64_t i = 0; i < k; i++) buf[i] = trace[(start + i) % trace_cap];
  *n = k;
  pthread_mutex_unlock(&mu);
  return DL_OK;
}
