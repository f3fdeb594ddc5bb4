#!/usr/bin/env bash
# Remote step on a one-GPU host: an A/B of the attention kernels between libraries built elsewhere (each from a
# commit: scripts/ab-pack.sh NAME on the CPU machine packs build/lib/libdistlab.so into .ab/libNAME.so.xz and its
# commit into .ab/NAME.commit; carry .ab and .debs) and environment knobs, in one call:
#   VARIANTS  "NAME:LIB[:VAR=V,VAR=V]" separated by spaces (default "base:main"); the first is the base the
#             report sets every other against; LIB names .ab/libLIB.so.xz
#   ROUNDS    rounds (default 2); the variants' order is reversed in even rounds, so that neither end of a
#             round (a cool or a warm GPU) favours one variant
#   S, D      attn_bench's --s (default 8192,16384) and --d (128); BACKENDS its --backends (ours); GQA its
#             --gqa (1: MHA)
# Each run: the variant's library copied to build/lib/libdistlab.so, then `[knobs] DISTLAB_COMMIT=<LIB's commit>
# ./distlab run -n 1 --device $DEVICE experiments/attn/attn_bench.lua --s S --d D --backends BACKENDS --out
# $L/dD-NAME-rR` (bshd and thd, causal and not, each shape timed by the bench and checked after timing against
# fp64 at sampled rows, outputs poisoned); its log beside it. At the end the first variant's library is left in
# build/lib/libdistlab.so (each put there by rename; on a checkout of one's own, ./distlab build restores its
# own). Then experiments/attn/attn_ab_report.py writes $OUT/attn-ab-dD.md (each run's header, the speed-ups
# over the base in the same round, their ranges, the checks) and $OUT/attn-ab-dD.csv (every row with d,
# variant and round). A run that fails, or a row whose check is not ok, fails the script.
# BUDGET (560 s) bounds the runs (a run the budget cuts is named in the report, which is written from the others);
# a run gets at most RUN_LIMIT (150 s). About 45 s a run at d 128, 37 s at d 64 on an H200 (S 8k and 16k;
# session 22: 42-46 s and 36-37 s), so BUDGET >= runs x that + 20 (the start, the unpacking, the reserve); a
# smaller BUDGET is named at the start with the runs it may leave out. DEVICE=cpu with a small S runs the
# plumbing where there is no GPU (a stand-in nvidia-smi on PATH). DISTLAB_COMMIT is not read: each run names its library's commit.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_ab 560 || exit 2
VARIANTS="${VARIANTS:-base:main}" ROUNDS="${ROUNDS:-2}" S="${S:-8192,16384}" D="${D:-128}" GQA="${GQA:-1}"
BACKENDS="${BACKENDS:-ours}" DEV="${DEVICE:-cuda}" RUN_LIMIT="${RUN_LIMIT:-150}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { say "ROUNDS: a positive integer, got $ROUNDS"; exit 2; }
[[ "$D" =~ ^[0-9]+$ ]] || { say "D: a head dim, got $D"; exit 2; }
[[ "$GQA" =~ ^[1-9][0-9]*$ ]] || { say "GQA: query heads per kv head, got $GQA"; exit 2; }
names=()
for v in $VARIANTS; do
  IFS=: read -r name lib knobs <<<"$v"
  [[ "$name" =~ ^[a-z][a-z0-9]*$ ]] || { say "VARIANTS: NAME ([a-z][a-z0-9]*) first in $v"; exit 2; }
  [[ " ${names[*]} " != *" $name "* ]] || { say "VARIANTS: $name twice"; exit 2; }
  [[ "$lib" =~ ^[a-z0-9]+$ ]] || { say "VARIANTS: NAME:LIB, LIB a packed library's name ([a-z0-9]+), in $v"; exit 2; }
  knobs_ok "$knobs" || { say "VARIANTS: knobs VAR=V[,VAR=V] in $v"; exit 2; }
  [ -f ".ab/lib$lib.so.xz" ] && [ -f ".ab/$lib.commit" ] || { say "VARIANTS: .ab/lib$lib.so.xz or .ab/$lib.commit missing (scripts/ab-pack.sh $lib; carry .ab)"; exit 2; }
  names+=("$name")
done
[ "${#names[@]}" -ge 2 ] || { say "VARIANTS: two or more variants, got '$VARIANTS'"; exit 2; }
# the runs' libraries name their commits; the host's .git may be older than the tree carried to it (a
# device host's was: its describe said fe02c3d-dirty on a later tree), so the header does not ask it
HEADER_COMMIT="each library's own, below" header
# the runs a BUDGET this small may cut (the last ones: base's, round 2 reversed; session 22 lost two that way)
per_run=$([ "$D" -le 64 ] && echo 37 || echo 45)
case "$S" in 8192,16384 | 16384,8192) ;; *) per_run= ;; esac # the estimate is for the default S only
nruns=$((${#names[@]} * ROUNDS))
if [ -n "$per_run" ] && [ $((nruns * per_run + 20)) -gt "$BUDGET" ]; then
  say "WARNING: BUDGET $BUDGET s for $nruns runs of ~$per_run s (d $D): about $(((BUDGET - 20) / per_run)) fit; the report names any cut"
fi
mkdir -p build/ab build/lib
for lib in $(for v in $VARIANTS; do echo "$v" | cut -d: -f2; done | sort -u); do
  xz -dc ".ab/lib$lib.so.xz" >"build/ab/lib$lib.so" || { say "unpacking .ab/lib$lib.so.xz failed"; exit 2; }
  say "library $lib: commit $(cat ".ab/$lib.commit"), $(stat -c %s "build/ab/lib$lib.so") bytes"
done
# the library in place by rename, so that a process still running the old one keeps its pages
install_lib() { cp "build/ab/lib$1.so" build/lib/.libdistlab.so.ab && mv -f build/lib/.libdistlab.so.ab build/lib/libdistlab.so; }
for r in $(seq "$ROUNDS"); do
  order=$VARIANTS
  [ $((r % 2)) = 0 ] && order=$(list_rev "$VARIANTS")
  for v in $order; do
    IFS=: read -r name lib knobs <<<"$v"
    install_lib "$lib"
    # shellcheck disable=SC2046 # the knobs are VAR=V words
    step "d$D $name round $r" "$RUN_LIMIT" "$L/d$D-$name-r$r.log" \
      env DISTLAB_COMMIT="$(cat ".ab/$lib.commit")" $(echo "$knobs" | tr , ' ') ./distlab run -n 1 --device "$DEV" \
      experiments/attn/attn_bench.lua --s "$S" --d "$D" --gqa "$GQA" --backends "$BACKENDS" --out "$L/d$D-$name-r$r"
  done
done
first=$(echo "$VARIANTS" | awk '{print $1}' | cut -d: -f2)
install_lib "$first"
# The report of whatever ran, also where the budget cut a run (session 21: a run cut left no report at all): it
# reads the runs' CSVs in under a second, so it runs in the 10 s the budget keeps for packing
STEP_RESERVE=0 step "report (a run missing or a row not ok names itself)" 5 "$L/report.log" \
  python3 experiments/attn/attn_ab_report.py "$L" "$D" "$VARIANTS" "$OUT/attn-ab-d$D.csv" "$OUT/attn-ab-d$D.md"
{
  echo
  echo "Made by: \`$(env | grep -E '^(CUDA|NCCL)_' | sort | tr '\n' ' ')VARIANTS=\"$VARIANTS\" ROUNDS=$ROUNDS S=$S D=$D BACKENDS=$BACKENDS${DEVICE:+ DEVICE=$DEVICE} scripts/gpu/attn_ab.sh\` (device, date and each library's commit above and in each run's header)"
} >>"$OUT/attn-ab-d$D.md" 2>/dev/null
exit "$status"
