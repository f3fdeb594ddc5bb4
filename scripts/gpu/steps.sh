# Sourced by a remote script on a GPU host after scripts/gpu/setup.sh: the
# budgeted steps, the summary file and the packed logs that every whole-check
# script uses. Before sourcing, set NAME (the script's short name), L (its log
# folder under $OUT), SUM (the summary file), BUDGET (seconds) and t_start
# (`date +%s` at the script's start). Gives:
#   say MSG...               a line "[NAME +Ts] MSG" on stdout and in $SUM
#   step NAME LIMIT LOG CMD  CMD under min(LIMIT, what is left of BUDGET less 10 s for
#                            packing; under 5 s: skipped and failed), output into LOG, one
#                            verdict line (and LOG's last line) in $SUM; a failure sets status=1
#   header                   date, GPUs, commit ($DISTLAB_COMMIT or git), torch into $SUM
#   gpu_tag                  the GPU model in lower case (h200), "gpu" if unknown
#   build_or_skip            ./distlab build as a step, or, with SKIP_BUILD set and
#                            build/lib/libdistlab.so there (built and stripped elsewhere,
#                            carried), a line saying it was skipped; false if the build failed
#   mps_start                the MPS daemon (for ranks sharing a GPU); stopped at exit
#   unpack_carried_cudnn     the cuDNN carried in .deps/cudnn-lib, if any: carried_dir, carried_libs
#   pick_cudnn               DISTLAB_CUDNN = that carried cuDNN, else PyTorch's libcudnn where present (9.19 on
#                            the lent hosts; the same speed as the system's 9.14 in
#                            cudnn.sh's pick, and newer), DL_ENV = the environment for
#                            distlab's commands (its folder's neighbours on LD_LIBRARY_PATH)
# At exit: MPS stopped, $SUM copied into $L, $L packed into $OUT/NAME-logs.tgz.
status=0
deadline=$((t_start + BUDGET))
say() { echo "[$NAME +$(($(date +%s) - t_start)) s] $*" | tee -a "$SUM"; }
build_or_skip() {
  if [ -n "${SKIP_BUILD:-}" ] && [ -f build/lib/libdistlab.so ]; then
    say "build: skipped (SKIP_BUILD: the build/lib/libdistlab.so carried here)"
  else
    step build 240 "$L/build.log" ./distlab build
  fi
}

mps_ctl=""
steps_finish() {
  [ -n "$mps_ctl" ] && echo quit | "$mps_ctl" >/dev/null 2>&1
  cp "$SUM" "$L/" 2>/dev/null
  tar -czf "$OUT/$NAME-logs.tgz" -C "$(dirname "$L")" "$(basename "$L")"
  say "done, status $status; logs: $OUT/$NAME-logs.tgz"
}
trap steps_finish EXIT

step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((deadline - $(date +%s) - 10))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    status=1
    say "$name: SKIPPED (the ${BUDGET} s budget is spent)"
    return 1
  fi
  local t0 rc verdict
  t0=$(date +%s)
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

PY=/opt/torch/.venv/bin/python
[ -x "$PY" ] || PY=python3

header() {
  {
    date -u '+%Y-%m-%d %H:%M UTC'
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
    echo "commit: ${DISTLAB_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)}"
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1
  } | tee -a "$SUM"
}

gpu_tag() {
  local g
  g=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE '[AHBL][0-9]+' | head -1 | tr '[:upper:]' '[:lower:]')
  echo "${g:-gpu}"
}

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

# unpack_carried_cudnn: the cuDNN carried in .deps/cudnn-lib (scripts/fetch-cudnn-lib.sh: a
# pinned, newer cuDNN's GRAPH_JIT_ONLY sub-libraries, xz), unpacked once into carried_dir;
# carried_libs = that folder and an NVRTC 13's (PyTorch's wheel's or the toolkit's) for the
# loader's path. Both empty where nothing was carried.
unpack_carried_cudnn() {
  local x so n
  carried_dir="" carried_libs=""
  [ -f .deps/cudnn-lib/VERSION ] || return 0
  carried_dir="/tmp/distlab-cudnn-$(cat .deps/cudnn-lib/VERSION)/lib"
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

DL_ENV=(env)
pick_cudnn() {
  local f libs d
  unpack_carried_cudnn
  if [ -n "$carried_dir" ]; then # newer than PyTorch's; its thd backward is faster (attn-h200-cudnn928.md)
    export DISTLAB_CUDNN="$carried_dir/libcudnn.so.9"
    DL_ENV=(env CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY LD_LIBRARY_PATH="$carried_libs:${LD_LIBRARY_PATH:-}")
    say "cuDNN for distlab: $DISTLAB_CUDNN (carried; CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY)"
    return 0
  fi
  for f in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9; do
    [ -e "$f" ] || continue
    libs="$(dirname "$(readlink -f "$f")")"
    for d in "$(dirname "$f")"/../../*/lib; do [ -d "$d" ] && libs="$libs:$(readlink -f "$d")"; done
    export DISTLAB_CUDNN="$(readlink -f "$f")"
    DL_ENV=(env LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}")
    say "cuDNN for distlab: $DISTLAB_CUDNN"
    return 0
  done
  say "cuDNN for distlab: the loader's (no PyTorch wheel's found)"
}
