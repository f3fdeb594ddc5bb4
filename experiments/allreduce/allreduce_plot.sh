#!/usr/bin/env bash
# experiments/allreduce/allreduce_plot.sh WIDE.csv [OUT.png [METHOD]] — latency vs size of
# every column of experiments/allreduce/allreduce_sweep.lua's wide CSV (log-log), with
# gnuplot (gnuplot-nox: the png terminal through libgd). Default OUT: the CSV's name
# with -wide.csv replaced by .png. METHOD goes on the y axis (default "CUDA graph of
# 10, median"; the sweep gives the host's method on cpu, where there are no graphs).
set -euo pipefail
csv="${1:?usage: allreduce_plot.sh WIDE.csv [OUT.png]}"
png="${2:-${csv%-wide.csv}.png}"
method="${3:-CUDA graph of 10, median}"
command -v gnuplot >/dev/null || { echo "allreduce_plot.sh: no gnuplot here; run it where gnuplot-nox is installed" >&2; exit 2; }
ncols=$(head -1 "$csv" | awk -F, '{print NF}')
title=$(basename "${csv%-wide.csv}")
gnuplot 2> >(grep -v "no valid points" >&2) <<GP
set terminal png noenhanced size 1200,760 font ",11"
set output "$png"
set datafile separator ","
set datafile missing "NaN"
set key autotitle columnhead left top
set logscale xy
set xlabel "bytes per rank (bf16)"
set ylabel "us per all-reduce ($method)"
set title "$title: all-reduce latency vs size"
set grid xtics ytics mxtics mytics
set xtics ("8K" 8192, "64K" 65536, "512K" 524288, "4M" 4194304, "32M" 33554432, "256M" 268435456, "1G" 1073741824)
plot for [c=2:$ncols] "$csv" using 1:c with linespoints lw 2 pt (c % 7 + 1) ps 1
GP
echo "wrote $png"
