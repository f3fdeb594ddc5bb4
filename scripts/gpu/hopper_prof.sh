#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host: Nsight Compute on one launch of the hopper lab's forward
# (experiments/lab/attn/hopper/fwd.cu), for where its time goes. Env: PIPE (1), S (8192), WINDOW
# (-1,-1), B (2), H (16), MERGE ("": the plain step; f32 or bf16: the fused merge into a running out
# of that dtype, the launch fwd.cu --merge makes after the plain step's 3 (f32) or 6 (bf16), with
# no warm-up or timing loop). Writes under $OUT: prof.txt (speed of light, warp states, scheduler,
# pipes), sass.csv (per-instruction stall samples), build.log.
set -uo pipefail
t_start=$(date +%s)
OUT=${OUT:-/tmp/hopper-prof} LAYOUT=flat SUM_NAME=summary.txt
source "$(dirname "$0")/steps.sh" hopper_prof 590 || exit 2
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
BIN=/tmp/hopper_fwd
nvcc -Ikernels -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" \
  experiments/lab/attn/hopper/fwd.cu >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
ARGS="--b ${B:-2} --h ${H:-16} --s ${S:-8192} --pipe ${PIPE:-1} --window ${WINDOW:--1,-1} --iters 1"
# fwd.cu's launches with --iters 1 and no warm-up: the first run, then 2 a timing (the plain step; with
# --merge then per dtype f32, bf16: 2 timed and one checked)
case "${MERGE:-}" in
  "") SKIP=0 ;;
  f32) SKIP=3 ARGS="$ARGS --merge --warm-ms 0 --min-ms 0" ;;
  bf16) SKIP=6 ARGS="$ARGS --merge --warm-ms 0 --min-ms 0" ;;
  *) echo "MERGE is f32, bf16 or unset" >&2; exit 2 ;;
esac
echo "commit ${DISTLAB_COMMIT:-unknown}; $BIN $ARGS (launch $SKIP of fwd_kernel)" >"$OUT/prof.txt"
timeout 400 "$NCU" --kernel-name regex:fwd_kernel --launch-skip "$SKIP" --launch-count 1 --set full --import-source yes \
  -o /tmp/prof -f "$BIN" $ARGS >>"$OUT/prof.txt" 2>&1
echo "ncu rc $?" >>"$OUT/prof.txt"
"$NCU" -i /tmp/prof.ncu-rep --page details --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy >>"$OUT/prof.txt" 2>&1
"$NCU" -i /tmp/prof.ncu-rep --page source --csv --print-source sass >"$OUT/sass.csv" 2>&1
echo "source page rc $?" >>"$OUT/prof.txt"
