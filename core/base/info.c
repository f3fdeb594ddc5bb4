/*
 * info.c — the library's identity and its fixed tables: ABI version, build
 * line, dtype sizes and names, device type names; where the repository is.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int dl_abi_version(void) { return DL_ABI_VERSION; }

void dl_repo_root(char *out, size_t n) {
  const char *env = getenv("DISTLAB_ROOT");
  Dl_info info;
  out[0] = 0;
  if (env && *env) {
    snprintf(out, n, "%s", env);
  } else if (dladdr((void *)dl_repo_root, &info) && info.dli_fname) {
    const char *end = strstr(info.dli_fname, "/build/lib/");
    if (end) snprintf(out, n, "%.*s", (int)(end - info.dli_fname), info.dli_fname);
  }
}

int dl_dtype_size(int dtype) {
  static const int sizes[DL_NUM_DTYPES] = {4, 2, 2, 4, 8, 1, 8};
  return dtype >= 0 && dtype < DL_NUM_DTYPES ? sizes[dtype] : 0;
}

const char *dl_dtype_name(int dtype) {
  static const char *names[DL_NUM_DTYPES] = {"f32", "f16", "bf16", "i32", "i64", "u8", "f64"};
  return dtype >= 0 && dtype < DL_NUM_DTYPES ? names[dtype] : "?";
}

const char *dl_build_info(void) {
  static char info[128];
  if (!info[0]) {
#ifdef DL_WITH_CUDA
    snprintf(info, sizeof info, "distlab abi %d, CUDA runtime %d, NCCL loaded at run time",
             (int)DL_ABI_VERSION, (int)CUDART_VERSION);
#else
    snprintf(info, sizeof info, "distlab abi %d, cpu-only build (no nvcc at build time)",
             (int)DL_ABI_VERSION);
#endif
  }
  return info;
}

const char *dl_device_type_name(int dev_type) {
  return dev_type == DL_CPU ? "cpu" : dev_type == DL_CUDA ? "cuda" : dev_type == DL_META ? "meta" : "?";
}
