/*
 * cublaslt.c — dl_gemm on cuda: cuBLASLt, opened at run time.
 *
 * The library is dlopen'ed at the first GEMM on a GPU, so libdistlab loads
 * (and everything but GPU GEMMs works) where cuBLAS is absent. Candidates,
 * in order: $DISTLAB_CUBLASLT (a file name or path), libcublasLt.so.13 and
 * .so.12 on the loader's paths, then the same names in the folder of the
 * libcudart this library runs with (CUDA installs them side by side; our
 * RUNPATH does not reach dlopen). A missing library, symbol or too old a
 * version (cuBLASLt 12 or newer) is an error naming the library and what to
 * do. Every cuBLASLt status is checked and reported by name.
 *
 * Row-major tensors map onto column-major cuBLASLt without copies: a matrix
 * with unit column stride is the transpose of a column-major one, so
 * d = a @ b is computed as d^T = b^T a^T when d is row-major (and as
 * d = a b when d is column-major); each operand gets op N or op T from its
 * own strides, so transposed views cost nothing.
 *
 * The algorithm: for each (device, dtypes, ops, m, n, k, leading
 * dimensions, pointer alignments) the first result of
 * cublasLtMatmulAlgoGetHeuristic (its results come ordered by estimated
 * time) that fits a DL_GEMM_WORKSPACE_BYTES workspace (32 MiB: what
 * PyTorch gives cuBLAS on Hopper) and keeps every partial sum in fp32. A
 * split-K algorithm may add its K-slices' partial results in the output
 * type (reduction schemes INPLACE and OUTPUT_TYPE: bf16 partials), which is
 * not fp32 accumulation: on an H100 a bf16 300x700x500 GEMM had a tenth of
 * its elements off by more than fp32 sums allow (0.03 at |c| = 0.34, 15
 * bf16 units there), what rounding partial sums of size ~20 to bf16 gives.
 * So the preference allows only COMPUTE_TYPE reductions (fp32 partials in
 * the workspace; no split-K is scheme NONE), and a candidate whose
 * configuration says otherwise is skipped. The choice is made once and
 * cached with the descriptors (CACHE entries, least recently used out), so
 * a repeated shape costs no heuristic query and no descriptor creation. A
 * MoE step's grouped GEMMs alone bring 6 shapes an expert (64 experts: 384):
 * with 256 entries they went round the cache and missed every call (8-15 ms
 * of host time a 64-expert grouped GEMM on an H200, block-h200x2.md), so
 * the cache holds 4096, found through a hash index (linear probing over
 * twice as many slots; an evicted entry's slot is deleted by shifting back).
 * Alignments are part of the key because cuBLASLt assumes 256-byte aligned
 * pointers unless told: a kernel chosen for aligned rows must never see a
 * view at an odd offset.
 *
 * A batch (dl_gemm_args_t.batch > 1: the grouped GEMM's experts of one
 * shape, evenly spaced) is one strided-batched cublasLtMatmul: the layouts
 * carry the batch count and each operand's stride, and the strides (with
 * their alignment: every matrix of the batch must meet what the kernel may
 * assume) are part of the key.
 *
 * c in place (c is d) with a 16-bit d and beta != 0 runs on a copy of c
 * (run_on_copy; gemm_internal.h says why), here so that every caller gets it.
 *
 * Tuning (DISTLAB_GEMM_TUNE=N; a strided batch by default): core/ops/gemm/
 * cublaslt_tune.c times and checks the first N candidates at a configuration's
 * first call and keeps the fastest that agrees with the first; N, whether beta
 * is 0 and whether c is the output are part of the key.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "gemm_internal.h"
#include "gemm_lt.h"
#include "gemm_lt_tune.h"
#include "mem/alloc.h"

#ifdef DL_WITH_CUDA

#include <cublasLt.h>

enum { CACHE = 4096, SLOTS = 2 * CACHE, HEURISTIC_RESULTS = DL_LT_TUNE_MAX, MAX_DEVS = 16, MIN_MAJOR = 12, KEY = 25 };

static struct {
  void *lib;
  char path[512];
  size_t version;
  cublasStatus_t (*Create)(cublasLtHandle_t *);
  size_t (*GetVersion)(void);
  const char *(*GetStatusName)(cublasStatus_t);
  cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
  cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t);
  cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                           const void *, size_t);
  cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t,
                                       int64_t);
  cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t);
  cublasStatus_t (*MatrixLayoutSetAttribute)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t,
                                             const void *, size_t);
  cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t *);
  cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
  cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t,
                                                 cublasLtMatmulPreferenceAttributes_t, const void *,
                                                 size_t);
  cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                           cublasLtMatmulPreference_t, int,
                                           cublasLtMatmulHeuristicResult_t *, int *);
  cublasStatus_t (*MatmulAlgoConfigGetAttribute)(const cublasLtMatmulAlgo_t *,
                                                 cublasLtMatmulAlgoConfigAttributes_t, void *,
                                                 size_t, size_t *);
  cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                           cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                           const void *, const void *, cublasLtMatrixLayout_t, void *,
                           cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t,
                           cudaStream_t);
} lt;

/* One cached configuration: the key, its descriptors and algorithm. */
typedef struct entry {
  int64_t key[KEY];
  int used;
  int64_t last; /* lookups counter at its last use */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatmulAlgo_t algo;
} entry_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t handles[MAX_DEVS];
static entry_t cache[CACHE];
static int32_t slots[SLOTS]; /* the hash index: entry + 1, 0 empty */
static int64_t n_calls, n_heuristics, n_lookups;

static const char *status_name(cublasStatus_t st) {
  const char *s = lt.GetStatusName ? lt.GetStatusName(st) : NULL;
  return s ? s : "unknown status";
}

#define LT_CHECK(expr)                                                                        \
  do {                                                                                        \
    cublasStatus_t lt_st_ = (expr);                                                           \
    if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      return DL_ERR(DL_ECUDA, "%s failed: %s (%d)", #expr, status_name(lt_st_), (int)lt_st_); \
  } while (0)

/* ---- the library ---------------------------------------------------------- */

void dl_gemm_cudart_dir(char *buf, size_t len) {
  Dl_info info;
  buf[0] = 0;
  if (!dladdr((void *)cudaGetDeviceCount, &info) || !info.dli_fname) return;
  const char *slash = strrchr(info.dli_fname, '/');
  if (slash && (size_t)(slash - info.dli_fname) < len)
    snprintf(buf, len, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
}

static int try_open(const char *name, char *tried, size_t tlen) {
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    lt.lib = lib;
    snprintf(lt.path, sizeof lt.path, "%s", name);
    return 1;
  }
  size_t used = strlen(tried);
  snprintf(tried + used, tlen - used, "\n  %s", dlerror()); /* it names the file */
  return 0;
}

static int bind_symbols(void) {
  int rc = DL_OK;
#define SYM(f)                                                                               \
  if (rc == DL_OK && !(*(void **)&lt.f = dlsym(lt.lib, "cublasLt" #f)))                     \
    rc = DL_ERR(DL_EUNSUPPORTED, "%s lacks cublasLt" #f " (cuBLASLt too old? need %d or newer)", \
                lt.path, MIN_MAJOR);
  SYM(Create) SYM(GetVersion) SYM(GetStatusName) SYM(MatmulDescCreate) SYM(MatmulDescDestroy)
  SYM(MatmulDescSetAttribute) SYM(MatrixLayoutCreate) SYM(MatrixLayoutDestroy)
  SYM(MatrixLayoutSetAttribute)
  SYM(MatmulPreferenceCreate) SYM(MatmulPreferenceDestroy) SYM(MatmulPreferenceSetAttribute)
  SYM(MatmulAlgoGetHeuristic) SYM(MatmulAlgoConfigGetAttribute) SYM(Matmul)
#undef SYM
  if (rc == DL_OK) {
    lt.version = lt.GetVersion();
    if (lt.version / 10000 < MIN_MAJOR)
      rc = DL_ERR(DL_EUNSUPPORTED, "%s is cuBLASLt %zu.%zu.%zu; dl.gemm needs %d or newer", lt.path,
                  lt.version / 10000, lt.version / 100 % 100, lt.version % 100, MIN_MAJOR);
  }
  return rc;
}

/* Called with mu held. */
static int load(void) {
  if (lt.lib) return DL_OK;
  char tried[2048] = "", dir[400];
  const char *env = getenv("DISTLAB_CUBLASLT");
  int found = 0;
  if (env && *env) {
    found = try_open(env, tried, sizeof tried);
  } else {
    static const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12"};
    dl_gemm_cudart_dir(dir, sizeof dir);
    for (int i = 0; i < 2 && !found; i++) found = try_open(names[i], tried, sizeof tried);
    for (int i = 0; i < 2 && !found && dir[0]; i++) {
      char path[512];
      snprintf(path, sizeof path, "%s/%s", dir, names[i]);
      found = try_open(path, tried, sizeof tried);
    }
  }
  if (!found)
    return DL_ERR(DL_EUNSUPPORTED, "cannot load cuBLASLt (libcublasLt), which dl.gemm on cuda needs; "
                  "tried:%s\ninstall the CUDA toolkit's cuBLAS, put the folder of "
                  "libcublasLt.so.13 on LD_LIBRARY_PATH, or set DISTLAB_CUBLASLT to its path",
                  tried);
  int rc = bind_symbols();
  if (rc) {
    dlclose(lt.lib);
    memset(&lt, 0, sizeof lt);
  }
  return rc;
}

/* ---- operands -------------------------------------------------------------- */

/* How cuBLASLt sees matrix x (rows x cols, or its transpose when trans):
 * a column-major layout (lrows x lcols, leading dimension ld) and op N, or
 * the layout of its transpose and op T. A size-1 dimension takes any stride. */
typedef struct operand {
  int op;
  int64_t lrows, lcols, ld;
} operand_t;

static int operand(const char *name, const dl_gemm_mat_t *x, int64_t rows, int64_t cols,
                   int trans, operand_t *o) {
  int64_t r = rows, c = cols, rs = x->rs, cs = x->cs;
  if (trans) {
    r = cols, c = rows, rs = x->cs, cs = x->rs;
  }
  /* element (i, j) of the wanted r x c matrix is at i * rs + j * cs */
  if (rs == 1 || r == 1) {
    int64_t ld = c == 1 ? (r > 1 ? r : 1) : cs;
    if (ld >= (r > 1 ? r : 1)) {
      *o = (operand_t){CUBLAS_OP_N, r, c, ld};
      return DL_OK;
    }
  }
  if (cs == 1 || c == 1) {
    int64_t ld = r == 1 ? (c > 1 ? c : 1) : rs;
    if (ld >= (c > 1 ? c : 1)) {
      *o = (operand_t){CUBLAS_OP_T, c, r, ld};
      return DL_OK;
    }
  }
  return DL_ERR(DL_EINVAL, "gemm: %s has strides (%lld, %lld): cuBLASLt needs a unit stride in one "
                "dimension and the other at least that dimension's size (make it contiguous)",
                name, (long long)x->rs, (long long)x->cs);
}

static cudaDataType_t cuda_type(int dt) {
  return dt == DL_BF16 ? CUDA_R_16BF : dt == DL_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The largest power of two up to 256 that divides p (what a kernel may assume). */
static int64_t align_of(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int64_t a = 256;
  while (a > 1 && u % (uintptr_t)a) a /= 2;
  return a;
}

/* Whether algo keeps its partial sums in fp32: no split-K, or split-K
 * reduced in the compute type (see the header). */
static int fp32_partials(const cublasLtMatmulAlgo_t *algo) {
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_MASK;
  size_t written = 0;
  if (lt.MatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                      sizeof scheme, &written) != CUBLAS_STATUS_SUCCESS)
    return 0;
  return scheme == CUBLASLT_REDUCTION_SCHEME_NONE ||
         scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
}

/* ---- the cache --------------------------------------------------------------- */

static void entry_drop(entry_t *e) {
  if (e->desc) lt.MatmulDescDestroy(e->desc);
  if (e->la) lt.MatrixLayoutDestroy(e->la);
  if (e->lb) lt.MatrixLayoutDestroy(e->lb);
  if (e->lc) lt.MatrixLayoutDestroy(e->lc);
  if (e->ld) lt.MatrixLayoutDestroy(e->ld);
  memset(e, 0, sizeof *e);
}

/* A batch of `batch` matrices (> 1), each `stride` elements after the one before. */
static int layout_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  const int32_t count = (int32_t)batch;
  LT_CHECK(lt.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  LT_CHECK(lt.MatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                       sizeof stride));
  return DL_OK;
}

/* Descriptors for key's GEMM x (op) @ y (op) -> d, and the heuristic's first
 * algorithm that fits ws_bytes (with tune > 1: the fastest of its first tune).
 * bs: the batch and the strides of x, y, c, d ({1, ...}: one GEMM). */
static int entry_make(entry_t *e, cublasLtHandle_t h, const operand_t *x, const operand_t *y,
                      const operand_t *c, const operand_t *d, int in_dt, int out_dt, int64_t k,
                      const int64_t bs[5], const int64_t align[4], int64_t ws_bytes, int tune,
                      const dl_lt_tune_args_t *t) {
  const cublasOperation_t opx = (cublasOperation_t)x->op, opy = (cublasOperation_t)y->op;
  LT_CHECK(lt.MatmulDescCreate(&e->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof opx));
  LT_CHECK(lt.MatmulDescSetAttribute(e->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof opy));
  LT_CHECK(lt.MatrixLayoutCreate(&e->la, cuda_type(in_dt), x->lrows, x->lcols, x->ld));
  LT_CHECK(lt.MatrixLayoutCreate(&e->lb, cuda_type(in_dt), y->lrows, y->lcols, y->ld));
  LT_CHECK(lt.MatrixLayoutCreate(&e->lc, cuda_type(out_dt), c->lrows, c->lcols, c->ld));
  LT_CHECK(lt.MatrixLayoutCreate(&e->ld, cuda_type(out_dt), d->lrows, d->lcols, d->ld));
  if (bs[0] > 1) {
    DL_TRY(layout_batch(e->la, bs[0], bs[1]));
    DL_TRY(layout_batch(e->lb, bs[0], bs[2]));
    DL_TRY(layout_batch(e->lc, bs[0], bs[3]));
    DL_TRY(layout_batch(e->ld, bs[0], bs[4]));
  }
  cublasLtMatmulPreference_t pref = NULL;
  LT_CHECK(lt.MatmulPreferenceCreate(&pref));
  const uint64_t ws = (uint64_t)ws_bytes;
  const uint32_t al[4] = {(uint32_t)align[0], (uint32_t)align[1], (uint32_t)align[2],
                          (uint32_t)align[3]};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* and NONE, which is 0 */
  cublasStatus_t st =
      lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                         &reductions, sizeof reductions);
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = lt.MatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
  cublasLtMatmulHeuristicResult_t res[HEURISTIC_RESULTS];
  int got = 0;
  if (st == CUBLAS_STATUS_SUCCESS) {
    n_heuristics++;
    st = lt.MatmulAlgoGetHeuristic(h, e->desc, e->la, e->lb, e->lc, e->ld, pref, HEURISTIC_RESULTS,
                                   res, &got);
  }
  lt.MatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS)
    return DL_ERR(DL_ECUDA, "cublasLtMatmulAlgoGetHeuristic failed: %s (%d)", status_name(st),
                  (int)st);
  cublasLtMatmulAlgo_t cand[HEURISTIC_RESULTS];
  int n = 0;
  for (int i = 0; i < got && n < (tune > 1 ? tune : 1); i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= (size_t)ws_bytes &&
        fp32_partials(&res[i].algo))
      cand[n++] = res[i].algo;
  if (n > 0) {
    int best = 0;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (n > 1 && cudaStreamIsCapturing((cudaStream_t)t->stream, &cs) == cudaSuccess &&
        cs == cudaStreamCaptureStatusNone)
      DL_TRY(dl_lt_tune_pick((dl_lt_matmul_fn)lt.Matmul, h, e->desc, e->la, e->lb, e->lc, e->ld, cand,
                             n, t, ws_bytes, &best));
    (void)cudaGetLastError();
    e->algo = cand[best];
    return DL_OK;
  }
  return DL_ERR(DL_EUNSUPPORTED, "cuBLASLt has no algorithm with fp32 partial sums for %s x %s "
                "-> %s, op %c/%c, [%lld x %lld] (ld %lld) @ [%lld x %lld] (ld %lld), k = %lld, "
                "alignments %lld/%lld/%lld/%lld bytes (%d candidates)", dl_dtype_name(in_dt),
                dl_dtype_name(in_dt), dl_dtype_name(out_dt), opx == CUBLAS_OP_N ? 'N' : 'T',
                opy == CUBLAS_OP_N ? 'N' : 'T', (long long)x->lrows, (long long)x->lcols,
                (long long)x->ld, (long long)y->lrows, (long long)y->lcols, (long long)y->ld,
                (long long)k, (long long)align[0], (long long)align[1], (long long)align[2],
                (long long)align[3], got);
}

/* FNV-1a over the key's bytes: its home slot */
static uint32_t home(const int64_t key[KEY]) {
  const unsigned char *p = (const unsigned char *)key;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < sizeof(int64_t) * KEY; i++) h = (h ^ p[i]) * 16777619u;
  return h & (SLOTS - 1);
}

/* The slot holding entry i's index, or -1. */
static int slot_of(int i) {
  for (uint32_t s = home(cache[i].key), n = 0; n < SLOTS; s = (s + 1) & (SLOTS - 1), n++) {
    if (slots[s] == 0) return -1;
    if (slots[s] == i + 1) return (int)s;
  }
  return -1;
}

/* Delete slot s, shifting back the entries after it whose probe passed it. */
static void slot_delete(uint32_t s) {
  uint32_t hole = s;
  slots[hole] = 0;
  for (uint32_t j = (hole + 1) & (SLOTS - 1); slots[j]; j = (j + 1) & (SLOTS - 1)) {
    const uint32_t h = home(cache[slots[j] - 1].key);
    /* j's entry may move to the hole unless its home lies in (hole, j] */
    const int stays = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
    if (!stays) {
      slots[hole] = slots[j];
      slots[j] = 0;
      hole = j;
    }
  }
}

/* Entry e out of the index and dropped (its making failed). */
static void forget(entry_t *e) {
  const int s = slot_of((int)(e - cache));
  if (s >= 0) slot_delete((uint32_t)s);
  entry_drop(e);
}

/* The entry of key, made on a miss (the least recently used one goes). */
static int lookup(const int64_t key[KEY], entry_t **out, int *fresh) {
  n_lookups++;
  uint32_t s = home(key);
  for (; slots[s]; s = (s + 1) & (SLOTS - 1)) {
    entry_t *e = &cache[slots[s] - 1];
    if (!memcmp(e->key, key, sizeof e->key)) {
      e->last = n_lookups;
      *out = e;
      *fresh = 0;
      return DL_OK;
    }
  }
  /* a miss: a free entry, else the least recently used (its slot deleted first) */
  int v = 0;
  for (int i = 0; i < CACHE; i++) {
    if (!cache[i].used) {
      v = i;
      break;
    }
    if (cache[i].last < cache[v].last) v = i;
  }
  if (cache[v].used) {
    const int vs = slot_of(v);
    if (vs >= 0) slot_delete((uint32_t)vs);
  }
  entry_drop(&cache[v]);
  memcpy(cache[v].key, key, sizeof cache[v].key);
  cache[v].last = n_lookups;
  for (s = home(key); slots[s]; s = (s + 1) & (SLOTS - 1)) {
  }
  slots[s] = v + 1;
  *out = &cache[v];
  *fresh = 1;
  return DL_OK;
}

/* ---- one GEMM ----------------------------------------------------------------- */

/* How cuBLAS(Lt) sees g, column-major: d' = op(x) op(y), rows x cols, with
 * d' = d^T = b^T a^T when d is row-major (unit column stride), else d = a b.
 * The grouped GEMM's cuBLAS path maps each group with it too. */
typedef struct mapped {
  const dl_gemm_mat_t *x, *y;
  int64_t rows, cols;
  operand_t ox, oy, oc, od;
} mapped_t;

static int map_operands(const dl_gemm_args_t *g, mapped_t *mp) {
  const int rowmajor = !(g->d.rs == 1 && g->m > 1) && (g->d.cs == 1 || g->n == 1);
  mp->x = rowmajor ? &g->b : &g->a;
  mp->y = rowmajor ? &g->a : &g->b;
  mp->rows = rowmajor ? g->n : g->m;
  mp->cols = rowmajor ? g->m : g->n;
  /* row-major: x = b^T (n x k), y = a^T (k x m); else x = a (m x k), y = b (k x n) */
  DL_TRY(operand(rowmajor ? "b" : "a", mp->x, rowmajor ? g->k : g->m, rowmajor ? g->n : g->k,
                 rowmajor, &mp->ox));
  DL_TRY(operand(rowmajor ? "a" : "b", mp->y, rowmajor ? g->m : g->k, rowmajor ? g->k : g->n,
                 rowmajor, &mp->oy));
  DL_TRY(operand("out", &g->d, g->m, g->n, rowmajor, &mp->od));
  DL_TRY(operand("c", &g->c, g->m, g->n, rowmajor, &mp->oc));
  if (mp->od.op != CUBLAS_OP_N || mp->oc.op != CUBLAS_OP_N)
    return DL_ERR(DL_EINVAL, "gemm: out and c must have the same layout (both row-major or both "
                  "column-major)");
  return DL_OK;
}

int dl_gemm_lt_map(const dl_gemm_args_t *g, dl_gemm_cm_t *cm) {
  mapped_t mp;
  DL_TRY(map_operands(g, &mp));
  *cm = (dl_gemm_cm_t){mp.x->data, mp.y->data, g->d.data, mp.ox.op, mp.oy.op, mp.rows,
                       mp.cols, g->k, mp.ox.ld, mp.oy.ld, mp.od.ld};
  return DL_OK;
}

static int run_locked(const dl_gemm_args_t *g, int dev, void *ws, int64_t ws_bytes,
                      void *stream) {
  DL_TRY(load());
  DL_CHECK_ARG(dev >= 0 && dev < MAX_DEVS, "gemm: cuda:%d is beyond the %d devices handled", dev,
               MAX_DEVS);
  if (!handles[dev]) LT_CHECK(lt.Create(&handles[dev]));
  mapped_t mp;
  DL_TRY(map_operands(g, &mp));
  const dl_gemm_mat_t *x = mp.x, *y = mp.y;
  const int64_t rows = mp.rows, cols = mp.cols;
  const operand_t ox = mp.ox, oy = mp.oy, oc = mp.oc, od = mp.od;
  /* a batch: the strides of x and y (b and a when d is row-major), and of c and d */
  const int64_t batch = g->batch > 1 ? g->batch : 1;
  const int64_t bs[5] = {batch, batch > 1 ? (x == &g->a ? g->sa : g->sb) : 0,
                         batch > 1 ? (y == &g->a ? g->sa : g->sb) : 0, batch > 1 ? g->sc : 0,
                         batch > 1 ? g->sd : 0};
  const void *ptrs[4] = {x->data, y->data, g->c.data, g->d.data};
  const int es[4] = {dl_dtype_size(x->dtype), dl_dtype_size(y->dtype), dl_dtype_size(g->c.dtype),
                     dl_dtype_size(g->d.dtype)};
  int64_t align[4];
  for (int i = 0; i < 4; i++) { /* every matrix of a batch: the base and the stride's alignment */
    align[i] = align_of(ptrs[i]);
    const int64_t sa = align_of((const void *)(uintptr_t)(bs[i + 1] * es[i]));
    if (batch > 1 && sa < align[i]) align[i] = sa;
  }
  int tune;
  DL_TRY(dl_lt_tune_count(batch > 1, &tune));
  /* a tuned choice was checked at its first call's beta and c (in place or not) */
  const int64_t key[KEY] = {dev,      g->a.dtype, g->d.dtype, ox.op,    oy.op,    rows,
                            cols,     g->k,       ox.ld,      oy.ld,    oc.ld,    od.ld,
                            align[0], align[1],   align[2],   align[3], ws_bytes, tune,
                            bs[0],    bs[1],      bs[2],      bs[3],    bs[4],
                            tune && g->beta != 0, tune && g->c.data == g->d.data};
  entry_t *e;
  int fresh;
  DL_TRY(lookup(key, &e, &fresh));
  if (fresh) {
    const dl_lt_tune_args_t t = {x->data, y->data, g->c.data, (float)g->alpha, (float)g->beta,
                           g->c.data == g->d.data, g->d.dtype,
                           ((size_t)od.ld * (size_t)od.lcols + (size_t)((batch - 1) * bs[4])) *
                               dl_dtype_size(g->d.dtype), stream};
    int rc = entry_make(e, handles[dev], &ox, &oy, &oc, &od, g->a.dtype, g->d.dtype, g->k, bs,
                        align, ws_bytes, tune, &t);
    if (rc) {
      forget(e);
      /* some cuBLASLt versions refuse the heuristic query while a stream captures */
      enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess)
        (void)cudaGetLastError();
      else if (cs != cudaStreamCaptureStatusNone)
        rc = dl_error_context(rc, "gemm inside a CUDA graph capture (the first call of a "
                              "configuration asks cuBLASLt's heuristic: make one before capturing)");
      return rc;
    }
    e->used = 1;
  }
  const float alpha = (float)g->alpha, beta = (float)g->beta;
  n_calls++;
  LT_CHECK(lt.Matmul(handles[dev], e->desc, &alpha, x->data, e->la, y->data, e->lb, &beta,
                     g->c.data, e->lc, g->d.data, e->ld, &e->algo, ws, (size_t)ws_bytes,
                     (cudaStream_t)stream));
  return DL_OK;
}

/* g with c in place, 16-bit, beta != 0 (gemm_internal.h says why): c copied to a block of its
 * own on `stream`'s pool and handed to cuBLASLt as c. Given back stream-ordered after the GEMM,
 * so GEMMs in turn on one stream reuse one block, and GEMMs on several streams (the grouped
 * loop) hold a copy each. */
static int run_on_copy(const dl_gemm_args_t *g, int64_t bytes, int dev, void *ws,
                       int64_t ws_bytes, void *stream) {
  dl_storage_t *cs = NULL;
  DL_TRY(dl_mem_tag_push("gemm_c_copy"));
  int rc = dl_storage_new(DL_CUDA, dev, bytes, stream, &cs);
  dl_mem_tag_pop();
  if (rc) return dl_error_context(rc, "gemm: allocating the copy of c (c is out)");
  dl_gemm_args_t gc = *g;
  gc.c.data = cs->ptr;
  const cudaError_t e = cudaMemcpyAsync(cs->ptr, g->c.data, (size_t)bytes,
                                        cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
  rc = e == cudaSuccess ? dl_gemm_lt_run(&gc, dev, ws, ws_bytes, stream)
                        : DL_ERR(DL_ECUDA, "gemm: copying c: %s", cudaGetErrorString(e));
  dl_storage_release(cs);
  return rc;
}

int dl_gemm_lt_run(const dl_gemm_args_t *g, int dev, void *ws, int64_t ws_bytes, void *stream) {
  const int64_t copy = dl_gemm_c_copy_bytes(g);
  if (copy > 0) return run_on_copy(g, copy, dev, ws, ws_bytes, stream);
  pthread_mutex_lock(&mu);
  int rc = run_locked(g, dev, ws, ws_bytes, stream);
  pthread_mutex_unlock(&mu);
  return rc;
}

void dl_gemm_lt_stats(dl_gemm_stats_t *out) {
  pthread_mutex_lock(&mu);
  out->calls = n_calls;
  out->heuristics = n_heuristics;
  out->cached = 0;
  for (int i = 0; i < CACHE; i++) out->cached += cache[i].used;
  out->version = (int64_t)lt.version;
  pthread_mutex_unlock(&mu);
}

#endif
