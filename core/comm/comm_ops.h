/*
 * comm_ops.h — what an operator (core/ops/) may use of a communicator beyond
 * the ABI (dl_comm_info for its rank, size, device, name and timeout; the
 * collectives; dl_symm_*): the store in the communicator's namespace, the id
 * its next symmetric buffer gets, whether debug checks are on, and the one
 * cross-rank check that every rank made the same call. The communicator's
 * struct stays private to core/comm/ (comm_internal.h).
 */
#ifndef DISTLAB_COMM_OPS_H
#define DISTLAB_COMM_OPS_H

#include "base/internal.h"

/* The store under the communicator's namespace: key "k" is "<name>/k", so
 * the same key on two communicators never meets. get waits for the key and
 * fails unless it holds exactly len bytes; the wait also ends within 100 ms
 * of a member's death (dl_comm_watch) or of an abort of the communicator. */
int dl_comm_store_set(dl_comm_t *c, const char *key, const void *val, int64_t len);
int dl_comm_store_get(dl_comm_t *c, const char *key, void *buf, int64_t len);
int dl_comm_store_delete(dl_comm_t *c, const char *key);

/* Peers' processes (core/comm/peers.c). dl_comm_peer_pid: member rank's pid
 * where it runs on this host, else 0. dl_comm_watch: within 50 ms of the
 * death of a member's process on this host (a zombie counts), *word
 * becomes 1 + that member's rank, and stays so; the process's watchdog
 * thread writes it. Waits that must end at a peer's death, not at the
 * timeout, poll it (kernels too: on cuda give a word in pinned host memory
 * mapped for the device). dl_comm_unwatch before the word's memory goes. */
int dl_comm_peer_pid(dl_comm_t *c, int rank);
int dl_comm_watch(dl_comm_t *c, uint32_t *word);
void dl_comm_unwatch(uint32_t *word);

/* Debug mode is on (dl_comm_set_debug): operators check their calls across
 * ranks too (dl_comm_check_same). */
int dl_comm_debug(const dl_comm_t *c);

/* The id the next dl_symm_alloc on c gets: 0, 1, ... in the order of the
 * allocations, so the same on every rank; names an operator's store keys. */
int dl_comm_next_symm_id(const dl_comm_t *c);

/* Bytes a rank's dl_symm_alloc of nbytes takes on a device type: the data
 * rounded up to 4 KiB, the signal pad behind it, and on cuda the whole in
 * 2 MiB pages (an IPC handle names a page: symm.c says why), so that an
 * operator charges its symmetric parts to the allocator as they are. */
int64_t dl_symm_mapped_bytes(int dev_type, int64_t nbytes);

/* Debug mode's check that every rank of c made the same call: publishes
 * this rank's signature (len bytes, compared bytewise, so no padding) under
 * "<key>/<seq>/<rank>", reads every other rank's, and fails with DL_EINVAL
 * "mismatched <what>: rank R <mine> but rank Q <theirs>", each side written
 * by describe (e.g. "calls all_reduce(sum), dtype f32, 10 in, 10 out").
 * seq numbers the calls, the same on every rank; once a rank has read
 * every signature of call seq, everyone has read its key of call seq - 1,
 * which it then deletes. */
int dl_comm_check_same(dl_comm_t *c, const char *key, int64_t seq, const void *sig, size_t len,
                       const char *what, int (*describe)(const void *sig, char *buf, size_t len));

#endif
