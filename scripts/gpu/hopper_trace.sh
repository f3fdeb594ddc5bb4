#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host for issue 19's fused-merge cost: where a CTA's time goes, from
# the lab forward built with -DHP_FWD_TRACE=1 (fwd_kernel.cuh's hp_trace; experiments/lab/attn/hopper/
# fwd.cu --trace): bshd b=2 h=16 at 4k causal and dense and 8k causal, thd 2 x 4k causal, pipe 0, the
# plain step and the merges into f32 and bf16, each timed, checked and then traced once. The traced
# build's times are set beside the default build's (the trace's own cost). PROF=1 adds Nsight
# Compute on the plain step and the f32 merge at 4k causal (scripts/gpu/hopper_prof.sh).
# Everything under $OUT: summary.txt, trace.csv, the logs; out.tgz holds them all.
set -uo pipefail
t_start=$(date +%s)
OUT=${OUT:-/tmp/hopper-trace} LAYOUT=flat SUM_NAME=summary.txt
source "$(dirname "$0")/steps.sh" hopper_trace 590 || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$SUM"
say "commit: ${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
for v in plain trace; do
  flags=$([ $v = trace ] && echo -DHP_FWD_TRACE=1)
  nvcc -DLAB_D=128 $flags -Ikernels -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
    -o /tmp/hopper_fwd_$v experiments/lab/attn/hopper/fwd.cu >"$OUT/build-$v.log" 2>&1 || { say "build $v FAILED"; tail "$OUT/build-$v.log"; exit 1; }
  grep -A2 fwd_kernel "$OUT/build-$v.log" | grep -E "registers|spill" | sed "s/^/$v: /" | tee -a "$SUM"
done
: >"$OUT/trace.csv"
for round in $(seq ${ROUNDS:-1}); do
  for v in plain trace; do
    tr=$([ $v = trace ] && echo "--trace $OUT/trace.csv")
    { echo "== round $round: $v"
      timeout 120 /tmp/hopper_fwd_$v --check --merge --s 4096,8192 --window -1,0 --pipe 0 --iters 20 $tr
      timeout 120 /tmp/hopper_fwd_$v --check --merge --s 4096 --window -1,-1 --pipe 0 --iters 20 $tr
      timeout 120 /tmp/hopper_fwd_$v --check --merge --h 16 --thd 4096,4096 --window -1,0 --pipe 0 --iters 20 $tr
    } >>"$OUT/trace.log" 2>&1
  done
done
grep -E "^==|TFLOP|merged into|trace |check:" "$OUT/trace.log" | tee -a "$SUM"
if [ -n "${PROF:-}" ]; then
  for m in "" f32; do
    OUT="$OUT/prof-${m:-plain}" MERGE=$m S=4096 WINDOW=-1,0 PIPE=0 bash scripts/gpu/hopper_prof.sh >/dev/null 2>&1
    say "prof ${m:-plain}: $(tail -1 "$OUT/prof-${m:-plain}/prof.txt")"
  done
fi
tar czf /tmp/out.tgz -C "$OUT" . && mv /tmp/out.tgz "$OUT/out.tgz"
