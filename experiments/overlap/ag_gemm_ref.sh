#!/usr/bin/env bash
# experiments/overlap/ag_gemm_ref.sh — all-gather + GEMM against the best GEMM alone (issue 49), in one
# device call on a GPU host (repo root as cwd, .debs carried; PyTorch in /opt/torch/.venv):
#   1. build (SKIP_BUILD=1 and build/lib/libdistlab.so there: not);
#   2. the reference on GPU 0, the GEMM alone's shapes (m in AG_M, k, n): torch.matmul
#      (gemm_bench_torch.py), dl.gemm tuned (gemm_bench.lua, DISTLAB_GEMM_TUNE, default 8: the
#      fastest of cuBLASLt's first 8 candidates), torch.matmul again, then gemm_bench's results file
#      from the three (--measured: torch.matmul the mean of the run before and the run after):
#      $OUT/gemm-<gpu>.{md,csv};
#   3. with NGPUS >= 2 (default: the GPUs here): ag_gemm_torch.py's anchors under torchrun, then
#      ag_gemm_bench.lua with DISTLAB_GEMM_TUNE and --gemm-ref $OUT/gemm-<gpu>.csv: its interleaved
#      table gains "of the best GEMM alone" (the pipeline against the faster of dl.gemm and
#      torch.matmul); torch.matmul alone again after it, for the record ($OUT/ag-torch-after.{csv,md});
#      $OUT/ag-gemm-<gpu>x<N>.{md,csv,dat,png}. With one GPU: 2 ranks sharing it, small shapes, into
#      $OUT/smoke (a check of the path; timings mean nothing).
# OP=gemm_rs does the same for GEMM + reduce-scatter (the reference at k/N). Each step under
# `timeout`; the verdicts in $OUT/ag-gemm-ref-summary.txt; exit status non-zero when a step failed.
# DISTLAB_COMMIT=<hash> names the commit where the checkout has no .git.
#
#   OUT=/tmp/out [NGPUS=2] [AG_M=8192,16384,32768] [K=16384] [N=8192] [OP=ag_gemm] bash experiments/overlap/ag_gemm_ref.sh
set -u
OUT="${OUT:-/tmp/distlab-out}"
L="$OUT/ag-gemm-ref"
mkdir -p "$L"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-120}" NCCL_NVLS_ENABLE=0 DISTLAB_GEMM_TUNE="${DISTLAB_GEMM_TUNE:-8}"
PY="${PY:-/opt/torch/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
SUM="$OUT/ag-gemm-ref-summary.txt"
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

AG_M="${AG_M:-8192,16384,32768}" K="${K:-16384}" N="${N:-8192}" OP="${OP:-ag_gemm}"
NGPUS="${NGPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | grep -oE '[AHBL][0-9]+' | head -1 | tr 'A-Z' 'a-z')
gpu="${gpu:-gpu}"
say "ag_gemm_ref: $OP, m $AG_M, k $K, n $N, $NGPUS GPU(s) ($gpu), DISTLAB_GEMM_TUNE=$DISTLAB_GEMM_TUNE, $(date -u '+%Y-%m-%d %H:%M UTC')"
[ "$NGPUS" -ge 1 ] || { say "no GPU here"; exit 1; }
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -f build/lib/libdistlab.so ]; then say "build: skipped (SKIP_BUILD=1)"
else run build 300 "$L/build.log" ./distlab build || exit 1; fi

# 2. the reference: torch.matmul, dl.gemm tuned, torch.matmul, then the results file from the three
# (reference M K N DIR TAG -> DIR/gemm-TAG.{md,csv}; scratch in $L)
reference() {
  local G=(--m "$1" --k "$2" --n "$3") dir="$4" t="$5"
  run "torch.matmul (before), $t" 120 "$L/gemm-torch-1-$t.log" env CUDA_VISIBLE_DEVICES=0 "$PY" \
    experiments/overlap/gemm_bench_torch.py "$L/gemm-torch-1-$t.csv" "${G[@]}"
  run "dl.gemm, DISTLAB_GEMM_TUNE=$DISTLAB_GEMM_TUNE, $t" 120 "$L/gemm-bench-1-$t.log" env CUDA_VISIBLE_DEVICES=0 \
    ./distlab run -n 1 --device cuda experiments/overlap/gemm_bench.lua "${G[@]}" --out "$L" --tag "$t"
  run "torch.matmul (after), $t" 120 "$L/gemm-torch-2-$t.log" env CUDA_VISIBLE_DEVICES=0 "$PY" \
    experiments/overlap/gemm_bench_torch.py "$L/gemm-torch-2-$t.csv" "${G[@]}"
  run "the reference's results file, $t" 60 "$L/gemm-bench-$t.log" env CUDA_VISIBLE_DEVICES=0 ./distlab run -n 1 \
    --device cuda experiments/overlap/gemm_bench.lua "${G[@]}" --measured "$L/gemm-$t.csv" \
    --torch "$L/gemm-torch-1-$t.csv,$L/gemm-torch-2-$t.csv" --out "$dir" --tag "$t" --command "DISTLAB_GEMM_TUNE=$DISTLAB_GEMM_TUNE \
experiments/overlap/ag_gemm_ref.sh (gemm_bench_torch.py, gemm_bench.lua, gemm_bench_torch.py, then this with --measured, in one device call)"
  sed -n '/^# dl.gemm vs/,$p' "$L/gemm-bench-$t.log" | tee -a "$SUM"
}
div=$((NGPUS >= 2 ? NGPUS : 2))
refk="$K"
[ "$OP" = gemm_rs ] && refk=$((K / div))
reference "$AG_M" "$refk" "$N" "$OUT" "$gpu"
REF="$OUT/gemm-$gpu.csv"

# 3. the pipelines against it
port=$((20000 + RANDOM % 20000))
if [ "$NGPUS" -ge 2 ]; then
  tag="${gpu}x$NGPUS" dir="$OUT" extra=() torch_args=(--ag-m "$AG_M" --ag-k "$K" --ag-n "$N")
  bench_args=(--m "$AG_M" --k "$K" --n "$N")
else # one GPU: 2 ranks sharing it, small shapes, a check of the path (the reference above is the figure)
  NGPUS=2 tag="${gpu}-smoke" dir="$OUT/smoke" extra=(--iters 3 --streams 1,2 --interleave 1)
  torch_args=(--ag-m 2048,4096 --ag-k 2048 --ag-n 1024 --ag-iters 3) bench_args=(--m 2K,4K --k 2K --n 1K)
  refk=2048
  [ "$OP" = gemm_rs ] && refk=1024
  reference 2048,4096 "$refk" 1024 "$dir" "$tag"
  REF="$dir/gemm-$tag.csv"
fi
run "$OP PyTorch anchors ($NGPUS ranks)" 200 "$L/ag-torch.log" "$PY" -m torch.distributed.run --nproc_per_node "$NGPUS" \
  --master_port "$port" experiments/overlap/ag_gemm_torch.py "$L/ag-torch.csv" --ag-op "$OP" "${torch_args[@]}"
run "$OP bench ($NGPUS ranks, --gemm-ref)" 400 "$L/ag-bench.log" ./distlab run -n "$NGPUS" --device cuda \
  experiments/overlap/ag_gemm_bench.lua --op "$OP" "${bench_args[@]}" "${extra[@]}" --torch "$L/ag-torch.csv" --gemm-ref "$REF" \
  --out "$dir" --tag "$tag" --command "DISTLAB_GEMM_TUNE=$DISTLAB_GEMM_TUNE experiments/overlap/ag_gemm_ref.sh (the reference, ag_gemm_torch.py under torchrun, then this with --gemm-ref, in one device call)"
run "torch.matmul alone again, after the bench" 120 "$L/ag-torch-after.log" "$PY" -m torch.distributed.run \
  --nproc_per_node "$NGPUS" --master_port "$((port + 7))" experiments/overlap/ag_gemm_torch.py "$OUT/ag-torch-after.csv" \
  --ag-op "$OP" "${torch_args[@]}" --ag-impls torch_matmul
grep -A12 "of the best GEMM alone |" "$dir"/*-"$tag".md 2>/dev/null | tee -a "$SUM"
tar czf "$OUT/ag-gemm-ref-logs.tgz" -C "$OUT" ag-gemm-ref 2>/dev/null
exit $status
