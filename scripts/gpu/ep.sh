#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried) for issue 16,
# the expert-parallel dispatch/combine: everything on ONE GPU
# (CUDA_VISIBLE_DEVICES=0, ranks sharing it) in BUDGET seconds (default 480),
# on scripts/gpu/steps.sh (budgeted steps, summary, packed logs, MPS):
#   1. build;
#   2. MPS started (as scripts/gpu/shared.sh does; MPS=0 skips it and the
#      ranks' contexts take turns on the GPU);
#   3. spec/ep_spec.lua's #multigpu specs with 2 ranks sharing the GPU: the
#      rank scripts of the cpu specs on cuda (every layout, output and dtype
#      checked against every rank's inputs and fp64 sums, T = 0, 1, 16, ids
#      of -1, all experts on one rank, fp8 within its bound, planted 2%
#      errors caught, ep:bytes() against the formula; 1000 calls back to
#      back with new data and layouts; CUDA-graph replays with new data among
#      eager calls), a peer that never comes (the kernel ends by itself,
#      check() names phase, rank and peer) and a bad expert id (1 rank): 5 specs;
#   4. the same with 4 ranks sharing the GPU, less the two whose rank count
#      is fixed (their names hold "check()"): 3 specs;
#   5. the errors at the caller's line (T > B, dtypes, shapes, ...) on cuda, 1 rank;
#   6. the PyTorch anchor (experiments/ep/ep_bench_torch.py under torchrun, its
#      graph and eager modes), 2 ranks: gloo through host memory, since NCCL
#      refuses two ranks on one GPU, so nothing captured (a smoke run of its
#      plan and data check; the graphs run on 2 GPUs: scripts/gpu/multi.sh);
#   7. experiments/ep/ep_bench.lua, 2 ranks sharing the GPU: B 1 and 128,
#      E 16, both layouts, outputs and dtypes, the all_to_allv path and the
#      baseline's CSV merged, written under $OUT/ep/bench (the harness
#      writes nothing under experiments/results where ranks share a GPU);
#   8. only with STEPS holding "san": MPS stopped, compute-sanitizer memcheck
#      on spec/ep/correct.lua with SAN_RANKS ranks (default "1 2"; every
#      rank's luajit under the sanitizer, its log and the rank's stderr per
#      process). Not yet useful: on the H200 (a44d898..347a91a) 1 rank's NCCL
#      communicator setup hit cudaErrorNoKernelImageForDevice 4 times inside
#      NCCL under the sanitizer and was aborted after 20 s, before any ep
#      kernel; 2 ranks sharing the GPU ended within 4 s with exit 6 and
#      nothing on either rank's stderr: LuaJIT's compiled traces, which the
#      sanitizer's host backtraces cannot unwind (scripts/gpu/sanitizer.sh
#      runs luajit -joff for that; use it rather than this step).
# STEPS (default "specs bench") picks 3-5, 6-7 and 8.
# Expect "5 passed, 0 failed", "3 passed, 0 failed", "args done", torch lines
# with "#wrong 0", an ep_bench table whose #wrong column is all 0, status 0.
# Timings mean nothing here: this is a correctness and smoke run.
# Every step runs under `timeout` with the smaller of its own limit and what
# is left of BUDGET (under 5 s left: skipped, and the run fails); a job of
# ranks that outlives DISTLAB_JOB_TIMEOUT (90 s) is killed, a wait that never
# ends fails in DISTLAB_TIMEOUT (30 s).
# Outputs: $OUT/ep-summary.txt (the verdicts) and $OUT/ep-logs.tgz (every
# log, CSV and markdown). DISTLAB_COMMIT=<hash> names the commit where the
# checkout has no .git.
set -u
t_start=$(date +%s) # the budget counts from here: unpacking the .debs is part of it
source "$(dirname "$0")/steps.sh" ep 480 || exit 2
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" NCCL_NVLS_ENABLE=0
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-30}"
# every job of ranks the specs start ends within DISTLAB_JOB_TIMEOUT, hung or not
export DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-90}"

STEPS="${STEPS:-specs bench}"

header
say "steps: $STEPS"
step build 240 "$L/build.log" ./distlab build || exit 1
[ "${MPS:-1}" = 1 ] && mps_start

want specs && for n in 2 4; do
  filter=()
  # the timeout (2 ranks) and bad-id (1 rank) specs run their own rank count. One word:
  # busted re-runs itself under luajit through a shell, joining its arguments with spaces
  [ "$n" = 2 ] || filter=(--filter-out=check)
  DISTLAB_SPEC_RANKS=$n step "ep_spec #multigpu, $n ranks on one GPU" 150 "$L/ep-spec-$n.log" \
    ./distlab test --tags=multigpu ${filter[@]+"${filter[@]}"} spec/ep_spec.lua
  grep -E "^(ok|FAIL|ERROR)" "$L/ep-spec-$n.log" | head -12 | tee -a "$SUM"
done

if want specs; then
  step "ep bad input on cuda (1 rank)" 40 "$L/ep-args.log" ./distlab run -n 1 --device cuda spec/ep/fail.lua args
  grep -c "^ERR " "$L/ep-args.log" | sed 's/^/ERR lines: /' | tee -a "$SUM"
fi

if want bench; then
  port=$((20000 + RANDOM % 20000))
  step "ep_bench_torch (2 ranks, one GPU, gloo: nothing captured)" 120 "$L/torch.log" "$PY" -m torch.distributed.run \
    --nproc_per_node 2 --master_port "$port" experiments/ep/ep_bench_torch.py "$L/torch.csv" \
    --B 1,128 --experts 16 --iters 10 --warmup 3
  grep -E "^torch " "$L/torch.log" | tee -a "$SUM"
  torch_arg=()
  [ -s "$L/torch.csv" ] && torch_arg=(--torch "$L/torch.csv")
  step "ep_bench smoke (2 ranks, one GPU)" 120 "$L/bench.log" ./distlab run -n 2 --device cuda \
    experiments/ep/ep_bench.lua --B 1,128 --experts 16 --replays 10 --out "$L/bench" ${torch_arg[@]+"${torch_arg[@]}"} \
    --command "scripts/gpu/ep.sh (2 ranks sharing one GPU: a smoke run)"
  sed -n '/distlab ep_bench/,$p' "$L/bench.log" | head -40 | tee -a "$SUM"
fi

SANBIN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if want san && [ -n "$SANBIN" ]; then
  # the sanitizer and MPS clients do not mix: the ranks take turns on the GPU from here
  mps_stop
  sd="$L/sanitizer"
  mkdir -p "$sd"
  cat >"$sd/luajit" <<EOF
#!/bin/sh
exec "$SANBIN" --tool memcheck --error-exitcode 9 --log-file "$sd/rank-%p.log" luajit -joff "\$@" 2>"$sd/stderr-\$\$.log"
EOF
  chmod +x "$sd/luajit"
  for n in ${SAN_RANKS:-1 2}; do
    # the ipc communicator (CUDA IPC, no NCCL) also for 1 rank: NCCL's setup did not survive the sanitizer
    DISTLAB_COMM_BACKEND=ipc DISTLAB_JOB_TIMEOUT=150 LUAJIT="$sd/luajit" step "compute-sanitizer memcheck, correct.lua, $n ranks" 150 \
      "$L/sanitizer-$n.log" ./distlab run -n "$n" --device cuda spec/ep/correct.lua
  done
  for f in "$sd"/rank-*.log "$sd"/stderr-*.log; do
    [ -s "$f" ] && echo "$(basename "$f"): $(grep -E "ERROR SUMMARY|rror|PANIC|memory" "$f" | tail -2 | tr '\n' ' ')" | tee -a "$SUM"
  done
elif want san; then
  say "compute-sanitizer: not found here"
fi
exit $status
