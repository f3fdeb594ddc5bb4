/* device.h — device checks and stream resolution shared inside the core. */
#ifndef DISTLAB_DEVICE_H
#define DISTLAB_DEVICE_H

#include <stdio.h>

#include "internal.h"

/* DL_OK if the device exists; DL_ENODEV / DL_EINVAL with a clear message if not. */
int dl_device_check(int dev_type, int dev_index);
/* The raw cudaStream_t for work on (dev_type, dev_index); NULL for the default
 * stream and for cpu/meta. Fails if s belongs to another CUDA device. */
int dl_stream_for(dl_stream_t *s, int dev_type, int dev_index, void **handle);
#ifdef DL_WITH_CUDA
/* cudaSetDevice, skipped when the thread is already there. */
int dl_cuda_use(int dev_index);
#endif

/* Graphs and the objects whose work they captured. A CUDA graph that holds
 * NCCL work keeps the communicator busy (ncclCommDestroy waits for every such
 * graph, so a communicator that goes first would hang the exit), and one that
 * holds all-reduce kernels reads that object's symmetric buffers. Such an
 * object notes itself (note_user) when it issues work while this thread
 * captures, and releases (release_user) every live graph that captured it
 * before it goes; a released graph refuses to replay, saying why. */
void dl_graph_note_user(const void *key);
void dl_graph_release_user(const void *key, const char *what);

#endif
