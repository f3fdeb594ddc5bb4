// emu_test.cpp — runs the real kernels/ep/*.cu (through cuda_emu.h) on N
// emulated ranks (host threads sharing memory, each with its own "stream"
// that runs one grid at a time) and checks every output bit for bit against
// the CPU twin (kernels/ep/cpu/ep.c, which spec/ep_spec.lua checks against
// fp64 references) run on a world of its own with the same inputs.
//
//   ./emu_test [ranks] [calls per buffer] [seed] [hidden 256] [threads 64]
//
// Every layout, output and dtype, send and receive in one launch or two;
// per call each rank's T (0..B), routing (random with -1 ids, all of a
// token's experts on one rank, no expert, an expert picked twice: dropped
// and recorded) and data are new; calls run back to back with no host
// synchronisation between ranks, some dispatched twice before their
// combine; for half the layouts the counters start just below their wrap
// (2^32; epochs 2^22). Last, after three whole rounds, rank 1 skips a
// dispatch: rank 0's receive kernel must end by itself and leave a record
// naming the phase, a rank that skipped it, the call and the peer's count.
// Then calls out of step (one rank's dispatch against the others' combine)
// end every rank's kernel with a record of the call, and a dead peer
// (status.gone) one of the death.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "ep/ep.h"
#include "ep/fp8.h"
#include "common/cpu/host_wait.h"

extern "C" int dl_set_error(int code, const char *file, int line, const char *fmt, ...) {
  (void)file;
  (void)line;
  (void)fmt;
  return code;
}

#ifndef EMU_K // selections a token (the Makefile's second binary: 10, past the kernels' K <= 8 fast path)
#define EMU_K 3
#endif
enum { B = 16, K = EMU_K, BLOCKS = 3 };
// hidden size and threads a block: at 1024 and 128 the kernels cut rows
// into segments (ep_split_rows) whenever a call has few rows
static int H = 256, THREADS = 64;

struct rank_state {
  std::vector<char> buf; // the symmetric buffer (4 KiB aligned below)
  char *base = nullptr;
  dl_ep_status_t status{};
  std::vector<uint16_t> x;
  std::vector<int32_t> idx, hidx, counts, ids, src;
  std::vector<float> w, hw, weights, scales;
  std::vector<uint8_t> rx;
  std::vector<uint16_t> y, out;
  int T = 0;
};

struct world {
  int n, layout, output, fp8, E;
  bool emulated;
  std::vector<rank_state> r;
  dl_ep_args_t base{};
};

static int64_t rows_of(const world &w) { return w.output == DL_EP_EXPERT_MAJOR ? (int64_t)w.E * B : (int64_t)w.n * B; }

// Every counter of every rank at `calls` whole calls (ep.h: the counts a
// buffer holds after that many calls of each phase); near 2^22 they wrap.
static void start_at(world &w, uint32_t calls) {
  for (int q = 0; q < w.n; q++) {
    uint32_t *c = reinterpret_cast<uint32_t *>(w.r[q].base);
    for (int p = 0; p < w.n; p++)
      c[dl_ep_disp_flag(w.n, p)] = c[dl_ep_disp_done(w.n, p)] = c[dl_ep_comb_flag(w.n, p)] =
          c[dl_ep_comb_done(w.n, p)] = dl_ep_count_of(calls);
  }
}

// per_rank in Lamport slots (ep.h; dl_ep_new takes them for rank_major output up to
// DL_EP_LAMPORT_MAX_ROWS rows N B: the dispatch's and the combine's; the combine's kernels
// take them for either output), except where lamport is false (the flag)
static void make_world(world &w, int n, int layout, int output, int fp8, int E, bool emulated, bool lamport = true) {
  w.n = n, w.layout = layout, w.output = output, w.fp8 = fp8, w.E = E, w.emulated = emulated;
  const int L = E / n;
  dl_ep_args_t &a = w.base;
  a.lamport = dl_ep_layout_lamport(layout) && lamport;
  a.layout = layout, a.output = output, a.fp8 = fp8, a.nranks = n, a.experts = E, a.local = L, a.topk = K;
  a.hidden = H, a.max_tokens = B, a.blocks = BLOCKS, a.threads = emulated ? THREADS : 1;
  a.hdr = dl_ep_hdr_bytes(layout, K);
  a.msg_d = dl_ep_msg_d(layout, fp8, K, H);
  a.msg_c = dl_ep_msg_c(H);
  a.drecv_off = dl_ep_ctrl_bytes(n, L);
  const int lamport_d = dl_ep_dispatch_lamport(layout, a.lamport, output, fp8);
  a.crecv_off = a.drecv_off + dl_ep_dispatch_bytes(layout, lamport_d, n, E, B, a.msg_d);
  a.timeout_ns = 20000000000ull;
  const int64_t total = a.crecv_off + dl_ep_combine_slots(layout, a.lamport, E, K, B) * a.msg_c;
  w.r.resize(n);
  const int64_t rows = rows_of(w);
  for (int q = 0; q < n; q++) {
    rank_state &s = w.r[q];
    s.buf.assign(total + 4096, (char)0x5a); // garbage everywhere but the control words
    s.base = s.buf.data() + (4096 - (uintptr_t)s.buf.data() % 4096) % 4096;
    memset(s.base, 0, a.drecv_off);
    if (a.lamport) // Lamport slots start empty (ep.h), as dl_ep_new leaves them
      memset(s.base + a.crecv_off, 0xff, (size_t)(dl_ep_combine_slots(layout, 1, E, K, B) * a.msg_c));
    if (lamport_d) memset(s.base + a.drecv_off, 0xff, (size_t)(a.crecv_off - a.drecv_off));
    a.bufs[q] = s.base;
    s.rx.assign(rows * H * (fp8 ? 1 : 2), 0);
    s.scales.assign(rows * (H / 128), 0);
    s.counts.assign(output == DL_EP_EXPERT_MAJOR ? L : n, 0);
    s.ids.assign(rows * K, 0);
    s.weights.assign(rows * K, 0);
    s.src.assign(rows * 2, 0);
    s.hidx.assign(B * K, 0);
    s.hw.assign(B * K, 0);
    s.y.assign(rows * H, 0);
    s.out.assign(B * H, 0);
  }
}

static dl_ep_args_t args_of(world &w, int q, int phase) {
  dl_ep_args_t a = w.base;
  rank_state &s = w.r[q];
  a.phase = phase, a.rank = q, a.tokens = s.T;
  a.x = s.x.data(), a.idx = s.idx.data(), a.w = s.w.data(), a.hidx = s.hidx.data(), a.hw = s.hw.data();
  a.rx = s.rx.data(), a.rscales = s.scales.data(), a.rcounts = s.counts.data(), a.rids = s.ids.data();
  a.rweights = s.weights.data(), a.rsrc = s.src.data(), a.y = s.y.data(), a.out = s.out.data();
  a.status = &s.status;
  return a;
}

// Every rank runs `phase` at once; the emulated kernels or the twin.
static void run(world &w, int phase) {
  std::vector<std::thread> th;
  for (int q = 0; q < w.n; q++)
    th.emplace_back([&w, q, phase] {
      dl_ep_args_t a = args_of(w, q, phase);
      const int rc = w.emulated ? dl_ep_cuda(&a, nullptr) : dl_ep_cpu(&a, nullptr);
      if (rc != 0) fprintf(stderr, "rank %d phase %d returned %d\n", q, phase, rc);
    });
  for (auto &t : th) t.join();
}

// Whether call i runs its send and receive in one launch (DL_EP_DISPATCH,
// DL_EP_COMBINE): every other call emulated, every third on the twin, so
// fused and split calls follow each other on the same buffer.
static bool fused(const world &w, int i) { return w.emulated ? i % 2 == 1 : i % 3 == 0; }

// Rank q's inputs of call c: T, routing, bf16 data.
static void inputs(world &w, int q, int c, std::mt19937 &g) {
  rank_state &s = w.r[q];
  s.T = (int)(g() % (B + 1));
  const int route = (int)(g() % 6), L = w.E / w.n;
  s.x.resize((size_t)B * H);
  s.idx.resize((size_t)B * K);
  s.w.resize((size_t)B * K);
  for (int i = 0; i < s.T * H; i++) s.x[i] = dl_f32_to_bf16((float)((int)(g() % 2001) - 1000) / 256.0f * (1 + c % 3));
  for (int t = 0; t < s.T; t++) {
    const int rank = (int)(g() % w.n);
    for (int k = 0; k < K; k++) {
      int e;
      do {
        e = route == 0 ? rank * L + (int)(g() % L) : (int)(g() % w.E);
        if (route == 1 || (route >= 2 && g() % 8 == 0)) e = -1;
        if (route == 2 && k == 1) e = s.idx[t * K];
      } while (e >= 0 && route != 2 && route != 0 && [&] {
        for (int j = 0; j < k; j++)
          if (s.idx[t * K + j] == e) return true;
        return false;
      }());
      s.idx[t * K + k] = e;
      s.w[t * K + k] = (float)(g() % 1000 + 1) / 997.0f;
    }
  }
}

// Every token of every rank (at least one a rank) routed to an expert of
// each of the first K ranks, so each rank waits for a row of those peers.
static void route_to_every_rank(world &w) {
  for (int q = 0; q < w.n; q++) {
    if (w.r[q].T == 0) w.r[q].T = 1;
    for (int t = 0; t < w.r[q].T; t++)
      for (int k = 0; k < K; k++) w.r[q].idx[(size_t)t * K + k] = k < w.n ? k * (w.E / w.n) : -1;
  }
}

// The experts' outputs from the received rows: x (dequantized) times a
// per-expert factor (expert_major), or the rank's weighted sum (rank_major).
static void experts(world &w, int q) {
  rank_state &s = w.r[q];
  const int L = w.E / w.n, em = w.output == DL_EP_EXPERT_MAJOR;
  auto val = [&](int64_t row, int i) {
    if (!w.fp8) return dl_bf16_to_f32(((uint16_t *)s.rx.data())[row * H + i]);
    return dl_e4m3_to_f32(s.rx[row * H + i]) * s.scales[row * (H / 128) + i / 128];
  };
  auto coef = [&](int le) { return 1.0f + (float)((q * L + le) % 7) / 8.0f; };
  for (int g = 0; g < (int)s.counts.size(); g++)
    for (int r = 0; r < s.counts[g]; r++) {
      const int64_t row = em ? (int64_t)g * w.n * B + r : (int64_t)g * B + r;
      for (int i = 0; i < H; i++) {
        float acc = 0;
        if (em) acc = coef(g) * val(row, i);
        else
          for (int k = 0; k < K; k++)
            if (s.ids[row * K + k] >= 0) acc += s.weights[row * K + k] * coef(s.ids[row * K + k]) * val(row, i);
        s.y[row * H + i] = dl_f32_to_bf16(acc);
      }
    }
}

static std::atomic<int> failures{0};

// Whether a token of rank q picks one expert twice (the kernels drop the
// repeat and record it as a bad id, naming the expert).
static bool repeats(const rank_state &s) {
  for (int t = 0; t < s.T; t++)
    for (int k = 1; k < K; k++)
      for (int j = 0; j < k; j++)
        if (s.idx[t * K + k] >= 0 && s.idx[t * K + k] == s.idx[t * K + j]) return true;
  return false;
}

// After a dispatch: a record on exactly the ranks whose tokens repeat an
// expert, naming one (as the host does, it is then cleared).
static void check_record(world &w, int c) {
  for (int q = 0; q < w.n; q++) {
    dl_ep_status_t &st = w.r[q].status;
    const bool want = repeats(w.r[q]);
    const bool ok = want ? st.kind == DL_EP_ERR_BAD_ID && (int)st.seen >= 0 && (int)st.seen < w.E &&
                               w.r[q].idx[st.peer * K + st.expected] == (int)st.seen
                         : st.kind == 0;
    if (!ok && failures++ < 12)
      fprintf(stderr, "  rank %d call %d (%s): record kind %u (repeated expert: %s)\n", q, c,
              w.emulated ? "emulated" : "twin", st.kind, want ? "yes" : "no");
    st = dl_ep_status_t{};
  }
}

static void expect(bool ok, const char *what, int q, int c, int64_t i) {
  if (!ok && failures++ < 12) fprintf(stderr, "  rank %d call %d: %s differs at %lld\n", q, c, what, (long long)i);
}

// The emulated kernels' outputs against the twin's, bit for bit, where defined.
static void compare_dispatch(world &a, world &b, int c) {
  const int em = a.output == DL_EP_EXPERT_MAJOR;
  for (int q = 0; q < a.n; q++) {
    rank_state &s = a.r[q], &t = b.r[q];
    for (size_t g = 0; g < s.counts.size(); g++) {
      expect(s.counts[g] == t.counts[g], "counts", q, c, (int64_t)g);
      for (int r = 0; r < s.counts[g] && r < t.counts[g]; r++) {
        const int64_t row = em ? (int64_t)g * a.n * B + r : (int64_t)g * B + r;
        const int64_t rb = a.fp8 ? H : 2 * H;
        expect(!memcmp(&s.rx[row * rb], &t.rx[row * rb], rb), "x row", q, c, row);
        if (a.fp8) expect(!memcmp(&s.scales[row * (H / 128)], &t.scales[row * (H / 128)], 4 * (H / 128)), "scales", q, c, row);
        expect(!memcmp(&s.src[row * 2], &t.src[row * 2], 8), "src", q, c, row);
        if (!em) {
          expect(!memcmp(&s.ids[row * K], &t.ids[row * K], 4 * K), "expert ids", q, c, row);
          expect(!memcmp(&s.weights[row * K], &t.weights[row * K], 4 * K), "weights", q, c, row);
        }
      }
    }
    expect(!memcmp(s.hidx.data(), t.hidx.data(), 4 * (size_t)s.T * K), "hidx", q, c, 0);
  }
}

static void compare_combine(world &a, world &b, int c) {
  for (int q = 0; q < a.n; q++)
    expect(!memcmp(a.r[q].out.data(), b.r[q].out.data(), 2 * (size_t)a.r[q].T * H), "combined out", q, c, 0);
}

// Free-running ranks, as GPU streams run: every rank makes all its calls on
// a thread of its own, with no join between calls and random delays, so a
// fast rank's next dispatch or combine meets a slow rank still reading the
// last one (what the waits for the peers' done must hold off). The combined
// outputs of every call must equal the twin's (run phase by phase).
// What rank q received: its counts, then the valid rows of x.
static std::vector<uint8_t> received(world &w, int q) {
  rank_state &s = w.r[q];
  const int em = w.output == DL_EP_EXPERT_MAJOR;
  const int64_t rb = (int64_t)H * (w.fp8 ? 1 : 2);
  std::vector<uint8_t> v((uint8_t *)s.counts.data(), (uint8_t *)(s.counts.data() + s.counts.size()));
  for (int g = 0; g < (int)s.counts.size(); g++)
    for (int r = 0; r < s.counts[g]; r++) {
      const int64_t row = em ? (int64_t)g * w.n * B + r : (int64_t)g * B + r;
      v.insert(v.end(), s.rx.data() + row * rb, s.rx.data() + (row + 1) * rb);
    }
  return v;
}

static void free_running(int n, int layout, int output, int fp8, int E, int calls, unsigned seed, bool lamport = true) {
  world twin, emu;
  make_world(twin, n, layout, output, fp8, E, false);
  make_world(emu, n, layout, output, fp8, E, true, lamport);
  start_at(twin, (1u << 22) - 3);
  start_at(emu, (1u << 22) - 3);
  struct in_t {
    int T;
    std::vector<uint16_t> x;
    std::vector<int32_t> idx;
    std::vector<float> w;
    std::vector<uint16_t> out;
    std::vector<uint8_t> first; // every third call dispatches twice: what the first one received
  };
  std::vector<std::vector<in_t>> in(calls, std::vector<in_t>(n));
  std::mt19937 g(seed);
  std::vector<std::vector<in_t>> pre(calls, std::vector<in_t>(n)); // the first dispatch's inputs
  for (int c = 0; c < calls; c++) {
    if (c % 3 == 1) {
      for (int q = 0; q < n; q++) {
        inputs(twin, q, c, g);
        pre[c][q] = in_t{twin.r[q].T, twin.r[q].x, twin.r[q].idx, twin.r[q].w, {}, {}};
      }
      run(twin, DL_EP_DISPATCH);
      for (int q = 0; q < n; q++) pre[c][q].first = received(twin, q);
    }
    for (int q = 0; q < n; q++) {
      inputs(twin, q, c, g);
      in[c][q] = in_t{twin.r[q].T, twin.r[q].x, twin.r[q].idx, twin.r[q].w, {}, {}};
    }
    run(twin, DL_EP_DISPATCH);
    for (int q = 0; q < n; q++) experts(twin, q);
    run(twin, DL_EP_COMBINE);
    for (int q = 0; q < n; q++) in[c][q].out.assign(twin.r[q].out.begin(), twin.r[q].out.begin() + (size_t)in[c][q].T * H);
  }
  std::vector<std::thread> th;
  for (int q = 0; q < n; q++)
    th.emplace_back([&, q] {
      std::mt19937 d(seed * 31 + q);
      auto stall = [&] {
        if (d() % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(d() % 3000));
      };
      rank_state &s = emu.r[q];
      for (int c = 0; c < calls; c++) {
        if (c % 3 == 1) { // a dispatch, then at once the next: the peers may still be reading the first
          s.T = pre[c][q].T, s.x = pre[c][q].x, s.idx = pre[c][q].idx, s.w = pre[c][q].w;
          dl_ep_args_t a = args_of(emu, q, c % 2 ? DL_EP_DISPATCH : DL_EP_DISPATCH_SEND);
          dl_ep_cuda(&a, nullptr);
          stall();
          if (c % 2 == 0) {
            a = args_of(emu, q, DL_EP_DISPATCH_RECV);
            dl_ep_cuda(&a, nullptr);
          }
          expect(received(emu, q) == pre[c][q].first, "free-running first of two dispatches", q, c, 0);
        }
        s.T = in[c][q].T, s.x = in[c][q].x, s.idx = in[c][q].idx, s.w = in[c][q].w;
        for (int phase : {DL_EP_DISPATCH_SEND, DL_EP_DISPATCH_RECV, DL_EP_DISPATCH}) {
          if ((phase == DL_EP_DISPATCH) != (c % 2 == 1)) continue; // fused every other call
          stall();
          dl_ep_args_t a = args_of(emu, q, phase);
          dl_ep_cuda(&a, nullptr);
        }
        experts(emu, q);
        stall();
        dl_ep_args_t a = args_of(emu, q, DL_EP_COMBINE);
        dl_ep_cuda(&a, nullptr);
        expect(!memcmp(s.out.data(), in[c][q].out.data(), 2 * (size_t)s.T * H), "free-running combined out", q, c, 0);
        if (s.status.kind == DL_EP_ERR_TIMEOUT) expect(false, "free-running: a timeout", q, c, 0);
      }
    });
  for (auto &t : th) t.join();
  printf("free-running %s %s %s (%s): %d calls on %d emulated ranks\n", layout ? "per_rank" : "per_expert",
         output ? "rank_major" : "expert_major", fp8 ? "fp8" : "bf16", emu.base.lamport ? "Lamport" : "flag", calls, n);
}

int main(int argc, char **argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2, calls = argc > 2 ? atoi(argv[2]) : 12;
  const unsigned seed = argc > 3 ? (unsigned)atoi(argv[3]) : 1;
  if (argc > 4) H = atoi(argv[4]);
  if (argc > 5) THREADS = atoi(argv[5]);
  if (H < 128 || H % 128 || THREADS < 32 || THREADS % 32 || THREADS > DL_EP_THREADS) {
    fprintf(stderr, "usage: emu_test [ranks] [calls] [seed] [hidden, a multiple of 128] [threads, a multiple of 32]\n");
    return 2;
  }
  const int E = 2 * n;
  int total = 0;
  for (int combo = 0; combo < 8; combo++) {
    const int layout = combo & 1 ? DL_EP_PER_RANK : DL_EP_PER_EXPERT;
    const int output = combo & 2 ? DL_EP_RANK_MAJOR : DL_EP_EXPERT_MAJOR, fp8 = combo >> 2 & 1;
    world twin, emu;
    make_world(twin, n, layout, output, fp8, E, false);
    // per_rank: Lamport slots (the dispatch's with rank_major and bf16), but expert_major with fp8 (the
    // flag; its combine's Lamport kernels with bf16)
    make_world(emu, n, layout, output, fp8, E, true, output == DL_EP_RANK_MAJOR || !fp8);
    printf("  (%s)\n", !emu.base.lamport ? "flag"
                        : dl_ep_dispatch_lamport(layout, 1, output, fp8) ? "Lamport slots"
                                                                                          : "Lamport combine");
    if (combo & 1) { // the counters wrap (2^32, epochs 2^22) during these calls
      start_at(twin, (1u << 22) - 3);
      start_at(emu, (1u << 22) - 3);
    }
    std::mt19937 g(seed * 100 + combo);
    for (int c = 0; c < calls; c++) {
      const int twice = c % 5 == 2; // a second dispatch before the combine
      for (int d = 0; d <= twice; d++) {
        for (int q = 0; q < n; q++) inputs(twin, q, c, g);
        for (int q = 0; q < n; q++) emu.r[q].T = twin.r[q].T, emu.r[q].x = twin.r[q].x, emu.r[q].idx = twin.r[q].idx,
                                    emu.r[q].w = twin.r[q].w;
        for (world *w : {&twin, &emu}) { // fused (one launch) or send then receive
          if (fused(*w, c + d)) {
            run(*w, DL_EP_DISPATCH);
          } else {
            run(*w, DL_EP_DISPATCH_SEND);
            run(*w, DL_EP_DISPATCH_RECV);
          }
        }
        compare_dispatch(emu, twin, c);
        check_record(emu, c);
        check_record(twin, c);
      }
      for (world *w : {&twin, &emu}) {
        for (int q = 0; q < n; q++) experts(*w, q);
        if (fused(*w, c + 1)) {
          run(*w, DL_EP_COMBINE);
        } else {
          run(*w, DL_EP_COMBINE_SEND);
          run(*w, DL_EP_COMBINE_RECV);
        }
      }
      compare_combine(emu, twin, c);
      for (int q = 0; q < n; q++)
        if (emu.r[q].status.kind)
          fprintf(stderr, "  rank %d call %d: a failure was recorded (kind %u phase %u peer %u call %u seen %u block %u)\n",
                  q, c, emu.r[q].status.kind, emu.r[q].status.phase, emu.r[q].status.peer, emu.r[q].status.expected,
                  emu.r[q].status.seen, emu.r[q].status.block),
              failures++;
      total++;
    }
    printf("layout %s output %s %s: %d calls on %d emulated ranks %s\n", layout ? "per_rank" : "per_expert",
           output ? "rank_major" : "expert_major", fp8 ? "fp8" : "bf16", calls, n, failures ? "FAILED" : "match the twin");
  }
  free_running(n, DL_EP_PER_RANK, DL_EP_RANK_MAJOR, 0, E, calls, seed);
  free_running(n, DL_EP_PER_RANK, DL_EP_RANK_MAJOR, 0, E, calls, seed + 2, false); // the flag (larger buffers)
  free_running(n, DL_EP_PER_EXPERT, DL_EP_EXPERT_MAJOR, 1, E, calls, seed + 1);
  total += 3 * calls;
  // After three whole rounds (the counters wrapping), rank 0 alone makes a
  // fourth dispatch: its receive ends by itself, naming a rank that skipped
  // it and call 4 (in calls since the start: the epoch wraps at 2^22).
  for (int at = 0; at < 2 && n >= 2; at++) {
    world w;
    make_world(w, n, DL_EP_PER_RANK, at ? DL_EP_RANK_MAJOR : DL_EP_EXPERT_MAJOR, 0, E, true);
    const uint32_t first = at ? (1u << 22) - 2 : 0;
    start_at(w, first);
    std::mt19937 g(seed);
    for (int c = 0; c < 3; c++) {
      for (int q = 0; q < n; q++) inputs(w, q, c, g);
      run(w, c % 2 ? DL_EP_DISPATCH : DL_EP_DISPATCH_SEND);
      if (c % 2 == 0) run(w, DL_EP_DISPATCH_RECV);
      for (int q = 0; q < n; q++) experts(w, q);
      run(w, DL_EP_COMBINE);
    }
    for (int q = 0; q < n; q++) inputs(w, q, 0, g);
    for (int q = 0; q < n; q++) w.r[q].status = dl_ep_status_t{}; // a repeated expert's record, if the inputs had one
    // the lone call's wait is short; the rounds before keep the long one (200 ms
    // for them too timed out now and then on 2 cores: 768 threads at 4 ranks)
    w.base.timeout_ns = 200000000ull;
    dl_ep_args_t a = args_of(w, 0, DL_EP_DISPATCH_SEND);
    dl_ep_cuda(&a, nullptr);
    w.r[0].status = dl_ep_status_t{};
    a = args_of(w, 0, DL_EP_DISPATCH_RECV);
    dl_ep_cuda(&a, nullptr);
    const dl_ep_status_t &s = w.r[0].status;
    const uint32_t call = (first + 4) & ((1u << 22) - 1);
    const bool ok = s.kind == DL_EP_ERR_TIMEOUT && s.phase == DL_EP_DISPATCH_RECV && s.peer >= 1 && s.expected == call &&
                    s.seen == call - 1 && s.epoch == call;
    printf("timeout after 3 calls from %u: %s (kind %u phase %u peer %u call %u, its count %u)\n", first,
           ok ? "recorded" : "WRONG", s.kind, s.phase, s.peer, s.expected, s.seen);
    if (!ok) failures++;
  }
  // The same for a combine: after three whole rounds rank 0 alone makes a
  // fourth combine (send, then receive). per_rank's receive polls its
  // Lamport slots (no count to wait for): it must end by itself, naming a
  // rank whose row did not come, call 4 and that rank's count (call 3).
  for (int at = 0; at < 2 && n >= 2; at++) {
    world w;
    make_world(w, n, DL_EP_PER_RANK, at ? DL_EP_RANK_MAJOR : DL_EP_EXPERT_MAJOR, 0, E, true);
    const uint32_t first = at ? (1u << 22) - 2 : 0;
    start_at(w, first);
    std::mt19937 g(seed + 7);
    for (int c = 0; c < 4; c++) {
      for (int q = 0; q < n; q++) inputs(w, q, c, g);
      route_to_every_rank(w); // so rank 0 waits for a row of every peer
      run(w, DL_EP_DISPATCH);
      for (int q = 0; q < n; q++) experts(w, q);
      if (c < 3) run(w, c % 2 ? DL_EP_COMBINE : DL_EP_COMBINE_SEND);
      if (c < 3 && c % 2 == 0) run(w, DL_EP_COMBINE_RECV);
    }
    for (int q = 0; q < n; q++) w.r[q].status = dl_ep_status_t{};
    w.base.timeout_ns = 200000000ull; // the lone call's wait only (above)
    dl_ep_args_t a = args_of(w, 0, DL_EP_COMBINE_SEND);
    dl_ep_cuda(&a, nullptr);
    a = args_of(w, 0, DL_EP_COMBINE_RECV);
    dl_ep_cuda(&a, nullptr);
    const dl_ep_status_t &s = w.r[0].status;
    const uint32_t call = (first + 4) & ((1u << 22) - 1);
    const bool ok = s.kind == DL_EP_ERR_TIMEOUT && s.phase == DL_EP_COMBINE_RECV && s.peer >= 1 &&
                    (int)s.peer < n && s.expected == call && s.seen == call - 1 && s.epoch == call;
    printf("combine timeout after 3 calls from %u: %s (kind %u phase %u peer %u call %u, its count %u)\n", first,
           ok ? "recorded" : "WRONG", s.kind, s.phase, s.peer, s.expected, s.seen);
    if (!ok) failures++;
  }
  // Calls out of step (ep.h, the call tag): after two whole rounds rank 0
  // makes a dispatch where the others make a combine (every token routed to
  // every rank, so each waits for the others); every rank must stop by
  // itself, long before the timeout, recording DL_EP_ERR_CALL with the call.
  // Then a dead peer: rank 0 alone dispatches with status.gone set (rank 1
  // died) and records DL_EP_ERR_GONE.
  for (int at = 0; at < 3 && n >= 2; at++) {
    world w;
    const int layout = at == 2 ? DL_EP_PER_EXPERT : DL_EP_PER_RANK, output = at ? DL_EP_EXPERT_MAJOR : DL_EP_RANK_MAJOR;
    make_world(w, n, layout, output, 0, E, true);
    std::mt19937 g(seed + 11);
    for (int c = 0; c < 2; c++) {
      for (int q = 0; q < n; q++) inputs(w, q, c, g);
      route_to_every_rank(w);
      run(w, DL_EP_DISPATCH);
      for (int q = 0; q < n; q++) experts(w, q);
      run(w, DL_EP_COMBINE);
    }
    for (int q = 0; q < n; q++) w.r[q].status = dl_ep_status_t{};
    const double t0 = dl_host_now_s();
    std::vector<std::thread> th;
    for (int q = 0; q < n; q++)
      th.emplace_back([&w, q] {
        dl_ep_args_t a = args_of(w, q, q == 0 ? DL_EP_DISPATCH : DL_EP_COMBINE);
        dl_ep_cuda(&a, nullptr);
      });
    for (auto &t : th) t.join();
    const double took = dl_host_now_s() - t0;
    for (int q = 0; q < n; q++) {
      const dl_ep_status_t &s = w.r[q].status;
      // call 5 on every rank: two rounds of dispatch and combine before it
      const bool ok = s.kind == DL_EP_ERR_CALL && s.expected == 5 && (q == 0 ? s.phase <= 1 : s.phase >= 2) && took < 10;
      printf("out of step, %s %s, rank %d (%s): %s in %.2f s (kind %u phase %u peer %u call %u, its %u)\n",
             dl_ep_layout_name(layout), output ? "rank_major" : "expert_major", q, q == 0 ? "dispatch" : "combine",
             ok ? "recorded" : "WRONG", took, s.kind, s.phase, s.peer, s.expected, s.seen);
      if (!ok) failures++;
    }
    for (int q = 0; q < n; q++) w.r[q].status = dl_ep_status_t{};
    w.r[0].status.gone = 2; // rank 1 died
    dl_ep_args_t a = args_of(w, 0, DL_EP_DISPATCH);
    dl_ep_cuda(&a, nullptr);
    const dl_ep_status_t &s = w.r[0].status;
    const bool ok = s.kind == DL_EP_ERR_GONE && s.peer == 1;
    printf("dead peer, %s: %s (kind %u phase %u peer %u)\n", dl_ep_layout_name(layout), ok ? "recorded" : "WRONG",
           s.kind, s.phase, s.peer);
    if (!ok) failures++;
  }
  printf("%s: %d calls, %d failures\n", failures ? "FAIL" : "ok", total, failures.load());
  return failures ? 1 : 0;
}
