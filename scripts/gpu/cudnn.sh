#!/usr/bin/env bash
# Remote step on a GPU host (repo root as cwd, .debs and .deps carried) for
# issue 18, cuDNN's fused attention as a backend of dl.attn: the whole check
# on one GPU, in BUDGET seconds (default 470):
#   1. build (with cuDNN's frontend headers from .deps/, fetched beforehand by
#      scripts/fetch-cudnn-frontend.sh);
#   2. which libcudnn: every candidate (the system's, the one in PyTorch's
#      venv, the CUDA toolkit's), its version, and one causal bf16 forward +
#      backward timed with each (experiments/attn/cudnn_pick.lua); the
#      fastest, newest on a tie (within 1%), is exported as DISTLAB_CUDNN for
#      distlab's commands (with its folder's neighbours, e.g. NVRTC, on their
#      LD_LIBRARY_PATH; PyTorch's keeps its own); without this step distlab takes
#      the newest it finds (core/ops/attn/cudnn_lib.c), as everywhere;
#   3. spec/attn_cudnn_spec.lua (#gpu: every attention case with backend
#      "cudnn" against the fp64 cpu twin, normwise and element-wise) and
#      spec/attn_spec.lua (ours unchanged);
#   4. the attention bench: FlashAttention-4 (installed by steps.sh's fa4_site
#      from the wheels of scripts/fetch-fa4.sh, carried in two calls), PyTorch
#      SDPA flash and cuDNN (attn_bench_torch.py, bshd and thd), dl.attn ours
#      and cudnn, the anchors again, same run, b=2 h=16 d=128 s 4k..32k (BENCH_S), causal and not,
#      bshd and thd: $OUT/attn-vs-fa4-<gpu>.md, the results file, against the mean
#      of the two anchor runs (targets: ours >= the faster of FA4 and cuDNN,
#      issue 52; cudnn >= 0.95 x PyTorch's cuDNN, fwd and bwd). BENCH_TORCH_BACKENDS
#      (default: all three) narrows both anchor runs (naming fa4 there makes a missing FA4 stop
#      the step before any timing), e.g. fa4,cudnn: at d 128 the
#      whole table took 173 + 212 + ~175 s on an H200 with FlashAttention-2's rows,
#      past one call's budget; without them it fits;
#   5. MPS started, the CP specs with backend "cudnn" (DISTLAB_CP_BACKEND)
#      with 2 ranks sharing the GPU, and the cudnn workspace of the CP
#      schedules measured on the GPU beside the meta formula
#      (experiments/cp/cp_cudnn_memory.lua on cuda, then on meta).
#   6. (STEPS=plans only) cuDNN's candidate engines, each timed (DISTLAB_CUDNN_PLAN).
#   7. (STEPS=libs only) every candidate libcudnn through dl.attn's cudnn backend at LIBS_S,
#      bshd and thd, beside one PyTorch SDPA run. The candidates of 2 and 7 include a newer
#      cuDNN carried in .deps/cudnn-lib (scripts/fetch-cudnn-lib.sh), run with
#      CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY (distlab's commands only).
#   8. (STEPS=impls only) cuDNN's composite and unified forward nodes against the frontend's choice.
# STEPS picks steps (default "pick specs bench cp"; the build always runs, unless SKIP_BUILD is set:
# then build/lib/libdistlab.so must be there, carried, or the script stops at once).
# Every step runs under `timeout` with the smaller of its own limit and what
# is left of BUDGET and writes one verdict line to $OUT/cudnn-summary.txt;
# logs are packed into $OUT/cudnn-logs.tgz however the script ends (MPS
# stopped). Exit status non-zero when a step failed. DISTLAB_COMMIT=<hash>
# names the commit where the checkout has no .git.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" cudnn 470 || exit 2 # logs packed into $OUT/cudnn-logs.tgz
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-60}" NCCL_NVLS_ENABLE=0
STEPS="${STEPS:-pick specs bench cp}"

header
gpu=$(gpu_tag)

build_or_skip || exit 1
[ -f build/make.log ] && ! grep -q "cudnn_sdpa" build/make.log && [ ! -f build/lib/libdistlab_cudnn.a ] &&
  say "WARNING: built without cuDNN's frontend (no .deps/cudnn-frontend?)"
DL_LIBS="${DL_LIBS:-}" # the folders distlab's commands add for cuDNN (pick sets them; or the caller)

# The cuDNN carried in .deps/cudnn-lib, if any (steps.sh: carried_dir, carried_libs); its runs need
# CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY, which only distlab's commands see: PyTorch keeps its full cuDNN.
unpack_carried_cudnn
DL_CFG="${DL_CFG:-}" # CUDNN_LIB_CONFIG for distlab's commands (set by pick for the carried cuDNN)

if want pick || want libs; then
  # candidates: the loader's (system), PyTorch's wheel, the CUDA toolkit's, the carried one;
  # each with its folder's neighbours first on the loader's path (NVRTC and cuBLAS of the same
  # CUDA major for the wheel's cuDNN) and its CUDNN_LIB_CONFIG (the carried one only)
  cands=() cand_libs=() cand_cfg=()
  for f in /usr/lib/x86_64-linux-gnu/libcudnn.so.9 /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn.so.9 \
    /usr/local/cuda/lib64/libcudnn.so.9; do
    [ -e "$f" ] || continue
    libs="$(dirname "$f")"
    for d in "$(dirname "$f")"/../../*/lib; do [ -d "$d" ] && libs="$libs:$(readlink -f "$d")"; done
    cands+=("$(readlink -f "$f")") cand_libs+=("$libs") cand_cfg+=("")
  done
  [ -n "$carried_dir" ] && cands+=("$carried_dir/libcudnn.so.9") cand_libs+=("$carried_libs") cand_cfg+=(GRAPH_JIT_ONLY)
  # CENV: the environment of distlab's commands with candidate $1
  cand_env() {
    CENV=(env DISTLAB_CUDNN="${cands[$1]}" ${cand_cfg[$1]:+CUDNN_LIB_CONFIG=${cand_cfg[$1]}}
      LD_LIBRARY_PATH="${cand_libs[$1]}:${LD_LIBRARY_PATH:-}")
  }
fi

if want pick; then
  best="" best_ms="" best_ver=0
  for i in "${!cands[@]}"; do
    f=${cands[$i]} libs=${cand_libs[$i]} cfg=${cand_cfg[$i]}
    log="$L/pick-$(echo "$f" | tr '/' '_').log"
    cand_env "$i"
    if step "pick: $f${cfg:+ ($cfg)}" 90 "$log" "${CENV[@]}" ./distlab run -n 1 --device cuda \
      experiments/attn/cudnn_pick.lua; then
      ms=$(sed -n 's/^pick ms=\([0-9.]*\).*/\1/p' "$log")
      ver=$(sed -n 's/^pick .*version=\([0-9]*\).*/\1/p' "$log")
      # faster by more than 1%, or as fast (within 1%) and newer
      if [ -n "$ms" ] && { [ -z "$best_ms" ] || awk "BEGIN{exit !($ms < $best_ms * 0.99 || \
        ($ms <= $best_ms * 1.01 && $ver > $best_ver))}"; }; then
        best=$f best_ms=$ms best_libs=$libs best_ver=$ver best_cfg=$cfg
      fi
    fi
  done
  if [ -n "$best" ]; then
    # distlab's commands only: PyTorch must keep finding the cuDNN it was built with
    export DISTLAB_CUDNN="$best" DL_LIBS="$best_libs" DL_CFG="$best_cfg"
    say "cuDNN for the rest: $best (version $best_ver, $best_ms ms per causal fwd+bwd at s=8k${best_cfg:+; CUDNN_LIB_CONFIG=$best_cfg})"
  else
    say "no libcudnn candidate ran; the rest uses the loader's"
  fi
fi
# the environment of distlab's commands: the picked cuDNN's folders first, its configuration
DLENV=(env ${DL_CFG:+CUDNN_LIB_CONFIG=$DL_CFG} LD_LIBRARY_PATH="${DL_LIBS:+$DL_LIBS:}${LD_LIBRARY_PATH:-}")

if want libs; then
  # every candidate cuDNN through dl.attn's cudnn backend at LIBS_S (default 4k, 8k), bshd and
  # thd, beside one PyTorch SDPA run at the same shapes: is a newer cuDNN faster?
  LIBS_S="${LIBS_S:-4096,8192}"
  step "libs: PyTorch SDPA" 120 "$L/libs-torch.log" "$PY" experiments/attn/attn_bench_torch.py \
    --s "$LIBS_S" --out "$L" --name libs-torch
  grep -E "cudnn" "$L/libs-torch.log" | head -20 | tee -a "$SUM"
  for i in "${!cands[@]}"; do
    cand_env "$i"
    step "libs: dl.attn cudnn with ${cands[$i]}" 150 "$L/libs-$i.log" "${CENV[@]}" ./distlab run -n 1 --device cuda \
      experiments/attn/attn_bench.lua --s "$LIBS_S" --backends cudnn --warm-ms 150 --min-ms 300 --out "$L/libs-$i"
    grep -h "cudnn backend" "$L/libs-$i/attn-distlab.md" 2>/dev/null | sed "s/^/lib $i: /" | tee -a "$SUM"
    grep -E "^cudnn " "$L/libs-$i.log" | sed "s/^/lib $i: /" | tee -a "$SUM"
  done
fi

if want specs; then
  step "attn_cudnn_spec (#gpu)" 200 "$L/attn-cudnn-spec.log" "${DLENV[@]}" ./distlab test --exclude-tags=multigpu spec/attn_cudnn_spec.lua
  grep -E "^(FAIL|ERROR)|^cudnn|^  (bshd|sbhd|thd)" "$L/attn-cudnn-spec.log" | head -40 | tee -a "$SUM"
fi

if want bench; then
  # The anchors (FA4, PyTorch SDPA) before and after ours: each anchor figure is the mean of the
  # two runs, so a drift of the card's clocks between them cancels; the results file
  # (attn-vs-fa4-<gpu>[-dD].md) is assembled last with --measured, which reads the timed pass's
  # header, so it can be assembled off the host from the logs' CSVs too. BENCH_D: head dims, one
  # pass each (default 128). BENCH_GQA: query heads per kv head (default 1, MHA; G > 1 adds -gqaG
  # to the results file's name).
  BENCH_S="${BENCH_S:-4096,8192,16384,32768}"
  if ! fa4_site; then
    # asked for by name (the issue-52 table), a table without FA4 is not the table: stop before timing
    [[ ",${BENCH_TORCH_BACKENDS:-}," != *,fa4,* ]] || { say "FA4: BENCH_TORCH_BACKENDS names fa4 but it is not installed (stage .deps/fa4/2 into build/fa4-wheels first): no bench"; exit 1; }
    say "FA4: its rows will say it is not installed"
  fi
  BENCH_BACKENDS="${BENCH_BACKENDS:-ours,cudnn}" # dl.attn's
  TB=(); [ -z "${BENCH_TORCH_BACKENDS:-}" ] || TB=(--backends "$BENCH_TORCH_BACKENDS") # the anchors
  gqa="${BENCH_GQA:-1}"
  gsfx=$([ "$gqa" = 1 ] || echo "-gqa$gqa")
  for d in ${BENCH_D:-128}; do
    sfx=$([ "$d" = 128 ] || echo "-d$d")$gsfx Ld="$L/d$d$gsfx"
    mkdir -p "$Ld"
    step "attn bench d $d: FA4, PyTorch SDPA (before)" "${TORCH_LIMIT:-200}" "$Ld/attn-torch-1.log" "$PY" \
      experiments/attn/attn_bench_torch.py --s "$BENCH_S" --d "$d" --gqa "$gqa" --out "$Ld" --name attn-torch-1 "${TB[@]}"
    step "attn bench d $d: dl.attn $BENCH_BACKENDS" "${OURS_LIMIT:-240}" "$Ld/attn-bench.log" "${DLENV[@]}" \
      ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua --s "$BENCH_S" --d "$d" --gqa "$gqa" \
      --backends "$BENCH_BACKENDS" --out "$Ld"
    step "attn bench d $d: FA4, PyTorch SDPA (after)" "${TORCH_LIMIT:-200}" "$Ld/attn-torch-2.log" "$PY" \
      experiments/attn/attn_bench_torch.py --s "$BENCH_S" --d "$d" --gqa "$gqa" --out "$Ld" --name attn-torch-2 "${TB[@]}"
    step "attn bench d $d: the results file" 60 "$Ld/attn-table.log" "${DLENV[@]}" ./distlab run -n 1 --device cuda \
      experiments/attn/attn_bench.lua --s "$BENCH_S" --d "$d" --gqa "$gqa" --backends "$BENCH_BACKENDS" \
      --measured "$Ld/attn-distlab.csv" --torch "$Ld/attn-torch-1.csv,$Ld/attn-torch-2.csv" --out "$OUT" \
      --tag "vs-fa4-$gpu$sfx" \
      --command "${BENCH_COMMAND:-$(call_line 'SKIP_BUILD|STEPS|BUDGET|BENCH_[A-Z_]+|TORCH_LIMIT|OURS_LIMIT')} (attn_bench_torch.py, attn_bench.lua, attn_bench_torch.py, then this with --measured, in the same call)"
    sed -n '/^TFLOP\/s fwd\/bwd/,$p' "$Ld/attn-table.log" | tee -a "$SUM"
  done
fi

if want impls; then
  # cuDNN's two forward nodes (DISTLAB_CUDNN_IMPL, a lab knob of core/ops/attn/cudnn_sdpa.cpp:
  # composite, unified; default the frontend's choice) through dl.attn's cudnn backend at LIBS_S,
  # bshd and thd, each once with its candidate list (DISTLAB_CUDNN_PLAN=0) on stderr
  LIBS_S="${LIBS_S:-4096,8192}"
  for m in default composite unified; do
    ie=(); [ "$m" = default ] || ie=(DISTLAB_CUDNN_IMPL="$m")
    step "impls: dl.attn cudnn, forward node $m" 150 "$L/impl-$m.log" "${DLENV[@]}" "${ie[@]}" DISTLAB_CUDNN_PLAN=0 \
      ./distlab run -n 1 --device cuda experiments/attn/attn_bench.lua --s "$LIBS_S" --backends cudnn \
      --warm-ms 150 --min-ms 300 --out "$L/impl-$m"
    grep -E "^cudnn " "$L/impl-$m.log" | sed "s/^/impl $m: /" | tee -a "$SUM"
    grep -h -A3 "^distlab cudnn: fwd" "$L/impl-$m.log" | head -24 | sed "s/^/impl $m: /" | tee -a "$SUM"
  done
fi

if want plans; then
  # cuDNN's candidate engines against its heuristics' choice (DISTLAB_CUDNN_PLAN, a lab knob of
  # core/ops/attn/cudnn_sdpa.cpp: every candidate of heuristics modes A and FALLBACK built, listed on
  # stderr, candidate N run): dl.attn's cudnn backend at PLAN_S (default 4k, 8k), bshd and thd, once
  # as built and once a candidate in PLANS (default "0 1 2 3")
  PLAN_S="${PLAN_S:-4096,8192}"
  for n in default ${PLANS:-0 1 2 3}; do
    pe=(); [ "$n" = default ] || pe=(DISTLAB_CUDNN_PLAN="$n")
    step "plans: dl.attn cudnn, candidate $n" 120 "$L/plan-$n.log" "${DLENV[@]}" "${pe[@]}" \
      ./distlab run -n 1 --device cuda \
      experiments/attn/attn_bench.lua --s "$PLAN_S" --backends cudnn --warm-ms 150 --min-ms 300 --out "$L/plan-$n"
    grep -E "^cudnn " "$L/plan-$n.log" | sed "s/^/plan $n: /" | tee -a "$SUM"
  done
  grep -h -A12 "^distlab cudnn: fwd thd b=2 h=16 s=4096" "$L/plan-0.log" | head -14 | tee -a "$SUM"
  grep -h -A12 "^distlab cudnn: bwd thd b=2 h=16 s=4096" "$L/plan-0.log" | head -14 | tee -a "$SUM"
fi

if want cp; then
  [ "${MPS:-1}" = 1 ] && mps_start
  export DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-150}"
  DISTLAB_CP_BACKEND=cudnn DISTLAB_SPEC_RANKS=2 step "cp_spec #multigpu, backend cudnn, 2 ranks on one GPU" 200 \
    "$L/cp-spec-cudnn.log" "${DLENV[@]}" ./distlab test --tags=multigpu spec/cp_spec.lua
  grep -E "^(ok|FAIL|ERROR)" "$L/cp-spec-cudnn.log" | head -12 | tee -a "$SUM"
  step "cp memory: cudnn workspace, 2 ranks on the GPU" 90 "$L/cp-cudnn-memory-gpu.log" "${DLENV[@]}" ./distlab run -n 2 \
    --device cuda experiments/cp/cp_cudnn_memory.lua
  step "cp memory: cudnn workspace, meta formula" 30 "$L/cp-cudnn-memory-meta.log" ./distlab run --device meta \
    --world 2 --rank 0 experiments/cp/cp_cudnn_memory.lua
  grep -h "^cudnn" "$L/cp-cudnn-memory-gpu.log" "$L/cp-cudnn-memory-meta.log" | tee -a "$SUM"
fi
exit $status
