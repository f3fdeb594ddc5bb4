// emu_test.cpp — runs the real kernels/allreduce/*.cu (through cuda_emu.h) on
// N emulated ranks (host threads sharing memory, each with its own "stream"
// that runs one grid at a time) and checks every call exactly.
//
//   ./emu_test [ranks] [calls] [seed]
//
// Each rank runs the same sequence of calls, back to back, without any host
// synchronisation between ranks: random algorithm, dtype, size (1, 7, 4095,
// odd sizes, a few rounds' worth), grid size, zero-copy or copy-in, in place
// or not, aligned or not, and replays of the previous call's arguments (what
// a CUDA graph replay does). Inputs are multiples of 1/4 in [-2, 2], so every
// sum is exact in every dtype and the check is bit-exact; bytes around the
// output must stay untouched. Then the failures: rank 1 skips a call (rank
// 0's kernel must end by itself and leave a record naming rank 1); rank 1
// calls differently (size, dtype, algorithm, grid: every rank must end at
// once with a mismatch, or the abort of a peer that saw it first); rank 1
// comes after rank 0 timed out (it must not complete the call: abort);
// rank 1 dies (the others must end at once, naming it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "allreduce/allreduce.h"
#include "common/dtype.h"

extern "C" int dl_set_error(int code, const char *file, int line, const char *fmt, ...) {
  fprintf(stderr, "dl_set_error %d at %s:%d: %s\n", code, file, line, fmt);
  return code;
}
extern "C" const char *dl_dtype_name(int dtype) { return dtype == 0 ? "f32" : dtype == 1 ? "f16" : "bf16"; }
extern "C" int dl_dtype_size(int dtype) { return dtype == 0 ? 4 : 2; }

enum { GUARD = 64 };
static const int64_t SLOT = 1 << 20; // bytes per staging slot / zero-copy region
// bytes per lamport slot: smaller than a staging slot, as the core sizes it
// (a quarter of max_bytes there), and still above the largest call (65537 f32)
static const int64_t LSLOT = SLOT / 2;
static int64_t lamport_off(int n) { return DL_AR_CTRL_BYTES + SLOT + 2 * n * SLOT; }

struct world {
  int n;
  uint64_t timeout_ns = 3000000000ull;
  std::vector<char *> bufs;
  std::vector<dl_signal_pad_t> pads;
  std::vector<dl_ar_status_t> status;
};

struct call {
  int algo, dtype, blocks, round_vecs, ahead, zc, inplace, misalign;
  int tagged = 0; // one_shot_lamport: tagged vectors (2 x its whole vectors must fit LSLOT)
  int threads = 0; // the Lamport kernels: threads a block (0: the launch shape's), as the core's shape_for sets them
  int64_t n, zc_extra; // zero-copy tensor at this byte offset in the region
};

static double val(int c, int r, int64_t i) { return (double)(((c * 7 + r * 13 + i * 5) % 17) - 8) / 4.0; }

static std::atomic<int> failures{0};

static void fail(int rank, int c, const call &k, const char *what, int64_t i, double got, double want) {
  if (failures++ < 10)
    fprintf(stderr, "rank %d call %d (algo %d dtype %d n %lld blocks %d zc %d inplace %d mis %d): %s at %lld: got %g want %g\n",
            rank, c, k.algo, k.dtype, (long long)k.n, k.blocks, k.zc, k.inplace, k.misalign, what, (long long)i, got, want);
}

// Rank r runs calls (all but the last when skip_last) after delay_s; with
// expect_fail a recorded failure ends it quietly (the caller checks it).
static void rank_main(world *w, int r, const std::vector<call> *calls, int skip_last,
                      double delay_s, bool expect_fail) {
  const int n = w->n;
  if (delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
  // room for the largest call: a staging slot, or two_shot_lamport's piece (n / 2 Lamport slots)
  const size_t room = (size_t)std::max<int64_t>(SLOT, n * LSLOT / 2) + 2 * GUARD + 16;
  std::vector<unsigned char> inbuf(room), outbuf(room);
  for (size_t c = 0; c < calls->size(); c++) {
    const call &k = (*calls)[c];
    if (skip_last && c + 1 == calls->size()) return;
    const int es = dl_dtype_size(k.dtype);
    // where the input and output live
    char *zc_region = w->bufs[r] + DL_AR_CTRL_BYTES;
    char *in, *out;
    if (k.zc) {
      in = zc_region + k.zc_extra;
    } else {
      in = (char *)inbuf.data() + GUARD + (k.misalign ? es : 0);
    }
    if (k.inplace) out = in;
    else out = (char *)outbuf.data() + GUARD + (k.misalign ? es : 0);
    // guards around the output and the zero-copy tensor
    memset(outbuf.data(), 0xa5, outbuf.size());
    if (k.zc) memset(zc_region, 0xa5, SLOT);
    if (k.inplace && !k.zc) memset(inbuf.data(), 0xa5, inbuf.size());
    int reps = (c % 5 == 4) ? 2 : 1; // a "graph replay": same arguments again
    for (int rep = 0; rep < reps; rep++) {
      for (int64_t i = 0; i < k.n; i++) dl_store_f64(in, i, k.dtype, val((int)c + rep, r, i));
      dl_ar_args_t a;
      memset(&a, 0, sizeof a);
      a.algo = k.algo;
      a.dtype = k.dtype;
      a.rank = r;
      a.nranks = n;
      a.blocks = k.blocks;
      a.round_vecs = k.round_vecs;
      a.lamport_ahead = k.ahead;
      a.tagged = k.tagged;
      dl_allreduce_cuda_shape(n, &a.threads, &a.unroll);
      if (k.threads && dl_ar_algo(k.algo)->lamport)
        a.threads = k.threads; // (the failure cases below copy a random call and change its algorithm)
      a.zero_copy = k.zc;
      a.n = k.n;
      a.in = in;
      a.out = out;
      for (int p = 0; p < n; p++) a.bufs[p] = w->bufs[p];
      a.zc_off = DL_AR_CTRL_BYTES + k.zc_extra;
      a.staging_off = DL_AR_CTRL_BYTES + SLOT;
      a.slot_bytes = SLOT;
      a.lamport_off = lamport_off(n);
      a.lamport_stride = LSLOT;
      a.pad = &w->pads[r];
      a.status = &w->status[r];
      a.timeout_ns = w->timeout_ns;
      a.total_n = k.n;
      a.call_hash = dl_ar_args_hash(&a);
      int rc = dl_allreduce_cuda(&a, nullptr);
      if (rc != 0) {
        fail(r, (int)c, k, "launcher returned an error", 0, rc, 0);
        return;
      }
      if (w->status[r].kind) {
        if (!expect_fail)
          fail(r, (int)c, k, "failure recorded", w->status[r].peer, w->status[r].expected, w->status[r].seen);
        return;
      }
      for (int64_t i = 0; i < k.n; i++) {
        double want = 0;
        for (int p = 0; p < n; p++) want += val((int)c + rep, p, i);
        double got = dl_load_f64(out, i, k.dtype);
        if (got != want) {
          fail(r, (int)c, k, "wrong sum", i, got, want);
          break;
        }
      }
      // nothing written outside the output
      const unsigned char *o = (const unsigned char *)out;
      for (int g = 1; g <= 16; g++) {
        if (o[-g] != 0xa5 || o[k.n * es + g - 1] != 0xa5) {
          fail(r, (int)c, k, "wrote outside the output", g, o[-g], o[k.n * es + g - 1]);
          break;
        }
      }
    }
  }
}

// Every buffer as dl_allreduce_new leaves it: counters at zero, the Lamport
// region empty; no failure recorded.
static void reset(world &w) {
  const int n = w.n;
  const int64_t total = DL_AR_CTRL_BYTES + SLOT + 2 * n * SLOT + 2 * n * LSLOT;
  if (w.bufs.empty())
    for (int r = 0; r < n; r++) w.bufs.push_back((char *)aligned_alloc(4096, total));
  for (int r = 0; r < n; r++) {
    memset(w.bufs[r], 0, lamport_off(n));
    memset(w.bufs[r] + lamport_off(n), 0xff, total - lamport_off(n));
  }
  memset(w.pads.data(), 0, sizeof(dl_signal_pad_t) * n);
  memset(w.status.data(), 0, sizeof(dl_ar_status_t) * n);
}

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Whether a one_shot_lamport call of n elements of dtype fits the tagged form (the core's tagged_fits).
static bool tagged_fits(int64_t n, int dtype) {
  const int64_t whole = (n * dl_dtype_size(dtype) + 15) / 16 * 16;
  return 2 * whole <= LSLOT;
}

// Rank 1 calls `theirs`, the others `mine`: every rank must end well before
// the timeout, each with a mismatch naming a rank that differs from it, or
// with the abort of a rank that saw one first. At 2 ranks every rank must
// name the mismatch as the host reports it: an abort whose sender's call
// and ours (both in our ctrl) differ is reported as that mismatch
// (dl_ar_calls_differ, core/ops/allreduce).
static bool mismatch_case(world &w, const call &mine, const call &theirs, const char *what) {
  reset(w);
  std::vector<call> a(1, mine), b(1, theirs);
  std::vector<std::thread> ranks;
  const double t0 = now_s();
  for (int r = 0; r < w.n; r++) ranks.emplace_back(rank_main, &w, r, r == 1 ? &b : &a, 0, 0.0, true);
  for (auto &t : ranks) t.join();
  const double took = now_s() - t0;
  bool ok = took < 0.5 * w.timeout_ns * 1e-9;
  int mismatches = 0, reported = 0;
  for (int r = 0; r < w.n; r++) {
    const dl_ar_status_t &s = w.status[r];
    mismatches += s.kind == DL_AR_FAIL_MISMATCH;
    const bool named = s.kind == DL_AR_FAIL_MISMATCH ? (r == 1) != (s.peer == 1) : s.kind == DL_AR_FAIL_ABORT;
    ok = ok && named && s.seq == 0;
    dl_ar_call_t a, b;
    const dl_ar_ctrl_t *c = reinterpret_cast<const dl_ar_ctrl_t *>(w.bufs[r]);
    reported += s.kind == DL_AR_FAIL_MISMATCH ||
                (s.kind == DL_AR_FAIL_ABORT && s.peer < (uint32_t)w.n &&
                 dl_ar_calls_differ(&c->calls[s.seq & 1][r], &c->calls[s.seq & 1][s.peer], s.seq, &a, &b));
  }
  ok = ok && mismatches > 0 && (w.n != 2 || reported == 2);
  printf("mismatch (%s): %.2f s, kinds", what, took);
  for (int r = 0; r < w.n; r++) printf(" %u/%u", w.status[r].kind, w.status[r].peer);
  printf(": %s\n", ok ? "ok" : "FAILED");
  return ok;
}

// Rank 0 times out waiting for rank 1, which comes afterwards: rank 1 must
// not complete the call against rank 0's abandoned one.
static bool late_case(world &w, const call &k) {
  reset(w);
  std::vector<call> one(1, k);
  std::vector<std::thread> ranks;
  for (int r = 0; r < w.n; r++)
    ranks.emplace_back(rank_main, &w, r, &one, 0, r == 1 ? w.timeout_ns * 1e-9 + 0.3 : 0.0, true);
  for (auto &t : ranks) t.join();
  // the others time out on rank 1 (or take the abort of one that did first)
  bool ok = w.status[1].kind == DL_AR_FAIL_ABORT && w.status[1].peer != 1;
  for (int r = 0; r < w.n; r++)
    if (r != 1)
      ok = ok && ((w.status[r].kind == DL_AR_FAIL_TIMEOUT && w.status[r].peer == 1) ||
                  (w.status[r].kind == DL_AR_FAIL_ABORT && w.status[r].peer != 1));
  printf("late peer (algo %d): rank 0 kind %u, rank 1 kind %u (gave up: rank %u): %s\n", k.algo,
         w.status[0].kind, w.status[1].kind, w.status[1].peer, ok ? "ok" : "FAILED");
  return ok;
}

// Rank 1 never comes and the host's watchdog says its process is gone
// (status.gone, as core/comm/peers.c writes it) 50 ms in: every other rank
// must end at once with the death, not at the timeout.
static bool dead_case(world &w, const call &k) {
  reset(w);
  std::vector<call> one(1, k);
  std::vector<std::thread> ranks;
  const double t0 = now_s();
  for (int r = 0; r < w.n; r++)
    if (r != 1) ranks.emplace_back(rank_main, &w, r, &one, 0, 0.0, true);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int r = 0; r < w.n; r++) __atomic_store_n(&w.status[r].gone, 2u, __ATOMIC_RELEASE);
  for (auto &t : ranks) t.join();
  const double took = now_s() - t0;
  bool ok = took < 0.5 * w.timeout_ns * 1e-9;
  for (int r = 0; r < w.n; r++)
    if (r != 1)
      ok = ok && ((w.status[r].kind == DL_AR_FAIL_DEAD && w.status[r].peer == 1) ||
                  (w.status[r].kind == DL_AR_FAIL_ABORT && w.status[r].peer != 1));
  printf("dead peer (algo %d): %.2f s, rank 0 kind %u peer %u: %s\n", k.algo, took, w.status[0].kind,
         w.status[0].peer, ok ? "ok" : "FAILED");
  return ok;
}

// A call's grid, round length and steps ahead at random, in place or not, no zero copy.
static void any_grid(const world &w, std::mt19937 &rng, call &k) {
  int threads, unroll;
  dl_allreduce_cuda_shape(w.n, &threads, &unroll);
  k.blocks = 1 + rng() % 4;
  k.round_vecs = 1 + rng() % (3 * threads * unroll);
  k.ahead = rng() % 4;
  k.zc = 0;
  k.inplace = rng() % 2;
  k.zc_extra = 0;
}

// Every rank runs calls; true when no call failed and every rank's Lamport
// region is empty again after them (each word emptied by its reader).
static bool run_emptied(world &w, const std::vector<call> &calls) {
  failures = 0;
  std::vector<std::thread> ranks;
  for (int r = 0; r < w.n; r++) ranks.emplace_back(rank_main, &w, r, &calls, 0, 0.0, false);
  for (auto &t : ranks) t.join();
  for (int r = 0; r < w.n; r++)
    for (int64_t i = lamport_off(w.n); i < lamport_off(w.n) + 2 * w.n * LSLOT; i++)
      if ((unsigned char)w.bufs[r][i] != 0xff) {
        fprintf(stderr, "rank %d: lamport byte %lld not empty\n", r, (long long)(i - lamport_off(w.n)));
        return false;
      }
  return failures == 0;
}

// Tagged one_shot_lamport back to back with untagged ones and other
// algorithms (so each half is used by both forms in turn): every dtype,
// sizes at and around the limit (2 x the whole vectors = LSLOT: f32 65536
// fits, 65537 does not and runs untagged), tails, misaligned (the AL=false
// path) and in place; sums exact.
static bool tagged_sums(world &w, unsigned seed) {
  reset(w);
  std::mt19937 rng(seed + 100);
  std::vector<call> calls;
  const int64_t f32_sizes[] = {1, 3, 4, 5, 8191, 65535, 65536, 65537};
  for (int c = 0; c < 48; c++) {
    call k;
    k.dtype = c % 3;
    const int64_t per = k.dtype == 0 ? 1 : 2; // elements of 16-bit dtypes a f32 element's bytes hold
    k.n = f32_sizes[(c / 3) % 8] * per + (k.dtype && c % 2 ? -1 : 0);
    if (k.n < 1) k.n = 1;
    k.algo = c % 4 == 3 ? (c % 8 == 3 ? DL_AR_TWO_SHOT_LAMPORT : DL_AR_ONE_SHOT_PUSH) : DL_AR_ONE_SHOT_LAMPORT;
    k.tagged = k.algo == DL_AR_ONE_SHOT_LAMPORT && c % 4 != 2 && tagged_fits(k.n, k.dtype);
    any_grid(w, rng, k);
    k.misalign = rng() % 4 == 0;
    calls.push_back(k);
  }
  int tagged = 0;
  for (const call &k : calls) tagged += k.tagged;
  // the region empty again: every word a tagged call wrote was emptied by its reader
  const bool ok = run_emptied(w, calls) && tagged > 0;
  printf("tagged sums (%zu calls, %d tagged, at and around the limit): %s\n", calls.size(), tagged, ok ? "ok" : "FAILED");
  return ok;
}

// two_shot_lamport at its piece limit (n / 2 Lamport slots at 3+ ranks, one at 2:
// a slot holds two of the n slices, kernels/allreduce/lamport.cuh) and a few
// elements below it, back to back (both halves), every dtype, in place or not,
// misaligned (the AL=false path); sums exact and the region empty after.
static bool two_shot_lamport_limit(world &w, unsigned seed) {
  reset(w);
  std::mt19937 rng(seed + 200);
  const int64_t most = w.n > 2 ? LSLOT / 2 * w.n : LSLOT; // bytes (the core's lamport_piece)
  std::vector<call> calls;
  for (int c = 0; c < 8; c++) {
    call k;
    k.algo = DL_AR_TWO_SHOT_LAMPORT;
    k.dtype = c % 3;
    k.n = most / dl_dtype_size(k.dtype) - (c % 2 ? 1 + rng() % 7 : 0);
    any_grid(w, rng, k);
    k.misalign = c % 4 == 3;
    calls.push_back(k);
  }
  const bool ok = run_emptied(w, calls);
  printf("two_shot_lamport at its piece limit (%lld bytes, %zu calls): %s\n", (long long)most, calls.size(), ok ? "ok" : "FAILED");
  return ok;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  int ncalls = argc > 2 ? atoi(argv[2]) : 200;
  unsigned seed = argc > 3 ? (unsigned)atoi(argv[3]) : 1;
  world w;
  w.n = n;
  w.pads.resize(n);
  w.status.resize(n);
  reset(w);
  std::mt19937 rng(seed);
  const int64_t sizes[] = {1, 7, 8, 9, 31, 4095, 4096, 12345, 40001, 65537};
  std::vector<call> calls;
  for (int c = 0; c < ncalls; c++) {
    call k;
    k.algo = 1 + rng() % (DL_AR_NUM_ALGOS - 1); // every algorithm but nccl
    k.dtype = rng() % 3;
    k.n = sizes[rng() % 10];
    int threads, unroll;
    dl_allreduce_cuda_shape(n, &threads, &unroll);
    k.blocks = 1 + rng() % 5;
    // any round length: partial steps (as the core's even spread gives) and several steps
    k.round_vecs = 1 + rng() % (3 * threads * unroll);
    k.ahead = rng() % 4; // one_shot_lamport: steps pushed ahead (0: all)
    const dl_ar_algo_t *row = dl_ar_algo(k.algo); // its traits (kernels/allreduce/algos.h)
    k.zc = row->zero_copy != DL_AR_ZC_NONE && rng() % 3 == 0;
    k.inplace = rng() % 2;
    if (k.zc && row->zero_copy == DL_AR_ZC_APART) k.inplace = 0; // the core copies in instead
    if (k.zc && row->zero_copy == DL_AR_ZC_IN_PLACE) k.inplace = 1; // two-shot zero copy is in place
    k.misalign = !k.zc && rng() % 5 == 0;
    k.zc_extra = k.zc ? 16 * (int64_t)(1 + rng() % 4) : 0;
    // half the tagging (one_shot_lamport) calls that fit go tagged (the core: up to its limit)
    k.tagged = row->tagged && tagged_fits(k.n, k.dtype) && rng() % 2 == 0;
    // the Lamport kernels on blocks of fewer threads, in whole "warps" (DL_AR_WARP, 8 here), one a rank at least
    if (row->lamport && rng() % 2 == 0)
      k.threads = std::max(n, DL_AR_WARP * (int)(1 + rng() % (threads / DL_AR_WARP)));
    calls.push_back(k);
  }
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; r++) ranks.emplace_back(rank_main, &w, r, &calls, 0, 0.0, false);
  for (auto &t : ranks) t.join();
  printf("%d ranks, %d calls: %s\n", n, ncalls, failures ? "FAILED" : "ok");
  for (int r = 0; r < n; r++)
    printf("  rank %d: seq %u done %u\n", r, ((dl_ar_ctrl_t *)w.bufs[r])->seq, ((dl_ar_ctrl_t *)w.bufs[r])->done);
  if (failures) return 1;

  // the failures need no margin for a slow emulation: a second is long
  w.timeout_ns = 1000000000ull;
  // rank 1 skips the last call: rank 0 must time out and say so (with the
  // first call's algorithm, then with the Lamport ones, whose waits poll data)
  bool ok = true;
  for (int algo : {calls[0].algo, (int)DL_AR_ONE_SHOT_LAMPORT, (int)DL_AR_TWO_SHOT_LAMPORT, -1}) {
    std::vector<call> last(1, calls[0]);
    last[0].algo = algo;
    last[0].zc = 0;
    last[0].blocks = 2;
    if (algo < 0) { // one_shot_lamport, tagged
      last[0].algo = algo = DL_AR_ONE_SHOT_LAMPORT;
      last[0].n = 4095;
      last[0].tagged = 1;
    }
    memset(w.pads.data(), 0, sizeof(dl_signal_pad_t) * n);
    memset(w.status.data(), 0, sizeof(dl_ar_status_t) * n);
    ranks.clear();
    failures = 0;
    for (int r = 0; r < n; r++) ranks.emplace_back(rank_main, &w, r, &last, r == 1, 0.0, true);
    for (auto &t : ranks) t.join();
    const dl_ar_status_t &s = w.status[0];
    printf("timeout: rank 0 status kind %u peer %u expected %u seen %u block %u algo %u seq %u; pad error %u %u\n",
           s.kind, s.peer, s.expected, s.seen, s.block, s.algo, s.seq, w.pads[0].error[0], w.pads[0].error[1]);
    // with 3 or more ranks another waiter may time out first and abort: its
    // abort, naming it, is the record then
    bool here = ((s.kind == DL_SIGNAL_ERR_BARRIER && s.peer == 1) ||
                 (n > 2 && s.kind == DL_AR_FAIL_ABORT && s.peer != 1)) &&
                s.algo == (uint32_t)algo && w.pads[0].error[0] == s.kind;
    printf("timeout path (algo %d%s): %s\n", algo, last[0].tagged ? ", tagged" : "", here ? "ok" : "FAILED");
    ok = ok && here;
  }

  // ranks that call differently, a peer that comes too late, a dead one
  call base = calls[0];
  base.zc = 0;
  base.inplace = 0;
  base.misalign = 0;
  base.n = 4095;
  base.blocks = 2;
  base.algo = DL_AR_TWO_SHOT;
  for (int i = 0; i < 6; i++) {
    call other = base;
    const char *what = "";
    switch (i) {
    case 0: other.n = 4096; what = "size"; break;
    case 1: other.dtype = (base.dtype + 1) % 3; what = "dtype"; break;
    case 2: other.algo = DL_AR_ONE_SHOT; what = "algorithm two_shot vs one_shot"; break;
    case 3: other.algo = DL_AR_ONE_SHOT_LAMPORT; what = "algorithm two_shot vs one_shot_lamport"; break;
    case 4: other.blocks = 3; what = "grid"; break;
    case 5: other.round_vecs = base.round_vecs + 32; what = "round length"; break;
    }
    ok = mismatch_case(w, base, other, what) && ok;
  }
  // both sides Lamport: a rank whose data never comes must stop at the
  // record, well before the timeout. Every thread of such a grid polls
  // until it sees the record (each an OS thread here: on 2 cores under load
  // that took up to 0.56 s at 4 ranks), so a timeout of 3 s for these, half
  // of which still tells a stop at the record from the timeout.
  w.timeout_ns = 3000000000ull;
  for (int i = 0; i < 4; i++) {
    call mine = base, other = base;
    mine.algo = other.algo = i < 2 ? DL_AR_ONE_SHOT_LAMPORT : DL_AR_TWO_SHOT_LAMPORT;
    const char *what = "";
    switch (i) {
    case 0: other.n = 4096; what = "one_shot_lamport size"; break;
    case 1: other.algo = DL_AR_TWO_SHOT_LAMPORT; what = "one_shot_lamport vs two_shot_lamport"; break;
    case 2: other.n = 2047; what = "two_shot_lamport size"; break;
    case 3: other.dtype = (base.dtype + 1) % 3; what = "two_shot_lamport dtype"; break;
    }
    ok = mismatch_case(w, mine, other, what) && ok;
  }
  // tagged one_shot_lamport (its vectors say which call sent them, nothing
  // waits for a peer's call): a mismatch must be seen in the data, at once
  for (int i = 0; i < 7; i++) {
    call mine = base, other = base;
    mine.algo = other.algo = DL_AR_ONE_SHOT_LAMPORT;
    mine.tagged = other.tagged = 1;
    const char *what = "";
    switch (i) {
    case 0: other.n = 4096; what = "tagged size"; break;
    case 1: other.dtype = (base.dtype + 1) % 3; what = "tagged dtype"; break;
    case 2: other.n = 70001; other.tagged = 0; what = "tagged vs untagged size (one over the limit)"; break;
    case 3: other.tagged = 0; what = "tagged vs untagged, same size (the limit differs)"; break;
    case 4: other.algo = DL_AR_TWO_SHOT_LAMPORT; other.tagged = 0; what = "tagged vs two_shot_lamport"; break;
    case 5: other.algo = DL_AR_TWO_SHOT; other.tagged = 0; what = "tagged vs two_shot"; break;
    case 6: other.n = 1; what = "tagged size 4095 vs 1"; break;
    }
    ok = mismatch_case(w, mine, other, what) && ok;
  }
  w.timeout_ns = 1000000000ull;
  for (int algo : {(int)DL_AR_ONE_SHOT_PUSH, (int)DL_AR_TWO_SHOT_LAMPORT, (int)DL_AR_ONE_SHOT_LAMPORT, -1}) {
    call k = base;
    k.algo = algo < 0 ? DL_AR_ONE_SHOT_LAMPORT : algo;
    k.tagged = algo < 0;
    ok = late_case(w, k) && ok;
  }
  for (int algo : {(int)DL_AR_TWO_SHOT, (int)DL_AR_ONE_SHOT_LAMPORT, -1}) {
    call k = base;
    k.algo = algo < 0 ? DL_AR_ONE_SHOT_LAMPORT : algo;
    k.tagged = algo < 0;
    ok = dead_case(w, k) && ok;
  }
  ok = tagged_sums(w, seed) && ok;
  ok = two_shot_lamport_limit(w, seed) && ok;
  return ok ? 0 : 1;
}
