#!/usr/bin/env bash
# attn_lab.sh — the attention kernel lab on a GPU machine: builds
# experiments/lab/attn/{attn_check,attn_bench} with nvcc for sm_90, runs the
# checker (all cases), compute-sanitizer memcheck and racecheck on the small
# subset, then the benchmark. Run from the repository root; outputs go to
# $OUT (default experiments/results/attn/lab), the verdicts in $OUT/summary.txt. ~3-5 minutes on an
# H100/H200 (BUDGET, default 590 s, is not enforced here: each step has its own timeout).
#   scripts/gpu/attn_lab.sh            everything
#   QUICK=1 scripts/gpu/attn_lab.sh    no sanitizers, bench at s=8k only
#   NOVARIANTS=1 NOBENCH=1 ...          only the checker and the sanitizers
# Exit status: non-zero if the build, the checker or a sanitizer failed.
set -uo pipefail
t_start=$(date +%s)
OUT=${OUT:-experiments/results/attn/lab} LAYOUT=flat SUM_NAME=summary.txt # as the lab notes cite them
source "$(dirname "$0")/steps.sh" attn_lab 590 || exit 2
BUILD=${BUILD:-/tmp/distlab_attn_lab_gpu}
NVCC=${NVCC:-nvcc}
SAN=${SANITIZER:-compute-sanitizer}
command -v "$NVCC" >/dev/null || NVCC=/usr/local/cuda/bin/nvcc
command -v "$SAN" >/dev/null || SAN=/usr/local/cuda/bin/compute-sanitizer
mkdir -p "$BUILD"
FLAGS="-Icore -Icore/include -Ikernels -std=c++17 -O3 -lineinfo -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"
log() { say "== $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$OUT/summary.txt" || true

log "build ($(date +%T))"
pids=()
for f in attn_fwd attn_bwd attn_merge; do
  $NVCC $FLAGS -Xptxas -v -c kernels/attn/$f.cu -o "$BUILD/$f.o" > "$BUILD/$f.ptxas" 2>&1 & pids+=($!)
done
for f in attn attn_merge attn_params; do
  gcc -std=c11 -O2 -fPIC -Icore -Icore/include -Ikernels -c kernels/attn/cpu/$f.c -o "$BUILD/cpu_$f.o" & pids+=($!)
done
gcc -std=c11 -O2 -fPIC -Icore -Icore/include -Ikernels -D_POSIX_C_SOURCE=200809L -c core/base/error.c -o "$BUILD/error.o" & pids+=($!)
$NVCC $FLAGS -c experiments/lab/attn/attn_check.cu -o "$BUILD/attn_check.o" & pids+=($!)
$NVCC $FLAGS -c experiments/lab/attn/attn_bench.cu -o "$BUILD/attn_bench.o" & pids+=($!)
# lab knobs (see the kernels' headers): variants of the d=128 tiles, checked
# and timed at s=8k after the main run
VARIANTS=("fwd 128x32, bwd 4 warps|-DDL_ATTN_FWD128_BN=32 -DDL_ATTN_BWD128_NW=4"
          "fwd 64x64 1 m-tile per warp|-DDL_ATTN_FWD128_BM=64"
          "fwd K/V double-buffered|-DDL_ATTN_FWD128_STAGES=2")
[ -n "${NOVARIANTS:-}" ] && VARIANTS=()
for i in "${!VARIANTS[@]}"; do
  defs=${VARIANTS[$i]#*|}
  $NVCC $FLAGS $defs -c kernels/attn/attn_fwd.cu -o "$BUILD/attn_fwd_v$i.o" & pids+=($!)
  $NVCC $FLAGS $defs -c kernels/attn/attn_bwd.cu -o "$BUILD/attn_bwd_v$i.o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$BUILD"/attn_*.ptxas > "$OUT/ptxas.txt" 2>/dev/null
grep -E "error" "$OUT/ptxas.txt" && status=1
CPU_OBJS="$BUILD/cpu_attn.o $BUILD/cpu_attn_merge.o $BUILD/cpu_attn_params.o $BUILD/error.o"
OBJS="$BUILD/attn_fwd.o $BUILD/attn_bwd.o $BUILD/attn_merge.o $CPU_OBJS"
$NVCC $FLAGS "$BUILD/attn_check.o" $OBJS -o "$BUILD/attn_check" -lm || status=1
$NVCC $FLAGS "$BUILD/attn_bench.o" $OBJS -o "$BUILD/attn_bench" -lm || status=1
for i in "${!VARIANTS[@]}"; do
  for t in check bench; do
    $NVCC $FLAGS "$BUILD/attn_$t.o" "$BUILD/attn_fwd_v$i.o" "$BUILD/attn_bwd_v$i.o" "$BUILD/attn_merge.o" $CPU_OBJS \
      -o "$BUILD/attn_${t}_v$i" -lm || status=1
  done
done
if [ $status -ne 0 ]; then log "BUILD FAILED"; exit 1; fi
awk '/Compiling entry/ {f = $7} /spill stores/ {sp = $5 "B spill"} /Used [0-9]+ registers/ {print $5, "regs", sp, f}' \
  "$OUT/ptxas.txt" | (c++filt 2>/dev/null || cat) | tee -a "$OUT/summary.txt"

log "checker, all cases ($(date +%T))"
timeout 240 "$BUILD/attn_check" > "$OUT/check.txt" 2>&1 || status=1
grep -E "^FAIL|passed" "$OUT/check.txt" | tee -a "$OUT/summary.txt"
grep -q passed "$OUT/check.txt" || tail -5 "$OUT/check.txt" | tee -a "$OUT/summary.txt"

if [ -z "${QUICK:-}" ] && ! [ -x "$(command -v "$SAN")" ]; then
  log "compute-sanitizer not found: sanitizer runs skipped"
elif [ -z "${QUICK:-}" ]; then
  log "compute-sanitizer memcheck, small set ($(date +%T))"
  timeout 150 "$SAN" --tool memcheck --error-exitcode 1 "$BUILD/attn_check" --small > "$OUT/memcheck.txt" 2>&1 || status=1
  tail -3 "$OUT/memcheck.txt" | tee -a "$OUT/summary.txt"
  log "compute-sanitizer racecheck, small set ($(date +%T))"
  timeout 150 "$SAN" --tool racecheck --racecheck-report hazard --error-exitcode 1 "$BUILD/attn_check" --small \
    > "$OUT/racecheck.txt" 2>&1 || status=1
  tail -3 "$OUT/racecheck.txt" | tee -a "$OUT/summary.txt"
fi

if [ -z "${NOBENCH:-}" ]; then
  log "bench ($(date +%T))"
  timeout 150 "$BUILD/attn_bench" ${QUICK:+--quick} 2>&1 | tee "$OUT/bench.txt" | tee -a "$OUT/summary.txt" || status=1
fi
for i in "${!VARIANTS[@]}"; do
  log "variant $i: ${VARIANTS[$i]%|*} ($(date +%T))"
  timeout 60 "$BUILD/attn_check_v$i" --filter d128/128 > "$OUT/check_v$i.txt" 2>&1 || status=1
  grep -E "^FAIL|passed" "$OUT/check_v$i.txt" | tee -a "$OUT/summary.txt"
  timeout 60 "$BUILD/attn_bench_v$i" --quick 2>&1 | tee "$OUT/bench_v$i.txt" | tee -a "$OUT/summary.txt" || status=1
done
exit $status
