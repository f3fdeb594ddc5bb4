#!/usr/bin/env bash
# EP survivors of a dead rank (experiments/faults/ep_death.lua) on cpu: TRIALS
# (default 20) trials of each of kill -9 and exit(1), with the launcher
# (./distlab run) and without (ranks started here with the variables a
# launcher sets), alternately 2 and 3 ranks. A survivor passes when it ends
# within 1 s of the death with an error naming the dead rank ("rank R (pid
# P) has exited"). Prints one line per case: trials, survivors, passed, the
# slowest survivor; exits 1 if any survivor failed.
#   experiments/faults/ep_deaths.sh        TRIALS=5 experiments/faults/ep_deaths.sh
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
TRIALS="${TRIALS:-20}"
export LUA_PATH="$ROOT/bindings/?.lua;$ROOT/bindings/?/init.lua;$ROOT/?.lua;;"
bad=0

# A port for rank 0's store outside the kernel's range for outgoing
# connections, whose local ports (a busy host's clients) a listener cannot
# take (the launcher's choice, scripts/distlab's free_port).
port() {
  local lo=32768 hi=60999 base span
  read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  if [ "$lo" -gt 12000 ]; then base=10000 span=$((lo - 10000)); else base=$((hi + 1)) span=$((65535 - hi)); fi
  [ "$span" -ge 1000 ] || base=20000 span=40000
  echo $((base + RANDOM % span))
}

# One trial's output, ranks started without the launcher, each stopped
# after 60 s (they ignore SIGTERM: KILL); returns 1 where rank 0 could not
# serve the store on the port (another process had it), the other ranks
# stopped at once rather than after 30 s at a closed port.
bare_once() { # n how seed port
  local n=$1 how=$2 seed=$3 port=$4 pids=() outs=() r dir t0=$SECONDS
  dir=$(mktemp -d)
  for ((r = 0; r < n; r++)); do
    DISTLAB_RANK=$r DISTLAB_WORLD_SIZE=$n DISTLAB_LOCAL_RANK=$r DISTLAB_LOCAL_WORLD_SIZE=$n DISTLAB_DEVICE=cpu \
      DISTLAB_JOB_ID="epd$$-$seed" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      luajit experiments/faults/ep_death.lua "$how" "$seed" >"$dir/$r" 2>&1 &
    pids+=($!)
    outs+=("$dir/$r")
  done
  local taken=0
  while kill -0 "${pids[@]}" 2>/dev/null; do # a rank still runs
    grep -qs "rank 0 cannot serve the store" "$dir/0" && taken=1
    if [ $taken = 1 ] || [ $((SECONDS - t0)) -ge 60 ]; then
      kill -KILL "${pids[@]}" 2>/dev/null
      break
    fi
    sleep 0.1
  done
  wait "${pids[@]}" 2>/dev/null # no "Killed" lines: the ranks' own output is in $dir
  [ $taken = 1 ] || cat "${outs[@]}"
  rm -rf "$dir"
  return $taken
}

bare() { # n how seed
  local try
  for try in 1 2 3 4 5; do bare_once "$@" "$(port)" && return; done
  echo "bare: rank 0 could not serve the store on 5 ports"
}

for launcher in yes no; do
  for how in kill9 exit1; do
    survivors=0 passed=0 worst=0 fails=""
    for ((seed = 1; seed <= TRIALS; seed++)); do
      n=$((seed % 2 == 0 ? 2 : 3))
      victim=$((seed % 4 == 0 ? 0 : n - 1))
      if [ "$launcher" = yes ]; then
        out=$(DISTLAB_JOB_TIMEOUT=60 ./distlab run -n $n --device cpu experiments/faults/ep_death.lua "$how" "$seed" 2>&1)
      else
        out=$(bare $n "$how" "$seed")
      fi
      while read -r _ rank secs msg; do
        survivors=$((survivors + 1))
        if [[ "$msg" =~ ^ERR:.*"rank $victim (pid "[0-9]+") has exited" ]] &&
          awk -v s="$secs" 'BEGIN { exit !(s <= 1.0) }'; then
          passed=$((passed + 1))
        else
          fails+=$'\n'"  seed $seed rank $rank after $secs s: $msg"
        fi
        worst=$(awk -v a="$worst" -v b="$secs" 'BEGIN { print (b > a ? b : a) }')
      done < <(printf '%s\n' "$out" | grep '^SURVIVOR ')
      want=$((n - 1))
      got=$(printf '%s\n' "$out" | grep -c '^SURVIVOR ')
      [ "$got" -eq "$want" ] || fails+=$'\n'"  seed $seed: $got of $want survivors reported"$'\n'"$out"
    done
    printf 'launcher %-3s %-5s: %d trials, %d survivors, %d failed within 1 s naming the dead rank, slowest %.3f s%s\n' \
      "$launcher" "$how" "$TRIALS" "$survivors" "$passed" "$worst" "$fails"
    [ -z "$fails" ] || bad=1
  done
done
exit $bad
