#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs carried) for issue 53: the soak,
# experiments/faults/soak.lua, with RANKS (default 4) ranks sharing one GPU under MPS for
# DURATION seconds (default 720): all-reduce (every algorithm), EP dispatch/combine (both
# layouts), ag_gemm/gemm_rs and CP forward/backward with shapes changing from op to op,
# every result checked, memory sampled every SAMPLE s (60) and judged after WARMUP s (240:
# soak.lua's header says why).
#   1. build (240 s), or SKIP_BUILD=1 with a build/lib/libdistlab.so built for sm_90
#      elsewhere and carried (with a build, DETACH's two calls are needed: COLLECT waits);
#   2. MPS started (MPS=0: not; the ranks' contexts then take turns on the GPU);
#   3. the soak, under DURATION + 120 s.
# Writes $OUT/soak-<gpu>.md (commit it as experiments/results/faults/soak-<gpu>.md: device,
# date, commit, the command with its variables, libraries; ops of each kind, wrong count,
# the memory samples, the verdict), $OUT/soak-summary.txt and every log in
# $OUT/soak-logs.tgz. Exit status non-zero on a wrong result, memory growth beyond 1 MiB or
# an error. CUDA_MODULE_LOADING=EAGER (unless set): every kernel of a library is loaded
# with it, so a kernel first taken after the warm-up (a GEMM shape cuBLASLt had not met)
# does not show as device memory that grew. SOAK_ARGS passes more options to soak.lua
# (--seed N, --reps N, --kinds LIST, --plant KIND); DISTLAB_COMMIT=<hash> names the commit
# where the checkout has no .git. DEVICE=cpu runs the ranks on the cpu (no MPS): the
# script's own plumbing, tried where there is no GPU.
#
# A device call runs at most 600 s, and 720 s of soak need about 780. So, by default
# (DETACH=1), the script starts itself again in a session of its own (setsid: it outlives
# the call), writing under /tmp/distlab-soak, and waits up to WAIT s (default 570) for it:
# done by then, its files are copied to $OUT as above; else the call ends saying so, and a
# second call, `COLLECT=1 scripts/gpu/soak.sh` (within the 30 s the machine stays warm),
# waits for the rest (up to 590 s) and brings the files back. DETACH=0 runs in the call
# itself (DURATION up to about 520 then).
#   SKIP_BUILD=1 scripts/gpu/soak.sh                    then, if it says so: COLLECT=1 scripts/gpu/soak.sh
#   SKIP_BUILD=1 DETACH=0 DURATION=520 scripts/gpu/soak.sh   one call
set -u
t_start=$(date +%s)
cd "$(dirname "$0")/../.." || exit 2
DURATION="${DURATION:-720}" WARMUP="${WARMUP:-240}"
SOAK_DIR=/tmp/distlab-soak
OUT="${OUT:-/tmp/distlab-out}"

# Waits up to $1 s for the detached soak to end, then brings its files to $OUT; returns its
# status (3: still running, 4: none started here).
collect() {
  local until=$(($(date +%s) + $1)) f n
  local -A shown=()
  [ -f "$SOAK_DIR/pid" ] || { echo "soak.sh: no detached soak here ($SOAK_DIR/pid): the machine was given back?"; return 4; }
  while [ ! -f "$SOAK_DIR/done" ] && [ "$(date +%s)" -lt "$until" ]; do
    # the verdicts and the soak's progress lines as they come
    for f in "$SOAK_DIR/out/soak-summary.txt" "$SOAK_DIR/out/soak/soak.log"; do
      n=$({ wc -l <"$f"; } 2>/dev/null || echo 0)
      if [ "$n" -gt "${shown[$f]:-0}" ]; then
        sed -n "$((${shown[$f]:-0} + 1)),${n}p" "$f" | grep -E '^\[soak'
        shown[$f]=$n
      fi
    done
    kill -0 "$(cat "$SOAK_DIR/pid")" 2>/dev/null || { sleep 2; break; }
    sleep 5
  done
  mkdir -p "$OUT"
  if [ ! -f "$SOAK_DIR/done" ]; then
    if kill -0 "$(cat "$SOAK_DIR/pid")" 2>/dev/null; then
      echo "soak.sh: the soak (pid $(cat "$SOAK_DIR/pid")) still runs: COLLECT=1 scripts/gpu/soak.sh within 30 s brings it back"
      cp "$SOAK_DIR/out/soak-summary.txt" "$OUT/" 2>/dev/null
      return 3
    fi
    echo "soak.sh: the detached soak ended without saying how (killed?); its files as they are:"
    echo 2 >"$SOAK_DIR/done"
  fi
  cp "$SOAK_DIR"/out/soak-*.md "$SOAK_DIR"/out/soak-summary.txt "$SOAK_DIR"/out/soak-logs.tgz "$OUT/" 2>/dev/null
  cp "$SOAK_DIR/detached.log" "$OUT/soak-detached.log" 2>/dev/null
  echo "soak.sh: the soak ended with status $(cat "$SOAK_DIR/done"); files in $OUT: $(cd "$OUT" && ls soak-* | tr '\n' ' ')"
  grep -h "^\*\*Verdict" "$OUT"/soak-*.md 2>/dev/null
  return "$(cat "$SOAK_DIR/done")"
}

if [ -n "${COLLECT:-}" ]; then
  collect "${WAIT:-590}"
  exit $?
fi
if [ "${DETACH:-1}" = 1 ] && [ -z "${SOAK_DETACHED:-}" ]; then
  if [ -f "$SOAK_DIR/pid" ] && [ ! -f "$SOAK_DIR/done" ] && kill -0 "$(cat "$SOAK_DIR/pid")" 2>/dev/null; then
    echo "soak.sh: a soak runs already (pid $(cat "$SOAK_DIR/pid")): COLLECT=1 scripts/gpu/soak.sh waits for it"
    exit 2
  fi
  rm -rf "$SOAK_DIR"
  mkdir -p "$SOAK_DIR/out"
  SOAK_DETACHED=1 OUT="$SOAK_DIR/out" setsid "$0" </dev/null >"$SOAK_DIR/detached.log" 2>&1 &
  for _ in $(seq 100); do [ -f "$SOAK_DIR/pid" ] && break; sleep 0.1; done # the detached script writes its pid
  echo "soak.sh: the soak runs detached (pid $(cat "$SOAK_DIR/pid" 2>/dev/null), files under $SOAK_DIR); waiting up to ${WAIT:-570} s"
  collect "${WAIT:-570}"
  exit $?
fi

[ -n "${SOAK_DETACHED:-}" ] && echo $$ >"$SOAK_DIR/pid"
# the budget: the soak and its start and report, and a build where none was carried
source scripts/gpu/steps.sh soak $((DURATION + 180 + $([ -n "${SKIP_BUILD:-}" ] && echo 0 || echo 240))) || { [ -n "${SOAK_DETACHED:-}" ] && echo 2 >"$SOAK_DIR/done"; exit 2; }
if [ -n "${SOAK_DETACHED:-}" ]; then
  trap 'steps_finish; echo "$status" >"$SOAK_DIR/done"' EXIT
fi
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING="${CUDA_MODULE_LOADING:-EAGER}"
# a wait that never ends fails in 60 s; the job ends within DURATION + 150 s, hung or not
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-60}" DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-$((DURATION + 150))}"
RANKS="${RANKS:-4}"
header
gpu=$(gpu_tag)
say "soak: $RANKS ranks on one ${DEVICE:-cuda} device, $DURATION s; budget $BUDGET s"
build_or_skip || exit 1
DEVICE="${DEVICE:-cuda}"
if [ "${MPS:-1}" = 1 ] && [ "$DEVICE" = cuda ]; then mps_start; else say "MPS: not started (MPS=0 or DEVICE=$DEVICE)"; fi

# the command as it was given, with the variables that change what runs
recorded=$(env | grep -E '^(DISTLAB|NCCL|CUDA)_' | grep -vE '^CUDA_MPS_' | sort | tr '\n' ' ')
cmd="${recorded}$([ -n "${SKIP_BUILD:-}" ] && echo "SKIP_BUILD=1 ")DURATION=$DURATION WARMUP=$WARMUP RANKS=$RANKS${SOAK_ARGS:+ SOAK_ARGS=\"$SOAK_ARGS\"}$([ "${MPS:-1}" = 1 ] || echo " MPS=0")$([ "$DEVICE" = cuda ] || echo " DEVICE=$DEVICE") scripts/gpu/soak.sh"
# shellcheck disable=SC2086
step "soak ($RANKS ranks, $DURATION s)" $((DURATION + 150)) "$L/soak.log" \
  ./distlab run -n "$RANKS" --device "$DEVICE" experiments/faults/soak.lua --duration "$DURATION" \
  --warmup "$WARMUP" --sample "${SAMPLE:-60}" --out "$OUT" --tag "$gpu" --command "$cmd" ${SOAK_ARGS:-}
grep -h "^\[soak" "$L/soak.log" | tee -a "$SUM"
grep -h "^soak: " "$L/soak.log" | head -25 | tee -a "$SUM"
[ -f "$OUT/soak-$gpu.md" ] || { say "no results file: $OUT/soak-$gpu.md"; status=1; }
exit $status
