#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried): build for sm_90
# and run the GPU checks. Everything it prints and writes lands in $OUT.
#   scripts/gpu/check.sh [foundation] [more sections as they exist...]
# Sections: foundation = the specs (gpu-tagged included), overhead benchmark
# (distlab and PyTorch eager: $OUT/overhead-<gpu>.{md,csv}, overhead-torch-<gpu>.*), demo;
# any other word runs scripts/gpu/<word>.sh. Within BUDGET (default 580 s); verdicts in
# $OUT/check-summary.txt, logs (test.log, launch_floor.txt, ...) in $OUT/check-logs.tgz. (The whole
# suite with ranks sharing the GPU, in one call: scripts/gpu/suite.sh.)
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" check 580 || exit 2
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(foundation)
header
nvcc --version | tail -1 | tee -a "$SUM"
step build 240 "$L/build.log" ./distlab build || exit 1

for s in "${sections[@]}"; do
  case "$s" in
    foundation)
      step "specs" 540 "$L/test.log" ./distlab test
      grep -v '^ok ' "$L/test.log" | tail -40
      step "overhead" 120 "$L/overhead.log" ./distlab run -n 1 --device cuda experiments/foundation/overhead.lua --out "$OUT"
      step "launch floor (build)" 60 "$L/launch_floor_build.log" nvcc -O2 -arch=sm_90 experiments/lab/launch_floor.cu -o /tmp/launch_floor &&
        step "launch floor" 60 "$L/launch_floor.txt" /tmp/launch_floor && cat "$L/launch_floor.txt"
      step "overhead, PyTorch" 120 "$L/overhead-torch.log" "$PY" experiments/foundation/overhead_torch.py --out "$OUT"
      step "demo" 120 "$L/demo.log" ./distlab demo
      tail -8 "$L/demo.log" ;;
    *)
      if [ -x "scripts/gpu/$s.sh" ]; then "scripts/gpu/$s.sh"; else say "unknown section $s"; status=1; fi ;;
  esac
done
exit $status
