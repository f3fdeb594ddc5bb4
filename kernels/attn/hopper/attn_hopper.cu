/*
 * attn_hopper.cu — the launchers of the Hopper forward (fwd_kernel.cuh) and
 * backward (bwd_kernel.cuh): which calls they take, the TMA tensor maps, and
 * the launches. dl_attn_fwd_cuda (attn_fwd.cu) runs the forward where
 * dl_attn_fwd_hopper_fits says so and the device is an sm_90 part;
 * dl_attn_bwd_cuda (attn_bwd.cu) runs the backward's main kernel likewise
 * (dl_attn_bwd_hopper_fits), between its own prep and dQ conversion.
 * DISTLAB_ATTN_HOPPER=0 in the environment keeps the portable kernels (for
 * A/B timings).
 *
 * Built for sm_90a only (premake5.lua's distlab_hopper): wgmma, setmaxnreg
 * and TMA need the arch-specific target.
 *
 * A wait of the kernel that times out (a phase that never completes) sets
 * a host-mapped word instead of trapping; the next call through here
 * reports it as an error, and that call's results are garbage.
 */
#include "attn/attn.h"
#include "common/base.h"
#include "fwd_kernel.cuh"
#include "bwd_kernel.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail_why(char *why, size_t n, const char *msg) {
  if (why && n) snprintf(why, n, "%s", msg);
  return 0;
}
/* why gets ", what" appended where on (the variants a kernel runs with) */
static void add_why(char *why, size_t n, bool on, const char *what) {
  const size_t used = strlen(why);
  if (on && used < n) snprintf(why + used, n - used, ", %s", what);
}

/* Whether the environment's name is value, read once (*cache: -1 until then). */
static int env_is(const char *name, const char *value, int *cache) {
  if (*cache < 0) {
    const char *e = getenv(name);
    *cache = e && !strcmp(e, value);
  }
  return *cache;
}
/* A knob that is on (1), off (0) or unset (-1, any other value too), read once (cache: {-1, -1} until then). */
static int env_on_off(const char *name, int (&cache)[2]) {
  return env_is(name, "1", &cache[0]) ? 1 : env_is(name, "0", &cache[1]) ? 0 : -1;
}
/* DISTLAB_ATTN_HOPPER=0: the portable kernels only (A/B timings) */
static int env_off(void) {
  static int c = -1;
  return env_is("DISTLAB_ATTN_HOPPER", "0", &c);
}
/* At d 64 the backward's warpgroups take turns at the tensor cores (bwd_kernel's TURNS; at d 128 ptxas
 * spills and serialises it); DISTLAB_ATTN_HOPPER_BWD_TURNS=0 keeps them in step (A/B timings) */
static int env_bwd_turns(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_TURNS", "0", &c);
}
/* The backward's in-step loop issues an item's GEMMs in FA4's order (bwd_kernel's BWD_ORDER);
 * DISTLAB_ATTN_HOPPER_BWD_ORDER=0 keeps the earlier order (BWD_STEP; A/B timings) */
static int env_bwd_order(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_ORDER", "0", &c);
}
/* DISTLAB_ATTN_HOPPER_BWD_ELECT=1: the backward's consumers release their barriers with one arrival a
 * warp instead of one a thread (bwd_kernel's ELECT; FA4-GAP.md B2, A/B timings). Built for the default
 * loops only (BWD_ORDER at d 128, BWD_TURNS at d 64); with DISTLAB_ATTN_HOPPER_BWD_ORDER=0 or (d 64)
 * DISTLAB_ATTN_HOPPER_BWD_TURNS=0 it is ignored. */
static int env_bwd_elect(void) {
  static int c = -1;
  return env_is("DISTLAB_ATTN_HOPPER_BWD_ELECT", "1", &c);
}
/* The backward runs its own prep (bwd_prep_kernel: lse log2(e) and D in rows padded per sequence) and its
 * main kernel loads an item's rows of them by cp.async.bulk with Q and dO (bwd_kernel's BULK; FA4-GAP.md
 * B5: +0.1-2.0% backward at d 128; the A/B: experiments/results/attn/hopper-knobs-ab-h200.md). Built for
 * the default loops only (BWD_ORDER at d 128, BWD_TURNS at d 64, each with and without ELECT), where M80
 * and M128 below do not apply; DISTLAB_ATTN_HOPPER_BWD_BULK_LSE=0 turns it off (A/B timings), as do
 * ..._BWD_ORDER=0 or (d 64) ..._BWD_TURNS=0 (dl_attn_bwd_hopper_preps). */
static int env_bwd_bulk_lse(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_BULK_LSE", "0", &c);
}
/* At d 128 the backward's items take 80 query rows instead of 64 (bwd_kernel's BQ = 80, FA4's sm90 choice
 * without a mask; FA4-GAP.md B3: +8.8-11.5% backward), under every mask (2, the default: FA4 keeps 64 with
 * one, but ours runs 3.1-4.7% faster causal with 80; hopper-s9-ab-h200.md). Built for BWD_ORDER with and
 * without ELECT; DISTLAB_ATTN_HOPPER_BWD_M80=1 takes it without a mask only, =0 turns it off (A/B
 * timings), as does ..._BWD_ORDER=0. Its rows are not BULK's (padded to 64 a sequence): where it runs,
 * BULK does not. Returns 0, 1 or 2. */
static int env_bwd_m80(void) {
  static int off = -1, bare = -1;
  return env_is("DISTLAB_ATTN_HOPPER_BWD_M80", "0", &off) ? 0 : env_is("DISTLAB_ATTN_HOPPER_BWD_M80", "1", &bare) ? 1 : 2;
}
/* At d 64 the backward's items take 128 query rows instead of 64 (bwd_kernel's BQ = 128, FA4's sm90
 * choice at d 64; FA4-GAP.md B6: +19.9-21.5% backward, the same A/B), in FA4's order (in place of the
 * turns) with and without ELECT, under every mask; DISTLAB_ATTN_HOPPER_BWD_TURNS and ..._ORDER do not
 * apply to it. DISTLAB_ATTN_HOPPER_BWD_M128=0 turns it off (A/B timings); where it runs, BULK does not. */
static int env_bwd_m128(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_M128", "0", &c);
}
/* The masked schedules' groups of heads (tile_scheduler.cuh: the forward's tiles and, since B10, the
 * backward's key blocks heaviest first over a group whose operands fit in L2), in MB of L2:
 * DISTLAB_ATTN_HOPPER_FWD_GROUP_MB and ..._BWD_GROUP_MB, unset the build's 16 MB, 0 the grid's order (A/B
 * timings: FA4-GAP.md F5, B10), else 1 to 4096; *mb as params_t.group_mb wants it (0, -1 or N). Read once. */
static int env_group_mb(const char *name, int *cache, int *mb) {
  if (*cache == INT_MIN) {
    const char *e = getenv(name);
    char *end = NULL;
    const long v = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && (*end || v < 0 || v > 4096))
      return DL_ERR(DL_EINVAL, "attn (hopper): %s=%s: the masked schedule's group in MB of L2, an integer from 0 "
                               "(the grid's order) to 4096, or unset (16)", name, e);
    *cache = !e || !*e ? 0 : v == 0 ? -1 : (int)v;
  }
  *mb = *cache;
  return 0;
}
static int env_fwd_group_mb(int *mb) {
  static int c = INT_MIN;
  return env_group_mb("DISTLAB_ATTN_HOPPER_FWD_GROUP_MB", &c, mb);
}
static int env_bwd_group_mb(int *mb) {
  static int c = INT_MIN;
  return env_group_mb("DISTLAB_ATTN_HOPPER_BWD_GROUP_MB", &c, mb);
}
/* The backward's tail split (tile_scheduler.cuh: hp_bwd_tile, hp_bwd_split_plan): without a mask on bshd,
 * sbhd and thd of equal, unpadded lengths (bwd_uniform), the key blocks of the last, partial wave go in
 * parts over every SM, their dK and dV added up in split slots in the workspace's lse log2(e) rows, which
 * only BULK's kernels use (as many slots as fit there: the workspace does not grow). Their dK and dV are
 * then sums of fp32 atomics, not bitwise the same run to run (as dQ never is);
 * DISTLAB_ATTN_HOPPER_BWD_SPLIT=0 turns it off (A/B timings: FA4-GAP.md section 16). */
static int env_bwd_split(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_SPLIT", "0", &c);
}
/* Whether the split plan's cost model (every key block the same items) can hold: bshd and sbhd, and thd
 * unpadded with b times the longest length rows (packed equal lengths; the lengths themselves are on the
 * device: shorter ones only make the plan a poorer guess, the split is right for any, emu --split). */
static bool bwd_uniform(const dl_attn_params_t *p) {
  if (!p->cu_seqlens_q) return true;
  return !p->cu_seqlens_q_padded && !p->cu_seqlens_kv_padded && p->total_q == (int64_t)p->b * p->s_q &&
         p->total_kv == (int64_t)p->b * p->s_kv;
}
/* Where M80 or M128 runs, the backward's own prep, bwd_prep_ws_kernel (D and the zeroed accumulator in the
 * portable prep's layout, by 16-byte loads and stores; FA4-GAP.md section 26: backward 1.009-1.021x at d 64,
 * 0.994-1.016x at d 128, s 4k and 8k); DISTLAB_ATTN_HOPPER_BWD_PREP_WS=0 runs attn_bwd.cu's (A/B timings). */
static int env_bwd_prep_ws(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_PREP_WS", "0", &c);
}
/* Which of the backward's item heights runs for p: 80 (M80), 128 (M128) or BWD_BQ */
static int bwd_rows(const dl_attn_params_t *p) {
  const int m80 = env_bwd_m80();
  if (p->d_qk == 128 && p->d_v == 128 && env_bwd_order() &&
      (m80 == 2 || (m80 == 1 && p->window_left < 0 && p->window_right < 0)))
    return 80;
  if (p->d_qk == 64 && p->d_v == 64 && env_bwd_m128()) return 128;
  return BWD_BQ;
}

/* DISTLAB_ATTN_HOPPER_FWD_PIPE=0, 1, 2 or 3: the forward's main loop at d 128 and 64 (fwd_kernel's PIPE; FA4-GAP.md
 * F1, F1b, A/B timings): 0 the steps in turn (d 128 only; env_fwd_opt's ELECT/TREE variants with it alone), 1 FA3's
 * intra-warpgroup pipelining, 2 the same with V's wait placed so that ptxas keeps the softmax under the P V,
 * 3 PIPE 2 with FA4's load order (K(j+1) before V(j)). Unset or other values: -1, each head dim's default
 * (PIPE 2 at d 128 since FA4-GAP B8c, PIPE 1 at d 64). */
static int env_fwd_pipe(void) {
  static int zero = -1, one = -1, two = -1, three = -1;
  return env_is("DISTLAB_ATTN_HOPPER_FWD_PIPE", "0", &zero)    ? 0
         : env_is("DISTLAB_ATTN_HOPPER_FWD_PIPE", "1", &one)   ? 1
         : env_is("DISTLAB_ATTN_HOPPER_FWD_PIPE", "2", &two)   ? 2
         : env_is("DISTLAB_ATTN_HOPPER_FWD_PIPE", "3", &three) ? 3
                                                               : -1;
}

/* DISTLAB_ATTN_HOPPER_FWD_TMA_O: the forward's plain epilogue (no merge) writes O through shared memory (over
 * Q's tile) with TMA stores (fwd_params.cuh's HP_FWD_OPT_TMA_O; FA4-GAP.md F4, F3b). Built for each head dim's
 * default loop and PIPE 2 and 3 at d 128 and 64; MLA's 192/128, DISTLAB_ATTN_HOPPER_FWD_PIPE=1 at d 128 and the
 * merge keep the per-thread stores. 1 on, 0 off; unset: the default loops (fwd_d128_default, fwd_d64_default). -1 where unset. */
static int env_fwd_tma_o(void) {
  static int c[2] = {-1, -1};
  return env_on_off("DISTLAB_ATTN_HOPPER_FWD_TMA_O", c);
}
/* DISTLAB_ATTN_HOPPER_FWD_TREE as the default loops read it: 1 on (PIPE 0's variants read env_fwd_opt), 0 off;
 * unset: the default loops (fwd_d128_default, fwd_d64_default). -1 where unset. */
static int env_fwd_tree(void) {
  static int c[2] = {-1, -1};
  return env_on_off("DISTLAB_ATTN_HOPPER_FWD_TREE", c);
}

/* At d 64 the forward's CTAs take 192 query rows with three consumer warpgroups (fwd_kernel's
 * HP_FWD_OPT_M192, FA4's sm90 tile at d 64; FA4-GAP.md F6: +12-18% forward, hopper-s9-ab-h200.md), with the
 * plain epilogue (..._FWD_TMA_O too) and the fused merge, under every mask; its loop is PIPE 1 (d 64's
 * default), or PIPE 2 with DISTLAB_ATTN_HOPPER_FWD_PIPE=2 (other PIPE values: PIPE 1).
 * DISTLAB_ATTN_HOPPER_FWD_M192=0 turns it off (128-row CTAs; A/B timings). */
static int env_fwd_m192(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_FWD_M192", "0", &c);
}

/* A masked forward's short m-block first (params_t.rag_first, fwd_params.cuh's hp_fwd_row_off): where the
 * query length is not a multiple of the CTA's rows and a window bounds the keys on the right (causal), the
 * blocks are aligned to the sequence's end, so that the short block holds the first rows (the fewest keys)
 * rather than the last (the most: at d 64's 192-row CTAs, 4k causal, 32 key blocks for 64 rows, a twelfth of
 * the forward's key blocks). DISTLAB_ATTN_HOPPER_FWD_RAG=0 turns it off (A/B timings). */
static int env_fwd_rag(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_FWD_RAG", "0", &c);
}

/* The backward's short item first (bwd_params_t.rag_first, bwd_kernel.cuh's hp_bwd_row_off): where a window
 * bounds the keys on the right (causal) and the query length is not a multiple of the item's rows (d 128's 80),
 * the items align to the sequence's end, so that the short one holds the first rows, which only the first key
 * blocks run (4k causal: 883 -> 858 items a kv head). DISTLAB_ATTN_HOPPER_BWD_RAG=0 turns it off (A/B timings). */
static int env_bwd_rag(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_RAG", "0", &c);
}

/* The lazy rescale: the forward's exps keep a row's base until a block raises its max by more than 2^8, and
 * O's rescale is skipped where no row of a warp moved (fwd_kernel's HP_FWD_OPT_LAZY; FA4-GAP.md section 9).
 * Built for each head dim's default loop (PIPE 2 at d 128, PIPE 1 at d 64 and with M192), with or without
 * ..._FWD_TMA_O; not where max_logit is asked for (the base is not the max). Unset: at d 128 (+2.5-4.1%
 * forward, hopper-s9-ab-h200.md); DISTLAB_ATTN_HOPPER_FWD_LAZY=1: at d 64 too (where it was noise
 * with M192 (-0.7 to +1.1%), -2.9 to -5.6% without), =0: nowhere (A/B timings). Returns 0, 1 (d 128) or 2 (both). */
static int env_fwd_lazy(void) {
  static int off = -1, both = -1;
  return env_is("DISTLAB_ATTN_HOPPER_FWD_LAZY", "0", &off) ? 0 : env_is("DISTLAB_ATTN_HOPPER_FWD_LAZY", "1", &both) ? 2 : 1;
}
/* The forward's loop for p: the knob's, else the head dim's default (PIPE 2 at d 128, PIPE 1 at d 64) */
static int fwd_pipe(const dl_attn_params_t *p) { return env_fwd_pipe() >= 0 ? env_fwd_pipe() : p->d_qk == 128 ? 2 : 1; }
/* Whether the forward of p runs with LAZY: the knob, no max_logit, a loop it is built for (the dispatch's) */
static bool fwd_lazy(const dl_attn_params_t *p) {
  const int pipe = fwd_pipe(p);
  const int lazy = env_fwd_lazy();
  return lazy && !p->max_logit && p->d_qk == p->d_v &&
         ((p->d_qk == 128 && pipe == 2) || (lazy == 2 && p->d_qk == 64 && pipe != 2 && pipe != 3));
}

/* d 128's default forward (PIPE 2 with the lazy rescale) takes the four-chain softmax (TREE) and the TMA store
 * of O unless their knobs say 0: together 1.012-1.045x forward at s 4k and 8k, bshd and thd, causal and not, in
 * both rounds on an H200 (experiments/results/attn/hopper-f3b-ab-h200.md; each alone 0.997-1.010x, 1.008-1.031x) */
static bool fwd_d128_default(const dl_attn_params_t *p) { return p->d_qk == 128 && p->d_v == 128 && fwd_pipe(p) == 2 && fwd_lazy(p); }
/* d 64's default forward (192-row CTAs, PIPE 1, no lazy rescale) takes the four-chain softmax, the TMA store of O
 * and the elected arrive (FWD_ELECT) unless their knobs say 0: together 1.003-1.027x forward at s 4k and 8k,
 * bshd and thd, causal and not, in both rounds on an H200 (hopper-b16-ab-h200-d64.md; TREE and the TMA store
 * alone 1.001-1.026x) */
static bool fwd_d64_default(const dl_attn_params_t *p) {
  return p->d_qk == 64 && p->d_v == 64 && env_fwd_m192() && fwd_pipe(p) != 2 && !fwd_lazy(p);
}
/* DISTLAB_ATTN_HOPPER_FWD_ELECT as the default loops read it: 1 on, 0 off, -1 unset (fwd_elect) */
static int env_fwd_elect(void) {
  static int c[2] = {-1, -1};
  return env_on_off("DISTLAB_ATTN_HOPPER_FWD_ELECT", c);
}
/* The forward's A/B variants at d 128 with PIPE 0 (fwd_params.cuh's HP_FWD_OPT_*; experiments/lab/attn/FA4-GAP.md
 * F2, F3): DISTLAB_ATTN_HOPPER_FWD_ELECT=1 releases K/V stages with one arrival a consumer warp,
 * DISTLAB_ATTN_HOPPER_FWD_TREE=1 takes the softmax's row max and sum in four chains a row (both also in the
 * default loops: fwd_tree, fwd_elect) */
static int env_fwd_opt(void) {
  return (env_fwd_elect() == 1 ? HP_FWD_OPT_ELECT : 0) | (env_fwd_tree() == 1 ? HP_FWD_OPT_TREE : 0);
}
/* Whether the forward of p runs the four-chain softmax: each head dim's default loop unless the knob says 0;
 * d 64's 192-row PIPE 2 without the lazy rescale where it says 1 (PIPE 0's variants: env_fwd_opt) */
static bool fwd_tree(const dl_attn_params_t *p) {
  const int t = env_fwd_tree();
  const bool d64 = p->d_qk == 64 && p->d_v == 64 && env_fwd_m192() && !fwd_lazy(p);
  return ((fwd_d128_default(p) || fwd_d64_default(p)) && t != 0) || (d64 && t == 1);
}
/* Whether the forward of p frees K and V stages with one arrival a consumer warp (HP_FWD_OPT_ELECT; FA4's
 * elected arrive) in a default loop: d 64's unless DISTLAB_ATTN_HOPPER_FWD_ELECT=0; d 128's (with TREE) where
 * it says 1 (0.984-0.996x there, hopper-b16-ab-h200.md; PIPE 0's variants: env_fwd_opt) */
static bool fwd_elect(const dl_attn_params_t *p) {
  const int e = env_fwd_elect();
  return (fwd_d64_default(p) && e != 0) || (fwd_d128_default(p) && fwd_tree(p) && e == 1);
}
static bool fwd_tma_o(const dl_attn_params_t *p) {
  const int t = env_fwd_tma_o();
  return (t == 1 || (t < 0 && (fwd_d128_default(p) || fwd_d64_default(p)))) && !p->acc_out && p->out &&
         p->d_qk == p->d_v && p->d_qk <= 128 && !(p->d_qk == 128 && env_fwd_pipe() == 1);
}

/* The fused merge's running rows in by TMA boxes and the merged rows back by TMA stores (HP_FWD_OPT_TMA_M;
 * FA4-GAP.md section 15), in each head dim's default loop: the default for a bf16 running out (CP's; its merge
 * at 4k causal +2.9-4.1% against +5.1-6.0% without, experiments/results/attn/attn-merge-tmam-h200.md), not for
 * fp32 (no faster: its TMA stores cost more cycles than each thread's 8-byte stores).
 * DISTLAB_ATTN_HOPPER_FWD_TMA_M=1 takes it for both, =0 for neither. */
static int env_fwd_tma_m(void) {
  static int c[2] = {-1, -1};
  return env_on_off("DISTLAB_ATTN_HOPPER_FWD_TMA_M", c);
}
static bool fwd_tma_m(const dl_attn_params_t *p) {
  const int t = env_fwd_tma_m();
  if (!p->acc_out || !(t == 1 || (t < 0 && p->acc_dtype == DL_BF16))) return false;
  /* TMA: 16-byte aligned base and strides (the kernel's own test, params_t.acc_vec) */
  const int64_t st[3] = {p->acc_out_st.s, p->acc_out_st.h, p->acc_out_st.b};
  const bool aligned = hp_acc_vec(p->acc_out, st, p->acc_dtype == DL_BF16 ? 2 : 4) == 16;
  return aligned && fwd_tree(p) &&
         ((fwd_d128_default(p) && !fwd_elect(p)) || (fwd_d64_default(p) && fwd_elect(p))); /* launch's kernels */
}

/* The forward at MLA's head dims 192/128 (launch<0, 192, 128> below); DISTLAB_ATTN_HOPPER_MLA=0 sends
 * them to the portable kernel */
static int env_mla(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_MLA", "0", &c);
}

/* What both directions need: the kernels on, bf16, head dims 64/64 or 128/128 (the forward: 192/128
 * unless DISTLAB_ATTN_HOPPER_MLA=0), GQA groups, k and v with rows (no tensor map of no rows). 1, or 0 with why. */
static int common_fit(const dl_attn_params_t *p, bool fwd, char *why, size_t n) {
  if (env_off()) return fail_why(why, n, "DISTLAB_ATTN_HOPPER=0");
  if (p->dtype != DL_BF16) return fail_why(why, n, "dtype is not bf16");
  const bool mla = p->d_qk == 192 && p->d_v == 128;
  if (mla && !fwd) return fail_why(why, n, "head dims 192/128 (MLA): no Hopper backward for them");
  if (mla && !env_mla())
    return fail_why(why, n, "head dims 192/128 (MLA): DISTLAB_ATTN_HOPPER_MLA=0");
  if (!mla && !((p->d_qk == 64 && p->d_v == 64) || (p->d_qk == 128 && p->d_v == 128)))
    return fail_why(why, n, "head dims are not 64/64, 128/128 or 192/128");
  if (p->h_kv <= 0 || p->h_q % p->h_kv) return fail_why(why, n, "h_q is not a multiple of h_kv");
  if ((p->cu_seqlens_q ? p->total_kv : p->s_kv) == 0)
    return fail_why(why, n, "k and v have no rows (the portable kernels handle it)");
  return 1;
}

extern "C" int dl_attn_fwd_hopper_fits(const dl_attn_params_t *p, char *why, size_t n) {
  if (!common_fit(p, true, why, n)) return 0;
  if (p->acc_out && p->acc_dtype != DL_F32 && p->acc_dtype != DL_BF16)
    return fail_why(why, n, "accumulate.out is neither f32 nor bf16");
  /* TMA: 16-byte aligned bases and strides (dl_attn_validate's cuda rules give that for q, k, v,
   * out and acc_out); acc_out is read and written two elements at a time */
  if (p->acc_out && ((p->acc_out_st.s | p->acc_out_st.h | p->acc_out_st.b) & 1))
    return fail_why(why, n, "accumulate.out has an odd stride");
  if (why && n) {
    if (p->d_qk == 64 && env_fwd_m192()) snprintf(why, n, "hopper forward (wgmma, TMA; bf16, d 64), 192 query rows a CTA");
    else if (p->d_qk == p->d_v) snprintf(why, n, "hopper forward (wgmma, TMA; bf16, d %d)", p->d_qk);
    else snprintf(why, n, "hopper forward (wgmma, TMA; bf16, d %d/%d)", p->d_qk, p->d_v);
    add_why(why, n, fwd_lazy(p), "lazy rescale");
    add_why(why, n, fwd_tree(p), "row max and sum in four chains");
    add_why(why, n, fwd_tma_o(p), "O by TMA store");
    add_why(why, n, fwd_elect(p), "stages freed by one arrival a warp");
    add_why(why, n, fwd_tma_m(p), "running rows in and out by TMA");
  }
  return 1;
}

/* The device of the call is an sm_90 part (cached per device). */
static int on_hopper(int *yes) {
  static int known[64], is90[64];
  int dev;
  DL_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return *yes = 0, 0;
  if (!known[dev]) {
    int major = 0, minor = 0;
    DL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    is90[dev] = major == 9 && minor == 0, known[dev] = 1;
  }
  *yes = is90[dev];
  return 0;
}

extern "C" int dl_attn_fwd_hopper_usable(const dl_attn_params_t *p, int *yes) {
  *yes = 0;
  if (!dl_attn_fwd_hopper_fits(p, NULL, 0)) return 0;
  return on_hopper(yes);
}

extern "C" int dl_attn_bwd_hopper_fits(const dl_attn_params_t *p, char *why, size_t n) {
  if (!common_fit(p, false, why, n)) return 0;
  if ((p->cu_seqlens_q ? p->total_q : p->s_q) == 0) return fail_why(why, n, "q has no rows");
  if (why && n) snprintf(why, n, "hopper backward (wgmma, TMA; bf16, d %d; %d query rows an item)", p->d_qk, bwd_rows(p));
  return 1;
}

extern "C" int dl_attn_bwd_hopper_usable(const dl_attn_params_t *p, int *yes) {
  *yes = 0;
  if (!dl_attn_bwd_hopper_fits(p, NULL, 0)) return 0;
  return on_hopper(yes);
}

/* BULK's prep (BWD_BQ), or bwd_prep_ws_kernel (M80, M128) */
static bool bwd_bulk(const dl_attn_params_t *p) {
  return env_bwd_bulk_lse() && bwd_rows(p) == BWD_BQ && (p->d_qk == 64 ? env_bwd_turns() : env_bwd_order());
}
extern "C" int dl_attn_bwd_hopper_preps(const dl_attn_params_t *p) {
  return bwd_bulk(p) || (bwd_rows(p) != BWD_BQ && env_bwd_prep_ws());
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn(void) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn;
  if (!fn) {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
  }
  return fn;
}

/* A [b][s][h][d] bf16 operand (strides st; thd: rows packed, batch extent 1) as a 4-d tensor map
 * (d, h, s, b) with boxes of 64 columns x box_rows rows and the 128-byte swizzle. */
static int tensor_map(CUtensorMap *m, const void *base, const dl_attn_strides_t &st, int d, int heads, int64_t rows,
                      int batches, const char *what, int box_rows = BM, int es = 2) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = encode_fn();
  if (!enc) return DL_ERR(DL_ECUDA, "attn (hopper): cuTensorMapEncodeTiled not found in the driver");
  const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)heads, (cuuint64_t)rows, (cuuint64_t)batches};
  /* es bytes an element (bf16, or fp32: the merge's running out); boxes of 128 bytes x box_rows rows */
  const cuuint64_t strides[3] = {(cuuint64_t)st.h * es, (cuuint64_t)st.s * es,
                                 (cuuint64_t)(batches > 1 ? st.b : st.s * rows) * es};
  const cuuint32_t box[4] = {(cuuint32_t)(128 / es), 1, (cuuint32_t)box_rows, 1}, elem[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dt = es == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  CUresult r = enc(m, dt, 4, const_cast<void *>(base), dims, strides, box, elem,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return DL_ERR(DL_ECUDA, "attn (hopper): the tensor map of %s failed (CUresult %d; rows %lld, strides %lld/%lld/%lld)",
                  what, (int)r, (long long)rows, (long long)st.s, (long long)st.h, (long long)st.b);
  return 0;
}

/* The host-mapped word the kernel's timed-out waits set (portable: every device of the process maps it),
 * and its device address (*dev). */
static int *status_word(int **dev) {
  static int *word, *dword;
  if (!word) {
    void *h = NULL, *d = NULL;
    if (cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess ||
        cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      if (h) cudaFreeHost(h);
      return NULL;
    }
    memset(h, 0, sizeof(int));
    word = (int *)h, dword = (int *)d;
  }
  *dev = dword;
  return word;
}

/* The current device's multiprocessors, asked of the runtime once per device (every backward call plans its
 * tail split with them). */
static int device_sms(int *sms) {
  static int known[64];
  int dev = 0;
  DL_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && known[dev]) return *sms = known[dev], 0;
  DL_CUDA_CHECK(cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < 64) known[dev] = *sms;
  return 0;
}

/* The masked backward's group of kv heads in MB of L2 for p (bwd_params_t.group_mb, from the knob's mb). Its key
 * blocks go heaviest first over the group (tile_scheduler.cuh, B10), which balances the SMs only if the group
 * holds about a wave of them: with fewer, each group's heaviest blocks start behind the last group's light ones.
 * Under GQA a kv head's operands are its query heads' (4:1: four times MHA's), so at 4k the build's 16 MB held
 * one kv head, 32 key blocks on 132 SMs, and the causal backward ran at 0.80x FA4's. Unless the knob sets the
 * size, a group holds its L2 budget's kv heads or round(SMs / key blocks) of them, whichever is more: about a
 * wave of key blocks a group (tile_scheduler.cuh's hp_bwd_group_mb; a ceiling instead made 5 + 3 of GQA 4k's 8
 * kv heads and 3 + 3 + 2 of 8k's, and lost most of the gain). MHA's groups at d 64 and 128 stay the L2
 * budget's at every s 4k-32k; GQA 4:1's at 4k and 8k become 4 and 2 kv heads (causal backward +24% and +9% with
 * those sizes set by the knob; experiments/results/attn/hopper-gqa-ab-h200.md). */
static int bwd_group_mb(const dl_attn_params_t *p, int mb, int *out) {
  *out = mb;
  if (mb != 0 || (p->window_left < 0 && p->window_right < 0)) return 0; /* the knob's, or no masked schedule */
  int sms = 0;
  DL_TRY(device_sms(&sms));
  const int64_t head = hp_bwd_head_bytes(p->h_q / p->h_kv, p->s_q, p->d_qk, p->d_v);
  *out = hp_bwd_group_mb((p->s_kv + BN - 1) / BN, (int64_t)p->h_kv * p->b, head, sms, mb);
  return 0;
}

/* PDL in the backward (launch_bwd, launch_dq): the main kernel and the dQ conversion are launched with
 * programmatic stream serialization after the kernel before them (the prep, the main kernel), so that each
 * starts under the tail of the one before and waits (dl_pdl_wait) only where it reads that one's output (FA4's
 * sm90 backward launches its main kernel so). DISTLAB_ATTN_HOPPER_BWD_PDL=0 launches them plainly (A/B
 * timings: FA4-GAP.md section 29). */
static int env_bwd_pdl(void) {
  static int c = -1;
  return !env_is("DISTLAB_ATTN_HOPPER_BWD_PDL", "0", &c);
}

/* HP_PREFETCH (params_t.next_ctas): each CTA's TMA thread, once its last loads are issued, prefetches into L2
 * the first inputs of CTA lin + (the SMs), the one that starts about when it ends (one CTA an SM): the
 * forward's Q tile and first K and V blocks, the backward's K and V. DISTLAB_ATTN_HOPPER_PREFETCH=0 turns
 * it off (A/B timings: FA4-GAP.md section 29). */
static int next_ctas(int *n) {
  static int c = -1;
  *n = 0;
  if (env_is("DISTLAB_ATTN_HOPPER_PREFETCH", "0", &c)) return 0;
  return device_sms(n);
}

/* kernel's dynamic shared memory limit raised to smem, once per device (done: the kernel's own flags). */
template <class K> static int allow_smem(K *kernel, size_t smem, int (&done)[64]) {
  int dev = 0;
  DL_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && done[dev]) return 0;
  DL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  if (dev >= 0 && dev < 64) done[dev] = 1;
  return 0;
}

/* to: O's tensor map (boxes of 64 rows) where OPT has HP_FWD_OPT_TMA_O, else any map (unread). */
template <int PIPE, int DQK, int DV, int OPT = HP_FWD_OPT>
static int launch(dim3 grid, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv, const params_t &k,
                  const CUtensorMap &to, void *stream) {
  static int done[64]; // the limit raised once, to what a merge needs (its running rows staged)
  DL_TRY(allow_smem(fwd_kernel<PIPE, DQK, DV, OPT>, fwd_smem_bytes<DQK, DV, fwd_rows(OPT)>(true), done));
  fwd_kernel<PIPE, DQK, DV, OPT><<<grid, fwd_threads(OPT), fwd_smem_bytes<DQK, DV, fwd_rows(OPT)>(k.acc_out != nullptr),
                                   (cudaStream_t)stream>>>(tq, tk, tv, k, to);
  return 0;
}
/* launch's loop PIPE with the TMA store of O (HP_FWD_OPT_TMA_O) where tma, else with OPT (the default's) */
template <int PIPE, int DQK, int DV, int OPT = HP_FWD_OPT>
static int launch_o(bool tma, dim3 grid, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                    const params_t &k, const CUtensorMap &to, void *stream) {
  return tma ? launch<PIPE, DQK, DV, OPT | HP_FWD_OPT_TMA_O>(grid, tq, tk, tv, k, to, stream)
             : launch<PIPE, DQK, DV, OPT>(grid, tq, tk, tv, k, to, stream);
}

/* launch_o's, or with the running rows by TMA (HP_FWD_OPT_TMA_M) where tma_m (a merge: no TMA store of O) */
template <int PIPE, int DQK, int DV, int OPT = HP_FWD_OPT>
static int launch_m(bool tma_m, bool tma, dim3 grid, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                    const params_t &k, const CUtensorMap &to, void *stream) {
  return tma_m ? launch<PIPE, DQK, DV, OPT | HP_FWD_OPT_TMA_M>(grid, tq, tk, tv, k, to, stream)
               : launch_o<PIPE, DQK, DV, OPT>(tma, grid, tq, tk, tv, k, to, stream);
}

static void copy_st(int64_t (&dst)[3], const dl_attn_strides_t &st) { dst[0] = st.s, dst[1] = st.h, dst[2] = st.b; }

/* The fields params_t and bwd_params_t share: sizes, the mask, the scale in log2 units, thd's offsets. */
template <class K> static void common_params(K &k, const dl_attn_params_t *p) {
  k.b = p->b, k.h = p->h_q, k.h_kv = p->h_kv, k.s_q = p->s_q, k.s_kv = p->s_kv;
  k.window_left = p->window_left, k.window_right = p->window_right, k.bottom_right = p->bottom_right;
  k.scale_log2 = p->scale * 1.4426950408889634f;
  if (p->cu_seqlens_q) {
    k.cu_q = p->cu_seqlens_q, k.cu_kv = p->cu_seqlens_kv;
    k.pad_q = p->cu_seqlens_q_padded, k.pad_kv = p->cu_seqlens_kv_padded;
  }
}

/* The status word, checked and cleared: an earlier call's timed-out wait is this call's error. */
static int status_check(int **dword, const char *op) {
  int *word = status_word(dword);
  if (!word) return DL_ERR(DL_ENOMEM, "%s (hopper): no host-mapped status word", op);
  if (__atomic_exchange_n(word, 0, __ATOMIC_ACQ_REL))
    return DL_ERR(DL_ETIMEOUT, "%s (hopper): a wait of an earlier call's kernel (forward or backward) timed out "
                               "(a TMA load or a barrier never completed); that call's results are garbage", op);
  return 0;
}

extern "C" int dl_attn_fwd_hopper_cuda(const dl_attn_params_t *p, void *stream) {
  int *dword = NULL;
  DL_TRY(status_check(&dword, "attn fwd"));
  const bool thd = p->cu_seqlens_q != NULL;
  CUtensorMap tq, tk, tv;
  const int64_t rq = thd ? p->total_q : p->s_q, rkv = thd ? p->total_kv : p->s_kv;
  const int bt = thd ? 1 : p->b;
  if (rq == 0) return 0; /* nothing to write (no keys: dl_attn_fwd_hopper_fits sent it elsewhere) */
  /* F6's 192-row CTAs at d 64 (env_fwd_m192): Q's boxes of 192 rows (TMA's limit 256), the grid by 192 */
  const bool m192 = p->d_qk == 64 && p->d_v == 64 && env_fwd_m192();
  const int rows = m192 ? fwd_rows(HP_FWD_OPT_M192) : BM;
  DL_TRY(tensor_map(&tq, p->q, p->q_st, p->d_qk, p->h_q, rq, bt, "q", rows));
  DL_TRY(tensor_map(&tk, p->k, p->k_st, p->d_qk, p->h_kv, rkv, bt, "k"));
  DL_TRY(tensor_map(&tv, p->v, p->v_st, p->d_v, p->h_kv, rkv, bt, "v"));
  params_t k = {};
  common_params(k, p);
  DL_TRY(env_fwd_group_mb(&k.group_mb));
  k.o = (uint16_t *)p->out, k.lse = p->lse;
  if (p->out) copy_st(k.o_st, p->out_st);
  if (p->lse) copy_st(k.lse_st, p->lse_st);
  if (p->acc_out) {
    k.acc_out = p->acc_out, k.acc_lse = p->acc_lse, k.acc_bf16 = p->acc_dtype == DL_BF16;
    copy_st(k.acc_st, p->acc_out_st), copy_st(k.acc_lse_st, p->acc_lse_st);
    k.acc_vec = hp_acc_vec(k.acc_out, k.acc_st, k.acc_bf16 ? 2 : 4);
  }
  k.max_logit = p->max_logit;
  k.err = dword;
  DL_TRY(next_ctas(&k.next_ctas));
  k.rag_first = env_fwd_rag();
  /* F4's TMA store of O: the plain epilogue only, d 128 and 64 (launch_o below) */
  const bool tma_o = fwd_tma_o(p);
  CUtensorMap to = tq; /* unread by a kernel without the TMA store (or with the merge) */
  if ((tma_o || (HP_FWD_OPT & HP_FWD_OPT_TMA_O)) && !p->acc_out && p->out) /* the knob, or the build flag */
    DL_TRY(tensor_map(&to, p->out, p->out_st, p->d_v, p->h_q, rq, bt, "out", 64));
  /* the merge's running rows by TMA: `to` is the running out's map (fp32 or bf16 boxes of 128 bytes x 64 rows) */
  const bool tma_m = fwd_tma_m(p);
  if (tma_m)
    DL_TRY(tensor_map(&to, p->acc_out, p->acc_out_st, p->d_v, p->h_q, rq, bt, "accumulate.out", 64, k.acc_bf16 ? 2 : 4));
  static_assert(BM == 128 && fwd_rows(HP_FWD_OPT_M192) >= BM, "dl_attn_fwd_cuda checks the grid for 128-row blocks");
  const dim3 grid((p->s_q + rows - 1) / rows, p->h_q, p->b);
  // the faster loop of each head dim on an H200 (experiments/results/attn/hopper-s9-ab-h200.md,
  // history/hopper-f5-ab-h200.md): PIPE 2 at d 128 (1.3-2.7% ahead of PIPE 0 since B8c) with the lazy rescale (and
  // F3b's four-chain softmax and TMA store of O: fwd_tree, fwd_tma_o), FA3's
  // intra-warpgroup pipelining at d 64 in 192-row CTAs (PIPE 2 1-3% behind there; with the four-chain softmax,
  // the TMA store and the elected arrive: fwd_d64_default), the steps in turn at
  // MLA's 192/128 (not yet timed); PIPE 0 at d 128 with the A/B variants the build or the environment asks for
  constexpr int E = HP_FWD_OPT_ELECT, T = HP_FWD_OPT_TREE, O = HP_FWD_OPT;
  const int opt = O | env_fwd_opt(), pipe = fwd_pipe(p);
  constexpr int M = HP_FWD_OPT | HP_FWD_OPT_M192, L = HP_FWD_OPT_LAZY;
  const bool lazy = fwd_lazy(p);
  const bool tree = fwd_tree(p), elect = fwd_elect(p); /* F3b, F2b: in the default loops too */
  const int rc = m192             ? (pipe == 2 && tree ? launch_o<2, 64, 64, M | T>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : pipe == 2 ? launch_o<2, 64, 64, M>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : lazy    ? launch_o<1, 64, 64, M | L>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : tree && elect ? launch_m<1, 64, 64, M | T | E>(tma_m, tma_o, grid, tq, tk, tv, k, to, stream)
                                     : tree    ? launch_o<1, 64, 64, M | T>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : elect   ? launch_o<1, 64, 64, M | E>(tma_o, grid, tq, tk, tv, k, to, stream)
                                               : launch_o<1, 64, 64, M>(tma_o, grid, tq, tk, tv, k, to, stream))
                 : p->d_qk == 64  ? (pipe == 2   ? launch_o<2, 64, 64>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : pipe == 3 ? launch_o<3, 64, 64>(tma_o, grid, tq, tk, tv, k, to, stream)
                                     : lazy      ? launch_o<1, 64, 64, O | L>(tma_o, grid, tq, tk, tv, k, to, stream)
                                                 : launch_o<1, 64, 64>(tma_o, grid, tq, tk, tv, k, to, stream))
                 : p->d_qk != 128 ? launch<0, 192, 128>(grid, tq, tk, tv, k, to, stream)
                 : pipe == 1      ? launch<1, 128, 128>(grid, tq, tk, tv, k, to, stream)
                 : pipe == 2 && lazy && tree && elect ? launch_o<2, 128, 128, O | L | T | E>(tma_o, grid, tq, tk, tv, k, to, stream)
                 : pipe == 2 && lazy && tree ? launch_m<2, 128, 128, O | L | T>(tma_m, tma_o, grid, tq, tk, tv, k, to, stream)
                 : pipe == 2 && lazy ? launch_o<2, 128, 128, O | L>(tma_o, grid, tq, tk, tv, k, to, stream)
                 : pipe == 2      ? launch_o<2, 128, 128>(tma_o, grid, tq, tk, tv, k, to, stream)
                 : pipe == 3      ? launch_o<3, 128, 128>(tma_o, grid, tq, tk, tv, k, to, stream)
                 : tma_o          ? launch<0, 128, 128, O | HP_FWD_OPT_TMA_O>(grid, tq, tk, tv, k, to, stream)
                 : opt == (E | T) ? launch<0, 128, 128, E | T>(grid, tq, tk, tv, k, to, stream)
                 : opt == (O | E) ? launch<0, 128, 128, O | E>(grid, tq, tk, tv, k, to, stream)
                 : opt == (O | T) ? launch<0, 128, 128, O | T>(grid, tq, tk, tv, k, to, stream)
                                  : launch<0, 128, 128>(grid, tq, tk, tv, k, to, stream);
  if (rc) return rc;
  DL_CUDA_CHECK_LAUNCH("attn fwd (hopper)");
  return 0;
}

template <int DQK, int DV, int LOOP, bool ELECT = false, bool BULK = false, int BQ = BWD_BQ, bool RAG = false>
static int launch_bwd(dim3 grid, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
                      const CUtensorMap &tdo, const bwd_params_t &k, void *stream) {
  const size_t smem = sizeof(bwd_smem_t<DQK, DV, BQ>) + 1024;
  static_assert(sizeof(bwd_smem_t<DQK, DV, BQ>) + 1024 <= 227 * 1024, "the backward's shared memory");
  static int done[64];
  DL_TRY(allow_smem(bwd_kernel<DQK, DV, LOOP, ELECT, BULK, BQ, RAG>, smem, done));
  DL_CUDA_CHECK(dl_pdl_launch(bwd_kernel<DQK, DV, LOOP, ELECT, BULK, BQ, RAG>, grid, THREADS, smem, (cudaStream_t)stream,
                              env_bwd_pdl(), tq, tk, tv, tdo, k));
  return 0;
}
/* bwd_dq_kernel<DQK, BQ> after the main kernel, by PDL as launch_bwd */
template <int DQK, int BQ = BWD_BQ> static int launch_dq(dim3 grid, const bwd_params_t &k, void *stream) {
  DL_CUDA_CHECK(dl_pdl_launch(bwd_dq_kernel<DQK, BQ>, grid, 128, 0, (cudaStream_t)stream, env_bwd_pdl(), k));
  return 0;
}

#if HP_BWD_TRACE
/* The lab's sums of the backward's steps (bwd_kernel.cuh's HP_BWD_TRACE): with
 * DISTLAB_ATTN_HOPPER_BWD_TRACE=FILE each backward call's, after the call, into FILE (overwritten: the last
 * call's), headed by the grid's CTAs, BQ and HP_BT_WORDS (int32 each), then [2][HP_BT_WORDS] uint64 */
static int bwd_trace_buf(unsigned long long **buf) {
  static unsigned long long *d = NULL;
  if (!d && getenv("DISTLAB_ATTN_HOPPER_BWD_TRACE"))
    DL_CUDA_CHECK(cudaMalloc(&d, sizeof(unsigned long long) * 2 * HP_BT_WORDS));
  *buf = d;
  return 0;
}
static int bwd_trace_write(unsigned long long *d, int ctas, int bq, void *stream) {
  unsigned long long h[2 * HP_BT_WORDS];
  DL_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
  DL_CUDA_CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  const char *name = getenv("DISTLAB_ATTN_HOPPER_BWD_TRACE");
  FILE *f = fopen(name, "wb");
  const int head[3] = {ctas, bq, HP_BT_WORDS};
  const bool ok = f && fwrite(head, sizeof head, 1, f) == 1 && fwrite(h, sizeof h, 1, f) == 1;
  if (f) fclose(f);
  return ok ? 0 : DL_ERR(DL_EIO, "attn bwd trace: cannot write %s", name);
}
#endif

extern "C" int dl_attn_bwd_hopper_cuda(const dl_attn_params_t *p, float *dq_acc, float *delta, void *stream) {
  /* after dl_attn_bwd_cuda's prep (or, with dl_attn_bwd_hopper_preps, this one's own): the main
   * kernel, then bwd_dq_kernel */
  int *dword = NULL;
  DL_TRY(status_check(&dword, "attn bwd"));
  const bool thd = p->cu_seqlens_q != NULL;
  CUtensorMap tq, tk, tv, tdo;
  const int64_t rq = thd ? p->total_q : p->s_q, rkv = thd ? p->total_kv : p->s_kv;
  const int bt = thd ? 1 : p->b;
  const bool turns = p->d_qk == 64 && env_bwd_turns(), order = env_bwd_order(), elect = env_bwd_elect();
  const bool bulk = bwd_bulk(p);
  /* B3's 80 query rows an item (d 128 without a mask; warp 9's lse2 and D), B6's 128 (d 64; warps 9 and
   * 11's): FA4's order; neither with BULK */
  const int bq = bwd_rows(p);
  const bool m80 = bq == 80, m128 = bq == 128;
  DL_TRY(tensor_map(&tq, p->q, p->q_st, p->d_qk, p->h_q, rq, bt, "q", bq));
  DL_TRY(tensor_map(&tdo, p->dout, p->dout_st, p->d_v, p->h_q, rq, bt, "dout", bq));
  DL_TRY(tensor_map(&tk, p->k, p->k_st, p->d_qk, p->h_kv, rkv, bt, "k", BN));
  DL_TRY(tensor_map(&tv, p->v, p->v_st, p->d_v, p->h_kv, rkv, bt, "v", BN));
  bwd_params_t k = {};
  common_params(k, p);
  DL_TRY(env_bwd_group_mb(&k.group_mb));
  DL_TRY(bwd_group_mb(p, k.group_mb, &k.group_mb));
  k.scale = p->scale, k.lse = p->lse;
  copy_st(k.lse_st, p->lse_st);
  k.dq = (uint16_t *)p->dq, k.dk = (uint16_t *)p->dk, k.dv = (uint16_t *)p->dv;
  copy_st(k.dq_st, p->dq_st), copy_st(k.dk_st, p->dk_st), copy_st(k.dv_st, p->dv_st);
  k.accumulate = p->accumulate_grads;
  k.dq_acc = dq_acc;
  k.ws_rows = thd ? p->total_q : (int64_t)p->b * p->s_q; /* attn_bwd.cu's workspace rows */
  k.err = dword;
  /* the short item first (hp_bwd_row_off) by its own kernels (bwd_kernel's RAG): the default loops' item rows
   * (M80, M128; not with ELECT), a window bounding the keys on the right, and an offset that is not 0 (bshd's
   * and sbhd's lengths are s_q; thd's are on the device, so any) */
  k.rag_first = (m80 || m128) && !elect && env_bwd_rag() && p->window_right >= 0 && (thd || (bq - p->s_q % bq) % bq / 8 > 0);
  DL_TRY(next_ctas(&k.next_ctas));
  const dim3 grid((p->s_kv + BN - 1) / BN, p->h_kv, p->b);
  /* the tail split: the plan for this GPU's SMs (a tail of at most a quarter of them; a part's own cost
   * taken as 2 items; at least 1% saved); its memset before the prep, so that the main kernel follows the prep
   * directly (PDL: launch_bwd) */
  dim3 grid_run = grid;
  const int64_t lse_rows = dl_attn_bwd_lse_rows(p);
  const size_t slot_bytes = ((size_t)BN * (p->d_qk + p->d_v) + 1) * sizeof(float);
  const int64_t slots = (int64_t)((size_t)lse_rows * p->h_q * sizeof(float) / slot_bytes); /* in the lse2 rows */
  if (bwd_uniform(p) && p->window_left < 0 && p->window_right < 0 && slots > 0 && env_bwd_split() && p->s_q > 0 &&
      bq != BWD_BQ) { /* bwd_kernel's SPLIT (not BULK's kernels: they read the lse2 rows) */
    int sms = 0, first = 0;
    DL_TRY(device_sms(&sms));
    const int64_t nblocks = (int64_t)grid.x * grid.y * grid.z;
    const int items = (p->h_q / p->h_kv) * ((p->s_q + bq - 1) / bq);
    const int parts = hp_bwd_split_plan(nblocks, items, sms, (int)(slots < 1024 ? slots : 1024), 0.25, 2.0, 0.01, &first);
    if (parts > 1) {
      const int64_t split = nblocks - first;
      k.split_first = first, k.split_parts = parts;
      k.split_acc = delta + (size_t)lse_rows * p->h_q; /* the lse2 rows (256-aligned: lse_rows is of 64) */
      k.split_count = (int *)(k.split_acc + split * BN * (p->d_qk + p->d_v));
      DL_CUDA_CHECK(cudaMemsetAsync(k.split_acc, 0, (size_t)split * (BN * (p->d_qk + p->d_v) + 1) * sizeof(float), (cudaStream_t)stream));
      grid_run = dim3((unsigned)(first + split * parts), 1, 1);
    }
  }
#if HP_BWD_TRACE
  DL_TRY(bwd_trace_buf(&k.trace));
  if (k.trace)
    DL_CUDA_CHECK(cudaMemsetAsync(k.trace, 0, sizeof(unsigned long long) * 2 * HP_BT_WORDS, (cudaStream_t)stream));
#endif
  if (bulk) { /* the prep into bwd_lse_row's rows: D where delta points, lse log2(e) after it */
    k.lse_rows = dl_attn_bwd_lse_rows(p);
    float *lse2 = delta + (size_t)k.lse_rows * p->h_q;
    k.o = (const uint16_t *)p->out, k.dout = (const uint16_t *)p->dout, k.lse2 = lse2;
    copy_st(k.o_st, p->out_st), copy_st(k.do_st, p->dout_st);
    const dim3 pgrid((p->s_q + BWD_BQ - 1) / BWD_BQ, p->h_q, p->b);
    if (p->s_q > 0) {
      if (p->d_qk == 64) bwd_prep_kernel<64, 64><<<pgrid, 128, 0, (cudaStream_t)stream>>>(k, delta, lse2);
      else bwd_prep_kernel<128, 128><<<pgrid, 128, 0, (cudaStream_t)stream>>>(k, delta, lse2);
      DL_CUDA_CHECK_LAUNCH("attn bwd (hopper) prep");
    }
  }
  k.delta = delta;
  if (bq != BWD_BQ && env_bwd_prep_ws() && p->s_q > 0) {
    k.o = (const uint16_t *)p->out, k.dout = (const uint16_t *)p->dout;
    copy_st(k.o_st, p->out_st), copy_st(k.do_st, p->dout_st);
    const dim3 pgrid((p->s_q + 63) / 64, p->h_q, p->b);
    if (p->d_qk == 64) bwd_prep_ws_kernel<64, 64><<<pgrid, 256, 0, (cudaStream_t)stream>>>(k, delta);
    else bwd_prep_ws_kernel<128, 128><<<pgrid, 256, 0, (cudaStream_t)stream>>>(k, delta);
    DL_CUDA_CHECK_LAUNCH("attn bwd (hopper) prep");
  }
  int rc;
  if (m128)
    rc = elect        ? launch_bwd<64, 64, BWD_ORDER, true, false, 128>(grid_run, tq, tk, tv, tdo, k, stream)
         : k.rag_first ? launch_bwd<64, 64, BWD_ORDER, false, false, 128, true>(grid_run, tq, tk, tv, tdo, k, stream)
                       : launch_bwd<64, 64, BWD_ORDER, false, false, 128>(grid_run, tq, tk, tv, tdo, k, stream);
  else if (p->d_qk == 64)
    rc = turns && bulk && elect ? launch_bwd<64, 64, BWD_TURNS, true, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : turns && bulk        ? launch_bwd<64, 64, BWD_TURNS, false, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : turns && elect       ? launch_bwd<64, 64, BWD_TURNS, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : turns                ? launch_bwd<64, 64, BWD_TURNS>(grid_run, tq, tk, tv, tdo, k, stream)
         : order                ? launch_bwd<64, 64, BWD_ORDER>(grid_run, tq, tk, tv, tdo, k, stream)
                                : launch_bwd<64, 64, BWD_STEP>(grid_run, tq, tk, tv, tdo, k, stream);
  else if (m80)
    rc = elect        ? launch_bwd<128, 128, BWD_ORDER, true, false, 80>(grid_run, tq, tk, tv, tdo, k, stream)
         : k.rag_first ? launch_bwd<128, 128, BWD_ORDER, false, false, 80, true>(grid_run, tq, tk, tv, tdo, k, stream)
                       : launch_bwd<128, 128, BWD_ORDER, false, false, 80>(grid_run, tq, tk, tv, tdo, k, stream);
  else
    rc = order && bulk && elect ? launch_bwd<128, 128, BWD_ORDER, true, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : order && bulk        ? launch_bwd<128, 128, BWD_ORDER, false, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : order && elect       ? launch_bwd<128, 128, BWD_ORDER, true>(grid_run, tq, tk, tv, tdo, k, stream)
         : order                ? launch_bwd<128, 128, BWD_ORDER>(grid_run, tq, tk, tv, tdo, k, stream)
                                : launch_bwd<128, 128, BWD_STEP>(grid_run, tq, tk, tv, tdo, k, stream);
  if (rc) return rc;
  DL_CUDA_CHECK_LAUNCH("attn bwd (hopper)");
#if HP_BWD_TRACE
  if (k.trace) DL_TRY(bwd_trace_write(k.trace, (int)(grid_run.x * grid_run.y * grid_run.z), bq, stream));
#endif
  const dim3 rgrid((p->s_q + BWD_BQ - 1) / BWD_BQ, p->h_q, p->b);
  /* (m80: dQ^T's column order) */
  return p->d_qk == 64 ? launch_dq<64>(rgrid, k, stream) : m80 ? launch_dq<128, 80>(rgrid, k, stream) : launch_dq<128>(rgrid, k, stream);
}
