# Sourced by the lab steps (hopper_lab.sh, hopper_trace.sh), repo root as cwd: $OUT (default $1) made,
# $SUM ($OUT/summary.txt) started, say() that prints into it, and the GPU's and the commit's lines first.
#   source scripts/gpu/lab_summary.sh /tmp/default-out
set -uo pipefail
OUT="${OUT:-$1}"
mkdir -p "$OUT"
SUM="$OUT/summary.txt"
: >"$SUM"
say() { echo "$*" | tee -a "$SUM"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$SUM"
say "commit: ${DISTLAB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
