#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (repo root as cwd) for issue 19's lab
# kernel, experiments/lab/attn/hopper/fwd.cu (wgmma + TMA forward, bshd bf16,
# d = 128), in one call:
#   1. build for sm_90a (registers and spills into the summary);
#   2. correctness first, both main loops (and the fused merge into f32 and bf16 running outs on the
#      GQA and thd cases): b=1 h=2 at s 128..1024, GQA 4/2
#      sbhd, MQA 4/1 (s 384 and 200), thd with lengths 1000, 0, 1, 77, 4096 and
#      NaN gaps, the merge into a running out off 16-byte alignment (8- and 4-byte copies), sliding
#      windows (100, 20) and (64, -1), then b=2 h=16 at s 4k
#      (the bench shape), causal and not,
#      against the fp64 reference on sampled rows, with a planted 2% error that
#      must fail; stop here if it fails;
#   3. compute-sanitizer memcheck and racecheck on b=1 h=2 s=256, every loop and merge;
#   4. timing at the bench's shapes (b=2 h=16, s 4k-32k; thd: two sequences of s), the plain step and
#      the fused merge into f32 and bf16 (issue 19: at most 3% more), data checked after timing,
#      and in the same call PyTorch's cuDNN and flash SDPA at those shapes
#      (experiments/attn/attn_bench_torch.py, bshd).
#   5. with AB_FLAGS (e.g. "-DHP_FWD_STAGE_ACC=0"): a second binary built with those
#      flags, and both's plain rates and merge costs, alternating, AB_ROUNDS times (default 2), pipe 0,
#      bshd at AB_S (default 4096,8192) and thd 2 x 4096, causal and not (fwd-ab.log).
#   AB_ONLY=1 (with AB_FLAGS): only the two builds, the small checks of each, the sanitizers on the
#      second, and the A/B (about 2 minutes less than the whole).
# Env for quicker rounds: SKIP_SAN, SKIP_TORCH (set: leave those steps out), BENCH_S, PIPES;
# LAB_D=64 runs all of it at head dim 64 (the kernel, its checks, and PyTorch's anchors).
# Everything under $OUT (summary.txt, fwd-*.log, attn-torch-hopper.{md,csv}).
set -uo pipefail
t_start=$(date +%s)
OUT=${OUT:-/tmp/hopper-lab} LAYOUT=flat SUM_NAME=summary.txt
source "$(dirname "$0")/steps.sh" hopper_lab 590 || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$SUM"
say "commit: ${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
BIN=/tmp/hopper_fwd # not under $OUT: at most 8 files come back
# the lab binary $1 with the extra nvcc flags $3, its log in $2
build() {
  nvcc -DLAB_D=${LAB_D:-128} $3 -Ikernels -std=c++17 -O3 -lineinfo -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$1" \
    experiments/lab/attn/hopper/fwd.cu >"$2" 2>&1 || { say "build $3 FAILED"; tail -20 "$2" | tee -a "$SUM"; exit 1; }
}
# AB_BASE_FLAGS: the first binary (the A/B's baseline) built with those (e.g. -I.ab/oldk: an older kernel's headers)
build "$BIN" "$OUT/build.log" "${AB_BASE_FLAGS:-}"
[ -n "${AB_BASE_FLAGS:-}" ] && say "baseline built with $AB_BASE_FLAGS"
grep -A2 "fwd_kernel" "$OUT/build.log" | grep -E "registers|spill" | tee -a "$SUM"
Q="--warm-ms 0 --min-ms 0" # checks: no timing to speak of
SAN=compute-sanitizer
command -v $SAN >/dev/null || SAN=/usr/local/cuda/bin/compute-sanitizer
# the small checks of one binary ($1) into $2; their exit code
small_checks() {
  { timeout 120 "$1" --check --b 1 --h 2 --s 128,256,384,1024 --iters 2 $Q &&
    timeout 60 "$1" --check --merge --pipe 0,1 --b 2 --h 4 --hkv 2 --layout sbhd --s 256,640 --iters 2 $Q &&
    timeout 60 "$1" --check --b 1 --h 4 --hkv 1 --s 384,200 --iters 2 $Q &&
    timeout 60 "$1" --check --merge --pipe 0,1 --h 4 --hkv 2 --thd 1000,0,1,77,4096 --iters 2 $Q &&
    timeout 60 "$1" --check --merge --acc-misalign --pipe 0,1 --b 2 --h 4 --hkv 2 --s 640 --iters 2 $Q &&
    timeout 60 "$1" --check --b 1 --h 2 --s 1000 --window 100,20 --iters 2 $Q &&
    timeout 60 "$1" --check --h 2 --thd 300,1,900 --window 64,-1 --iters 2 $Q; } >"$2" 2>&1
}
# the A/B of the build as is against AB_FLAGS (fwd-ab.log); each build's plain and merged rates
ab() {
  for round in $(seq ${AB_ROUNDS:-2}); do
    for b in "$BIN" "$BIN-ab"; do
      tag=$([ "$b" = "$BIN" ] && echo "as built" || echo "$AB_FLAGS")
      echo "== round $round: $tag"
      timeout 120 "$b" --check --merge --s ${AB_S:-4096,8192} --pipe 0 --iters 20
      timeout 120 "$b" --check --merge --h 16 --thd 4096,4096 --pipe 0 --iters 20
    done
  done >"$OUT/fwd-ab.log" 2>&1
  say "A/B ($AB_FLAGS) rc $?"
  grep -E "^==|TFLOP|merged into|check:" "$OUT/fwd-ab.log" | tee -a "$SUM"
}
if [ -n "${AB_ONLY:-}" ]; then # both builds' small checks, the sanitizers on the A/B build, the A/B
  [ -n "${AB_FLAGS:-}" ] || { say "AB_ONLY needs AB_FLAGS"; exit 1; }
  build "$BIN-ab" "$OUT/build-ab.log" "$AB_FLAGS"
  grep -A2 "fwd_kernel" "$OUT/build-ab.log" | grep -E "registers|spill" | sed "s/^/$AB_FLAGS: /" | tee -a "$SUM"
  for b in "$BIN" "$BIN-ab"; do
    small_checks "$b" "$OUT/fwd-small-$(basename "$b").log"
    rc=$?
    say "small checks $(basename "$b"): rc $rc ($(grep -c 'check: all ok' "$OUT/fwd-small-$(basename "$b").log") runs all ok)"
    [ $rc -eq 0 ] || { tail -20 "$OUT/fwd-small-$(basename "$b").log" | tee -a "$SUM"; exit 1; }
  done
  [ -n "${SKIP_SAN:-}" ] || for tool in memcheck racecheck; do
    timeout 300 $SAN --tool $tool --error-exitcode 9 "$BIN-ab" --b 1 --h 2 --s 256 --merge --pipe 0,1 --iters 1 $Q >"$OUT/san-$tool.log" 2>&1
    say "compute-sanitizer $tool ($AB_FLAGS): rc $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.log" | head -1))"
  done
  ab
  exit 0
fi
small_checks "$BIN" "$OUT/fwd-small.log"
rc=$?
tail -n +1 "$OUT/fwd-small.log" | tee -a "$SUM"
[ $rc -eq 0 ] || { say "small check FAILED (rc $rc): stopping before any timing"; exit 1; }
timeout 120 "$BIN" --check --s 4096 --iters 3 $Q >"$OUT/fwd-4k.log" 2>&1 || { cat "$OUT/fwd-4k.log" | tee -a "$SUM"; say "4k check FAILED"; exit 1; }
cat "$OUT/fwd-4k.log" | tee -a "$SUM"
[ -n "${SKIP_SAN:-}" ] || for tool in memcheck racecheck; do
  timeout 300 $SAN --tool $tool --error-exitcode 9 "$BIN" --b 1 --h 2 --s 256 --merge --pipe 0,1 --iters 1 $Q >"$OUT/san-$tool.log" 2>&1
  say "compute-sanitizer $tool: rc $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san-$tool.log" | head -1))"
done
timeout 300 "$BIN" --check --merge --s ${BENCH_S:-4096,8192,16384,32768} --pipe ${PIPES:-0,1} --iters 20 >"$OUT/fwd-bench.log" 2>&1
say "bench rc $?"
for s in $(echo ${BENCH_S:-4096,8192,16384,32768} | tr , ' '); do # thd: two sequences of s, the bshd bench's work
  timeout 200 "$BIN" --check --merge --h 16 --thd $s,$s --pipe ${PIPES:-0,1} --iters 20
done >>"$OUT/fwd-bench.log" 2>&1
say "thd bench rc $?"
cat "$OUT/fwd-bench.log" | tee -a "$SUM"
if [ -n "${AB_FLAGS:-}" ]; then
  build "$BIN-ab" "$OUT/build-ab.log" "$AB_FLAGS"
  ab
fi
[ -n "${SKIP_TORCH:-}" ] && exit 0
timeout 300 python3 experiments/attn/attn_bench_torch.py --layouts bshd --d ${LAB_D:-128} --out "$OUT" --name attn-torch-hopper \
  >"$OUT/torch.log" 2>&1
say "PyTorch SDPA rc $?"
grep -E "^\|" "$OUT/attn-torch-hopper.md" 2>/dev/null | head -20 | tee -a "$SUM"
