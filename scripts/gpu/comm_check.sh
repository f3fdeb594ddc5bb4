#!/usr/bin/env bash
# Remote step on a host with 2 GPUs (repo root as cwd, .debs carried): the
# communicator checks in one go, everything under $OUT.
#   scripts/gpu/comm_check.sh [specs] [hostcost] [bench]   (default specs bench; alone, or as
#                                               `scripts/gpu/check.sh comm_check`)
# Each step has its own time limit, all together within BUDGET (default 590 s).
# 1. the #multigpu specs of comm and symm (NCCL, CUDA IPC)   -> $OUT/comm_specs.log
# 2./3. experiments/lab/nccl_loop.c (plain C over NCCL) and
#    experiments/comm/comm_bench.lua, ROUNDS (default 1) rounds of loop, distlab,
#    distlab, loop; each side's fastest run per size -> $OUT/results/comm-<gpu>x2.{md,csv}
#    (a round takes about two minutes; distlab's runs also time raw NCCL
#    calls on the same communicator, --raw); BIND=FIRST:PER pins rank r of both to
#    cores FIRST + r*PER .. (the small sizes are host-bound: the issue rate
#    of one core)
# 4. up to 64 MiB again with the NCCL watchdog off, to show what it costs
#    (NOWD=0 skips it)                                       -> $OUT/results/comm-<gpu>x2-nowatchdog.*
# Verdicts in $OUT/comm_check-summary.txt, logs in $OUT/comm_check-logs.tgz.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); nothing here calls cuMulticastCreate.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" comm_check 590 || exit 2
mkdir -p "$OUT/results"
export NCCL_NVLS_ENABLE=0
STEPS="${*:-specs bench}"

CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
{
  header
  nvidia-smi topo -m 2>/dev/null | head -5
  grep -h -m3 -E '#define NCCL_(MAJOR|MINOR|PATCH)' /usr/include/nccl.h "$CUDA_HOME/include/nccl.h" 2>/dev/null
} | tee "$OUT/comm_machine.txt"
step build 240 "$OUT/comm_build.log" ./distlab build || exit 1

if want specs; then
  step "multigpu specs" 240 "$OUT/comm_specs.log" busted --run=default --tags=multigpu -o spec/support/summary.lua \
    spec/comm_spec.lua spec/symm_spec.lua
  tail -25 "$OUT/comm_specs.log"
fi
if want hostcost; then
  say "host cost of a call without transport (meta); clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
  step "host cost" 60 "$OUT/comm_host_cost.txt" ./distlab run --device meta --world 2 --rank 0 ${BIND:+--bind "${BIND%%:*}:1"} \
    experiments/comm/comm_host_cost.lua --calls 200000 --out "$OUT/results"
  cat "$OUT/comm_host_cost.txt"
fi
want bench || exit $status

nccl_lib=""
for d in /usr/lib/x86_64-linux-gnu "$CUDA_HOME/lib64" \
  $("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null); do
  [ -e "$d/libnccl.so.2" ] && { nccl_lib="$d"; break; }
done
step "plain C loop over NCCL (build)" 60 "$OUT/nccl_loop_build.log" gcc -O2 -o "$OUT/nccl_loop" experiments/lab/nccl_loop.c \
  -I/usr/include -I"$CUDA_HOME/include" -L"$CUDA_HOME/lib64" ${nccl_lib:+-L"$nccl_lib" -Wl,-rpath,"$nccl_lib"} \
  -lcudart -l:libnccl.so.2
# ROUNDS (default 1) rounds in ABBA order (loop, distlab, distlab, loop):
# each side keeps its fastest run per op and size. Clocks drift over a call
# (later runs were slower), and ABBA gives both sides the same mean position.
tag="$(gpu_tag)x2"
loops=() runs=()
loop() {
  step "plain loop run $1" 120 "$L/nccl_loop$1.log" "$OUT/nccl_loop" -n 2 -b 8 -e 1073741824 -o "$OUT/nccl_loop$1.csv" \
    ${BIND:+-c "$BIND"}
  tail -5 "$L/nccl_loop$1.log"
  loops+=("$OUT/nccl_loop$1.csv")
}
bench() {
  step "distlab comm_bench run $1" 180 "$OUT/comm_bench$1.log" ./distlab run -n 2 --device cuda ${BIND:+--bind "$BIND"} \
    experiments/comm/comm_bench.lua -b 8 -e 1G --raw --tag "$tag-r$1" --compare "$OUT/nccl_loop1.csv" --out "$OUT/round$1"
  tail -2 "$OUT/comm_bench$1.log"
  runs+=("$OUT/round$1/comm-$tag-r$1.csv")
}
for ((r = 0; r < ${ROUNDS:-1}; r++)); do
  loop $((2 * r + 1)); bench $((2 * r + 1)); bench $((2 * r + 2)); loop $((2 * r + 2))
done
# the table: every distlab run against every loop run (the written CSV holds the merged figures)
merge=$(IFS=,; echo "${runs[*]:1}")
step "the table" 60 "$L/report.log" ./distlab run --device cpu experiments/comm/comm_bench.lua --ranks 2 \
  --report-only "${runs[0]}" --merge "$merge" --compare "$(IFS=,; echo "${loops[*]}")" \
  --tag "$tag" --out "$OUT/results" --device-name "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
cp "${loops[-1]}" "$OUT/nccl_loop.csv" # the last plain-loop run, as a readable table below
column -s, -t "$OUT/nccl_loop.csv" 2>/dev/null | head -200 >"$OUT/nccl_loop.txt"
tail -4 "$OUT"/results/comm-*x2.md

[ "${NOWD:-1}" = 0 ] && exit $status
step "mid sizes with the NCCL watchdog off (does the watchdog cost bandwidth?)" 90 "$OUT/comm_bench_nowatchdog.log" \
  env DISTLAB_NCCL_WATCHDOG=0 ./distlab run -n 2 --device cuda experiments/comm/comm_bench.lua -b 8 -e 64M \
  --ops all_reduce,reduce_scatter,all_to_all --compare "$(IFS=,; echo "${loops[*]}")" \
  --out "$OUT/results" --tag "$tag-nowatchdog"
tail -4 "$OUT/comm_bench_nowatchdog.log"
say "comm_check done: results in $OUT/results, specs in $OUT/comm_specs.log"
exit $status
