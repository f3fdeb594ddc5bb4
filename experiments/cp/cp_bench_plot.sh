#!/usr/bin/env bash
# experiments/cp_bench_plot.sh CSV [OUT.png] — overlap efficiency of every CP
# strategy against S_total (forward, and forward+backward), from the CSV that
# experiments/cp_bench.lua writes, with gnuplot (gnuplot-nox). Default OUT:
# the CSV's name with .csv replaced by .png.
set -euo pipefail
csv="${1:?usage: cp_bench_plot.sh CSV [OUT.png]}"
png="${2:-${csv%.csv}.png}"
command -v gnuplot >/dev/null || { echo "cp_bench_plot.sh: no gnuplot here; run it where gnuplot-nox is installed" >&2; exit 2; }
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
# one block per strategy: S_total fwd_eff fwd_bwd_eff (the name may hold commas; it is
# quoted, and the last five fields are numbers)
awk -F, 'NR > 1 {
  name = $2; for (i = 3; i <= NF - 5; i++) name = name "," $i
  gsub(/"/, "", name)
  if ($(NF - 3) == "") next                      # the one-GPU reference row
  rows[name] = rows[name] sprintf("%s %.4f %.4f\n", $1, 100 * $(NF - 3), 100 * $(NF - 1))
  if (!(name in seen)) { seen[name] = 1; order[++n] = name }
} END { for (k = 1; k <= n; k++) printf "\"%s\"\n%s\n\n", order[k], rows[order[k]] }' "$csv" >"$dat"
title=$(basename "${csv%.csv}")
gnuplot <<GP
set terminal png noenhanced size 1200,520 font ",11"
set output "$png"
set multiplot layout 1,2 title "$title: overlap efficiency = T(1 GPU) / (C x T(CP)), causal, B=1 H=16 D=128 bf16"
set logscale x 2
set xlabel "S_total (tokens)"
set ylabel "efficiency (%)"
set grid
set key bottom right
set yrange [60:100]
set xrange [13000:160000]
set xtics ("16k" 16384, "32k" 32768, "64k" 65536, "128k" 131072)
set title "forward"
plot for [i=0:*] "$dat" index i using 1:2 with linespoints lw 2 pt (i % 7 + 1) title columnheader(1)
set title "forward + backward"
plot for [i=0:*] "$dat" index i using 1:3 with linespoints lw 2 pt (i % 7 + 1) title columnheader(1)
unset multiplot
GP
echo "wrote $png"
