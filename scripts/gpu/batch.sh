#!/usr/bin/env bash
# One device call, several checks: runs each given step (a script under
# scripts/gpu/ with its arguments, or `test` for the whole spec suite, or
# `foundation`) with OUT pointing at a scratch folder ($OUT/batch), each under its own time
# limit and all within BUDGET (default 590 s), packing that folder into $OUT/batch-logs.tgz
# after every step, so a device call cut at its limit returns the steps that ended. The log
# of each step is printed as it runs; the verdicts go to $OUT/batch-summary.txt.
#   scripts/gpu/batch.sh "test" "attn_lab.sh QUICK=1" "comm_check.sh bench"
#   scripts/gpu/batch.sh "specs spec/a_spec.lua spec/b_spec.lua"   (each file under FILE_TIMEOUT)
# (words with '=' become the step's environment, the others its arguments)
# Every step gets STEP_TIMEOUT seconds (default 300), each spec file FILE_TIMEOUT (90).
# SKIP_BUILD=1: no build where build/lib/libdistlab.so is there (carried).
# (scripts/gpu/suite.sh is the whole suite, #multigpu with shared ranks included, in one call.)
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" batch 590 || exit 2
pack() { tar czf "$OUT/batch-logs.tgz" -C "$OUT" "$(basename "$L")" 2>/dev/null; }
header | tee "$L/machine.txt" >/dev/null
build_or_skip || exit 1
for s in "$@"; do
  name=${s%% *}
  args=""
  [ "$name" != "$s" ] && args=${s#* }
  say "=== $s"
  case "$name" in
    test) step "test $args" "${STEP_TIMEOUT:-300}" "$L/test.log" ./distlab test $args
          grep -E "^(FAIL|ERROR)|skipping|passed," "$L/test.log" | tail -30 ;;
    specs) # each spec file alone, under its own limit, so one hang costs one file
          for f in ${args:-spec/*_spec.lua}; do
            log="$L/$(basename "$f" .lua).log"
            step "$(basename "$f")" "${FILE_TIMEOUT:-90}" "$log" busted --run=default -o spec/support/summary.lua "$f"
            grep -E "^(FAIL|ERROR)" "$log" | head -8
          done ;;
    foundation) OUT="$L" step foundation "${STEP_TIMEOUT:-300}" "$L/foundation.log" bash scripts/gpu/check.sh foundation
          tail -30 "$L/foundation.log" ;;
    *.sh) envs=() pos=()
          for a in $args; do if [[ "$a" == *=* ]]; then envs+=("$a"); else pos+=("$a"); fi; done
          OUT="$L" step "$s" "${STEP_TIMEOUT:-300}" "$L/${name%.sh}.log" env "${envs[@]}" bash "scripts/gpu/$name" "${pos[@]}"
          tail -40 "$L/${name%.sh}.log" ;;
    *) say "unknown step $name"; status=1 ;;
  esac
  pack # after every step: a call cut at its time limit still brings back what ran
done
exit $status
