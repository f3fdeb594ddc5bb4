#!/usr/bin/env bash
# A CUDA graph holding NCCL all-reduces, replayed, then the process ends:
# where does the exit hang? (spec/allreduce/graph.lua with SPEC_ALGOS=nccl;
# DISTLAB_TRACE_TEARDOWN prints each teardown step). Variants by env.
export NCCL_NVLS_ENABLE=0
source scripts/gpu/setup.sh >/dev/null 2>&1
./distlab build 2>&1 | tail -1
mkdir -p "$OUT/diag"
for v in "${@:-a:X=1}"; do
  n=${v%%:*} e=${v#*:}
  echo "== graph nccl $n ($e)"
  env $e DISTLAB_TRACE_TEARDOWN=1 SPEC_ALGOS=nccl SPEC_VERBOSE=1 SPEC_TIMEOUT=5 timeout 40 \
    ./distlab run -n 2 --device cuda --timeout 30 spec/allreduce/graph.lua 2 >"$OUT/diag/$n.log" 2>&1
  echo "rc $?"
  grep -E "teardown|graph ok|barrier done|timed out" "$OUT/diag/$n.log" | tail -16 | cut -c1-200
done
