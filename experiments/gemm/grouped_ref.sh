#!/usr/bin/env bash
# experiments/gemm/grouped_ref.sh — dl.gemm.grouped against torch's grouped GEMM paths (issue 55), in one
# device call on a GPU host (repo root as cwd, .debs carried; PyTorch in /opt/torch/.venv):
#   1. build (SKIP_BUILD=1 and build/lib/libdistlab.so there: not);
#   2. the specs of the grouped GEMM and of the trace, GPU tags included (NOSPECS=1: not);
#   3. (NOBENCH=1: not) the cases (grouped_bench.lua --cases-out, on cpu: a list, nothing timed),
#      then on GPU 0: torch's paths (grouped_torch.py), dl.gemm.grouped (grouped_bench.lua, every
#      backend), torch's paths again, then grouped_bench's results file from the three (--measured:
#      torch the mean of the run before and the run after) -> $OUT/grouped-<gpu>.{md,csv}: copy them
#      to experiments/results/gemm/ (the results file of issue 55's grouped GEMM target).
# $OUT gets at most 4 files (what a device call brings back is limited): those two, the verdicts
# ($OUT/grouped-ref-summary.txt) and every log and CSV of the steps ($OUT/grouped-ref-logs.tgz, made
# in $WORK, default /tmp/grouped-ref); exit status non-zero when a step failed. BENCH_ARGS (e.g.
# "--experts 8 --dists skew") narrows the cases of both benches. On one H200: build ~2-3 min, specs
# ~1-2, the benches ~4-5 (torch ~1 each, ours ~2-3): two device calls (NOBENCH=1, then SKIP_BUILD=1
# NOSPECS=1 on the same warm machine) keep each under its 10 minutes (the benches' steps are cut at
# 30 + 120 + 240 + 120 + 60 s: a step cut short leaves its rows out of the results file, says FAIL).
# DISTLAB_COMMIT=<hash> names the commit where the checkout has no .git.
#
#   OUT=/tmp/out [BENCH_ARGS=...] bash experiments/gemm/grouped_ref.sh
set -u
OUT="${OUT:-/tmp/distlab-out}"
L="${WORK:-/tmp/grouped-ref}"
mkdir -p "$L" "$OUT"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-120}"
PY="${PY:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
SUM="$OUT/grouped-ref-summary.txt"
: >"$SUM"
status=0
say() { echo "$*" | tee -a "$SUM"; }
run() { # run NAME LIMIT LOG cmd...: one step, its verdict in the summary
  local name="$1" limit="$2" log="$3"
  shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  say "$( [ $rc = 0 ] && echo ok || echo "FAIL (exit $rc)" ) $name ($((SECONDS - t0)) s; $log)"
  [ $rc = 0 ] || status=1
  return $rc
}

finish() {
  tar czf "$OUT/grouped-ref-logs.tgz" -C "$(dirname "$L")" "$(basename "$L")" 2>/dev/null
  exit $status
}
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | grep -oE '[AHBL][0-9]+' | head -1 | tr 'A-Z' 'a-z')
gpu="${gpu:-gpu}"
say "grouped_ref: $gpu, BENCH_ARGS='${BENCH_ARGS:-}', $(date -u '+%Y-%m-%d %H:%M UTC')"
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -f build/lib/libdistlab.so ]; then say "build: skipped (SKIP_BUILD=1)"
else run build 400 "$L/build.log" ./distlab build || finish; fi

if [ "${NOSPECS:-0}" != 1 ]; then
  run "specs: grouped GEMM, trace, gemm (GPU tags included)" 300 "$L/specs.log" env CUDA_VISIBLE_DEVICES=0 \
    ./distlab test spec/gemm_grouped_spec.lua spec/trace_spec.lua spec/gemm_spec.lua
  tail -5 "$L/specs.log" | tee -a "$SUM"
fi

[ "${NOBENCH:-0}" = 1 ] && finish

run "the cases" 30 "$L/cases.log" ./distlab run -n 1 --device cpu experiments/gemm/grouped_bench.lua \
  --cases-out "$L/cases.csv" "${EXTRA[@]}" || finish
run "torch's paths (before)" 120 "$L/torch-1.log" env CUDA_VISIBLE_DEVICES=0 "$PY" experiments/gemm/grouped_torch.py \
  "$L/torch-1.csv" --cases "$L/cases.csv"
run "dl.gemm.grouped, every backend" 240 "$L/bench.log" env CUDA_VISIBLE_DEVICES=0 ./distlab run -n 1 --device cuda \
  experiments/gemm/grouped_bench.lua "${EXTRA[@]}" --out "$L" --tag "$gpu"
run "torch's paths (after)" 120 "$L/torch-2.log" env CUDA_VISIBLE_DEVICES=0 "$PY" experiments/gemm/grouped_torch.py \
  "$L/torch-2.csv" --cases "$L/cases.csv"
run "the results file" 60 "$L/results.log" env CUDA_VISIBLE_DEVICES=0 ./distlab run -n 1 --device cuda \
  experiments/gemm/grouped_bench.lua "${EXTRA[@]}" --measured "$L/grouped-$gpu.csv" \
  --torch "$L/torch-1.csv,$L/torch-2.csv" --out "$OUT" --tag "$gpu" \
  --command "experiments/gemm/grouped_ref.sh ${BENCH_ARGS:+BENCH_ARGS='$BENCH_ARGS' }(grouped_torch.py, grouped_bench.lua, grouped_torch.py, then this with --measured, in one device call)"
grep -E "^target|wrote" "$L/results.log" | tee -a "$SUM"
finish
