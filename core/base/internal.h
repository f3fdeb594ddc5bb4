/*
 * internal.h — what the core's files share and Lua never sees: the kernels'
 * base header (errors, views; kernels/common/base.h) plus the pieces only
 * the core uses: views of tensors, device names, tensor arguments, the
 * clock of host waits, timeouts, integer knobs from the environment and
 * teardown tracing (core/base/clock.c).
 */
#ifndef DISTLAB_INTERNAL_H
#define DISTLAB_INTERNAL_H

#include "common/base.h"

#ifdef __cplusplus
extern "C" {
#endif

int dl_view_of(const dl_tensor_t *t, dl_view_t *v);
/* Merge dims that are contiguous in BOTH views (same shape); both change. */
void dl_view_coalesce2(dl_view_t *a, dl_view_t *b);
void dl_view_coalesce1(dl_view_t *a);

/* A contiguous tensor argument of an op that works on (dev_type, dev_index)
 * (on meta, any device): its view, or an error naming `what` ("input") and
 * `owner` ("comm 'w' (nccl)") when it is NULL, freed, strided or elsewhere. */
int dl_tensor_arg(const dl_tensor_t *t, const char *what, int dev_type, int dev_index,
                  const char *owner, dl_view_t *v);

/* "cpu", "cuda", "meta" (or "?") for a DL_CPU/DL_CUDA/DL_META type. */
const char *dl_device_type_name(int dev_type);

/* One pause of a host loop that polls the GPU (a stream or an event), the
 * wait having started at since_us (dl_now_us): none for the first 100 us
 * (a wait that ends soon costs no wake-up, as cudaStreamSynchronize's spin),
 * then a yield until 2 ms, then naps of 50 us. */
void dl_wait_pause(double since_us);
/* The SIGINTs counted and not yet taken, or -1 while dl_sigint_arm is off. A
 * blocking wait the REPL cannot reach reads it as it starts and ends (taking
 * them) once two more came: Ctrl-C twice during the wait. */
int dl_sigint_pending(void);
/* The repository's root (where .deps/ lies): DISTLAB_ROOT, else the folder
 * above build/lib of this library; "" when neither says. */
void dl_repo_root(char *out, size_t n);
/* Default timeout of every blocking wait, seconds: DISTLAB_TIMEOUT or 120. */
double dl_timeout_s(void);
/* An integer knob from the environment: dflt where unset or empty, else the
 * value, or DL_EINVAL naming fn ("dl_ep_new"), the variable and [lo, hi] (a
 * typo must not quietly measure something else). */
int dl_env_int(const char *fn, const char *name, long dflt, long lo, long hi, long *out);
/* DISTLAB_TRACE_TEARDOWN=1: one line on stderr per step of taking NCCL
 * communicators and graphs down (where an exit hangs, without a debugger). */
void dl_teardown_trace(const char *what, const void *p);

#ifdef __cplusplus
}
#endif

#endif
