#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs and .deps carried): the whole suite in one
# device call, in BUDGET seconds (default 540), so that every change to GPU code can run it:
#   1. build (240 s), or SKIP_BUILD=1 with a build/lib/libdistlab.so built for sm_90 elsewhere
#      and carried;
#   2. the libraries distlab loads here, and their files (scripts/gpu/libs.lua: NCCL, cuBLASLt,
#      cuDNN and why that one; PyTorch's versions);
#   3. two tracks side by side (TRACKS=serial: one after the other), all under MPS (started
#      first, so every process on the GPU is a client of the one daemon):
#      - the lanes: every spec file with `./distlab test FILE` (the #gpu specs included, the
#        #multigpu ones left to the other track), LANES (default 4) files at a time, the
#        longest first, each under its limit (SLOW below, else FILE_LIMIT, default 150 s); and
#        spec/attn_cudnn_spec.lua once more with the system's libcudnn.so.9 forced
#        (DISTLAB_CUDNN=<it>: 9.14 on the lent hosts, whose known-wrong configurations distlab
#        refuses), so the pick and the system's cuDNN are both covered. Mostly cpu work: the
#        twins, the emulators, ranks on cpu;
#      - the #multigpu track: for N in RANKS (default "2 4 8") the #multigpu spec files with
#        DISTLAB_SPEC_RANKS=N ranks sharing the GPU(s), one file at a time: every one at 2 and 4
#        ranks (MULTI: the files with a #multigpu describe), the all-reduce, EP,
#        overlap and CP ones at 8 (MULTI8), above 2 less the specs whose rank count is fixed
#        (they ran at 2: FIXED below).
# Writes $OUT/suite-<gpu>.md (commit it as experiments/results/suite-<gpu>.md): device, date,
# commit, the exact commands with every DISTLAB_* / NCCL_* / CUDA_* variable set, the libraries
# loaded, a table of every step (spec file, ranks, passed / failed / skipped, seconds), the
# failures' first lines; every log in $OUT/suite-logs.tgz. Exit status non-zero when a step
# failed or did not run. Where 8 ranks do not fit the call (steps left say SKIPPED), run the
# rest as RANKS=8 STEPS=multi in a second call. STEPS (default "libs specs multi") picks 2-4;
# SPECS (spec files), MULTI and MULTI8 (module names) narrow 3 and 4.
# DISTLAB_COMMIT=<hash> names the commit where the checkout has no .git.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" suite 540 || exit 2
export NCCL_NVLS_ENABLE=0
# a wait that never ends fails in 60 s, a job of ranks ends within 300 s, hung or not
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-60}" DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-300}"
STEPS="${STEPS:-libs specs multi}"
LANES="${LANES:-4}"
RANKS="${RANKS:-2 4 8}"
# every spec file with a #multigpu describe (today comm, symm, allreduce, cp, ep, overlap, repl)
MULTI="${MULTI:-$(grep -l '#multigpu' spec/*_spec.lua | sed 's,spec/\(.*\)_spec.lua,\1,' | tr '\n' ' ')}"
MULTI8="${MULTI8:-allreduce ep overlap cp}"
# the spec files that take long, started first, with their limits (seconds): on 2 shared cores
# the emulators took 290 s (attn_hopper_emu, with M192 and LAZY since c8e0443; more than 300 s on an
# H200 host, where it ran out of that limit) and 115 s, the cpu ranks of allreduce, ep and cp
# 110-180 s; the #gpu cases of attn and attn_cudnn check every case against the fp64 twin; ptxas_check
# compiles the Hopper kernels (about a minute on an idle machine; started last of the lanes on an H200 host,
# the suite's budget cut it at 70 s: suite-h200.md of 515df9a)
declare -A SLOW=([attn_hopper_emu_spec]=480 [allreduce_emu_spec]=240 [attn_spec]=240 [attn_cudnn_spec]=240
  [attn_merge_spec]=180 [bench_spec]=240 [allreduce_spec]=240 [cp_spec]=240 [ep_spec]=240 [faults_spec]=180
  [repl_spec]=180 [overlap_spec]=180 [comm_spec]=150 [launcher_spec]=150 [ptxas_check_spec]=200)
# the #multigpu specs whose rank count is fixed (busted --filter-out patterns, one word each:
# busted re-runs itself through a shell that splits on spaces)
declare -A FIXED=([allreduce]="never%scomes tune%swrites" [comm]="failure:" [ep]="check" [overlap]="stuck")

header
gpu=$(gpu_tag)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
say "steps: $STEPS; $ngpu GPU(s); lanes $LANES; ranks $RANKS"
build_how=$([ -n "${SKIP_BUILD:-}" ] && [ -f build/lib/libdistlab.so ] && echo "carried (SKIP_BUILD)" || echo "on the host")
build_or_skip || exit 1
export SKIP_BUILD=1 # built: the ./distlab test of every step need not ask make again (one at a time, under a lock)
unpack_carried_cudnn
sys_cudnn=$(system_cudnn)

# A spec step: `env VARS ./distlab test ARGS`, its record (file, ranks, variables, summary,
# seconds, exit code, log) appended to $L/records for the table.
#   spec_step LIMIT FILE RANKS "VARS" ARGS...
spec_step() {
  local limit=$1 file=$2 ranks=$3 vars=$4
  shift 4
  local log="$L/$(basename "$file" .lua)-$ranks${vars:+-$(echo "$vars" | md5sum | cut -c1-6)}.log" t0 rc
  t0=$(date +%s)
  step "$(basename "$file") ($ranks rank(s)${vars:+; $vars})" "$limit" "$log" env $vars ./distlab test "$@" "$file"
  rc=$?
  printf '%s|%s|%s|%s|%s|%s|%s\n' "$file" "$ranks" "$vars" "$(tail -n 1 "$log" 2>/dev/null || echo "not run")" \
    "$(($(date +%s) - t0))" "$rc" "$(basename "$log")" >>"$L/records"
  return $rc
}

if want libs; then
  step "libraries" 90 "$L/libs.log" ./distlab run -n 1 --device cuda scripts/gpu/libs.lua
  [ -n "$sys_cudnn" ] && DISTLAB_CUDNN="$sys_cudnn" step "libraries, the system's cuDNN forced" 60 \
    "$L/libs-system-cudnn.log" ./distlab run -n 1 --device cuda scripts/gpu/libs.lua
fi

# The #multigpu track: one file at a time, 2 ranks first (the lanes are busiest then), 8 last.
multi_track() {
  local n m mods out p
  for n in $RANKS; do
    mods=$MULTI
    [ "$n" -ge 8 ] && mods=$MULTI8
    for m in $mods; do
      out=()
      if [ "$n" != 2 ]; then for p in ${FIXED[$m]:-}; do out+=("--filter-out=$p"); done; fi
      spec_step 240 "spec/${m}_spec.lua" "$n" "DISTLAB_SPEC_RANKS=$n" --tags=multigpu "${out[@]}"
    done
  done
}

# The spec files, LANES at a time, longest first (by their limits).
spec_lanes() {
  local f b j limit vars list=()
  for f in ${SPECS:-spec/*_spec.lua}; do
    b=$(basename "$f" .lua)
    list+=("${SLOW[$b]:-${FILE_LIMIT:-150}}|$f|")
  done
  if [ -n "$sys_cudnn" ]; then
    list+=("240|spec/attn_cudnn_spec.lua|DISTLAB_CUDNN=$sys_cudnn")
  else
    say "no system libcudnn.so.9 (ldconfig): the cudnn specs run once, with the pick"
  fi
  mapfile -t list < <(printf '%s\n' "${list[@]}" | sort -t'|' -k1,1nr)
  for j in "${list[@]}"; do
    IFS='|' read -r limit f vars <<<"$j"
    while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do sleep 0.5; done
    spec_step "$limit" "$f" 1 "$vars" &
  done
  wait
}

if want multi; then
  [ "$ngpu" -ge 1 ] || { say "multi: no GPU"; status=1; exit 1; }
  # before the lanes start, so that every process on the GPU is a client of the one daemon
  [ "${MPS:-1}" = 1 ] && mps_start
fi
# The two tracks side by side (TRACKS=serial: the lanes, then the #multigpu files): the lanes
# are mostly cpu work (the twins, the emulators, ranks on cpu), the #multigpu track GPU work
if want multi && want specs && [ "${TRACKS:-parallel}" = parallel ]; then
  multi_track &
  (spec_lanes) # a shell of its own: its lanes count (and wait for) its jobs alone
  wait
else
  if want specs; then spec_lanes; fi
  if want multi; then multi_track; fi
fi
# the steps ran in subshells too: their failures are in the records
awk -F'|' '$6 != 0 { bad = 1 } END { exit !bad }' "$L/records" 2>/dev/null && status=1

# ---- the results file ---------------------------------------------------------------------
md="$OUT/suite-$gpu.md"
git_head=$(git rev-parse --short HEAD 2>/dev/null)
# uncommitted changes, told only where this host's .git is the commit named: a tree carried with
# DISTLAB_COMMIT set is that commit's, and a diff against an older .git here would list its commits
dirty_note() {
  if [ -n "$git_head" ] && { [ -z "${DISTLAB_COMMIT:-}" ] || [ "${DISTLAB_COMMIT}" = "$git_head" ]; }; then
    git diff --quiet HEAD || echo " (with uncommitted changes: $(git diff --name-only HEAD | head -3 | tr '\n' ' ')$(git diff --name-only HEAD | wc -l) files)"
  elif [ -n "$git_head" ]; then
    echo " (the tree carried as DISTLAB_COMMIT; this host's .git is at $git_head)"
  fi
}
{
  echo "# The whole suite on one $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (scripts/gpu/suite.sh)"
  echo
  echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), $ngpu GPU(s); $(nproc) CPU cores"
  echo "- date: $(date -u -d "@$t_start" '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: \`${DISTLAB_COMMIT:-${git_head:-unknown}}\`$(dirty_note)"
  echo "- command: \`$(env | grep -E '^(DISTLAB|NCCL|CUDA)_' | sort | tr '\n' ' ')$([ "$build_how" = "on the host" ] || echo "SKIP_BUILD=1 ")STEPS=\"$STEPS\" LANES=$LANES RANKS=\"$RANKS\" MULTI=\"${MULTI% }\" MULTI8=\"$MULTI8\" TRACKS=${TRACKS:-parallel}${SPECS:+ SPECS=\"$SPECS\"} scripts/gpu/suite.sh\`; each step below is \`[VARS] ./distlab test [ARGS] FILE\` (the #multigpu ones with \`--tags=multigpu\`, at 4 and 8 ranks with the \`--filter-out\` of FIXED), its variables in the table"
  echo "- build: $build_how; $(grep -h '^lib distlab:' "$L/libs.log" 2>/dev/null | sed 's/^lib distlab: //')"
  echo "- libraries loaded (scripts/gpu/libs.lua: an NCCL world, a GEMM, a cudnn attention step):"
  grep -h '^lib \(loaded\|cudnn pick\|NCCL\|cuBLASLt\|cuDNN\):' "$L/libs.log" 2>/dev/null | sed 's/^lib /  - /'
  if [ -f "$L/libs-system-cudnn.log" ]; then
    echo "  - with DISTLAB_CUDNN=$sys_cudnn (the cudnn specs' second run): $(grep -h '^lib loaded:' \
      "$L/libs-system-cudnn.log" | grep -o 'cuDNN [^;]*')"
  fi
  echo "  - PyTorch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1 | tail -1)"
  echo "- MPS: $([ -n "$mps_ctl" ] && echo "running while the #multigpu specs ran" || echo "not started")"
  echo
  echo "| spec file | ranks | variables | passed | failed | skipped | seconds | log |"
  echo "|---|---:|---|---:|---:|---:|---:|---|"
  tot_p=0 tot_f=0 tot_s=0
  while IFS='|' read -r f ranks vars summary secs rc log; do
    if [[ "$summary" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
      p=${BASH_REMATCH[1]} fl=${BASH_REMATCH[2]} s=${BASH_REMATCH[3]}
      [ "$rc" = 0 ] || [ "$fl" != 0 ] || fl="1 (exit $rc)"
    elif [ "$summary" = "not run" ]; then
      p=0 fl="1 (not run: the budget was spent)" s=0
    else
      p=0 fl="1 ($([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo "timed out" || echo "exit $rc, no summary"))" s=0
    fi
    tot_p=$((tot_p + p)) tot_f=$((tot_f + ${fl%% *})) tot_s=$((tot_s + s))
    echo "| $(basename "$f") | $ranks | ${vars:+\`$vars\`} | $p | $fl | $s | $secs | $log |"
  done < <(sort -t'|' -k2,2n -k1,1 "$L/records" 2>/dev/null)
  echo "| **all** | | | **$tot_p** | **$tot_f** | **$tot_s** | $(($(date +%s) - t_start)) (the call) | |"
  echo
  if grep -q "SKIPPED\|TIMED OUT" "$SUM"; then
    echo "Steps that did not run or finish:"
    grep -h "SKIPPED\|TIMED OUT" "$SUM" | sed 's/^/- /'
    echo
  fi
  if grep -lqE '^(FAIL|ERROR) ' "$L"/*.log 2>/dev/null; then
    echo "## Failures (the first lines of each)"
    echo
    for log in "$L"/*.log; do
      grep -qE '^(FAIL|ERROR) ' "$log" || continue
      echo "$(basename "$log"):"
      echo '```'
      # the first 6 failures of the summary's details, 4 lines each (name, where, message)
      sed -n '/^-\{72\}$/,/^-\{72\}$/p' "$log" | grep -v '^-\{72\}$' >"$L/details.tmp"
      awk '/^(FAIL|ERROR) /{k++; n=0} k <= 6 && n++ < 4' "$L/details.tmp"
      k=$(grep -cE '^(FAIL|ERROR) ' "$L/details.tmp")
      [ "$k" -gt 6 ] && echo "... and $((k - 6)) more (the log)"
      rm -f "$L/details.tmp"
      echo '```'
    done
  fi
} >"$md"
say "results: $md: $(grep '^| \*\*all' "$md" | tr -d '*|' | awk '{print $2 " passed, " $3 " failed, " $4 " skipped"}')"
exit $status
