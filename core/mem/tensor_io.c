/*
 * tensor_io.c — a tensor's bytes to and from host memory and files, the
 * layer under dl.load / dl.save / dl.from_bytes / t:bytes()
 * (bindings/distlab/io.lua parses the .npy and .safetensors headers).
 *
 * A tensor's bytes are its elements in row-major order as the device holds
 * them (little-endian: every host distlab builds for is). The tensor must be
 * contiguous. cpu reads and writes its storage directly (a file read with
 * pread straight into the storage: no staging, no per-element work), cuda
 * moves the bytes through two pinned host buffers of at most 8 MiB each, in
 * turn, so the disk and the copy engine overlap, and waits for the stream
 * before returning. meta checks the sizes (and that a file holds the bytes)
 * and moves nothing, so a file's tensors can be "loaded" on meta for their
 * shapes and memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "base/device.h"

enum { STAGE_BYTES = 8 << 20 };

/* The contiguous view of t and its byte count, or an error naming op. */
static int bytes_of(const dl_tensor_t *t, const char *op, dl_view_t *v, int64_t *nbytes) {
  DL_TRY(dl_view_of(t, v));
  DL_CHECK_ARG(dl_view_is_contiguous(v), "%s: the tensor must be contiguous (use :contiguous())", op);
  *nbytes = v->numel * dl_dtype_size(t->dtype_id);
  return DL_OK;
}

/* Reverses the bytes of each esz-byte element (a big-endian file). */
static void swap_bytes(char *p, int64_t n, int esz) {
  if (esz == 1) return;
  for (int64_t i = 0; i + esz <= n; i += esz)
    for (int a = 0, b = esz - 1; a < b; a++, b--) {
      char c = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = c;
    }
}

/* ---- the host side of a transfer ------------------------------------------------ */

/* Where bytes come from or go to: host memory, or a file descriptor at an offset. */
typedef struct host_end {
  const char *op, *path;
  char *mem;      /* or NULL: fd */
  int fd;
  int64_t offset; /* of the first byte in the file */
} host_end_t;

static int end_read(const host_end_t *e, int64_t at, char *dst, int64_t n) {
  if (e->mem) {
    memcpy(dst, e->mem + at, (size_t)n);
    return DL_OK;
  }
  int64_t done = 0;
  while (done < n) {
    ssize_t r = pread(e->fd, dst + done, (size_t)(n - done), (off_t)(e->offset + at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return DL_ERR(DL_EIO, "%s: reading %s: %s", e->op, e->path, strerror(errno));
    if (r == 0)
      return DL_ERR(DL_EIO, "%s: %s ends at byte %lld, before the tensor's last byte %lld", e->op, e->path,
                    (long long)(e->offset + at + done), (long long)(e->offset + at + n - 1));
    done += r;
  }
  return DL_OK;
}

static int end_write(const host_end_t *e, int64_t at, const char *src, int64_t n) {
  if (e->mem) {
    memcpy(e->mem + at, src, (size_t)n);
    return DL_OK;
  }
  int64_t done = 0;
  while (done < n) {
    ssize_t w = write(e->fd, src + done, (size_t)(n - done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return DL_ERR(DL_EIO, "%s: writing %s: %s", e->op, e->path, strerror(errno));
    done += w;
  }
  return DL_OK;
}

/* ---- cuda: through pinned buffers ------------------------------------------------- */

#ifdef DL_WITH_CUDA
typedef struct stage {
  char *buf[2];
  cudaEvent_t done[2]; /* the copy that last used buf[i] */
  int64_t size;
} stage_t;

static void stage_free(stage_t *st) {
  for (int i = 0; i < 2; i++) {
    if (st->done[i]) cudaEventDestroy(st->done[i]);
    if (st->buf[i]) cudaFreeHost(st->buf[i]);
  }
}

static int stage_new(stage_t *st, int64_t nbytes) {
  memset(st, 0, sizeof *st);
  st->size = nbytes < STAGE_BYTES ? nbytes : STAGE_BYTES;
  for (int i = 0; i < 2; i++) {
    cudaError_t e = cudaHostAlloc((void **)&st->buf[i], (size_t)st->size, cudaHostAllocDefault);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&st->done[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      stage_free(st);
      return DL_ERR(DL_ECUDA, "pinned staging buffer of %lld bytes: %s", (long long)st->size,
                    cudaGetErrorString(e));
    }
  }
  return DL_OK;
}

/* Host -> device in chunks: read chunk i into buffer i%2 once its last copy is done. */
static int upload(char *dev, int64_t nbytes, const host_end_t *e, int swap_esz, cudaStream_t h) {
  stage_t st;
  DL_TRY(stage_new(&st, nbytes));
  int rc = DL_OK;
  for (int64_t at = 0, i = 0; at < nbytes && !rc; at += st.size, i++) {
    int64_t n = nbytes - at < st.size ? nbytes - at : st.size;
    char *b = st.buf[i % 2];
    cudaError_t ce = cudaEventSynchronize(st.done[i % 2]);
    if (ce == cudaSuccess) {
      if ((rc = end_read(e, at, b, n))) break;
      if (swap_esz) swap_bytes(b, n, swap_esz);
      ce = cudaMemcpyAsync(dev + at, b, (size_t)n, cudaMemcpyHostToDevice, h);
    }
    if (ce == cudaSuccess) ce = cudaEventRecord(st.done[i % 2], h);
    if (ce != cudaSuccess) {
      (void)cudaGetLastError();
      rc = DL_ERR(DL_ECUDA, "%s: copy to the device: %s", e->op, cudaGetErrorString(ce));
    }
  }
  cudaError_t ce = cudaStreamSynchronize(h);
  if (!rc && ce != cudaSuccess) {
    (void)cudaGetLastError();
    rc = DL_ERR(DL_ECUDA, "%s: copy to the device: %s", e->op, cudaGetErrorString(ce));
  }
  stage_free(&st);
  return rc;
}

/* Device -> host in chunks: the copy of chunk i+1 runs while chunk i is written out. */
static int download(const char *dev, int64_t nbytes, const host_end_t *e, cudaStream_t h) {
  stage_t st;
  DL_TRY(stage_new(&st, nbytes));
  int rc = DL_OK;
  int64_t nchunks = (nbytes + st.size - 1) / st.size;
  cudaError_t ce = cudaSuccess;
  for (int64_t i = 0; i <= nchunks && !rc; i++) {
    if (i < nchunks) { /* queue chunk i */
      int64_t at = i * st.size, n = nbytes - at < st.size ? nbytes - at : st.size;
      ce = cudaMemcpyAsync(st.buf[i % 2], dev + at, (size_t)n, cudaMemcpyDeviceToHost, h);
      if (ce == cudaSuccess) ce = cudaEventRecord(st.done[i % 2], h);
      if (ce != cudaSuccess) break;
    }
    if (i > 0) { /* write chunk i-1 */
      int64_t at = (i - 1) * st.size, n = nbytes - at < st.size ? nbytes - at : st.size;
      ce = cudaEventSynchronize(st.done[(i - 1) % 2]);
      if (ce != cudaSuccess) break;
      rc = end_write(e, at, st.buf[(i - 1) % 2], n);
    }
  }
  if (!rc && ce != cudaSuccess) {
    (void)cudaGetLastError();
    rc = DL_ERR(DL_ECUDA, "%s: copy from the device: %s", e->op, cudaGetErrorString(ce));
  }
  ce = cudaStreamSynchronize(h);
  if (!rc && ce != cudaSuccess) {
    (void)cudaGetLastError();
    rc = DL_ERR(DL_ECUDA, "%s: copy from the device: %s", e->op, cudaGetErrorString(ce));
  }
  stage_free(&st);
  return rc;
}
#endif

/* Moves t's nbytes between the device and the host end: into t (in = 1) or out of it. */
static int transfer(const dl_tensor_t *t, const dl_view_t *v, int64_t nbytes, const host_end_t *e, int in,
                    int swap, dl_stream_t *s) {
  if (nbytes == 0 || t->dev_type == DL_META) return DL_OK;
  int esz = swap ? dl_dtype_size(t->dtype_id) : 0;
  if (t->dev_type == DL_CPU) {
    int rc = in ? end_read(e, 0, v->data, nbytes) : end_write(e, 0, v->data, nbytes);
    if (!rc && in && esz) swap_bytes(v->data, nbytes, esz);
    return rc;
  }
#ifdef DL_WITH_CUDA
  void *h;
  DL_TRY(dl_cuda_use(t->dev_index));
  DL_TRY(dl_stream_for(s, t->dev_type, t->dev_index, &h));
  return in ? upload(v->data, nbytes, e, esz, (cudaStream_t)h) : download(v->data, nbytes, e, (cudaStream_t)h);
#else
  (void)s;
  return DL_ERR(DL_ENODEV, "%s: cpu-only build", e->op);
#endif
}

/* ---- the ABI ------------------------------------------------------------------------- */

int dl_tensor_from_host(dl_tensor_t *t, const void *src, int64_t nbytes, dl_stream_t *s) {
  const char *op = "from_bytes";
  dl_view_t v;
  int64_t need;
  DL_TRY(bytes_of(t, op, &v, &need));
  DL_CHECK_ARG(nbytes == need, "%s: %lld bytes given for a tensor of %lld bytes", op, (long long)nbytes,
               (long long)need);
  DL_CHECK_ARG(src || nbytes == 0, "%s: the source is NULL", op);
  host_end_t e = {.op = op, .path = "", .mem = (char *)src};
  return transfer(t, &v, need, &e, 1, 0, s);
}

int dl_tensor_to_host(const dl_tensor_t *t, void *dst, int64_t nbytes, dl_stream_t *s) {
  const char *op = "bytes";
  dl_view_t v;
  int64_t need;
  DL_TRY(bytes_of(t, op, &v, &need));
  DL_CHECK_ARG(t->dev_type != DL_META, "%s: a meta tensor holds no bytes", op);
  DL_CHECK_ARG(nbytes == need, "%s: a buffer of %lld bytes for a tensor of %lld bytes", op, (long long)nbytes,
               (long long)need);
  DL_CHECK_ARG(dst || nbytes == 0, "%s: the destination is NULL", op);
  host_end_t e = {.op = op, .path = "", .mem = dst};
  return transfer(t, &v, need, &e, 0, 0, s);
}

int dl_tensor_read_file(dl_tensor_t *t, const char *path, int64_t offset, int swap, dl_stream_t *s) {
  const char *op = "load";
  dl_view_t v;
  int64_t need;
  DL_CHECK_ARG(path, "%s: path is NULL", op);
  DL_TRY(bytes_of(t, op, &v, &need));
  DL_CHECK_ARG(offset >= 0, "%s: negative offset %lld in %s", op, (long long)offset, path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return DL_ERR(DL_EIO, "%s: cannot open %s: %s", op, path, strerror(errno));
  struct stat sb;
  int rc = DL_OK;
  if (fstat(fd, &sb) != 0)
    rc = DL_ERR(DL_EIO, "%s: %s: %s", op, path, strerror(errno));
  else if ((int64_t)sb.st_size < offset + need)
    rc = DL_ERR(DL_EIO, "%s: %s has %lld bytes; the tensor needs bytes %lld..%lld", op, path,
                (long long)sb.st_size, (long long)offset, (long long)(offset + need - 1));
  if (!rc) {
    host_end_t e = {.op = op, .path = path, .fd = fd, .offset = offset};
    rc = transfer(t, &v, need, &e, 1, swap, s);
  }
  close(fd);
  return rc;
}

int dl_tensor_append_file(const dl_tensor_t *t, const char *path, dl_stream_t *s) {
  const char *op = "save";
  dl_view_t v;
  int64_t need;
  DL_CHECK_ARG(path, "%s: path is NULL", op);
  DL_TRY(bytes_of(t, op, &v, &need));
  DL_CHECK_ARG(t->dev_type != DL_META, "%s: a meta tensor holds no bytes to write", op);
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return DL_ERR(DL_EIO, "%s: cannot open %s: %s", op, path, strerror(errno));
  host_end_t e = {.op = op, .path = path, .fd = fd};
  int rc = transfer(t, &v, need, &e, 0, 0, s);
  if (close(fd) != 0 && !rc) rc = DL_ERR(DL_EIO, "%s: closing %s: %s", op, path, strerror(errno));
  return rc;
}
