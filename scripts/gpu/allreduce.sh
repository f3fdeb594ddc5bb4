#!/usr/bin/env bash
# Remote step on a host with NRANKS GPUs (default 2; repo root as cwd, .debs
# carried, the lead's build done): everything the all-reduce issues need
# measured, in one run. Writes under $OUT/allreduce/ and prints the short
# table last.
#   [NRANKS=4] scripts/gpu/allreduce.sh [specs] [torch] [sweep] [variants]
#   (default: the first three)
#     specs  the #multigpu cases of spec/allreduce_spec.lua (2 GPUs; the cpu
#            cases run on every machine with ./distlab test)
#     torch  PyTorch anchors: experiments/allreduce/allreduce_torch.py under torchrun
#     sweep  dl.allreduce.tune (rows for ordinary tensors, zc_rows for inputs in the
#            zero-copy region), then experiments/allreduce/allreduce_sweep.lua (auto and
#            auto_zc use the table just tuned; the torch CSV is merged), then the plot;
#            then the Lamport region's A/B (issue 26): the Lamport columns again with
#            the fixed region of before (DISTLAB_AR_LAMPORT_MB=32), 256 KB .. 32 MB,
#            as allreduce-<gpu>x<NRANKS>-lamport_mb-32.{md,csv} (LAMPORT_AB=0: not)
#     variants  the sweep at 8 KB .. 16 MB once per setting of VARIANTS (see
#            below), under $OUT/allreduce/variants
#     stall  experiments/allreduce/allreduce_stall.lua (STALL_ARGS: its options)
#            once per knob setting in STALL_VARIANTS (see below)
#     commits  other builds against this checkout on one host (the "regressed
#            since?" question that runs on different days cannot answer): AB_COMMIT
#            (.ab/AB_COMMIT.tar, carried: `git archive -o .ab/C.tar C`; else this
#            checkout's .git) built in a folder of its own, and per word NAME of
#            AB_PATCHES this checkout with .ab/NAME.patch applied (`git diff >
#            .ab/NAME.patch`; a carried .ab/NAME.so, that tree's library built and
#            stripped elsewhere, saves the build); then each tree's own sweep at AB_SIZES (default
#            8K..256K; AB_ARGS: more options, e.g. --columns), alternating, AB_ROUNDS
#            times (default 3), under $OUT/allreduce/commits
# Results: allreduce-<gpu>x<NRANKS>.{md,csv}, -wide.csv, -tune.csv, the tuned
# table allreduce_tables-x<NRANKS>.lua, logs, and the PNG where gnuplot exists (else
# make it from the -wide.csv with experiments/allreduce/allreduce_plot.sh); copy the
# md, csv and png to experiments/results/allreduce/ (the md links the png by
# its bare name). distlab's NCCL is PyTorch's wheel's where there is one (the
# nccl_torch column's library; DISTLAB_AR_NCCL=system: the host's), named in
# machine.txt and the results' command. DISTLAB_COMMIT=<hash> names the commit in the results where
# the checkout has no .git. Typical run: about 5 minutes after the build; every step has a time
# limit (specs 300 s, torch 180 s, tune+sweep 480 s, the Lamport A/B 120 s).
set -u
t_start=$(date +%s)
source "$(dirname "$0")/steps.sh" allreduce 590 || exit 2
R="$L" # $OUT/allreduce: results and logs, packed into $OUT/allreduce-logs.tgz
export DISTLAB_TIMEOUT="${DISTLAB_TIMEOUT:-30}" # a hang fails in 30 s, not 120
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(specs torch sweep)

{
  header
  nvidia-smi topo -m 2>/dev/null | head -4
  nvcc --version 2>/dev/null | tail -1
  "$PY" -c 'import torch; print("torch nccl", torch.cuda.nccl.version())' 2>&1 | tail -1
} >"$R/machine.txt"
# distlab's NCCL: the one PyTorch's wheel brings where there is one (the
# nccl_torch column's), so the nccl and nccl_torch columns time one library;
# DISTLAB_AR_NCCL=system keeps the loader's (the host's libnccl2)
nccl_note="the host's libnccl.so.2"
if [ "${DISTLAB_AR_NCCL:-torch}" != system ]; then
  for f in /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2; do
    [ -e "$f" ] || continue
    export LD_LIBRARY_PATH="$(dirname "$(readlink -f "$f")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nccl_note="$(readlink -f "$f")"
    break
  done
fi
lib="$(ldconfig -p 2>/dev/null | grep -m1 'libnccl.so.2 ' | sed 's/.*=> //')"
[ "$nccl_note" != "the host's libnccl.so.2" ] && lib="$nccl_note"
ver=$(grep -a -m1 -o 'NCCL version [0-9][0-9.]*' "$lib" 2>/dev/null | head -1)
nccl_note="$nccl_note${ver:+ ($ver)}"
echo "distlab's NCCL: $nccl_note" >>"$R/machine.txt"
cat "$R/machine.txt"
NR="${NRANKS:-2}"
gpu=$(gpu_tag)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge "$NR" ] || { say "allreduce.sh: needs $NR GPUs, found $ngpu"; status=2; exit 2; }
if [ ! -f build/lib/libdistlab.so ]; then step build 240 "$R/build.log" ./distlab build || exit 1; fi
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((NR - 1)))}"

for s in "${sections[@]}"; do
  case "$s" in
    specs)
      DISTLAB_SPEC_GPUS="$NR" step "specs on 2 GPUs$([ "$NR" = 2 ] || echo ", and the correctness cases on $NR")" 300 \
        "$R/spec.log" busted --run=default --tags=multigpu -o spec/support/summary.lua spec/allreduce_spec.lua
      grep -v '^ok ' "$R/spec.log" | tail -30 ;;
    torch)
      port=$((20000 + RANDOM % 20000))
      step "PyTorch anchors" 180 "$R/torch.log" "$PY" -m torch.distributed.run --nproc_per_node "$NR" \
        --master_port "$port" experiments/allreduce/allreduce_torch.py "$R/torch.csv"
      tail -5 "$R/torch.log" ;;
    sweep)
      tables="$R/allreduce_tables-x$NR.lua" # one file a world size: a later run at another size keeps it
      rm -f "$tables"
      knobs="$(env | grep -E '^DISTLAB_AR_' | grep -v '^DISTLAB_AR_TABLE=' | sort | tr '\n' ' ')" # the run's knobs, named in its command
      DISTLAB_AR_TABLE="$tables" step "tune and sweep" 480 "$R/sweep.log" ./distlab run -n "$NR" --device cuda \
        experiments/allreduce/allreduce_sweep.lua --out "$R" --torch "$R/torch.csv" --tune "$tables" \
        --command "${knobs}NRANKS=$NR scripts/gpu/allreduce.sh (DISTLAB_AR_TABLE=allreduce_tables-x$NR.lua, tuned in the same run; distlab's NCCL: $nccl_note)"
      [ "${LAMPORT_AB:-1}" = 0 ] && continue # LAMPORT_AB=0: no A/B this time
      DISTLAB_AR_LAMPORT_MB=32 DISTLAB_AR_TABLE="$tables" step "the Lamport region of before (DISTLAB_AR_LAMPORT_MB=32)" 120 \
        "$R/lamport_mb-32.log" ./distlab run -n "$NR" --device cuda \
        experiments/allreduce/allreduce_sweep.lua --out "$R" --tag "${gpu}x$NR-lamport_mb-32" \
        --columns one_shot_lamport,two_shot_lamport --sizes 256K,1M,4M,8M,16M,32M \
        --command "DISTLAB_AR_LAMPORT_MB=32 NRANKS=$NR scripts/gpu/allreduce.sh sweep (its Lamport A/B)"
      grep -A8 '^| size' "$R/allreduce-${gpu}x$NR-lamport_mb-32.md" 2>/dev/null || tail -5 "$R/lamport_mb-32.log"
      for wide in "$R"/allreduce-*-wide.csv; do
        [ -f "$wide" ] || continue
        if command -v gnuplot >/dev/null; then experiments/allreduce/allreduce_plot.sh "$wide"
        else echo "no gnuplot on this host: make the PNG elsewhere with experiments/allreduce/allreduce_plot.sh $(basename "$wide")"; fi
      done ;;
    variants)
      # the sweep at 8 KB .. 16 MB once per setting in VARIANTS (NAME=VALUE
      # words, default "DISTLAB_AR_PDL=0 DISTLAB_AR_PDL=1"; also e.g.
      # DISTLAB_AR_ROUND_KB=32), tagged <gpu>x<NRANKS>-<value>; VARIANT_ARGS:
      # more sweep options (a later --sizes wins, e.g. --columns one_shot_lamport);
      # VARIANT_COLUMNS, VARIANT_SIZES: --columns, --sizes in one word each (for
      # batch.sh's steps, whose words cannot hold spaces); VARIANT_ROUNDS=K: the
      # settings K times, alternating (tags end -r1 .. -rK)
      VARIANT_ARGS="${VARIANT_ARGS:-}${VARIANT_COLUMNS:+ --columns $VARIANT_COLUMNS}${VARIANT_SIZES:+ --sizes $VARIANT_SIZES}"
      mkdir -p "$R/variants"
      VARIANTS="${VARIANTS:-DISTLAB_AR_PDL=0 DISTLAB_AR_PDL=1}"
      VARIANTS="${VARIANTS//,DISTLAB_/ DISTLAB_}" # commas between settings too (batch.sh's words)
      for round in $(seq "${VARIANT_ROUNDS:-1}"); do
      for v in $VARIANTS; do
        tag="${gpu}x$NR-$(echo "${v#DISTLAB_AR_}" | tr 'A-Z=' 'a-z-')"
        [ "${VARIANT_ROUNDS:-1}" -gt 1 ] && tag="$tag-r$round"
        step "sweep with $v (round $round)" 150 "$R/variants/$tag.log" env "$v" ./distlab run -n "$NR" --device cuda \
          experiments/allreduce/allreduce_sweep.lua --out "$R/variants" --tag "$tag" --torch "$R/torch.csv" \
          --sizes 8192,65536,262144,524288,1048576,2097152,3145728,4194304,8388608,16777216 ${VARIANT_ARGS:-} \
          --command "$v NRANKS=$NR scripts/gpu/allreduce.sh variants ${VARIANT_ARGS:-}"
        grep -E "^ *[0-9]+ (one_shot|one_shot_push|one_shot_lamport|two_shot_lamport|two_shot_push_zc|auto) " "$R/variants/$tag.log"
      done
      done ;;
    commits)
      # the trees: AB_COMMIT's (if set), one patched copy of this checkout per
      # .ab/NAME.patch in AB_PATCHES (its build copied, so only what the patch
      # touches compiles again), and this checkout's
      trees=() names=()
      mkdir -p "$R/commits"
      here="$(git rev-parse --short HEAD 2>/dev/null)"
      here="${DISTLAB_COMMIT:-${here:-HEAD}}"
      if [ -n "${AB_COMMIT:-}" ]; then
        old=/tmp/distlab-ab-$AB_COMMIT
        if [ ! -f "$old/build/lib/libdistlab.so" ]; then
          rm -rf "$old" && mkdir -p "$old"
          if [ -f ".ab/$AB_COMMIT.tar" ]; then tar -x -C "$old" -f ".ab/$AB_COMMIT.tar" # carried (git archive, locally)
          else git archive "$AB_COMMIT" | tar -x -C "$old" || { say "commits: no $AB_COMMIT in this .git, nor .ab/$AB_COMMIT.tar"; continue; }; fi
          cp -r .deps "$old/" 2>/dev/null
          step "building $AB_COMMIT in $old" 300 "$R/commits/build-$AB_COMMIT.log" env -C "$old" ./distlab build ||
            { tail -20 "$R/commits/build-$AB_COMMIT.log"; continue; }
        fi
        trees+=("$old") names+=("$AB_COMMIT")
      fi
      for pn in ${AB_PATCHES:-}; do
        t=/tmp/distlab-ab-$pn
        say "this checkout with .ab/$pn.patch in $t"
        rm -rf "$t" && mkdir -p "$t" && tar -c --exclude=./.git . | tar -x -C "$t" || continue
        if [ -f ".ab/$pn.so" ]; then # built and stripped elsewhere, carried: no build here
          (cd "$t" && patch -p1 <"$OLDPWD/.ab/$pn.patch" && mkdir -p build/lib &&
            cp "$OLDPWD/.ab/$pn.so" build/lib/libdistlab.so) >"$R/commits/build-$pn.log" 2>&1
        else
          (cd "$t" && patch -p1 <"$OLDPWD/.ab/$pn.patch" && timeout 300 ./distlab build) >"$R/commits/build-$pn.log" 2>&1
        fi || { tail -20 "$R/commits/build-$pn.log"; continue; }
        trees+=("$t") names+=("$here+$pn")
      done
      trees+=("$PWD") names+=("$here")
      for round in $(seq "${AB_ROUNDS:-3}"); do
        for k in "${!trees[@]}"; do
          tree="${trees[$k]}" c="${names[$k]}"
          sweep=experiments/allreduce/allreduce_sweep.lua
          [ -f "$tree/$sweep" ] || sweep=experiments/allreduce_sweep.lua # before the rooms
          tag="${gpu}x$NR-$c-r$round"
          step "round $round: $c" 150 "$R/commits/$tag.log" env -C "$tree" ./distlab run -n "$NR" --device cuda "$sweep" \
            --out "$R/commits" --tag "$tag" --sizes "${AB_SIZES:-8192,16384,32768,65536,131072,262144}" ${AB_ARGS:-} \
            --command "AB_COMMIT=${AB_COMMIT:-} AB_PATCHES=${AB_PATCHES:-} NRANKS=$NR scripts/gpu/allreduce.sh commits (the tree of $c)"
          grep -E "^ *[0-9]+ (one_shot|one_shot_lamport|two_shot_lamport|auto) " "$R/commits/$tag.log"
        done
      done ;;
    stall)
      # back-to-back calls after a late start (experiments/allreduce/allreduce_stall.lua),
      # once per word of STALL_VARIANTS (NAME=VALUE, or "default": as shipped); the
      # default compares the kernels of before 2026-11-27 piece by piece: every waiting
      # thread reading the watchdog's host word (DISTLAB_AR_GONE_GAP_US=0), one nap
      # for every poll (DISTLAB_AR_LONG_POLL_NS=128), and as shipped
      for v in ${STALL_VARIANTS:-DISTLAB_AR_GONE_GAP_US=0 DISTLAB_AR_LONG_POLL_NS=128 default}; do
        step "stall, $v" 150 "$R/stall-$v.log" env $([ "$v" != default ] && echo "$v") ./distlab run -n "$NR" \
          --device cuda experiments/allreduce/allreduce_stall.lua --out "$R" \
          ${STALL_ARGS:-} --command "NRANKS=$NR scripts/gpu/allreduce.sh stall ($v)"
        grep -E "^#|^ +[0-9]" "$R/stall-$v.log"
      done ;;
    *) say "unknown section $s (specs, torch, sweep, variants, commits, stall)"; status=1 ;;
  esac
done
if [ -f "$R/sweep.log" ]; then
  echo "---- targets"
  grep -A9 '^## Targets' "$R"/allreduce-*x"$NR".md 2>/dev/null | grep '^- ' || tail -5 "$R/sweep.log"
  echo "---- short table (us per all-reduce)"
  sed -n '/^size  /,$p' "$R/sweep.log"
fi
exit $status
