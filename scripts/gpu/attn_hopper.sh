#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (repo root as cwd, .debs and .deps carried): dl.attn with
# the Hopper kernels inside it (issue 19), in one call. STEPS (default "specs san torch bench"):
#   build  always: ./distlab build;
#   specs  spec/attn_spec.lua, attn_merge_spec.lua and seq_spec.lua with the #gpu specs (every
#          layout, mask, window, GQA/MQA and thd case, also at d 128 bf16, where the Hopper kernels
#          run, against the cpu twin; and that they are the kernels taken);
#   optout the attn and merge specs again with the paths that became defaults turned off
#          (DISTLAB_ATTN_HOPPER_MLA=0: MLA's 192/128 on the portable forward; DISTLAB_ATTN_HOPPER_BWD_TURNS=0:
#          the backward's warpgroups in step at d 64; DISTLAB_ATTN_HOPPER_BWD_ORDER=0: the backward's earlier
#          GEMM order);
#   san    experiments/attn/hopper_small.lua (fwd + bwd at small shapes, d 64 and 128, against the
#          cpu twin) under compute-sanitizer memcheck and racecheck;
#   torch  PyTorch SDPA's flash and cuDNN (experiments/attn/attn_bench_torch.py) at S, the anchors;
#   bench  experiments/attn/attn_bench.lua at S (default 4096,8192,16384) for each of VARIANTS (default
#          "hopper portable": the Hopper kernels, DISTLAB_ATTN_HOPPER=0; hopper-oldorder: the backward's earlier
#          GEMM order, DISTLAB_ATTN_HOPPER_BWD_ORDER=0; and hopper-noturns: the backward's warpgroups in step (DISTLAB_ATTN_HOPPER_BWD_TURNS=0, d 64 only:
#          with D=64, the head dim of the bench and the anchors, default 128),
#          each with the anchors when torch ran: $OUT/<variant>/attn-<gpu>.md.
# Logs and tables (attn-spec.log, san-*.log, attn-torch.*, <variant>/) in $OUT/attn-hopper-logs.tgz, and
# the results file $OUT/hopper-dlattn-<gpu>.md (experiments/attn/hopper_report.py). With STEPS="torch bench"
# after STEPS="specs san", the second call's results file has no spec or sanitizer lines: take them from
# the first call's logs.
# About 10-12 minutes in all on an H200: split it as STEPS="specs san" then STEPS="torch bench" (a device
# call runs at most 600 s; the build stays between calls; BUDGET, default 1200 s, bounds the whole). Every
# log goes to $OUT/attn-hopper, packed into $OUT/attn-hopper-logs.tgz however the script ends, the
# verdicts to $OUT/attn-hopper-summary.txt; $OUT also gets the results file.
set -uo pipefail
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn-hopper 1200 || exit 2
trap 'cp "$L"/hopper-dlattn-*.md "$OUT"/ 2>/dev/null; steps_finish' EXIT
STEPS="${STEPS:-specs san torch bench}"
tag=$(gpu_tag)
say "commit ${DISTLAB_COMMIT:-unknown}; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); steps: $STEPS"
step build 300 "$L/build.log" ./distlab build

if want specs; then
  step "specs" 300 "$L/attn-spec.log" busted --run=default --exclude-tags=multigpu -o spec/support/summary.lua \
    spec/attn_spec.lua spec/attn_merge_spec.lua spec/seq_spec.lua
  grep -E "^(FAIL|ERROR)" "$L/attn-spec.log" | head -20
fi
if want optout; then # the same specs with the former paths: MLA's on the portable forward, the backward in step (d 64)
  DISTLAB_ATTN_HOPPER_MLA=0 DISTLAB_ATTN_HOPPER_BWD_TURNS=0 DISTLAB_ATTN_HOPPER_BWD_ORDER=0 step \
    "specs, DISTLAB_ATTN_HOPPER_MLA=0 DISTLAB_ATTN_HOPPER_BWD_TURNS=0 DISTLAB_ATTN_HOPPER_BWD_ORDER=0" 300 "$L/attn-spec-optout.log" \
    busted --run=default --exclude-tags=multigpu -o spec/support/summary.lua spec/attn_spec.lua spec/attn_merge_spec.lua
  grep -E "^(FAIL|ERROR)" "$L/attn-spec-optout.log" | head -20
fi

SANBIN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if want san && [ -n "$SANBIN" ]; then
  for tool in memcheck racecheck; do
    w="$L/san-$tool"
    mkdir -p "$w"
    printf '#!/bin/sh\nexec "%s" --tool %s --error-exitcode 9 --log-file "%s/sanitizer-%%p.log" luajit -joff "$@"\n' \
      "$SANBIN" "$tool" "$w" >"$w/luajit"
    chmod +x "$w/luajit"
    LUAJIT="$w/luajit" DISTLAB_JOB_TIMEOUT=280 step "compute-sanitizer $tool, hopper_small.lua" 300 "$L/san-$tool.log" \
      ./distlab run -n 1 --device cuda experiments/attn/hopper_small.lua
    grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$w"/sanitizer-*.log 2>/dev/null | sort | uniq -c | tee -a "$SUM"
  done
elif want san; then
  say "compute-sanitizer not found: sanitizer runs skipped"
fi

torch_csv=""
if want torch; then
  step "PyTorch SDPA" 300 "$L/attn-torch.log" python3 experiments/attn/attn_bench_torch.py --s "${S:-4096,8192,16384}" \
    --d "${D:-128}" --out "$L" && torch_csv="$L/attn-torch.csv"
  grep -vi "warn" "$L/attn-torch.log" | tail -n 12
fi

if want bench; then
  for k in ${VARIANTS:-hopper portable}; do
    mkdir -p "$L/$k"
    case $k in
      hopper) envs="" ;;
      hopper-noturns) envs="DISTLAB_ATTN_HOPPER_BWD_TURNS=0" ;;
      hopper-oldorder) envs="DISTLAB_ATTN_HOPPER_BWD_ORDER=0" ;;
      portable) envs="DISTLAB_ATTN_HOPPER=0" ;;
      *) say "unknown variant $k"; status=1; continue ;;
    esac
    step "attn_bench, $k" 240 "$L/$k/bench.log" env $envs ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua \
      --s "${S:-4096,8192,16384}" --d "${D:-128}" --out "$L/$k" ${torch_csv:+--torch "$torch_csv" --tag "$tag"}
    grep -E "^(ours|cudnn) |backend ours" "$L/$k/bench.log" | head -20
    [ -n "$torch_csv" ] && sed -n '/^TFLOP\/s fwd\/bwd/,$p' "$L/$k/bench.log" | head -20
  done
  # the results file: every variant beside the anchors, issue 19's ratios
  step "the results file" 60 "$L/report.log" python3 experiments/attn/hopper_report.py "$L" "$L/hopper-dlattn-$tag.md" \
    --commit "${DISTLAB_COMMIT:-unknown}" --date "$(date -u '+%Y-%m-%d %H:%M UTC')"
  sed -n '/^## /,$p' "$L/hopper-dlattn-$tag.md" | head -40
fi
exit $status
