/*
 * comm_meta.c — the meta communicator: one process plays rank r of a world
 * of any size, and every op is accepted and moves nothing.
 *
 * It exists for memory accounting of large configurations: a CP=64 schedule
 * runs on a laptop on meta tensors, allocating every buffer it would
 * allocate (so the allocator's peaks are exact) while its communication is
 * a no-op. Argument checks still run in comm.c, so a shape error shows up on
 * meta exactly as it would on a real communicator.
 */
#include "comm_internal.h"

static int meta_init(dl_comm_t *c) {
  c->impl = c; /* no state; non-NULL marks it initialised */
  return DL_OK;
}

static int meta_run(dl_comm_t *c, const dl_comm_call_t *call) { return DL_OK; }
static int meta_group(dl_comm_t *c) { return DL_OK; }
static int meta_synchronize(dl_comm_t *c, dl_stream_t *s) { return DL_OK; }
static void meta_destroy(dl_comm_t *c) { c->impl = NULL; }

const dl_comm_backend_t dl_comm_meta_backend = {
    .name = "meta",
    .init = meta_init,
    .run = meta_run,
    .group_start = meta_group,
    .group_end = meta_group,
    .synchronize = meta_synchronize,
    .abort = NULL,
    .destroy = meta_destroy,
};
