// hopper.h — the Hopper instructions of kernels/attn/hopper/ (ptx.cuh's
// names) on the CPU, on the attention kernels' warp emulator (cuda_emu.h:
// every CUDA thread a coroutine, warps in a shuffled order, shared memory
// starting as NaN garbage), as the PTX ISA and CUTLASS's canonical layouts
// define them. hopper_fwd.cpp runs the forward on it, hopper_bwd.cpp the backward.
//   mbarrier   arrival count, transaction bytes, phase parity (try_wait is
//              true once the phase of the given parity completed);
//   cp.async   a thread's copies land when its cp.async.mbarrier.arrive's arrival does (at once, or
//              when the barrier is polled);
//   TMA        a box of a 4-d tensor into shared memory, rows of 128 bytes
//              with the 128-byte swizzle (16-byte chunk c of row r lands at
//              chunk c ^ (r % 8)), zeros outside the tensor; it lands either
//              at once or only when a thread polls its barrier (a coin), and
//              completes that many transaction bytes;
//   bulk copy  cp.async.bulk global -> shared (16-byte aligned and sized),
//              landing and completing its bytes as a TMA box does;
//   TMA store  a box from shared memory (the swizzle read back) into the
//              tensor, clipped at its bounds, at the issue or at the issuing
//              thread's cp.async.bulk.wait_group.read (a coin);
//   wgmma      m64nNk16 (N a multiple of 8 up to 128), bf16 in, fp32 accumulators: a
//              collective of the 128 threads of a warpgroup, A and B decoded
//              from shared memory descriptors (K-major: row r at (r % 8) * 128
//              + (r / 8) * SBO; MN-major (B, or A transposed): 8 elements a
//              16-byte unit, units (n / 8) % 8 apart by 16 bytes and n / 64
//              by LBO, k % 8 by 128 bytes and k / 8 by SBO; then the swizzle
//              on the address) or A from each thread's registers, D in the
//              accumulator layout (thread t, value v: row 16 (t / 32) +
//              (t % 32) / 4 + 8 ((v / 2) % 2), column 8 (v / 4) + 2 (t % 4) +
//              v % 2). Asynchronous as on the GPU: a wgmma adds to the
//              accumulators at the wgmma.wait_group that covers its commit
//              group, and reads its shared operands then or at its issue (a
//              coin), so a stage reused, or accumulators read or written,
//              before that wait, or a stage read before its TMA landed, give
//              wrong results.
// This checks a kernel's own logic (fragment maps, softmax, masks, the
// pipeline's barriers and phases, the epilogue) against an fp64 reference;
// it cannot check that the hardware reads the layouts as emulated: that is
// what the GPU runs (scripts/gpu/hopper_lab.sh) are for.
#ifndef DISTLAB_LAB_HOPPER_EMU_H
#define DISTLAB_LAB_HOPPER_EMU_H
#define HOPPER_EMU
#include "cuda_emu.h"

#include <algorithm>
#include <array>
#include <map>
#include <random>
#include <set>
#include <string>

#define HP_DEV inline
#define HP_HD inline
#define HP_GRID_CONST
struct float2 {
  float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
struct alignas(8) uint2 {
  uint32_t x, y;
};
static inline uint2 make_uint2(uint32_t x, uint32_t y) { return uint2{x, y}; }

struct hp_tmap_t {
  const void *base;
  uint64_t dims[4], strides[3]; // strides in bytes of dims 1..3
  uint32_t box[4];
  uint32_t es; // bytes an element: 2 (bf16), 4 (fp32: the merge's running out)
};

// ---- shared memory addresses: offsets that keep the real pointer's alignment mod 1024 ----

static inline uint32_t hp_off0() { return (uint32_t)((uintptr_t)emu.smem % 1024); }
HP_DEV char *hp_smem() { return emu.smem; }
HP_DEV char *hp_smem_aligned() {
  char *p = hp_smem();
  return p + ((1024 - (reinterpret_cast<uintptr_t>(p) & 1023)) & 1023);
}
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
HP_DEV int __ffs(int x) { return __builtin_ffs(x); }
HP_DEV int hp_warp_uniform(int x) { return x; } // the kernel passes values that are the same in every lane
HP_DEV uint32_t hp_opaque(uint32_t x) { return x; }
HP_DEV float hp_exp2(float x) { return exp2f(x); }
HP_DEV float hp_log2(float x) { return log2f(x); }
template <int N> HP_DEV void reg_alloc() {}
template <int N> HP_DEV void reg_dealloc() {}
HP_DEV float hp_shfl_xor(float x, int m) { return attn_shfl_xor(x, m); }
HP_DEV bool hp_any(bool x) { // __any_sync by shuffles (the emulator has no vote)
  float v = x ? 1.0f : 0.0f;
  for (int m = 1; m < 32; m *= 2) v = fmaxf(v, attn_shfl_xor(v, m));
  return v > 0.0f;
}
HP_DEV uint32_t pack_bf16(float lo, float hi) { return emu_f32_to_b16(lo, true) | emu_f32_to_b16(hi, true) << 16; }

// ---- mbarriers and TMA ----------------------------------------------------------------------

struct hp_mbar {
  uint32_t count = 0, pending = 0, phase = 0;
  int64_t tx = 0;
};
struct hp_copy {
  uint32_t dst, bar;
  const hp_tmap_t *map; // a TMA box (points at tmap, its copy); nullptr: a plain bulk copy of bytes from src
  int c[4];
  const void *src;
  uint32_t bytes;
  // the map as issued: a kernel's map is a parameter on its thread's stack, which the thread's exit
  // overwrites while its copies may still be pending (on a GPU the map stays in parameter space)
  hp_tmap_t tmap;
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

static void hp_land_bulk(const hp_copy &c) {
  memcpy(hp_ptr(c.dst, c.bytes), c.src, c.bytes);
  hp_mbar &b = hp_bars.at(c.bar);
  b.tx -= c.bytes;
  if (b.tx < 0) {
    fprintf(stderr, "emu: more bulk-copy bytes than the barrier expected\n");
    abort();
  }
  emu.progress++;
  hp_complete_if(b);
}
// One TMA box of m at coordinates c, 128-byte swizzle, rows of 128 bytes: f(the global element, or
// nullptr outside the tensor, its shared-memory address from smem, and its bytes m.es), for tma_load and
// tma_store.
template <class F> static void hp_tma_box(const hp_tmap_t &m, const int *c, uint32_t smem, F f) {
  uint32_t r = 0;
  for (uint32_t i3 = 0; i3 < m.box[3]; i3++)
    for (uint32_t i2 = 0; i2 < m.box[2]; i2++)
      for (uint32_t i1 = 0; i1 < m.box[1]; i1++, r++)
        for (uint32_t e = 0; e < m.box[0]; e++) {
          const int64_t x[4] = {(int64_t)c[0] + e, (int64_t)c[1] + i1, (int64_t)c[2] + i2, (int64_t)c[3] + i3};
          bool in = true;
          for (int a = 0; a < 4; a++) in = in && x[a] >= 0 && (uint64_t)x[a] < m.dims[a];
          char *g = in ? (char *)m.base + m.es * x[0] + x[1] * m.strides[0] + x[2] * m.strides[1] + x[3] * m.strides[2]
                       : nullptr;
          const uint32_t byte = e * m.es;
          f(g, smem + r * 128 + ((byte / 16) ^ (r % 8)) * 16 + byte % 16, m.es);
        }
}
static void hp_land(const hp_copy &c) {
  if (!c.map) return hp_land_bulk(c);
  const hp_tmap_t &m = c.tmap;
  if (c.dst % 1024) {
    fprintf(stderr, "emu: TMA destination %u not 1024-byte aligned (128-byte swizzle)\n", c.dst);
    abort();
  }
  if (m.box[0] * m.es != 128) {
    fprintf(stderr, "emu: the emulated TMA takes rows of 128 bytes\n");
    abort();
  }
  hp_tma_box(m, c.c, c.dst, [](char *g, uint32_t a, uint32_t es) { /* out of bounds: zeros, as TMA fills */
    uint32_t v = 0;
    if (g) memcpy(&v, g, es);
    memcpy(hp_ptr(a, es), &v, es);
  });
  hp_mbar &b = hp_bars.at(c.bar);
  b.tx -= (int64_t)m.box[0] * m.box[1] * m.box[2] * m.box[3] * m.es;
  if (b.tx < 0) {
    fprintf(stderr, "emu: more TMA bytes than the barrier expected\n");
    abort();
  }
  emu.progress++;
  hp_complete_if(b);
}

// PDL (kernels/common/pdl.cuh): the emulator runs a grid after the one before it, so both are nothing
HP_DEV void dl_pdl_wait() {}
HP_DEV void dl_pdl_release() {}
// the boxes loaded and prefetched (tma_prefetch_l2 below): a box is its tensor's base and coordinates
using hp_box = std::array<uint64_t, 5>;
static std::set<hp_box> hp_prefetched, hp_loaded;
HP_DEV void tma_load(void *dst, const hp_tmap_t *map, uint64_t *bar, int c0, int c1, int c2, int c3) {
  hp_loaded.insert(hp_box{(uint64_t)(uintptr_t)map->base, (uint64_t)c0, (uint64_t)c1, (uint64_t)c2, (uint64_t)c3});
  const hp_copy c{hp_smem_u32(dst), hp_smem_u32(bar), map, {c0, c1, c2, c3}, nullptr, 0, *map};
  hp_bar(bar); // initialised
  if (hp_coin() % 2) hp_land(c);
  else hp_pending.push_back(c);
}
// the TMA's L2 prefetch: a hint with nothing to emulate. The kernels prefetch a box that another CTA of the
// grid loads (HP_PREFETCH: the first loads of CTA lin + next_ctas), so each is recorded (its tensor's base
// and coordinates) beside every box tma_load loads, and hp_prefetch_check compares the two once the grid ran
HP_DEV void tma_prefetch_l2(const hp_tmap_t *map, int c0, int c1, int c2, int c3) {
  if (!map) {
    fprintf(stderr, "emu: tma_prefetch_l2 without a tensor map\n");
    abort();
  }
  hp_prefetched.insert(hp_box{(uint64_t)(uintptr_t)map->base, (uint64_t)c0, (uint64_t)c1, (uint64_t)c2, (uint64_t)c3});
}
// After a grid (or the grids of one call): every prefetched box is one some CTA loaded (1), or the first
// one that is not is printed (0); both records are cleared for the next call.
static inline bool hp_prefetch_check(const char *what) {
  bool ok = true;
  for (const hp_box &b : hp_prefetched)
    if (!hp_loaded.count(b)) {
      printf("%s: prefetched box (%d, %d, %d, %d) of the tensor at %p: no CTA loads it\n", what, (int)b[1], (int)b[2],
             (int)b[3], (int)b[4], (void *)(uintptr_t)b[0]);
      ok = false;
      break;
    }
  hp_prefetched.clear(), hp_loaded.clear();
  return ok;
}
// cp.async.bulk global -> shared: reads its source when it lands (at the issue or when a thread polls
// its barrier, a coin), as a TMA box does
HP_DEV void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  const hp_copy c{hp_smem_u32(dst), hp_smem_u32(bar), nullptr, {0, 0, 0, 0}, src, bytes};
  if (c.dst % 16 || (uintptr_t)src % 16 || bytes % 16 || bytes == 0) {
    fprintf(stderr, "emu: bulk copy of %u bytes %p -> %u: not 16-byte aligned or sized\n", bytes, src, c.dst);
    abort();
  }
  hp_ptr(c.dst, bytes); // inside shared memory
  hp_bar(bar);          // initialised
  if (hp_coin() % 2) hp_land(c);
  else hp_pending.push_back(c);
}

// cp.async: a thread's copies (4, 8 or 16 bytes, both addresses aligned to it) wait, unread, until its
// cp_async_arrive ties them to a barrier; then they land (reading the source then) with one arrival on
// it, either at once or only when a thread polls it (a coin).
struct hp_cp {
  uint32_t dst;
  const void *src;
  int bytes;
};
struct hp_cp_group {
  uint32_t bar;
  std::vector<hp_cp> cps;
};
static std::map<int, std::vector<hp_cp>> hp_cp_open; // by thread
static std::vector<hp_cp_group> hp_cp_groups;
HP_DEV void cp_async(uint32_t dst, const void *src, int bytes) {
  if ((bytes != 4 && bytes != 8 && bytes != 16) || dst % bytes || (uintptr_t)src % bytes) {
    fprintf(stderr, "emu: cp.async of %d bytes at %u <- %p: not a size, or not aligned to it\n", bytes, dst, src);
    abort();
  }
  hp_ptr(dst, bytes); // inside shared memory
  hp_cp_open[emu.cur].push_back(hp_cp{dst, src, bytes});
}
static void hp_cp_land(const hp_cp_group &g) {
  for (const hp_cp &c : g.cps) memcpy(hp_ptr(c.dst, c.bytes), c.src, c.bytes);
  hp_mbar &m = hp_bars.at(g.bar);
  if (m.pending == 0) {
    fprintf(stderr, "emu: more arrivals than the barrier's count (cp.async)\n");
    abort();
  }
  m.pending--;
  emu.progress++;
  hp_complete_if(m);
}
HP_DEV void cp_async_arrive(uint64_t *b) {
  hp_bar(b); // initialised
  hp_cp_group g{hp_smem_u32(b), std::move(hp_cp_open[emu.cur])};
  hp_cp_open.erase(emu.cur);
  if (hp_coin() % 2) hp_cp_land(g);
  else hp_cp_groups.push_back(std::move(g));
}
template <class T> static T hp_ld_shared(uint32_t addr) {
  if (addr % sizeof(T)) {
    fprintf(stderr, "emu: ld.shared of %zu bytes at %u, not aligned\n", sizeof(T), addr);
    abort();
  }
  T x;
  memcpy(&x, hp_ptr(addr, sizeof(T)), sizeof(T));
  return x;
}
HP_DEV float ld_shared_f32(uint32_t addr) { return hp_ld_shared<float>(addr); }
HP_DEV uint32_t ld_shared_u32(uint32_t addr) { return hp_ld_shared<uint32_t>(addr); }
HP_DEV float2 ld_shared_f2(uint32_t addr) { return hp_ld_shared<float2>(addr); }

HP_DEV bool mbar_try(uint64_t *b, uint32_t parity) {
  const uint32_t a = hp_smem_u32(b);
  std::vector<hp_copy> keep; // copies to this barrier land now
  for (const hp_copy &c : hp_pending) {
    if (c.bar == a) hp_land(c);
    else keep.push_back(c);
  }
  hp_pending.swap(keep);
  std::vector<hp_cp_group> later; // and cp.async groups
  for (hp_cp_group &g : hp_cp_groups) {
    if (g.bar == a) hp_cp_land(g);
    else later.push_back(std::move(g));
  }
  hp_cp_groups.swap(later);
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
  bool rs, bt, at; // A from registers; B MN-major; A MN-major (transposed)
  int acc, n; // n: the columns of the accumulators (128, or 64 for head dim 64's P V)
  uint64_t da, db;
  float *d[128];
  uint32_t a[128][4];          // A's registers at the issue
  const uint32_t *ap[128];     // and where they are: they must hold until the wait
  std::vector<float> c;        // A B, when the coin read the operands at the issue (64 x 128)
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
static void hp_product(const hp_op &op, float *C);
template <class F> static void hp_wg_op(F compute);

HP_DEV void wg_fence() {}
HP_DEV void wg_commit() {
  hp_wg_op([](hp_wg &g) {
    g.groups.push_back(g.open);
    g.open.clear();
  });
}
// wgmma.wait_group N: every commit group but the N newest completes, in order; the other warpgroups
// run on for up to 32 rounds first (the tensor cores take time), so that a buffer rewritten before a
// wgmma that reads it completed shows
template <int N> HP_DEV void wg_wait() {
  hp_wg_op([](hp_wg &g) {
    if (g.groups.size() > (size_t)N)
      for (int n = hp_coin() % 33; n > 0; n--) emu.progress++, emu_yield();
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
static void hp_issue(hp_wg &g, bool rs, bool bt, bool at = false) {
  for (int t = 1; t < 128; t++)
    if (g.db[t] != g.db[0] || (!rs && (g.da[t] != g.da[0] || g.acc[t] != g.acc[0]))) {
      fprintf(stderr, "emu: the threads of a warpgroup gave different wgmma operands\n");
      abort();
    }
  hp_op op;
  op.rs = rs, op.bt = bt, op.at = at, op.acc = g.acc[0], op.n = g.n, op.da = g.da[0], op.db = g.db[0];
  memcpy(op.d, g.d, sizeof op.d);
  memcpy(op.a, g.a, sizeof op.a);
  memcpy(op.ap, g.ap, sizeof op.ap);
  // the hardware reads the shared operands at some time between the issue and the wait: a coin takes
  // either end, so that a stage read before its barrier's wait (its TMA still in flight) shows as well
  // as one reused before the wait that covers the read
  if (hp_coin() % 2) op.c.resize(64 * 128), hp_product(op, op.c.data());
  g.open.push_back(op);
}

// A B of one wgmma into C (64 x 128), its shared-memory operands read now
static void hp_product(const hp_op &op, float *C) {
  static float A[64][16];
  for (int m = 0; m < 64; m++)
    for (int k = 0; k < 16; k++) A[m][k] = op.rs ? NAN : op.at ? hp_mnmajor(op.da, k, m) : hp_kmajor(op.da, m, k);
  if (op.rs)
    for (int t = 0; t < 128; t++)
      for (int v = 0; v < 8; v++) A[hp_row(t, v)][hp_col(t, v)] = emu_b16_to_f32(op.a[t][v / 2] >> (16 * (v % 2)), true);
  for (int m = 0; m < 64; m++)
    for (int n = 0; n < op.n; n++) {
      float c = 0;
      for (int k = 0; k < 16; k++) c += A[m][k] * (op.bt ? hp_mnmajor(op.db, k, n) : hp_kmajor(op.db, n, k));
      C[128 * m + n] = c;
    }
}
// The wait's part: the accumulators added to now; the shared operands read now unless the issue's coin
// read them then (hp_issue)
static void hp_mma(const hp_op &op) {
  static float C[64 * 128];
  if (op.rs)
    for (int t = 0; t < 128; t++)
      if (memcmp(op.a[t], op.ap[t], 16)) {
        fprintf(stderr, "emu: a wgmma's A registers changed before the wait that covers it (thread %d)\n", t);
        abort();
      }
  if (op.c.empty()) hp_product(op, C);
  const float *c = op.c.empty() ? C : op.c.data();
  for (int t = 0; t < 128; t++)
    for (int v = 0; v < op.n / 2; v++) op.d[t][v] = (op.acc ? op.d[t][v] : 0.0f) + c[128 * hp_row(t, v) + hp_col(t, v)];
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
HP_DEV void st_shared_u32(uint32_t addr, uint32_t v) {
  if (addr % 4) {
    fprintf(stderr, "emu: st.shared.b32 at %u, not 4-byte aligned\n", addr);
    abort();
  }
  memcpy(hp_ptr(addr, 4), &v, 4);
}
HP_DEV void st_shared_v2(uint32_t addr, uint32_t x, uint32_t y) {
  if (addr % 8) {
    fprintf(stderr, "emu: st.shared.v2.b32 at %u, not 8-byte aligned\n", addr);
    abort();
  }
  const uint32_t v[2] = {x, y};
  memcpy(hp_ptr(addr, 8), v, 8);
}
// Bulk reductions (shared -> global, fp32 add): done at the issue or only at the wait that covers
// them (a coin), reading shared memory then, so a source rewritten before bulk_wait_read shows.
struct hp_bulk {
  float *dst;
  uint32_t src, bytes;
  bool committed;
};
static std::vector<hp_bulk> hp_bulks;
static void hp_bulk_do(const hp_bulk &b) {
  const float *s = (const float *)hp_ptr(b.src, b.bytes);
  for (uint32_t i = 0; i < b.bytes / 4; i++) b.dst[i] += s[i];
  emu.progress++;
}
HP_DEV void bulk_reduce_add(float *dst, const void *src, uint32_t bytes) {
  const hp_bulk b{dst, hp_smem_u32(src), bytes, false};
  if (b.src % 16 || (uintptr_t)dst % 16 || bytes % 16) {
    fprintf(stderr, "emu: bulk reduction of %u bytes at %u -> %p: not 16-byte aligned\n", bytes, b.src, (void *)dst);
    abort();
  }
  if (hp_coin() % 2) hp_bulk_do(b);
  else hp_bulks.push_back(b);
}
// TMA stores (shared -> global, a box of a 4-d tensor map, the 128-byte swizzle read back): done at the
// issue or only at the issuing thread's bulk_wait_read (a coin), reading shared memory then, so that a
// box stored before all its rows were written, or rewritten before the wait, shows; the box's elements
// outside the tensor are not written.
struct hp_store {
  int thread;
  const hp_tmap_t *map;
  uint32_t src;
  int c[4];
  bool committed;
};
static std::vector<hp_store> hp_stores;
static void hp_store_do(const hp_store &st) {
  hp_tma_box(*st.map, st.c, st.src, [](char *g, uint32_t a, uint32_t es) { /* out of bounds: not written, as TMA clips */
    if (g) memcpy(g, hp_ptr(a, es), es);
  });
  emu.progress++;
}
HP_DEV void tma_store(const hp_tmap_t *map, const void *src, int c0, int c1, int c2, int c3) {
  const hp_store st{emu.cur, map, hp_smem_u32(src), {c0, c1, c2, c3}, false};
  if (st.src % 1024 || map->box[0] * map->es != 128) {
    fprintf(stderr, "emu: TMA store from %u: not 1024-byte aligned (128-byte swizzle), or rows not of 128 bytes\n", st.src);
    abort();
  }
  hp_ptr(st.src, (size_t)128 * map->box[1] * map->box[2] * map->box[3]); // inside shared memory
  if (hp_coin() % 2) hp_store_do(st);
  else hp_stores.push_back(st);
}
HP_DEV void bulk_commit() {
  for (hp_bulk &b : hp_bulks) b.committed = true;
  for (hp_store &st : hp_stores)
    if (st.thread == emu.cur) st.committed = true;
}
HP_DEV void bulk_wait_read() {
  auto mine = [](const hp_store &st) { return st.thread == emu.cur; }; // this thread's TMA stores
  if (std::any_of(hp_stores.begin(), hp_stores.end(), mine)) {
    // the other threads run on while the copy engine reads: up to 64 rounds, or one time in 8 a long stall
    // (2000 rounds), so that a source rewritten an item later without waiting for this read shows too
    for (int n = hp_coin() % 8 == 0 ? 2000 : hp_coin() % 65; n > 0; n--) emu.progress++, emu_yield();
    for (const hp_store &st : hp_stores)
      if (mine(st)) {
        if (!st.committed) {
          fprintf(stderr, "emu: a TMA store waited for before its commit\n");
          abort();
        }
        hp_store_do(st);
      }
    hp_stores.erase(std::remove_if(hp_stores.begin(), hp_stores.end(), mine), hp_stores.end());
  }
  if (!hp_bulks.empty()) // the other threads run on (up to 64 rounds) while the copy engine reads
    for (int n = hp_coin() % 65; n > 0; n--) emu.progress++, emu_yield();
  for (const hp_bulk &b : hp_bulks) {
    if (!b.committed) {
      fprintf(stderr, "emu: a bulk reduction waited for before its commit\n");
      abort();
    }
    hp_bulk_do(b);
  }
  hp_bulks.clear();
}
HP_DEV void bulk_wait() { bulk_wait_read(); }

// SS: N columns (any multiple of 8 up to 128); A K-major, or (TA) MN-major; B K-major, or (TB) MN-major
template <int N, bool TA, bool TB = TA> HP_DEV void wgmma_ss_n(float *d, uint64_t da, uint64_t db, int accumulate) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 128, "wgmma m64nNk16: N a multiple of 8 (up to the emulator's 128)");
  hp_wg &g = hp_wgs[emu.cur / 128];
  const int t = emu.cur % 128;
  g.d[t] = d, g.da[t] = da, g.db[t] = db, g.acc[t] = accumulate != 0;
  hp_wg_op([](hp_wg &g) { g.n = N, hp_issue(g, false, TB, TA); });
}
HP_DEV void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<128, false>(d, da, db, accumulate); }
HP_DEV void wgmma_ss(float (&d)[40], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<80, false>(d, da, db, accumulate); }
HP_DEV void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<64, false>(d, da, db, accumulate); }
HP_DEV void wgmma_ss_ta(float (&d)[40], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<80, true, false>(d, da, db, accumulate); }
HP_DEV void wgmma_ss_tt(float (&d)[32], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<64, true>(d, da, db, accumulate); }
HP_DEV void wgmma_ss_tt(float (&d)[16], uint64_t da, uint64_t db, int accumulate) { wgmma_ss_n<32, true>(d, da, db, accumulate); }

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

// stmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: a warp collective; matrix m is register m of the
// lanes (lane l: row l / 4, columns 2 (l % 4), + 1); row i of matrix m (TRANS: of its transpose, column
// i), 8 bf16 (16 bytes), stored at the address of lane 8 m + i (16-byte aligned)
template <bool TRANS> static void hp_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  emu_warp &w = emu.warps[emu.cur / 32];
  const int lane = emu.cur % 32;
  w.in[lane][0] = r0, w.in[lane][1] = r1, w.in[lane][2] = r2, w.in[lane][3] = r3, w.in[lane][4] = addr;
  // (cuda_emu.h's collectives use 1-7 and 2 + 16 mask)
  emu_warp_op(TRANS ? 9 : 8, [](emu_warp &w) {
    for (int m = 0; m < 4; m++)
      for (int i = 0; i < 8; i++) {
        const uint32_t a = w.in[8 * m + i][4];
        if (a % 16) {
          fprintf(stderr, "emu: stmatrix row at %u, not 16-byte aligned\n", a);
          abort();
        }
        for (int j = 0; j < 8; j++) { // element j of the stored row: (j, i) of the matrix with TRANS, else (i, j)
          const int row = TRANS ? j : i, col = TRANS ? i : j;
          const uint16_t h = (uint16_t)(w.in[4 * row + col / 2][m] >> (16 * (col % 2)));
          memcpy(hp_ptr(a + 2 * j, 2), &h, 2);
        }
      }
  });
}
HP_DEV void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  hp_stmatrix_x4<true>(addr, r0, r1, r2, r3);
}
HP_DEV void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  hp_stmatrix_x4<false>(addr, r0, r1, r2, r3);
}

// ---- test scaffolding (hopper_fwd.cpp, hopper_bwd.cpp) ----------------------------------------

#include <algorithm>
#include <random>

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

// The cases both tests run (emu_bwd.cpp adds one), and the masks: none, causal top-left and
// bottom-right, a window both ways, a left window bottom-right.
static const std::vector<hp_case> hp_cases = {
    {0, 1, 1, 1, 128, {}, {}},                                 // MHA bshd
    {1, 1, 4, 2, 256, {}, {}},                                 // GQA 4/2 sbhd
    {0, 2, 2, 1, 384, {}, {}},                                 // MQA 2/1, two sequences
    {0, 2, 2, 2, 200, {}, {}},                                 // s not a multiple of 128
    {2, 4, 2, 1, 0, {130, 0, 1, 77}, {5, 140, 141, 150}, {}},  // thd: lengths 130, 0, 1, 77, offsets from 5, NaN gaps
    {2, 3, 2, 2, 0, {70, 300, 5}, {0, 72, 380}, {260, 40, 0}}, // thd, keys of other lengths (0 too)
};
static const hp_mask hp_masks[] = {{-1, -1, 0}, {-1, 0, 0}, {-1, 0, 1}, {100, 20, 0}, {64, -1, 1}};

// A case's sequences: their lengths, first rows and cumulative lengths (queries; keys), the longest
// (s, s_kv), the tensors' rows (3 NaN rows after the last sequence) and batch extent tb.
struct hp_seqs {
  bool thd, sbhd;
  int b, s, s_kv, rows, rows_kv, tb;
  std::vector<int> cu, first, len, cu_kv, first_kv, len_kv;
  explicit hp_seqs(const hp_case &cs)
      : thd(cs.layout == 2), sbhd(cs.layout == 1), b(cs.b), s(cs.s), s_kv(cs.s), rows(cs.s), rows_kv(cs.s),
        tb(cs.layout == 2 ? 1 : cs.b), cu(cs.b + 1, 0), first(cs.b, 0), len(cs.b, cs.s), cu_kv(cs.b + 1, 0),
        first_kv(cs.b, 0), len_kv(cs.b, cs.s) {
    for (int bb = 0; bb < b; bb++) cu[bb + 1] = cu[bb] + len[bb], cu_kv[bb + 1] = cu_kv[bb] + len_kv[bb];
    if (!thd) return;
    s = s_kv = rows = rows_kv = 0;
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
  // "bshd b=2 s=200" or "thd lens 130@5,0@140" (with keys' lengths /L where asked)
  std::string what(bool kv) const {
    char w[160];
    int n = 0;
    if (!thd) n = snprintf(w, sizeof w, "%s b=%d s=%d", sbhd ? "sbhd" : "bshd", b, s);
    else {
      n = snprintf(w, sizeof w, "thd lens");
      for (int bb = 0; bb < b && n < (int)sizeof w; bb++)
        n += kv ? snprintf(w + n, sizeof w - n, "%s%d@%d/%d", bb ? "," : " ", len[bb], first[bb], len_kv[bb])
                : snprintf(w + n, sizeof w - n, "%s%d@%d", bb ? "," : " ", len[bb], first[bb]);
    }
    return w;
  }
};

// The tensor map of a [tb][rows][heads][d] (or sbhd) bf16 (or fp32) tensor x with strides st (elements:
// position, head, batch), boxes of 128 bytes (64 or 32 columns) x box_rows rows.
template <class E>
static hp_tmap_t hp_map(const std::vector<E> &x, int d, int heads, const int64_t *st, int rows, int tb, int box_rows) {
  static_assert(sizeof(E) == 2 || sizeof(E) == 4, "bf16 or fp32 elements");
  hp_tmap_t m;
  m.base = x.data(), m.es = sizeof(E);
  const uint64_t dims[4] = {(uint64_t)d, (uint64_t)heads, (uint64_t)rows, (uint64_t)tb};
  const uint64_t bst[3] = {(uint64_t)st[1] * m.es, (uint64_t)st[0] * m.es, (uint64_t)st[2] * m.es};
  const uint32_t box[4] = {128 / m.es, 1, (uint32_t)box_rows, 1};
  memcpy(m.dims, dims, sizeof dims), memcpy(m.strides, bst, sizeof bst), memcpy(m.box, box, sizeof box);
  return m;
}

// One CTA (blockIdx = at, gridDim = grid) of THREADS threads with fresh barriers: false, with the
// reason, where it left a TMA copy, a wgmma or a bulk reduction unwaited.
static bool hp_run_cta(dim3 at, dim3 grid, int threads, size_t smem, const std::function<void()> &kernel) {
  hp_bars.clear();
  hp_pending.clear();
  hp_cp_open.clear();
  hp_cp_groups.clear();
  hp_named.clear(); // a CTA's named barriers start empty (warpgroup 0's opening turn is left over)
  hp_stores.clear();
  const std::function<void()> one = [&] {
    blockIdx = at;
    gridDim = grid;
    kernel();
  };
  emu_run(dim3(1, 1, 1), dim3(threads), smem + 1024, one);
  bool cp_left = !hp_cp_groups.empty();
  for (const auto &t : hp_cp_open) cp_left = cp_left || !t.second.empty();
  const char *left = !hp_pending.empty() ? "a TMA copy"
                     : !hp_bulks.empty() ? "a bulk reduction"
                     : !hp_stores.empty() ? "a TMA store"
                     : cp_left           ? "a cp.async"
                                         : nullptr;
  for (const hp_wg &g : hp_wgs)
    if (!g.open.empty() || !g.groups.empty()) left = "a wgmma";
  if (left) fprintf(stderr, "emu: %s never waited for\n", left);
  return left == nullptr;
}

#endif
