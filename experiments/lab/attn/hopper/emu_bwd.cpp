// emu_bwd.cpp — runs hopper/bwd_kernel.cuh (the main kernel, both ways of
// adding dQ, and its dQ conversion) on the CPU with the Hopper instructions
// emulated (emu_hopper.h), after a host twin of the portable backward's prep
// (attn_bwd.cu: D = rowsum(dO * O) in fp32, the accumulator zeroed, in its
// workspace layout), against an fp64
// reference of dq, dk, dv: the forward's six (and one with keys but no queries)
// cases (bshd, sbhd, thd with offsets and NaN gaps, GQA/MQA, lengths off the
// tile, keys of other lengths) under five masks at head dim 128, and under
// three at head dim 64, with accumulate_grads on some. Each check also shows
// that a planted 2% error would fail it.
//   make -C experiments/lab/attn hopper-emu-bwd
#include "emu_hopper.h"

#include "attn/hopper/bwd_kernel.cuh"

#include <algorithm>

static uint16_t bf16_of(float f) { return (uint16_t)emu_f32_to_b16(f, true); }
static float f32_of(uint16_t h) { return emu_b16_to_f32(h, true); }

struct hp_case {
  int layout; // 0 bshd, 1 sbhd, 2 thd
  int b, h, h_kv, s;
  std::vector<int> lens, pads; // thd
  std::vector<int> kv_lens;    // thd: the keys' lengths where they differ (packed from row 3, gaps of 2)
};
struct hp_mask {
  int wl, wr, br;
};

// The three gradients' errors against fp64: normwise, and elementwise against |ref| plus the row's
// largest |ref| (at least 1e-3 of the tensor's: a row whose gradient is 0 in exact arithmetic, e.g.
// a query that sees one key, comes out as rounding noise); and the normwise error of the result
// scaled by 1.02 (which must fail).
struct errs {
  double num = 0, den = 0, planted = 0, gmax = 0;
  std::vector<double> d, scale; // |got - ref| and |ref| + the row's largest |ref|, per element
  std::vector<double> rmaxs;    // and that row maximum
  void add(const double *got, const double *ref, int n) {
    double rmax = 0;
    for (int c = 0; c < n; c++) rmax = fmax(rmax, fabs(ref[c]));
    gmax = fmax(gmax, rmax);
    for (int c = 0; c < n; c++) {
      const double e = got[c] - ref[c];
      num += e * e, den += ref[c] * ref[c], planted += (got[c] * 1.02 - ref[c]) * (got[c] * 1.02 - ref[c]);
      d.push_back(got[c] != got[c] ? INFINITY : fabs(e)), scale.push_back(fabs(ref[c])), rmaxs.push_back(rmax);
    }
  }
  double emax() const {
    double m = 0;
    for (size_t i = 0; i < d.size(); i++) m = fmax(m, d[i] / (scale[i] + fmax(rmaxs[i], 1e-3 * gmax) + 1e-30));
    return m;
  }
  double nw() const { return den > 0 ? sqrt(num / den) : sqrt(num); }
  double pw() const { return den > 0 ? sqrt(planted / den) : 1.0; }
};

template <int D, bool BULK> static bool run_case(const hp_case &cs, const hp_mask &mk, unsigned seed, bool accumulate) {
  const bool thd = cs.layout == 2, sbhd = cs.layout == 1;
  const int b = cs.b, h = cs.h, h_kv = cs.h_kv, group = h / h_kv;
  int s = cs.s, s_kv = cs.s, rows = cs.s, rows_kv = cs.s;
  std::vector<int> cu(b + 1, 0), first(b, 0), len(b, cs.s), cu_kv(b + 1, 0), first_kv(b, 0), len_kv(b, cs.s);
  if (thd) {
    s = 0, s_kv = 0, rows = 0, rows_kv = 0;
    for (int bb = 0; bb < b; bb++) {
      len[bb] = cs.lens[bb], first[bb] = cs.pads[bb], cu[bb + 1] = cu[bb] + len[bb];
      s = std::max(s, len[bb]), rows = std::max(rows, first[bb] + len[bb] + 3);
    }
    for (int bb = 0; bb < b; bb++) {
      len_kv[bb] = cs.kv_lens.empty() ? len[bb] : cs.kv_lens[bb];
      first_kv[bb] = cs.kv_lens.empty() ? first[bb] : bb ? first_kv[bb - 1] + len_kv[bb - 1] + 2 : 3;
      cu_kv[bb + 1] = cu_kv[bb] + len_kv[bb], s_kv = std::max(s_kv, len_kv[bb]);
      rows_kv = std::max(rows_kv, first_kv[bb] + len_kv[bb] + 3);
    }
  }
  const int tb = thd ? 1 : b;
  const size_t nq = (size_t)tb * rows * h * D, nk = (size_t)tb * rows_kv * h_kv * D;
  // NaN where no sequence is; the outputs NaN-poisoned too (where a sequence is, unless accumulating)
  std::vector<uint16_t> q(nq, 0x7fc0), o(nq, 0x7fc0), dout(nq, 0x7fc0), k(nk, 0x7fc0), v(nk, 0x7fc0);
  std::vector<uint16_t> dq(nq, 0xffff), dk(nk, 0xffff), dv(nk, 0xffff);
  std::vector<float> lse(thd ? (size_t)h * rows : (size_t)b * h * s, NAN);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t sq[3], sk[3], sl[3];
  hp_strides(sbhd, tb, rows, h, D, sq);
  hp_strides(sbhd, tb, rows_kv, h_kv, D, sk);
  hp_lse_strides(thd, h, thd ? rows : s, sl);
  auto qi = [&](int bb, int pos, int hd) { return (thd ? first[bb] + pos : pos) * sq[0] + hd * sq[1] + (thd ? 0 : bb) * sq[2]; };
  auto ki = [&](int bb, int pos, int hd) { return (thd ? first_kv[bb] + pos : pos) * sk[0] + hd * sk[1] + (thd ? 0 : bb) * sk[2]; };
  auto li = [&](int bb, int pos, int hd) { return (thd ? first[bb] + pos : pos) * sl[0] + hd * sl[1] + (thd ? 0 : bb) * sl[2]; };
  for (int bb = 0; bb < b; bb++) {
    for (int pos = 0; pos < len[bb]; pos++)
      for (int hd = 0; hd < h; hd++)
        for (int c = 0; c < D; c++) {
          q[qi(bb, pos, hd) + c] = bf16_of(u(g)), dout[qi(bb, pos, hd) + c] = bf16_of(u(g));
          if (accumulate) dq[qi(bb, pos, hd) + c] = bf16_of(u(g));
        }
    for (int pos = 0; pos < len_kv[bb]; pos++)
      for (int hd = 0; hd < h_kv; hd++)
        for (int c = 0; c < D; c++) {
          k[ki(bb, pos, hd) + c] = bf16_of(u(g)), v[ki(bb, pos, hd) + c] = bf16_of(u(g));
          if (accumulate) dk[ki(bb, pos, hd) + c] = bf16_of(u(g)), dv[ki(bb, pos, hd) + c] = bf16_of(u(g));
        }
  }
  const std::vector<uint16_t> dq0 = dq, dk0 = dk, dv0 = dv;
  // the forward in fp64: out (rounded to bf16, the kernel's input) and lse
  const double scale = 1.0 / sqrt((double)D);
  auto seen = [&](int bb, int i) {
    std::vector<int> js;
    const int shift = mk.br ? len_kv[bb] - len[bb] : 0;
    for (int j = 0; j < len_kv[bb]; j++)
      if (hp_visible(i, j, shift, mk.wl, mk.wr)) js.push_back(j);
    return js;
  };
  auto dot = [&](const std::vector<uint16_t> &x, size_t xo, const std::vector<uint16_t> &y, size_t yo) {
    double a = 0;
    for (int c = 0; c < D; c++) a += (double)f32_of(x[xo + c]) * f32_of(y[yo + c]);
    return a;
  };
  std::vector<std::vector<double>> P(b * h); // per (bb, hh): [len][len_kv] probabilities
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++) {
      const int hk = hh / group;
      std::vector<double> &pr = P[bb * h + hh];
      pr.assign((size_t)len[bb] * len_kv[bb], 0.0);
      for (int i = 0; i < len[bb]; i++) {
        const std::vector<int> js = seen(bb, i);
        double m = -INFINITY, l = 0;
        for (int j : js) m = fmax(m, scale * dot(q, qi(bb, i, hh), k, ki(bb, j, hk)));
        for (int j : js) l += exp(scale * dot(q, qi(bb, i, hh), k, ki(bb, j, hk)) - m);
        const double lr = js.empty() ? -INFINITY : m + log(l);
        lse[li(bb, i, hh)] = (float)lr;
        for (int j : js) pr[(size_t)i * len_kv[bb] + j] = exp(scale * dot(q, qi(bb, i, hh), k, ki(bb, j, hk)) - (double)(float)lr);
        for (int c = 0; c < D; c++) {
          double a = 0;
          for (int j : js) a += pr[(size_t)i * len_kv[bb] + j] * f32_of(v[ki(bb, j, hk) + c]);
          o[qi(bb, i, hh) + c] = bf16_of((float)a);
        }
      }
    }
  auto map = [&](const std::vector<uint16_t> &x, int heads, const int64_t *st, int nrows, int box_rows) {
    hp_tmap_t m;
    m.base = x.data();
    const uint64_t dims[4] = {(uint64_t)D, (uint64_t)heads, (uint64_t)nrows, (uint64_t)tb};
    const uint64_t bst[3] = {(uint64_t)st[1] * 2, (uint64_t)st[0] * 2, (uint64_t)st[2] * 2};
    const uint32_t box[4] = {64, 1, (uint32_t)box_rows, 1};
    memcpy(m.dims, dims, sizeof dims), memcpy(m.strides, bst, sizeof bst), memcpy(m.box, box, sizeof box);
    return m;
  };
  const hp_tmap_t tq = map(q, h, sq, rows, BQ), tdo = map(dout, h, sq, rows, BQ), tk = map(k, h_kv, sk, rows_kv, BN),
                  tv = map(v, h_kv, sk, rows_kv, BN);
  bwd_params_t p{};
  p.b = b, p.h = h, p.h_kv = h_kv, p.s_q = s, p.s_kv = s_kv;
  p.window_left = mk.wl, p.window_right = mk.wr, p.bottom_right = mk.br;
  p.scale = (float)scale, p.scale_log2 = (float)(scale * 1.4426950408889634);
  if (thd) p.cu_q = cu.data(), p.pad_q = first.data(), p.cu_kv = cu_kv.data(), p.pad_kv = first_kv.data();
  p.lse = lse.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  memcpy(p.dq_st, sq, sizeof sq), memcpy(p.dk_st, sk, sizeof sk), memcpy(p.dv_st, sk, sizeof sk), memcpy(p.lse_st, sl, sizeof sl);
  p.accumulate = accumulate;
  // the portable layout: D [h][ws_rows], dQ [h][ws_rows][D]; NaN where no sequence's row is
  p.ws_rows = thd ? rows : (int64_t)b * s;
  std::vector<float> delta((size_t)h * p.ws_rows, NAN), dq_acc((size_t)h * p.ws_rows * D, NAN);
  p.delta = delta.data(), p.dq_acc = dq_acc.data();
  auto wsr = [&](int bb, int i) { return thd ? (int64_t)first[bb] + i : (int64_t)bb * s + i; };
  for (int bb = 0; bb < b; bb++) // the prep's twin: fp32 sums of bf16 products, the accumulator zeroed
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < len[bb]; i++) {
        float a = 0;
        for (int c = 0; c < D; c++) a += f32_of(dout[qi(bb, i, hh) + c]) * f32_of(o[qi(bb, i, hh) + c]);
        delta[hh * p.ws_rows + wsr(bb, i)] = a;
        for (int c = 0; c < D; c++) dq_acc[(hh * p.ws_rows + wsr(bb, i)) * D + c] = 0.0f;
      }
  const int nb = (s_kv + BN - 1) / BN;
  for (int z = 0; z < b; z++)
    for (int y = 0; y < h_kv; y++)
      for (int x = 0; x < nb; x++) {
        hp_bars.clear(), hp_pending.clear(), hp_named.clear();
        const std::function<void()> one = [&] {
          blockIdx = dim3(x, y, z);
          gridDim = dim3(nb, h_kv, b);
          bwd_kernel<D, D, BULK>(tq, tk, tv, tdo, p);
        };
        emu_run(dim3(1, 1, 1), dim3(THREADS), sizeof(bwd_smem_t<D, D, BULK>) + 1024, one);
        if (!hp_bulks.empty()) {
          fprintf(stderr, "emu: a bulk reduction never waited for\n");
          return false;
        }
        if (!hp_pending.empty()) {
          fprintf(stderr, "emu: a TMA copy never waited for\n");
          return false;
        }
        for (const hp_wg &g : hp_wgs)
          if (!g.open.empty() || !g.groups.empty()) {
            fprintf(stderr, "emu: a wgmma never committed or waited for\n");
            return false;
          }
      }
  const int mb = (s + BQ - 1) / BQ;
  if (mb > 0) {
    const std::function<void()> conv = [&] { bwd_dq_kernel<D>(p); };
    emu_run(dim3(mb, h, b), dim3(128), 0, conv);
  }
  // the reference gradients (D = rowsum(dO * out) with out as given, as dl.attn's backward defines it)
  errs eq, ek, ev;
  std::vector<double> got(D), ref(D);
  for (int bb = 0; bb < b; bb++) {
    const int L = len[bb], LK = len_kv[bb];
    std::vector<double> dS((size_t)h * L * LK, 0.0);
    for (int hh = 0; hh < h; hh++) {
      const int hk = hh / group;
      const std::vector<double> &pr = P[bb * h + hh];
      for (int i = 0; i < L; i++) {
        const double Di = dot(dout, qi(bb, i, hh), o, qi(bb, i, hh));
        for (int j = 0; j < LK; j++) {
          const double pij = pr[(size_t)i * LK + j];
          if (pij != 0) dS[((size_t)hh * L + i) * LK + j] = pij * (dot(dout, qi(bb, i, hh), v, ki(bb, j, hk)) - Di);
        }
        for (int c = 0; c < D; c++) {
          double a = 0;
          for (int j = 0; j < LK; j++) a += dS[((size_t)hh * L + i) * LK + j] * f32_of(k[ki(bb, j, hk) + c]);
          ref[c] = scale * a + (accumulate ? f32_of(dq0[qi(bb, i, hh) + c]) : 0.0);
          got[c] = f32_of(dq[qi(bb, i, hh) + c]);
        }
        eq.add(got.data(), ref.data(), D);
      }
    }
    for (int hk = 0; hk < h_kv; hk++)
      for (int j = 0; j < LK; j++) {
        for (int c = 0; c < D; c++) {
          double a = 0;
          for (int hh = hk * group; hh < (hk + 1) * group; hh++)
            for (int i = 0; i < L; i++) a += dS[((size_t)hh * L + i) * LK + j] * f32_of(q[qi(bb, i, hh) + c]);
          ref[c] = scale * a + (accumulate ? f32_of(dk0[ki(bb, j, hk) + c]) : 0.0);
          got[c] = f32_of(dk[ki(bb, j, hk) + c]);
        }
        ek.add(got.data(), ref.data(), D);
        for (int c = 0; c < D; c++) {
          double a = 0;
          for (int hh = hk * group; hh < (hk + 1) * group; hh++)
            for (int i = 0; i < L; i++) a += P[bb * h + hh][(size_t)i * LK + j] * f32_of(dout[qi(bb, i, hh) + c]);
          ref[c] = a + (accumulate ? f32_of(dv0[ki(bb, j, hk) + c]) : 0.0);
          got[c] = f32_of(dv[ki(bb, j, hk) + c]);
        }
        ev.add(got.data(), ref.data(), D);
      }
  }
  // nothing outside the sequences written: the poison (NaN pattern 0xffff) or the inputs' NaN stay,
  // and no workspace row outside them
  size_t stray = 0;
  std::vector<char> inws((size_t)h * p.ws_rows, 0);
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < len[bb]; i++) inws[hh * p.ws_rows + wsr(bb, i)] = 1;
  for (size_t r = 0; r < inws.size(); r++)
    for (int c = 0; c < D && !inws[r]; c++) stray += dq_acc[r * D + c] == dq_acc[r * D + c]; // not NaN: written
  std::vector<char> inq(nq, 0), ink(nk, 0);
  for (int bb = 0; bb < b; bb++) {
    for (int pos = 0; pos < len[bb]; pos++)
      for (int hd = 0; hd < h; hd++) memset(&inq[qi(bb, pos, hd)], 1, D);
    for (int pos = 0; pos < len_kv[bb]; pos++)
      for (int hd = 0; hd < h_kv; hd++) memset(&ink[ki(bb, pos, hd)], 1, D);
  }
  for (size_t i = 0; i < nq; i++) stray += !inq[i] && dq[i] != dq0[i];
  for (size_t i = 0; i < nk; i++) stray += !ink[i] && (dk[i] != dk0[i] || dv[i] != dv0[i]);
  const double tol_nw = 1e-2, tol_el = 2e-2;
  bool ok = stray == 0, caught = true;
  for (const errs *e : {&eq, &ek, &ev}) {
    ok = ok && e->nw() <= tol_nw && e->emax() <= tol_el;
    caught = caught && (e->den == 0 || e->pw() > tol_nw);
  }
  char what[96];
  if (thd) {
    int w = snprintf(what, sizeof what, "thd lens");
    for (int bb = 0; bb < b; bb++) w += snprintf(what + w, sizeof what - w, "%s%d@%d/%d", bb ? "," : " ", len[bb], first[bb], len_kv[bb]);
  } else {
    snprintf(what, sizeof what, "%s b=%d s=%d", sbhd ? "sbhd" : "bshd", b, s);
  }
  printf("bwd d=%d %s %s h=%d/%d window (%d,%d)%s%s: dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e (normwise/elementwise), "
         "stray %zu; planted 2%%: %.1e %.1e %.1e %s -> %s\n",
         D, BULK ? "bulk" : "red ", what, h, h_kv, mk.wl, mk.wr, mk.br ? " bottom-right" : "", accumulate ? " accumulate" : "", eq.nw(), eq.emax(),
         ek.nw(), ek.emax(), ev.nw(), ev.emax(), stray, eq.pw(), ek.pw(), ev.pw(), caught ? "caught" : "MISSED",
         ok && caught ? "ok" : "FAIL");
  return ok && caught;
}

int main(int argc, char **argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
  bool ok = true;
  const hp_case cases[] = {
      {0, 1, 1, 1, 128, {}, {}},                                  // MHA bshd
      {1, 1, 4, 2, 256, {}, {}},                                  // GQA 4/2 sbhd
      {0, 2, 2, 1, 200, {}, {}},                                  // MQA 2/1, two sequences, s off the tiles
      {2, 4, 2, 1, 0, {130, 0, 1, 77}, {5, 140, 141, 150}, {}},   // thd: lengths 130, 0, 1, 77, offsets, NaN gaps
      {2, 3, 2, 2, 0, {70, 300, 5}, {0, 72, 380}, {260, 40, 0}},  // thd, keys of other lengths (0 too)
      {2, 2, 2, 1, 0, {0, 50}, {0, 3}, {140, 60}},                // thd: no queries for 140 keys (dk, dv = 0)
  };
  // none, causal top-left and bottom-right, a window both ways, a left window bottom-right
  const hp_mask masks[] = {{-1, -1, 0}, {-1, 0, 0}, {-1, 0, 1}, {100, 20, 0}, {64, -1, 1}};
  unsigned seed = 1;
  for (const hp_case &c : cases) {
    for (int m = 0; m < 5; m++) { // dQ by bulk reductions (the default), and by the consumers' (fewer masks)
      if (quick && m % 2) continue;
      ok = run_case<128, true>(c, masks[m], seed++, m == 3) && ok;
      if (m % 2 == 0) ok = run_case<128, false>(c, masks[m], seed++, m == 2) && ok;
    }
    for (int m : {0, 2, 4}) {
      if (quick && m == 4) continue;
      ok = run_case<64, true>(c, masks[m], seed++, m == 2) && ok;
      if (m == 2) ok = run_case<64, false>(c, masks[m], seed++, true) && ok;
    }
  }
  printf("%s\n", ok ? "hopper emu bwd: all ok" : "hopper emu bwd: FAILED");
  return ok ? 0 : 1;
}
