#!/usr/bin/env bash
# The kill trials of spec/faults_spec.lua at full count on cpu: TRIALS
# (default 20) per op, a rank killed mid-op each time; every survivor must
# fail within 1 s naming the death, and the launcher must name the dead
# rank. `./distlab test` runs 4 per op; this takes about a minute on 2 cores.
# Prints each op's slowest survivor (seconds after the death).
#   scripts/faults.sh            TRIALS=50 scripts/faults.sh
set -u
cd "$(dirname "$0")/.." || exit 2
SPEC_KILL_TRIALS="${TRIALS:-20}" ./distlab test spec/faults_spec.lua
