#!/usr/bin/env bash
# Remote step on a GPU host for issue 4, from the repo root after the build
# (`scripts/gpu/check.sh attn` builds, then runs this):
#   1. spec/attn_spec.lua, attn_merge_spec.lua and seq_spec.lua with the #gpu specs (the CUDA
#      kernels against the cpu twin on the same inputs);
#   2. PyTorch SDPA (flash and cuDNN backends), then dl.attn, on the same
#      shapes in this one run (experiments/attn/attn_bench_torch.py, attn_bench.lua);
#   3. attn-<gpu>.md (e.g. attn-h200.md) assembled from both.
# Logs and tables land in $OUT (logs in $OUT/attn-logs.tgz) and in experiments/results/attn/;
# the short comparison table is printed last. Exit status non-zero if a step failed (a failed
# data check included); all of it within BUDGET (default 580 s). DISTLAB_COMMIT=<hash> names
# the commit in the results where the checkout has no .git.
set -uo pipefail
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn 580 || exit 2
mkdir -p experiments/results/attn
tag=$(gpu_tag)

step "attn specs, #gpu included" 240 "$L/attn-spec.log" busted --run=default --exclude-tags=multigpu \
  -o spec/support/summary.lua spec/attn_spec.lua spec/attn_merge_spec.lua spec/seq_spec.lua
grep -E "^(FAIL|ERROR)" "$L/attn-spec.log" | head -20

step "PyTorch SDPA" 240 "$L/attn-torch.log" python3 experiments/attn/attn_bench_torch.py --out "$OUT"
grep -vi "warn" "$L/attn-torch.log" | tail -n 20

step "dl.attn" 300 "$L/attn-bench.log" ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua --out "$OUT" \
  --torch "$OUT/attn-torch.csv" --tag "$tag"
sed -n '1,/^$/p' "$L/attn-bench.log"
cp "$OUT"/attn-*.md "$OUT"/attn-*.csv experiments/results/attn/ 2>/dev/null
say "tables: $OUT/attn-$tag.md"
sed -n '/^TFLOP\/s fwd\/bwd/,$p' "$L/attn-bench.log"
exit $status
