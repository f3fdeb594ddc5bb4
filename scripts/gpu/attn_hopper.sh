#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (repo root as cwd, .debs and .deps carried): dl.attn with
# the Hopper kernels inside it (issue 19), in one call:
#   1. ./distlab build;
#   2. spec/attn_spec.lua, attn_merge_spec.lua and seq_spec.lua with the #gpu specs (every
#      layout, mask, window, GQA/MQA and thd case, also at d 128 bf16, where the Hopper kernels run,
#      against the cpu twin; and that they are the kernels taken), with the Hopper backward on
#      (DISTLAB_ATTN_HOPPER_BWD, default 1 here: it is opt-in until these specs pass on it);
#   3. experiments/attn/attn_bench.lua at S (default 8192,16384): with the Hopper kernels, then with
#      DISTLAB_ATTN_HOPPER=0 (the portable ones), the A/B at the dl.attn level.
# Logs and tables under $OUT (attn-spec.log, hopper/, portable/).
set -uo pipefail
OUT="${OUT:-/tmp/distlab-out}"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
export DISTLAB_ATTN_HOPPER_BWD="${DISTLAB_ATTN_HOPPER_BWD:-1}"
mkdir -p "$OUT/hopper" "$OUT/portable"
status=0
echo "commit ${DISTLAB_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
./distlab build 2>&1 | tail -3 >"$OUT/build.log" || status=1
echo "== specs ($(date +%T))"
timeout 300 busted --run=default --exclude-tags=multigpu -o spec/support/summary.lua \
  spec/attn_spec.lua spec/attn_merge_spec.lua spec/seq_spec.lua >"$OUT/attn-spec.log" 2>&1 || status=1
grep -E "^(FAIL|ERROR)" "$OUT/attn-spec.log" | head -20
tail -n 1 "$OUT/attn-spec.log"
for k in hopper portable; do
  echo "== attn_bench, $k ($(date +%T))"
  env $([ $k = portable ] && echo DISTLAB_ATTN_HOPPER=0) timeout 200 ./distlab run -n 1 --device cuda \
    experiments/attn/attn_bench.lua --s "${S:-8192,16384}" --out "$OUT/$k" --tag "$k" >"$OUT/$k/bench.log" 2>&1 || status=1
  grep -E "^(ours|cudnn) " "$OUT/$k/bench.log" | head -20
done
exit $status
