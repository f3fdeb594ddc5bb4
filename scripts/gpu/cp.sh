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
# Logs in $OUT/cp-logs.tgz, tables in $OUT and in experiments/results/cp/; the short tables
# are printed last. Exit status non-zero if a step failed (a failed data
# check included). DISTLAB_COMMIT=<hash> names the commit in the results
# where the checkout has no .git.
#   scripts/gpu/cp.sh [specs] [memory] [bench]     (default: all three)
# CP_MEM_S (default 262144: cp_memory's --s) and CP_BENCH_S ("16384 65536
# 131072": cp_bench's --s), CP_BENCH_ITERS (default 5: its --iters) trade
# fidelity for time. The steps stop after
# 150, 240 and 240 s, all within BUDGET (default 660 s): under batch.sh give
# STEP_TIMEOUT=660, or run the steps in separate calls.
set -uo pipefail
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" cp 660 || exit 2
mkdir -p experiments/results/cp
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$ngpu" -lt 2 ]; then say "cp.sh: needs 2 GPUs, found $ngpu"; status=2; exit 2; fi
tag="$(gpu_tag)x2"
STEPS="${*:-specs memory bench}"

if want specs; then
  step "cp specs, #multigpu included" 150 "$L/cp-spec.log" busted --run=default --exclude-tags=gpu \
    -o spec/support/summary.lua spec/cp_spec.lua
  grep -E "^(FAIL|ERROR)" "$L/cp-spec.log" | head -20
fi

if want memory; then
  step "cp memory on the GPUs, CP=1 and 2" 240 "$L/cp-memory-gpu.log" ./distlab run -n 2 --device cuda \
    experiments/cp/cp_memory.lua --s "${CP_MEM_S:-262144}" --out "$OUT"
  tail -n 20 "$L/cp-memory-gpu.log"
  if [ -f "$OUT/cp-memory-gpu.csv" ]; then
    # the run's own header replaces the caption line of runs before the harness
    rm -f experiments/results/cp/cp-memory-gpu.txt
    cp "$OUT/cp-memory-gpu.csv" "$OUT/cp-memory-gpu.md" experiments/results/cp/
    step "cp memory on meta" 120 "$L/cp-memory.log" ./distlab run --device meta experiments/cp/cp_memory.lua
    cp experiments/results/cp/cp-memory.md experiments/results/cp/cp-memory.png "$OUT/" 2>/dev/null
  fi
fi

if want bench; then
  s_list="${CP_BENCH_S:-}"
  step "cp bench at CP=2" 240 "$L/cp-bench.log" ./distlab run -n 2 --device cuda experiments/cp/cp_bench.lua \
    --iters "${CP_BENCH_ITERS:-5}" ${s_list:+--s "${s_list// /,}"} --tag "$tag" --out "$OUT"
  cp "$OUT/cp-bench-$tag.md" "$OUT/cp-bench-$tag.csv" experiments/results/cp/ 2>/dev/null
  command -v gnuplot >/dev/null && experiments/cp/cp_bench_plot.sh "experiments/results/cp/cp-bench-$tag.csv" ||
    echo "no gnuplot here: draw the PNG with experiments/cp/cp_bench_plot.sh experiments/results/cp/cp-bench-$tag.csv"
fi

say "tables: $OUT/cp-memory.md, $OUT/cp-bench-$tag.md"
sed -n '/^| layout | strategy | CP | fwd MiB/,/^$/p' "$OUT/cp-memory.md" 2>/dev/null
tail -n 25 "$L/cp-bench.log" 2>/dev/null
exit $status
