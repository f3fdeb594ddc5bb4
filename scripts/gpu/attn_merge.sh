#!/usr/bin/env bash
# Remote step on a one-GPU host: the fused merge's cost over the plain step (issue 52 item 3; issue 19),
# experiments/attn/attn_merge_bench.lua through dl.attn's own dispatch, bshd and thd, causal and not, at
# S (default 4096,8192) and D (default 128), the running out in f32 and bf16; every timed call checked
# against fp64 at sampled rows. Writes $OUT/attn-merge.md and .csv (the bench's files), its log in
# $OUT/attn_merge-logs.tgz; a failed check fails the script. BUDGET (default 240 s) bounds the call
# (about 8 s a shape at d 128 on an H200, most of it the host's fp64 checks). SKIP_BUILD=1 with a
# build/lib/libdistlab.so carried (scripts/ab-pack.sh, unpacked by the caller) skips the build;
# DISTLAB_COMMIT=<hash> names the commit where the checkout has no .git. DEVICE=cpu with a small S runs the
# plumbing where there is no GPU (a stand-in nvidia-smi on PATH).
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_merge 240 || exit 2
S="${S:-4096,8192}" D="${D:-128}"
[[ "$D" =~ ^[0-9]+$ ]] || { say "D: a head dim, got $D"; exit 2; }
header
build_or_skip || exit 1
step "merge cost d$D s $S" $((BUDGET - 20)) "$L/merge.log" ./distlab run -n 1 --device "${DEVICE:-cuda}" \
  experiments/attn/attn_merge_bench.lua --s "$S" --d "$D" --out "$OUT" --command "$(call_line 'S|D|DEVICE')"
tail -n 14 "$L/merge.log"
exit "$status"
