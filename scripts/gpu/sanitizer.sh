#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried) for issue 53: every kernel
# family under compute-sanitizer, in BUDGET seconds (default 290):
#   all-reduce  spec/allreduce/correct.lua 7 4095 70000: every algorithm of dl.allreduce.algos,
#               bf16/f16/f32, in place, out of place, a misaligned view, zero copy, in pieces
#   EP          spec/ep/correct.lua: dispatch and combine, both layouts, both outputs, bf16
#               and fp8, T = 0, 1, B and varying, -1 ids, repeats
#   overlap     spec/overlap/correct.lua: ag_gemm and gemm_rs, every variant (the copy
#               kernels, the flags' stream operations, cuBLASLt's GEMMs), f16 -> f32, merge
#   attention   experiments/attn/hopper_small.lua: dl.attn forward and backward (the Hopper
#               kernels at d 64 and 128; bshd causal, bottom-right GQA, sbhd window, thd with
#               gaps), checked in full against fp64
# The first three with 2 ranks sharing one GPU (the ipc communicator: CUDA IPC, no NCCL),
# under TOOLS (default "memcheck racecheck synccheck"); attention with 1 rank under
# ATTN_TOOLS (default "memcheck initcheck"; ATTN_ARGS: hopper_small.lua's arguments, split on spaces, e.g.
# "--quick" or "--case s=333" for one tool's slow run). MPS is not started: the sanitizer and MPS
# clients do not mix (scripts/gpu/ep.sh), so the ranks take turns on the GPU. Each rank's
# luajit runs under `compute-sanitizer --tool T --target-processes all --error-exitcode 9
# --report-api-errors no --log-file DIR/san-%p.log` (LUAJIT: the launcher starts each rank
# through it), so every process has its own log; kernels' errors and hazards are what is
# counted (API errors off: distlab checks every CUDA call's result itself, and probes that
# are meant to fail would count; SAN_API_ERRORS=explicit turns them on). SAN_EXTRA adds
# options (e.g. --kernel-name-exclude kns=cublas).
# Order: each family once without the sanitizer (tool "none": does the run itself pass on
# this host? PLAIN=0 skips it), then memcheck of every family, then initcheck, racecheck,
# synccheck; each run under the smaller of its limit (LIMIT, default 60 s; attention 90 s)
# and what is left of BUDGET; a run the budget cannot start is SKIPPED and listed.
# Under the sanitizer everything is 10-100x slower, so each run's own waits are sized from
# its limit, not from the defaults made for a plain run: DISTLAB_TIMEOUT and SPEC_TIMEOUT
# (any store, collective or device wait) the limit less 15 s, so that a hang ends in our
# error naming the wait rather than in the job's kill; DISTLAB_STOP_GRACE 20 s (a rank's
# peers, slowed too, still print their own errors after it fails; the default is 2 s) and
# DISTLAB_STORE_LINGER 30 s (rank 0's store outlives it while a slowed peer still connects;
# default 5 s). Each set in the environment wins.
# Every rank's stderr is kept in rank-R.err beside its sanitizer log, and how it ended in
# rank-R.status ("exit N", or "signal N (SIGNAME)"); glibc's fatal messages (heap corruption,
# fortify) go to stderr rather than to /dev/tty (LIBC_FATAL_STDERR_=1). LuaJIT runs with its
# JIT off under the sanitizer (-joff; the kernels and every CUDA call are the same): the
# sanitizer unwinds the host stack at each CUDA call for its backtraces, and LuaJIT's compiled
# traces have no unwind tables, so libgcc's unwinder aborted the rank (SIGABRT, nothing
# printed; the sanitizer reports exit 6) within 1-2 s under memcheck, initcheck, racecheck
# and synccheck alike; with -joff hopper_small.lua ended clean under memcheck (H200,
# 2026-11-29). A run that fails lists each rank's
# end and the last lines of its stderr and of its sanitizer logs in the results file.
# FAMILIES (default "allreduce ep overlap attn") narrows, e.g. a second call:
#   SKIP_BUILD=1 scripts/gpu/sanitizer.sh
#   SKIP_BUILD=1 TOOLS="racecheck synccheck" ATTN_TOOLS= scripts/gpu/sanitizer.sh
# compute-sanitizer: SANITIZER, else on PATH, else /usr/local/cuda/bin/compute-sanitizer;
# missing, the script says so and fails. Writes $OUT/sanitizer-<gpu>.md (commit it as
# experiments/results/faults/sanitizer-<gpu>.md: device, date, commit, the command with its
# variables, libraries, and a row per family and tool: processes, errors, hazards, the
# run's exit code and ok lines, where the first errors were), $OUT/sanitizer-summary.txt and
# every raw log in $OUT/sanitizer-logs.tgz. Exit status non-zero when a run failed, found
# an error or a hazard, or did not run. DISTLAB_COMMIT=<hash> names the commit where the
# checkout has no .git. DEVICE=cpu (with SANITIZER=<a stand-in>) runs the ranks on the cpu:
# the script's own plumbing, tried where there is no GPU.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" sanitizer 290 || exit 2
export NCCL_NVLS_ENABLE=0 LIBC_FATAL_STDERR_=1
export DISTLAB_STOP_GRACE="${DISTLAB_STOP_GRACE:-20}" DISTLAB_STORE_LINGER="${DISTLAB_STORE_LINGER:-30}"
# set here, they win over each run's own (its limit less 15 s)
user_timeout="${DISTLAB_TIMEOUT:-}" user_spec_timeout="${SPEC_TIMEOUT:-}"
TOOLS="${TOOLS-memcheck racecheck synccheck}"
ATTN_TOOLS="${ATTN_TOOLS-memcheck initcheck}"
FAMILIES="${FAMILIES:-allreduce ep overlap attn}"
LIMIT="${LIMIT:-60}"
header
gpu=$(gpu_tag)
md="$OUT/sanitizer-$gpu.md"

SANBIN="${SANITIZER:-$(command -v compute-sanitizer || true)}"
[ -n "$SANBIN" ] || SANBIN=/usr/local/cuda/bin/compute-sanitizer
if [ ! -x "$SANBIN" ]; then
  say "compute-sanitizer not found (SANITIZER, PATH, /usr/local/cuda/bin/compute-sanitizer): nothing was run"
  printf '# compute-sanitizer on every kernel family (scripts/gpu/sanitizer.sh)\n\nNot run: no compute-sanitizer on this host (SANITIZER, PATH, /usr/local/cuda/bin/compute-sanitizer).\n' >"$md"
  status=1
  exit 1
fi
san_version=$("$SANBIN" --version 2>&1 | grep -iE 'version|release' | tail -1)
say "compute-sanitizer: $SANBIN ($san_version)"
build_or_skip || exit 1

# family -> ranks, what it runs (the rank script and its arguments), what it covers
declare -A RANKS=([allreduce]=2 [ep]=2 [overlap]=2 [attn]=1)
declare -A SCRIPT=([allreduce]="spec/allreduce/correct.lua 7 4095 70000" [ep]="spec/ep/correct.lua"
  [overlap]="spec/overlap/correct.lua" [attn]="experiments/attn/hopper_small.lua${ATTN_ARGS:+ $ATTN_ARGS}")
declare -A COVERS=([allreduce]="every algorithm (nccl, one_shot, two_shot, push, write, Lamport, flat), bf16/f16/f32, in place, out of place, misaligned, zero copy, pieces"
  [ep]="dispatch + combine, per_rank and per_expert, expert_major and rank_major, bf16 and fp8"
  [overlap]="ag_gemm and gemm_rs: nccl baselines, p2p and ring x get/put x ce/sm x 1-3 streams, merge, f16 -> f32 (copy kernels, flags, cuBLASLt GEMMs)"
  [attn]="dl.attn fwd + bwd, Hopper kernels d 64 and 128: bshd causal, GQA bottom-right, sbhd window, thd with gaps")
# an "ok" line each rank prints when its checks passed
declare -A OKWORD=([allreduce]="correct ok" [ep]="correct ok" [overlap]="correct ok" [attn]="hopper_small: all ok")

# The runs in order: every family plain, memcheck of every family, then the other tools.
runs=()
if [ "${PLAIN:-1}" = 1 ]; then for f in $FAMILIES; do runs+=("$f:none"); done; fi
for tool in memcheck initcheck racecheck synccheck; do
  for f in $FAMILIES; do
    if [ "$f" = attn ]; then [[ " $ATTN_TOOLS " == *" $tool "* ]] || continue
    else [[ " $TOOLS " == *" $tool "* ]] || continue; fi
    runs+=("$f:$tool")
  done
done
say "runs: ${runs[*]}"

# The counts of one run's logs: "processes errors hazards unfinished"
count() {
  local d=$1 f procs=0 errs=0 haz=0 unfinished=0 line
  for f in "$d"/san-*.log; do
    [ -e "$f" ] || continue
    procs=$((procs + 1))
    if line=$(grep -m1 -E "RACECHECK SUMMARY: [0-9]+ hazard" "$f"); then
      haz=$((haz + $(echo "$line" | grep -oE '[0-9]+ hazard' | grep -oE '[0-9]+')))
      errs=$((errs + $(echo "$line" | grep -oE '[0-9]+ error' | grep -oE '[0-9]+' || echo 0)))
    elif line=$(grep -m1 -E "ERROR SUMMARY: [0-9]+ error" "$f"); then
      errs=$((errs + $(echo "$line" | grep -oE '[0-9]+ error' | grep -oE '[0-9]+')))
    else # stopped before its summary: the error records it holds so far (one "at KERNEL" line each)
      unfinished=$((unfinished + 1))
      errs=$((errs + $(grep -cE '^========= +at ' "$f")))
    fi
  done
  echo "$procs $errs $haz $unfinished"
}

: >"$L/records"
for r in "${runs[@]}"; do
  f=${r%%:*} tool=${r#*:}
  d="$L/$f-$tool"
  mkdir -p "$d"
  # the rank's luajit under the sanitizer (tool none: as it is); its stderr also kept in
  # rank-R.err, how it ended in rank-R.status
  run_it="\"$SANBIN\" --tool $tool --target-processes all --error-exitcode 9 --report-api-errors ${SAN_API_ERRORS:-no} ${SAN_EXTRA:-} --log-file \"$d/san-%p.log\" luajit -joff"
  [ "$tool" = none ] && run_it=luajit
  cat >"$d/luajit" <<EOF
#!/usr/bin/env bash
r=\${DISTLAB_RANK:-0}
$run_it "\$@" 2> >(tee "$d/rank-\$r.err" >&2)
rc=\$?
if [ \$rc -gt 128 ]; then echo "signal \$((rc - 128)) (SIG\$(kill -l \$((rc - 128)) 2>/dev/null))"; else echo "exit \$rc"; fi >"$d/rank-\$r.status"
exit \$rc
EOF
  chmod +x "$d/luajit"
  limit=$LIMIT
  [ "$f" = attn ] && limit=$((LIMIT * 3 / 2))
  t0=$(date +%s)
  # shellcheck disable=SC2086
  DISTLAB_TIMEOUT="${user_timeout:-$((limit - 15))}" SPEC_TIMEOUT="${user_spec_timeout:-$((limit - 15))}" \
    DISTLAB_JOB_TIMEOUT=$limit LUAJIT="$d/luajit" step "compute-sanitizer $tool: $f (${RANKS[$f]} rank(s))" "$limit" \
    "$d/run.log" ./distlab run -n "${RANKS[$f]}" --device "${DEVICE:-cuda}" ${SCRIPT[$f]}
  rc=$?
  secs=$(($(date +%s) - t0))
  read -r procs errs haz unfinished <<<"$(count "$d")"
  [ "$tool" = none ] && procs=${RANKS[$f]} unfinished=0
  if [ "$rc" != 0 ]; then
    # each rank's end, the last lines of its stderr and of its sanitizer logs, for the results file
    for ((k = 0; k < ${RANKS[$f]}; k++)); do
      echo "$f $tool rank $k: $(cat "$d/rank-$k.status" 2>/dev/null || echo "no status (its wrapper was stopped: by the launcher once a peer failed, or by the limit)")"
      tail -n 8 "$d/rank-$k.err" 2>/dev/null | sed 's/^/  stderr: /'
    done >>"$L/ends"
    for lg in "$d"/san-*.log; do
      [ -e "$lg" ] || continue
      echo "$f $tool $(basename "$lg"):"
      grep -v '^========= *$' "$lg" | tail -n 8 | sed 's/^/  /'
    done >>"$L/ends"
  fi
  oks=$(grep -c "${OKWORD[$f]}" "$d/run.log" 2>/dev/null)
  oks=${oks:-0}
  # where the first errors were: the sanitizer's "at KERNEL+0x.." (racecheck: "access at") lines, distinct, 3 at most
  where=$(sed -nE 's/^========= +at (.*)$/\1/p; s/^=========.* access at (.*)$/\1/p' "$d"/san-*.log 2>/dev/null | sed -E 's/\+0x[0-9a-f]+.*$//; s/ in .*$//' |
    cut -c1-80 | tr -d '|`' | awk '!seen[$0]++' | head -3 | tr '\n' ';' | sed 's/;$//; s/;/; /g')
  if grep -q "SKIPPED" <<<"$(tail -n 1 "$SUM")"; then rc=skipped; fi
  printf '%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\n' "$f" "$tool" "$procs" "$errs" "$haz" "$unfinished" "$rc" "$oks" "$secs" \
    "$where" >>"$L/records"
  say "  $f $tool: $procs process(es), $errs error(s), $haz hazard(s)$([ "$unfinished" -gt 0 ] && echo ", $unfinished log(s) without a summary"); ok lines $oks of ${RANKS[$f]}"
  { [ "$errs" = 0 ] && [ "$haz" = 0 ] && [ "$unfinished" = 0 ] && [ "$procs" -gt 0 ] && [ "$rc" = 0 ] &&
    [ "$oks" -ge "${RANKS[$f]}" ]; } || status=1
done

# ---- the results file -----------------------------------------------------------------------
# the libraries distlab loads here (scripts/gpu/libs.lua: an NCCL world, a GEMM, a cudnn step), as suite.sh names them
libs=$(./distlab run -n 1 --device "${DEVICE:-cuda}" scripts/gpu/libs.lua 2>&1 | sed -n 's/^lib loaded: //p' | head -1)
recorded=$(env | grep -E '^(DISTLAB|NCCL|CUDA)_' | sort | tr '\n' ' ')
{
  echo "# compute-sanitizer on the all-reduce, EP, overlap and attention kernels (scripts/gpu/sanitizer.sh)"
  echo
  echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  echo "- date: $(date -u -d "@$t_start" '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: \`${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}\`"
  echo "- command: \`${recorded}$([ -n "${SKIP_BUILD:-}" ] && echo "SKIP_BUILD=1 ")TOOLS=\"$TOOLS\" ATTN_TOOLS=\"$ATTN_TOOLS\"${ATTN_ARGS:+ ATTN_ARGS=\"$ATTN_ARGS\"} FAMILIES=\"$FAMILIES\" LIMIT=$LIMIT BUDGET=$BUDGET${DEVICE:+ DEVICE=$DEVICE}${SAN_EXTRA:+ SAN_EXTRA=\"$SAN_EXTRA\"}${SAN_API_ERRORS:+ SAN_API_ERRORS=$SAN_API_ERRORS} scripts/gpu/sanitizer.sh\`"
  echo "- libraries: ${libs:-(scripts/gpu/libs.lua did not say)}; compute-sanitizer $san_version ($SANBIN)"
  echo "- each run: \`LUAJIT=<wrapper> ./distlab run -n R --device cuda SCRIPT\`, every rank's \`luajit -joff\` under \`compute-sanitizer --tool T --target-processes all --error-exitcode 9 --report-api-errors ${SAN_API_ERRORS:-no} ${SAN_EXTRA:-}--log-file san-%p.log\`; 2 ranks share one GPU through CUDA IPC (the ipc communicator), MPS off; raw logs in sanitizer-logs.tgz (\`sanitizer/<family>-<tool>/\`)"
  echo
  echo "| family | what ran | ranks | tool | processes | errors | hazards | exit | ok lines | seconds | first error sites |"
  echo "|---|---|---:|---|---:|---:|---:|---|---:|---:|---|"
  while IFS='|' read -r f tool procs errs haz unfinished rc oks secs where; do
    ex=$rc
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && ex="$rc (timed out)"
    [ "$rc" = 9 ] && ex="9 (the sanitizer found errors)"
    [ "$unfinished" -gt 0 ] && procs="$procs ($unfinished without a summary)"
    echo "| $f | \`${SCRIPT[$f]}\`: ${COVERS[$f]} | ${RANKS[$f]} | $tool | $procs | $errs | $haz | $ex | $oks of ${RANKS[$f]} | $secs | ${where:--} |"
  done <"$L/records"
  echo
  echo "Verdict: $([ "$status" = 0 ] && echo "0 errors, 0 hazards in every run" || echo "NOT CLEAN: see the rows above (errors, hazards, a run that failed, timed out or was skipped)")."
  if [ -s "$L/ends" ]; then
    echo
    echo "How the ranks of the runs that failed ended (rank-R.status), and the last lines of their stderr and sanitizer logs:"
    echo
    echo '```'
    cat "$L/ends"
    echo '```'
  fi
  if grep -q "SKIPPED\|TIMED OUT" "$SUM"; then
    echo
    echo "Runs that did not run or finish:"
    grep -h "SKIPPED\|TIMED OUT" "$SUM" | sed 's/^/- /'
  fi
} >"$md"
say "results: $md"
exit $status
