#!/usr/bin/env bash
# experiments/ep/ep_bench_plot.sh BENCH.csv [E] [OUT.png] — ep_bench.lua's latency
# against B (log-log), with gnuplot (gnuplot-nox): dispatch and combine side by
# side, one line per (layout, output, dtype) of distlab's ep path, and the
# all_to_allv path and PyTorch's all_to_all_single baseline where the CSV has
# them, at E experts (default 256). Default OUT: the CSV's name with .csv
# replaced by -E<E>.png. The hosts have no gnuplot: draw here, from the CSV the
# run brought back.
set -euo pipefail
csv="${1:?usage: ep_bench_plot.sh BENCH.csv [E] [OUT.png]}"
E="${2:-256}"
png="${3:-${csv%.csv}-E$E.png}"
command -v gnuplot >/dev/null || { echo "ep_bench_plot.sh: no gnuplot here; run it where gnuplot-nox is installed" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one file per series: B dispatch_us combine_us, rows of E (a CSV reader: the
# PyTorch rows' method field holds a quoted comma)
python3 - "$csv" "$E" "$tmp" <<'PY'
import csv, re, sys
path, E, out = sys.argv[1], sys.argv[2], sys.argv[3]
series = {}
for r in csv.DictReader(open(path)):
    if r["E"] != E:
        continue
    name = "+".join((r["layout"], r["output"], r["dtype"])) if r["impl"] == "distlab" and r["path"] == "ep" \
        else "-".join((r["impl"], r["path"], r["layout"], r["dtype"]))  # torch: graph (the anchor) or eager
    series.setdefault(re.sub(r"[^A-Za-z0-9+_-]", "_", name), []).append((int(r["B"]), r["dispatch_us"], r["combine_us"]))
for name, rows in series.items():
    with open(f"{out}/{name}.dat", "w") as f:
        for b, d, c in sorted(rows):
            f.write(f"{b} {d} {c}\n")
PY
ls "$tmp"/*.dat >/dev/null 2>&1 || { echo "ep_bench_plot.sh: no rows with E=$E in $csv" >&2; exit 1; }
series=$(cd "$tmp" && ls *.dat | sed 's/\.dat$//' | tr '\n' ' ')
title=$(basename "${csv%.csv}")
plots() { # $1: column (2 dispatch, 3 combine)
  local s out="" i=0
  for s in $series; do
    out="$out${out:+, }\"$tmp/$s.dat\" using 1:$1 with linespoints lw 2 pt $((i % 7 + 1)) title \"$s\""
    i=$((i + 1))
  done
  echo "$out"
}
gnuplot <<GP
set terminal png noenhanced size 1400,620 font ",10"
set output "$png"
set multiplot layout 1,2 title "$title, E=$E: latency vs tokens per rank (distlab: CUDA graph of 10 calls, median, max over ranks)"
set logscale xy
set grid xtics ytics mytics
set key left top
set xlabel "B (tokens per rank)"
set ylabel "us"
set title "dispatch"
plot $(plots 2)
set title "combine"
plot $(plots 3)
unset multiplot
GP
echo "wrote $png"
