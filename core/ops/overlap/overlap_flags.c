/*
 * overlap_flags.c — the overlap object's control words (every rank's
 * flags, its active word and its progress words: overlap_int.h) in host
 * memory that all the ranks of the node map: one POSIX shm segment per
 * rank, named after its process, the names exchanged through the
 * communicator's store and unlinked once every rank has mapped them. On
 * cuda each process registers every mapping with CUDA (mapped, portable),
 * so its stream memory operations reach them through device pointers.
 *
 * Why host memory and not the symmetric buffer's device memory: a
 * cuStreamWaitValue32 has no timeout, and the only way to end one is to
 * write its word. The host writes host memory at any time, with a plain
 * store. Device memory it can only write through a stream (a copy or a
 * memory operation), which the GPU runs from a hardware work queue, and the
 * driver aliases streams onto a few such queues per context (fewer under
 * MPS, where clients share one pool), so the write that should end a stuck
 * wait can sit in the queue behind that very wait (CUDA's documentation of
 * the stream memory operations warns that the scheduler may serialise work
 * that they order in a way that deadlocks). With
 * the words in host memory the watchdog reads and writes them without any
 * CUDA call, and every wait ends. The GPU polls a word in host memory over
 * PCIe, once per step: nothing next to a step's GEMM.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "overlap_int.h"
#include "comm/comm_ops.h"
#include "base/device.h"

enum { NAME = 64 };

static int64_t made; /* segments made by this process: with the pid, a name unique on the host */

static void key_of(char *key, size_t len, int64_t seq, int rank) {
  snprintf(key, len, "ovc/%lld/%d", (long long)seq, rank);
}

/* Maps segment `name` as rank r's control words (creating it when create). */
static int map_one(dl_overlap_t *o, int r, const char *name, int create) {
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0 && create && errno == EEXIST) { /* left by a crashed process of this pid */
    shm_unlink(name);
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return DL_ERR(DL_EIO, "overlap flags: shm_open(%s): %s", name, strerror(errno));
  int rc = DL_OK;
  if (create && ftruncate(fd, (off_t)o->ctl_bytes) != 0)
    rc = DL_ERR(DL_EIO, "overlap flags: ftruncate(%s, %zu): %s (is /dev/shm full?)", name,
                o->ctl_bytes, strerror(errno));
  void *p = rc ? MAP_FAILED : mmap(NULL, o->ctl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (rc == DL_OK && p == MAP_FAILED)
    rc = DL_ERR(DL_EIO, "overlap flags: mmap(%s): %s", name, strerror(errno));
  if (rc) return rc;
  o->flags[r] = o->dflags[r] = p;
#ifdef DL_WITH_CUDA
  if (o->op.dev_type == DL_CUDA) {
    DL_TRY(dl_cuda_use(o->op.dev_index));
    DL_CUDA_CHECK(
        cudaHostRegister(p, o->ctl_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    o->registered[r] = 1;
    void *d = NULL;
    DL_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    o->dflags[r] = d;
  }
#endif
  return DL_OK;
}

int dl_overlap_ctl_map(dl_overlap_t *o, dl_comm_t *c, int64_t seq) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  o->ctl_bytes = (DL_OVERLAP_CTL_WORDS * sizeof(uint32_t) + page - 1) / page * page;
  char name[NAME] = "", key[48];
  snprintf(name, sizeof name, "/distlab-ov-%d-%lld", (int)getpid(),
           (long long)__atomic_fetch_add(&made, 1, __ATOMIC_RELAXED));
  snprintf(o->ctl_name, sizeof o->ctl_name, "%s", name);
  DL_TRY(map_one(o, o->op.rank, name, 1));
  o->state = o->flags[o->op.rank] + DL_OVERLAP_MAX_FLAGS;
  o->dstate = o->dflags[o->op.rank] + DL_OVERLAP_MAX_FLAGS;
  key_of(key, sizeof key, seq, o->op.rank);
  DL_TRY(dl_comm_store_set(c, key, name, NAME));
  for (int r = 0; r < o->op.size; r++) {
    if (r == o->op.rank) continue;
    key_of(key, sizeof key, seq, r);
    DL_TRY(dl_comm_store_get(c, key, name, NAME));
    name[NAME - 1] = 0;
    DL_TRY(map_one(o, r, name, 0));
  }
  return DL_OK;
}

int dl_overlap_ctl_unlink(dl_overlap_t *o, dl_comm_t *c, int64_t seq) {
  char key[48];
  if (o->ctl_name[0]) shm_unlink(o->ctl_name);
  o->ctl_name[0] = 0;
  key_of(key, sizeof key, seq, o->op.rank);
  return dl_comm_store_delete(c, key);
}

void dl_overlap_ctl_unmap(dl_overlap_t *o) {
  for (int r = 0; r < o->op.size; r++) {
    if (!o->flags[r]) continue;
#ifdef DL_WITH_CUDA
    if (o->registered[r] && cudaHostUnregister(o->flags[r]) != cudaSuccess)
      (void)cudaGetLastError();
#endif
    munmap(o->flags[r], o->ctl_bytes);
    o->flags[r] = o->dflags[r] = NULL;
    o->registered[r] = 0;
  }
  o->state = o->dstate = NULL;
  if (o->ctl_name[0]) shm_unlink(o->ctl_name);
  o->ctl_name[0] = 0;
}
