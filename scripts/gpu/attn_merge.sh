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
# VARIANTS "NAME[:VAR=V,VAR=V] ..." (default one, "base": the files straight in $OUT) runs the bench once a
# variant and round with its knobs in the environment, each into NAME-rR/ of the logs (attn_merge-logs.tgz);
# ROUNDS (default 1) rounds, the variants' order reversed in even rounds (an A/B of kernel knobs, e.g. DISTLAB_ATTN_HOPPER_FWD_TMA_M=1);
# with more than one run, experiments/attn/attn_merge_ab_report.py sets them side by side in $OUT/attn-merge-ab.md
# (each run's header, every cost by round, each variant's ranges, the checks), the one file to fetch;
# the runs' own files travel in the logs' tgz.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_merge 240 || exit 2
S="${S:-4096,8192}" D="${D:-128}" VARIANTS="${VARIANTS:-base}" ROUNDS="${ROUNDS:-1}"
[[ "$D" =~ ^[0-9]+$ ]] || { say "D: a head dim, got $D"; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { say "ROUNDS: a positive integer, got $ROUNDS"; exit 2; }
n=0
for v in $VARIANTS; do
  IFS=: read -r name knobs <<<"$v"
  [[ "$name" =~ ^[a-z][a-z0-9]*$ ]] || { say "VARIANTS: NAME ([a-z][a-z0-9]*) first in $v"; exit 2; }
  knobs_ok "$knobs" || { say "VARIANTS: knobs VAR=V[,VAR=V] in $v"; exit 2; }
  n=$((n + 1))
done
runs=$((n * ROUNDS))
header
build_or_skip || exit 1
for r in $(seq "$ROUNDS"); do
  order=$VARIANTS
  [ $((r % 2)) = 0 ] && order=$(list_rev "$VARIANTS")
  for v in $order; do
    IFS=: read -r name knobs <<<"$v"
    out="$L/$name-r$r" log="$L/merge-$name-r$r.log"
    [ "$runs" = 1 ] && out="$OUT" log="$L/merge.log"
    mkdir -p "$out"
    # shellcheck disable=SC2046 # the knobs are VAR=V words
    step "merge cost d$D s $S $name round $r" $(((BUDGET - 20) / runs)) "$log" env $(echo "$knobs" | tr , ' ') \
      ./distlab run -n 1 --device "${DEVICE:-cuda}" experiments/attn/attn_merge_bench.lua --s "$S" --d "$D" \
      --out "$out" --command "$(echo "$knobs" | tr , ' ')${knobs:+ }$(call_line 'S|D|DEVICE|VARIANTS|ROUNDS')"
    tail -n 14 "$log"
  done
done
if [ "$runs" -gt 1 ]; then # the variants side by side, from each run's CSV and header
  names=$(for v in $VARIANTS; do echo "${v%%:*}"; done)
  # shellcheck disable=SC2086 # the names are words
  step "report" 30 "$OUT/attn-merge-ab.md" "$PY" experiments/attn/attn_merge_ab_report.py "$L" $names \
    --rounds "$ROUNDS" --made-by "$(call_line 'S|D|DEVICE|VARIANTS|ROUNDS')"
fi
exit "$status"
