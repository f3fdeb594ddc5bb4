/*
 * allreduce_launch.cu — the launcher of the all-reduce kernels (one_shot.cu,
 * two_shot.cu): checks the launch shape the core computed, has
 * the file of a->algo's family pick its kernel instantiated for the dtype,
 * world size and alignment, and launches it on the stream, with programmatic stream serialization when
 * a->pdl (so a grid can be scheduled while the one before it finishes).
 * Asynchronous: a wait that times out inside a kernel shows up in
 * *a->status, which the core reads (core/ops/allreduce/allreduce.c).
 *
 * Requirements: the shape dl_allreduce_cuda_shape gives for a->nranks (the
 * Lamport kernels: fewer threads a block too, whole warps),
 * 1..DL_AR_MAX_BLOCKS blocks, 2..DL_SIGNAL_MAX_RANKS ranks, f32 / f16 /
 * bf16. The CPU twin kernels/allreduce/cpu/allreduce.c (dl_allreduce_cpu)
 * takes the same arguments.
 */
#include "allreduce/allreduce_device.cuh"
#include "common/launch.cuh"

// ---- launchers ------------------------------------------------------------------

extern "C" void dl_allreduce_cuda_shape(int nranks, int *threads, int *unroll) {
  *threads = AR_THREADS;
  *unroll = nranks == 2   ? (int)shape<2>::U
            : nranks == 4 ? (int)shape<4>::U
            : nranks == 8 ? (int)shape<8>::U
                          : (int)shape<0>::U;
}

// The kernel of a->algo, from the file of its family (algos.h).
static dl_ar_picked_t kernel_of(const dl_ar_args_t *a, const dl_ar_algo_t *row) {
  switch (row->family) {
  case DL_AR_FAMILY_ONE: return dl_ar_one_shot_kernel(a);
  case DL_AR_FAMILY_TWO: return dl_ar_two_shot_kernel(a);
  default: return {nullptr, nullptr};
  }
}

extern "C" int dl_allreduce_cuda(const dl_ar_args_t *a, void *stream) {
  int threads, unroll;
  dl_allreduce_cuda_shape(a->nranks, &threads, &unroll);
  const dl_ar_algo_t *row = dl_ar_algo(a->algo);
  if (!row) return DL_ERR(DL_EINVAL, "allreduce: algorithm %d has no kernel", a->algo);
  // the Lamport kernels run with fewer threads a block too (the core's
  // shape_for): whole warps, and one a rank at least (ar_announce, ar_agree)
  const bool threads_ok = row->lamport ? a->threads >= DL_AR_WARP && a->threads <= threads &&
                                        a->threads % DL_AR_WARP == 0 && a->threads >= a->nranks
                                  : a->threads == threads;
  if (!threads_ok || a->unroll != unroll || a->round_vecs < 1 || a->blocks < 1 ||
      a->blocks > DL_AR_MAX_BLOCKS || a->nranks < 2 || a->nranks > DL_SIGNAL_MAX_RANKS)
    return DL_ERR(DL_EINVAL, "allreduce: bad launch shape (%d blocks of %d threads, unroll %d, "
                  "%d vectors a round, %d ranks)", a->blocks, a->threads, a->unroll, a->round_vecs, a->nranks);
  if (a->dtype != DL_F32 && a->dtype != DL_F16 && a->dtype != DL_BF16)
    return DL_ERR(DL_EUNSUPPORTED, "allreduce kernels: dtype %s (f32, f16, bf16 only)", dl_dtype_name(a->dtype));
  const dl_ar_picked_t k = kernel_of(a, row);
  if (!k.kernel) return DL_ERR(DL_EINVAL, "allreduce: algorithm %d has no kernel", a->algo);
  dl_ar_args_t b = *a;
  dl_ar_args_ring(&b);
  return dl_launch(k.kernel, k.name, b.blocks, b.threads, 0, stream, b.pdl, b);
}
