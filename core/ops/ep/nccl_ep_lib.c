/*
 * nccl_ep_lib.c — opening NVIDIA's NCCL EP (libnccl_ep.so) for the nccl_ep
 * backend of dl.ep.buffer, at run time and once per process, so that
 * libdistlab loads and works without it (as NCCL, core/comm/comm_nccl.c).
 *
 * Which file: DISTLAB_NCCL_EP (a path or a file name) alone when set; else
 * the pinned one, <root>/.deps/nccl-ep/lib/libnccl_ep.so (scripts/fetch-nccl-ep.sh:
 * nccl-extensions 0.1.0, its cu13 build); else libnccl_ep.so.0 and
 * libnccl_ep.so wherever the loader looks (LD_LIBRARY_PATH, ...).
 *
 * Which NCCL: libnccl_ep.so names libnccl.so.2 as a dependency, so it binds
 * to the NCCL this process already runs (the one the communicator came
 * from), and it calls functions NCCL has since 2.29.2 (ncclCommQueryProperties,
 * ncclGetPeerDevicePointer, ncclWinGetUserPtr; the wheel itself asks for
 * nvidia-nccl-cu13 2.30.7). An older NCCL is refused up front with both
 * versions named; the GPU hosts' 2.28 needs a newer libnccl.so.2 first on
 * LD_LIBRARY_PATH (scripts/fetch-nccl-ep.sh --nccl brings 2.30.7).
 *
 * Its JIT reads its kernel headers from NCCL_EP_HOME/include/nccl_ep and
 * NCCL's device headers from NCCL_HOME/include (it falls back to its
 * precompiled kernels, with a warning, where they are missing): unset, they
 * point at .deps/nccl-ep and .deps/nccl-ep/nccl where the fetch put them,
 * as the wheel's Python package does with its own folders.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/internal.h"
#include "nccl_ep_api.h"

enum { MIN_NCCL = 22902 }; /* 2.29.2: ncclGetVersion's code, MAJOR*10000 + MINOR*100 + PATCH */

static dl_nccl_ep_api_t api;
static int loaded;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static const char *how_to_get =
    "scripts/fetch-nccl-ep.sh puts the pinned nccl-extensions 0.1.0 into .deps/nccl-ep (or set DISTLAB_NCCL_EP to "
    "a libnccl_ep.so)";

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* NCCL_EP_HOME and NCCL_HOME for the JIT, where unset and the fetch's folders exist. */
static void jit_homes(const char *root) {
  char dir[PATH_MAX], inc[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/.deps/nccl-ep", root);
  snprintf(inc, sizeof inc, "%s/include/nccl_ep", dir);
  if (!getenv("NCCL_EP_HOME") && is_dir(inc)) setenv("NCCL_EP_HOME", dir, 0);
  snprintf(dir, sizeof dir, "%s/.deps/nccl-ep/nccl", root);
  snprintf(inc, sizeof inc, "%s/include", dir);
  if (!getenv("NCCL_HOME") && is_dir(inc)) setenv("NCCL_HOME", dir, 0);
}

/* The libnccl.so.2 the communicator opened: its version and error strings. */
static int nccl_of_process(void) {
  void *nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!nccl)
    return DL_ERR(DL_ESTATE, "nccl_ep: no NCCL is loaded in this process (NCCL EP runs on an NCCL communicator: "
                             "make the buffer's comm first, on cuda)");
  int (*get_version)(int *) = (int (*)(int *))dlsym(nccl, "ncclGetVersion");
  *(void **)&api.NcclErrorString = dlsym(nccl, "ncclGetErrorString");
  dlclose(nccl); /* the communicator keeps it open */
  if (!get_version || !api.NcclErrorString || get_version(&api.nccl_version) != 0)
    return DL_ERR(DL_ENCCL, "nccl_ep: cannot read the version of this process's NCCL (libnccl.so.2)");
  if (api.nccl_version < MIN_NCCL)
    return DL_ERR(DL_EUNSUPPORTED,
                  "nccl_ep: NCCL EP needs NCCL 2.29.2 or newer (nccl-extensions 0.1.0 is built for 2.30.7); this "
                  "process runs NCCL %d.%d.%d: put a newer libnccl.so.2 first on LD_LIBRARY_PATH "
                  "(scripts/fetch-nccl-ep.sh --nccl fetches 2.30.7 into .deps/nccl-ep/nccl/lib)",
                  api.nccl_version / 10000, api.nccl_version / 100 % 100, api.nccl_version % 100);
  return DL_OK;
}

/* Open the first candidate that opens; *tried gets each one's failure. */
static void *open_lib(char *tried, size_t n) {
  char root[PATH_MAX - 64], pinned[PATH_MAX];
  const char *env = getenv("DISTLAB_NCCL_EP");
  dl_repo_root(root, sizeof root);
  jit_homes(root);
  snprintf(pinned, sizeof pinned, "%s/.deps/nccl-ep/lib/libnccl_ep.so", root);
  const char *cands[] = {env && *env ? env : pinned, env && *env ? NULL : "libnccl_ep.so.0", "libnccl_ep.so"};
  size_t used = 0;
  tried[0] = 0;
  for (int i = 0; i < 3 && cands[i]; i++) {
    if (i == 0 && !(env && *env) && !root[0]) continue;
    void *lib = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      snprintf(api.path, sizeof api.path, "%s", cands[i]);
      return lib;
    }
    const char *e = dlerror();
    used += (size_t)snprintf(tried + used, used < n ? n - used : 0, "%s%s", used ? "; " : "", e ? e : cands[i]);
    if (used >= n) break;
  }
  return NULL;
}

static int resolve(void *lib) {
#define SYM(f)                                                                                        \
  if (!(*(void **)&api.f = dlsym(lib, "ncclEp" #f)))                                                  \
    return DL_ERR(DL_EUNSUPPORTED, "nccl_ep: %s lacks ncclEp" #f " (not NCCL EP 0.2? %s)", api.path, \
                  how_to_get);
  SYM(GetVersion) SYM(CreateGroup) SYM(GroupDestroy) SYM(HandleMemSize) SYM(InitHandle) SYM(UpdateHandle)
  SYM(HandleDestroy) SYM(Dispatch) SYM(Combine) SYM(Complete) SYM(GetAsyncError)
#undef SYM
  if (api.GetVersion(&api.version) != 0)
    return DL_ERR(DL_EUNSUPPORTED, "nccl_ep: ncclEpGetVersion failed in %s", api.path);
  if (api.version < NCCL_EP_MIN_VERSION_CODE || api.version >= 10000)
    return DL_ERR(DL_EUNSUPPORTED,
                  "nccl_ep: %s is NCCL EP %d.%d.%d; distlab's declarations match the API of 0.2 (version 2, "
                  "nccl-extensions 0.1.0): %s",
                  api.path, api.version / 10000, api.version / 100 % 100, api.version % 100, how_to_get);
  return DL_OK;
}

int dl_nccl_ep_load(const dl_nccl_ep_api_t **out) {
  *out = NULL;
  pthread_mutex_lock(&mu);
  int rc = loaded ? DL_OK : nccl_of_process();
  if (rc == DL_OK && !loaded) {
    char tried[2048];
    void *lib = open_lib(tried, sizeof tried);
    if (!lib)
      rc = DL_ERR(DL_EUNSUPPORTED, "nccl_ep: cannot open NCCL EP (libnccl_ep.so): %s. %s", tried, how_to_get);
    else if ((rc = resolve(lib)) != DL_OK)
      dlclose(lib);
    else
      loaded = 1;
  }
  pthread_mutex_unlock(&mu);
  if (rc == DL_OK) *out = &api;
  return rc;
}
