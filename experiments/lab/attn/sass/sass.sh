#!/usr/bin/env bash
# experiments/lab/attn/sass/sass.sh: SASS of the Hopper attention kernels, ours and FlashAttention-4's sm90
# forward, on a machine without a GPU (the CPU machine), for reading them side by side (FA4-GAP.md section 13).
#   ours                 nvcc -cubin of kernels/attn/hopper/attn_hopper.cu (sm_90a), disassembled: build/sass/ours.sass
#   fa4 D CAUSAL         FA4's FlashAttentionForwardSm90 at head dim D (64 or 128), CAUSAL 0 or 1, as FA4's
#                        interface picks its tile for sm90 (d 128: 128 x 128; d 64: 192 x 128; RS, intra-warpgroup
#                        overlap), compiled by the CuTe DSL for sm_90a with fake tensors: build/sass/fa4-fwd-dD-cC.sass
#   fa4bwd D CAUSAL      FA4's FlashAttentionBackwardSm90 likewise (fa4_compile_bwd.py: its sm90 tile; two lines of
#                        quack's copy_utils.py rewritten in a copy, which the DSL does not trace here otherwise):
#                        build/sass/fa4-bwd-dD-cC.sass
#   loops FILE           per kernel of a .sass file: its instructions, and in the first window from a
#                        `WARPGROUP.DEPBAR.LE gsb0, 0x1` to the next `... 0x0` (the forward: S in, then P V in; the
#                        first may be a masked block's path, so read the file where it matters) the MUFU.EX2, FMNMX
#   events FILE FROM TO  the order of lines FROM-TO's waits, barriers, wgmma groups, arrives and softmax arithmetic
#                        (events.py), to set two kernels' loops side by side
# Tools, pinned and fetched from PyPI into build/sass/ (ignored): nvdisasm (nvidia-cuda-nvdisasm, the CPU
# machine's CUDA toolkit has none) and, for fa4, a venv with nvidia-cutlass-dsl, flash-attn-4 and quack-kernels
# (--no-deps: fa4_compile.py stands a mock in for torch, which only FA4's interface needs).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=build/sass
NVDISASM_PIN="nvidia-cuda-nvdisasm==13.5.37"
FA4_PINS="nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1"
FA4_NODEPS="flash-attn-4==4.0.0b36 quack-kernels==0.6.5"
mkdir -p "$OUT"
nvdisasm() {
  local bin="$OUT/tools/nvidia/cu13/bin/nvdisasm"
  if [ ! -x "$bin" ]; then
    python3 -m pip download -q --no-deps -d "$OUT/tools/whl" "$NVDISASM_PIN" >&2
    (cd "$OUT/tools" && python3 -m zipfile -e whl/nvidia_cuda_nvdisasm-*.whl .) && chmod +x "$bin"
  fi
  "$bin" "$@" 2>/dev/null
}
# the venv of the CuTe DSL and FA4 (fa4, fa4bwd), made once; its path on stdout
fa4_venv() {
  local v="$OUT/venv"
  if [ ! -x "$v/bin/python" ]; then
    python3 -m venv "$v" >&2
    "$v/bin/pip" install -q $FA4_PINS >&2
    "$v/bin/pip" install -q --no-deps $FA4_NODEPS >&2
  fi
  echo "$v"
}
case "${1:-}" in
  ours)
    nvcc -Icore -Icore/include -Ikernels -I/usr/local/cuda/include -std=c++20 -O3 -Xcompiler -fPIC \
      --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -cubin -o "$OUT/ours.cubin" \
      kernels/attn/hopper/attn_hopper.cu
    nvdisasm -c "$OUT/ours.cubin" >"$OUT/ours.sass"
    echo "$OUT/ours.sass" ;;
  fa4 | fa4bwd)
    D=${2:?usage: sass.sh $1 D CAUSAL}; C=${3:?usage: sass.sh $1 D CAUSAL}
    [[ "$D" =~ ^(64|128)$ && "$C" =~ ^[01]$ ]] || { echo "sass.sh $1: D 64 or 128, CAUSAL 0 or 1" >&2; exit 2; }
    if [ "$1" = fa4 ]; then dir=fwd py=fa4_compile.py; else dir=bwd py=fa4_compile_bwd.py; fi
    V=$(fa4_venv)
    dump="$OUT/fa4-$dir-dump-d$D-c$C"
    rm -rf "$dump" && mkdir -p "$dump"
    QUACK_DIR="$OUT/quack-bwd" D=$D CAUSAL=$C CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP=cubin CUTE_DSL_DUMP_DIR="$dump" \
      "$V/bin/python" "experiments/lab/attn/sass/$py"
    nvdisasm -c "$dump"/*.cubin >"$OUT/fa4-$dir-d$D-c$C.sass"
    echo "$OUT/fa4-$dir-d$D-c$C.sass" ;;
  loops)
    F=${2:?usage: sass.sh loops FILE.sass}
    awk '/^\.text\./ { if (name) report(); name = $0; n = 0; m = 0; f = 0; on = 0; done = 0; next }
         /\*\// { n++ }
         !done && /WARPGROUP.DEPBAR.LE gsb0, 0x1/ { on = 1; m = 0; f = 0; next }
         on && /MUFU.EX2/ { m++ }
         on && /FMNMX/ { f++ }
         on && /WARPGROUP.DEPBAR.LE gsb0, 0x0/ { on = 0; done = 1; pm = m; pf = f }
         function report() { printf "%s\n  %d instructions; first DEPBAR 1-to-0 window: %s\n", name, n, done ? pm " MUFU.EX2, " pf " FMNMX" : "none" }
         END { if (name) report() }' "$F" ;;
  events)
    python3 experiments/lab/attn/sass/events.py "${2:?usage: sass.sh events FILE FROM TO}" "${3:?FROM}" "${4:?TO}" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
