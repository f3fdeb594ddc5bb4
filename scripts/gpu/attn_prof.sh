#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host for issue 52's item 0 (experiments/lab/attn/FA4-GAP.md, "0. Profile
# FA4 and ours side by side"): Nsight Compute (`--set full --import-source yes`) on one launch of each main
# attention kernel, ours and FlashAttention-4's, at S (8192), D (128), LAYOUT (bshd), b 2, h 16, bf16, for
# each mask in MASKS (default "none causal"):
#   ours  experiments/attn/attn_prof.lua (dl.attn): fwd_kernel and bwd_kernel (the backward's main kernel,
#         not its prep or bwd_dq_kernel); the launcher runs luajit as a child, hence --target-processes all
#   FA4   experiments/attn/attn_prof_fa4.py (flash-attn-4's sm90 path, PyTorch's python): its forward
#         and backward main kernels (FlashAttentionForwardSm90, FlashAttentionBackwardSm90; not the
#         backward's pre/postprocess)
# Each driver calls the forward CALLS (3) times, then the backward CALLS times. ncu's --kernel-name filter
# counts only the launches it matches, so --launch-skip CALLS-1 --launch-count 1 profiles the last call of
# each: the earlier ones take the first launch's module load and FA4's JIT. Before ncu, each driver runs
# once plainly: ours prints the launches dl.attn makes and checks its results against fp64; FA4's runs
# under torch.profiler (--list-kernels: every kernel launched, with counts; this also compiles FA4's
# kernels into its disk cache) and prints the filter and skip that pick the main kernels by name, which
# this script then uses. Every profiled run checks its data too (the drivers' verdict lines are kept).
# Reports stay on the machine in build/attn-prof/s<S>-d<D>-<LAYOUT>/ (LABEL.ncu-rep and its exports:
# details page as text, raw page as CSV, the SASS source page as CSV; LABEL.meta: date, commit, the exact
# command, exit code, the driver's check) for a later call on the same warm machine. Labels:
# ours-fwd-MASK, fa4-fwd-MASK, ours-bwd-MASK, fa4-bwd-MASK.
# STEPS (default "ours fa4 summary"):
#   ours     build (unless SKIP_BUILD and build/lib/libdistlab.so are there), then per mask the plain run
#            and ncu on fwd_kernel and on bwd_kernel
#   fa4      steps.sh's fa4_site (FA4 from the wheel sets of .deps/fa4/1 and /2, carried in two calls;
#            a call with one set keeps it for the next and skips FA4), then per mask the listing run
#            and ncu on the two main kernels
#   summary  $OUT/attn-prof-summary.md from every report kept for this shape: device, date, commit,
#            this call's command, the libraries (Nsight Compute, distlab's, PyTorch's and FA4's), each
#            column's exact command and check, then scripts/gpu/ncu_summary.py's tables (rows: metrics;
#            columns: ours and FA4 side by side, forward then backward, per mask)
# On a fresh machine, two calls: carry .debs and .deps/fa4/1 for `bash scripts/gpu/attn_prof.sh` (build,
# ours, FA4's first set kept), then .debs and .deps/fa4/2 for `STEPS="fa4 summary" bash
# scripts/gpu/attn_prof.sh` (FA4 installed and profiled; the summary has all eight columns).
# Writes under $OUT: attn-prof-summary.md, attn_prof-summary.txt (the steps' verdicts),
# attn_prof-logs.tgz (the logs and every report's text exports: attn_prof/reports/), and the binary
# reports in attn-prof-reports.tgz (split into attn-prof-reports.tgz.part-N of 15 MiB where larger:
# `cat attn-prof-reports.tgz.part-* | tar -xz`; over 3 parts they stay on the machine only).
# OURS_VARIANTS (default "ours"): ours' columns, each NAME or NAME:VAR=VALUE,VAR=VALUE (environment knobs,
# e.g. "ours pipe2:DISTLAB_ATTN_HOPPER_FWD_PIPE=2"): every one profiled as NAME-fwd-MASK and NAME-bwd-MASK and
# put beside FA4's in the summary (the forward knobs of FA4-GAP.md profiled against the default loop).
# Limits: NCU_LIMIT (180 s) each ncu run, within BUDGET (570 s; the summary and packing after it).
# NCU: the ncu binary (default: PATH, else /usr/local/cuda/bin/ncu); NCU_EXTRA: more ncu options
# (e.g. `--clock-control none`: by default ncu locks the clocks to base, so durations are not the
# bench's). OURS_LUAJIT (`luajit -joff`): the luajit of ours' runs under ncu. FA4's kernels carry no
# line info, so their source page is SASS alone; CUTE_DSL_LINEINFO=1 in the environment (the CuTe
# DSL's own option, not tried here) would compile them with it. DISTLAB_COMMIT=<hash> names the
# commit where the checkout has no .git. DEVICE=cpu (with a small S, NCU=<a stand-in> and a stand-in
# nvidia-smi) runs ours on the cpu: the script's own plumbing, tried where there is no GPU (FA4 runs
# on cuda only). About 5-7 minutes a call on an H200 (an estimate: not yet run); MASKS=causal (or
# none) narrows a call that ran out of budget.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" attn_prof 570 || exit 2
export PYTHONUNBUFFERED=1
STEPS="${STEPS:-ours fa4 summary}"
S="${S:-8192}" D="${D:-128}" LAYOUT="${LAYOUT:-bshd}" MASKS="${MASKS:-none causal}" CALLS="${CALLS:-3}"
DEV="${DEVICE:-cuda}"
OURS_VARIANTS="${OURS_VARIANTS:-ours}"
for v in $OURS_VARIANTS; do
  [[ "${v%%:*}" =~ ^[a-z][a-z0-9]*$ ]] && [ "${v%%:*}" != fa4 ] || { say "OURS_VARIANTS: a name ([a-z][a-z0-9]*, not fa4) before ':', got $v"; exit 2; }
  [[ "$v" != *:* ]] || [[ "${v#*:}" =~ ^[A-Z_0-9]+=[^,]*(,[A-Z_0-9]+=[^,]*)*$ ]] || { say "OURS_VARIANTS: NAME:VAR=VALUE[,VAR=VALUE...], got $v"; exit 2; }
done
for m in $MASKS; do [ "$m" = none ] || [ "$m" = causal ] || { say "MASKS: none or causal, got $m"; exit 2; }; done
[ "$LAYOUT" = bshd ] || [ "$LAYOUT" = thd ] || { say "LAYOUT: bshd or thd, got $LAYOUT"; exit 2; }
[[ "$CALLS" =~ ^[1-9][0-9]*$ ]] || { say "CALLS: a positive integer, got $CALLS"; exit 2; }
COMMIT="${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
SHAPE="s$S-d$D-$LAYOUT"
R="build/attn-prof/$SHAPE" # the reports, kept between calls of one warm machine
mkdir -p "$R" "$L/reports"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
NCU_LIMIT="${NCU_LIMIT:-180}"
OURS_LUAJIT="${OURS_LUAJIT:-luajit -joff}" # ours' luajit under ncu
# the variables that change a run, as the call set them (before fa4_site sets FA4's cache), then the script's own
RECORDED="$(env | grep -E '^(DISTLAB|CUDA|CUTE_DSL|FLASH_ATTENTION)_' | grep -v '^DISTLAB_COMMIT=' | sort | tr '\n' ' ')"
RECORDED="${RECORDED}S=$S D=$D LAYOUT=$LAYOUT MASKS=\"$MASKS\" CALLS=$CALLS STEPS=\"$STEPS\"${DEVICE:+ DEVICE=$DEVICE}"
[ "$OURS_VARIANTS" = ours ] || RECORDED="$RECORDED OURS_VARIANTS=\"$OURS_VARIANTS\""
RECORDED="$RECORDED${SKIP_BUILD:+ SKIP_BUILD=$SKIP_BUILD}${NCU_EXTRA:+ NCU_EXTRA=\"$NCU_EXTRA\"}"

header
if [ -x "$NCU" ]; then
  say "ncu: $NCU ($("$NCU" --version 2>&1 | tail -1))"
else
  say "ncu not found (NCU, PATH, /usr/local/cuda/bin/ncu): nothing will be profiled"
  status=1
fi

# The driver's arguments for one mask (both drivers take the same)
args() { echo "--s $S --d $D --mask $1 --layout $LAYOUT --calls $CALLS"; }
# prof LABEL FILTER SKIP CMD...: ncu on CMD, one launch of the kernels FILTER matches (the one after SKIP
# of them); LABEL.ncu-rep, its exports and LABEL.meta in $R (the exports also in $L/reports)
prof() {
  local label=$1 filter=$2 skip=$3
  shift 3
  local rep="$R/$label" rc x
  rm -f "$rep".*
  [ -x "$NCU" ] || return 1
  # shellcheck disable=SC2206 # NCU_EXTRA: words, as given
  local cmd=("$NCU" --target-processes all --kernel-name "$filter" --launch-skip "$skip" --launch-count 1
    --set full --import-source yes ${NCU_EXTRA:-} -f -o "$rep" "$@")
  step "ncu $label ($filter, launch $((skip + 1)))" "$NCU_LIMIT" "$L/$label.log" "${cmd[@]}"
  rc=$?
  cp "$L/$label.log" "$rep.log"
  {
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $COMMIT"
    echo "command: $(printf '%q ' "${cmd[@]}")"
    echo "exit: $rc"
    # the driver's verdict on its data (its last line naming the shape), and ours' launch counts
    echo "check: $(grep -E '^attn_prof(_fa4)?: (bshd|thd) (none|causal) s=[0-9]+ d=[0-9]+: ' "$rep.log" | tail -1 |
      sed -E 's/^attn_prof(_fa4)?: //')"
    grep -E '^attn_prof: .* launches: [0-9]+' "$rep.log" | tail -1 | sed 's/^attn_prof: /launches: /'
  } >"$rep.meta"
  if [ ! -s "$rep.ncu-rep" ]; then
    say "$label: no report written ($(grep -E '==(ERROR|WARNING)==' "$rep.log" | tail -1))"
    status=1
    return 1
  fi
  timeout 90 "$NCU" -i "$rep.ncu-rep" --page details >"$rep.details.txt" 2>&1 || say "$label: details page: exit $?"
  timeout 90 "$NCU" -i "$rep.ncu-rep" --page raw --csv >"$rep.raw.csv" 2>&1 || say "$label: raw page: exit $?"
  timeout 120 "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$rep.sass.csv" 2>&1 ||
    say "$label: source page: exit $?"
  for x in meta log details.txt raw.csv sass.csv; do cp "$rep.$x" "$L/reports/" 2>/dev/null; done
  # a raw page holds the names, the units, then a row a profiled kernel
  [ "$(grep -c '^"' "$rep.raw.csv")" -ge 3 ] || { say "$label: the raw page holds no kernel"; status=1; }
  say "  $label: $(sed -n 's/^check: //p' "$rep.meta")"
}

if want ours; then
  build_or_skip || exit 1
  for v in $OURS_VARIANTS; do
    name=${v%%:*} knobs=()
    [[ "$v" != *:* ]] || IFS=, read -r -a knobs <<<"${v#*:}"
    for mask in $MASKS; do
      # shellcheck disable=SC2046 # args: words
      step "$name $mask: plain run (launches, check)${knobs[*]:+ (${knobs[*]})}" 120 "$L/$name-plain-$mask.log" \
        env "${knobs[@]}" ./distlab run -n 1 --device "$DEV" experiments/attn/attn_prof.lua $(args "$mask")
      grep -E '^attn_prof: (fwd_why|bwd_why|.* launches: )' "$L/$name-plain-$mask.log" | tee -a "$SUM"
      # regex:fwd_kernel, as hopper_prof.sh matched it on these hosts; regex:bwd_kernel matches neither
      # bwd_prep_kernel nor bwd_dq_kernel. Both also match the portable attn_fwd_kernel / attn_bwd_kernel,
      # which do not run where the Hopper kernels do (the plain run's fwd_why / bwd_why say which run; the
      # summary names the kernel each report holds).
      # (luajit -joff: compute-sanitizer's backtraces aborted LuaJIT's compiled traces, sanitizer.sh; ncu takes
      # none by default, and with the JIT off the launches are the same, so it costs nothing to rule that out)
      # shellcheck disable=SC2046
      prof "$name-fwd-$mask" regex:fwd_kernel $((CALLS - 1)) env "${knobs[@]}" LUAJIT="$OURS_LUAJIT" ./distlab run -n 1 \
        --device "$DEV" experiments/attn/attn_prof.lua $(args "$mask")
      # shellcheck disable=SC2046
      prof "$name-bwd-$mask" regex:bwd_kernel $((CALLS - 1)) env "${knobs[@]}" LUAJIT="$OURS_LUAJIT" ./distlab run -n 1 \
        --device "$DEV" experiments/attn/attn_prof.lua $(args "$mask")
    done
  done
fi

if want fa4; then
  if [ "$DEV" != cuda ]; then
    say "FA4: DEVICE=$DEV: FlashAttention-4 runs on cuda only, skipped"
  elif fa4_site; then
    for mask in $MASKS; do
      log="$L/fa4-kernels-$mask.log"
      # shellcheck disable=SC2046
      step "FA4 $mask: kernels launched (torch.profiler; compiles)" 300 "$log" "$PY" experiments/attn/attn_prof_fa4.py \
        $(args "$mask") --list-kernels
      grep -E '^attn_prof_fa4: (seen|ncu|expected)' "$log" | tee -a "$SUM"
      for dir in fwd bwd; do
        # the filter and skip it printed; the class names read from FA4's source where it printed none
        f=$(sed -n "s/^attn_prof_fa4: ncu $dir: --kernel-name \([^ ]*\) --launch-skip \([0-9]*\) .*/\1 \2/p" \
          "$log" | tail -1)
        if [ -z "$f" ]; then
          cls=FlashAttentionForwardSm90
          [ "$dir" = bwd ] && cls=FlashAttentionBackwardSm90
          f="regex:$cls $((CALLS - 1))"
          say "FA4 $mask $dir: the listing printed no filter; taking $f"
        fi
        read -r filter skip <<<"$f"
        # shellcheck disable=SC2046
        prof "fa4-$dir-$mask" "$filter" "$skip" "$PY" experiments/attn/attn_prof_fa4.py $(args "$mask")
      done
    done
  else
    say "FA4: not profiled in this call (see above; the summary lists what is missing)"
  fi
fi

if want summary; then
  # the header: this call's device, date, commit, command, libraries; each column's own command and check
  pre="$L/summary-preamble.md"
  first() { grep -h -m1 "$1" "$R"/*.log 2>/dev/null | head -1 | sed "s/$1//"; }
  field() { sed -n "s/^$1: //p" "$2"; }
  cols=() lines=()
  for mask in $MASKS; do
    labels=()
    for dir in fwd bwd; do
      for v in $OURS_VARIANTS; do labels+=("${v%%:*}-$dir-$mask"); done
      labels+=("fa4-$dir-$mask")
    done
    for label in "${labels[@]}"; do
      cols+=("$label=$R/$label.raw.csv")
      m="$R/$label.meta"
      if [ -f "$m" ]; then
        line="- $label: \`$(field command "$m")\` ($(field date "$m"), commit $(field commit "$m"), exit"
        lines+=("$line $(field exit "$m")); check: $(field check "$m")")
      else
        lines+=("- $label: not profiled on this machine")
      fi
    done
  done
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  [ "$DEV" = cuda ] || gpu="$gpu (DEVICE=$DEV: ours ran on $DEV, a plumbing run)"
  {
    echo "- device: $gpu"
    echo "- date: $(date -u -d "@$t_start" '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: \`$COMMIT\`"
    echo "- command: \`$RECORDED scripts/gpu/attn_prof.sh\`"
    echo "- libraries: Nsight Compute $("$NCU" --version 2>&1 | tail -1) (\`$NCU\`); distlab:" \
      "$(first '^attn_prof: build: '), $(first '^attn_prof: libraries: '); FA4 side:" \
      "$(first '^attn_prof_fa4: libraries: ' | grep . || echo "not run")"
    echo "- what ran: b 2, h 16, s $S, d $D, bf16, $LAYOUT; each driver calls the forward $CALLS times, then the" \
      "backward $CALLS times, and checks the last call's results (ours: out, lse, dq, dk, dv against fp64 at sampled" \
      "rows; FA4: out at sampled rows, gradients finite); ncu \`--set full --import-source yes\` on the last launch of" \
      "each main kernel (\`--kernel-name F --launch-skip $((CALLS - 1)) --launch-count 1\`; FA4's F and skip from its" \
      "torch.profiler listing); ncu's default clock control locks the clocks to base unless NCU_EXTRA says otherwise," \
      "so durations are ncu's, not the bench's"
    echo "- each column (reports kept in \`$R\` on the machine; text exports in attn_prof-logs.tgz, attn_prof/reports/):"
    printf '  %s\n' "${lines[@]}"
  } >"$pre"
  title="Nsight Compute: dl.attn's kernels beside FlashAttention-4's (issue 52, item 0)"
  timeout 60 "$PY" scripts/gpu/ncu_summary.py --title "$title" --preamble "$pre" -o "$OUT/attn-prof-summary.md" \
    "${cols[@]}" >"$L/summary.log" 2>&1
  rc=$?
  [ $rc = 0 ] || status=1
  missing=$(grep -c '^- .*: no profiled kernel' "$OUT/attn-prof-summary.md" 2>/dev/null)
  say "summary: $OUT/attn-prof-summary.md (exit $rc; ${missing:-?} of ${#cols[@]} columns without a report)"
  # the binary reports, in parts of 15 MiB where larger (a call returns files of 16 MiB at most)
  if ls "$R"/*.ncu-rep >/dev/null 2>&1; then
    (cd "$R" && tar -czf "$OUT/attn-prof-reports.tgz" ./*.ncu-rep)
    size=$(stat -c %s "$OUT/attn-prof-reports.tgz")
    if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
      split -b 15M -d -a 1 "$OUT/attn-prof-reports.tgz" "$OUT/attn-prof-reports.tgz.part-"
      rm -f "$OUT/attn-prof-reports.tgz"
      parts=("$OUT"/attn-prof-reports.tgz.part-*)
      n=${#parts[@]}
      if [ "$n" -gt 3 ]; then # 45 MiB at most, leaving the 64 MiB a call returns room for the logs
        rm -f "$OUT"/attn-prof-reports.tgz.part-*
        say "reports: $((size / 1048576)) MiB packed, more than a call returns: kept on the machine in $R" \
          "(a later call can pack a few: tar -czf \$OUT/r.tgz -C $R LABEL.ncu-rep ...)"
      else
        say "reports: $OUT/attn-prof-reports.tgz.part-0..$((n - 1)) ($((size / 1048576)) MiB; cat them | tar -xz)"
      fi
    else
      say "reports: $OUT/attn-prof-reports.tgz ($((size / 1024)) KiB)"
    fi
  fi
fi
exit $status
