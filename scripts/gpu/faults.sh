#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried) for issue 24,
# "nothing silently wrong", on one GPU with ranks sharing it (the ipc
# communicator, symmetric buffers over CUDA IPC), in BUDGET seconds
# (default 470):
#   1. build;
#   2. the all-reduce kernels still right with their call descriptors: every
#      algorithm, dtype and size against the fp64 sum, and 300 calls back to
#      back (2 ranks);
#   3. mismatched all-reduce calls (sizes, dtypes, algorithms) fail at once on
#      every rank, naming what differs (the #multigpu mismatch specs);
#   4. the kill trials of spec/faults_spec.lua on cuda: per op (collectives,
#      custom all-reduce, CP, debug mode, symmetric flags, overlap) TRIALS
#      trials (default 20), alternately 2 and 3 ranks, a rank killed mid-op;
#      every survivor must fail within 1 s naming the death, and the
#      launcher must name the dead rank. Each op's slowest survivor goes to
#      the summary.
# Every step runs under `timeout` with the smaller of its own limit and what
# is left of BUDGET (a step with under 5 s left is skipped and fails the
# run). MPS stays off unless MPS=1 (the contexts take turns on the GPU). A
# job of ranks is killed after DISTLAB_JOB_TIMEOUT (60 s). Outputs:
# $OUT/faults-summary.txt and $OUT/faults-logs.tgz (every log), packed however
# the script ends; exit status non-zero when a step failed.
# DISTLAB_COMMIT=<hash> names the commit where the checkout has no .git.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" faults 470 || exit 2
export DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-60}"
TRIALS="${TRIALS:-20}"
header
say "kernel: $(uname -r); trials per op: $TRIALS; budget: $BUDGET s"
if [ "${MPS:-0}" = 1 ]; then mps_start; else say "MPS: not started (MPS=1 starts it)"; fi

step build 200 "$L/build.log" ./distlab build || exit 1

# ok lines: every rank of the job printed "<word> ok"
ranks_ok() {
  local log=$1 word=$2 n=$3
  [ "$(grep -c "$word ok" "$log")" = "$n" ] || { echo "expected $n '$word ok' lines" >>"$log"; return 1; }
}
step "allreduce correct (2 ranks, one GPU)" 60 "$L/ar-correct.log" \
  ./distlab run -n 2 --device cuda spec/allreduce/correct.lua && ranks_ok "$L/ar-correct.log" correct 2 || status=1
step "allreduce 300 calls back to back (2 ranks, one GPU)" 60 "$L/ar-backtoback.log" \
  ./distlab run -n 2 --device cuda spec/allreduce/backtoback.lua 300 && ranks_ok "$L/ar-backtoback.log" backtoback 2 || status=1
DISTLAB_SPEC_RANKS=2 step "allreduce mismatches (#multigpu, 2 ranks, one GPU)" 90 "$L/ar-mismatch.log" \
  ./distlab test --tags=multigpu --filter=mismatched spec/allreduce_spec.lua
grep -E "^(ok|FAIL|ERROR)" "$L/ar-mismatch.log" | head -6 | tee -a "$SUM"

for op in ${OPS:-collectives allreduce cp debug symm overlap}; do
  # one word: busted re-runs itself through a shell, joining its arguments with spaces
  SPEC_KILL_DEVICE=cuda SPEC_KILL_TRIALS=$TRIALS step "kill trials: $op ($TRIALS)" $((TRIALS * 12 + 20)) \
    "$L/kill-$op.log" ./distlab test "--filter=$op:" spec/faults_spec.lua
  grep -E "slowest survivor" "$L/kill-$op.log" | tee -a "$SUM"
  grep -E "^FAIL" -A8 "$L/kill-$op.log" | head -20 | tee -a "$SUM"
done
exit $status
