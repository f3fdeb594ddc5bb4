/*
 * nccl_loop.c — the plain C baseline that experiments/comm/comm_bench.lua is held
 * against: the same ops, sizes, iteration counts and timing, straight on
 * NCCL, with nothing in between.
 *
 * One process per GPU, forked here (rank 0 makes the unique id and passes it
 * down a pipe). Per (op, size): barrier (a 1-element all-reduce, synced), 5
 * warm-up iterations, then REPS times: event, `iters` back-to-back ops on the
 * default stream, event; time = elapsed / iters. The parent takes the max
 * over ranks of each repetition and the median over repetitions, then
 * checks data (first and last element of each rank's block), as nccl-tests
 * does after timing. Ops and busbw factors follow nccl-tests; all f32 and
 * out of place; sendrecv sends to rank+1 and receives from rank-1 in a group.
 *
 *   build: gcc -O2 -o nccl_loop experiments/lab/nccl_loop.c -I$CUDA/include \
 *            -L$CUDA/lib64 -lcudart -lnccl
 *   run:   ./nccl_loop [-n ranks] [-b min_bytes] [-e max_bytes] [-o out.csv] [-c FIRST:PER]
 * -c: rank r runs on cores FIRST + r*PER .. FIRST + (r+1)*PER - 1, as
 * `distlab run --bind FIRST:PER` places distlab's ranks.
 * The CSV has the columns comm_bench.lua writes and reads (--compare).
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { OP_AR, OP_AG, OP_RS, OP_A2A, OP_SR, NOPS, MAXSIZES = 40, MAXRANKS = 8, REPS = 5,
       WARMUP = 5 };
static const char *op_name[NOPS] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                    "sendrecv"};

typedef struct results {
  double us[NOPS][MAXSIZES][REPS][MAXRANKS];
  double host_us[NOPS][MAXSIZES][REPS][MAXRANKS]; /* the host's time to issue one op */
  long wrong[NOPS][MAXSIZES][MAXRANKS];
} results_t;

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e_));              \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)
#define NK(x)                                                                              \
  do {                                                                                     \
    ncclResult_t r_ = (x);                                                                 \
    if (r_ != ncclSuccess) {                                                               \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #x, ncclGetErrorString(r_));              \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

/* The same schedule as comm_bench.lua: 2^28 bytes' worth, 10..1000. */
static int iters_for(long bytes) {
  long it = (1L << 28) / bytes;
  return it < 10 ? 10 : it > 1000 ? 1000 : (int)it;
}

/* Bytes actually moved for a nominal size: a multiple of 4*n (whole f32 blocks). */
static long round_bytes(long s, int n) {
  long b = s / (4L * n) * (4L * n);
  return b > 0 ? b : 4L * n;
}

static int issue(int op, float *send, float *recv, long bytes, int n, int rank, ncclComm_t comm) {
  long count = bytes / 4, block = count / n;
  switch (op) {
  case OP_AR: NK(ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, 0)); break;
  case OP_AG: NK(ncclAllGather(send, recv, block, ncclFloat32, comm, 0)); break;
  case OP_RS: NK(ncclReduceScatter(send, recv, block, ncclFloat32, ncclSum, comm, 0)); break;
  case OP_A2A:
    NK(ncclGroupStart());
    for (int j = 0; j < n; j++) {
      NK(ncclSend(send + j * block, block, ncclFloat32, j, comm, 0));
      NK(ncclRecv(recv + j * block, block, ncclFloat32, j, comm, 0));
    }
    NK(ncclGroupEnd());
    break;
  case OP_SR:
    NK(ncclGroupStart());
    NK(ncclSend(send, count, ncclFloat32, (rank + 1) % n, comm, 0));
    NK(ncclRecv(recv, count, ncclFloat32, (rank + n - 1) % n, comm, 0));
    NK(ncclGroupEnd());
    break;
  }
  return 0;
}

/* Expected value of recv element i after op (send holds rank+1 everywhere). */
static float expect(int op, long i, long bytes, int n, int rank) {
  long block = bytes / 4 / n;
  switch (op) {
  case OP_AR:
  case OP_RS: return n * (n + 1) / 2.0f;
  case OP_AG:
  case OP_A2A: return (float)(i / block + 1);
  default: return (float)((rank + n - 1) % n + 1);
  }
}

static int rank_main(int rank, int n, int idpipe[2], long minb, long maxb, results_t *res) {
  ncclUniqueId id;
  if (rank == 0) {
    NK(ncclGetUniqueId(&id));
    for (int r = 1; r < n; r++)
      if (write(idpipe[1], &id, sizeof id) != sizeof id) return 1;
  } else if (read(idpipe[0], &id, sizeof id) != sizeof id) {
    return 1;
  }
  CK(cudaSetDevice(rank));
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, n, id, rank));
  float *send, *recv, *one;
  CK(cudaMalloc((void **)&send, maxb));
  CK(cudaMalloc((void **)&recv, maxb));
  CK(cudaMalloc((void **)&one, 4));
  long chunk = 1 << 20;
  float *host = malloc(chunk * 4);
  for (long i = 0; i < chunk; i++) host[i] = (float)(rank + 1);
  for (long off = 0; off < maxb / 4; off += chunk) {
    long k = maxb / 4 - off < chunk ? maxb / 4 - off : chunk;
    CK(cudaMemcpy(send + off, host, k * 4, cudaMemcpyHostToDevice));
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int op = 0; op < NOPS; op++) {
    int si = 0;
    for (long s = minb; s <= maxb && si < MAXSIZES; s *= 2, si++) {
      long bytes = round_bytes(s, n);
      int iters = iters_for(bytes);
      for (int w = 0; w < WARMUP; w++)
        if (issue(op, send, recv, bytes, n, rank, comm)) return 1;
      for (int rep = 0; rep < REPS; rep++) {
        NK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm, 0)); /* barrier */
        CK(cudaStreamSynchronize(0));
        CK(cudaEventRecord(e0, 0));
        struct timespec h0, h1;
        clock_gettime(CLOCK_MONOTONIC, &h0);
        for (int it = 0; it < iters; it++)
          if (issue(op, send, recv, bytes, n, rank, comm)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &h1);
        res->host_us[op][si][rep][rank] =
            ((h1.tv_sec - h0.tv_sec) * 1e6 + (h1.tv_nsec - h0.tv_nsec) * 1e-3) / iters;
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        res->us[op][si][rep][rank] = ms * 1e3 / iters;
      }
      long out = op == OP_RS ? bytes / 4 / n : bytes / 4, wrong = 0;
      long block = op == OP_RS ? out : bytes / 4 / n;
      for (long b = 0; b < out; b += block) {
        float v[2];
        CK(cudaMemcpy(&v[0], recv + b, 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&v[1], recv + b + block - 1, 4, cudaMemcpyDeviceToHost));
        wrong += (v[0] != expect(op, b, bytes, n, rank)) +
                 (v[1] != expect(op, b + block - 1, bytes, n, rank));
      }
      res->wrong[op][si][rank] = wrong;
    }
  }
  ncclCommDestroy(comm);
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int n = 2, first = -1, per = 0;
  long minb = 8, maxb = 1L << 30;
  const char *out = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-n")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-b")) minb = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "-o")) out = argv[i + 1];
    else if (!strcmp(argv[i], "-c") && sscanf(argv[i + 1], "%d:%d", &first, &per) != 2) first = -2;
  }
  if (n < 1 || n > MAXRANKS || minb < 1 || maxb < minb || first < -1 || (first >= 0 && per < 1)) {
    fprintf(stderr, "usage: nccl_loop [-n 1..%d] [-b min_bytes] [-e max_bytes] [-o out.csv] "
            "[-c FIRST:PER]\n", MAXRANKS);
    return 2;
  }
  results_t *res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
  int idpipe[2];
  if (res == MAP_FAILED || pipe(idpipe) != 0) return 1;
  for (int r = 0; r < n; r++)
    if (fork() == 0) {
      if (first >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c = first + r * per; c < first + (r + 1) * per; c++) CPU_SET(c, &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
          perror("nccl_loop: sched_setaffinity");
          _exit(1);
        }
      }
      _exit(rank_main(r, n, idpipe, minb, maxb, res));
    }
  int failed = 0, st;
  for (int r = 0; r < n; r++)
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
  if (failed) {
    fprintf(stderr, "nccl_loop: a rank failed\n");
    return 1;
  }
  FILE *f = out ? fopen(out, "w") : stdout;
  if (!f) return 1;
  fprintf(f, "impl,op,bytes,count,dtype,iters,time_us,algbw_GBps,busbw_GBps,wrong,host_us\n");
  for (int op = 0; op < NOPS; op++) {
    int si = 0;
    for (long s = minb; s <= maxb && si < MAXSIZES; s *= 2, si++) {
      long bytes = round_bytes(s, n);
      double t[REPS], ht[REPS];
      long wrong = 0;
      for (int rep = 0; rep < REPS; rep++) {
        t[rep] = 0;
        ht[rep] = 0;
        for (int r = 0; r < n; r++) {
          t[rep] = res->us[op][si][rep][r] > t[rep] ? res->us[op][si][rep][r] : t[rep];
          ht[rep] = res->host_us[op][si][rep][r] > ht[rep] ? res->host_us[op][si][rep][r] : ht[rep];
        }
      }
      for (int r = 0; r < n; r++) wrong += res->wrong[op][si][r];
      qsort(t, REPS, sizeof t[0], cmp_double);
      qsort(ht, REPS, sizeof ht[0], cmp_double);
      double us = t[REPS / 2], alg = bytes / us * 1e-3;
      double factor = op == OP_AR ? 2.0 * (n - 1) / n : op == OP_SR ? 1.0 : (double)(n - 1) / n;
      fprintf(f, "nccl_loop,%s,%ld,%ld,f32,%d,%.2f,%.2f,%.2f,%ld,%.2f\n", op_name[op], bytes, bytes / 4,
              iters_for(bytes), us, alg, alg * factor, wrong, ht[REPS / 2]);
    }
  }
  if (out) fclose(f);
  return 0;
}
