#!/usr/bin/env bash
# One device call, several checks: runs each given step (a script under
# scripts/gpu/ with its arguments, or `test` for the whole spec suite, or
# `foundation`) with OUT pointing at a scratch folder, each under its own time
# limit, then packs that folder into $OUT/out.tgz, because a device call
# returns at most 8 files. The log of each step is printed as it runs.
#   scripts/gpu/batch.sh "test" "attn_lab.sh QUICK=1" "comm_check.sh bench"
#   scripts/gpu/batch.sh "specs spec/a_spec.lua spec/b_spec.lua"   (each file under FILE_TIMEOUT)
# (words with '=' become the step's environment, the others its arguments)
# Every step gets STEP_TIMEOUT seconds (default 300). out.tgz is packed after
# every step, so a device call cut at its limit returns the steps that ended.
# SKIP_BUILD=1: no build where build/lib/libdistlab.so is there (carried).
set -u
REAL_OUT="${OUT:-/tmp/distlab-out}"
export OUT=/tmp/distlab-batch
rm -rf "$OUT"
mkdir -p "$OUT" "$REAL_OUT"
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
pack() { tar czf "$REAL_OUT/out.tgz" -C "$OUT" . 2>/dev/null; }
trap pack EXIT
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
} | tee "$OUT/machine.txt"
t0=$(date +%s)
if [ -n "${SKIP_BUILD:-}" ] && [ -f build/lib/libdistlab.so ]; then
  echo "build: skipped (SKIP_BUILD: the build/lib/libdistlab.so carried here)" | tee "$OUT/build.log"
else
  ./distlab build 2>&1 | tail -3 | tee "$OUT/build.log"
  echo "build: $(( $(date +%s) - t0 )) s"
fi
for step in "$@"; do
  name=${step%% *}
  args=""
  [ "$name" != "$step" ] && args=${step#* }
  echo "=== $step ($(date -u +%T))"
  case "$name" in
    test) timeout "${STEP_TIMEOUT:-300}" ./distlab test $args >"$OUT/test.log" 2>&1
          grep -E "^(FAIL|ERROR)|skipping|passed," "$OUT/test.log" | tail -30 ;;
    specs) # each spec file alone, under its own limit, so one hang costs one file
          for f in ${args:-spec/*_spec.lua}; do
            timeout "${FILE_TIMEOUT:-90}" busted --run=default -o spec/support/summary.lua "$f" >"$OUT/$(basename "$f" .lua).log" 2>&1
            rc=$?
            echo "$(basename "$f"): $(tail -n 1 "$OUT/$(basename "$f" .lua).log")$([ $rc = 124 ] && echo ' TIMED OUT')"
            grep -E "^(FAIL|ERROR)" "$OUT/$(basename "$f" .lua).log" | head -8
          done ;;
    foundation) timeout "${STEP_TIMEOUT:-300}" bash scripts/gpu/check.sh foundation 2>&1 | tail -30 ;;
    *.sh) envs=() pos=()
          for a in $args; do if [[ "$a" == *=* ]]; then envs+=("$a"); else pos+=("$a"); fi; done
          env "${envs[@]}" timeout "${STEP_TIMEOUT:-300}" bash "scripts/gpu/$name" "${pos[@]}" 2>&1 | tail -40 ;;
    *) echo "unknown step $name" ;;
  esac
  pack # after every step: a call cut at its time limit still brings back what ran
done
echo "=== done ($(( $(date +%s) - t0 )) s)"
