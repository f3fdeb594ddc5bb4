#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (issue 52): ours and FlashAttention-4 at one shape under the GPU's power
# cap, in time and in cycles. The H200 runs these kernels at its 700 W cap (FA4-GAP.md section 15), so a
# kernel that spends less energy a FLOP runs at a higher SM clock: the bench's time ratio is cycles times
# clock, and this tells the two apart. ROUNDS rounds of FA4 then ours then ours then FA4 (the anchors before
# and after ours), each experiments/attn/attn_prof_fa4.py or attn_prof.lua with --stamp (a warm-up call, then
# FWD_CALLS forward calls and CALLS backward calls, each phase between two synchronized lines, each line
# timed here), while nvidia-smi samples the SM clock, the power and the throttle reasons every 50 ms;
# experiments/lab/attn/clock_pair.py sets each phase's time beside its clock. Every run checks its last call
# (ours: out, lse, dq, dk, dv against fp64 at sampled rows; FA4: out against fp64, gradients finite).
# Knobs: S (8192), D (128), MASK (none), LAYOUT (bshd), CALLS (the backward phase's calls; default about 3 s),
# FWD_CALLS (the forward's; default 2.5 CALLS, about as long), ROUNDS (1: fa4, ours, ours, fa4). FA4 from the
# carried wheel sets (steps.sh's fa4_site: stage .deps/fa4/2 first). Writes $OUT/attn-clock.md and the raw
# files in attn_clock-logs.tgz. SKIP_BUILD as steps.sh's build_or_skip. BUDGET 300 s.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_clock 300 || exit 2
S="${S:-8192}" D="${D:-128}" MASK="${MASK:-none}" LAYOUT="${LAYOUT:-bshd}" ROUNDS="${ROUNDS:-1}"
# about 3 s of backward a phase at ~550 TFLOP/s (at least 20 calls)
flops=$((4 * 2 * 16 * S * S * D * 5 / 2))
[ "$MASK" = causal ] && flops=$((flops / 2))
CALLS="${CALLS:-$(( (3 * 550 * 1000000000000 / flops) > 20 ? (3 * 550 * 1000000000000 / flops) : 20 ))}"
# the forward phase as long (2.5x the calls at ~the same TFLOP/s): the power cap's steady state, not the
# one-second power average's lag behind the phase before
FWD_CALLS="${FWD_CALLS:-$((CALLS * 5 / 2))}"
header
build_or_skip || exit 1
fa4_site || { say "FA4 is not installed: no pair"; exit 1; }
args=(--s "$S" --d "$D" --mask "$MASK" --layout "$LAYOUT" --calls "$CALLS" --fwd-calls "$FWD_CALLS" --stamp)
fa4_cmd=("$PY" experiments/attn/attn_prof_fa4.py "${args[@]}")
ours_cmd=(./distlab run -n 1 --device cuda experiments/attn/attn_prof.lua "${args[@]}")
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 >"$L/smi.csv" &
smi=$!
sleep 1
logs=()
for r in $(seq 1 "$ROUNDS"); do
  for impl in fa4 ours ours fa4; do
    n=1
    while [ -e "$L/$impl-$r-$n.log" ]; do n=$((n + 1)); done
    log="$L/$impl-$r-$n.log"
    if [ $impl = fa4 ]; then cmd=("${fa4_cmd[@]}"); else cmd=("${ours_cmd[@]}"); fi
    # each line of the run's output with its time (the stamps)
    step "$impl, round $r" 150 "$log" bash -c \
      "set -o pipefail; stdbuf -oL ${cmd[*]} 2>&1 | while IFS= read -r l; do echo \"\$(date +%Y/%m/%d\ %H:%M:%S.%N) \$l\"; done"
    logs+=("$log")
  done
done
sleep 0.5
kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
{
  echo "# Ours and FlashAttention-4 under the power cap: time, SM clock, cycles ($(gpu_tag), $(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "- commit: \`${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}\`; $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,enforced.power.limit --format=csv,noheader)"
  echo "- FA4: flash-attn-4 $FA4; \`${fa4_cmd[*]}\`"
  echo "- ours: \`${ours_cmd[*]}\` ($(grep -h 'attn_prof: build:' "$L"/ours-*.log | head -1 | sed 's/^[^ ]* [^ ]* //'))"
  echo "- order: FA4, ours, ours, FA4 a round; nvidia-smi \`--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active -lms 50\`"
  echo "- made by: \`$(call_line 'S|D|MASK|LAYOUT|CALLS|FWD_CALLS|ROUNDS|SKIP_BUILD|BUDGET')\`"
  echo
  "$PY" experiments/lab/attn/clock_pair.py --smi "$L/smi.csv" "${logs[@]}"
} >"$OUT/attn-clock.md" 2>&1 || status=1
cat "$OUT/attn-clock.md"
exit $status
