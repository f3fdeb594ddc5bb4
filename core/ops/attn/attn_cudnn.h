/*
 * attn_cudnn.h — between the C side of the cudnn attention backend
 * (core/ops/attn/attn_cudnn.c: checks, temporaries, workspace, the small
 * kernels around the call) and the one C++ translation unit that speaks to
 * cuDNN's frontend (core/ops/attn/cudnn_sdpa.cpp). Plain C; internal to the
 * core.
 */
#ifndef DISTLAB_ATTN_CUDNN_H
#define DISTLAB_ATTN_CUDNN_H

#include <stdint.h>

#include "distlab.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of an SDPA graph, each seen as [b, h, s, d] with (b, h, s)
 * strides in elements and d contiguous. */
enum {
  DL_CUDNN_Q = 0,
  DL_CUDNN_K,
  DL_CUDNN_V,
  DL_CUDNN_O,
  DL_CUDNN_DO,
  DL_CUDNN_DQ,
  DL_CUDNN_DK,
  DL_CUDNN_DV,
  DL_CUDNN_NT
};

/* Everything a graph is built from: the plan cache's key (all int64, zeroed
 * before filling, so it compares with memcmp). thd: b sequences of at most
 * s_q / s_kv rows, each starting where its ragged offset says. Stats (and
 * Max) are packed fp32 [b, h_q, s_q]. */
typedef struct dl_cudnn_key {
  int64_t dev, bwd, dtype, thd;
  int64_t b, h_q, h_kv, s_q, s_kv, d_qk, d_v;
  int64_t st[DL_CUDNN_NT][3];
  int64_t window_left, window_right, bottom_right; /* distlab's convention (attn.h) */
  int64_t want_max;                                /* fwd: also the row max of the logits */
  int64_t scale_bits;                              /* the float scale's bits */
} dl_cudnn_key_t;

typedef struct dl_cudnn_ptrs {
  void *t[DL_CUDNN_NT];
  float *stats, *max, *sum_exp; /* fwd with max: max and sum_exp, not stats */
  int32_t *seq_q, *seq_kv;       /* thd: [b] valid lengths                      */
  int32_t *ragged[DL_CUDNN_NT]; /* thd: [b+1] element offset of each sequence   */
} dl_cudnn_ptrs_t;

/* ---- which libcudnn (cudnn_lib.c) ---- */
typedef struct dl_cudnn_cand {
  char path[512], real[512]; /* where it was found; the file behind it */
  int64_t version;           /* from its files (cudnnGetVersion's numbering); 0: unknown */
  const char *origin;        /* "pinned, ...", "PyTorch's wheel", "system" */
  int jit_only;              /* the pinned copy: CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY */
} dl_cudnn_cand_t;

/* The candidates this host has, newest first (scanned once per process); their count. */
int dl_cudnn_candidates(const dl_cudnn_cand_t **list);
/* What the loader opened: its version (cudnnGetVersion), file and how it was chosen. */
void dl_cudnn_opened(int64_t version, const char *path, const char *how);
/* The version the errata are read for: the library opened, else (nothing opened yet, no
 * DISTLAB_CUDNN) the newest candidate's; 0 if none. path: its file. */
int64_t dl_cudnn_errata_version(char *path, size_t n);
/* "took <file> (how); found: <version> <file> (origin); ..." (or "will take ...") */
void dl_cudnn_pick_describe(char *out, size_t n);
/* 91400 -> "9.14.0" */
void dl_cudnn_version_str(int64_t v, char *buf, size_t n);

/* Opens cuDNN (once; see cudnn_lib.c for the files tried). */
int dl_cudnn_load(void);
/* The cached plan of key, built on a miss (an unsupported configuration is
 * DL_EUNSUPPORTED with cuDNN's reason); *workspace its workspace bytes. */
int dl_cudnn_plan(const dl_cudnn_key_t *key, void **plan, int64_t *workspace);
int dl_cudnn_run(void *plan, const dl_cudnn_ptrs_t *p, void *workspace, void *stream);
/* Library, versions and cache counters (no loading). */
void dl_cudnn_info_fill(dl_attn_cudnn_info_t *out);

/* ---- what core/ops/attn/attn.c calls (attn_cudnn.c) ---- */
#ifndef __cplusplus
#include "attn/attn.h"

/* *use: run cuDNN for this call (o->backend, the device, the options, then
 * cuDNN's own support check); why: the reason either way. An error only
 * when o->backend is DL_ATTN_CUDNN and cuDNN cannot run it. */
int dl_attn_cudnn_choose(const dl_attn_opts_t *o, const dl_tensor_t *q, const dl_attn_params_t *p,
                         int thd, int bwd, int fused, int want_max, int *use, char *why,
                         size_t whylen);
/* meta: charge the workspace a cuda call would take (by formula) and give it
 * back; grads_bytes: dq + dk + dv, temporaries when accumulating. */
int dl_attn_cudnn_account(const dl_attn_params_t *p, int bwd, int thd, int want_max,
                          const dl_tensor_t *q, int64_t grads_bytes);
int dl_attn_cudnn_fwd(const dl_attn_params_t *p, int thd, const dl_tensor_t *q, dl_stream_t *s);
int dl_attn_cudnn_bwd(const dl_attn_params_t *p, int thd, const dl_tensor_t *q, dl_tensor_t *dq,
                      dl_tensor_t *dk, dl_tensor_t *dv, int layout, dl_stream_t *s);
#endif

#ifdef __cplusplus
}
#endif
#endif
