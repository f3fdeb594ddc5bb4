#!/usr/bin/env bash
# Remote step on a host of several GPUs (nvidia-h200-x2/-x4/-x8; repo root as
# cwd, .debs and .deps carried): the multi-GPU timings of issues 20, 21 and
# 23 in one call, each step on every GPU of the host (N = nvidia-smi's count),
# in BUDGET seconds (default 540):
#   ag_gemm  all-gather + GEMM (issue 21): PyTorch's anchors
#            (experiments/overlap/ag_gemm_torch.py under torchrun: the fused op
#            without multicast, NCCL then matmul, matmul alone), then
#            ag_gemm_bench.lua at m 8k,16k,32k (AG_M), k 16k, n 8k, bf16, GEMM
#            alone, nccl_then_gemm and every variant, AG_ITERS (20) timed runs
#            per row, each GEMM shape on the fastest of cuBLASLt's first 8 candidates
#            (DISTLAB_GEMM_TUNE, default 8 here; 0: the heuristic's first, as before
#            2026-11-27: on 2 H200s that GEMM alone ran 3-5% under torch.matmul at m 32k
#            and moved as much between runs) -> $OUT/ag-gemm-<gpu>x<N>.{md,csv}; then
#            (AG_TORCH_AFTER=1, the default) torch.matmul alone once more, after the bench,
#            on GPUs as warm as it left them (multi/<op>-torch-after.csv, lines in the summary);
#            the GPUs' clocks, power, temperature and throttle reasons every 200 ms during
#            the bench in multi/<op>-clocks.csv;
#   gemm_rs  the mirror, GEMM + reduce-scatter (issue 21), the same way (--op gemm_rs)
#            -> $OUT/gemm-rs-<gpu>x<N>.{md,csv};
#   cp       cp_bench.lua at CP = N (issue 23) on the attention backends CP_BACKENDS
#            (default "cudnn"; "ours,cudnn" for both), S_total CP_S (16k,64k,128k),
#            CP_ITERS (20) repeats -> $OUT/cp-bench-<gpu>x<N>[-TAG].{md,csv} (CP_TAG);
#   cp_memory  cp_memory.lua at CP = N (issue 23, not in the default STEPS): peak memory of
#            every strategy, distlab's allocator beside the driver's free-memory delta, on
#            each of CP_BACKENDS (default here "ours,cudnn"), S per sequence CP_MEM_S (65536)
#            -> $OUT/cp-memory-gpu-<gpu>x<N>[-cudnn].{md,csv};
#   ep       spec/ep_spec.lua's #multigpu specs, one rank a GPU, then
#            ep_bench.lua (issue 20, where experiments/ep/ exists) between two runs of
#            its PyTorch anchor (ep_bench_torch.py under torchrun, EP_TORCH_ARGS: --mode
#            graph,eager before, --mode graph after; the graph rows the mean of the
#            two), EP_ARGS passed on, the results file assembled last (--measured)
#            -> $OUT/ep-bench-<gpu>x<N>.{md,csv}; then (EP_SPLIT=1, the default)
#            the same with --split, send and receive as two kernels each, at
#            E 256 -> ep-bench-<gpu>x<N>-split.{md,csv}, the A/B of the fused kernels;
#            (ours, and NCCL EP's low latency and high throughput where .deps/nccl-ep-carry came
#            along: then the file is ep-vs-nccl-ep-<gpu>x<N>, and spec/ep_nccl_spec.lua's
#            equivalence specs run after ep_spec's) then, for each nb in EP_BLOCKS (unset: none), bf16 E 256 B 1,128 on nb
#            blocks -> multi/ep-bench-<gpu>x<N>-blocks<nb>.{md,csv} (in the logs tarball);
#   ep_memory  (not in the default STEPS) experiments/ep/ep_memory.lua on the GPUs: our buffers'
#            bytes from the allocator and the driver beside NCCL EP's own (where it runs) and the
#            formulas -> $OUT/ep-memory-gpu-<gpu>x<N>.{md,csv};
#   block    (not in the default STEPS) the MoE block (issue 55): first checked at BLOCK_CHECK_SHAPE
#            (check) against one rank on the cpu (fp64), every named schedule; then timed at
#            BLOCK_SHAPE (dsv3) x BLOCK_SCALE (1), BLOCK_TOKENS (4096) tokens a rank, BLOCK_VARIANTS
#            (named), the compute alone beside each -> $OUT/block-<gpu>x<N>.md, each variant's
#            trace JSON in the logs tarball (the hosts have no gnuplot: draw the PNGs here,
#            dl.trace.draw);
#   ep_ab    (not in the default STEPS) an A/B of EP knobs: ep_bench.lua once per setting of
#            EP_AB (NAME=VALUE, separated by commas or spaces), alternating, EP_AB_ROUNDS (2)
#            times, with EP_AB_ARGS (default B 1,8,32,128,512, E 256, rank_major, the ep path)
#            -> $OUT/ep-ab/ep-bench-<gpu>x<N>-<name>-<value>-r<round>.{md,csv}; e.g. the A/B of
#            programmatic dependent launch: EP_AB="DISTLAB_EP_PDL=1,DISTLAB_EP_PDL=0"; of two builds:
#            EP_AB="DISTLAB_LIB=$PWD/build/lib/libdistlab.so,DISTLAB_LIB=$PWD/.ab/NAME.so" (.ab carried).
# STEPS picks them (default "ag_gemm gemm_rs cp ep"); the build always runs, unless SKIP_BUILD is
# set: then build/lib/libdistlab.so must be there (carried: built and stripped elsewhere), or it stops. NGPUS=n
# runs every step on the host's first n GPUs (CUDA_VISIBLE_DEVICES), tagged x<n>. Results
# files come back in $OUT (copy them to experiments/results/<family>/ and
# draw the PNGs locally: the hosts have no gnuplot); every log in
# $OUT/multi-logs.tgz; verdicts in $OUT/multi-summary.txt. Exit status
# non-zero when a step failed. DISTLAB_COMMIT=<hash> names the commit.
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" multi 540 || exit 2
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-60}" DISTLAB_JOB_TIMEOUT="${DISTLAB_JOB_TIMEOUT:-400}" NCCL_NVLS_ENABLE=0
STEPS="${STEPS:-ag_gemm gemm_rs cp ep}"

header
N=$(nvidia-smi -L | grep -c '^GPU')
if [ -n "${NGPUS:-}" ]; then # the first NGPUS of the host's GPUs (a 2-GPU run on a 4-GPU host)
  [ "$NGPUS" -le "$N" ] || { say "NGPUS=$NGPUS but the host has $N GPUs"; status=1; exit 1; }
  N=$NGPUS
  export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((N - 1)))"
fi
tag="$(gpu_tag)x$N"
say "$N GPUs: tag $tag; steps: $STEPS"
[ "$N" -ge 2 ] || { say "multi.sh needs at least 2 GPUs"; status=1; exit 1; }
build_or_skip || exit 1
unpack_carried_nccl_ep
port=$((20000 + RANDOM % 20000))

AG_M="${AG_M:-8192,16384,32768}" AG_ITERS="${AG_ITERS:-20}"
for op in ag_gemm gemm_rs; do
  want $op || continue
  port=$((port + 2))
  step "$op PyTorch anchors ($N ranks)" 150 "$L/$op-torch.log" "$PY" -m torch.distributed.run \
    --nproc_per_node "$N" --master_port "$port" experiments/overlap/ag_gemm_torch.py "$L/$op-torch.csv" \
    --ag-op $op --ag-m "$AG_M" --ag-iters "$AG_ITERS"
  # the GPUs' clocks, power, temperature and throttle reasons every 200 ms while the bench runs (rows minutes apart
  # have run 7-15% apart on H100s): $L/$op-clocks.csv, in the logs tarball
  clocks_pid=""
  if command -v nvidia-smi >/dev/null; then
    reasons=clocks_throttle_reasons.active # the older name; the newer one where this driver knows it
    nvidia-smi --help-query-gpu 2>/dev/null | grep -q clocks_event_reasons.active && reasons=clocks_event_reasons.active
    nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,$reasons \
      --format=csv -lms 200 >"$L/$op-clocks.csv" 2>&1 &
    clocks_pid=$!
  fi
  step "$op bench ($N ranks)" 200 "$L/$op-bench.log" env DISTLAB_GEMM_TUNE="${DISTLAB_GEMM_TUNE:-8}" ./distlab run -n "$N" --device cuda \
    experiments/overlap/ag_gemm_bench.lua --op $op --m "$AG_M" --iters "$AG_ITERS" --torch "$L/$op-torch.csv" \
    --out "$OUT" --tag "$tag" --command "scripts/gpu/multi.sh (ag_gemm_torch.py --ag-op $op under torchrun, then this, in the same run)"
  [ -n "$clocks_pid" ] && kill "$clocks_pid" 2>/dev/null
  grep -E "^m=" "$L/$op-torch.log" | tee -a "$SUM"
  if [ "${AG_TORCH_AFTER:-1}" = 1 ]; then # torch.matmul alone again, on GPUs as warm as the bench left them
    step "$op torch.matmul alone again, after the bench ($N ranks)" 90 "$L/$op-torch-after.log" "$PY" -m torch.distributed.run \
      --nproc_per_node "$N" --master_port "$((port + 11))" experiments/overlap/ag_gemm_torch.py "$L/$op-torch-after.csv" \
      --ag-op $op --ag-m "$AG_M" --ag-iters "$AG_ITERS" --ag-impls torch_matmul
    grep -E "^m=" "$L/$op-torch-after.log" | sed 's/^/after: /' | tee -a "$SUM"
  fi
done

if want cp; then
  pick_cudnn
  CP_BACKENDS="${CP_BACKENDS:-cudnn}"
  ctag="$tag${CP_TAG:+-$CP_TAG}"
  step "cp_bench CP=$N, backends $CP_BACKENDS" 300 "$L/cp-bench.log" ./distlab run -n "$N" --device cuda \
    experiments/cp/cp_bench.lua --backends "$CP_BACKENDS" --s "${CP_S:-16384,65536,131072}" --iters "${CP_ITERS:-20}" \
    --tag "$ctag" --out "$OUT" --command "scripts/gpu/multi.sh (STEPS=cp CP_BACKENDS=$CP_BACKENDS${CP_S:+ CP_S=$CP_S}${CP_ITERS:+ CP_ITERS=$CP_ITERS}${CP_TAG:+ CP_TAG=$CP_TAG})"
  sed -n '/^| backend | S_total/,$p' "$L/cp-bench.log" | head -60 | tee -a "$SUM"
fi

if want cp_memory; then
  # peak memory of every CP strategy at CP = N (issue 23): distlab's allocator beside the
  # driver's free-memory delta, on each backend of CP_BACKENDS, S per sequence CP_MEM_S
  pick_cudnn
  for be in $(echo "${CP_BACKENDS:-ours,cudnn}" | tr , ' '); do
    mtag="$tag$([ "$be" = ours ] || echo "-$be")"
    step "cp_memory CP=$N, backend $be" 200 "$L/cp-memory-$be.log" ./distlab run -n "$N" --device cuda \
      experiments/cp/cp_memory.lua --backend "$be" --s "${CP_MEM_S:-65536}" --tag "$mtag" --out "$OUT" \
      --command "scripts/gpu/multi.sh (STEPS=cp_memory CP_BACKENDS=${CP_BACKENDS:-ours,cudnn})"
    grep -E "^(thd|bshd) " "$L/cp-memory-$be.log" | tee -a "$SUM"
  done
fi

if want ep && [ -f experiments/ep/ep_bench.lua ]; then
  # correctness first, one rank a GPU: the specs ep.sh runs with ranks sharing one GPU
  # (EP_SPECS=0: the timings alone, where the specs ran at this commit in an earlier call)
  [ "${EP_SPECS:-1}" = 1 ] && DISTLAB_SPEC_RANKS=$N step "ep_spec #multigpu ($N ranks, a GPU each)" 150 "$L/ep-spec.log" \
    "${DLENV[@]}" ./distlab test --tags=multigpu spec/ep_spec.lua
  grep -E "^(FAIL|ERROR)|passed," "$L/ep-spec.log" 2>/dev/null | head -12 | tee -a "$SUM"
  ep_name=ep-bench
  if [ -f .deps/nccl-ep/lib/libnccl_ep.so ]; then
    ep_name=ep-vs-nccl-ep
    [ "${EP_SPECS:-1}" = 1 ] && DISTLAB_SPEC_RANKS=$N step "ep_nccl_spec #multigpu ($N ranks, a GPU each: ours and NCCL EP)" 200 \
      "$L/ep-nccl-spec.log" "${DLENV[@]}" ./distlab test --tags=multigpu spec/ep_nccl_spec.lua
    grep -E "^(FAIL|ERROR)|passed,|skip" "$L/ep-nccl-spec.log" 2>/dev/null | head -12 | tee -a "$SUM"
  fi
  # The PyTorch anchor before and after ours (ep_bench_torch.py under torchrun): its graph mode
  # (layout planned ahead, CUDA graphs) both times, its eager mode (host-read counts) once, before;
  # the anchor figures the mean of the two runs (torch_common.py mean), so a drift of the clocks
  # over the call cancels. Ours timed between them (its own files under the logs), the results
  # file assembled last from ours' CSV and that mean (ep_bench.lua --measured: nothing timed).
  torch_ep() { # $1: 1 (before) or 2 (after), $2: modes, $3: limit (s), $4: the summary lines' label
    step "ep PyTorch anchor ($2, ${4}) ($N ranks)" "$3" "$L/ep-torch-$1.log" "$PY" -m torch.distributed.run \
      --nproc_per_node "$N" --master_port "$((port + 1))" experiments/ep/ep_bench_torch.py "$L/ep-torch-$1.csv" \
      --mode "$2" ${EP_TORCH_ARGS:-}
    grep -E "^torch |data check failed" "$L/ep-torch-$1.log" | sed "s/^/$4: /" | tee -a "$SUM"
  }
  torch_ep 1 graph,eager 240 before
  step "ep_bench ($N ranks)" "${EP_LIMIT:-240}" "$L/ep-bench.log" "${DLENV[@]}" ./distlab run -n "$N" --device cuda \
    experiments/ep/ep_bench.lua --out "$L/ep-ours" --name "$ep_name" --tag "$tag" ${EP_ARGS:-} \
    --command "scripts/gpu/multi.sh (ep_bench_torch.py before and after it, in the same run)"
  port=$((port + 2))
  torch_ep 2 graph 180 after
  runs=()
  for f in "$L/ep-torch-1.csv" "$L/ep-torch-2.csv"; do [ -s "$f" ] && runs+=("$f"); done
  torch_arg=()
  if [ ${#runs[@]} -gt 0 ] && "$PY" experiments/torch_common.py mean "$L/ep-torch.csv" "${runs[@]}" --key B,E,mode \
    --runs both_us >>"$L/ep-torch-mean.log" 2>&1; then
    torch_arg=(--torch "$L/ep-torch.csv")
  else
    say "ep: no PyTorch anchor to merge (see ep-torch-*.log)"
  fi
  step "ep_bench: the results file ($N ranks)" 60 "$L/ep-table.log" "${DLENV[@]}" ./distlab run -n "$N" --device cuda \
    experiments/ep/ep_bench.lua --measured "$L/ep-ours/$ep_name-$tag.csv" ${torch_arg[@]+"${torch_arg[@]}"} --out "$OUT" \
    --name "$ep_name" --tag "$tag" ${EP_ARGS:-} --command "scripts/gpu/multi.sh (ep_bench_torch.py --mode graph,eager, ep_bench.lua, \
ep_bench_torch.py --mode graph, then this with --measured and their mean, in the same call)"
  tail -n 60 "$L/ep-table.log" >>"$SUM"
  if [ "${EP_SPLIT:-1}" = 1 ]; then
    step "ep_bench --split ($N ranks)" 120 "$L/ep-bench-split.log" ./distlab run -n "$N" --device cuda \
      experiments/ep/ep_bench.lua --split --experts 256 --paths ep --out "$OUT" --tag "$tag-split" ${EP_ARGS:-} \
      --command "scripts/gpu/multi.sh (after the fused run, in the same call)"
    tail -n 36 "$L/ep-bench-split.log" >>"$SUM"
  fi
  for nb in ${EP_BLOCKS:-}; do # the floor against the grid: every ep kernel on nb blocks (bf16, E 256)
    step "ep_bench --blocks $nb ($N ranks)" 90 "$L/ep-bench-blocks$nb.log" ./distlab run -n "$N" --device cuda \
      experiments/ep/ep_bench.lua --blocks "$nb" --B 1,128 --experts 256 --dtypes bf16 --paths ep \
      --out "$L" --tag "$tag-blocks$nb" --command "scripts/gpu/multi.sh (EP_BLOCKS, in the same call)"
    grep -E "^\|" "$L/ep-bench-blocks$nb.log" | tail -n 12 >>"$SUM"
  done
fi
if want ep_memory; then
  step "ep_memory ($N ranks, a GPU each)" 120 "$L/ep-memory.log" "${DLENV[@]}" ./distlab run -n "$N" --device cuda \
    experiments/ep/ep_memory.lua --out "$OUT" --tag "$tag" --command "scripts/gpu/multi.sh (STEPS=ep_memory)"
  grep -E "^\|" "$L/ep-memory.log" | tail -n 30 >>"$SUM"
fi
if want block; then
  # correctness first (fp64 on the cpu, every named schedule, a GPU a rank), then the timed run
  step "block check ($N ranks, shape ${BLOCK_CHECK_SHAPE:-check})" 200 "$L/block-check.log" "${DLENV[@]}" \
    ./distlab run -n "$N" --device cuda experiments/block/block.lua --shape "${BLOCK_CHECK_SHAPE:-check}" \
    --variants named --check yes --time no --out "$L/block-check" --tag "$tag"
  grep -E "ok|wrong|FAIL" "$L/block-check.log" | tail -n 20 >>"$SUM"
  step "block ($N ranks, ${BLOCK_SHAPE:-dsv3} x${BLOCK_SCALE:-1}, ${BLOCK_TOKENS:-4096} tokens a rank)" \
    "${BLOCK_LIMIT:-300}" "$L/block.log" "${DLENV[@]}" ./distlab run -n "$N" --device cuda experiments/block/block.lua \
    --shape "${BLOCK_SHAPE:-dsv3}" --scale "${BLOCK_SCALE:-1}" --tokens "${BLOCK_TOKENS:-4096}" \
    --variants "${BLOCK_VARIANTS:-named}" --check no --compute yes --png no ${BLOCK_ARGS:-} --out "$L/block" --tag "$tag" \
    --command "scripts/gpu/multi.sh (STEPS=block${BLOCK_SCALE:+ BLOCK_SCALE=$BLOCK_SCALE}${BLOCK_VARIANTS:+ BLOCK_VARIANTS=$BLOCK_VARIANTS})"
  tail -n 40 "$L/block.log" >>"$SUM"
  cp "$L/block/block-$tag.md" "$OUT/" 2>/dev/null # the traces stay in the logs tarball (a call returns 8 files)
fi
if want ep_ab; then # an A/B of EP knobs on one host: each setting of EP_AB in turn, EP_AB_ROUNDS times
  for round in $(seq "${EP_AB_ROUNDS:-2}"); do
    for v in ${EP_AB//,DISTLAB_/ DISTLAB_}; do
      t="$tag-$(echo "${v#DISTLAB_EP_}" | tr 'A-Z=' 'a-z-' | sed 's,.*/,,; s,\.so$,,')-r$round" # DISTLAB_LIB=/x/y.so: tag y
      step "ep_bench $v round $round ($N ranks)" 90 "$L/ep-ab-$t.log" env "$v" ./distlab run -n "$N" --device cuda \
        experiments/ep/ep_bench.lua ${EP_AB_ARGS:---B 1,8,32,128,512 --experts 256 --outputs rank_major --paths ep} \
        --out "$OUT/ep-ab" --tag "$t" --command "$v scripts/gpu/multi.sh (STEPS=ep_ab, round $round of ${EP_AB_ROUNDS:-2}, settings alternating)"
      grep -E "^\|" "$L/ep-ab-$t.log" | tail -n 24 >>"$SUM"
    done
  done
fi
cp "$OUT"/*.csv "$L/" 2>/dev/null
exit $status
