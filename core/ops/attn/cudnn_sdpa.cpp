/*
 * cudnn_sdpa.cpp — cuDNN's fused attention (dl.attn backend "cudnn"): the one
 * C++ translation unit of libdistlab, behind the plain-C surface of
 * core/ops/attn/attn_cudnn.h. core/ops/attn/attn_cudnn.c does the checks,
 * temporaries and workspace; this file opens cuDNN, builds and caches the
 * plans, and runs them.
 *
 * Frontend, not the backend C API. cuDNN's backend SDPA operation
 * descriptors (CUDNN_BACKEND_OPERATION_SDPA_FWD/BWD_DESCRIPTOR, 9.13 / 9.17)
 * carry Q, K, V, O, stats, scale, block mask, page tables and sequence
 * lengths (cudnn_graph.h), but no causal or sliding-window band, no
 * bottom-right alignment and no ragged offsets, and the backward one needs
 * 9.17 where the GPU hosts' system library is 9.14. Everything else is the
 * generic graph of matmul / pointwise / reduction operations with the
 * engine-specific rules that cuDNN's frontend composes and keeps in step with
 * each cuDNN release (node/scaled_dot_product_flash_attention.h,
 * sdpa_support_surface.h: thousands of lines of version checks and errata).
 * So this uses the frontend: header-only, pinned (1.32.0), fetched into
 * .deps/ by scripts/fetch-cudnn-frontend.sh, built with
 * NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: every cuDNN call of the frontend
 * goes through dlsym on the handle opened here (cudnn_frontend::cudnn_dlhandle),
 * so libdistlab has no link-time dependency on libcudnn and loads, and runs
 * everything else, where cuDNN is absent.
 *
 * Which libcudnn: $DISTLAB_CUDNN (a file name or a path) alone when set;
 * else the newest this host has (core/ops/attn/cudnn_lib.c: the pinned copy
 * of scripts/fetch-cudnn-lib.sh, PyTorch's wheel, the system's), else
 * libcudnn.so.9 as the loader finds it. cuDNN 9 opens its sub-libraries
 * (libcudnn_graph, libcudnn_engines_*) from its own folder. dl_attn_cudnn_info
 * names the file, its version and why it was taken; the benchmarks write them
 * into their results.
 *
 * Plans: one per dl_cudnn_key_t (shapes, strides, dtype, mask, window, scale,
 * device, direction), built on first use (validate, operation graph,
 * heuristics mode A, support check, plan build: on an H200, 75 ms per plan
 * on average with cuDNN 9.14 and 140-165 ms with 9.19, 1.8-2.1 s for the
 * first, which loads the engines) and kept, least recently
 * used out beyond CACHE entries; dl_attn_cudnn_info reports builds, hits and
 * build times. A configuration cuDNN refuses is cached too (with its
 * reason), so "auto" asks once. Every frontend error and exception becomes a
 * DL_E* code with cuDNN's message.
 */
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING 1
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1

#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <time.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>

#include "attn_cudnn.h"
#include "base/internal.h"

namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr; /* the frontend's dlsym()s look here */
}

namespace fe = cudnn_frontend;

namespace {

enum { CACHE = 128, MAX_DEVS = 16 };

/* uids of the graphs' tensors: DL_CUDNN_* for the operands, then these */
enum : int64_t {
  UID_STATS = 100,
  UID_MAX,
  UID_SEQ_Q,
  UID_SEQ_KV,
  UID_SUM_EXP,
  UID_RAGGED = 200 /* + DL_CUDNN_* */
};

struct Plan {
  dl_cudnn_key_t key;
  std::shared_ptr<fe::graph::Graph> graph;
  std::string unsupported; /* non-empty: cuDNN refused the key, this is why */
  int64_t workspace = 0;
  int64_t last = 0;
  int64_t index = -1; /* DISTLAB_CUDNN_PLAN's candidate, or -1: the heuristics' choice */
};

std::mutex mu;
std::vector<std::unique_ptr<Plan>> cache;
cudnnHandle_t handles[MAX_DEVS];
char lib_path[512];
char load_error[512];
int64_t lib_version, n_builds, n_hits, n_lookups, max_ws;
double build_ms_total, build_ms_last;

double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- the library ------------------------------------------------------------ */

void cudart_dir(char *buf, size_t len) {
  Dl_info info;
  buf[0] = 0;
  if (!dladdr((void *)cudaGetDeviceCount, &info) || !info.dli_fname) return;
  const char *slash = strrchr(info.dli_fname, '/');
  if (slash && (size_t)(slash - info.dli_fname) < len)
    snprintf(buf, len, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
}

/* The real file behind a handle (what the results name). */
bool dlinfo_path(void *lib, const char *name) {
  void *sym = dlsym(lib, "cudnnGetVersion");
  Dl_info info;
  if (!sym || !dladdr(sym, &info) || !info.dli_fname) return false;
  char real[PATH_MAX];
  snprintf(lib_path, sizeof lib_path, "%.500s", realpath(info.dli_fname, real) ? real : name);
  return true;
}

bool try_open(const char *name, std::string &tried) {
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    fe::cudnn_dlhandle = lib;
    if (!dlinfo_path(lib, name)) snprintf(lib_path, sizeof lib_path, "%s", name);
    return true;
  }
  const char *e = dlerror();
  tried += "\n  ";
  tried += e ? e : name;
  return false;
}

}  // namespace

/* An NVRTC of our CUDA major for the pinned cuDNN's JIT engines (cuDNN opens it by soname):
 * loaded already or on the loader's paths, else beside cudart, the toolkit's or PyTorch's
 * wheel's, loaded globally so that cuDNN's dlopen finds it. */
static void ensure_nvrtc() {
  char name[32], dir[400], path[512];
  snprintf(name, sizeof name, "libnvrtc.so.%d", CUDART_VERSION / 1000);
  if (dlopen(name, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) || dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return;
  cudart_dir(dir, sizeof dir);
  std::vector<std::string> paths = {std::string(dir) + "/" + name, std::string("/usr/local/cuda/lib64/") + name};
  glob_t g;
  snprintf(path, sizeof path, "/opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/%s", name);
  if (glob(path, 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; i++) paths.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  for (auto &p : paths)
    if (dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL)) return;
}

/* Called with mu held. DISTLAB_CUDNN, else the candidates of cudnn_lib.c newest first, else
 * libcudnn.so.9 as the loader finds it. */
static int load_locked() {
  if (fe::cudnn_dlhandle) return DL_OK;
  std::string tried, how;
  const char *env = getenv("DISTLAB_CUDNN");
  bool found = false;
  int64_t expected = 0;
  const dl_cudnn_cand_t *c;
  const int n = dl_cudnn_candidates(&c);
  /* the pinned copy holds the graph API and the JIT engines alone: CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY
   * (set here unless set otherwise: then that copy is passed over) and an NVRTC */
  auto jit_only = [&](const dl_cudnn_cand_t &x, bool *set_cfg) {
    const char *cfg = getenv("CUDNN_LIB_CONFIG");
    if (cfg && strcmp(cfg, "GRAPH_JIT_ONLY")) {
      tried += std::string("\n  ") + x.path + ": needs CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY, not " + cfg;
      return false;
    }
    *set_cfg = !cfg;
    if (*set_cfg) setenv("CUDNN_LIB_CONFIG", "GRAPH_JIT_ONLY", 0);
    ensure_nvrtc();
    return true;
  };
  if (env && *env) {
    char real[PATH_MAX];
    bool set_cfg = false;
    for (int i = 0; i < n; i++) /* DISTLAB_CUDNN naming the pinned copy */
      if (c[i].jit_only && realpath(env, real) && !strcmp(real, c[i].real)) jit_only(c[i], &set_cfg);
    found = try_open(env, tried);
    how = std::string("DISTLAB_CUDNN") + (getenv("CUDNN_LIB_CONFIG") ? "; CUDNN_LIB_CONFIG=" : "") +
          (getenv("CUDNN_LIB_CONFIG") ? getenv("CUDNN_LIB_CONFIG") : "");
  } else {
    for (int i = 0; i < n && !found; i++) {
      bool set_cfg = false;
      if (c[i].jit_only && !jit_only(c[i], &set_cfg)) continue;
      found = try_open(c[i].path, tried);
      if (found) {
        char v[32];
        dl_cudnn_version_str(c[i].version, v, sizeof v);
        how = std::string(i == 0 ? "the newest found: " : "the newest that opened: ") + v + ", " + c[i].origin;
        if (getenv("CUDNN_LIB_CONFIG")) how += std::string("; CUDNN_LIB_CONFIG=") + getenv("CUDNN_LIB_CONFIG");
        expected = c[i].version;
      } else if (set_cfg) {
        unsetenv("CUDNN_LIB_CONFIG");
      }
    }
    if (!found) {
      how = "the loader's";
      found = try_open("libcudnn.so.9", tried);
      char dir[400], path[512];
      cudart_dir(dir, sizeof dir);
      if (!found && dir[0]) {
        snprintf(path, sizeof path, "%s/libcudnn.so.9", dir);
        found = try_open(path, tried);
      }
    }
  }
  if (!found) {
    snprintf(load_error, sizeof load_error, "cannot load cuDNN (libcudnn.so.9); tried:%s",
             tried.c_str());
    return DL_ERR(DL_EUNSUPPORTED,
                  "%s\ninstall cuDNN 9, put the folder of libcudnn.so.9 on LD_LIBRARY_PATH, or "
                  "set DISTLAB_CUDNN to its path",
                  load_error);
  }
  auto get_version = (size_t(*)(void))dlsym(fe::cudnn_dlhandle, "cudnnGetVersion");
  lib_version = get_version ? (int64_t)get_version() : 0;
  if (lib_version < 90000) {
    snprintf(load_error, sizeof load_error, "%.400s is cuDNN %lld; the cudnn backend needs 9.0 or newer",
             lib_path, (long long)lib_version);
    dlclose(fe::cudnn_dlhandle);
    fe::cudnn_dlhandle = nullptr;
    lib_version = 0;
    return DL_ERR(DL_EUNSUPPORTED, "%s", load_error);
  }
  if (expected && expected / 100 != lib_version / 100) { /* its files said otherwise */
    char v[32];
    dl_cudnn_version_str(expected, v, sizeof v);
    how += std::string(" (its files said ") + v + ")";
  }
  dl_cudnn_opened(lib_version, lib_path, how.c_str());
  load_error[0] = 0;
  return DL_OK;
}

extern "C" int dl_cudnn_load(void) {
  std::lock_guard<std::mutex> lock(mu);
  return load_locked();
}

/* ---- graphs ------------------------------------------------------------------- */

namespace {

fe::DataType_t io_type(int64_t dt) {
  return dt == DL_BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

/* Tensor i of key k: [b, h, s, d] with its strides (and its ragged offsets for thd). */
void describe(const std::shared_ptr<fe::graph::Tensor_attributes> &t, fe::graph::Graph &g,
              const dl_cudnn_key_t &k, int i) {
  const bool q_side = i == DL_CUDNN_Q || i == DL_CUDNN_O || i == DL_CUDNN_DO || i == DL_CUDNN_DQ;
  const bool is_v = i == DL_CUDNN_V || i == DL_CUDNN_DV || i == DL_CUDNN_O || i == DL_CUDNN_DO;
  const int64_t h = q_side ? k.h_q : k.h_kv, s = q_side ? k.s_q : k.s_kv;
  const int64_t d = is_v ? k.d_v : k.d_qk;
  t->set_uid(i)
      .set_data_type(io_type(k.dtype))
      .set_dim({k.b, h, s, d})
      .set_stride({k.st[i][0], k.st[i][1], k.st[i][2], 1});
  if (k.thd) {
    auto r = g.tensor(fe::graph::Tensor_attributes()
                          .set_name(std::string("ragged_") + std::to_string(i))
                          .set_uid(UID_RAGGED + i)
                          .set_data_type(fe::DataType_t::INT32)
                          .set_dim({k.b + 1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1}));
    t->set_ragged_offset(r);
  }
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const dl_cudnn_key_t &k,
                                                    int i) {
  auto t = g.tensor(fe::graph::Tensor_attributes().set_name(std::string("in") + std::to_string(i)));
  describe(t, g, k, i);
  return t;
}

std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph &g,
                                                           const dl_cudnn_key_t &k, int64_t uid,
                                                           const char *name) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_data_type(fe::DataType_t::FLOAT)
                      .set_dim({k.b, k.h_q, k.s_q, 1})
                      .set_stride({k.h_q * k.s_q, k.s_q, 1, 1}));
}

/* The mask and scale of key on either direction's attributes. distlab's
 * window: key j visible to query i iff i + shift - left <= j <= i + shift +
 * right. cuDNN keeps j + left_bound > i + shift and j <= i + shift +
 * right_bound, so its left bound is ours + 1. */
template <class A>
void set_mask(A &a, const dl_cudnn_key_t &k, fe::graph::Graph &g,
              std::shared_ptr<fe::graph::Tensor_attributes> *seq_q,
              std::shared_ptr<fe::graph::Tensor_attributes> *seq_kv) {
  float scale;
  memcpy(&scale, &k.scale_bits, sizeof scale);
  a.set_attn_scale(scale);
  if (k.window_left >= 0 || k.window_right >= 0)
    a.set_diagonal_alignment(k.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                            : fe::DiagonalAlignment_t::TOP_LEFT);
  if (k.window_right >= 0) a.set_diagonal_band_right_bound((int)k.window_right);
  if (k.window_left >= 0) a.set_diagonal_band_left_bound((int)k.window_left + 1);
  if (k.thd) {
    auto len = [&](int64_t uid, const char *name) {
      return g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_data_type(fe::DataType_t::INT32)
                          .set_dim({k.b, 1, 1, 1})
                          .set_stride({1, 1, 1, 1}));
    };
    *seq_q = len(UID_SEQ_Q, "seq_q");
    *seq_kv = len(UID_SEQ_KV, "seq_kv");
    a.set_padding_mask(true).set_seq_len_q(*seq_q).set_seq_len_kv(*seq_kv);
  }
}

std::string check(fe::error_t e, const char *step) {
  if (e.is_good()) return "";
  return std::string(step) + ": " + e.get_message();
}

/* Builds key's graph into p (p->unsupported says why it could not). */
void build(Plan *p, cudnnHandle_t h) {
  const dl_cudnn_key_t &k = p->key;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  std::shared_ptr<fe::graph::Tensor_attributes> seq_q, seq_kv;
  auto q = input(*g, k, DL_CUDNN_Q), kk = input(*g, k, DL_CUDNN_K), v = input(*g, k, DL_CUDNN_V);
  if (!k.bwd) {
    /* cuDNN's softmax gives stats (the LSE) or its parts, the row max and the
     * sum of exp(s - max), not both: with max_logit asked for, the parts
     * (attn_cudnn.c makes the LSE, max + log(sum), and reduces the max) */
    auto a = fe::graph::SDPA_attributes().set_name("sdpa_fwd").set_generate_stats(!k.want_max);
    set_mask(a, k, *g, &seq_q, &seq_kv);
    /* DISTLAB_CUDNN_IMPL=composite|unified (a lab knob, for comparing cuDNN's two forward
     * nodes; unset: the frontend's choice, unified where it supports the graph) */
    const char *impl = getenv("DISTLAB_CUDNN_IMPL");
    if (impl && !strcmp(impl, "composite")) a.set_implementation(fe::AttentionImplementation_t::COMPOSITE);
    if (impl && !strcmp(impl, "unified")) a.set_implementation(fe::AttentionImplementation_t::UNIFIED);
    std::shared_ptr<fe::graph::Tensor_attributes> mx, se;
    if (k.want_max) {
      mx = stats_tensor(*g, k, UID_MAX, "max");
      se = stats_tensor(*g, k, UID_SUM_EXP, "sum_exp");
      mx->set_output(true);
      se->set_output(true);
      a.set_logit_max(mx).set_score_sum_exp(se);
    }
    auto outs = g->sdpa(q, kk, v, a);
    describe(outs[0], *g, k, DL_CUDNN_O);
    outs[0]->set_output(true);
    if (outs[1])
      outs[1]
          ->set_output(true)
          .set_uid(UID_STATS)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({k.b, k.h_q, k.s_q, 1})
          .set_stride({k.h_q * k.s_q, k.s_q, 1, 1});
  } else {
    auto a = fe::graph::SDPA_backward_attributes().set_name("sdpa_bwd");
    set_mask(a, k, *g, &seq_q, &seq_kv);
    auto o = input(*g, k, DL_CUDNN_O), dout = input(*g, k, DL_CUDNN_DO);
    auto stats = stats_tensor(*g, k, UID_STATS, "stats");
    auto outs = g->sdpa_backward(q, kk, v, o, dout, stats, a);
    const int grads[3] = {DL_CUDNN_DQ, DL_CUDNN_DK, DL_CUDNN_DV};
    for (int i = 0; i < 3; i++) {
      describe(outs[i], *g, k, grads[i]);
      outs[i]->set_output(true);
    }
  }
  /* DISTLAB_CUDNN_PLAN=N (a lab knob, for comparing cuDNN's engines): build
   * every candidate of heuristics modes A and FALLBACK, list them on stderr
   * and run candidate N (0 is the heuristics' first; where there are N or
   * fewer, candidate 0, marked * in the list) */
  const char *pick = getenv("DISTLAB_CUDNN_PLAN");
  const bool all = pick && *pick;
  std::string why = check(g->validate(), "validate");
  if (why.empty()) why = check(g->build_operation_graph(h), "operation graph");
  if (why.empty() && all)
    why = check(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
                "heuristics");
  else if (why.empty())
    why = check(g->create_execution_plans({fe::HeurMode_t::A}), "heuristics");
  if (why.empty()) why = check(g->check_support(), "support");
  if (why.empty() && all) {
    why = check(g->build_plans(fe::BuildPlanPolicy_t::ALL), "plans");
    const int64_t n = g->get_execution_plan_count();
    p->index = strtoll(pick, nullptr, 10);
    if (p->index >= n && n > 0) p->index = 0; /* fewer candidates: the first (the list says so) */
    fprintf(stderr, "distlab cudnn: %s %s b=%lld h=%lld s=%lld d=%lld%s%s: %lld candidates\n",
            k.bwd ? "bwd" : "fwd", k.thd ? "thd" : "bshd", (long long)k.b, (long long)k.h_q,
            (long long)k.s_q, (long long)k.d_qk, k.window_right == 0 ? " causal" : "",
            k.bottom_right ? " br" : "", (long long)n);
    for (int64_t i = 0; why.empty() && i < n; i++) {
      std::string name;
      int64_t ws = -1;
      if (g->get_plan_name_at_index(i, name).is_bad()) name = "(not built)";
      (void)g->get_workspace_size_plan_at_index(i, ws);
      fprintf(stderr, "  [%lld]%s %s workspace %lld\n", (long long)i, i == p->index ? "*" : " ",
              name.c_str(), (long long)ws);
    }
    if (why.empty() && (p->index < 0 || p->index >= n))
      why = "DISTLAB_CUDNN_PLAN=" + std::string(pick) + ": there are " + std::to_string(n) +
            " candidates";
    if (why.empty()) why = check(g->get_workspace_size_plan_at_index(p->index, p->workspace),
                                 "workspace size");
  } else {
    if (why.empty())
      why = check(g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "plan");
    if (why.empty()) why = check(g->get_workspace_size(p->workspace), "workspace size");
  }
  if (why.empty())
    p->graph = g;
  else
    p->unsupported = why;
}

}  // namespace

/* ---- plans and runs ------------------------------------------------------------ */

extern "C" int dl_cudnn_plan(const dl_cudnn_key_t *key, void **plan, int64_t *workspace) {
  std::lock_guard<std::mutex> lock(mu);
  DL_TRY(load_locked());
  const int dev = (int)key->dev;
  DL_CHECK_ARG(dev >= 0 && dev < MAX_DEVS, "attn (cudnn): cuda:%d is beyond the %d devices handled",
               dev, MAX_DEVS);
  n_lookups++;
  Plan *p = nullptr;
  for (auto &e : cache)
    if (!memcmp(&e->key, key, sizeof *key)) p = e.get();
  if (p) {
    n_hits++;
  } else {
    try {
      if (!handles[dev]) {
        cudnnStatus_t st = fe::detail::create_handle(&handles[dev]);
        if (st != CUDNN_STATUS_SUCCESS)
          return DL_ERR(DL_ECUDA, "attn (cudnn): cudnnCreate on cuda:%d failed: %s", dev,
                        fe::detail::get_error_string(st));
      }
      if (cache.size() >= CACHE) {
        size_t old = 0;
        for (size_t i = 1; i < cache.size(); i++)
          if (cache[i]->last < cache[old]->last) old = i;
        cache.erase(cache.begin() + (long)old);
      }
      auto fresh = std::make_unique<Plan>();
      fresh->key = *key;
      double t0 = now_ms();
      build(fresh.get(), handles[dev]);
      build_ms_last = now_ms() - t0;
      build_ms_total += build_ms_last;
      n_builds++;
      if (fresh->workspace > max_ws) max_ws = fresh->workspace;
      p = fresh.get();
      cache.push_back(std::move(fresh));
    } catch (const std::exception &e) {
      return DL_ERR(DL_ECUDA, "attn (cudnn): building the plan threw: %s", e.what());
    }
  }
  p->last = n_lookups;
  if (!p->unsupported.empty())
    return DL_ERR(DL_EUNSUPPORTED, "cuDNN %lld (%s) does not support it: %s",
                  (long long)lib_version, lib_path, p->unsupported.c_str());
  *plan = p;
  *workspace = p->workspace;
  return DL_OK;
}

extern "C" int dl_cudnn_run(void *plan, const dl_cudnn_ptrs_t *ptrs, void *workspace,
                            void *stream) {
  Plan *p = (Plan *)plan;
  const dl_cudnn_key_t &k = p->key;
  std::unordered_map<int64_t, void *> pack;
  const int fwd_ops[] = {DL_CUDNN_Q, DL_CUDNN_K, DL_CUDNN_V, DL_CUDNN_O};
  const int bwd_ops[] = {DL_CUDNN_Q,  DL_CUDNN_K,  DL_CUDNN_V,  DL_CUDNN_O,
                         DL_CUDNN_DO, DL_CUDNN_DQ, DL_CUDNN_DK, DL_CUDNN_DV};
  const int *ops = k.bwd ? bwd_ops : fwd_ops;
  const int n = k.bwd ? 8 : 4;
  for (int j = 0; j < n; j++) {
    pack[ops[j]] = ptrs->t[ops[j]];
    if (k.thd) pack[UID_RAGGED + ops[j]] = ptrs->ragged[ops[j]];
  }
  if (k.want_max && !k.bwd) {
    pack[UID_MAX] = ptrs->max;
    pack[UID_SUM_EXP] = ptrs->sum_exp;
  } else {
    pack[UID_STATS] = ptrs->stats;
  }
  if (k.thd) {
    pack[UID_SEQ_Q] = ptrs->seq_q;
    pack[UID_SEQ_KV] = ptrs->seq_kv;
  }
  std::lock_guard<std::mutex> lock(mu); /* one handle per device: its stream is ours until run */
  cudnnHandle_t h = handles[k.dev];
  try {
    cudnnStatus_t st = fe::detail::set_stream(h, (cudaStream_t)stream);
    if (st != CUDNN_STATUS_SUCCESS)
      return DL_ERR(DL_ECUDA, "attn (cudnn): cudnnSetStream failed: %s",
                    fe::detail::get_error_string(st));
    fe::error_t e = p->index >= 0 ? p->graph->execute_plan_at_index(h, pack, workspace, p->index)
                                  : p->graph->execute(h, pack, workspace);
    if (e.is_bad())
      return DL_ERR(DL_ECUDA, "attn (cudnn): executing the %s plan failed: %s",
                    k.bwd ? "backward" : "forward", e.get_message().c_str());
  } catch (const std::exception &e) {
    return DL_ERR(DL_ECUDA, "attn (cudnn): executing the plan threw: %s", e.what());
  }
  return DL_OK;
}

extern "C" void dl_cudnn_info_fill(dl_attn_cudnn_info_t *out) {
  std::lock_guard<std::mutex> lock(mu);
  out->version = lib_version;
  out->header_version = CUDNN_VERSION;
  out->frontend_version = CUDNN_FRONTEND_VERSION;
  out->plans = (int64_t)cache.size();
  out->builds = n_builds;
  out->hits = n_hits;
  out->build_ms = build_ms_total;
  out->last_build_ms = build_ms_last;
  out->max_workspace = max_ws;
  snprintf(out->path, sizeof out->path, "%s", fe::cudnn_dlhandle ? lib_path : load_error);
}
