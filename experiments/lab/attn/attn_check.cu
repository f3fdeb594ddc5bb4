/*
 * attn_check.cu — checks the CUDA attention kernels (kernels/attn_*.cu)
 * against their CPU twins (kernels/attn/cpu/attn*.c) on fresh random inputs
 * (clamp(randn, -1, 1)): every layout (bshd, sbhd with padded rows, thd with
 * offsets not at 0, gaps and lengths 0, 1 and non-multiples of the tiles),
 * masks and windows in both alignments, GQA/MQA, head dims 64/128/256, MLA
 * 192/128 and non-template dims, bf16 and fp16, max_logit, the fused merge
 * (fp32 and bf16 accumulators), accumulate_grads, the merge kernels, and
 * parameter validation. Outputs are poisoned with NaN before each kernel
 * (except what the caller pre-fills); rows the kernel does not own hold a
 * sentinel that must survive. One line per case, then "N passed, N failed";
 * exit status 1 on any failure.
 *
 *   attn_check              all cases
 *   attn_check --small      a subset, for compute-sanitizer
 *   attn_check --filter S   the cases whose name contains S
 *   attn_check --list       list the attention cases
 *
 * Built by scripts/gpu/attn_lab.sh on a GPU, or with -DDL_ATTN_EMU on the
 * CPU warp emulator (experiments/lab/emu/attn, `make portable`).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "attn/attn.h"
#include "common/base.h"

#ifdef DL_ATTN_EMU
static void *dev_alloc(size_t n) { return aligned_alloc(256, (n + 256) / 256 * 256); }
static void dev_free(void *p) { free(p); }
static void to_dev(void *d, const void *h, size_t n) { memcpy(d, h, n); }
static void to_host(void *h, const void *d, size_t n) { memcpy(h, d, n); }
static void dev_sync() {}
// the Hopper kernels are sm_90a-only (experiments/lab/emu/attn/hopper_*.cpp emulate them): here the portable ones always run
extern "C" int dl_attn_fwd_hopper_usable(const dl_attn_params_t *, int *yes) { return *yes = 0, 0; }
extern "C" int dl_attn_bwd_hopper_usable(const dl_attn_params_t *, int *yes) { return *yes = 0, 0; }
extern "C" int dl_attn_fwd_hopper_cuda(const dl_attn_params_t *, void *) { return DL_EINVAL; }
extern "C" int dl_attn_bwd_hopper_cuda(const dl_attn_params_t *, float *, float *, void *) { return DL_EINVAL; }
extern "C" int dl_attn_bwd_hopper_preps(const dl_attn_params_t *) { return 0; }
#else
#include <cuda_runtime.h>
static void *dev_alloc(size_t n) {
  void *p = nullptr;
  if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
    exit(2);
  }
  return p;
}
static void dev_free(void *p) { cudaFree(p); }
static void to_dev(void *d, const void *h, size_t n) { cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); }
static void to_host(void *h, const void *d, size_t n) { cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost); }
static void dev_sync() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    exit(2);
  }
}
#endif

/* ---- data -------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand() {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return ((rng_state >> 11) + 0.5) * 0x1p-53;
}
static double randn_clamped() {
  double x = sqrt(-2 * log(urand())) * cos(6.283185307179586 * urand());
  return x < -1 ? -1 : x > 1 ? 1 : x;
}

static uint16_t f2h(double v, int dt) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (dt == DL_BF16) return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  /* fp16 from float: the inputs are in [-1, 1] and outputs moderate */
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a < 0x38800000u) return (uint16_t)sign; /* only tiny values; fine for inputs */
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}
static double h2f(uint16_t h, int dt) {
  if (dt == DL_BF16) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t u = e == 0x1f ? sign | 0x7f800000u | (m << 13)
               : e == 0  ? 0
                         : sign | ((e + 112) << 23) | (m << 13);
  float f;
  memcpy(&f, &u, 4);
  return e == 0 ? (sign ? -1.0 : 1.0) * m * 0x1p-24 : f;
}

/* An operand: host copy, device copy, which elements are the kernel's. */
struct operand {
  int dtype; /* DL_BF16, DL_F16, DL_F32 */
  std::vector<uint8_t> host, init;
  std::vector<char> mine;
  void *dev = nullptr;
  dl_attn_strides_t st{0, 0, 0};
  size_t n = 0;
  size_t esize() const { return dtype == DL_F32 ? 4 : 2; }
  double get(size_t e) const {
    if (dtype == DL_F32) return ((const float *)host.data())[e];
    return h2f(((const uint16_t *)host.data())[e], dtype);
  }
  void set(size_t e, double v) {
    if (dtype == DL_F32)
      ((float *)host.data())[e] = (float)v;
    else
      ((uint16_t *)host.data())[e] = f2h(v, dtype);
  }
  void alloc(size_t count, int dt) {
    n = count, dtype = dt;
    host.assign((n + 1) * esize(), 0), mine.assign(n, 0); /* never empty: a NULL pointer means absent */
    dev = dev_alloc(n * esize());
  }
  /* mine: value; others: a sentinel NaN that must survive */
  void fill(double (*value)()) {
    for (size_t e = 0; e < n; e++) {
      if (mine[e]) {
        set(e, value());
      } else if (dtype == DL_F32) {
        uint32_t s = 0x7fc00123u;
        memcpy(&host[4 * e], &s, 4);
      } else {
        uint16_t s = dtype == DL_BF16 ? 0x7fc1 : 0x7e01;
        memcpy(&host[2 * e], &s, 2);
      }
    }
    init = host;
  }
  void upload() { to_dev(dev, host.data(), n * esize()); }
  void download() { to_host(host.data(), dev, n * esize()); }
  ~operand() { dev_free(dev); }
};

static double nan_value() { return NAN; }
static double ninf_or_rand() { return urand() < 0.2 ? -INFINITY : randn_clamped() * 3; }

/* ---- comparison ----------------------------------------------------------------- */

struct verdict {
  bool ok = true;
  std::string text;
  void add(const char *name, const operand &gpu, const operand &ref, double tol) {
    double sd = 0, sr = 0, worst = 0;
    size_t bad = 0, nonfinite = 0, touched = 0;
    for (size_t e = 0; e < gpu.n; e++) {
      if (!gpu.mine[e]) {
        touched += memcmp(&gpu.host[e * gpu.esize()], &gpu.init[e * gpu.esize()], gpu.esize()) != 0;
        continue;
      }
      double a = gpu.get(e), b = ref.get(e);
      if (a == b) continue;
      if (!isfinite(a)) nonfinite++;
      double d = fabs(a - b);
      if (!(d <= tol + tol * fabs(b))) bad++;
      if (isfinite(d)) sd += d * d, sr += b * b, worst = fmax(worst, d);
    }
    char buf[160];
    snprintf(buf, sizeof buf, " %s rel %.1e max %.1e", name, sr > 0 ? sqrt(sd / sr) : sqrt(sd), worst);
    text += buf;
    if (bad || nonfinite || touched) {
      snprintf(buf, sizeof buf, " [%zu bad, %zu nonfinite, %zu gap elems touched]", bad, nonfinite, touched);
      text += buf;
      ok = false;
    }
  }
};

static int n_pass, n_fail;
static void report(const std::string &name, verdict &v) {
  v.ok ? n_pass++ : n_fail++;
  printf("%-4s %-58s%s\n", v.ok ? "ok" : "FAIL", name.c_str(), v.text.c_str());
  fflush(stdout);
}

/* ---- attention cases ------------------------------------------------------------- */

enum { BSHD, SBHD, THD };
static const char *layout_names[] = {"bshd", "sbhd", "thd"};

struct acase {
  int layout = BSHD, b = 2, hq = 4, hkv = 2, dqk = 64, dv = 64, dtype = DL_BF16;
  int sq = 0, skv = 0;     /* bshd / sbhd */
  std::vector<int> ql, kl; /* thd lengths per sequence */
  int wl = -1, wr = -1, br = 0, row_pad = 0, fused = -1;
  bool max_logit = false, acc_grads = false, small = false;
  std::string name() const {
    char buf[200];
    snprintf(buf, sizeof buf, "%s %s h%d/%d d%d/%d w(%d,%d)%s%s%s%s%s%s", layout_names[layout],
             dtype == DL_BF16 ? "bf16" : "fp16", hq, hkv, dqk, dv, wl, wr, br ? " br" : "",
             max_logit ? " maxlogit" : "", fused == DL_F32 ? " fused-f32" : fused >= 0 ? " fused-16" : "",
             acc_grads ? " accgrad" : "", row_pad ? " rowpad" : "", layout == THD ? " varlen" : "");
    std::string s = buf;
    if (layout != THD) s += " s" + std::to_string(sq) + "/" + std::to_string(skv);
    return s;
  }
};

struct seqs {
  std::vector<int32_t> cu_q, cu_kv, pad_q, pad_kv;
  int64_t t_q = 0, t_kv = 0;
  void *d_cu_q = nullptr, *d_cu_kv = nullptr, *d_pad_q = nullptr, *d_pad_kv = nullptr;
  int len(bool q, int bi) const { return q ? cu_q[bi + 1] - cu_q[bi] : cu_kv[bi + 1] - cu_kv[bi]; }
  ~seqs() { dev_free(d_cu_q), dev_free(d_cu_kv), dev_free(d_pad_q), dev_free(d_pad_kv); }
};

static void make_seqs(const acase &c, seqs &s) {
  if (c.layout != THD) return;
  s.cu_q = {0}, s.cu_kv = {0}, s.pad_q = {5}, s.pad_kv = {3}; /* offsets not at 0 */
  for (int bi = 0; bi < c.b; bi++) {
    s.cu_q.push_back(s.cu_q.back() + c.ql[bi]);
    s.cu_kv.push_back(s.cu_kv.back() + c.kl[bi]);
    s.pad_q.push_back(s.pad_q.back() + c.ql[bi] + (bi % 3) * 7); /* gaps that belong to others */
    s.pad_kv.push_back(s.pad_kv.back() + c.kl[bi] + (bi % 2) * 5);
  }
  s.t_q = s.pad_q.back() + 6, s.t_kv = s.pad_kv.back() + 2;
  void **dst[4] = {&s.d_cu_q, &s.d_cu_kv, &s.d_pad_q, &s.d_pad_kv};
  std::vector<int32_t> *src[4] = {&s.cu_q, &s.cu_kv, &s.pad_q, &s.pad_kv};
  for (int i = 0; i < 4; i++) {
    *dst[i] = dev_alloc(src[i]->size() * 4);
    to_dev(*dst[i], src[i]->data(), src[i]->size() * 4);
  }
}

/* Shape, strides and ownership of a [seq, heads, d] operand (lse-like: d = 0). */
static void geom(operand &o, const acase &c, const seqs &s, bool q, int heads, int d, int dt) {
  bool thd = c.layout == THD, lse = d == 0;
  int64_t len = q ? c.sq : c.skv, t = q ? s.t_q : s.t_kv, row = (int64_t)heads * d + c.row_pad;
  if (lse)
    o.st = thd ? dl_attn_strides_t{0, 1, t} : dl_attn_strides_t{heads * len, 1, len};
  else if (thd)
    o.st = {0, row, d};
  else
    o.st = c.layout == BSHD ? dl_attn_strides_t{len * row, row, d} : dl_attn_strides_t{row, c.b * row, d};
  o.alloc(lse ? (size_t)heads * (thd ? t : c.b * len) : (size_t)(thd ? t : c.b * len) * row, dt);
  for (int bi = 0; bi < c.b; bi++) {
    int64_t base = thd ? (q ? s.pad_q[bi] : s.pad_kv[bi]) * o.st.s : bi * o.st.b;
    int n = thd ? s.len(q, bi) : (int)len;
    for (int64_t i = 0; i < n; i++)
      for (int h = 0; h < heads; h++)
        for (int x = 0; x < (lse ? 1 : d); x++) o.mine[base + i * o.st.s + h * o.st.h + x] = 1;
  }
}

static dl_attn_params_t base_params(const acase &c, const seqs &s, bool gpu) {
  dl_attn_params_t p = {};
  p.dtype = c.dtype, p.b = c.b, p.h_q = c.hq, p.h_kv = c.hkv, p.d_qk = c.dqk, p.d_v = c.dv;
  p.s_q = c.sq, p.s_kv = c.skv, p.scale = (float)(1 / sqrt((double)c.dqk));
  p.window_left = c.wl, p.window_right = c.wr, p.bottom_right = c.br;
  if (c.layout == THD) {
    p.cu_seqlens_q = (const int32_t *)(gpu ? s.d_cu_q : (void *)s.cu_q.data());
    p.cu_seqlens_kv = (const int32_t *)(gpu ? s.d_cu_kv : (void *)s.cu_kv.data());
    p.cu_seqlens_q_padded = (const int32_t *)(gpu ? s.d_pad_q : (void *)s.pad_q.data());
    p.cu_seqlens_kv_padded = (const int32_t *)(gpu ? s.d_pad_kv : (void *)s.pad_kv.data());
    p.total_q = s.t_q, p.total_kv = s.t_kv;
    p.s_q = p.s_kv = 0;
    for (int bi = 0; bi < c.b; bi++) p.s_q = std::max(p.s_q, s.len(true, bi)), p.s_kv = std::max(p.s_kv, s.len(false, bi));
  }
  return p;
}

static void *ptr(operand &o, bool gpu) { return gpu ? o.dev : (void *)o.host.data(); }

static void run_case(const acase &c) {
  seqs s;
  make_seqs(c, s);
  operand q, k, v, dout, out[2], lse[2], acc[2], acc_lse[2], ml[2], dq[2], dk[2], dv[2];
  geom(q, c, s, true, c.hq, c.dqk, c.dtype), geom(k, c, s, false, c.hkv, c.dqk, c.dtype);
  geom(v, c, s, false, c.hkv, c.dv, c.dtype), geom(dout, c, s, true, c.hq, c.dv, c.dtype);
  q.fill(randn_clamped), k.fill(randn_clamped), v.fill(randn_clamped), dout.fill(randn_clamped);
  q.upload(), k.upload(), v.upload(), dout.upload();
  const int acc_dt = c.fused >= 0 ? c.fused : DL_F32;
  for (int g = 0; g < 2; g++) {
    geom(out[g], c, s, true, c.hq, c.dv, c.dtype), geom(lse[g], c, s, true, c.hq, 0, DL_F32);
    geom(acc[g], c, s, true, c.hq, c.dv, acc_dt), geom(acc_lse[g], c, s, true, c.hq, 0, DL_F32);
    ml[g].alloc(c.hq, DL_F32), ml[g].mine.assign(c.hq, 1);
    geom(dq[g], c, s, true, c.hq, c.dqk, c.dtype), geom(dk[g], c, s, false, c.hkv, c.dqk, c.dtype);
    geom(dv[g], c, s, false, c.hkv, c.dv, c.dtype);
  }
  rng_state += 17;
  uint64_t seed = rng_state;
  for (int g = 0; g < 2; g++) { /* identical initial states for the gpu (0) and the twin (1) */
    rng_state = seed;
    out[g].fill(nan_value), lse[g].fill(nan_value), acc[g].fill(randn_clamped), acc_lse[g].fill(ninf_or_rand);
    for (int h = 0; h < c.hq; h++) ml[g].set(h, -INFINITY);
    double (*grad_init)() = c.acc_grads ? randn_clamped : nan_value;
    dq[g].fill(grad_init), dk[g].fill(grad_init), dv[g].fill(grad_init);
    for (operand *o : {&out[g], &lse[g], &acc[g], &acc_lse[g], &ml[g], &dq[g], &dk[g], &dv[g]}) o->upload();
  }
  verdict vd;
  int rc[2];
  for (int g = 0; g < 2; g++) {
    bool gpu = g == 0;
    dl_attn_params_t p = base_params(c, s, gpu);
    p.q = ptr(q, gpu), p.k = ptr(k, gpu), p.v = ptr(v, gpu), p.q_st = q.st, p.k_st = k.st, p.v_st = v.st;
    if (c.fused >= 0) {
      p.acc_out = ptr(acc[g], gpu), p.acc_dtype = c.fused, p.acc_out_st = acc[g].st;
      p.acc_lse = (float *)ptr(acc_lse[g], gpu), p.acc_lse_st = acc_lse[g].st;
    } else {
      p.out = ptr(out[g], gpu), p.out_st = out[g].st, p.lse = (float *)ptr(lse[g], gpu), p.lse_st = lse[g].st;
    }
    if (c.max_logit) p.max_logit = (float *)ptr(ml[g], gpu);
    rc[g] = gpu ? dl_attn_fwd_cuda(&p, nullptr, nullptr) : dl_attn_fwd_cpu(&p, nullptr);
    if (gpu) dev_sync();
  }
  if (rc[0] || rc[1]) {
    vd.ok = false, vd.text = std::string(" fwd rc ") + std::to_string(rc[0]) + ": " + dl_last_error();
    return report(c.name(), vd);
  }
  const double tol = c.dtype == DL_BF16 ? 2.5e-2 : 5e-3;
  if (c.fused >= 0) {
    acc[0].download(), acc_lse[0].download();
    vd.add("acc_out", acc[0], acc[1], acc_dt == DL_BF16 ? 2.5e-2 : tol), vd.add("acc_lse", acc_lse[0], acc_lse[1], tol);
  } else {
    out[0].download(), lse[0].download();
    vd.add("out", out[0], out[1], tol), vd.add("lse", lse[0], lse[1], tol);
  }
  if (c.max_logit) ml[0].download(), vd.add("max_logit", ml[0], ml[1], tol);

  /* backward from the twin's out and lse (recomputed unfused when fused) */
  operand &o_ref = out[1], &l_ref = lse[1];
  if (c.fused >= 0) {
    dl_attn_params_t p = base_params(c, s, false);
    p.q = q.host.data(), p.k = k.host.data(), p.v = v.host.data(), p.q_st = q.st, p.k_st = k.st, p.v_st = v.st;
    p.out = o_ref.host.data(), p.out_st = o_ref.st, p.lse = (float *)l_ref.host.data(), p.lse_st = l_ref.st;
    dl_attn_fwd_cpu(&p, nullptr);
  }
  o_ref.upload(), l_ref.upload();
  void *ws = nullptr;
  for (int g = 0; g < 2; g++) {
    bool gpu = g == 0;
    dl_attn_params_t p = base_params(c, s, gpu);
    p.q = ptr(q, gpu), p.k = ptr(k, gpu), p.v = ptr(v, gpu), p.q_st = q.st, p.k_st = k.st, p.v_st = v.st;
    p.out = ptr(o_ref, gpu), p.out_st = o_ref.st, p.lse = (float *)ptr(l_ref, gpu), p.lse_st = l_ref.st;
    p.dout = ptr(dout, gpu), p.dout_st = dout.st, p.accumulate_grads = c.acc_grads;
    p.dq = ptr(dq[g], gpu), p.dk = ptr(dk[g], gpu), p.dv = ptr(dv[g], gpu);
    p.dq_st = dq[g].st, p.dk_st = dk[g].st, p.dv_st = dv[g].st;
    if (gpu) {
      p.workspace_bytes = dl_attn_bwd_workspace_bytes(&p);
      p.workspace = ws = dev_alloc(p.workspace_bytes);
    }
    rc[g] = gpu ? dl_attn_bwd_cuda(&p, nullptr, nullptr) : dl_attn_bwd_cpu(&p, nullptr);
    if (gpu) dev_sync();
  }
  dev_free(ws);
  if (rc[0] || rc[1]) {
    vd.ok = false, vd.text += std::string(" bwd rc ") + std::to_string(rc[0]) + ": " + dl_last_error();
    return report(c.name(), vd);
  }
  dq[0].download(), dk[0].download(), dv[0].download();
  vd.add("dq", dq[0], dq[1], tol), vd.add("dk", dk[0], dk[1], tol), vd.add("dv", dv[0], dv[1], tol);
  report(c.name(), vd);
}

/* ---- merge cases ---------------------------------------------------------------------- */

struct mcase {
  const char *name;
  bool thd;
  int what, mode, half, part_is_half, out_dtype, skip_zero, d; /* d % 4: the scalar kernels */
};

static void run_merge(const mcase &mc) {
  const int B = 4, H = 3, S = 40, D = mc.d;
  const std::vector<int32_t> cu = {4, 20, 20, 58, 80}; /* starts at 4; one empty sequence */
  const int64_t T = 86, TH = (cu[B] - cu[0]) / 2;
  void *d_cu = dev_alloc(cu.size() * 4);
  to_dev(d_cu, cu.data(), cu.size() * 4);
  operand out[2], lse[2], part, part_lse;
  auto setup = [&](operand &o, bool is_part, int d, int dt) {
    bool half = is_part && mc.part_is_half;
    int64_t rows = mc.thd ? (half ? TH : T) : (half ? S / 2 : S);
    int64_t n = mc.thd ? rows * H * (d ? d : 1) : (int64_t)B * rows * H * (d ? d : 1);
    if (d)
      o.st = mc.thd ? dl_attn_strides_t{0, H * d, d} : dl_attn_strides_t{rows * H * d, H * d, d};
    else
      o.st = mc.thd ? dl_attn_strides_t{0, 1, rows} : dl_attn_strides_t{H * rows, 1, rows};
    o.alloc(n, dt);
    for (int bi = 0; bi < B; bi++) {
      int64_t len = mc.thd ? cu[bi + 1] - cu[bi] : S;
      int64_t lo = mc.half == DL_ATTN_HALF_SECOND ? len / 2 : 0, hi = mc.half == DL_ATTN_HALF_FIRST ? len / 2 : len;
      for (int64_t i = lo; i < hi; i++) {
        int64_t r = half ? (mc.thd ? (cu[bi] - cu[0]) / 2 : 0) + i - lo : (mc.thd ? cu[bi] : 0) + i;
        for (int h = 0; h < H; h++)
          for (int c = 0; c < (d ? d : 1); c++) o.mine[(mc.thd ? 0 : bi * o.st.b) + r * o.st.s + h * o.st.h + c] = 1;
      }
    }
  };
  setup(part, true, D, DL_BF16), setup(part_lse, true, 0, DL_F32);
  part.fill(randn_clamped), part_lse.fill(ninf_or_rand);
  if (mc.skip_zero) /* zero rows with finite lse: skipped */
    for (size_t r = 0; r * D < part.n; r += 7)
      for (int c = 0; c < D; c++) part.set(r * D + c, 0);
  part.upload(), part_lse.upload();
  uint64_t seed = rng_state;
  for (int g = 0; g < 2; g++) {
    rng_state = seed;
    setup(out[g], false, D, mc.out_dtype), setup(lse[g], false, 0, DL_F32);
    out[g].fill(randn_clamped), lse[g].fill(ninf_or_rand);
    if (mc.mode == DL_ATTN_MERGE_INIT || mc.mode == DL_ATTN_MERGE_ADD) /* a final lse covers every part */
      for (size_t e = 0; e < lse[g].n; e++) lse[g].set(e, lse[g].mine[e] ? 4.0 : lse[g].get(e));
    out[g].upload(), lse[g].upload();
  }
  int rc[2];
  for (int g = 0; g < 2; g++) {
    bool gpu = g == 0;
    dl_attn_merge_params_t m = {};
    m.b = B, m.h = H, m.s = S, m.d = D, m.half = mc.half, m.part_is_half = mc.part_is_half;
    m.mode = mc.mode, m.skip_zero_rows = mc.skip_zero;
    if (mc.thd) m.cu_seqlens_padded = (const int32_t *)(gpu ? d_cu : (void *)cu.data()), m.total = T;
    m.out = ptr(out[g], gpu), m.out_dtype = mc.out_dtype, m.out_st = out[g].st;
    m.lse = (float *)ptr(lse[g], gpu), m.lse_st = lse[g].st;
    m.part = ptr(part, gpu), m.part_dtype = DL_BF16, m.part_st = part.st;
    m.part_lse = (const float *)ptr(part_lse, gpu), m.part_lse_st = part_lse.st;
    if (mc.what == 0) rc[g] = gpu ? dl_attn_merge_lse_cuda(&m, nullptr) : dl_attn_merge_lse_cpu(&m, nullptr);
    if (mc.what == 1) rc[g] = gpu ? dl_attn_merge_out_cuda(&m, nullptr) : dl_attn_merge_out_cpu(&m, nullptr);
    if (mc.what == 2) rc[g] = gpu ? dl_attn_merge_grad_cuda(&m, nullptr) : dl_attn_merge_grad_cpu(&m, nullptr);
    if (gpu) dev_sync();
  }
  dev_free(d_cu);
  verdict vd;
  if (rc[0] || rc[1]) {
    vd.ok = false, vd.text = std::string(" rc: ") + dl_last_error();
  } else {
    out[0].download(), lse[0].download();
    double tol = mc.out_dtype == DL_F32 ? 1e-5 : mc.out_dtype == DL_BF16 ? 1e-2 : 2e-3;
    if (mc.what != 0) vd.add("out", out[0], out[1], tol);
    if (mc.what != 2) vd.add("lse", lse[0], lse[1], 1e-5);
  }
  report(std::string("merge ") + mc.name, vd);
}

/* Requests every launcher must refuse with DL_EINVAL, without launching. */
static void run_validation() {
  verdict vd;
  char dummy[64] __attribute__((aligned(16)));
  dl_attn_params_t good = {};
  good.dtype = DL_BF16, good.b = 1, good.h_q = 4, good.h_kv = 2, good.s_q = good.s_kv = 8;
  good.d_qk = good.d_v = 64, good.scale = 0.125f, good.window_left = good.window_right = -1;
  good.q = good.k = good.v = good.dout = dummy;
  good.out = good.dq = good.dk = good.dv = dummy;
  good.lse = (float *)dummy;
  struct bad_case {
    const char *what;
    void (*edit)(dl_attn_params_t *);
  } bad[] = {
      {"head dim 12", [](dl_attn_params_t *p) { p->d_qk = 12; }},
      {"head dim 264", [](dl_attn_params_t *p) { p->d_v = 264; }},
      {"h_kv not dividing h_q", [](dl_attn_params_t *p) { p->h_kv = 3; }},
      {"null k", [](dl_attn_params_t *p) { p->k = nullptr; }},
      {"dtype fp32", [](dl_attn_params_t *p) { p->dtype = DL_F32; }},
      {"scale 0", [](dl_attn_params_t *p) { p->scale = 0; }},
      {"window -2", [](dl_attn_params_t *p) { p->window_left = -2; }},
      {"misaligned q", [](dl_attn_params_t *p) { p->q = (const char *)p->q + 2; }},
      {"stride not multiple of 8", [](dl_attn_params_t *p) { p->q_st.s = 68; }},
      {"thd without cu_seqlens_kv", [](dl_attn_params_t *p) { p->cu_seqlens_q = (const int32_t *)p->q; }},
  };
  int wrong = 0;
  for (const bad_case &bc : bad) {
    dl_attn_params_t p = good;
    bc.edit(&p);
    /* the twin needs no alignment, and takes fp32 (900b891): it is only asked what it must refuse
       (asked fp32, it ran on the 64-byte dummy and overwrote this stack: a segfault or a failure) */
    bool cpu_too = strcmp(bc.what, "misaligned q") && strcmp(bc.what, "stride not multiple of 8") &&
                   strcmp(bc.what, "dtype fp32");
    int r1 = dl_attn_fwd_cuda(&p, nullptr, nullptr), r2 = cpu_too ? dl_attn_fwd_cpu(&p, nullptr) : DL_EINVAL;
    if (r1 != DL_EINVAL || r2 != DL_EINVAL) {
      wrong++;
      vd.text += std::string(" [") + bc.what + " accepted]";
    }
  }
  dl_attn_params_t p = good;
  p.workspace = dummy, p.workspace_bytes = 16;
  if (dl_attn_bwd_cuda(&p, nullptr, nullptr) != DL_EINVAL) wrong++, vd.text += " [small workspace accepted]";
  vd.ok = wrong == 0;
  if (vd.ok) vd.text = std::string(" e.g. \"") + dl_last_error() + "\"";
  report("validation: bad parameters give DL_EINVAL", vd);
}

/* ---- the case list ------------------------------------------------------------------------- */

/* the --small set (for the sanitizers): every layout and head dim, windows in both
 * alignments, GQA and MQA, fused, accumulate_grads, max_logit */
#define SMALL_CASES {5, 13, 18, 32, 39}

static std::vector<acase> attention_cases() {
  static const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}, {96, 96}, {40, 72}};
  static const int masks[][3] = {{-1, -1, 0}, {-1, 0, 0}, {-1, 0, 1}, {37, 11, 0}, {50, 0, 1}, {0, -1, 1}, {-1, 5, 0}};
  static const int heads[][2] = {{4, 2}, {4, 4}, {4, 1}};
  static const int lens[][2] = {{200, 200}, {77, 190}, {130, 67}, {1, 129}, {256, 256}};
  std::vector<acase> v;
  int n = 0;
  for (int dt : {DL_BF16, DL_F16})
    for (int layout : {BSHD, SBHD, THD})
      for (const auto &mk : masks) {
        acase c;
        c.dtype = dt, c.layout = layout, c.wl = mk[0], c.wr = mk[1], c.br = mk[2];
        /* features cycle with different periods, so they meet in many combinations */
        c.dqk = dims[n % 6][0], c.dv = dims[n % 6][1], c.hq = heads[n / 2 % 3][0], c.hkv = heads[n / 2 % 3][1];
        c.sq = lens[n % 5][0], c.skv = lens[n % 5][1];
        if (layout == THD) c.b = 5, c.ql = {70, 0, 1, 129, 64}, c.kl = {90, 5, 0, 129, 64};
        c.max_logit = n / 3 % 2 == 0, c.acc_grads = n / 4 % 2 == 1, c.row_pad = layout != THD && n / 5 % 2 ? 8 : 0;
        c.fused = n % 7 == 2 ? DL_F32 : n % 7 == 5 ? DL_BF16 : -1;
        v.push_back(c), n++;
      }
  acase mla; /* MLA dims, MQA, thd causal bottom-right, fp32 accumulator */
  mla.layout = THD, mla.b = 3, mla.hq = 8, mla.hkv = 1, mla.dqk = 192, mla.dv = 128, mla.wr = 0, mla.br = 1;
  mla.ql = {33, 150, 64}, mla.kl = {100, 150, 1}, mla.fused = DL_F32, mla.max_logit = true, mla.small = true;
  v.push_back(mla);
  acase big; /* many key blocks: the pipeline, causal */
  big.b = 1, big.hq = big.hkv = 2, big.dqk = big.dv = 128, big.sq = big.skv = 1000, big.wr = 0;
  v.push_back(big);
  acase d256 = big;
  d256.dqk = d256.dv = 256, d256.sq = d256.skv = 300, d256.dtype = DL_F16, d256.acc_grads = true;
  v.push_back(d256);
  acase empty; /* no queries at all, keys present: dk = dv = 0 */
  empty.sq = 0, empty.skv = 50, empty.small = true;
  v.push_back(empty);
  empty.sq = 50, empty.skv = 0, empty.max_logit = true; /* no keys: out 0, lse -inf, dq 0 */
  v.push_back(empty);
  for (int i : SMALL_CASES) v[i].small = true;
  return v;
}

static const mcase merge_cases[] = {
    {"lse bshd all", false, 0, 0, DL_ATTN_HALF_ALL, 0, DL_F32, 0, 72},
    {"lse thd second half, packed part", true, 0, 0, DL_ATTN_HALF_SECOND, 1, DL_F32, 0, 72},
    {"out incremental bshd, fp32 acc", false, 1, DL_ATTN_MERGE_INCR, DL_ATTN_HALF_ALL, 0, DL_F32, 0, 72},
    {"out incremental bshd second half packed, bf16", false, 1, DL_ATTN_MERGE_INCR, DL_ATTN_HALF_SECOND, 1, DL_BF16, 0, 72},
    {"out incremental thd first half, skip zero rows, bf16", true, 1, DL_ATTN_MERGE_INCR, DL_ATTN_HALF_FIRST, 0, DL_BF16, 1, 70},
    {"out incremental thd second half packed, fp32 acc", true, 1, DL_ATTN_MERGE_INCR, DL_ATTN_HALF_SECOND, 1, DL_F32, 1, 72},
    {"out post-loop init bshd, bf16", false, 1, DL_ATTN_MERGE_INIT, DL_ATTN_HALF_ALL, 0, DL_BF16, 0, 72},
    {"out post-loop add thd second half packed, skip zero rows", true, 1, DL_ATTN_MERGE_ADD, DL_ATTN_HALF_SECOND, 1, DL_F32, 1, 72},
    {"grad copy thd second half packed", true, 2, DL_ATTN_GRAD_COPY, DL_ATTN_HALF_SECOND, 1, DL_BF16, 0, 72},
    {"grad add thd first half", true, 2, DL_ATTN_GRAD_ADD, DL_ATTN_HALF_FIRST, 0, DL_BF16, 0, 72},
    {"grad add bshd all, fp16 out", false, 2, DL_ATTN_GRAD_ADD, DL_ATTN_HALF_ALL, 0, DL_F16, 0, 70},
};

int main(int argc, char **argv) {
  bool small = false, list = false;
  const char *filter = nullptr;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small")) small = true;
    if (!strcmp(argv[i], "--list")) list = true;
    if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
  }
  if (!list) run_validation();
  for (const mcase &mc : merge_cases)
    if (!list && (!filter || strstr(mc.name, filter))) run_merge(mc);
  std::vector<acase> cases = attention_cases();
  for (size_t i = 0; i < cases.size(); i++)
    if (list)
      printf("%2zu %s%s\n", i, cases[i].name().c_str(), cases[i].small ? "  [small]" : "");
    else if ((!small || cases[i].small) && (!filter || strstr(cases[i].name().c_str(), filter)))
      run_case(cases[i]);
  if (list) return 0;
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail != 0;
}
