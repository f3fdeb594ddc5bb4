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
# Writes $OUT/repl-spec.log, repl-cuda-1.txt, repl-cuda-2.txt and
# repl-logs.tgz. About 3-5 minutes with the build.
set -u
OUT="${OUT:-/tmp/distlab-out}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  echo "commit: ${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
} | tee "$OUT/repl-spec.log"

t0=$(date +%s)
timeout 300 ./distlab build 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 )) s"

DISTLAB_SPEC_RANKS=2 timeout 300 ./distlab test spec/repl_spec.lua >>"$OUT/repl-spec.log" 2>&1
echo "spec (exit $?): $(tail -n 1 "$OUT/repl-spec.log")"
timeout 120 luajit spec/repl/transcript.lua cuda 1 >"$OUT/repl-cuda-1.txt" 2>&1
echo "transcript, 1 rank (exit $?)"
timeout 180 luajit spec/repl/transcript.lua cuda 2 >"$OUT/repl-cuda-2.txt" 2>&1
echo "transcript, 2 ranks on one GPU (exit $?)"
tar -czf "$OUT/repl-logs.tgz" -C "$OUT" repl-spec.log repl-cuda-1.txt repl-cuda-2.txt
