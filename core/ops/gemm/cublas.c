/*
 * cublas.c — the grouped GEMM's cuBLAS path: every expert's GEMM in one
 * cublasGemmGroupedBatchedEx (cuBLAS 12.5 or newer), libcublas opened at run
 * time as cublaslt.c opens cuBLASLt.
 *
 * Candidates, in order: libcublas.so.13 and .so.12 on the loader's paths,
 * then the same names in the folder of the libcudart we run with. A missing library or symbol (an
 * older cuBLAS has no cublasGemmGroupedBatchedEx) is an error naming the
 * file and what to do; every cuBLAS status is checked and reported by name.
 *
 * Each expert's GEMM is mapped onto column-major cuBLAS as dl_gemm maps one
 * GEMM (dl_gemm_lt_map: a row-major result is computed transposed, each
 * operand op N or op T from its own strides); consecutive experts of one
 * shape make one cuBLAS group (uniform counts: a single group of E problems). The problem sizes, ops,
 * leading dimensions and scalars are host arrays; the A, B and C pointer
 * arrays are device memory that dl_gemm_pointers_cuda writes on the stream
 * (kernels/gemm/gemm_grouped.cu). The handle's workspace is the caller's
 * (from the allocator, under "gemm_workspace"), set before every call. The
 * math mode forbids reduced-precision reductions, so split-K partial sums
 * stay fp32 as dl_gemm's do (cublaslt.c says why that matters).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "gemm_cublas.h"
#include "gemm_lt.h"

#ifdef DL_WITH_CUDA

#include <cublas_api.h>

enum { MAX_DEVS = 16 };

static struct {
  void *lib;
  char path[512];
  int64_t version;
  cublasStatus_t (*Create)(cublasHandle_t *);
  cublasStatus_t (*GetProperty)(libraryPropertyType, int *);
  const char *(*GetStatusName)(cublasStatus_t);
  cublasStatus_t (*SetStream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*SetWorkspace)(cublasHandle_t, void *, size_t);
  cublasStatus_t (*SetMathMode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*GemmGroupedBatchedEx)(cublasHandle_t, const cublasOperation_t[],
                                         const cublasOperation_t[], const int[], const int[],
                                         const int[], const void *, const void *const[],
                                         cudaDataType_t, const int[], const void *const[],
                                         cudaDataType_t, const int[], const void *,
                                         void *const[], cudaDataType_t, const int[], int,
                                         const int[], cublasComputeType_t);
} cb;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cublasHandle_t handles[MAX_DEVS];
static int64_t n_calls;

static const char *status_name(cublasStatus_t st) {
  const char *s = cb.GetStatusName ? cb.GetStatusName(st) : NULL;
  return s ? s : "unknown status";
}

#define CB_CHECK(expr)                                                                        \
  do {                                                                                        \
    cublasStatus_t cb_st_ = (expr);                                                           \
    if (cb_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return DL_ERR(DL_ECUDA, "%s failed: %s (%d)", #expr, status_name(cb_st_), (int)cb_st_); \
  } while (0)

/* ---- the library ---------------------------------------------------------- */

static int try_open(const char *name, char *tried, size_t tlen) {
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    cb.lib = lib;
    snprintf(cb.path, sizeof cb.path, "%s", name);
    return 1;
  }
  size_t used = strlen(tried);
  snprintf(tried + used, tlen - used, "\n  %s", dlerror());
  return 0;
}

static int bind_symbols(void) {
  int rc = DL_OK;
#define SYM(field, name)                                                                      \
  if (rc == DL_OK && !(*(void **)&cb.field = dlsym(cb.lib, name)))                           \
    rc = DL_ERR(DL_EUNSUPPORTED, "%s lacks %s (the grouped GEMM needs cuBLAS 12.5 or newer)", \
                cb.path, name);
  SYM(Create, "cublasCreate_v2") SYM(GetProperty, "cublasGetProperty")
  SYM(GetStatusName, "cublasGetStatusName") SYM(SetStream, "cublasSetStream_v2")
  SYM(SetWorkspace, "cublasSetWorkspace_v2") SYM(SetMathMode, "cublasSetMathMode")
  SYM(GemmGroupedBatchedEx, "cublasGemmGroupedBatchedEx")
#undef SYM
  if (rc == DL_OK) {
    int v[3] = {0, 0, 0};
    for (int i = 0; i < 3 && rc == DL_OK; i++)
      if (cb.GetProperty((libraryPropertyType)i, &v[i]) != CUBLAS_STATUS_SUCCESS)
        rc = DL_ERR(DL_ECUDA, "%s: cublasGetProperty(%d) failed", cb.path, i);
    cb.version = (int64_t)v[0] * 10000 + v[1] * 100 + v[2];
  }
  return rc;
}

/* Called with mu held. */
static int load(void) {
  if (cb.lib) return DL_OK;
  char tried[2048] = "", dir[400];
  static const char *names[] = {"libcublas.so.13", "libcublas.so.12"};
  int found = 0;
  dl_gemm_cudart_dir(dir, sizeof dir);
  for (int i = 0; i < 2 && !found; i++) found = try_open(names[i], tried, sizeof tried);
  for (int i = 0; i < 2 && !found && dir[0]; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    found = try_open(path, tried, sizeof tried);
  }
  if (!found)
    return DL_ERR(DL_EUNSUPPORTED, "cannot load cuBLAS (libcublas), which the grouped GEMM's "
                  "cublas backend needs; tried:%s\ninstall the CUDA toolkit's cuBLAS, put the "
                  "folder of libcublas.so.13 on LD_LIBRARY_PATH, or take backend \"loop\" "
                  "(cuBLASLt alone)", tried);
  int rc = bind_symbols();
  if (rc) {
    dlclose(cb.lib);
    memset(&cb, 0, sizeof cb);
  }
  return rc;
}

/* ---- the grouped call ------------------------------------------------------- */

static cudaDataType_t cuda_type(int dt) {
  return dt == DL_BF16 ? CUDA_R_16BF : dt == DL_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The host arrays of one call: ops, sizes, leading dimensions, scalars, group
 * sizes and the 3n pointers, in one block. */
typedef struct arrays {
  cublasOperation_t *ta, *tb;
  int *m, *n, *k, *lda, *ldb, *ldc, *size;
  float *alpha, *beta;
  void **ptr;
} arrays_t;

static void *arrays_new(int64_t n, arrays_t *a) {
  const size_t each = (size_t)n;
  char *blk = malloc(each * (2 * sizeof(cublasOperation_t) + 7 * sizeof(int) + 2 * sizeof(float) +
                             3 * sizeof(void *)));
  if (!blk) return NULL;
  char *p = blk;
  a->ptr = (void **)p, p += 3 * each * sizeof(void *);
  a->ta = (cublasOperation_t *)p, p += each * sizeof(cublasOperation_t);
  a->tb = (cublasOperation_t *)p, p += each * sizeof(cublasOperation_t);
  int **ints[] = {&a->m, &a->n, &a->k, &a->lda, &a->ldb, &a->ldc, &a->size};
  for (int i = 0; i < 7; i++) *ints[i] = (int *)p, p += each * sizeof(int);
  a->alpha = (float *)p, p += each * sizeof(float);
  a->beta = (float *)p;
  return blk;
}

static int fill(const dl_gemm_args_t *g, int64_t n, arrays_t *a) {
  for (int64_t i = 0; i < n; i++) {
    dl_gemm_cm_t cm;
    int rc = dl_gemm_lt_map(&g[i], &cm);
    if (rc) return dl_error_context(rc, "grouped gemm, group %lld", (long long)i);
    DL_CHECK_ARG(g[i].batch <= 1, "grouped gemm (cublas): group %lld is a batch", (long long)i);
    DL_CHECK_ARG(g[i].c.data == g[i].d.data || g[i].beta == 0,
                 "grouped gemm (cublas): group %lld adds a c that is not its out", (long long)i);
    const int64_t dims[6] = {cm.rows, cm.cols, cm.k, cm.ldx, cm.ldy, cm.ldd};
    for (int d = 0; d < 6; d++)
      DL_CHECK_ARG(fits_int(dims[d]), "grouped gemm (cublas): group %lld has a size or leading "
                   "dimension of %lld, beyond cuBLAS's int", (long long)i, (long long)dims[d]);
    a->ta[i] = (cublasOperation_t)cm.opx;
    a->tb[i] = (cublasOperation_t)cm.opy;
    a->m[i] = (int)cm.rows, a->n[i] = (int)cm.cols, a->k[i] = (int)cm.k;
    a->lda[i] = (int)cm.ldx, a->ldb[i] = (int)cm.ldy, a->ldc[i] = (int)cm.ldd;
    a->size[i] = 1;
    a->alpha[i] = (float)g[i].alpha, a->beta[i] = (float)g[i].beta;
    a->ptr[i] = (void *)cm.x;
    a->ptr[n + i] = (void *)cm.y;
    a->ptr[2 * n + i] = cm.d;
  }
  return DL_OK;
}

/* Consecutive problems of one shape, ops, leading dimensions and scalars into
 * one group (every expert alike: one group of E); the pointers stay one per
 * problem, in order. Returns the number of groups. */
static int64_t merge_groups(arrays_t *a, int64_t n) {
  int64_t groups = 0;
  for (int64_t i = 0; i < n; i++) {
    const int64_t j = groups - 1;
    if (groups > 0 && a->ta[i] == a->ta[j] && a->tb[i] == a->tb[j] && a->m[i] == a->m[j] &&
        a->n[i] == a->n[j] && a->k[i] == a->k[j] && a->lda[i] == a->lda[j] &&
        a->ldb[i] == a->ldb[j] && a->ldc[i] == a->ldc[j] && a->alpha[i] == a->alpha[j] &&
        a->beta[i] == a->beta[j]) {
      a->size[j]++;
      continue;
    }
    a->ta[groups] = a->ta[i], a->tb[groups] = a->tb[i];
    a->m[groups] = a->m[i], a->n[groups] = a->n[i], a->k[groups] = a->k[i];
    a->lda[groups] = a->lda[i], a->ldb[groups] = a->ldb[i], a->ldc[groups] = a->ldc[i];
    a->alpha[groups] = a->alpha[i], a->beta[groups] = a->beta[i];
    a->size[groups++] = 1;
  }
  return groups;
}

static int run_locked(const dl_gemm_args_t *g, int64_t n, int dev, void **ptrs, void *ws,
                      int64_t ws_bytes, void *stream) {
  DL_TRY(load());
  DL_CHECK_ARG(dev >= 0 && dev < MAX_DEVS, "grouped gemm: cuda:%d is beyond the %d devices "
               "handled", dev, MAX_DEVS);
  DL_CHECK_ARG(fits_int(n), "grouped gemm (cublas): %lld groups", (long long)n);
  if (!handles[dev]) {
    CB_CHECK(cb.Create(&handles[dev]));
    CB_CHECK(cb.SetMathMode(handles[dev], (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  arrays_t a;
  void *blk = arrays_new(n, &a);
  if (!blk) return DL_ERR(DL_ENOMEM, "grouped gemm: out of host memory for %lld groups", (long long)n);
  int rc = fill(g, n, &a);
  const int64_t groups = rc ? 0 : merge_groups(&a, n);
  if (!rc) rc = dl_gemm_pointers_cuda(ptrs, a.ptr, 3 * n, stream);
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const char *what = "cublasSetStream";
  if (!rc) st = cb.SetStream(handles[dev], (cudaStream_t)stream);
  if (!rc && st == CUBLAS_STATUS_SUCCESS)
    what = "cublasSetWorkspace", st = cb.SetWorkspace(handles[dev], ws, (size_t)ws_bytes);
  if (!rc && st == CUBLAS_STATUS_SUCCESS) {
    what = "cublasGemmGroupedBatchedEx";
    const int dt_in = g[0].a.dtype, dt_out = g[0].d.dtype;
    st = cb.GemmGroupedBatchedEx(handles[dev], a.ta, a.tb, a.m, a.n, a.k, a.alpha,
                                 (const void *const *)ptrs, cuda_type(dt_in), a.lda,
                                 (const void *const *)(ptrs + n), cuda_type(dt_in), a.ldb, a.beta,
                                 ptrs + 2 * n, cuda_type(dt_out), a.ldc, (int)groups, a.size,
                                 CUBLAS_COMPUTE_32F);
    /* a dtype combination it lacks: NOT_SUPPORTED, or INVALID_VALUE for an output type
     * that is not the inputs' (what the documentation's table leaves out) */
    if (st == CUBLAS_STATUS_NOT_SUPPORTED ||
        (st == CUBLAS_STATUS_INVALID_VALUE && dt_out != dt_in))
      rc = DL_ERR(DL_EUNSUPPORTED, "%s (%s) does not take %s x %s -> %s: %s (backend "
                  "\"loop\" does)", what, cb.path, dl_dtype_name(dt_in), dl_dtype_name(dt_in),
                  dl_dtype_name(dt_out), status_name(st));
    else if (st == CUBLAS_STATUS_SUCCESS)
      n_calls++;
  }
  if (!rc && st != CUBLAS_STATUS_SUCCESS)
    rc = DL_ERR(DL_ECUDA, "%s failed: %s (%d)", what, status_name(st), (int)st);
  free(blk);
  return rc;
}

int dl_gemm_cublas_grouped(const dl_gemm_args_t *g, int64_t n, int dev, void **ptrs, void *ws,
                           int64_t ws_bytes, void *stream) {
  pthread_mutex_lock(&mu);
  int rc = run_locked(g, n, dev, ptrs, ws, ws_bytes, stream);
  pthread_mutex_unlock(&mu);
  return rc;
}

void dl_gemm_cublas_stats(dl_gemm_stats_t *out) {
  pthread_mutex_lock(&mu);
  out->grouped_cublas = n_calls;
  out->cublas_version = cb.version;
  pthread_mutex_unlock(&mu);
}

#endif
