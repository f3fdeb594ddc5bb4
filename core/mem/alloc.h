/* alloc.h — storages: reference-counted allocations from the per-device caching
 * allocator, charged to a memory tag (see alloc.c). */
#ifndef DISTLAB_ALLOC_H
#define DISTLAB_ALLOC_H

#include "base/internal.h"

struct dl_storage {
  int refs;
  int dev_type;
  int dev_index;
  int tag;
  void *ptr;         /* NULL on meta and for 0 bytes */
  int64_t nbytes;    /* requested */
  int64_t charged;   /* what the stats count: nbytes, rounded on cuda */
  int64_t block;     /* bytes of the device block behind it */
  void *stream;      /* cudaStream_t it was allocated on (its pool) */
  void *uses[4];     /* other streams that used it (record_stream) */
  int n_uses;
  /* wrapped memory (dl_storage_wrap): not the allocator's, not counted;
   * release(ctx) runs when the last reference goes */
  void (*release)(void *ctx);
  void *ctx;
};

/* A new storage with one reference, allocated on `stream`'s pool. */
int dl_storage_new(int dev_type, int dev_index, int64_t nbytes, void *stream, dl_storage_t **out);
/* A storage over memory distlab did not allocate (a peer's mapped buffer...). */
int dl_storage_wrap(int dev_type, int dev_index, void *ptr, int64_t nbytes,
                    void (*release)(void *ctx), void *ctx, dl_storage_t **out);
void dl_storage_retain(dl_storage_t *s);
void dl_storage_release(dl_storage_t *s);
int dl_storage_record_stream(dl_storage_t *s, void *stream);

/* Memory taken outside the allocator (a symmetric buffer an operator lays
 * out, core/ops/ep/) counted as if allocated: charge adds bytes to the
 * allocated and reserved stats of the device and to the tag on top of the
 * stack (returned in *tag), uncharge gives them back to that tag. */
int dl_mem_charge(int dev_type, int dev_index, int64_t bytes, int *tag);
void dl_mem_uncharge(int dev_type, int dev_index, int tag, int64_t bytes);

#endif
