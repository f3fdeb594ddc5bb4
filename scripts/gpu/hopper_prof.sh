#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host: Nsight Compute on one launch of the hopper lab's forward
# (experiments/lab/attn/hopper/fwd.cu), for where its time goes. Env: PIPE (1), S (8192), WINDOW
# (-1,-1), B (2), H (16). Writes under $OUT: prof.txt (speed of light, warp states, scheduler,
# pipes), sass.csv (per-instruction stall samples), build.log.
set -uo pipefail
OUT="${OUT:-/tmp/hopper-prof}"
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
BIN=/tmp/hopper_fwd
nvcc -Ikernels -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" \
  experiments/lab/attn/hopper/fwd.cu >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
ARGS="--b ${B:-2} --h ${H:-16} --s ${S:-8192} --pipe ${PIPE:-1} --window ${WINDOW:--1,-1} --iters 1"
echo "commit ${DISTLAB_COMMIT:-unknown}; $BIN $ARGS" >"$OUT/prof.txt"
timeout 400 "$NCU" --kernel-name regex:fwd_kernel --launch-count 1 --set full --import-source yes \
  -o /tmp/prof -f "$BIN" $ARGS >>"$OUT/prof.txt" 2>&1
echo "ncu rc $?" >>"$OUT/prof.txt"
"$NCU" -i /tmp/prof.ncu-rep --page details --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy >>"$OUT/prof.txt" 2>&1
"$NCU" -i /tmp/prof.ncu-rep --page source --csv --print-source sass >"$OUT/sass.csv" 2>&1
echo "source page rc $?" >>"$OUT/prof.txt"
