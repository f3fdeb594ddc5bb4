#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried): build for sm_90
# and run the GPU checks. Everything it prints and writes lands in $OUT.
#   scripts/gpu/check.sh [foundation] [more sections as they exist...]
# Sections: foundation = the specs (gpu-tagged included), overhead benchmark
# (distlab and PyTorch eager: $OUT/overhead-<gpu>.{md,csv}, overhead-torch-<gpu>.*), demo.
set -u
OUT="${OUT:-/tmp/distlab-out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(foundation)

{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  nvcc --version | tail -1
} | tee "$OUT/machine.txt"

t0=$(date +%s)
./distlab build 2>&1 | tail -5 | tee "$OUT/build.log"
echo "build: $(( $(date +%s) - t0 )) s"

for s in "${sections[@]}"; do
  case "$s" in
    foundation)
      ./distlab test 2>&1 | tee "$OUT/test.log" | grep -v '^ok ' | tail -40
      ./distlab run -n 1 --device cuda experiments/foundation/overhead.lua --out "$OUT"
      nvcc -O2 -arch=sm_90 experiments/lab/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor | tee "$OUT/launch_floor.txt"
      python3 experiments/foundation/overhead_torch.py --out "$OUT"
      ./distlab demo 2>&1 | tail -8 ;;
    *)
      if [ -x "scripts/gpu/$s.sh" ]; then "scripts/gpu/$s.sh"; else echo "unknown section $s"; fi ;;
  esac
done
