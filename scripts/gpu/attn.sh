#!/usr/bin/env bash
# Remote step on a GPU host for issue 4, from the repo root after the build
# (`scripts/gpu/check.sh attn` builds, then runs this):
#   1. spec/attn_spec.lua, attn_merge_spec.lua and seq_spec.lua with the #gpu specs (the CUDA
#      kernels against the cpu twin on the same inputs);
#   2. PyTorch SDPA (flash and cuDNN backends), then dl.attn, on the same
#      shapes in this one run (experiments/attn/attn_bench_torch.py, attn_bench.lua);
#   3. attn-<gpu>.md (e.g. attn-h200.md) assembled from both.
# Logs and tables land in $OUT and in experiments/results/attn/; the short
# comparison table is printed last. Exit status non-zero if a step failed
# (a failed data check included). DISTLAB_COMMIT=<hash> names the commit in
# the results where the checkout has no .git.
set -uo pipefail
OUT="${OUT:-/tmp/distlab-out}"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
mkdir -p "$OUT" experiments/results/attn
status=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
tag=$(echo "$gpu" | grep -oiE 'h100|h200|b200|a100|l40s' | head -1 | tr '[:upper:]' '[:lower:]')
tag=${tag:-gpu}

echo "== attn specs, #gpu included ($(date +%T))"
timeout 240 busted --run=default --exclude-tags=multigpu -o spec/support/summary.lua \
  spec/attn_spec.lua spec/attn_merge_spec.lua spec/seq_spec.lua >"$OUT/attn-spec.log" 2>&1 || status=1
grep -E "^(FAIL|ERROR)" "$OUT/attn-spec.log" | head -20
tail -n 1 "$OUT/attn-spec.log"

echo "== PyTorch SDPA ($(date +%T))"
timeout 240 python3 experiments/attn/attn_bench_torch.py --out "$OUT" >"$OUT/attn-torch.log" 2>&1 || status=1
grep -vi "warn" "$OUT/attn-torch.log" | tail -n 20

echo "== dl.attn ($(date +%T))"
timeout 300 ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua --out "$OUT" \
  --torch "$OUT/attn-torch.csv" --tag "$tag" >"$OUT/attn-bench.log" 2>&1 || status=1
sed -n '1,/^$/p' "$OUT/attn-bench.log"
cp "$OUT"/attn-*.md "$OUT"/attn-*.csv experiments/results/attn/ 2>/dev/null
echo "== done, status $status ($(date +%T)); tables: $OUT/attn-$tag.md"
sed -n '/^TFLOP\/s fwd\/bwd/,$p' "$OUT/attn-bench.log"
exit $status
