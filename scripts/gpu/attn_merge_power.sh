#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (issue 52 item 3): where the fused merge's cost comes from, cycles or
# the clock. Two parts, in one call:
#   ncu    Nsight Compute on experiments/attn/attn_merge_bench.lua (dl.attn's dispatch, the carried or built
#          library) at S (4096), few launches: every fwd_kernel's gpu__time_duration and sm__cycles_elapsed
#          with the clocks locked at base (ncu's default), so the merge's cost in cycles, without the power
#          cap's say; experiments/lab/attn/merge_power.py sets each timed merge beside the plain step's launches
#          around it (its RUNS merge launches between two runs of the plain step's kernel)
#   clock  the lab forward (experiments/lab/attn/hopper/fwd.cu, LAB_D 128, TREE: the merge's own loop; the lab's
#          plain step keeps the per-thread epilogue) at 4k causal, plain, f32 and bf16 merges each timed for
#          WARM_MS + MIN_MS and checked (--check: the plain step against fp64 with a planted 2% that must fail,
#          each merge against the plain step), with nvidia-smi sampling the SM clock, the power and the throttle reasons every
#          50 ms: merge_power.py averages each phase (its last two thirds) from the lab's line times
# Writes $OUT/attn-merge-power.md (both tables, the device, the commit, the commands) and the raw files in
# attn_merge_power-logs.tgz. STEPS (default "ncu clock"): the parts to run. LAB: a prebuilt lab binary
# (default: built here with nvcc). The forward's knobs (DISTLAB_ATTN_HOPPER_FWD_TMA_M=1, ...) in the
# environment reach the ncu part (dl.attn), and the results file names them. SKIP_BUILD as steps.sh's
# build_or_skip. BUDGET 240 s.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_merge_power 240 || exit 2
S="${S:-4096}" WARM_MS="${WARM_MS:-1500}" MIN_MS="${MIN_MS:-3000}" STEPS="${STEPS:-ncu clock}"
header
build_or_skip || exit 1
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
ncu_cmd=("$NCU" --target-processes all --kernel-name regex:fwd_kernel --metrics gpu__time_duration.sum,sm__cycles_elapsed.max
  --csv --log-file "$L/ncu.csv" ./distlab run -n 1 --device cuda experiments/attn/attn_merge_bench.lua --s "$S" --iters 3 --warm-ms 0 --min-ms 0
  --out "$L/bench")
want ncu && step "ncu: the merge bench's kernels at base clocks" 150 "$L/ncu-run.log" "${ncu_cmd[@]}"
LAB=${LAB:-}
if want clock && [ -z "$LAB" ]; then
  LAB=build/lab/hopper_fwd_merge
  mkdir -p build/lab
  step "lab forward build" 120 "$L/lab-build.log" nvcc -DLAB_D=128 -DHP_FWD_TREE=1 -Ikernels -std=c++17 -O3 \
    -gencode=arch=compute_90a,code=sm_90a -o "$LAB" experiments/lab/attn/hopper/fwd.cu
fi
lab_cmd=("$LAB" --check --merge --s 4096 --window -1,0 --pipe 2 --iters 20 --warm-ms "$WARM_MS" --min-ms "$MIN_MS")
if want clock; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader -lms 50 >"$L/smi.csv" &
  smi=$!
  sleep 1
  # each line of the lab's output with its time (the phases' ends)
  step "lab forward, plain and merges timed, clocks sampled" 90 "$L/lab.log" bash -c \
    "set -o pipefail; stdbuf -oL ${lab_cmd[*]} 2>&1 | while IFS= read -r l; do echo \"\$(date +%Y/%m/%d\ %H:%M:%S.%N) \$l\"; done"
  sleep 0.5
  kill "$smi" 2>/dev/null
  wait "$smi" 2>/dev/null
fi
{
  echo "# The fused merge's cost: cycles or clock ($(gpu_tag), $(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "- commit: \`${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}\`; $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,enforced.power.limit --format=csv,noheader)"
  echo "- ncu: \`${ncu_cmd[*]}\` ($("$NCU" --version | tail -1))"
  echo "- lab: \`${lab_cmd[*]}\` with \`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active -lms 50\`"
  echo "- made by: \`$(call_line 'S|WARM_MS|MIN_MS|STEPS|LAB|SKIP_BUILD|BUDGET')\`"
  echo
  "$PY" experiments/lab/attn/merge_power.py $(want ncu && echo --ncu "$L/ncu.csv") \
    $(want clock && echo --lab "$L/lab.log" --smi "$L/smi.csv")
} >"$OUT/attn-merge-power.md" 2>&1 || status=1
cat "$OUT/attn-merge-power.md"
exit $status
