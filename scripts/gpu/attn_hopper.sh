#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (repo root as cwd, .debs and .deps carried): dl.attn with
# the Hopper kernels inside it (issue 19), in one call. STEPS (default "specs san torch bench"):
#   build  always: ./distlab build;
#   specs  spec/attn_spec.lua, attn_merge_spec.lua and seq_spec.lua with the #gpu specs (every
#          layout, mask, window, GQA/MQA and thd case, also at d 128 bf16, where the Hopper kernels
#          run, against the cpu twin; and that they are the kernels taken);
#   optout the attn and merge specs again with the paths that became defaults turned off
#          (DISTLAB_ATTN_HOPPER_MLA=0: MLA's 192/128 on the portable forward; DISTLAB_ATTN_HOPPER_BWD_TURNS=0:
#          the backward's warpgroups in step at d 64);
#   san    experiments/attn/hopper_small.lua (fwd + bwd at small shapes, d 64 and 128, against the
#          cpu twin) under compute-sanitizer memcheck and racecheck;
#   torch  PyTorch SDPA's flash and cuDNN (experiments/attn/attn_bench_torch.py) at S, the anchors;
#   bench  experiments/attn/attn_bench.lua at S (default 4096,8192,16384) for each of VARIANTS (default
#          "hopper portable": the Hopper kernels, DISTLAB_ATTN_HOPPER=0; and hopper-noturns: the backward's warpgroups in step (DISTLAB_ATTN_HOPPER_BWD_TURNS=0, d 64 only:
#          with D=64, the head dim of the bench and the anchors, default 128),
#          each with the anchors when torch ran: $OUT/<variant>/attn-<gpu>.md.
# Logs and tables (attn-spec.log, san-*.log, attn-torch.*, <variant>/) in $OUT/attn-hopper-logs.tgz, and
# the results file $OUT/hopper-dlattn-<gpu>.md (experiments/attn/hopper_report.py). With STEPS="torch bench"
# after STEPS="specs san", the second call's results file has no spec or sanitizer lines: take them from
# the first call's logs.
# About 10-12 minutes in all on an H200: split it as STEPS="specs san" then STEPS="torch bench" (a device
# call runs at most 600 s; the build stays between calls). A call returns at most 8 files, so every log goes
# to a scratch folder packed into $OUT/attn-hopper-logs.tgz however the script ends; $OUT also gets the
# results file.
set -uo pipefail
REAL_OUT="${OUT:-/tmp/distlab-out}"
OUT=/tmp/attn-hopper-logs
rm -rf "$OUT"
mkdir -p "$OUT" "$REAL_OUT"
pack() {
  tar czf "$REAL_OUT/attn-hopper-logs.tgz" -C "$OUT" . 2>/dev/null
  cp "$OUT"/hopper-dlattn-*.md "$REAL_OUT"/ 2>/dev/null
}
trap pack EXIT
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
STEPS="${STEPS:-specs san torch bench}"
want() { [[ " $STEPS " == *" $1 "* ]]; }
status=0
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
tag=$(echo "$gpu" | grep -oiE 'h100|h200' | head -1 | tr '[:upper:]' '[:lower:]')
echo "commit ${DISTLAB_COMMIT:-unknown}; $gpu; steps: $STEPS"
./distlab build 2>&1 | tail -3 >"$OUT/build.log" || status=1

if want specs; then
  echo "== specs ($(date +%T))"
  timeout 300 busted --run=default --exclude-tags=multigpu -o spec/support/summary.lua \
    spec/attn_spec.lua spec/attn_merge_spec.lua spec/seq_spec.lua >"$OUT/attn-spec.log" 2>&1 || status=1
  grep -E "^(FAIL|ERROR)" "$OUT/attn-spec.log" | head -20
  tail -n 1 "$OUT/attn-spec.log"
fi
if want optout; then # the same specs with the former paths: MLA's on the portable forward, the backward in step (d 64)
  echo "== specs, DISTLAB_ATTN_HOPPER_MLA=0 DISTLAB_ATTN_HOPPER_BWD_TURNS=0 ($(date +%T))"
  DISTLAB_ATTN_HOPPER_MLA=0 DISTLAB_ATTN_HOPPER_BWD_TURNS=0 timeout 300 busted --run=default --exclude-tags=multigpu \
    -o spec/support/summary.lua spec/attn_spec.lua spec/attn_merge_spec.lua >"$OUT/attn-spec-optout.log" 2>&1 || status=1
  grep -E "^(FAIL|ERROR)" "$OUT/attn-spec-optout.log" | head -20
  tail -n 1 "$OUT/attn-spec-optout.log"
fi

SANBIN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if want san && [ -n "$SANBIN" ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool, hopper_small.lua ($(date +%T))"
    w="$OUT/san-$tool"
    mkdir -p "$w"
    cat >"$w/luajit" <<EOF
#!/bin/sh
exec "$SANBIN" --tool $tool --error-exitcode 9 --log-file "$w/sanitizer-%p.log" luajit "\$@"
EOF
    chmod +x "$w/luajit"
    LUAJIT="$w/luajit" DISTLAB_JOB_TIMEOUT=280 timeout 300 ./distlab run -n 1 --device cuda \
      experiments/attn/hopper_small.lua >"$OUT/san-$tool.log" 2>&1 || status=1
    tail -n 3 "$OUT/san-$tool.log"
    grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$w"/sanitizer-*.log 2>/dev/null | sort | uniq -c
  done
elif want san; then
  echo "compute-sanitizer not found: sanitizer runs skipped"
fi

torch_csv=""
if want torch; then
  echo "== PyTorch SDPA ($(date +%T))"
  if timeout 300 python3 experiments/attn/attn_bench_torch.py --s "${S:-4096,8192,16384}" --d "${D:-128}" --out "$OUT" \
    >"$OUT/attn-torch.log" 2>&1; then
    torch_csv="$OUT/attn-torch.csv"
  else
    status=1
  fi
  grep -vi "warn" "$OUT/attn-torch.log" | tail -n 12
fi

if want bench; then
  for k in ${VARIANTS:-hopper portable}; do
    echo "== attn_bench, $k ($(date +%T))"
    mkdir -p "$OUT/$k"
    case $k in
      hopper) envs="" ;;
      hopper-noturns) envs="DISTLAB_ATTN_HOPPER_BWD_TURNS=0" ;;
      portable) envs="DISTLAB_ATTN_HOPPER=0" ;;
      *) echo "unknown variant $k"; status=1; continue ;;
    esac
    env $envs timeout 240 ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua \
      --s "${S:-4096,8192,16384}" --d "${D:-128}" --out "$OUT/$k" ${torch_csv:+--torch "$torch_csv" --tag "${tag:-gpu}"} \
      >"$OUT/$k/bench.log" 2>&1 || status=1
    grep -E "^(ours|cudnn) |backend ours" "$OUT/$k/bench.log" | head -20
    [ -n "$torch_csv" ] && sed -n '/^TFLOP\/s fwd\/bwd/,$p' "$OUT/$k/bench.log" | head -20
  done
fi
if want bench; then # the results file: every variant beside the anchors, issue 19's ratios
  python3 experiments/attn/hopper_report.py "$OUT" "$OUT/hopper-dlattn-${tag:-gpu}.md" \
    --commit "${DISTLAB_COMMIT:-unknown}" --date "$(date -u '+%Y-%m-%d %H:%M UTC')" >/dev/null || status=1
  sed -n '/^## /,$p' "$OUT/hopper-dlattn-${tag:-gpu}.md" | head -40
fi
echo "== done, status $status ($(date +%T))"
exit $status
