/*
 * algos.h — the all-reduce algorithms, one row each: the one list that the
 * core (core/ops/allreduce/: zero copy, pieces, grids), the launcher
 * (allreduce_launch.cu: which kernel file, which launch shape), the CPU twin
 * (cpu/allreduce.c) and the emulator read. Adding an algorithm: a row here,
 * its kernel (and its case in its family file's picker), its twin.
 *
 * Columns:
 *   id         DL_AR_<id>, the row's index (users name it by `name`;
 *              dl_allreduce_algo_name)
 *   family     the kernel file: ONE (one_shot.cu: every rank reduces all of
 *              the input), TWO (two_shot.cu: each rank reduces a slice, then
 *              the slices are gathered), NCCL (the communicator's own)
 *   lamport    no flags: data polled against a sentinel in the Lamport
 *              region (lamport.cuh); blocks of fewer threads, no rounds
 *   sliced     the grid is sized for one of n slices (two-shots)
 *   push       how data crosses: 0 peers load it; 1 the inputs are stored
 *              into the peers; 2 the sums too (two_shot_write)
 *   pipelined  cuda, copy-in or push: half a block's warps move rounds in,
 *              the other half reduce the rounds that have arrived
 *   tagged     small calls may go as tagged vectors (allreduce.h)
 *   zero_copy  an input in the zero-copy region is read in place: APART
 *              with the output elsewhere, IN_PLACE with the output the input
 */
#ifndef DISTLAB_ALLREDUCE_ALGOS_H
#define DISTLAB_ALLREDUCE_ALGOS_H

/* id                  name                  family lamport sliced push pipelined tagged zero_copy */
#define DL_AR_ALGOS(X)                                                                               \
  X(NCCL,               "nccl",               NCCL, 0,      0,     0,   0,        0,     NONE)     \
  X(ONE_SHOT,           "one_shot",           ONE,  0,      0,     0,   1,        0,     APART)    \
  X(ONE_SHOT_PUSH,      "one_shot_push",      ONE,  0,      0,     1,   1,        0,     NONE)     \
  X(TWO_SHOT,           "two_shot",           TWO,  0,      1,     0,   0,        0,     IN_PLACE) \
  X(TWO_SHOT_PUSH,      "two_shot_push",      TWO,  0,      1,     1,   0,        0,     IN_PLACE) \
  X(TWO_SHOT_WRITE,     "two_shot_write",     TWO,  0,      1,     2,   0,        0,     IN_PLACE) \
  X(ONE_SHOT_LAMPORT,   "one_shot_lamport",   ONE,  1,      0,     1,   0,        1,     NONE)     \
  X(ONE_SHOT_PUSH_FLAT, "one_shot_push_flat", ONE,  0,      0,     1,   0,        0,     NONE)     \
  X(TWO_SHOT_LAMPORT,   "two_shot_lamport",   TWO,  1,      1,     2,   0,        0,     NONE)

enum {
#define DL_AR_ID(id, ...) DL_AR_##id,
  DL_AR_ALGOS(DL_AR_ID)
#undef DL_AR_ID
  DL_AR_NUM_ALGOS
};

enum { DL_AR_FAMILY_NCCL, DL_AR_FAMILY_ONE, DL_AR_FAMILY_TWO };
enum { DL_AR_ZC_NONE, DL_AR_ZC_APART, DL_AR_ZC_IN_PLACE };

typedef struct dl_ar_algo {
  const char *name;
  int family, lamport, sliced, push, pipelined, tagged, zero_copy;
} dl_ar_algo_t;

/* The row of algorithm algo, or NULL for a number that names none. */
static inline const dl_ar_algo_t *dl_ar_algo(int algo) {
  static const dl_ar_algo_t rows[] = {
#define DL_AR_ROW(id, name, family, lamport, sliced, push, pipelined, tagged, zc) \
  {name, DL_AR_FAMILY_##family, lamport, sliced, push, pipelined, tagged, DL_AR_ZC_##zc},
      DL_AR_ALGOS(DL_AR_ROW)
#undef DL_AR_ROW
  };
  return algo >= 0 && algo < DL_AR_NUM_ALGOS ? &rows[algo] : (const dl_ar_algo_t *)0;
}

#endif
