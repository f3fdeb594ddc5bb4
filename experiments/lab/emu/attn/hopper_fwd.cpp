// hopper_fwd.cpp — runs kernels/attn/hopper/fwd_kernel.cuh on the CPU with
// the Hopper instructions emulated (hopper.h), against an fp64 reference: six
// cases (bshd, sbhd, thd with gaps, GQA/MQA, lengths off the tile) under
// five masks, the four loops (PIPE 0-3), the fused merge (into an f32 and a bf16 running out),
// head dims 128, 64 and 192/128, d 64's 192-row CTAs of three consumer warpgroups (M192), and the lazy
// rescale (LAZY: the exps' base moved by more than 2^8 only) at d 128 and 64.
// The TMA store of O (HP_FWD_OPT_TMA_O) in the plain epilogue's runs, and the merge's running rows in and
// out by TMA (HP_FWD_OPT_TMA_M) in the merge's runs where they are staged: ARGS=--tma-o all of them,
// --quick every other one, none otherwise.
//   make -C experiments/lab/emu/attn hopper-emu [ARGS=--quick | ARGS="--pipe N" | ARGS="--tma-o [--pipe N]" |
//                                                ARGS="--m192 [--quick | --pipe N]" | ARGS="--lazy [--quick]"]
#include "hopper.h"

#include "attn/hopper/fwd_kernel.cuh"

// ---- the test -------------------------------------------------------------------------------

// merge: the step merged into a running (acc_out, acc_lse) of random rows, some with lse -inf; acc_out
// fp32 (1) or bf16 (2)
// tma: the kernel with HP_FWD_OPT_TMA_O (O by TMA stores in the plain epilogue), or in a merge with the
// rows staged HP_FWD_OPT_TMA_M (the running rows by TMA loads and stores, the map of the running out)
// m192: with HP_FWD_OPT_M192 (192 rows a CTA, three consumer warpgroups, 512 threads; d 64)
// lazy: with HP_FWD_OPT_LAZY (the exps' base moved by more than 2^8 only), on logits 24 times sharper so
// that blocks raise a row's max past the slack and below it; no max_logit (the launcher keeps LAZY off there)
template <int DQK, int DV = DQK>
static bool run_case(const hp_case &cs, const hp_mask &mk, int pipe, unsigned seed, int merge = 0, bool tma = false,
                     bool m192 = false, bool lazy = false) {
  const double sharp = lazy ? 24.0 : 1.0;
  const int rows_cta = m192 ? fwd_rows(HP_FWD_OPT_M192) : BM;
  const hp_seqs sq_(cs);
  const bool thd = sq_.thd, sbhd = sq_.sbhd;
  const int b = cs.b, h = cs.h, h_kv = cs.h_kv, rows = sq_.rows, rows_kv = sq_.rows_kv, tb = sq_.tb;
  const int s = std::max(sq_.s, sq_.s_kv); // the grid's (and the lse's) longest length
  const std::vector<int> &cu = sq_.cu, &first = sq_.first, &len = sq_.len, &cu_kv = sq_.cu_kv, &first_kv = sq_.first_kv,
                         &len_kv = sq_.len_kv;
  // q [.., DQK], out and acc [.., DV]; k [.., DQK], v [.., DV]
  const size_t n = (size_t)tb * rows * h * DV, nq = (size_t)tb * rows * h * DQK, nk = (size_t)tb * rows_kv * h_kv * DQK,
               nv = (size_t)tb * rows_kv * h_kv * DV;
  std::vector<uint16_t> q(nq, 0x7fc0), k(nk, 0x7fc0), v(nv, 0x7fc0), o(n, 0xffff); // NaN where no sequence is
  std::vector<float> lse(thd ? (size_t)h * rows : (size_t)b * h * s, NAN);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int64_t sq[3], so[3], sk[3], sv[3];
  hp_strides(sbhd, tb, rows, h, DQK, sq);
  hp_strides(sbhd, tb, rows, h, DV, so);
  hp_strides(sbhd, tb, rows_kv, h_kv, DQK, sk);
  hp_strides(sbhd, tb, rows_kv, h_kv, DV, sv);
  // element (sequence bb, position pos, head hd, c) of q, of out (and acc), of k, of v
  auto at_q = [&](const int64_t *st, int bb, int pos, int hd) { return (thd ? first[bb] + pos : pos) * st[0] + hd * st[1] + (thd ? 0 : bb) * st[2]; };
  auto at_kv = [&](const int64_t *st, int bb, int pos, int hd) { return (thd ? first_kv[bb] + pos : pos) * st[0] + hd * st[1] + (thd ? 0 : bb) * st[2]; };
  auto qi = [&](int bb, int pos, int hd) { return at_q(sq, bb, pos, hd); };
  auto oi = [&](int bb, int pos, int hd) { return at_q(so, bb, pos, hd); };
  auto ki = [&](int bb, int pos, int hd) { return at_kv(sk, bb, pos, hd); };
  auto vi = [&](int bb, int pos, int hd) { return at_kv(sv, bb, pos, hd); };
  for (int bb = 0; bb < b; bb++) {
    for (int pos = 0; pos < len[bb]; pos++)
      for (int hd = 0; hd < h; hd++)
        for (int c = 0; c < DQK; c++) q[qi(bb, pos, hd) + c] = bf16_of(u(g));
    for (int pos = 0; pos < len_kv[bb]; pos++)
      for (int hd = 0; hd < h_kv; hd++) {
        for (int c = 0; c < DQK; c++) k[ki(bb, pos, hd) + c] = bf16_of(u(g));
        for (int c = 0; c < DV; c++) v[vi(bb, pos, hd) + c] = bf16_of(u(g));
      }
  }
  const hp_tmap_t tq = hp_map(q, DQK, h, sq, rows, tb, rows_cta), tk = hp_map(k, DQK, h_kv, sk, rows_kv, tb, BN),
                  tv = hp_map(v, DV, h_kv, sv, rows_kv, tb, BN), to = hp_map(o, DV, h, so, rows, tb, 64);
  params_t p{};
  p.b = b, p.h = h, p.h_kv = h_kv, p.s_q = p.s_kv = s;
  p.next_ctas = 1 + (int)(seed % 5); // HP_PREFETCH's stride (the GPU's SMs), small so that most CTAs prefetch
  p.rag_first = seed % 4 != 0;        // the short m-block first (hp_fwd_row_off) in three runs of four
  p.window_left = mk.wl, p.window_right = mk.wr, p.bottom_right = mk.br;
  p.scale_log2 = (float)(sharp * 1.4426950408889634 / sqrt((double)DQK)), p.o = o.data(), p.lse = lse.data();
  memcpy(p.o_st, so, sizeof so);
  hp_lse_strides(thd, h, thd ? rows : s, p.lse_st);
  memcpy(p.acc_st, p.o_st, sizeof sq), memcpy(p.acc_lse_st, p.lse_st, sizeof sq);
  if (thd) p.cu_q = cu.data(), p.pad_q = first.data(), p.cu_kv = cu_kv.data(), p.pad_kv = first_kv.data();
  std::vector<float> acc(merge ? n : 0), acc_lse(merge ? lse.size() : 0);
  std::vector<uint16_t> acc16(merge == 2 ? n : 0); // the bf16 running out
  if (merge) {
    for (size_t i = 0; i < acc.size(); i++) {
      acc[i] = u(g);
      if (merge == 2) acc16[i] = bf16_of(acc[i]), acc[i] = f32_of(acc16[i]);
    }
    for (size_t i = 0; i < acc_lse.size(); i++) acc_lse[i] = i % 7 == 3 ? -INFINITY : 4.0f * u(g);
    p.acc_out = merge == 2 ? (void *)acc16.data() : (void *)acc.data(), p.acc_lse = acc_lse.data();
    p.acc_bf16 = merge == 2;
    const int most = hp_acc_vec(p.acc_out, p.acc_st, merge == 2 ? 2 : 4); // and smaller copies too
    p.acc_vec = std::min(most, 4 << (seed % 3));
  }
  const hp_tmap_t ta = merge == 2 ? hp_map(acc16, DV, h, so, rows, tb, 64) : hp_map(acc, DV, h, so, rows, tb, 64);
  const std::vector<float> acc0 = acc, acc_lse0 = acc_lse;
  const std::vector<uint16_t> acc16_0 = acc16;
  std::vector<float> max_logit(h, -INFINITY);
  p.max_logit = lazy ? nullptr : max_logit.data();
  std::vector<double> want_max(h, -INFINITY); // the reference's
  // one CTA at a time, each with fresh barriers; the kernel of loop `pipe` and the bits OPT
  auto kernel = [&](auto opt_c) {
    constexpr int OPT = decltype(opt_c)::value;
    const hp_tmap_t &om = OPT & HP_FWD_OPT_TMA_O ? to : OPT & HP_FWD_OPT_TMA_M ? ta : tq; // (unread without either)
    if (pipe == 3) fwd_kernel<3, DQK, DV, OPT>(tq, tk, tv, p, om);
    else if (pipe == 2) fwd_kernel<2, DQK, DV, OPT>(tq, tk, tv, p, om);
    else if (pipe == 1) fwd_kernel<1, DQK, DV, OPT>(tq, tk, tv, p, om);
    else fwd_kernel<0, DQK, DV, OPT>(tq, tk, tv, p, om);
  };
  constexpr int O = HP_FWD_OPT, T = HP_FWD_OPT_TMA_O, M = HP_FWD_OPT_M192, L = HP_FWD_OPT_LAZY, TM = HP_FWD_OPT_TMA_M;
  constexpr bool staged = acc_stage_t<DQK, DV>::on; // TMA_M needs the rows staged (not MLA's 192/128)
  auto run = [&](auto opt_c) { // the bits, with LAZY's where lazy
    constexpr int OPT = decltype(opt_c)::value;
    if (lazy) kernel(std::integral_constant<int, OPT | L>{});
    else kernel(opt_c);
  };
  const int mb = (s + rows_cta - 1) / rows_cta;
  const size_t smem = (m192 ? fwd_smem_bytes<DQK, DV, fwd_rows(M)>(merge != 0) : fwd_smem_bytes<DQK, DV>(merge != 0)) - 1024;
  for (int z = 0; z < b; z++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < mb; x++) {
        const bool done = hp_run_cta(dim3(x, y, z), dim3(mb, h, b), m192 ? fwd_threads(M) : THREADS, smem, [&] {
          if constexpr (DQK == 64 && DV == 64)
            if (m192) {
              if (tma && merge) return run(std::integral_constant<int, O | M | TM>{});
              return tma ? run(std::integral_constant<int, O | T | M>{}) : run(std::integral_constant<int, O | M>{});
            }
          if constexpr (staged)
            if (tma && merge) return run(std::integral_constant<int, O | TM>{});
          if (tma) run(std::integral_constant<int, O | T>{});
          else run(std::integral_constant<int, O>{});
        });
        if (!done) return false;
      }
  if (!hp_prefetch_check("fwd")) return false;
  // fp64 reference, every row of every sequence (a sequence with no keys: out 0, lse -inf)
  double num = 0, den = 0, emax = 0, lmax = 0, planted_num = 0;
  const double scale = sharp / sqrt((double)DQK);
  std::vector<double> sc(std::max(s, 1) + 1), accr(DV);
  for (int bb = 0; bb < b; bb++)
    for (int hh = 0; hh < h; hh++)
      for (int i = 0; i < len[bb]; i++) {
        const int hkv = hh / (h / h_kv);
        const int shift = mk.br ? len_kv[bb] - len[bb] : 0;
        std::vector<int> seen; // the keys row i sees
        for (int j = 0; j < len_kv[bb]; j++)
          if (hp_visible(i, j, shift, mk.wl, mk.wr)) seen.push_back(j);
        const int keys = (int)seen.size();
        double m = -INFINITY;
        for (int jj = 0; jj < keys; jj++) {
          const int j = seen[jj];
          double dot = 0;
          for (int c = 0; c < DQK; c++) dot += (double)f32_of(q[qi(bb, i, hh) + c]) * f32_of(k[ki(bb, j, hkv) + c]);
          sc[jj] = dot * scale;
          m = fmax(m, sc[jj]);
          want_max[hh] = fmax(want_max[hh], sc[jj]);
        }
        double l = 0;
        for (int c = 0; c < DV; c++) accr[c] = 0;
        for (int jj = 0; jj < keys; jj++) {
          const double e = exp(sc[jj] - m);
          l += e;
          for (int c = 0; c < DV; c++) accr[c] += e * f32_of(v[vi(bb, seen[jj], hkv) + c]);
        }
        const size_t li = thd ? (size_t)hh * rows + first[bb] + i : ((size_t)bb * h + hh) * s + i;
        double lr = keys ? m + log(l) : -INFINITY;
        std::vector<double> refrow(DV);
        for (int c = 0; c < DV; c++) refrow[c] = keys ? accr[c] / l : 0.0;
        if (merge && lr != -INFINITY) { // the running pair after the merge (a step row with no key: as it was)
          const double l0 = acc_lse0[li], ln = l0 == -INFINITY ? lr : fmax(l0, lr) + log1p(exp(-fabs(l0 - lr)));
          for (int c = 0; c < DV; c++)
            refrow[c] = (l0 == -INFINITY ? 0.0 : acc0[oi(bb, i, hh) + c] * exp(l0 - ln)) + refrow[c] * exp(lr - ln);
          lr = ln;
        } else if (merge) {
          for (int c = 0; c < DV; c++) refrow[c] = acc0[oi(bb, i, hh) + c];
          lr = acc_lse0[li];
        }
        double rmax = 0; // elementwise errors against |ref| plus the row's largest |ref|
        for (int c = 0; c < DV; c++) rmax = fmax(rmax, fabs(refrow[c]));
        for (int c = 0; c < DV; c++) {
          const double ref = refrow[c], got = merge == 2 ? (double)f32_of(acc16[oi(bb, i, hh) + c])
                                              : merge ? (double)acc[oi(bb, i, hh) + c] : (double)f32_of(o[oi(bb, i, hh) + c]);
          const double d = got - ref;
          num += d * d, den += ref * ref, planted_num += (got * 1.02 - ref) * (got * 1.02 - ref);
          emax = got != got ? INFINITY : fmax(emax, fabs(d) / (fabs(ref) + rmax + (keys ? 0.0 : 1.0)));
        }
        const double lg = merge ? acc_lse[li] : lse[li];
        lmax = lg != lg || (lr == -INFINITY) != (lg == -INFINITY) ? INFINITY
               : lr == -INFINITY                                   ? lmax
                                                                   : fmax(lmax, fabs(lg - lr) / fmax(1.0, fabs(lr)));
      }
  // out (or the running out) outside the sequences' rows (thd's gaps, rows past a length) as it was
  std::vector<char> mine(n, 0);
  for (int bb = 0; bb < b; bb++)
    for (int i = 0; i < len[bb]; i++)
      for (int hh = 0; hh < h; hh++)
        for (int c = 0; c < DV; c++) mine[oi(bb, i, hh) + c] = 1;
  size_t touched = 0;
  for (size_t i = 0; i < n; i++)
    if (!mine[i])
      touched += merge == 2 ? acc16[i] != acc16_0[i] : merge ? memcmp(&acc[i], &acc0[i], 4) != 0 : o[i] != 0xffff;
  const double nw = sqrt(num / den), pw = sqrt(planted_num / den);
  double mlmax = 0; // max_logit, every head (not asked for with lazy)
  for (int hh = 0; !lazy && hh < h; hh++)
    mlmax = (want_max[hh] == -INFINITY) != (max_logit[hh] == -INFINITY) || max_logit[hh] != max_logit[hh] ? INFINITY
            : want_max[hh] == -INFINITY ? mlmax
                                        : fmax(mlmax, fabs(max_logit[hh] - want_max[hh]) / fmax(1.0, fabs(want_max[hh])));
  // a bf16 running out is rounded once more (2^-8 relative at most)
  const double nwb = merge == 2 ? 6e-3 : 4e-3;
  const bool ok = nw <= nwb && emax <= 1e-2 && lmax <= 1e-4 && mlmax <= 1e-5 && touched == 0, caught = pw > nwb;
  const std::string what = sq_.what(false);
  printf("d=%d/%d%s%s pipe=%d%s %s h=%d/%d window (%d,%d)%s%s%s: normwise %.2e, elementwise %.2e, lse %.2e, max_logit %.1e; %zu written outside the rows; planted 2%%: %.2e %s -> %s\n",
         DQK, DV, m192 ? " m192" : "", lazy ? " lazy" : "", pipe, tma ? (merge ? " tma-m" : " tma-o") : "", what.c_str(), h, h_kv, mk.wl, mk.wr, mk.br ? " bottom-right" : "", p.rag_first && mk.wr >= 0 && !merge ? " rag-first" : "", merge == 2 ? " merged into bf16" : merge ? " merged" : "", nw, emax, lmax, mlmax, touched, pw, caught ? "caught" : "MISSED",
         ok && caught ? "ok" : "FAIL");
  return ok && caught;
}

// --quick (the CI spec): each case under three masks with the loop taken in turn, the merge with the
// loop taken in turn, d 64 under one mask, d 64's M192 under three, MLA's under one. --pipe N: every
// case, loop N only (and MLA's, which has PIPE 0 alone, only for N = 0). --m192: M192's runs alone.
constexpr int NPIPE = 4; // the loops: PIPE 0 to 3
int main(int argc, char **argv) {
  bool quick = false, tma_all = false, m192_only = false, lazy_only = false;
  int only = -1;
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--quick")) quick = true;
    else if (!strcmp(argv[i], "--tma-o")) tma_all = true;
    else if (!strcmp(argv[i], "--m192")) m192_only = true;
    else if (!strcmp(argv[i], "--lazy")) lazy_only = true;
    else if (!strcmp(argv[i], "--pipe") && i + 1 < argc) only = atoi(argv[++i]);
  // the TMA store of O (the plain epilogue's runs) or the merge's rows by TMA (the merge's): --tma-o every
  // one; --quick every other one; else none
  auto tma = [&](unsigned sd) { return tma_all || (quick && sd % 2 == 1); };
  bool ok = true;
  const std::vector<hp_case> &cases = hp_cases, none;
  const std::vector<hp_case> &others = m192_only || lazy_only ? none : cases; // the runs other than M192's and LAZY's
  const std::vector<hp_case> &lazy_cases = m192_only ? none : cases, &m192_cases = lazy_only ? none : cases;
  const hp_mask *masks = hp_masks;
  unsigned seed = 1;
  int n = 0; // runs so far: quick takes the loops in turn by it
  auto pick = [&](int pipe) { return quick ? pipe == n % NPIPE : only < 0 || pipe == only; };
  for (const hp_case &c : others)
    for (int m = 0; m < 5; m++) {
      if (quick && m % 2 == 0 && m != 2) continue;
      for (int pipe = 0; pipe < NPIPE; pipe++)
        if (pick(pipe)) ok = run_case<128>(c, masks[m], pipe, seed, 0, tma(seed)) && ok, seed++;
      n++;
    }
  for (const hp_case &c : others) // the fused merge into f32 and bf16, causal and not (quick: one of each)
    for (int m = 0; m < 2; m++, n++)
      for (int pipe = 0; pipe < NPIPE; pipe++)
        for (int acc = 1; acc <= 2; acc++)
          if (pick(pipe) && (!quick || acc == 1 + (&c - cases.data() + m) % 2))
            ok = run_case<128>(c, masks[m], pipe, seed, acc, tma(seed)) && ok, seed++;
  for (const hp_case &c : others) // head dim 64: every case under three masks, and merged causal
    for (int m : {0, 2, 4}) {
      if (quick && m != 2) continue;
      for (int pipe = 0; pipe < NPIPE; pipe++)
        if (pick(pipe)) ok = run_case<64>(c, masks[m], pipe, seed, m == 2 ? 1 + seed % 2 : 0, tma(seed)) && ok, seed++;
      n++;
    }
  // head dim 64 with 192-row CTAs (M192, three consumer warpgroups): every case under the five masks
  // (quick: three), causal bottom-right merged (f32 and bf16 in turn), the plain runs with and without
  // the TMA store of O in turn (whatever --tma-o says: the knob takes both), the merged ones with the rows
  // by TMA as --tma-o and --quick say
  for (const hp_case &c : m192_cases)
    for (int m = 0; m < 5; m++) {
      if (quick && m % 2 == 1) continue;
      for (int pipe = 0; pipe < NPIPE; pipe++)
        if (pick(pipe))
          ok = run_case<64>(c, masks[m], pipe, seed, m == 2 ? 1 + seed % 2 : 0, m == 2 ? tma(seed) : seed % 2 == 1, true) && ok, seed++;
      n++;
    }
  // LAZY (HP_FWD_OPT_LAZY, on sharper logits): every case under the five masks at d 128 (PIPE 2, the
  // default, and PIPE 0 in turn) and d 64 (PIPE 1; M192 on every other case), causal top-left merged (f32
  // and bf16 in turn), the TMA store of O on every other plain run (quick: two masks a case)
  for (const hp_case &c : lazy_cases)
    for (int m = 0; m < 5; m++) {
      const int ci = (int)(&c - lazy_cases.data()), t = (ci + m) % 2; // t: what the case and mask take in turn
      if (quick && m != ci % 5 && m != 2) continue;
      const int mg = m == 1 ? 1 + ci % 2 : 0;
      const unsigned s1 = seed++, s2 = seed++; // merged: the rows by TMA as --tma-o and --quick say
      ok = run_case<128>(c, masks[m], t ? 2 : 0, s1, mg, mg ? tma(s1) : t == 1, false, true) && ok;
      ok = run_case<64>(c, masks[m], 1, s2, mg, mg ? tma(s2) : t == 0, t == 1, true) && ok;
    }
  for (const hp_case &c : others) // MLA's 192/128: every case causal bottom-right merged, and a window
    for (int m : {2, 3})
      if (quick ? m == 2 : only <= 0) ok = run_case<192, 128>(c, masks[m], 0, seed++, m == 2) && ok;
  printf("%s\n", ok ? "hopper emu: all ok" : "hopper emu: FAILED");
  return ok ? 0 : 1;
}
