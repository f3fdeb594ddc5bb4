# shellcheck shell=bash
# scripts/gpu/steps.sh — the skeleton of every remote step on a GPU host (scripts/gpu/*.sh),
# sourced first, before anything else the script does:
#   source "$(dirname "$0")/steps.sh" NAME [BUDGET]
# It goes to the repository root (once), unpacks the carried tools (setup.sh) and sets
#   OUT      where the call's files come back ($OUT, default /tmp/distlab-out), made
#   L        the script's logs, $OUT/NAME (made afresh), packed into $OUT/NAME-logs.tgz at exit;
#            with LAYOUT=flat set before sourcing (the lab steps), $OUT itself, not packed
#   SUM      the verdicts, $OUT/NAME-summary.txt or $OUT/$SUM_NAME (set before sourcing), started empty
#   t_start  `date +%s` when the script began (unpacking the .debs counts), BUDGET the seconds
#            every step must end within ($BUDGET, else the second argument, else 540)
#   status   0, 1 once a step failed; PY PyTorch's python (/opt/torch/.venv), else python3
# and gives
#   want WORD                whether STEPS (the script's list of steps) holds WORD
#   say MSG...               "[NAME +Ts] MSG" on stdout and in $SUM
#   step NAME LIMIT LOG CMD  CMD under min(LIMIT, what is left of BUDGET less 10 s for packing;
#                            under 5 s: skipped and failed), in its own process group, output
#                            into LOG, one verdict line (and LOG's last line) in $SUM; a failure
#                            sets status=1; returns CMD's exit code
#   header                   date, GPUs, commit ($DISTLAB_COMMIT or git), torch into $SUM
#   gpu_tag                  the GPU model in lower case (h200), "gpu" if unknown
#   build_or_skip            ./distlab build as a step, or, with SKIP_BUILD set and
#                            build/lib/libdistlab.so there (built and stripped elsewhere,
#                            carried), a line saying it was skipped; false if the build failed,
#                            or if SKIP_BUILD is set and no library is there (no build then)
#   mps_start, mps_stop      the MPS daemon (for ranks sharing a GPU); stopped at exit
#   unpack_carried_cudnn     the cuDNN carried in .deps/cudnn-lib (scripts/fetch-cudnn-lib.sh),
#                            unpacked once into .deps/cudnn-lib/lib, where libdistlab's pick finds
#                            it (core/ops/attn/cudnn_lib.c): carried_dir, carried_libs (with an
#                            NVRTC 13's folder), both empty where nothing was carried
#   pick_cudnn               the carried cuDNN unpacked, and a line naming the libcudnn distlab
#                            will take (the newest it finds: the carried one, PyTorch's wheel,
#                            the system's; DISTLAB_CUDNN overrides)
#   system_cudnn             the path of the system's libcudnn.so.9 (the loader's), or nothing
#   unpack_carried_nccl_ep   NCCL EP and its NCCL carried in .deps/nccl-ep-carry (scripts/fetch-nccl-ep.sh
#                            --nccl --carry) unpacked once into .deps/nccl-ep, where libdistlab opens it;
#                            DLENV: the command prefix that puts that NCCL first for distlab's runs
#                            (env LD_LIBRARY_PATH=...; plain `env` where nothing was carried), so
#                            PyTorch's anchors keep their own NCCL
#   list_rev "W1 W2 ..."     the words in reverse order (the A/B scripts' even rounds)
#   knobs_ok KNOBS           whether KNOBS is empty or VAR=V[,VAR=V] (a VARIANTS entry's knobs)
#   fa4_site                 FlashAttention-4 for $PY: importable already, or installed from the
#                            wheel sets carried from .deps/fa4/1 and /2 (scripts/fetch-fa4.sh; one
#                            a call, kept in build/fa4-wheels) into build/fa4site, on PYTHONPATH;
#                            FA4 names the version, or is empty (with a line saying what is missing)
# At exit: MPS stopped, $SUM copied into $L, $L packed into $OUT/NAME-logs.tgz and removed (KEEP_LOGS=1 keeps it).
t_start=${t_start:-$(date +%s)}
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
source scripts/gpu/setup.sh || exit 2
NAME=${1:?steps.sh: source it with the name of the script}
BUDGET=${BUDGET:-${2:-540}}
OUT="${OUT:-/tmp/distlab-out}"
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
if [ "${LAYOUT:-}" = flat ]; then
  L="$OUT"
else
  L="$OUT/$NAME"
  rm -rf "$L"
  mkdir -p "$L"
fi
SUM="$OUT/${SUM_NAME:-$NAME-summary.txt}"
: >"$SUM"
status=0
deadline=$((t_start + BUDGET))
PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3

want() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
list_rev() { echo "$1" | tr ' ' '\n' | grep . | tac | tr '\n' ' '; }
knobs_ok() { [ -z "$1" ] || [[ "$1" =~ ^[A-Z_0-9]+=[^,]*(,[A-Z_0-9]+=[^,]*)*$ ]]; }
say() { echo "[$NAME +$(($(date +%s) - t_start)) s] $*" | tee -a "$SUM"; }

step() {
  local name=$1 limit=$2 log=$3
  shift 3
  # STEP_RESERVE (10 s): what the budget keeps for packing; a step that must run inside it (a report of
  # whatever ran) is called with STEP_RESERVE=0
  local left=$((deadline - $(date +%s) - ${STEP_RESERVE:-10}))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    status=1
    say "$name: SKIPPED (the ${BUDGET} s budget is spent)"
    return 1
  fi
  local t0 rc verdict
  t0=$(date +%s)
  # timeout runs CMD in a process group of its own and signals all of it: a hung rank
  # the launcher started cannot keep the GPU busy for the next step
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) verdict=ok ;;
    124 | 137) verdict="TIMED OUT after $limit s" ;;
    *) verdict="FAILED (exit $rc)" ;;
  esac
  [ $rc = 0 ] || status=1
  say "$name: $verdict in $(($(date +%s) - t0)) s; $(tail -n 1 "$log")"
  return $rc
}

header() {
  {
    date -u '+%Y-%m-%d %H:%M UTC'
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
    echo "commit: ${HEADER_COMMIT:-${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}}"
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1
  } | tee -a "$SUM"
}

# The call as made, for a results file's header: every exported variable named DISTLAB_*, NCCL_*, CUDA_* or
# matching $1 (an ERE of the script's own knobs), as VAR=value (in double quotes where the value has other
# characters than [A-Za-z0-9_./,:=+@%-]), then the script. Exported only: what the caller set, not the
# script's own defaults.
call_line() {
  local v val out=
  for v in $(compgen -e | grep -E "^((DISTLAB|NCCL|CUDA)_[A-Z0-9_]*|${1:-})\$" | sort); do
    val=${!v}
    if [[ "$val" =~ ^[A-Za-z0-9_./,:=+@%-]*$ ]]; then out+="$v=$val "; else out+="$v=\"${val//\"/\\\"}\" "; fi
  done
  echo "${out}scripts/gpu/$NAME.sh"
}

gpu_tag() {
  local g
  g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE '[AHBL][0-9]+' | head -1 | tr '[:upper:]' '[:lower:]')
  echo "${g:-gpu}"
}

build_or_skip() {
  if [ -n "${SKIP_BUILD:-}" ] && [ -f build/lib/libdistlab.so ]; then
    say "build: skipped (SKIP_BUILD: the build/lib/libdistlab.so carried here)"
  elif [ -n "${SKIP_BUILD:-}" ]; then
    # a call that meant to run a carried library, on a machine without it (a fresh one: the warm one was
    # released), would otherwise build its own here, without what was carried for it (cuDNN's frontend)
    say "build: SKIP_BUILD is set but there is no build/lib/libdistlab.so (a fresh machine? unpack the carried library first; unset SKIP_BUILD to build here)"
    status=1
    return 1
  else
    step build 240 "$L/build.log" ./distlab build
  fi
}

mps_ctl=""
mps_start() {
  local ctl
  ctl="$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null)"
  [ -n "$ctl" ] || { say "MPS: no nvidia-cuda-mps-control here"; return 1; }
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/distlab-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/distlab-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$ctl" -d && mps_ctl=$ctl
  export PATH="$(dirname "$ctl"):$PATH" # the launcher looks for the daemon by name
  say "MPS: $([ -n "$mps_ctl" ] && echo "running ($ctl)" || echo "failed to start")"
}
mps_stop() {
  [ -n "$mps_ctl" ] || return 0
  echo quit | "$mps_ctl" >/dev/null 2>&1
  mps_ctl=""
  sleep 1
  say "MPS: stopped"
}

steps_finish() {
  local rc=$? # the script's exit status: an `exit 2` before any step (bad input) is the status said
  [ "$rc" != 0 ] && [ "$status" = 0 ] && status=$rc
  [ -n "$mps_ctl" ] && echo quit | "$mps_ctl" >/dev/null 2>&1
  if [ "$L" != "$OUT" ]; then
    cp "$SUM" "$L/" 2>/dev/null
    # packed, then gone unless KEEP_LOGS: a device call brings back a few files only, and loose logs
    # crowded a results file out (session 14's whole-suite call returned neither suite-h200.md nor its logs)
    tar -czf "$OUT/$NAME-logs.tgz" -C "$(dirname "$L")" "$(basename "$L")" && [ -z "${KEEP_LOGS:-}" ] && rm -rf "$L"
    say "done, status $status; logs: $OUT/$NAME-logs.tgz"
  else
    say "done, status $status"
  fi
}
trap steps_finish EXIT

unpack_carried_cudnn() {
  local x so n
  carried_dir="" carried_libs=""
  [ -f .deps/cudnn-lib/VERSION ] || return 0
  carried_dir="$PWD/.deps/cudnn-lib/lib"
  mkdir -p "$carried_dir"
  for x in .deps/cudnn-lib/*.so.9.xz; do
    so="$carried_dir/$(basename "$x" .xz)"
    if [ ! -f "$so" ]; then xz -d -c "$x" >"$so.tmp" && mv "$so.tmp" "$so"; fi
  done
  carried_libs="$carried_dir"
  for n in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.13* /usr/local/cuda/lib64/libnvrtc.so.13*; do
    [ -e "$n" ] && { carried_libs="$carried_libs:$(dirname "$(readlink -f "$n")")"; break; }
  done
  say "carried cuDNN $(cat .deps/cudnn-lib/VERSION) in $carried_dir (NVRTC from ${carried_libs#*:})"
}

pick_cudnn() {
  unpack_carried_cudnn
  say "cuDNN for distlab: $(DISTLAB_ROOT="$PWD" LUA_PATH="bindings/?.lua;bindings/?/init.lua;${LUA_PATH:-;}" \
    luajit -e 'io.write(require("distlab").attn.cudnn_info().pick)' 2>&1 | tail -1)"
}

system_cudnn() {
  local f
  f=$(ldconfig -p 2>/dev/null | awk '$1 == "libcudnn.so.9" { print $NF; exit }')
  [ -n "$f" ] && readlink -f "$f"
}

DLENV=(env)
unpack_carried_nccl_ep() {
  local c=.deps/nccl-ep-carry d=.deps/nccl-ep
  [ -f "$c/VERSION" ] || return 0
  if [ ! -f "$d/nccl/lib/libnccl.so.2" ] || [ "$(cat "$d/nccl/VERSION" 2>/dev/null)" != "$(cat "$c/nccl/VERSION")" ]; then
    rm -rf "$d" && mkdir -p "$d/lib" "$d/nccl/lib" &&
      cp -r "$c/include" "$c/VERSION" "$d/" && cp -r "$c/nccl/include" "$c/nccl/VERSION" "$d/nccl/" &&
      xz -d -c "$c/lib/libnccl_ep.so.xz" >"$d/lib/libnccl_ep.so" &&
      xz -d -c "$c/nccl/libnccl.so.2.xz" >"$d/nccl/lib/libnccl.so.2" ||
      { say "carried NCCL EP: unpacking failed"; rm -rf "$d"; return 1; }
  fi
  DLENV=(env LD_LIBRARY_PATH="$PWD/$d/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  say "carried NCCL EP $(cat "$d/VERSION") (nccl-extensions) with NCCL $(cat "$d/nccl/VERSION") (sm_$(cat "$c/nccl/SM") only), first on distlab's LD_LIBRARY_PATH"
}

fa4_site() {
  local d f missing=""
  FA4=""
  # build/fa4site and what nvidia-cutlass-dsl's .pth adds (PYTHONPATH folders' .pth files are not read)
  local site="$PWD/build/fa4site:$PWD/build/fa4site/nvidia_cutlass_dsl/dsl_packages"
  if [ -d build/fa4site/flash_attn ]; then export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"; fi
  if ! "$PY" -c 'import flash_attn.cute' >/dev/null 2>&1; then
    mkdir -p build/fa4-wheels
    for d in .deps/fa4/1 .deps/fa4/2; do [ -d "$d" ] && cp -u "$d"/* build/fa4-wheels/; done
    [ -f build/fa4-wheels/FILES ] || { say "FA4: not installed and no wheels carried (scripts/fetch-fa4.sh)"; return 1; }
    while read -r f; do [ -f "build/fa4-wheels/$f" ] || missing="$missing $f"; done <build/fa4-wheels/FILES
    [ -z "$missing" ] || { say "FA4: still missing (carry the other set of .deps/fa4):$missing"; return 1; }
    rm -rf build/fa4site && mkdir -p build/fa4site
    # the wheels, then the repacked one merged over them (pip --target skips folders that exist)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target build/fa4site \
      build/fa4-wheels/*.whl >"$L/fa4-install.log" 2>&1 &&
      cat build/fa4-wheels/*.tar.xz.part-* | xz -d | tar -C build/fa4site -xf - 2>>"$L/fa4-install.log" ||
      { say "FA4: install failed: $(tail -1 "$L/fa4-install.log")"; return 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  "$PY" -c 'import flash_attn.cute' >"$L/fa4-import.log" 2>&1 ||
    { say "FA4: installed but does not import: $(tail -1 "$L/fa4-import.log")"; return 1; }
  # compiled kernels kept on disk between processes (the runs before and after ours)
  export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$PWD/build/fa4cache"
  FA4=$("$PY" -c 'import importlib.metadata as m; print(m.version("flash-attn-4"))' 2>&1 | tail -1)
  say "FA4: flash-attn-4 $FA4 ($("$PY" -c 'import flash_attn.cute, os; print(os.path.dirname(flash_attn.cute.__file__))' 2>&1 | tail -1))"
}
