#!/usr/bin/env bash
# experiments/cp/cp_bench_plot.sh CSV [OUT.png] — overlap efficiency of every CP
# strategy against S_total (forward, and forward+backward), from the CSV that
# experiments/cp/cp_bench.lua writes, with gnuplot (gnuplot-nox). Default OUT:
# the CSV's name with .csv replaced by .png. The CSV is read as RFC 4180 has
# it (quoted names such as "all_gather, overlap"), its columns by name.
set -euo pipefail
csv="${1:?usage: cp_bench_plot.sh CSV [OUT.png]}"
png="${2:-${csv%.csv}.png}"
command -v gnuplot >/dev/null || { echo "cp_bench_plot.sh: no gnuplot here; run it where gnuplot-nox is installed" >&2; exit 2; }
dat=$(mktemp)
trap 'rm -f "$dat"' EXIT
# one block per strategy: S_total fwd_eff fwd_bwd_eff (in %), titled by the strategy's name
awk '
function fields(line, f,    n, i, c, q, v) {
  n = 0; v = ""; q = 0
  for (i = 1; i <= length(line); i++) {
    c = substr(line, i, 1)
    if (q) {
      if (c == "\"") { if (substr(line, i + 1, 1) == "\"") { v = v c; i++ } else q = 0 }
      else v = v c
    } else if (c == "\"") q = 1
    else if (c == ",") { f[++n] = v; v = "" }
    else v = v c
  }
  f[++n] = v
  return n
}
{ sub(/\r$/, "") }
NR == 1 { n = fields($0, h); for (i = 1; i <= n; i++) col[h[i]] = i; next }
{
  fields($0, f)
  name = f[col["strategy"]]
  if ("backend" in col && f[col["backend"]] != "") name = f[col["backend"]] ": " name  # cp_bench --backends
  if (f[col["fwd_eff"]] == "") next                      # the one-GPU reference row
  rows[name] = rows[name] sprintf("%s %.4f %.4f\n", f[col["S_total"]], 100 * f[col["fwd_eff"]], 100 * f[col["fwd_bwd_eff"]])
  if (!(name in seen)) { seen[name] = 1; order[++k] = name }
}
END { for (j = 1; j <= k; j++) printf "\"%s\"\n%s\n\n", order[j], rows[order[j]] }' "$csv" >"$dat"
title=$(basename "${csv%.csv}")
# the block count given, not [i=0:*]: that stops at the first block with no point in the y range
last=$(($(grep -c '^"' "$dat") - 1))
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
plot for [i=0:$last] "$dat" index i using 1:2 with linespoints lw 2 pt (i % 7 + 1) title columnheader(1)
set title "forward + backward"
plot for [i=0:$last] "$dat" index i using 1:3 with linespoints lw 2 pt (i % 7 + 1) title columnheader(1)
unset multiplot
GP
echo "wrote $png"
