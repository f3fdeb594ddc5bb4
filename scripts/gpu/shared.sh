#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried): every
# multi-rank GPU spec (#multigpu: communicators, symmetric buffers, every
# all-reduce algorithm with 1000 back-to-back calls and graph replays, the CP
# schedules) with ranks sharing the GPUs: RANKS="2 4" ranks (default), on one
# GPU or however many the host has (fewer than the ranks). Ranks that share a
# GPU talk through the ipc communicator (core/comm/comm_ipc.c).
# MPS: started when MPS=1 (default) and nvidia-cuda-mps-control is found
# (root); MPS=0 runs without it (the contexts then take turns on the GPU).
# Each spec file runs under FILE_TIMEOUT seconds (default 300), all of it within BUDGET
# (default 580). scripts/gpu/suite.sh runs these and every other spec, with 2, 4 and 8 ranks.
# Writes $OUT/shared-gpu.txt (machine, MPS, commit and the summary line of every run) and
# every log in $OUT/shared-logs.tgz (shared/<n>-<spec>.log). About 5-10 minutes.
set -u
t_start=$(date +%s)
SUM_NAME=shared-gpu.txt
source "$(dirname "$0")/steps.sh" shared 580 || exit 2
header
if [ "${MPS:-1}" = 1 ]; then mps_start; else say "MPS: not running (MPS=0)"; fi
build_or_skip || exit 1

for n in ${RANKS:-2 4}; do
  for f in ${SPECS:-spec/comm_spec.lua spec/symm_spec.lua spec/allreduce_spec.lua spec/cp_spec.lua}; do
    log="$L/$n-$(basename "$f" .lua).log"
    DISTLAB_SPEC_RANKS=$n step "$n ranks $(basename "$f")" "${FILE_TIMEOUT:-300}" "$log" \
      ./distlab test --tags=multigpu "$f"
    grep -E "^(FAIL|ERROR)" "$log" | head -8
  done
done
exit $status
