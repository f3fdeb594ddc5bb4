/*
 * fwd_kernel.cuh — dl.attn's forward on Hopper (sm_90a): wgmma and TMA,
 * warp-specialised, FA3's design written out in PTX (ptx.cuh). The launcher
 * is attn_hopper.cu (which calls are taken: dl_attn_fwd_hopper_fits);
 * experiments/lab/attn/hopper/fwd.cu times it alone, and
 * experiments/lab/emu/attn/hopper_fwd.cpp runs it on the CPU with wgmma, TMA
 * and mbarriers emulated.
 *
 * Why hand-written PTX and not CuTe: the kernel needs a few instructions that
 * CuTe wraps (TMA load, mbarrier, wgmma SS/RS, named barriers, setmaxnreg)
 * and two kinds of shared memory descriptors; spelled out they are one
 * screen each, the descriptors are explicit (below), and the file compiles
 * in seconds on CI's two cores. Layouts read from CUTLASS 4.2's
 * cute/atom/mma_traits_sm90_gmma.hpp and cute/arch/copy_sm90_tma.hpp; no
 * code copied.
 *
 * Shapes: bf16, head dims (d_qk, d_v) = (64, 64), (128, 128) or MLA's (192, 128) (templates DQK, DV); bshd, sbhd or thd (packed rows, first rows
 * that need not start at 0, anything (NaN) between sequences); GQA/MQA; any
 * length; dl.attn's masks (a window (left, right) around the diagonal,
 * top-left or bottom-right); LSE (natural log), max_logit, and the fused
 * merge into a running (acc_out, acc_lse): acc_out fp32, or bf16 (CP's
 * accumulator has q's dtype), the merge in fp32 either way.
 *
 * CTA: 384 threads, BM = 128 query rows of one (batch, head); grid (m-blocks
 * last to first, heads, batches).
 *   warpgroup 2, producer (setmaxnreg 24): one thread TMA-loads Q once, then
 *     K and V of each key block (BN = 128; last block first) into STAGES = 2
 *     buffers; full barriers carry the bytes, empty barriers free them. With
 *     the merge, warps 9-11 copy the running rows (cp.async) into shared
 *     memory past the tiles once the first S ran (acc_stage_t), so that the
 *     epilogue finds them there (OPT's HP_FWD_OPT_TMA_M: warp 9's first
 *     thread by TMA boxes of the map `to`, and the merged rows go back by
 *     TMA stores); where they do not fit beside the tiles (MLA's 192/128),
 *     the consumers load them into registers under the last P V instead
 *     (merge_loads).
 *   warpgroups 0, 1, consumers (setmaxnreg 240): 64 query rows each. Per key
 *     block: S = Q K^T (8 wgmma m64n128k16 from shared memory); the element
 *     mask (selects) only in blocks that need it; online softmax in base 2
 *     (FFMA + MUFU.EX2 an element); O += P V with P in registers (8 RS wgmma,
 *     V transposed by its descriptor). The two warpgroups take turns at the
 *     tensor cores (FA3's scheduler: named barriers 4 and 5), so one's
 *     softmax runs under the other's GEMMs. PIPE = 1 adds FA3's
 *     intra-warpgroup pipelining (S(j) issued with P(j-1) V(j-1)); PIPE = 2
 *     the same with V(j)'s wait placed so that ptxas keeps S(j)'s softmax
 *     under P(j-1) V(j-1); PIPE = 3 is PIPE 2 with FA4's load order (the
 *     producer issues K(0), Q, then K(j+1) before V(j)).
 *   M192 (OPT's HP_FWD_OPT_M192, d 64 only; FA4's sm90 tile there): 512
 *     threads, BM = 192 rows, consumer warpgroups 0-2 (setmaxnreg 160) take
 *     the turn in rotation, so that each softmax has two other warpgroups'
 *     GEMMs to hide under; the producer is warpgroup 3 (setmaxnreg 32; warps
 *     13-15 copy the merge's rows). Same loops, epilogues and merge.
 *   Every wait times out into *err (no trap: a trap made ptxas spill P).
 *   Epilogue: O / l in bf16 and the LSE by each thread's stores; or (OPT's
 *     HP_FWD_OPT_TMA_O) O through shared memory over the warpgroup's rows of
 *     Q and TMA stores (the fifth tensor map, to); or the fused merge.
 *
 * Shared memory tiles, each a TMA box of 64 columns (128 bytes) x rows with
 * the 128-byte swizzle, 1024-byte aligned; a d = 128 tile is two of them:
 * Q [2][BM][64], K and V [STAGES][2][BN][64]: 160 KB, one CTA an SM.
 * wgmma descriptors (start >> 4 at [0,14), leading byte offset >> 4 at
 * [16,30), stride byte offset >> 4 at [32,46), 1 = 128B swizzle at [62,64)):
 *   K-major (Q as A, K as B): SBO = 1024 (8 rows of 128 B), LBO = 16 (unused);
 *     the k16 step kk of a half at start + 32 kk, the second half of d at
 *     start + rows * 128.
 *   MN-major (V as B; d = N contiguous): SBO = 1024 (8 keys), LBO = BN * 128
 *     (the second 64 columns of d); the k16 step (16 keys) at start + 2048.
 *
 * Files: fwd_params.cuh (sizes, shared memory, params_t, waits, trace),
 * fwd_mainloop.cuh (the consumers' steps: GEMMs, mask, softmax),
 * tile_scheduler.cuh (the tile order); here the kernel: the producer, the
 * two loops and the epilogue (the stores, or the merge).
 *
 * The variants tried and dropped (the merge's stores and copies, persistent
 * grids, P through shared memory) and their timings: experiments/lab/attn/NOTES.md.
 */
#ifndef DISTLAB_HOPPER_FWD_KERNEL_CUH
#define DISTLAB_HOPPER_FWD_KERNEL_CUH

#include <climits>
#include <type_traits>

#include "fwd_mainloop.cuh"
#include "fwd_params.cuh"
#include "tile_scheduler.cuh"

#ifndef HP_FWD_SKIP0 // (the kernel's SKIP0)
#define HP_FWD_SKIP0 1
#endif

// Grid (s / BM, h, b); which tile a CTA computes: tile_scheduler.cuh. The two consumer
// warpgroups take turns at the tensor cores (take_turn / hand_turn below). PIPE = 0: per key block,
// S, softmax, P V one after another, P in registers. PIPE = 1: FA3's intra-warpgroup pipelining,
// the softmax of block it between the issue of S(it) with P(it - 1) V(it - 1) and their completion,
// P in registers. PIPE = 2: PIPE 1 with V(it) waited for after S(it)'s softmax (below). PIPE = 3:
// PIPE 2's loop, the producer loading K(0), Q, then K(it + 1) before V(it) (FA4's order). OPT: the A/B
// variants' bits (fwd_params.cuh, HP_FWD_OPT_*).
template <int PIPE, int DQK, int DV, int OPT = HP_FWD_OPT>
__global__ void __launch_bounds__(fwd_threads(OPT), 1)
    fwd_kernel(const HP_GRID_CONST hp_tmap_t tq, const HP_GRID_CONST hp_tmap_t tk, const HP_GRID_CONST hp_tmap_t tv,
               const params_t p, const HP_GRID_CONST hp_tmap_t to) {
  // NWG consumer warpgroups of 64 rows (2, or 3 with M192), ROWS query rows a CTA, the producer's first
  // thread PROD (warpgroup NWG)
  constexpr int NWG = fwd_wgs(OPT), ROWS = fwd_rows(OPT), PROD = 128 * NWG;
  static_assert(NWG == 2 || (DQK == 64 && DV == 64), "M192: head dim 64 only (registers: 160 a consumer thread)");
  smem_t<DQK, DV, ROWS> &sm = *reinterpret_cast<smem_t<DQK, DV, ROWS> *>(hp_smem_aligned());
  const hp_tile_t tile = hp_fwd_tile<DQK, DV>(p);
  const int m_block = tile.m_block, hh = tile.hh, bb = tile.bb, hkv = hh / (p.h / p.h_kv);
  const int warp_id = hp_warp_uniform(threadIdx.x / 32), tid = threadIdx.x % 128; // lane 0's, as CUTLASS does
  // this sequence: its lengths, the rows (thd) or batch (bshd/sbhd) the tensor maps address it by
  const hp_seq_t sq = hp_seq(p, bb);
  const int len_q = sq.len_q, len_kv = sq.len_kv, first_q = sq.first_q, first_kv = sq.first_kv, tb = sq.tb;
  if (m_block * ROWS >= len_q) return; // the whole CTA, before any barrier (the same with base's offset)
  // the block's first row (negative where the short block comes first: hp_fwd_row_off)
  const int base = m_block * ROWS - hp_fwd_row_off(p, len_q, ROWS);
  if (threadIdx.x == 0) HP_TRACE(p, 0, HP_TRACE_SMID), HP_TRACE(p, 1), HP_TRACE(p, 2, HP_TRACE_GLOBAL);
  using ST = acc_stage_t<DQK, DV, ROWS>;
  constexpr bool STAGED = ST::on;
  char *const stage_ptr = reinterpret_cast<char *>(&sm) + sizeof(smem_t<DQK, DV, ROWS>); // the running rows (STAGED)
  const uint32_t stage = hp_smem_u32(stage_ptr);
  // the running rows in and out by TMA (the map `to` is the running out's); staged rows only
  constexpr bool TMA_M = STAGED && (OPT & HP_FWD_OPT_TMA_M) != 0;
  static_assert(!(OPT & HP_FWD_OPT_TMA_M) || STAGED, "HP_FWD_OPT_TMA_M: only where the running rows are staged");
  // the arrivals that free a K or V stage: every consumer thread's, or (ELECT) one a consumer warp's
  constexpr bool ELECT = OPT & HP_FWD_OPT_ELECT;
  constexpr uint32_t RELEASES = ELECT ? 4 * NWG : 128 * NWG;
  constexpr int NSUM = OPT & HP_FWD_OPT_TREE ? 4 : 1; // partial row sums a row (softmax_step)
  constexpr bool LAZY = (OPT & HP_FWD_OPT_LAZY) != 0;  // the exps' base moved by more than 2^8 only
  // HP_FWD_SKIP0: a warpgroup skips block 0 where it is past all its rows' right window (M192 only: there
  // 192 rows over 128-key blocks leave the first warpgroup a whole block past the causal diagonal)
  constexpr bool SKIP0 = HP_FWD_SKIP0 && ROWS > BN;
  // key blocks [n_lo, n_hi): those holding a key that a row of this block sees; walked last to first
  const int shift = p.bottom_right ? len_kv - len_q : 0, wl = p.window_left, wr = p.window_right;
  const int i0 = max(base, 0), i1 = min(base + ROWS, len_q);
  const int key_lo = wl >= 0 ? max(0, i0 + shift - wl) : 0, key_hi = wr >= 0 ? min(len_kv, i1 + shift + wr) : len_kv;
  const int n_lo = key_lo / BN, n_hi = key_hi > key_lo ? (key_hi + BN - 1) / BN : n_lo, nblk = n_hi - n_lo;

  if (threadIdx.x == 0) {
    sm.fail = 0;
    mbar_init(&sm.q_full, 1);
    for (int i = 0; i < STAGES; i++) {
      mbar_init(&sm.k_full[i], 1);
      mbar_init(&sm.v_full[i], 1);
      mbar_init(&sm.k_empty[i], RELEASES);
      mbar_init(&sm.v_empty[i], RELEASES);
    }
    mbar_init(&sm.acc_go, 1);
    mbar_init(&sm.acc_full, TMA_M ? 97 : 96);
    mbar_init_fence();
  }
  hp_sync();

  // where row `row` of the sequence (from 0) is in an operand with strides st (params_t)
  auto at = [&](const int64_t(&st)[3], int row) { return ((int64_t)first_q + row) * st[0] + hh * st[1] + (int64_t)tb * st[2]; };

  // the go of the running rows' copies (STAGED merge), from the producer's first thread; with TMA_M it
  // issues their boxes first (128 bytes x 64 rows of the map `to`, rows past the tensor zeros; acc_full
  // counts its expect_tx as the 97th arrival), so that the copy warps copy only the LSEs
  auto acc_go = [&] {
    if constexpr (TMA_M) {
      auto boxes = [&](auto es_c) {
        constexpr int ES = decltype(es_c)::value;
        mbar_expect_tx(&sm.acc_full, ROWS * DV * ES);
#pragma unroll
        for (int rb = 0; rb < ROWS / 64; rb++)
#pragma unroll
          for (int b = 0; b < DV * ES / 128; b++)
            tma_load(stage_ptr + b * (ROWS * 128) + rb * (64 * 128), &to, &sm.acc_full, b * 128 / ES, hh,
                     first_q + i0 + 64 * rb, tb);
      };
      if (p.acc_bf16) boxes(std::integral_constant<int, 2>{});
      else boxes(std::integral_constant<int, 4>{});
    }
    mbar_arrive(&sm.acc_go);
  };
  // HP_PREFETCH (p.next_ctas): once its last K and V are issued, the TMA thread hints into L2 the Q tile and
  // the first K and V blocks of the CTA that starts about when this one ends (hp_cta_lin): its Q is its own,
  // so its first loads would otherwise wait on HBM at its start, with its SM idle
  auto prefetch_next = [&] {
    const int nxt = hp_cta_lin() + p.next_ctas;
    if (p.next_ctas <= 0 || nxt >= hp_grid_ctas()) return;
    const hp_tile_t t = hp_fwd_tile<DQK, DV>(p, nxt);
    const hp_seq_t s = hp_seq(p, t.bb);
    if (t.m_block * ROWS >= s.len_q) return;
    const int nbase = t.m_block * ROWS - hp_fwd_row_off(p, s.len_q, ROWS);
    for (int half = 0; half < DQK / 64; half++) tma_prefetch_l2(&tq, 64 * half, t.hh, s.first_q + nbase, s.tb);
    const int sh = p.bottom_right ? s.len_kv - s.len_q : 0, last = min(nbase + ROWS, s.len_q) - 1;
    const int kh = p.window_right >= 0 ? min(s.len_kv, last + 1 + sh + p.window_right) : s.len_kv; // its key_hi
    if (kh <= 0) return;
    const int k0 = s.first_kv + (kh - 1) / BN * BN, hk = t.hh / (p.h / p.h_kv);
    for (int half = 0; half < DQK / 64; half++) tma_prefetch_l2(&tk, 64 * half, hk, k0, s.tb);
    for (int half = 0; half < DV / 64; half++) tma_prefetch_l2(&tv, 64 * half, hk, k0, s.tb);
  };
  if (warp_id >= 4 * NWG) { // producer
    reg_dealloc<NWG == 3 ? 32 : 24>();
    if (STAGED && warp_id >= 4 * NWG + 1 && p.acc_out) { // the running rows into shared memory (acc_stage_t), once
      // the first key blocks are on their way (copied at once, they slowed the first blocks' loads: fp32
      // rows are as many bytes as Q, K and V of a block)
      // (in 24 registers: one wait in the code, for the go and then for the copies to land, so that no
      // thread leaves with its copies in flight; the rows' addresses from the first's, one step a row;
      // shifts, no divisions: a row's bytes and vec are powers of 2)
      // the running LSEs of the block's rows, a row a copy over the 96 copying threads (t), then the arrival
      auto copy_lses = [&](int t, int rows) {
        const float *lse0 = p.acc_lse + at(p.acc_lse_st, i0);
        for (int r = t; r < rows; r += 96) cp_async(stage + ST::o_bytes + 4 * r, lse0 + r * p.acc_lse_st[0], 4);
        cp_async_arrive(&sm.acc_full);
      };
      if constexpr (TMA_M) { // the rows come by TMA boxes (acc_go): the LSEs alone, then the wait for all
        mbar_wait(&sm.acc_go, 0, &sm.fail, p.err);
        copy_lses(threadIdx.x - (PROD + 32), i1 - i0);
        mbar_wait(&sm.acc_full, 0, &sm.fail, p.err);
        if (threadIdx.x == PROD + 32) HP_TRACE(p, 3);
      } else { // the rows and the LSEs by the copy warps' cp.asyncs
        for (int landed = 0;; landed = 1) {
          mbar_wait(landed ? &sm.acc_full : &sm.acc_go, 0, &sm.fail, p.err);
          if (landed) {
            if (threadIdx.x == PROD + 32) HP_TRACE(p, 3);
            break;
          }
          const int t = threadIdx.x - (PROD + 32), es = p.acc_bf16 ? 2 : 4, row_bytes = DV * es, vec = p.acc_vec;
          const int rows = i1 - i0, lg_vec = __ffs(vec) - 1, lg_row = __ffs(row_bytes / vec) - 1;
          const char *acc = static_cast<const char *>(p.acc_out) + at(p.acc_st, i0) * es;
          const int64_t step = p.acc_st[0] * es;
          if (vec == 16) { // 16-byte copies: a thread keeps one chunk c of rows r, r + rstep, ... (16 or
            // 32 chunks a row divide the 96 threads), so that a copy costs two adds and the swizzle's XOR
            const int c = t & ((1 << lg_row) - 1), rstep = 96 >> lg_row;
            const int64_t src_step = rstep * step;
            const uint32_t dst_step = rstep * 128;
            int r = t >> lg_row;
            const char *src = acc + r * step + 16 * c;
            for (uint32_t dst = stage + (c >> 3) * (ROWS * 128) + r * 128; r < rows; r += rstep, src += src_step, dst += dst_step)
              cp_async(dst + (((c & 7) ^ (r & 7)) << 4), src, 16);
          } else // 8- or 4-byte copies (a running out off 16-byte alignment; dl.attn never passes one)
            for (int i = t; i < rows << lg_row; i += 96) {
              const int r = i >> lg_row, byte = (i - (r << lg_row)) << lg_vec;
              cp_async(acc_stage_at<ROWS>(stage, r, byte), acc + r * step + byte, vec);
            }
          copy_lses(t, rows);
        }
      }
    }
    if (threadIdx.x == PROD && PIPE == 3) {
      // FA4's order (flash_fwd_sm90.py's load with intra-warpgroup overlap): K(0), Q, then K(it + 1)
      // before V(it), since the loop needs K(it + 1) for S(it + 1) in the turn where it issues
      // P(it) V(it), and V(it) only after S(it)'s softmax. K and V keep their own stages and
      // barriers, and block it its stage it % STAGES and phase, so only the issue order changes.
      const bool go = STAGED && p.acc_out;
      auto load_k = [&](int it) {
        const int st = it % STAGES;
        const uint32_t round = it / STAGES;
        if (round > 0) mbar_wait(&sm.k_empty[st], (round - 1) & 1, &sm.fail, p.err);
        if (go && it == STAGES) acc_go();
        mbar_expect_tx(&sm.k_full[st], tile_bytes_t<DQK>::value);
        for (int half = 0; half < DQK / 64; half++)
          tma_load(sm.k[st][half], &tk, &sm.k_full[st], 64 * half, hkv, first_kv + (n_hi - 1 - it) * BN, tb);
      };
      auto load_v = [&](int it) {
        const int st = it % STAGES;
        const uint32_t round = it / STAGES;
        if (round > 0) mbar_wait(&sm.v_empty[st], (round - 1) & 1, &sm.fail, p.err);
        mbar_expect_tx(&sm.v_full[st], tile_bytes_t<DV>::value);
        for (int half = 0; half < DV / 64; half++)
          tma_load(sm.v[st][half], &tv, &sm.v_full[st], 64 * half, hkv, first_kv + (n_hi - 1 - it) * BN, tb);
      };
      if (nblk > 0) load_k(0);
      mbar_expect_tx(&sm.q_full, ROWS * DQK * 2);
      for (int half = 0; half < DQK / 64; half++)
        tma_load(sm.q[half], &tq, &sm.q_full, 64 * half, hh, first_q + base, tb);
      for (int it = 1; it < nblk; it++) {
        load_k(it);
        load_v(it - 1);
      }
      if (nblk > 0) load_v(nblk - 1);
      if (go && nblk <= STAGES) acc_go();
      prefetch_next();
      HP_TRACE(p, 4);
    } else if (threadIdx.x == PROD) {
      // the go of the running rows' copies (STAGED merge): once the consumers are done with the first
      // K (the first S ran), or once every load is issued where there are at most two blocks
      const bool go = STAGED && p.acc_out;
      mbar_expect_tx(&sm.q_full, ROWS * DQK * 2);
      for (int half = 0; half < DQK / 64; half++)
        tma_load(sm.q[half], &tq, &sm.q_full, 64 * half, hh, first_q + base, tb);
      for (int it = 0; it < nblk; it++) {
        const int n = n_hi - 1 - it, st = it % STAGES;
        const uint32_t round = it / STAGES;
        if (round > 0) mbar_wait(&sm.k_empty[st], (round - 1) & 1, &sm.fail, p.err);
        if (go && it == STAGES) acc_go();
        mbar_expect_tx(&sm.k_full[st], tile_bytes_t<DQK>::value);
        for (int half = 0; half < DQK / 64; half++)
          tma_load(sm.k[st][half], &tk, &sm.k_full[st], 64 * half, hkv, first_kv + n * BN, tb);
        if (round > 0) mbar_wait(&sm.v_empty[st], (round - 1) & 1, &sm.fail, p.err);
        mbar_expect_tx(&sm.v_full[st], tile_bytes_t<DV>::value);
        for (int half = 0; half < DV / 64; half++)
          tma_load(sm.v[st][half], &tv, &sm.v_full[st], 64 * half, hkv, first_kv + n * BN, tb);
      }
      if (go && nblk <= STAGES) acc_go();
      prefetch_next();
      HP_TRACE(p, 4);
    }
    return;
  }

  reg_alloc<NWG == 3 ? 160 : 240>();
  // consumers: warpgroup c (warps 4c .. 4c + 3) owns rows [c * 64, c * 64 + 64) of the block
  const int c = warp_id / 4, warp = tid / 32, lane = tid % 32;
  const int r0 = c * 64 + warp * 16 + lane / 4; // this thread's rows: r0 and r0 + 8 (in the block)
  const int q0 = base + r0;
  float o[DV / 2], s[64];
  for (int i = 0; i < DV / 2; i++) o[i] = 0.0f;
  float mx[2] = {-INFINITY, -INFINITY}, sums[2 * NSUM] = {};
  const uint32_t q_base = hp_smem_u32(sm.q[0]) + c * 64 * 128;
  const int row0 = base + c * 64; // the warpgroup's first row
  // key block n_hi - 1 - it needs element masks where it reaches past the sequence's keys (the rows
  // past them hold another sequence's or zeros) or past the window of one of the warpgroup's rows
  // (its last key j1 against two bounds set once: j1 >= len_kv, or past the right window of the warpgroup's
  // first row, j1 > row0 + shift + wr; or its first key j1 - BN + 1 left of the left window of its last
  // row, < row0 + 63 + shift - wl; two compares an iteration where the three tests cost ten instructions)
  const int j1_hi = wr >= 0 ? min(len_kv, row0 + shift + wr + 1) : len_kv;
  const int j1_lo = wl >= 0 ? row0 + 63 + shift - wl + BN - 1 : INT_MIN;
  auto diag = [&](uint32_t it) {
    const int j1 = (n_hi - (int)it) * BN - 1; // the block's last key
    return j1 >= j1_hi || j1 < j1_lo;
  };
  auto key0 = [&](uint32_t it) { return (n_hi - 1 - (int)it) * BN; };
  // block it's stage and phase, from an unsigned it (a signed one costs the modulo's sign fix-ups)
  auto k_base = [&](uint32_t it) { return hp_smem_u32(sm.k[it % STAGES][0]); };
  auto v_base = [&](uint32_t it) { return hp_smem_u32(sm.v[it % STAGES][0]); };
  auto parity = [](uint32_t it) { return (it / STAGES) & 1u; };
  // a stage's release, once the wgmma.wait_group that covers the GEMMs reading it passed: that wait is
  // warp-aligned (every lane past it), and the warpgroup's wgmma, whose shared memory reads it
  // completes, is one operation for all its lanes, so with ELECT lane 0 alone arrives. No lane wrote the
  // stage with generic stores since its last barrier (zero_tail's stores are ordered by named barrier 3),
  // so no __syncwarp is needed first.
  auto release = [&](uint64_t *b) {
    if (!ELECT || lane == 0) mbar_arrive(b);
  };
  // V of block it in its stage, with the rows past the sequence's keys zeroed in the one block that has them
  // (only block n_hi - 1, it 0, can have such rows: key_hi <= len_kv; the pipelined loops wait for V(0)
  // before their loop and for later blocks by wait_v_full, without the test)
  auto wait_v_full = [&](uint32_t it) { mbar_wait(&sm.v_full[it % STAGES], parity(it), &sm.fail, p.err); };
  auto wait_v = [&](uint32_t it) {
    wait_v_full(it);
    const int valid = len_kv - (n_hi - 1 - (int)it) * BN;
    if (valid < BN) zero_tail<DV, NWG>(v_base(it), valid, c, tid);
  };
  float corr[2];
  auto step_softmax = [&](uint32_t it) {
    if (diag(it)) mask_block(s, key0(it), q0, len_kv, shift, wl, wr, lane);
    softmax_step<NSUM, LAZY>(s, mx, sums, corr, p.scale_log2);
  };
  uint32_t pa[32]; // P in bf16
  // FA3's warpgroup scheduler: a warpgroup issues its GEMMs in its turn (named barrier 4 + c, 256
  // threads: its own 128 and the previous one's arrival) and hands the turn to the next (arrives at
  // 4 + (c + 1) % NWG: 5 - c of two, a rotation 0, 1, 2 of three as FA4's WarpSchedulerWG barriers), so
  // that one warpgroup's softmax runs while another's GEMMs use the tensor cores. Warpgroup 0 starts.
  // Every turn taken is handed over; warpgroup 0's opening arrival is the one left at the end.
  auto take_turn = [&] { named_bar_sync(4 + c, 256); };
  auto hand_turn = [&] { named_bar_arrive(NWG == 2 ? 5 - c : 4 + (c + 1) % NWG, 256); };
  if (c == 0) named_bar_arrive(4, 256);
  // where the running rows are not staged: their reads (LSE and O) into registers, issued while the
  // last P V runs, so that the round trip is not on the epilogue's path
  float old[2] = {-INFINITY, -INFINITY};
  float2 x[2][STAGED ? 1 : DV / 8];
  auto merge_loads = [&] {
    if constexpr (!STAGED) {
      if (!p.acc_out) return;
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int row = q0 + 8 * r;
        const bool in = row < len_q;
        old[r] = in ? p.acc_lse[at(p.acc_lse_st, row)] : -INFINITY;
        const int64_t e = (in ? at(p.acc_st, row) : 0) + 2 * (lane % 4);
        if (p.acc_bf16) {
          const uint32_t *a = reinterpret_cast<const uint32_t *>(static_cast<const uint16_t *>(p.acc_out) + e);
#pragma unroll
          for (int j = 0; j < DV / 8; j++) x[r][j] = in ? unpack_bf16(a[4 * j]) : make_float2(0.0f, 0.0f);
        } else {
          const float2 *a = reinterpret_cast<const float2 *>(static_cast<const float *>(p.acc_out) + e);
#pragma unroll
          for (int j = 0; j < DV / 8; j++) x[r][j] = in ? a[4 * j] : make_float2(0.0f, 0.0f);
        }
      }
    }
  };
  mbar_wait(&sm.q_full, 0, &sm.fail, p.err);
  if (tid == 0 && c == 0) HP_TRACE(p, 5);

  if (PIPE == 0) {
    // the turn: P(it - 1) V(it - 1) issued and waited for, then S(it) issued
    take_turn();
    for (int it = 0; it < nblk; it++) {
      mbar_wait(&sm.k_full[it % STAGES], parity(it), &sm.fail, p.err);
      gemm_qk<DQK, ROWS>(s, q_base, k_base(it));
      hand_turn();
      wg_wait<0>();
      release(&sm.k_empty[it % STAGES]);
      step_softmax(it);
      pack_p(s, pa);
      if (!LAZY || hp_any(corr[0] != 1.0f || corr[1] != 1.0f)) scale_o<DV>(o, corr); // LAZY: a row of the warp moved
      wait_v(it);
      take_turn();
      gemm_pv_regs<DV>(o, pa, v_base(it));
      if (it == nblk - 1) merge_loads();
      wg_wait<0>();
      release(&sm.v_empty[it % STAGES]);
    }
    if (nblk == 0) merge_loads();
    hand_turn();
  } else if (nblk > 0) {
    // S(0) and its softmax before the loop, outside the turns; then the turn: S(it) and
    // P(it - 1) V(it - 1) issued together. PIPE 2 waits for V(it) after the first of S(it)'s exps,
    // before the wait for P(it - 1) V(it - 1) (PIPE 1: after P(it)'s packing): the try-wait
    // loop ends a basic block, and ptxas then keeps that wgmma wait where it is (in PIPE 1 it
    // hoists it above the row max, so the softmax does not run under the P V; FA4-GAP.md F1).
    constexpr bool LATE_V = PIPE >= 2;
    constexpr int EXPS_EARLY = 3; // of 16 columns (12 of a thread's 64 exps; FA4's SASS: 11)
    // SKIP0: block 0 (the CTA's last keys) lies past the right window of every row of this warpgroup (M192's
    // first warpgroups on the causal diagonal: 192 rows a CTA over 128-key blocks), so its S, softmax and
    // P V would add nothing: the warpgroup releases its stages unused and starts at block 1 (FA4 computes it)
    const bool skip0 = SKIP0 && wr >= 0 && nblk >= 2 && key0(0) > row0 + 63 + shift + wr;
    if (!skip0) {
      mbar_wait(&sm.k_full[0], parity(0), &sm.fail, p.err);
      gemm_qk<DQK, ROWS>(s, q_base, k_base(0));
      wg_wait<0>();
      release(&sm.k_empty[0]);
      step_softmax(0);
      pack_p(s, pa);
    } else release(&sm.k_empty[0]); // (V(0)'s stage: released in turn 1, as after its P V)
    wait_v(0); // the one block that can have a tail: it meets the other warpgroups in zero_tail here
    // one turn of block it; MASKED: its element masks (the caller's diag(it)), none where it is false;
    // FIRST: the warpgroup's first block after SKIP0's, with no P V of block it - 1
    auto turn = [&](uint32_t it, auto masked, auto first) {
      constexpr bool MASKED = decltype(masked)::value, FIRST = decltype(first)::value;
      mbar_wait(&sm.k_full[it % STAGES], parity(it), &sm.fail, p.err);
      take_turn();
      gemm_qk<DQK, ROWS>(s, q_base, k_base(it));
      if constexpr (!FIRST) gemm_pv_regs<DV>(o, pa, v_base(it - 1));
      hand_turn();
      if constexpr (FIRST) wg_wait<0>(); // S(it), the only group
      else wg_wait<1>(); // S(it) is in (commit groups complete in order); P(it - 1) V(it - 1) still runs
      release(&sm.k_empty[it % STAGES]);
      // PIPE 2: the wait for P(it - 1) V(it - 1) after the first EXPS_EARLY columns' exps (FA4's place), so
      // that P's packing into the registers that GEMM read runs among the other exps (A/B: d 128 forward
      // +0.5-3.5%; PIPE 1, whose wait ptxas hoists above the row max, gained nothing at d 64)
      float base[2];
      if (MASKED && diag(it)) mask_block(s, key0(it), q0, len_kv, shift, wl, wr, lane); // (the test: mask_block in a
      // basic block of its own, as the loop had it before; masks merged into the softmax's block spilled)
      if constexpr (LATE_V) {
        softmax_base<NSUM, LAZY>(s, mx, sums, corr, base, p.scale_log2);
        softmax_exps<NSUM, 0, EXPS_EARLY>(s, sums, base, p.scale_log2);
        wait_v_full(it); // for the next turn's P V
      } else softmax_step<NSUM, LAZY>(s, mx, sums, corr, p.scale_log2);
      wg_wait<0>(); // P(it - 1) V(it - 1) is in: O, P and V's stage are free
      release(&sm.v_empty[(it - 1) % STAGES]);
      if (!LAZY || hp_any(corr[0] != 1.0f || corr[1] != 1.0f)) scale_o<DV>(o, corr); // LAZY: a row of the warp moved
      if constexpr (LATE_V) softmax_exps_pack<NSUM, EXPS_EARLY>(s, sums, base, p.scale_log2, pa);
      else {
        pack_p(s, pa);
        wait_v_full(it); // PIPE 1: V(it), for the next turn's P V, after the softmax as before the turn
      }
    };
    // The blocks that need masks are a first run [1, it_a) (past the keys or the right window) and a last
    // one [it_b, nblk) (left of the left window; diag's j1 falls as it rises); the blocks between run in a
    // loop of their own with no mask test in its body (FA4's separate masked and unmasked loops), so that
    // the softmax follows S's wait in one basic block
    uint32_t it_a = 1, it_b = nblk;
    while (it_a < it_b && diag(it_a)) it_a++;
    while (it_b > it_a && diag(it_b - 1)) it_b--;
    uint32_t it = 1;
    if (skip0) turn(it++, std::true_type{}, std::true_type{});
    for (; it < it_a; it++) turn(it, std::true_type{}, std::false_type{});
    for (; it < it_b; it++) turn(it, std::false_type{}, std::false_type{});
    for (; it < (uint32_t)nblk; it++) turn(it, std::true_type{}, std::false_type{});
    gemm_pv_regs<DV>(o, pa, v_base(nblk - 1));
    merge_loads();
    wg_wait<0>();
    release(&sm.v_empty[(nblk - 1) % STAGES]);
  } else {
    merge_loads();
  }

  // epilogue: the row sums over the four threads of a row, O / l, LSE (natural log); or the merge
  if (lane == 0 && warp_id < 8) HP_TRACE(p, 8 + warp_id); // (M192's warps 8-11: no slots)
  float inv[2], sum[2];
  row_sums<NSUM>(sums, sum);
  row_totals(sum, inv, mx, q0, len_q, p, hh, lane);
  float lse[2];
#pragma unroll
  for (int r = 0; r < 2; r++) lse[r] = sum[r] > 0.0f ? (mx[r] + log2f(sum[r])) * 0.69314718055994531f : -INFINITY;
  if (!p.acc_out) {
    if constexpr ((OPT & HP_FWD_OPT_TMA_O) != 0) {
      // FA4's epilogue (sO = sQ): the warpgroup's O in bf16 over its own 64 rows of Q, whose last reader
      // (its last S) completed at a wgmma wait above (with no key block: Q landed, waited for before the
      // loop), swizzled as the map's 128-byte swizzle places them (16-byte chunk k of row r at chunk
      // k ^ (r % 8): a row's four threads fill a chunk, eight rows eight chunks, no bank conflict); then
      // one thread stores each half of d (64 columns x 64 rows) by TMA. bshd/sbhd: the map clips rows
      // past s_q. thd: a warpgroup whose rows reach past its sequence keeps the stores below.
      if (row0 >= 0 && (!p.cu_q || row0 + 64 <= len_q)) {
        const uint32_t ob = hp_smem_u32(sm.q[0]) + c * 64 * 128; // the warpgroup's rows, first half of d
        const int wr0 = r0 - c * 64;                             // this thread's first row among them
#pragma unroll
        for (int j = 0; j < DV / 8; j++)
#pragma unroll
          for (int r = 0; r < 2; r++) {
            const int row = wr0 + 8 * r;
            st_shared_u32(ob + (j / 8) * ROWS * 128 + row * 128 + (((j % 8) ^ (row & 7)) << 4) + 4 * (lane % 4),
                          pack_bf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]));
          }
        fence_proxy_async();       // the writes, visible to the TMA unit (the async proxy)
        named_bar_sync(4 + NWG + c, 128); // the warpgroup's writes all done (ids past the turns')
        if (tid == 0) {
          for (int half = 0; half < DV / 64; half++)
            tma_store(&to, sm.q[half] + c * 64 * 64, 64 * half, hh, first_q + row0, tb);
          bulk_commit();
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
          if (q0 + 8 * r < len_q && lane % 4 == 0) p.lse[at(p.lse_st, q0 + 8 * r)] = lse[r];
        if (tid == 0) bulk_wait_read(); // shared memory stays the CTA's until the stores read it
        if (lane == 0 && warp_id < 8) HP_TRACE(p, 16 + warp_id), HP_TRACE(p, 24 + warp_id, HP_TRACE_GLOBAL);
        return;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = q0 + 8 * r;
      if (row < 0 || row >= len_q) continue; // rows outside the sequence: another sequence's, or nothing
      const int64_t oa = at(p.o_st, row);
#pragma unroll
      for (int j = 0; j < DV / 8; j++)
        *reinterpret_cast<uint32_t *>(p.o + oa + 8 * j + 2 * (lane % 4)) =
            pack_bf16(o[4 * j + 2 * r] * inv[r], o[4 * j + 2 * r + 1] * inv[r]);
      if (lane % 4 == 0) p.lse[at(p.lse_st, row)] = lse[r];
    }
    if (lane == 0 && warp_id < 8) HP_TRACE(p, 16 + warp_id), HP_TRACE(p, 24 + warp_id, HP_TRACE_GLOBAL);
    return;
  }
  // merge: L = log(e^L_acc + e^L), acc_out = acc_out e^(L_acc - L) + O e^(L - L); a row of the step
  // with no key (L = -inf) leaves the running pair as it was. The running LSE and O are in shared
  // memory (STAGED), or were read by merge_loads (under the last P V).
  if (STAGED) mbar_wait(&sm.acc_full, 0, &sm.fail, p.err);
  else hp_syncwarp(); // a row's four threads read the old LSE before its first thread writes the new
  // both rows' factors first, in base 2 on MUFU.EX2/LG2 (no branch between the rows, so that their
  // latencies overlap), then the pairs
  float ka[2], kb[2], lnew[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    if constexpr (STAGED) old[r] = ld_shared_f32(stage + ST::o_bytes + 4 * (r0 + 8 * r));
    const float o2 = old[r] * 1.4426950408889634f, l2 = lse[r] * 1.4426950408889634f; // -inf stays -inf
    const float hi = fmaxf(o2, l2), n2 = hi + hp_log2(1.0f + hp_exp2(fminf(o2, l2) - hi));
    ka[r] = hp_exp2(o2 - n2), kb[r] = hp_exp2(l2 - n2) * inv[r], lnew[r] = n2 * 0.69314718055994531f;
  }
  // TMA_M: the merged pairs back into their staged places, then the warpgroup's boxes by TMA stores (a row
  // left as it was goes back as it came); thd: a warpgroup whose rows reach past its sequence stores its
  // own rows (its boxes would carry stale rows over another sequence's)
  const bool tma_m = TMA_M && (!p.cu_q || row0 + 64 <= len_q);
  // the rows, their pairs to shared memory (SM: TMA_M) or to global memory; one path or the other for
  // the whole epilogue, so that neither holds the other's addresses
  auto merge_rows = [&](auto sm_c) {
    constexpr bool SM = decltype(sm_c)::value;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = q0 + 8 * r;
      if (row >= len_q || lse[r] == -INFINITY) continue;
      const int br = r0 + 8 * r; // the row in the block (staged)
      // the pairs of a running out of ES bytes an element: pair j (columns 8 j + 2 (lane % 4), + 1) of
      // staged row br lies at off[j % J] + ROWS 128 (j / J), J pairs to a box's 128 bytes, so that a
      // pair's read is one instruction with an immediate offset; SM: the merged pair back there
      auto merge_row = [&](auto es_c) {
        constexpr int ES = decltype(es_c)::value, J = 128 / (8 * ES);
        [[maybe_unused]] const int64_t e = SM ? 0 : at(p.acc_st, row) + 2 * (lane % 4);
        [[maybe_unused]] uint32_t off[J]; // read only where the rows are staged
#pragma unroll
        for (int k = 0; k < J; k++)
          if constexpr (STAGED) off[k] = acc_stage_at<ROWS>(stage, br, (8 * k + 2 * (lane % 4)) * ES);
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
          float2 y;
          [[maybe_unused]] uint32_t a = 0;
          if constexpr (STAGED) {
            a = off[j % J] + ROWS * 128 * (j / J);
            if constexpr (ES == 2) y = unpack_bf16(ld_shared_u32(a));
            else y = ld_shared_f2(a);
          } else {
            y = x[r][j];
          }
          const float v0 = y.x * ka[r] + o[4 * j + 2 * r] * kb[r], v1 = y.y * ka[r] + o[4 * j + 2 * r + 1] * kb[r];
          if constexpr (SM) {
            if constexpr (ES == 2) st_shared_u32(a, pack_bf16(v0, v1));
            else st_shared_v2(a, __float_as_uint(v0), __float_as_uint(v1));
          } else if constexpr (ES == 2) {
            reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(p.acc_out) + e)[4 * j] = pack_bf16(v0, v1);
          } else {
            reinterpret_cast<float2 *>(static_cast<float *>(p.acc_out) + e)[4 * j] = make_float2(v0, v1);
          }
        }
      };
      if (p.acc_bf16) merge_row(std::integral_constant<int, 2>{});
      else merge_row(std::integral_constant<int, 4>{});
      if (lane % 4 == 0) p.acc_lse[at(p.acc_lse_st, row)] = lnew[r];
    }
  };
  if (tma_m) merge_rows(std::integral_constant<bool, TMA_M>{}); // (tma_m: TMA_M)
  else merge_rows(std::false_type{});
  if (tma_m) {
    fence_proxy_async();              // the writes, visible to the TMA unit (the async proxy)
    named_bar_sync(4 + NWG + c, 128); // the warpgroup's rows all written (ids past the turns')
    if (tid == 0) {
      const int es = p.acc_bf16 ? 2 : 4;
      for (int b = 0; b < DV * es / 128; b++)
        tma_store(&to, stage_ptr + b * (ROWS * 128) + c * (64 * 128), b * 128 / es, hh, first_q + row0, tb);
      bulk_commit();
      bulk_wait_read(); // shared memory stays the CTA's until the stores read it
    }
  }
  if (lane == 0 && warp_id < 8) HP_TRACE(p, 16 + warp_id), HP_TRACE(p, 24 + warp_id, HP_TRACE_GLOBAL);
}

#endif
