/*
 * cudnn_lib.c — which libcudnn the cudnn attention backend opens: the
 * candidates this host has, each with its version, newest first. The loader
 * (core/ops/attn/cudnn_sdpa.cpp) opens the first that opens; attn_cudnn.c
 * reads the version of the library opened (on meta: of the one that would be)
 * against its errata.
 *
 * DISTLAB_CUDNN (a file name or a path) alone when set. Else every candidate
 * found, newest first (on a tie, in this order):
 *   pinned  the cuDNN of scripts/fetch-cudnn-lib.sh, unpacked on a GPU host
 *           into <root>/.deps/cudnn-lib/lib (scripts/gpu/steps.sh); version from
 *           .deps/cudnn-lib/VERSION. It holds the graph API and the JIT engines
 *           only, so it runs with CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY and an NVRTC
 *           (the loader sees to both);
 *   wheel   PyTorch's, <venv>/lib/python3.N/site-packages/nvidia/cudnn/lib, for
 *           /opt/torch/.venv and $VIRTUAL_ENV; version from the wheel's
 *           dist-info (nvidia_cudnn_cu13-9.19.0.56.dist-info); its sub-libraries
 *           find the wheel's cuBLAS and NVRTC through their RUNPATH;
 *   system  libcudnn.so.9 in the folders of LD_LIBRARY_PATH, the system's
 *           library folders, the CUDA toolkit's and that of the libcudart we
 *           run with; version from the real file's name (libcudnn.so.9.14.0),
 *           else from cudnn_version.h in the include folder beside it.
 * Versions come from files, not from opening the libraries: a cuDNN opens its
 * sub-libraries by soname, so a second cuDNN opened in one process would run
 * on the first one's (a candidate whose version cannot be read comes last).
 * The library opened is asked its version (cudnnGetVersion) all the same;
 * dl_attn_cudnn_info's pick says which file was taken, why, and the others.
 * DISTLAB_CUDNN_SYSROOT=<dir> (a test hook, spec/attn_cudnn_spec.lua): every
 * candidate folder is looked for under dir.
 */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn_cudnn.h"
#include "base/internal.h"

#if defined(DL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

enum { MAX_CANDS = 16 };

static dl_cudnn_cand_t cands[MAX_CANDS];
static int n_cands;
static pthread_once_t scanned = PTHREAD_ONCE_INIT;
static pthread_mutex_t opened_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t opened_version;
static char opened_path[512];
static char opened_how[256];

/* "9.19.0.56", "9.14.0" -> 91900, 91400 (cudnnGetVersion's numbering); 0 if not a version */
static int64_t parse_version(const char *s) {
  int major = 0, minor = 0, patch = 0;
  if (sscanf(s, "%d.%d.%d", &major, &minor, &patch) < 2 || major < 1) return 0;
  return (int64_t)major * 10000 + minor * 100 + patch;
}

/* The first line of a small text file, or "" */
static void read_line(const char *path, char *buf, size_t n) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(buf, (int)n, f)) buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\r\n")] = 0;
}

/* CUDNN_MAJOR / MINOR / PATCHLEVEL of a cudnn_version.h */
static int64_t header_version(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[256], name[64];
  int v[3] = {-1, -1, -1}, x;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, " #define %63s %d", name, &x) != 2) continue;
    if (!strcmp(name, "CUDNN_MAJOR")) v[0] = x;
    if (!strcmp(name, "CUDNN_MINOR")) v[1] = x;
    if (!strcmp(name, "CUDNN_PATCHLEVEL")) v[2] = x;
  }
  fclose(f);
  return v[0] > 0 && v[1] >= 0 ? (int64_t)v[0] * 10000 + v[1] * 100 + (v[2] > 0 ? v[2] : 0) : 0;
}

/* <dir>/../<what> with dir's last component dropped */
static void sibling(const char *dir, const char *what, char *out, size_t n) {
  const char *slash = strrchr(dir, '/');
  int len = slash ? (int)(slash - dir) : 0;
  snprintf(out, n, "%.*s/%s", len, dir, what);
}

static void add(const char *path, int64_t version, const char *origin, int jit_only) {
  char real[PATH_MAX];
  if (n_cands == MAX_CANDS || !realpath(path, real)) return;
  for (int i = 0; i < n_cands; i++)
    if (strcmp(cands[i].real, real) == 0) return; /* one file, found twice */
  dl_cudnn_cand_t *c = &cands[n_cands++];
  snprintf(c->path, sizeof c->path, "%.511s", path);
  snprintf(c->real, sizeof c->real, "%.511s", real);
  c->version = version, c->origin = origin, c->jit_only = jit_only;
}

static void add_pinned(const char *sysroot) {
  char root[PATH_MAX - 64], dir[PATH_MAX], ver[64], lib[PATH_MAX + 32];
  dl_repo_root(root, sizeof root);
  if (!root[0]) return;
  snprintf(dir, sizeof dir, "%s%s/.deps/cudnn-lib", sysroot, root);
  snprintf(lib, sizeof lib, "%s/VERSION", dir);
  read_line(lib, ver, sizeof ver);
  snprintf(lib, sizeof lib, "%s/lib/libcudnn.so.9", dir);
  if (access(lib, R_OK) == 0) add(lib, parse_version(ver), "pinned, scripts/fetch-cudnn-lib.sh", 1);
}

/* The dist-info folder of the cudnn wheel in site-packages: its version */
static int64_t wheel_version(const char *site) {
  DIR *d = opendir(site);
  if (!d) return 0;
  int64_t v = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *dash = strchr(e->d_name, '-');
    size_t len = strlen(e->d_name);
    if (strncmp(e->d_name, "nvidia_cudnn_cu", 15) == 0 && dash && len > 10 &&
        strcmp(e->d_name + len - 10, ".dist-info") == 0) {
      int64_t w = parse_version(dash + 1);
      if (w > v) v = w;
    }
  }
  closedir(d);
  return v;
}

static void add_wheels(const char *sysroot, const char *venv) {
  char pattern[PATH_MAX];
  glob_t g;
  if (!venv || !*venv) return;
  snprintf(pattern, sizeof pattern, "%s%s/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
           sysroot, venv);
  if (glob(pattern, 0, NULL, &g) != 0) return;
  for (size_t i = 0; i < g.gl_pathc; i++) {
    char site[PATH_MAX];
    const char *cut = strstr(g.gl_pathv[i], "/nvidia/cudnn/lib/");
    snprintf(site, sizeof site, "%.*s", (int)(cut - g.gl_pathv[i]), g.gl_pathv[i]);
    add(g.gl_pathv[i], wheel_version(site), "PyTorch's wheel", 0);
  }
  globfree(&g);
}

static void add_system_dir(const char *sysroot, const char *dir) {
  char lib[PATH_MAX], real[PATH_MAX], inc[PATH_MAX];
  if (!dir || !*dir) return;
  snprintf(lib, sizeof lib, "%s%s/libcudnn.so.9", sysroot, dir);
  if (access(lib, R_OK) != 0 || !realpath(lib, real)) return;
  const char *name = strrchr(real, '/') + 1;
  int64_t v = strncmp(name, "libcudnn.so.", 12) == 0 ? parse_version(name + 12) : 0;
  if (!v) { /* the toolkit's layout: lib/ beside include/ */
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%.*s", (int)(name - 1 - real), real);
    sibling(d, "include/cudnn_version.h", inc, sizeof inc);
    v = header_version(inc);
  }
  if (!v) {
    snprintf(inc, sizeof inc, "%s/usr/include/cudnn_version.h", sysroot);
    v = header_version(inc);
  }
  add(lib, v, "system", 0);
}

static void scan(void) {
  const char *sysroot = getenv("DISTLAB_CUDNN_SYSROOT");
  if (!sysroot) sysroot = "";
  add_pinned(sysroot);
  add_wheels(sysroot, "/opt/torch/.venv");
  add_wheels(sysroot, getenv("VIRTUAL_ENV"));
  const char *ld = getenv("LD_LIBRARY_PATH");
  if (ld) {
    char copy[4096], *save = NULL;
    snprintf(copy, sizeof copy, "%s", ld);
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save))
      add_system_dir(sysroot, d);
  }
  const char *dirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                        "/usr/local/cuda/lib64", "/usr/local/cuda/lib"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) add_system_dir(sysroot, dirs[i]);
#if defined(DL_WITH_CUDA)
  Dl_info info;
  if (dladdr((void *)cudaGetDeviceCount, &info) && info.dli_fname) {
    char d[PATH_MAX];
    const char *slash = strrchr(info.dli_fname, '/');
    if (slash) {
      snprintf(d, sizeof d, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
      add_system_dir(sysroot, d);
    }
  }
#endif
  /* newest first; a stable insertion sort keeps the order above on a tie */
  for (int i = 1; i < n_cands; i++) {
    dl_cudnn_cand_t c = cands[i];
    int j = i - 1;
    for (; j >= 0 && cands[j].version < c.version; j--) cands[j + 1] = cands[j];
    cands[j + 1] = c;
  }
}

int dl_cudnn_candidates(const dl_cudnn_cand_t **list) {
  pthread_once(&scanned, scan);
  *list = cands;
  return n_cands;
}

void dl_cudnn_version_str(int64_t v, char *buf, size_t n) {
  snprintf(buf, n, "%lld.%lld.%lld", (long long)(v / 10000), (long long)(v / 100 % 100),
           (long long)(v % 100));
}

void dl_cudnn_opened(int64_t version, const char *path, const char *how) {
  pthread_mutex_lock(&opened_mu);
  opened_version = version;
  snprintf(opened_path, sizeof opened_path, "%s", path ? path : "");
  snprintf(opened_how, sizeof opened_how, "%s", how ? how : "");
  pthread_mutex_unlock(&opened_mu);
}

int64_t dl_cudnn_errata_version(char *path, size_t n) {
  const char *env = getenv("DISTLAB_CUDNN");
  pthread_mutex_lock(&opened_mu);
  int64_t v = opened_version;
  if (path) snprintf(path, n, "%s", opened_path);
  pthread_mutex_unlock(&opened_mu);
  if (v || (env && *env)) return v; /* DISTLAB_CUDNN: only what was opened counts */
  const dl_cudnn_cand_t *c;
  if (dl_cudnn_candidates(&c) == 0) return 0;
  if (path) snprintf(path, n, "%s", c[0].real);
  return c[0].version;
}

void dl_cudnn_pick_describe(char *out, size_t n) {
  const char *env = getenv("DISTLAB_CUDNN");
  const dl_cudnn_cand_t *c;
  int k = dl_cudnn_candidates(&c);
  size_t used = 0;
  char v[32];
  pthread_mutex_lock(&opened_mu);
  if (opened_path[0])
    used = snprintf(out, n, "took %s (%s)", opened_path, opened_how);
  else if (env && *env)
    used = snprintf(out, n, "will take DISTLAB_CUDNN=%s", env);
  else if (k)
    used = snprintf(out, n, "will take %s (the newest found)", c[0].real);
  else
    used = snprintf(out, n, "found no libcudnn.so.9; will ask the loader for one");
  pthread_mutex_unlock(&opened_mu);
  for (int i = 0; i < k && used < n; i++) {
    if (c[i].version) dl_cudnn_version_str(c[i].version, v, sizeof v);
    else snprintf(v, sizeof v, "version unknown");
    used += snprintf(out + used, n - used, "%s %s %s (%s)", i ? ";" : "; found:", v, c[i].real,
                     c[i].origin);
  }
}
