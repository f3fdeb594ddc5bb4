#!/usr/bin/env bash
# Remote step on a one-GPU Hopper host (repo root as cwd): where the fused merge's cost goes (issue 19,
# the fp32 running out at 4k causal). Four lab binaries of experiments/lab/attn/hopper/fwd.cu, built in
# parallel from copies of kernels/ edited by sed (nothing edited is committed; the sed patterns must
# match, or the script stops):
#   as_built  the shipped kernel;
#   nostore   the merge computes the new running rows but does not store them (acc_lse still stored);
#   noload    the producer issues no copies of the running rows (the epilogue merges whatever shared
#             memory holds);
#   neither   both.
# nostore, noload and neither give wrong running outs by design: they are timed, never checked. Each is
# run ROUNDS times (default 2), alternating, bshd b=2 h=16 d=128 at DIAG_S (default 4096), pipe 0, causal
# and not: the plain step, then merged into fp32 and bf16 (fwd.cu's "merged into" lines, cost against the
# same binary's plain step). Output: $OUT/diag.log, $OUT/summary.txt.
set -uo pipefail
t_start=$(date +%s)
OUT=${OUT:-/tmp/hopper-diag} LAYOUT=flat SUM_NAME=summary.txt
source "$(dirname "$0")/steps.sh" hopper_merge_diag 590 || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1 | tee -a "$SUM"
say "commit: ${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
K=kernels/attn/hopper/fwd_kernel.cuh
STORE='a\[4 \* j\] = z;'
LOAD1='cp_async(acc_stage_at(stage, r, row_bytes, byte), acc + r \* step + byte, vec);'
LOAD2='cp_async(stage + ST::o_bytes + 4 \* r, lse0 + r \* p.acc_lse_st\[0\], 4);'
[ "$(grep -c "$STORE" $K)" = 2 ] && grep -q "$LOAD1" $K && grep -q "$LOAD2" $K ||
  { echo "hopper_merge_diag.sh: $K no longer has the lines this script edits" | tee -a "$SUM"; exit 1; }
variant() { # $1 name, $2 sed program (may be empty)
  local d=/tmp/diag-$1
  rm -rf "$d" && mkdir -p "$d" && cp -r kernels "$d/" || return 1
  [ -n "$2" ] && sed -i "$2" "$d/$K"
  nvcc -DLAB_D=128 -I"$d/kernels" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
    -o "$d/fwd" experiments/lab/attn/hopper/fwd.cu >"$OUT/build-$1.log" 2>&1
}
# stores kept behind a condition no call meets (p.err is never 1), so the math stays
NOSTORE="s/$STORE/if (p.err == reinterpret_cast<int *>(1)) a[4 * j] = z;/"
NOLOAD="s/$LOAD1/;/; s/$LOAD2/;/"
t0=$(date +%s)
variant as_built "" & variant nostore "$NOSTORE" & variant noload "$NOLOAD" & variant neither "$NOSTORE; $NOLOAD" &
wait
for v in as_built nostore noload neither; do
  [ -x /tmp/diag-$v/fwd ] || { echo "build $v FAILED" | tee -a "$SUM"; tail -20 "$OUT/build-$v.log" | tee -a "$SUM"; exit 1; }
  echo "$v: $(grep -A2 fwd_kernel "$OUT/build-$v.log" | grep -oE 'Used [0-9]+ registers' | sort -u | tr '\n' ' ')" | tee -a "$SUM"
done
echo "builds: $(( $(date +%s) - t0 )) s" | tee -a "$SUM"
for round in $(seq ${ROUNDS:-2}); do
  for v in as_built nostore noload neither; do
    echo "== round $round: $v"
    timeout 120 /tmp/diag-$v/fwd --merge --s ${DIAG_S:-4096} --pipe 0 --iters 20
  done
done >"$OUT/diag.log" 2>&1
echo "runs rc $?" | tee -a "$SUM"
grep -E "^==|TFLOP|merged into" "$OUT/diag.log" | tee -a "$SUM"
