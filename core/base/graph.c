/*
 * graph.c — CUDA graphs: capture what is issued on one stream, instantiate
 * it, replay it on any stream of the same device.
 *
 * Capture runs in relaxed mode: the caching allocator may call cudaMalloc
 * and query events while capturing, and other threads (the NCCL watchdog)
 * keep working. Work that cannot be captured (a host synchronisation on the
 * capturing stream) invalidates the capture; dl_graph_end then reports it
 * and leaves the stream usable. cpu and meta streams have no graphs: the Lua
 * layer (distlab.graph) replays a recorded function there instead.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "device.h"

enum { GRAPH_MAGIC = 0x6a9a1c, MAX_USERS = 8 };

struct dl_graph {
  uint32_t magic;
  int dev_index;
  int capturing;
  int64_t nodes;
  const void *users[MAX_USERS]; /* communicators / all-reduce objects whose work it captured */
  int nusers;
  char released[160];           /* why it can no longer replay ("" if it can) */
  struct dl_graph *prev, *next; /* the live graphs */
#ifdef DL_WITH_CUDA
  cudaStream_t stream;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
#endif
};

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static dl_graph_t *live;
static __thread dl_graph_t *capturing_here; /* the graph this thread captures into */

#ifdef DL_WITH_CUDA /* only CUDA builds capture graphs */
static void live_add(dl_graph_t *g) {
  pthread_mutex_lock(&live_mu);
  g->next = live;
  if (live) live->prev = g;
  live = g;
  pthread_mutex_unlock(&live_mu);
}
#endif

static void live_remove(dl_graph_t *g) {
  pthread_mutex_lock(&live_mu);
  if (g->prev) g->prev->next = g->next;
  else if (live == g) live = g->next;
  if (g->next) g->next->prev = g->prev;
  g->prev = g->next = NULL;
  pthread_mutex_unlock(&live_mu);
}

void dl_graph_note_user(const void *key) {
  dl_graph_t *g = capturing_here;
  if (!g || !key) return;
  for (int i = 0; i < g->nusers; i++)
    if (g->users[i] == key) return;
  if (g->nusers < MAX_USERS) g->users[g->nusers++] = key;
  else snprintf(g->released, sizeof g->released, "it captured the work of more than %d "
                "communicators and all-reduce objects", MAX_USERS); /* refused at dl_graph_end */
}

/* The graph's CUDA objects, destroyed (the caller holds live_mu or owns g). */
static void drop_cuda(dl_graph_t *g) {
#ifdef DL_WITH_CUDA
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  g->exec = NULL;
  g->graph = NULL;
#else
  (void)g;
#endif
}

void dl_graph_release_user(const void *key, const char *what) {
  pthread_mutex_lock(&live_mu);
  for (dl_graph_t *g = live; g; g = g->next)
    for (int i = 0; i < g->nusers; i++)
      if (g->users[i] == key && !g->released[0]) {
        drop_cuda(g);
        snprintf(g->released, sizeof g->released, "%s it captured was destroyed",
                 what ? what : "a communicator");
      }
  pthread_mutex_unlock(&live_mu);
}

static int graph_check(const dl_graph_t *g, const char *fn) {
  if (!g || g->magic != GRAPH_MAGIC)
    return DL_ERR(DL_ESTATE, "%s: not a live graph (NULL or freed)", fn);
  return DL_OK;
}

int dl_graph_begin(dl_graph_t **out, dl_stream_t *s) {
  DL_CHECK_ARG(out, "dl_graph_begin: out is NULL");
  *out = NULL;
#ifdef DL_WITH_CUDA
  void *h = dl_stream_handle(s);
  DL_CHECK_ARG(s && h, "dl_graph_begin: capture needs a cuda stream of its own (not the default "
               "stream, not a cpu stream)");
  int dev = 0;
  DL_CUDA_CHECK(cudaStreamGetDevice((cudaStream_t)h, &dev));
  DL_TRY(dl_cuda_use(dev));
  dl_graph_t *g = calloc(1, sizeof *g);
  if (!g) return DL_ERR(DL_ENOMEM, "dl_graph_begin: out of host memory");
  g->magic = GRAPH_MAGIC;
  g->dev_index = dev;
  g->stream = (cudaStream_t)h;
  cudaError_t e = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    free(g);
    return DL_ERR(DL_ECUDA, "cudaStreamBeginCapture on cuda:%d: %s", dev, cudaGetErrorString(e));
  }
  g->capturing = 1;
  capturing_here = g;
  live_add(g);
  *out = g;
  return DL_OK;
#else
  (void)s;
  return DL_ERR(DL_EUNSUPPORTED, "CUDA graphs need a CUDA build");
#endif
}

int dl_graph_end(dl_graph_t *g) {
  DL_TRY(graph_check(g, "dl_graph_end"));
  DL_CHECK_ARG(g->capturing, "dl_graph_end: the graph is not capturing");
#ifdef DL_WITH_CUDA
  DL_TRY(dl_cuda_use(g->dev_index));
  g->capturing = 0;
  if (capturing_here == g) capturing_here = NULL;
  cudaError_t e = cudaStreamEndCapture(g->stream, &g->graph);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return DL_ERR(DL_ECUDA, "capture on cuda:%d failed: %s (an operation inside it cannot be "
                  "captured, e.g. a host synchronisation or a copy to the host)",
                  g->dev_index, cudaGetErrorString(e));
  }
  size_t n = 0;
  DL_CUDA_CHECK(cudaGraphGetNodes(g->graph, NULL, &n));
  g->nodes = (int64_t)n;
  if (g->released[0]) {
    cudaGraphDestroy(g->graph);
    g->graph = NULL;
    return DL_ERR(DL_EUNSUPPORTED, "capture on cuda:%d: %s", g->dev_index, g->released);
  }
  DL_CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
  DL_CUDA_CHECK(cudaGraphUpload(g->exec, g->stream));
#endif
  return DL_OK;
}

int dl_graph_replay(dl_graph_t *g, dl_stream_t *s) {
  DL_TRY(graph_check(g, "dl_graph_replay"));
  DL_CHECK_ARG(!g->capturing, "dl_graph_replay: the graph is still capturing");
#ifdef DL_WITH_CUDA
  void *h = NULL;
  DL_TRY(dl_stream_for(s, DL_CUDA, g->dev_index, &h));
  DL_TRY(dl_cuda_use(g->dev_index));
  /* under the lock that releasing takes: the executable cannot go mid-launch */
  pthread_mutex_lock(&live_mu);
  int rc = DL_OK;
  if (g->released[0]) rc = DL_ERR(DL_ESTATE, "dl_graph_replay: the graph was released: %s", g->released);
  else if (!g->exec) rc = DL_ERR(DL_EINVAL, "dl_graph_replay: the capture failed; nothing to replay");
  else {
    cudaError_t e = cudaGraphLaunch(g->exec, (cudaStream_t)h);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      rc = DL_ERR(DL_ECUDA, "cudaGraphLaunch on cuda:%d: %s", g->dev_index, cudaGetErrorString(e));
    }
  }
  pthread_mutex_unlock(&live_mu);
  DL_TRY(rc);
#endif
  return DL_OK;
}

int dl_graph_nodes(const dl_graph_t *g, int64_t *nodes) {
  DL_TRY(graph_check(g, "dl_graph_nodes"));
  DL_CHECK_ARG(nodes, "dl_graph_nodes: out is NULL");
  *nodes = g->nodes;
  return DL_OK;
}

void dl_graph_free(dl_graph_t *g) {
  if (!g || g->magic != GRAPH_MAGIC) return;
  dl_teardown_trace("graph freed", g);
  live_remove(g);
  if (capturing_here == g) capturing_here = NULL;
#ifdef DL_WITH_CUDA
  if (g->capturing) {
    cudaGraph_t partial = NULL;
    if (cudaStreamEndCapture(g->stream, &partial) == cudaSuccess && partial)
      cudaGraphDestroy(partial);
    (void)cudaGetLastError();
  }
#endif
  drop_cuda(g);
  g->magic = 0;
  free(g);
}
