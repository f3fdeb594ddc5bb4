#!/usr/bin/env bash
# Remote step on a 2-GPU host for issue 6 (context-parallel attention), from
# the repo root after the build (`scripts/gpu/check.sh cp`, or
# `scripts/gpu/batch.sh cp.sh`):
#   1. spec/cp_spec.lua with #multigpu: every schedule, layout, mask and
#      strategy on 2 GPUs (NCCL) against the one-GPU attention, plus the cpu
#      and meta parts;
#   2. experiments/cp/cp_memory.lua on the GPUs (CP=1 and CP=2) -> cp-memory-gpu.{csv,md},
#      then the meta sweep again (CPU), so cp-memory.md gains the GPU table;
#   3. experiments/cp/cp_bench.lua at CP=2 -> cp-bench-<gpu>x2.md (time and
#      overlap efficiency of every strategy against one GPU).
# Logs and tables land in $OUT and in experiments/results/cp/; the short tables
# are printed last. Exit status non-zero if a step failed (a failed data
# check included). DISTLAB_COMMIT=<hash> names the commit in the results
# where the checkout has no .git.
#   scripts/gpu/cp.sh [specs] [memory] [bench]     (default: all three)
# CP_MEM_S (default 262144: cp_memory's --s) and CP_BENCH_S ("16384 65536
# 131072": cp_bench's --s), CP_BENCH_ITERS (default 5: its --iters) trade
# fidelity for time. The steps stop after
# 150, 240 and 240 s: under batch.sh give STEP_TIMEOUT=660, or run the
# steps in separate calls.
set -uo pipefail
OUT="${OUT:-/tmp/distlab-out}"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
mkdir -p "$OUT" experiments/results/cp
status=0
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -lt 2 ]; then echo "cp.sh: needs 2 GPUs, found $ngpu"; exit 2; fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
tag=$(echo "$gpu" | grep -oiE 'h100|h200|b200|a100|l40s' | head -1 | tr '[:upper:]' '[:lower:]')
tag="${tag:-gpu}x2"

steps=" ${*:-specs memory bench} "
want() { [[ "$steps" == *" $1 "* ]]; }

if want specs; then
echo "== cp specs, #multigpu included ($(date +%T))"
timeout 150 busted --run=default --exclude-tags=gpu -o spec/support/summary.lua spec/cp_spec.lua \
  >"$OUT/cp-spec.log" 2>&1 || status=1
grep -E "^(FAIL|ERROR)" "$OUT/cp-spec.log" | head -20
tail -n 1 "$OUT/cp-spec.log"
fi

if want memory; then
echo "== cp memory on the GPUs, CP=1 and 2 ($(date +%T))"
timeout 240 ./distlab run -n 2 --device cuda experiments/cp/cp_memory.lua --s "${CP_MEM_S:-262144}" --out "$OUT" \
  >"$OUT/cp-memory-gpu.log" 2>&1 || status=1
tail -n 20 "$OUT/cp-memory-gpu.log"
if [ -f "$OUT/cp-memory-gpu.csv" ]; then
  # the run's own header replaces the caption line of runs before the harness
  rm -f experiments/results/cp/cp-memory-gpu.txt
  cp "$OUT/cp-memory-gpu.csv" "$OUT/cp-memory-gpu.md" experiments/results/cp/
  ./distlab run --device meta experiments/cp/cp_memory.lua >"$OUT/cp-memory.log" 2>&1 || status=1
  cp experiments/results/cp/cp-memory.md experiments/results/cp/cp-memory.png "$OUT/" 2>/dev/null
fi
fi

if want bench; then
echo "== cp bench at CP=2 ($(date +%T))"
s_list="${CP_BENCH_S:-}"
timeout 240 ./distlab run -n 2 --device cuda experiments/cp/cp_bench.lua --iters "${CP_BENCH_ITERS:-5}" \
  ${s_list:+--s "${s_list// /,}"} --tag "$tag" --out "$OUT" >"$OUT/cp-bench.log" 2>&1 || status=1
cp "$OUT/cp-bench-$tag.md" "$OUT/cp-bench-$tag.csv" experiments/results/cp/ 2>/dev/null
command -v gnuplot >/dev/null && experiments/cp/cp_bench_plot.sh "experiments/results/cp/cp-bench-$tag.csv" ||
  echo "no gnuplot here: draw the PNG with experiments/cp/cp_bench_plot.sh experiments/results/cp/cp-bench-$tag.csv"
fi

echo "== done, status $status ($(date +%T)); tables: $OUT/cp-memory.md, $OUT/cp-bench-$tag.md"
sed -n '/^| layout | strategy | CP | fwd MiB/,/^$/p' "$OUT/cp-memory.md" 2>/dev/null
tail -n 25 "$OUT/cp-bench.log"
exit $status
