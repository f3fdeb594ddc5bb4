/*
 * cuda_emu.h — runs the attention kernels on a CPU, one CTA at a time, each
 * CUDA thread a coroutine (x86-64 stack switch), so that the fragment
 * layouts, swizzles, masks, pipelines and launchers can be tested on a
 * machine without a GPU. It replaces kernels/attn/attn_device.cuh (it defines
 * that header's guard and every name in it) and is force-included:
 *   g++ -std=c++17 -include experiments/lab/emu/attn/cuda_emu.h -x c++ kernels/attn/attn_fwd.cu
 *
 * Semantics follow the PTX ISA: ldmatrix (.x4, .trans) and mma.m16n8k16
 * exchange data between the 32 lanes of a warp at the instruction, which
 * all lanes must reach (a divergent collective or barrier is reported as a
 * deadlock); cp.async copies land either at once or only at
 * cp.async.wait_group (a coin decides), so reading a stage before waiting
 * sees stale data (shared memory starts as NaN garbage) and refilling it
 * before a barrier clobbers data still in use; warps run in a different
 * order every round and a random quarter of them sit each round out, so
 * they drift apart between barriers as on hardware and a missing barrier
 * shows as stale data; with emu.lane_drift (hopper_bwd.cpp sets it) lanes of
 * a warp also sit rounds out, so that one lane's signal can overtake its
 * warp's other lanes (a missing __syncwarp); a barrier lets no thread past before all arrive. Not emulated: memory ordering between CTAs,
 * bank conflicts, timing.
 */
#ifndef DISTLAB_KERNELS_ATTN_DEVICE_CUH
#define DISTLAB_KERNELS_ATTN_DEVICE_CUH

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

#include "common/base.h"

#define ATTN_DEV inline
#define __global__
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
static inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
static inline float __uint_as_float(uint32_t x) { float f; memcpy(&f, &x, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t x; memcpy(&x, &f, 4); return x; }
// global atomics, fences and L2 loads: the emulated threads run one at a time, so plain accesses
template <class T> static inline T atomicAdd(T *p, T v) { const T old = *p; *p = old + v; return old; }
static inline void __threadfence() {}
template <class T> static inline T __ldcg(const T *p) { return *p; }

/* ---- the scheduler ------------------------------------------------------------ */

extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(R"(
  .text
  .weak emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");

struct emu_copy {
  char *dst;
  const char *src;
  int bytes, valid;
  long group;
};

struct emu_thread {
  void *sp;
  char *stack;
  bool done;
  long committed;
  std::vector<emu_copy> pending;
};

enum { EMU_STACK = 512 * 1024, EMU_MAX_THREADS = 1024 };

struct emu_warp {
  int arrived, op[32];
  long gen;
  uint32_t in[32][10];
  const void *ptr[32];
  uint32_t out[32][4];
};

struct emu_state {
  std::vector<emu_thread> th;
  std::vector<emu_warp> warps;
  int cur, nthreads, cta_arrived;
  long cta_gen, progress;
  void *sched_sp;
  char *smem;
  size_t smem_bytes;
  const std::function<void()> *body;
  bool deadlock;
  /* lanes drift too: about a quarter of the lanes of each warp also sit a round out, so that a
   * lane's signal to other warps can overtake its warp's other lanes (a missing __syncwarp) */
  bool lane_drift;
};
inline emu_state emu;

static inline void emu_yield() { emu_switch(&emu.th[emu.cur].sp, emu.sched_sp); }

static void emu_entry() {
  (*emu.body)();
  emu_thread &t = emu.th[emu.cur];
  for (const emu_copy &c : t.pending)
    if (c.group >= t.committed) fprintf(stderr, "emu: cp.async issued but never committed\n");
  t.done = true;
  emu.progress++;
  emu_yield();
  abort(); /* a finished thread is never resumed */
}

/* Barrier over `count` participants sharing (arrived, gen). */
static inline void emu_barrier(int *arrived, long *gen, int count, const std::function<void()> &last) {
  long g = *gen;
  emu.progress++;
  if (++*arrived == count) {
    last();
    *arrived = 0;
    ++*gen;
    return;
  }
  while (*gen == g) emu_yield();
}

/* A warp-collective op: every lane stages its inputs, the last to arrive
 * computes all lanes' outputs. */
template <class F>
static inline void emu_warp_op(int op, F compute) {
  emu_warp &w = emu.warps[emu.cur / 32];
  w.op[emu.cur % 32] = op;
  emu_barrier(&w.arrived, &w.gen, 32, [&] {
    for (int l = 1; l < 32; l++)
      if (w.op[l] != w.op[0]) {
        fprintf(stderr, "emu: lanes of warp %d in different collectives (%d, %d)\n", emu.cur / 32, w.op[0], w.op[l]);
        abort();
      }
    compute(w);
  });
}

static inline void emu_run(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
  int nt = (int)(block.x * block.y * block.z);
  if (nt % 32 || nt > EMU_MAX_THREADS) {
    fprintf(stderr, "emu: block of %d threads\n", nt);
    abort();
  }
  if (emu.th.size() < (size_t)nt) {
    size_t old = emu.th.size();
    emu.th.resize(nt);
    for (size_t i = old; i < (size_t)nt; i++) emu.th[i].stack = (char *)malloc(EMU_STACK);
  }
  emu.warps.assign(nt / 32, emu_warp{});
  emu.smem = (char *)realloc(emu.smem, smem + 16);
  emu.smem_bytes = smem;
  emu.body = &body;
  gridDim = grid, blockDim = block;
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3(x, y, z);
        memset(emu.smem, 0xff, smem); /* NaN garbage */
        emu.nthreads = nt, emu.cta_arrived = 0, emu.cta_gen = 0;
        for (int t = 0; t < nt; t++) {
          emu_thread &th = emu.th[t];
          th.done = false, th.committed = 0, th.pending.clear();
          void **sp = (void **)(((uintptr_t)(th.stack + EMU_STACK)) & ~(uintptr_t)15);
          *--sp = nullptr;           /* fake return address of emu_entry */
          *--sp = (void *)emu_entry; /* where the first switch returns to */
          for (int r = 0; r < 6; r++) *--sp = nullptr;
          th.sp = sp;
        }
        uint64_t order = 0x2545f4914f6cdd1dull ^ (x * 131 + y * 7 + z);
        for (int left = nt, idle = 0;;) {
          long before = emu.progress;
          left = 0;
          /* warps in a different order every round, so a missing barrier
           * between warps is likely to show as stale data */
          order ^= order << 13, order ^= order >> 7, order ^= order << 17;
          const int nw = nt / 32, w0 = (int)(order % nw);
          const int stride = (nw & (nw - 1)) == 0 ? 2 * (int)((order >> 20) % nw) + 1 : 1; /* coprime */
          /* and about a quarter of the warps sit out each round */
          const uint64_t sit_out = (order >> 24) & (order >> 40) & ~(1ull << w0);
          for (int k = 0; k < nt; k++) {
            const int w = (w0 + (k / 32) * stride) % nw, t = w * 32 + k % 32;
            if (emu.th[t].done) continue;
            uint64_t lanes = 0;
            if (emu.lane_drift) {
              lanes = order * (2 * (uint64_t)w + 1) * 0x9e3779b97f4a7c15ull;
              lanes ^= lanes >> 29;
              lanes = lanes & (lanes >> 32);
            }
            if ((sit_out >> (w % 64)) & 1 || (lanes >> (k % 32)) & 1) {
              left++;
              continue;
            }
            emu.cur = t;
            threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            emu_switch(&emu.sched_sp, emu.th[t].sp);
            left += !emu.th[t].done;
          }
          if (left == 0) break;
          idle = emu.progress == before ? idle + 1 : 0;
          if (idle > 64) { /* sitting out never lasts 64 rounds for every warp */
            fprintf(stderr, "emu: deadlock in block (%u,%u,%u): divergent barrier or collective\n", x, y, z);
            abort();
          }
        }
      }
}

/* ---- what kernels/attn/attn_device.cuh provides ------------------------------------- */

ATTN_DEV char *attn_smem() { return emu.smem; }

ATTN_DEV void attn_sync() {
  static const std::function<void()> nothing = [] {};
  emu_barrier(&emu.cta_arrived, &emu.cta_gen, emu.nthreads, nothing);
}

ATTN_DEV void attn_syncwarp() {
  emu_warp_op(1, [](emu_warp &) {});
}

ATTN_DEV float attn_shfl_xor(float x, int mask) {
  emu_warp &w = emu.warps[emu.cur / 32];
  int lane = emu.cur % 32;
  memcpy(&w.in[lane][0], &x, 4);
  emu_warp_op(2 + mask * 16, [mask](emu_warp &w) {
    for (int l = 0; l < 32; l++) w.out[l][0] = w.in[l ^ mask][0];
  });
  float r;
  memcpy(&r, &w.out[lane][0], 4);
  return r;
}

ATTN_DEV bool attn_all(bool x) {
  emu_warp &w = emu.warps[emu.cur / 32];
  int lane = emu.cur % 32;
  w.in[lane][0] = x;
  emu_warp_op(3, [](emu_warp &w) {
    uint32_t all = 1;
    for (int l = 0; l < 32; l++) all &= w.in[l][0] != 0;
    for (int l = 0; l < 32; l++) w.out[l][0] = all;
  });
  return w.out[lane][0] != 0;
}

/* shared "addresses" are offsets from the CTA's shared memory */
ATTN_DEV uint32_t attn_smem_u32(const void *p) {
  ptrdiff_t o = (const char *)p - emu.smem;
  if (o < 0 || (size_t)o > emu.smem_bytes) {
    fprintf(stderr, "emu: pointer outside shared memory\n");
    abort();
  }
  return (uint32_t)o;
}

static inline uint32_t emu_smem_word(uint32_t addr) {
  if ((size_t)addr + 4 > emu.smem_bytes || addr % 4) {
    fprintf(stderr, "emu: ldmatrix address %u outside shared memory of %zu bytes or misaligned\n", addr, emu.smem_bytes);
    abort();
  }
  uint32_t v;
  memcpy(&v, emu.smem + addr, 4);
  return v;
}

static inline void emu_ldmatrix(uint32_t r[4], uint32_t row, bool trans) {
  emu_warp &w = emu.warps[emu.cur / 32];
  int lane = emu.cur % 32;
  w.in[lane][0] = row;
  emu_warp_op(trans ? 5 : 4, [trans](emu_warp &w) {
    for (int l = 0; l < 32; l++)
      for (int m = 0; m < 4; m++) {
        if (w.in[8 * m + l / 4][0] % 16) {
          fprintf(stderr, "emu: ldmatrix row address not 16-byte aligned\n");
          abort();
        }
        if (!trans) {
          w.out[l][m] = emu_smem_word(w.in[8 * m + l / 4][0] + 4 * (l % 4));
        } else { /* elements (2(l%4), l/4) and (2(l%4)+1, l/4) of matrix m */
          uint32_t a = emu_smem_word(w.in[8 * m + 2 * (l % 4)][0] + 2 * (l / 4) / 4 * 4);
          uint32_t b = emu_smem_word(w.in[8 * m + 2 * (l % 4) + 1][0] + 2 * (l / 4) / 4 * 4);
          uint32_t lo = (l / 4) % 2 ? a >> 16 : a & 0xffff, hi = (l / 4) % 2 ? b >> 16 : b & 0xffff;
          w.out[l][m] = lo | hi << 16;
        }
      }
  });
  for (int m = 0; m < 4; m++) r[m] = w.out[lane][m];
}

ATTN_DEV void ldmatrix_x4(uint32_t r[4], uint32_t row) { emu_ldmatrix(r, row, false); }
ATTN_DEV void ldmatrix_x4_trans(uint32_t r[4], uint32_t row) { emu_ldmatrix(r, row, true); }

static inline float emu_b16_to_f32(uint32_t h, bool bf16) {
  h &= 0xffff;
  if (bf16) return __uint_as_float(h << 16);
  uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) return (sign ? -1.f : 1.f) * (float)m * 0x1p-24f;
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint32_t emu_f32_to_b16(float f, bool bf16) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (bf16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  }
  uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    if (a < 0x33000000u) return sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126 - e;
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | q;
  }
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | (r >> 13);
}

template <bool BF16>
ATTN_DEV void mma_16816(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
  emu_warp &w = emu.warps[emu.cur / 32];
  int lane = emu.cur % 32;
  for (int i = 0; i < 4; i++) w.in[lane][i] = a[i];
  w.in[lane][4] = b0, w.in[lane][5] = b1;
  for (int i = 0; i < 4; i++) memcpy(&w.in[lane][6 + i], &c[i], 4);
  emu_warp_op(BF16 ? 6 : 7, [](emu_warp &w) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
      int g = l / 4, t = l % 4;
      for (int h = 0; h < 2; h++) {
        A[g][2 * t + h] = emu_b16_to_f32(w.in[l][0] >> (16 * h), BF16);
        A[g + 8][2 * t + h] = emu_b16_to_f32(w.in[l][1] >> (16 * h), BF16);
        A[g][2 * t + 8 + h] = emu_b16_to_f32(w.in[l][2] >> (16 * h), BF16);
        A[g + 8][2 * t + 8 + h] = emu_b16_to_f32(w.in[l][3] >> (16 * h), BF16);
        B[2 * t + h][g] = emu_b16_to_f32(w.in[l][4] >> (16 * h), BF16);
        B[2 * t + 8 + h][g] = emu_b16_to_f32(w.in[l][5] >> (16 * h), BF16);
      }
      memcpy(&C[g][2 * t], &w.in[l][6], 4), memcpy(&C[g][2 * t + 1], &w.in[l][7], 4);
      memcpy(&C[g + 8][2 * t], &w.in[l][8], 4), memcpy(&C[g + 8][2 * t + 1], &w.in[l][9], 4);
    }
    for (int l = 0; l < 32; l++) {
      int g = l / 4, t = l % 4;
      for (int i = 0; i < 4; i++) {
        int row = g + (i / 2) * 8, col = 2 * t + i % 2;
        double s = C[row][col];
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * B[k][col];
        float f = (float)s;
        memcpy(&w.out[l][i], &f, 4);
      }
    }
  });
  for (int i = 0; i < 4; i++) memcpy(&c[i], &w.out[lane][i], 4);
}

static inline void emu_cp_async(void *dst, const void *src, int bytes, bool valid) {
  emu_thread &t = emu.th[emu.cur];
  attn_smem_u32(dst);
  if ((uintptr_t)dst % bytes || (valid && (uintptr_t)src % bytes)) {
    fprintf(stderr, "emu: cp.async of %d bytes misaligned\n", bytes);
    abort();
  }
  /* half the copies land at once, half at the wait: a missing wait reads
   * stale data, a missing barrier before a refill overwrites live data */
  static uint64_t coin = 0x853c49e6748fea9bull;
  coin ^= coin << 13, coin ^= coin >> 7, coin ^= coin << 17;
  if (coin & 1) {
    if (valid)
      memcpy(dst, src, bytes);
    else
      memset(dst, 0, bytes);
    return;
  }
  t.pending.push_back({(char *)dst, (const char *)src, bytes, valid, t.committed});
}

ATTN_DEV void cp_async16(void *dst, const void *src, bool valid) { emu_cp_async(dst, src, 16, valid); }
ATTN_DEV void cp_async4(void *dst, const void *src, bool valid) { emu_cp_async(dst, src, 4, valid); }
ATTN_DEV void cp_async_commit() { emu.th[emu.cur].committed++; }

template <int N>
ATTN_DEV void cp_async_wait() {
  emu_thread &t = emu.th[emu.cur];
  std::vector<emu_copy> keep;
  for (const emu_copy &c : t.pending) {
    if (c.group >= t.committed - N) {
      keep.push_back(c);
      continue;
    }
    if (c.valid)
      memcpy(c.dst, c.src, c.bytes);
    else
      memset(c.dst, 0, c.bytes);
  }
  t.pending.swap(keep);
}

ATTN_DEV float attn_exp2(float x) { return exp2f(x); }

template <bool BF16>
ATTN_DEV uint32_t attn_pack2(float lo, float hi) {
  return emu_f32_to_b16(lo, BF16) | emu_f32_to_b16(hi, BF16) << 16;
}

template <bool BF16>
ATTN_DEV float attn_unpack_lo(uint32_t x) { return emu_b16_to_f32(x, BF16); }

template <bool BF16>
ATTN_DEV float attn_unpack_hi(uint32_t x) { return emu_b16_to_f32(x >> 16, BF16); }

static inline void emu_aligned(const void *p, size_t n) {
  if ((uintptr_t)p % n) {
    fprintf(stderr, "emu: %zu-byte access misaligned\n", n);
    abort();
  }
}
ATTN_DEV void attn_ld_b64(const void *p, uint32_t r[2]) { emu_aligned(p, 8), memcpy(r, p, 8); }
ATTN_DEV void attn_st_b64(void *p, const uint32_t r[2]) { emu_aligned(p, 8), memcpy(p, r, 8); }
ATTN_DEV void attn_ld_b128(const void *p, uint32_t r[4]) { emu_aligned(p, 16), memcpy(r, p, 16); }
ATTN_DEV void attn_st_b128(void *p, const uint32_t r[4]) { emu_aligned(p, 16), memcpy(p, r, 16); }

ATTN_DEV void attn_atomic_add4(float *dst, float a, float b, float c, float d) {
  if ((uintptr_t)dst % 16) {
    fprintf(stderr, "emu: float4 atomic misaligned\n");
    abort();
  }
  dst[0] += a, dst[1] += b, dst[2] += c, dst[3] += d;
}

ATTN_DEV void attn_atomic_max(float *dst, float x) { *dst = fmaxf(*dst, x); }

template <typename... KArgs, typename... Args>
static int attn_launch(const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                       size_t smem, void *stream, Args... args) {
  (void)stream;
  if (smem > 227 * 1024 || grid.y > 65535 || grid.z > 65535 || grid.x == 0)
    return DL_ERR(DL_ECUDA, "launch of %s failed: bad configuration (emulated)", name);
  std::function<void()> body = [&] { kernel(args...); };
  emu_run(grid, block, smem, body);
  return 0;
}

#endif
