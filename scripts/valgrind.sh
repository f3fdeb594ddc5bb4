#!/usr/bin/env bash
# Runs the CPU specs under valgrind's memcheck and fails on any leak that is
# definitely or indirectly lost, and on invalid reads/writes in libdistlab.
# The launcher/REPL specs start other processes and are left out.
#   scripts/valgrind.sh [spec files...]
set -u
cd "$(dirname "$0")/.." || exit 2
./distlab build >/dev/null || exit 2
export DISTLAB_ROOT="$PWD" LUA_PATH="bindings/?.lua;bindings/?/init.lua;spec/?.lua;;"
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=($(ls spec/*_spec.lua | grep -v -e launcher_spec -e comm_spec -e symm_spec))
log=$(mktemp /tmp/distlab-valgrind.XXXXXX)
valgrind --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
  --num-callers=30 --log-file="$log" \
  luajit "$(command -v busted)" --ignore-lua --run=default --exclude-tags=gpu,multigpu,slow \
  -o spec/support/summary.lua "${specs[@]}" | tail -n 1
grep -E "definitely lost|indirectly lost|ERROR SUMMARY|Invalid (read|write)" "$log"
bad=$(grep -cE "Invalid (read|write)|Conditional jump" "$log")
lost=$(grep -E "definitely lost:|indirectly lost:" "$log" | grep -vc " 0 bytes")
echo "valgrind log: $log"
if [ "$bad" -gt 0 ] || [ "$lost" -gt 0 ]; then echo "valgrind: problems found"; exit 1; fi
echo "valgrind: no leaks, no invalid accesses"
