#!/usr/bin/env bash
# Runs the CPU specs under valgrind's memcheck and fails on any leak that is
# definitely or indirectly lost, and on invalid reads/writes or uses of
# uninitialised values in libdistlab. The specs that start ranks (comm, symm,
# launcher, and any other that runs `distlab run`) run every rank under
# memcheck too: LUAJIT is a wrapper the launcher uses for each rank, each
# writing its own log. The faults spec (kill trials, 1 s bounds) and the
# REPL's pseudo-terminal specs are left out: memcheck's slowdown is the point
# of neither. Takes a while (every rank is 20-50x slower): the default set
# about 30-40 minutes on 2 cores.
#   scripts/valgrind.sh [spec files...]
# valgrind: `apt-get install valgrind` (Debian 12).
set -u
cd "$(dirname "$0")/.." || exit 2
command -v valgrind >/dev/null || { echo "valgrind.sh: no valgrind (apt-get install valgrind)"; exit 2; }
./distlab build >/dev/null || exit 2
export DISTLAB_ROOT="$PWD" LUA_PATH="bindings/?.lua;bindings/?/init.lua;spec/?.lua;;"
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=($(ls spec/*_spec.lua | grep -v -e faults_spec -e repl_spec))
dir=$(mktemp -d /tmp/distlab-valgrind.XXXXXX)
vg=(valgrind --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect
  --num-callers=30)
# the ranks' luajit: the same checks, a log per process
cat >"$dir/luajit" <<EOF
#!/bin/sh
exec ${vg[*]} --log-file=$dir/rank-%p.log luajit "\$@"
EOF
chmod +x "$dir/luajit"
LUAJIT="$dir/luajit" "${vg[@]}" --log-file="$dir/busted.log" \
  luajit "$(command -v busted)" --ignore-lua --run=default --exclude-tags=gpu,multigpu,slow \
  -o spec/support/summary.lua "${specs[@]}" >"$dir/specs.out" 2>&1
# a spec that fails under memcheck's slowdown (a time bound) is shown, not counted
grep -E "^FAIL" "$dir/specs.out"
tail -n 1 "$dir/specs.out"
logs=("$dir"/busted.log "$dir"/rank-*.log)
bad=$(grep -lE "Invalid (read|write)|Conditional jump|uninitialised" "${logs[@]}" | wc -l)
lost=$(grep -E "definitely lost:|indirectly lost:" "${logs[@]}" | grep -vc " 0 bytes")
echo "valgrind: ${#logs[@]} processes (busted and every rank it started), logs in $dir"
grep -lE "Invalid (read|write)|Conditional jump|uninitialised" "${logs[@]}" | head
grep -E "definitely lost:|indirectly lost:" "${logs[@]}" | grep -v " 0 bytes" | head
if [ "$bad" -gt 0 ] || [ "$lost" -gt 0 ]; then echo "valgrind: problems found"; exit 1; fi
echo "valgrind: no leaks, no invalid accesses"
