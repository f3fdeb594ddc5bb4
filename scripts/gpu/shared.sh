#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried): every
# multi-rank GPU spec (#multigpu: communicators, symmetric buffers, every
# all-reduce algorithm with 1000 back-to-back calls and graph replays, the CP
# schedules) with ranks sharing the GPUs: RANKS="2 4" ranks (default), on one
# GPU or however many the host has (fewer than the ranks). Ranks that share a
# GPU talk through the ipc communicator (core/comm/comm_ipc.c).
# MPS: started when MPS=1 (default) and nvidia-cuda-mps-control is found
# (root); MPS=0 runs without it (the contexts then take turns on the GPU).
# Each spec file runs under FILE_TIMEOUT seconds (default 300).
# Writes $OUT/shared-<n>-<spec>.log and $OUT/shared-gpu.txt (machine, MPS,
# commit and the summary line of every run). About 5-10 minutes.
set -u
OUT="${OUT:-/tmp/distlab-out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
SUM="$OUT/shared-gpu.txt"
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "commit: ${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
} | tee "$SUM"

mps_on=0
if [ "${MPS:-1}" = 1 ]; then
  ctl="$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)"
  if [ -n "$ctl" ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/distlab-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/distlab-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    "$ctl" -d && mps_on=1
    trap 'echo quit | "$ctl" >/dev/null 2>&1' EXIT
    # the launcher looks for the daemon by name: make sure it shows under it
    export PATH="$(dirname "$ctl"):$PATH"
  fi
fi
echo "MPS: $([ $mps_on = 1 ] && echo "running ($ctl)" || echo "not running (MPS=${MPS:-1})")" | tee -a "$SUM"

t0=$(date +%s)
./distlab build 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"

for n in ${RANKS:-2 4}; do
  for f in ${SPECS:-spec/comm_spec.lua spec/symm_spec.lua spec/allreduce_spec.lua spec/cp_spec.lua}; do
    log="$OUT/shared-$n-$(basename "$f" .lua).log"
    t1=$(date +%s)
    DISTLAB_SPEC_RANKS=$n timeout "${FILE_TIMEOUT:-300}" \
      ./distlab test --tags=multigpu "$f" >"$log" 2>&1
    rc=$?
    line="$n ranks $(basename "$f"): $(tail -n 1 "$log")$([ $rc = 124 ] && echo ' TIMED OUT') ($(( $(date +%s) - t1 )) s)"
    echo "$line" | tee -a "$SUM"
    grep -E "^(FAIL|ERROR)" "$log" | head -8
  done
done
