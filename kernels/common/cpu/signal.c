/*
 * signal.c — CPU twins of kernels/common/signal.cu: flag set, flag wait and the
 * barrier on signal pads in shared memory, same protocol (signal_pad.h), with
 * C11 atomics (release stores, acquire loads) between processes.
 *
 * Waits spin, then yield, then sleep, and end after the timeout, or once the
 * peers' word `gone` is set (a rank's process died), with the record in the
 * pad (as on the GPU) and DL_ETIMEOUT or DL_EPEER naming the flag or the
 * peer. The stream argument is unused: cpu work is synchronous.
 */
#include "host_wait.h"
#include "common/signal_pad.h"

static void fail(dl_signal_pad_t *self, uint32_t kind, uint32_t index, uint32_t expected,
                 uint32_t seen) {
  uint32_t none = 0;
  if (__atomic_compare_exchange_n(&self->error[0], &none, kind, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    self->error[1] = index;
    self->error[2] = expected;
    self->error[3] = seen;
  }
}

/* 0 once *p reaches v; else the last value seen, with *why set: 1 timed
 * out, 1 + g once *gone (may be NULL) is g. */
static uint32_t wait_until(const uint32_t *p, uint32_t v, double timeout_s, const uint32_t *gone,
                           uint32_t *why) {
  double deadline = dl_host_now_s() + timeout_s;
  uint32_t x, g;
  *why = 0;
  for (long i = 0; !DL_SIGNAL_REACHED(x = __atomic_load_n(p, __ATOMIC_ACQUIRE), v); i++) {
    dl_host_pause(i);
    if (i % 16) continue;
    if (gone && (g = __atomic_load_n(gone, __ATOMIC_ACQUIRE)) != 0) {
      *why = 1 + g;
      return x;
    }
    if (dl_host_now_s() > deadline) {
      *why = 1;
      return x;
    }
  }
  return 0;
}

int dl_signal_set_cpu(dl_signal_pad_t *pad, int flag, uint32_t value, void *stream) {
  __atomic_store_n(&pad->flags[flag], value, __ATOMIC_RELEASE);
  return DL_OK;
}

int dl_signal_wait_cpu(dl_signal_pad_t *self, int flag, uint32_t value, double timeout_s,
                       const uint32_t *gone, void *stream) {
  uint32_t why;
  uint32_t seen = wait_until(&self->flags[flag], value, timeout_s, gone, &why);
  if (!why) return DL_OK;
  if (why > 1) {
    fail(self, DL_SIGNAL_ERR_DEAD, why - 2, value, seen);
    return DL_ERR(DL_EPEER, "flag %d waited for %u (it is %u): rank %u has exited", flag, value,
                  seen, why - 2);
  }
  fail(self, DL_SIGNAL_ERR_FLAG, (uint32_t)flag, value, seen);
  return DL_ERR(DL_ETIMEOUT, "flag %d did not reach %u within %.1f s (it is %u)", flag, value,
                timeout_s, seen);
}

int dl_signal_barrier_cpu(dl_signal_peers_t peers, int rank, int nranks, double timeout_s,
                          const uint32_t *gone, void *stream) {
  dl_signal_pad_t *self = peers.pads[rank];
  uint32_t e = self->epoch[0] + 1;
  for (int t = 0; t < nranks; t++)
    __atomic_store_n(&peers.pads[t]->barrier[0][rank], e, __ATOMIC_RELEASE);
  for (int t = 0; t < nranks; t++) {
    uint32_t why;
    uint32_t seen = wait_until(&self->barrier[0][t], e, timeout_s, gone, &why);
    if (why > 1) {
      fail(self, DL_SIGNAL_ERR_DEAD, why - 2, e, seen);
      return DL_ERR(DL_EPEER, "barrier %u: rank %u has exited (rank %d's count here is %u)", e,
                    why - 2, t, seen);
    }
    if (why) {
      fail(self, DL_SIGNAL_ERR_BARRIER, (uint32_t)t, e, seen);
      return DL_ERR(DL_ETIMEOUT,
                    "barrier %u: rank %d did not arrive within %.1f s (its count here is %u)", e,
                    t, timeout_s, seen);
    }
  }
  self->epoch[0] = e;
  return DL_OK;
}
