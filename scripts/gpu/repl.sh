#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried): the REPL on
# cuda, typed through a pseudo-terminal (spec/repl/pty.lua, no tmux).
#  1. spec/repl_spec.lua with its #gpu and #multigpu sessions: one rank on
#     cuda:0 (Ctrl-C at the prompt and in a loop queuing kernels: waited for,
#     then stopped, values kept; Tab completion; ?x on a cuda tensor and the
#     NCCL world; history), then DISTLAB_SPEC_RANKS=2 ranks sharing GPU 0
#     (the ipc communicator): :help on every rank, :ranks/:on, Ctrl-C on
#     every rank, a collective on one rank stopped by Ctrl-C twice (abort)
#     or by DISTLAB_TIMEOUT, :reset and a working collective. The cpu
#     sessions run too (the same file).
#  2. spec/repl/transcript.lua: the README's two sessions on cuda, screen as
#     typed (one rank; then 2 ranks on one GPU).
# Expect: the spec's last line "N passed, 0 failed, 0 skipped"; in
# repl-cuda-2.txt "[1] error: ..." after the second Ctrl-C (or the timeout),
# "a new world: comm 'w..' (ipc, 2 ranks, cuda)" and tensor([3.0000, ...]).
# Writes $OUT/repl-spec.log, repl-cuda-1.txt, repl-cuda-2.txt, the verdicts in
# $OUT/repl-summary.txt and repl-logs.tgz. About 3-5 minutes with the build (BUDGET 580 s).
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" repl 580 || exit 2
header
step build 300 "$L/build.log" ./distlab build || exit 1
DISTLAB_SPEC_RANKS=2 step "repl_spec (#gpu, #multigpu: 2 ranks on one GPU)" 300 "$OUT/repl-spec.log" \
  ./distlab test spec/repl_spec.lua
step "transcript, 1 rank" 120 "$OUT/repl-cuda-1.txt" luajit spec/repl/transcript.lua cuda 1
step "transcript, 2 ranks on one GPU" 180 "$OUT/repl-cuda-2.txt" luajit spec/repl/transcript.lua cuda 2
cp "$OUT/repl-spec.log" "$OUT/repl-cuda-1.txt" "$OUT/repl-cuda-2.txt" "$L/" 2>/dev/null
exit $status
