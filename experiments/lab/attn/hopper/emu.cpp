// emu.cpp — runs hopper/fwd_kernel.cuh on the CPU, on the attention lab's
// warp emulator (../emu/cuda_emu.h: every CUDA thread a coroutine, warps in
// a shuffled order, shared memory starting as NaN garbage), with the Hopper
// instructions emulated here as the PTX ISA and CUTLASS's canonical layouts
// define them:
//   mbarrier   arrival count, transaction bytes, phase parity (try_wait is
//              true once the phase of the given parity completed);
//   TMA        a box of a 4-d tensor into shared memory, rows of 128 bytes
//              with the 128-byte swizzle (16-byte chunk c of row r lands at
//              chunk c ^ (r % 8)), zeros outside the tensor; it lands either
//              at once or only when a thread polls its barrier (a coin), and
//              completes that many transaction bytes;
//   wgmma      m64n128k16, bf16 in, fp32 accumulators: a collective of the
//              128 threads of a warpgroup, A and B decoded from shared
//              memory descriptors (K-major: row r at (r % 8) * 128 + (r / 8)
//              * SBO; MN-major: 8 elements a 16-byte unit, units (n / 8) % 8
//              apart by 16 bytes and n / 64 by LBO, k % 8 by 128 bytes and
//              k / 8 by SBO; then the swizzle on the address) or A from each
//              thread's registers, D in the accumulator layout (thread t,
//              value v: row 16 (t / 32) + (t % 32) / 4 + 8 ((v / 2) % 2),
//              column 8 (v / 4) + 2 (t % 4) + v % 2). Asynchronous as on the
//              GPU: a wgmma runs at the wgmma.wait_group that covers its
//              commit group, reading shared memory and adding to the
//              accumulators then, so a stage reused, or accumulators read or
//              written, before that wait give wrong results.
// This checks the kernel's own logic (fragment maps, softmax, masks, the
// pipeline's barriers and phases, the epilogue) against an fp64 reference;
// it cannot check that the hardware reads the layouts as emulated: that is
// what the first GPU run (scripts/gpu/hopper_lab.sh) is for.
//   make -C experiments/lab/attn hopper-emu
#define HOPPER_EMU
#include "../emu/cuda_emu.h"

#include <map>
#include <random>

#define HP_DEV inline
#define HP_HD inline
#define HP_GRID_CONST
struct float2 {
  float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

struct hp_tmap_t {
  const uint16_t *base;
  uint64_t dims[4], strides[3]; // strides in bytes of dims 1..3
  uint32_t box[4];
};

// ---- shared memory addresses: offsets that keep the real pointer's alignment mod 1024 ----

static inline uint32_t hp_off0() { return (uint32_t)((uintptr_t)emu.smem % 1024); }
HP_DEV char *hp_smem() { return emu.smem; }
HP_DEV uint32_t hp_smem_u32(const void *p) {
  const ptrdiff_t o = (const char *)p - emu.smem;
  if (o < 0 || (size_t)o >= emu.smem_bytes) {
    fprintf(stderr, "emu: pointer outside shared memory\n");
    abort();
  }
  return (uint32_t)o + hp_off0();
}
static inline char *hp_ptr(uint32_t addr, size_t bytes) {
  const int64_t o = (int64_t)addr - hp_off0();
  if (o < 0 || (size_t)o + bytes > emu.smem_bytes) {
    fprintf(stderr, "emu: shared address %u (%zu bytes) outside shared memory\n", addr, bytes);
    abort();
  }
  return emu.smem + o;
}
static inline uint32_t hp_swizzle(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

HP_DEV void hp_sync() { attn_sync(); }
HP_DEV void hp_syncwarp() { attn_syncwarp(); }
HP_DEV void hp_atomic_max(float *dst, float x) { *dst = fmaxf(*dst, x); } // one thread runs at a time
HP_DEV int hp_warp_uniform(int x) { return x; } // the kernel passes values that are the same in every lane
HP_DEV float hp_exp2(float x) { return exp2f(x); }
HP_DEV void prefetch_l2(const void *) {}
template <int N> HP_DEV void reg_alloc() {}
template <int N> HP_DEV void reg_dealloc() {}
HP_DEV float hp_shfl_xor(float x, int m) { return attn_shfl_xor(x, m); }
HP_DEV uint32_t pack_bf16(float lo, float hi) { return emu_f32_to_b16(lo, true) | emu_f32_to_b16(hi, true) << 16; }

// ---- mbarriers and TMA ----------------------------------------------------------------------

struct hp_mbar {
  uint32_t count = 0, pending = 0, phase = 0;
  int64_t tx = 0;
};
struct hp_copy {
  uint32_t dst, bar;
  const hp_tmap_t *map;
  int c[4];
};
static std::map<uint32_t, hp_mbar> hp_bars; // by shared address, per CTA (cleared by the test between CTAs)
static std::vector<hp_copy> hp_pending;
static std::mt19937 hp_coin(7);

static hp_mbar &hp_bar(uint64_t *b) {
  auto it = hp_bars.find(hp_smem_u32(b));
  if (it == hp_bars.end()) {
    fprintf(stderr, "emu: mbarrier used before mbarrier.init\n");
    abort();
  }
  return it->second;
}
static void hp_complete_if(hp_mbar &m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase++;
    m.pending = m.count;
    emu.progress++;
  }
}
HP_DEV void mbar_init(uint64_t *b, uint32_t count) {
  hp_mbar m;
  m.count = m.pending = count;
  hp_bars[hp_smem_u32(b)] = m;
}
HP_DEV void mbar_init_fence() {}
HP_DEV void mbar_arrive(uint64_t *b) {
  hp_mbar &m = hp_bar(b);
  if (m.pending == 0) {
    fprintf(stderr, "emu: more arrivals than the barrier's count\n");
    abort();
  }
  m.pending--;
  emu.progress++;
  hp_complete_if(m);
}
HP_DEV void mbar_expect_tx(uint64_t *b, uint32_t bytes) {
  hp_bar(b).tx += bytes;
  mbar_arrive(b);
}

static void hp_land(const hp_copy &c) {
  const hp_tmap_t &m = *c.map;
  if (c.dst % 1024) {
    fprintf(stderr, "emu: TMA destination %u not 1024-byte aligned (128-byte swizzle)\n", c.dst);
    abort();
  }
  if (m.box[0] * 2 != 128) {
    fprintf(stderr, "emu: the emulated TMA takes rows of 128 bytes\n");
    abort();
  }
  uint32_t r = 0;
  for (uint32_t i3 = 0; i3 < m.box[3]; i3++)
    for (uint32_t i2 = 0; i2 < m.box[2]; i2++)
      for (uint32_t i1 = 0; i1 < m.box[1]; i1++, r++)
        for (uint32_t e = 0; e < m.box[0]; e++) {
          const uint64_t x[4] = {(uint64_t)c.c[0] + e, (uint64_t)c.c[1] + i1, (uint64_t)c.c[2] + i2, (uint64_t)c.c[3] + i3};
          uint16_t v = 0;
          if (x[0] < m.dims[0] && x[1] < m.dims[1] && x[2] < m.dims[2] && x[3] < m.dims[3])
            memcpy(&v, (const char *)m.base + 2 * x[0] + x[1] * m.strides[0] + x[2] * m.strides[1] + x[3] * m.strides[2], 2);
          const uint32_t addr = c.dst + r * 128 + ((e / 8) ^ (r % 8)) * 16 + (e % 8) * 2;
          memcpy(hp_ptr(addr, 2), &v, 2);
        }
  hp_mbar &b = hp_bars.at(c.bar);
  b.tx -= (int64_t)m.box[0] * m.box[1] * m.box[2] * m.box[3] * 2;
  if (b.tx < 0) {
    fprintf(stderr, "emu: more TMA bytes than the barrier expected\n");
    abort();
  }
  emu.progress++;
  hp_complete_if(b);
}

HP_DEV void tma_load(void *dst, const hp_tmap_t *map, uint64_t *bar, int c0, int c1, int c2, int c3) {
  const hp_copy c{hp_smem_u32(dst), hp_smem_u32(bar), map, {c0, c1, c2, c3}};
  hp_bar(bar); // initialised
  if (hp_coin() % 2) hp_land(c);
  else hp_pending.push_back(c);
}

HP_DEV bool mbar_try(uint64_t *b, uint32_t parity) {
  const uint32_t a = hp_smem_u32(b);
  std::vector<hp_copy> keep; // copies to this barrier land now
  for (const hp_copy &c : hp_pending) {
    if (c.bar == a) hp_land(c);
    else keep.push_back(c);
  }
  hp_pending.swap(keep);
  const hp_mbar &m = hp_bar(b);
  // true once the phase of this parity completed, i.e. the current phase has the other parity
  const bool done = (m.phase & 1u) != parity;
  if (!done) emu_yield();
  return done;
}

// ---- wgmma ----------------------------------------------------------------------------------

// One wgmma as issued: its operands (A's registers as they were then: ptxas keeps them until the
// wait) and where each thread's accumulators are. It runs at the wait that covers its commit group:
// the shared memory it reads and the accumulators it adds to are read then, so a kernel that
// reuses a stage, or reads or writes the accumulators, before that wait gets wrong results.
struct hp_op {
  bool rs, bt;
  int acc, n; // n: the columns of the accumulators (128, or 64 for head dim 64's P V)
  uint64_t da, db;
  float *d[128];
  uint32_t a[128][4];          // A's registers at the issue
  const uint32_t *ap[128];     // and where they are: they must hold until the wait
};
struct hp_wg {
  int arrived = 0, n = 128;
  long gen = 0;
  float *d[128];
  uint32_t a[128][4];
  const uint32_t *ap[128];
  uint64_t da[128], db[128];
  int acc[128];
  std::vector<hp_op> open;                // issued, not yet committed
  std::vector<std::vector<hp_op>> groups; // committed, not yet waited for (oldest first)
};
static hp_wg hp_wgs[8];

static void hp_mma(const hp_op &op);
template <class F> static void hp_wg_op(F compute);

HP_DEV void wg_fence() {}
HP_DEV void wg_commit() {
  hp_wg_op([](hp_wg &g) {
    g.groups.push_back(g.open);
    g.open.clear();
  });
}
// wgmma.wait_group N: every commit group but the N newest completes, in order
template <int N> HP_DEV void wg_wait() {
  hp_wg_op([](hp_wg &g) {
    while (g.groups.size() > (size_t)N) {
      for (const hp_op &op : g.groups.front()) hp_mma(op);
      g.groups.erase(g.groups.begin());
    }
  });
}
HP_DEV void fence_proxy_async() {}

static float hp_bf16(uint32_t addr) {
  uint16_t h;
  memcpy(&h, hp_ptr(hp_swizzle(addr), 2), 2);
  return emu_b16_to_f32(h, true);
}
static void hp_desc(uint64_t d, uint32_t &start, uint32_t &lbo, uint32_t &sbo) {
  if ((d >> 62) != 1 || ((d >> 49) & 7)) {
    fprintf(stderr, "emu: descriptor %016llx: only the 128-byte swizzle with base offset 0 is emulated\n", (unsigned long long)d);
    abort();
  }
  start = (uint32_t)(d & 0x3fff) << 4, lbo = (uint32_t)((d >> 16) & 0x3fff) << 4, sbo = (uint32_t)((d >> 32) & 0x3fff) << 4;
}
// K-major operand element (row r, k) of a descriptor
static float hp_kmajor(uint64_t d, int r, int k) {
  uint32_t start, lbo, sbo;
  hp_desc(d, start, lbo, sbo);
  return hp_bf16(start + (r % 8) * 128 + (r / 8) * sbo + (k / 8) * 16 + (k % 8) * 2);
}
// MN-major operand element (k, n)
static float hp_mnmajor(uint64_t d, int k, int n) {
  uint32_t start, lbo, sbo;
  hp_desc(d, start, lbo, sbo);
  return hp_bf16(start + (n % 8) * 2 + ((n / 8) % 8) * 16 + (n / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo);
}
static inline int hp_row(int t, int v) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((v / 2) % 2); }
static inline int hp_col(int t, int v) { return 8 * (v / 4) + 2 * (t % 4) + v % 2; }

template <class F> static void hp_wg_op(F compute) {
  hp_wg &g = hp_wgs[emu.cur / 128];
  emu_barrier(&g.arrived, &g.gen, 128, [&] { compute(g); });
}

// The issue: the warpgroup's operands checked and snapshot. rs: A from registers; bt: B MN-major
// (transposed), as the RS form always has it here.
static void hp_issue(hp_wg &g, bool rs, bool bt) {
  for (int t = 1; t < 128; t++)
    if (g.db[t] != g.db[0] || (!rs && (g.da[t] != g.da[0] || g.acc[t] != g.acc[0]))) {
      fprintf(stderr, "emu: the threads of a warpgroup gave different wgmma operands\n");
      abort();
    }
  hp_op op;
  op.rs = rs, op.bt = bt, op.acc = g.acc[0], op.n = g.n, op.da = g.da[0], op.db = g.db[0];
  memcpy(op.d, g.d, sizeof op.d);
  memcpy(op.a, g.a, sizeof op.a);
  memcpy(op.ap, g.ap, sizeof op.ap);
  g.open.push_back(op);
}

static void hp_mma(const hp_op &op) {
  static float A[64][16], C[64][128];
  for (int m = 0; m < 64; m++)
    for (int k = 0; k < 16; k++) A[m][k] = op.rs ? NAN : hp_kmajor(op.da, m, k);
  if (op.rs)
    for (int t = 0; t < 128; t++)
      if (memcmp(op.a[t], op.ap[t], 16)) {
        fprintf(stderr, "emu: a wgmma's A registers changed before the wait that covers it (thread %d)\n", t);
        abort();
      }
  if (op.rs)
    for (int t = 0; t < 128; t++)
      for (int v = 0; v < 8; v++) A[hp_row(t, v)][hp_col(t, v)] = emu_b16_to_f32(op.a[t][v / 2] >> (16 * (v % 2)), true);
  for (int m = 0; m < 64; m++)
    for (int n = 0; n < op.n; n++) {
      float c = 0;
      for (int k = 0; k < 16; k++) c += A[m][k] * (op.bt ? hp_mnmajor(op.db, k, n) : hp_kmajor(op.db, n, k));
      C[m][n] = c;
    }
  for (int t = 0; t < 128; t++)
    for (int v = 0; v < op.n / 2; v++) op.d[t][v] = (op.acc ? op.d[t][v] : 0.0f) + C[hp_row(t, v)][hp_col(t, v)];
}

// bar.sync id, count across warpgroups (the test's kernels use id 3 for both consumer warpgroups)
static std::map<int, std::pair<int, long>> hp_named; // id -> (arrived, generation)
HP_DEV void named_bar_sync(int id, int count) {
  auto &b = hp_named[id];
  static const std::function<void()> nothing = [] {};
  emu_barrier(&b.first, &b.second, count, nothing);
}
// bar.arrive id, count: counts toward the barrier's next phase without waiting for it
HP_DEV void named_bar_arrive(int id, int count) {
  auto &b = hp_named[id];
  emu.progress++;
  if (++b.first == count) b.first = 0, ++b.second;
}
HP_DEV void st_shared_zero16(uint32_t addr) { memset(hp_ptr(addr, 16), 0, 16); }

HP_DEV void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  hp_wg &g = hp_wgs[emu.cur / 128];
  const int t = emu.cur % 128;
  g.d[t] = d, g.da[t] = da, g.db[t] = db, g.acc[t] = accumulate != 0;
  hp_wg_op([](hp_wg &g) { g.n = 128, hp_issue(g, false, false); });
}

template <int N> HP_DEV void wgmma_rs_n(float *d, const uint32_t (&a)[4], uint64_t db) {
  hp_wg &g = hp_wgs[emu.cur / 128];
  const int t = emu.cur % 128;
  g.d[t] = d, g.db[t] = db, g.acc[t] = 1;
  memcpy(g.a[t], a, 16);
  g.ap[t] = a;
  hp_wg_op([](hp_wg &g) { g.n = N, hp_issue(g, true, true); });
}
HP_DEV void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) { wgmma_rs_n<128>(d, a, db); }
HP_DEV void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db) { wgmma_rs_n<64>(d, a, db); }

#include "attn/hopper/fwd_kernel.cuh"

// ---- the test -------------------------------------------------------------------------------

static uint16_t bf16_of(float f) { return (uint16_t)emu_f32_to_b16(f, true); }
static float f32_of(uint16_t h) { return emu_b16_to_f32(h, true); }

// A case: bshd or sbhd with b sequences of s tokens, or thd with the lengths lens at rows pads (the
// rows between and after them NaN, as a padded thd batch may hold).
struct hp_case {
  int layout; // 0 bshd, 1 sbhd, 2 thd
  int b, h, h_kv, s;
  std::vector<int> lens, pads; // thd
  std::vector<int> kv_lens;    // thd: the keys' lengths where they differ (packed from row 3, gaps of 2)
};
struct hp_mask {
  int wl, wr, br; // params_t's window_left, window_right, bottom_right
};

// merge: the step merged into a running (acc_out, acc_lse) of random rows, some with lse -inf
template <int DQK, int DV = DQK> static bool run_case(const hp_case &cs, const hp_mask &mk, int pipe, unsigned seed, bool merge = false) {
  const bool thd = cs.layout == 2, sbhd = cs.layout == 1;
  const int b = cs.b, h = cs.h, h_kv = cs.h_kv;
  int s = cs.s, rows = cs.s, rows_kv = cs.s; // thd: s = the longest sequence, rows = the packed tensors' rows
  std::vector<int> cu(b + 1, 0), first(b, 0), len(b, cs.s), cu_kv(b + 1, 0), first_kv(b, 0), len_kv(b, cs.s);
  if (thd) {
    s = 0, rows = 0, rows_kv = 0;
    for (int bb = 0; bb < b; bb++) {
      len[bb] = cs.lens[bb], first[bb] = cs.pads[bb], cu[bb + 1] = cu[bb] + len[bb];
      s = std::max(s, len[bb]), rows = std::max(rows, first[bb] + len[bb] + 3);
    }
    for (int bb = 0; bb < b; bb++) {
      len_kv[bb] = cs.kv_lens.empty() ? len[bb] : cs.kv_lens[bb];
      first_kv[bb] = cs.kv_lens.empty() ? first[bb] : bb ? first_kv[bb - 1] + len_kv[bb - 1] + 2 : 3;
      cu_kv[bb + 1] = cu_kv[bb] + len_kv[bb], s = std::max(s, len_kv[bb]);
      rows_kv = std::max(rows_kv, first_kv[bb] + len_kv[bb] + 3);
    }
  }
  const int tb = thd ? 1 : b; // the tensors' batch extent
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
  auto map = [&](const std::vector<uint16_t> &x, int heads, const int64_t *st, int d) {
    hp_tmap_t m;
    m.base = x.data();
    const uint64_t dims[4] = {(uint64_t)d, (uint64_t)heads, (uint64_t)(&x == &q ? rows : rows_kv), (uint64_t)tb};
    const uint64_t bst[3] = {(uint64_t)st[1] * 2, (uint64_t)st[0] * 2, (uint64_t)st[2] * 2};
    const uint32_t box[4] = {64, 1, 128, 1};
    memcpy(m.dims, dims, sizeof dims), memcpy(m.strides, bst, sizeof bst), memcpy(m.box, box, sizeof box);
    return m;
  };
  const hp_tmap_t tq = map(q, h, sq, DQK), tk = map(k, h_kv, sk, DQK), tv = map(v, h_kv, sv, DV);
  params_t p{};
  p.b = b, p.h = h, p.h_kv = h_kv, p.s_q = p.s_kv = s;
  p.window_left = mk.wl, p.window_right = mk.wr, p.bottom_right = mk.br;
  p.scale_log2 = 1.4426950408889634f / sqrtf((float)DQK), p.o = o.data(), p.lse = lse.data();
  memcpy(p.o_st, so, sizeof so);
  hp_lse_strides(thd, h, thd ? rows : s, p.lse_st);
  memcpy(p.acc_st, p.o_st, sizeof sq), memcpy(p.acc_lse_st, p.lse_st, sizeof sq);
  if (thd) p.cu_q = cu.data(), p.pad_q = first.data(), p.cu_kv = cu_kv.data(), p.pad_kv = first_kv.data();
  std::vector<float> acc(merge ? n : 0), acc_lse(merge ? lse.size() : 0);
  if (merge) {
    for (float &x : acc) x = u(g);
    for (size_t i = 0; i < acc_lse.size(); i++) acc_lse[i] = i % 7 == 3 ? -INFINITY : 4.0f * u(g);
    p.acc_out = acc.data(), p.acc_lse = acc_lse.data();
  }
  const std::vector<float> acc0 = acc, acc_lse0 = acc_lse;
  std::vector<float> max_logit(h, -INFINITY);
  p.max_logit = max_logit.data();
  std::vector<double> want_max(h, -INFINITY); // the reference's
  // one CTA at a time, each with fresh barriers
  const int mb = (s + BM - 1) / BM;
  for (int z = 0; z < b; z++)
    for (int y = 0; y < h; y++)
      for (int x = 0; x < mb; x++) {
        hp_bars.clear();
        hp_pending.clear();
        hp_named.clear(); // a CTA's named barriers start empty (warpgroup 0's opening turn is left over)
        const std::function<void()> one = [&] {
          blockIdx = dim3(x, y, z);
          gridDim = dim3(mb, h, b);
          if (pipe == 1) fwd_kernel<1, DQK, DV>(tq, tk, tv, p);
          else fwd_kernel<0, DQK, DV>(tq, tk, tv, p);
        };
        emu_run(dim3(1, 1, 1), dim3(THREADS), sizeof(smem_t<DQK, DV>) + 1024, one);
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
  // fp64 reference, every row of every sequence (a sequence with no keys: out 0, lse -inf)
  double num = 0, den = 0, emax = 0, lmax = 0, planted_num = 0;
  const double scale = 1.0 / sqrt((double)DQK);
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
          const double ref = refrow[c], got = merge ? (double)acc[oi(bb, i, hh) + c] : (double)f32_of(o[oi(bb, i, hh) + c]);
          const double d = got - ref;
          num += d * d, den += ref * ref, planted_num += (got * 1.02 - ref) * (got * 1.02 - ref);
          emax = got != got ? INFINITY : fmax(emax, fabs(d) / (fabs(ref) + rmax + (keys ? 0.0 : 1.0)));
        }
        const double lg = merge ? acc_lse[li] : lse[li];
        lmax = lg != lg || (lr == -INFINITY) != (lg == -INFINITY) ? INFINITY
               : lr == -INFINITY                                   ? lmax
                                                                   : fmax(lmax, fabs(lg - lr) / fmax(1.0, fabs(lr)));
      }
  const double nw = sqrt(num / den), pw = sqrt(planted_num / den);
  double mlmax = 0; // max_logit, every head
  for (int hh = 0; hh < h; hh++)
    mlmax = (want_max[hh] == -INFINITY) != (max_logit[hh] == -INFINITY) || max_logit[hh] != max_logit[hh] ? INFINITY
            : want_max[hh] == -INFINITY ? mlmax
                                        : fmax(mlmax, fabs(max_logit[hh] - want_max[hh]) / fmax(1.0, fabs(want_max[hh])));
  const bool ok = nw <= 4e-3 && emax <= 1e-2 && lmax <= 1e-4 && mlmax <= 1e-5, caught = pw > 4e-3;
  char what[96];
  if (thd) {
    int w = snprintf(what, sizeof what, "thd lens");
    for (int bb = 0; bb < b; bb++) w += snprintf(what + w, sizeof what - w, "%s%d@%d", bb ? "," : " ", len[bb], first[bb]);
  } else {
    snprintf(what, sizeof what, "%s b=%d s=%d", sbhd ? "sbhd" : "bshd", b, s);
  }
  printf("d=%d/%d pipe=%d %s h=%d/%d window (%d,%d)%s%s: normwise %.2e, elementwise %.2e, lse %.2e, max_logit %.1e; planted 2%%: %.2e %s -> %s\n",
         DQK, DV, pipe, what, h, h_kv, mk.wl, mk.wr, mk.br ? " bottom-right" : "", merge ? " merged" : "", nw, emax, lmax, mlmax, pw, caught ? "caught" : "MISSED",
         ok && caught ? "ok" : "FAIL");
  return ok && caught;
}

int main() {
  bool ok = true;
  const hp_case cases[] = {
      {0, 1, 1, 1, 128, {}, {}},                       // MHA bshd
      {1, 1, 4, 2, 256, {}, {}},                       // GQA 4/2 sbhd
      {0, 2, 2, 1, 384, {}, {}},                       // MQA 2/1, two sequences
      {0, 2, 2, 2, 200, {}, {}},                       // s not a multiple of 128
      {2, 4, 2, 1, 0, {130, 0, 1, 77}, {5, 140, 141, 150}, {}}, // thd: lengths 130, 0, 1, 77, offsets from 5, NaN gaps
      {2, 3, 2, 2, 0, {70, 300, 5}, {0, 72, 380}, {260, 40, 0}},  // thd, keys of other lengths (0 too)
  };
  // none, causal top-left and bottom-right, a window both ways, a left window bottom-right
  const hp_mask masks[] = {{-1, -1, 0}, {-1, 0, 0}, {-1, 0, 1}, {100, 20, 0}, {64, -1, 1}};
  unsigned seed = 1;
  for (const hp_case &c : cases)
    for (const hp_mask &mk : masks)
      for (int pipe = 0; pipe < 2; pipe++) ok = run_case<128>(c, mk, pipe, seed++) && ok;
  for (const hp_case &c : cases) // the fused merge, causal and not
    for (int m = 0; m < 2; m++)
      for (int pipe = 0; pipe < 2; pipe++) ok = run_case<128>(c, masks[m], pipe, seed++, true) && ok;
  for (const hp_case &c : cases) // head dim 64: every case under three masks, and merged causal
    for (int m : {0, 2, 4})
      for (int pipe = 0; pipe < 2; pipe++) ok = run_case<64>(c, masks[m], pipe, seed++, m == 2) && ok;
  for (const hp_case &c : cases) // MLA's 192/128: every case causal bottom-right merged, and a window
    for (int m : {2, 3})
      ok = run_case<192, 128>(c, masks[m], 0, seed++, m == 2) && ok;
  printf("%s\n", ok ? "hopper emu: all ok" : "hopper emu: FAILED");
  return ok ? 0 : 1;
}
