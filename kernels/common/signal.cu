/*
 * signal.cu — flag set, flag wait and barrier on symmetric-buffer signal
 * pads, each as a tiny kernel on a stream, so a stream can wait for another
 * rank's kernels without the host in the loop (protocol: signal_pad.h).
 *
 *   signal_set_kernel      1 thread: pad.flags[flag] = value, after a system
 *                          fence, so this stream's earlier writes are visible
 *   signal_wait_kernel     1 thread: until own flags[flag] reaches value
 *   signal_barrier_kernel  1 block of 32: dl_signal_barrier_block on block 0
 *
 * A wait that times out, or sees the peers' word `gone` set (a rank's
 * process died: the host's watchdog writes it into mapped host memory),
 * records itself in the pad and ends the kernel (it never traps: a trap
 * would poison the whole context); dl_symm_check reports it. Checked against the CPU twins in kernels/common/cpu/signal.c by
 * spec/symm_spec.lua (#multigpu).
 */
#include "signal_pad.h"

// ---- kernels ----------------------------------------------------------------

__global__ void signal_set_kernel(dl_signal_pad_t *pad, int flag, uint32_t value) {
  __threadfence_system();
  dl_signal_store_release(&pad->flags[flag], value);
}

__global__ void signal_wait_kernel(dl_signal_pad_t *self, int flag, uint32_t value,
                                   uint64_t timeout_ns, const uint32_t *gone) {
  uint32_t seen = 0, dead = 0;
  if (dl_signal_wait_until(&self->flags[flag], value, timeout_ns, gone, &seen, &dead)) return;
  if (dead) dl_signal_fail(self, DL_SIGNAL_ERR_DEAD, dead - 1, value, seen);
  else dl_signal_fail(self, DL_SIGNAL_ERR_FLAG, (uint32_t)flag, value, seen);
}

__global__ void signal_barrier_kernel(const __grid_constant__ dl_signal_peers_t peers, int rank, int nranks,
                                      uint64_t timeout_ns, const uint32_t *gone) {
  dl_signal_barrier_block(peers, rank, nranks, timeout_ns, gone);
}

// ---- launchers --------------------------------------------------------------

static uint64_t to_ns(double s) { return (uint64_t)(s * 1e9); }

extern "C" int dl_signal_set_cuda(dl_signal_pad_t *pad, int flag, uint32_t value, void *stream) {
  signal_set_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(pad, flag, value);
  DL_CUDA_CHECK_LAUNCH("signal_set_kernel");
  return DL_OK;
}

extern "C" int dl_signal_wait_cuda(dl_signal_pad_t *self, int flag, uint32_t value,
                                   double timeout_s, const uint32_t *gone, void *stream) {
  signal_wait_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(self, flag, value, to_ns(timeout_s), gone);
  DL_CUDA_CHECK_LAUNCH("signal_wait_kernel");
  return DL_OK;
}

extern "C" int dl_signal_barrier_cuda(dl_signal_peers_t peers, int rank, int nranks,
                                      double timeout_s, const uint32_t *gone, void *stream) {
  signal_barrier_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(peers, rank, nranks,
                                                           to_ns(timeout_s), gone);
  DL_CUDA_CHECK_LAUNCH("signal_barrier_kernel");
  return DL_OK;
}
