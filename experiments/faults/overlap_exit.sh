#!/usr/bin/env bash
# experiments/faults/overlap_exit.sh [trials] [ranks] — runs overlap_exit.lua
# `trials` times (100) at `ranks` ranks (3) on cpu and counts the runs in
# which some rank's check of a completed run failed (0 is the goal).
set -u
cd "$(dirname "$0")/../.." || exit 2
trials="${1:-100}" n="${2:-3}" spurious=0 broken=0
for ((t = 1; t <= trials; t++)); do
  out="$(./distlab run -n "$n" --device cpu experiments/faults/overlap_exit.lua 2>&1)"
  rc=$?
  if [ "$(grep -c '^CLEAN ' <<<"$out")" -ne "$n" ]; then
    if grep -q '^SPURIOUS ' <<<"$out"; then spurious=$((spurious + 1)); else broken=$((broken + 1)); fi
    [ "$((spurious + broken))" -le 2 ] && printf 'trial %d (exit %d):\n%s\n' "$t" "$rc" "$out"
  fi
done
echo "overlap_exit: $spurious of $trials runs at $n ranks with a spurious error, $broken otherwise broken"
[ "$spurious" -eq 0 ] && [ "$broken" -eq 0 ]
