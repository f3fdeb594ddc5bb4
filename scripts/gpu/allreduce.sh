#!/usr/bin/env bash
# Remote step on a host with 2 GPUs (repo root as cwd, .debs carried, the
# lead's build done): everything the all-reduce issue needs measured, in one
# run. Writes under $OUT/allreduce/ and prints the short table last.
#   scripts/gpu/allreduce.sh [specs] [torch] [sweep]      (default: all three)
#     specs  spec/allreduce_spec.lua with the #multigpu cases (2 GPUs)
#     torch  PyTorch anchors: experiments/allreduce_torch.py under torchrun
#     sweep  dl.allreduce.tune, then experiments/allreduce_sweep.lua (auto uses
#            the table just tuned; the torch CSV is merged), then the plot
# Results: allreduce-<gpu>x2.{md,csv,png}, -wide.csv, -tune.csv, the tuned
# table allreduce_tables.lua, logs; copy the md, csv and png to
# experiments/results/ (the md links the png by its bare name).
set -u
OUT="${OUT:-/tmp/distlab-out}"
R="$OUT/allreduce"
mkdir -p "$R"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-30}" # a hang fails in 30 s, not 120
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(specs torch sweep)
t_start=$(date +%s)
stamp() { echo "[allreduce.sh +$(( $(date +%s) - t_start )) s] $*"; }

{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -4
  nvcc --version 2>/dev/null | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 | tail -1
} >"$R/machine.txt"
cat "$R/machine.txt"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 2 ] || { echo "allreduce.sh: needs 2 GPUs, found $ngpu"; exit 2; }
[ -f build/lib/libdistlab.so ] || ./distlab build 2>&1 | tail -5
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1}"

for s in "${sections[@]}"; do
  case "$s" in
    specs)
      stamp "specs (cpu and 2 GPUs)"
      timeout 420 busted --run=default -o spec/support/summary.lua spec/allreduce_spec.lua >"$R/spec.log" 2>&1
      echo "specs exit code $?" >>"$R/spec.log"
      grep -v '^ok ' "$R/spec.log" | tail -30 ;;
    torch)
      stamp "PyTorch anchors"
      port=$((20000 + RANDOM % 20000))
      timeout 300 python3 -m torch.distributed.run --nproc_per_node 2 --master_port "$port" \
        experiments/allreduce_torch.py "$R/torch.csv" >"$R/torch.log" 2>&1
      echo "torch exit code $?" >>"$R/torch.log"
      tail -5 "$R/torch.log" ;;
    sweep)
      stamp "tune and sweep"
      rm -f "$R/allreduce_tables.lua"
      DISTLAB_AR_TABLE="$R/allreduce_tables.lua" timeout 480 ./distlab run -n 2 --device cuda \
        experiments/allreduce_sweep.lua --out "$R" --torch "$R/torch.csv" --tune "$R/allreduce_tables.lua" \
        --command "scripts/gpu/allreduce.sh (DISTLAB_AR_TABLE=allreduce_tables.lua, tuned in the same run)" \
        >"$R/sweep.log" 2>&1
      echo "sweep exit code $?" >>"$R/sweep.log"
      for wide in "$R"/allreduce-*-wide.csv; do
        [ -f "$wide" ] || continue
        if command -v gnuplot >/dev/null; then experiments/allreduce_plot.sh "$wide"
        else echo "no gnuplot on this host: make the PNG elsewhere with experiments/allreduce_plot.sh $(basename "$wide")"; fi
      done ;;
    *) echo "unknown section $s (specs, torch, sweep)" ;;
  esac
done
stamp "done"
if [ -f "$R/sweep.log" ]; then
  echo "---- targets"
  grep -A6 '^## Targets' "$R"/allreduce-*x2.md 2>/dev/null | grep '^- ' || tail -5 "$R/sweep.log"
  echo "---- short table (us per all-reduce)"
  sed -n '/^size  /,$p' "$R/sweep.log"
fi
