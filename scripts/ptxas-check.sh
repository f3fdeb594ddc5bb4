#!/usr/bin/env bash
# scripts/ptxas-check.sh [NVCC_ARGS...]: the Hopper kernel files (kernels/**/hopper/*.cu) compiled for sm_90a
# with premake5.lua's hopper_flags (copied here: keep the two alike) and `ptxas -v`, on the CPU machine, before a library goes
# to a GPU: per kernel its registers and spill bytes, and every note ptxas gives of a performance loss (C75xx:
# the wgmmas serialised, a wgmma wait injected). Exits 1 on any spill or any such note, 2 when a file does not
# compile. NVCC_ARGS go to nvcc as they are, e.g. `-DHP_BWD_NEXT=1` for a lab flag. About a minute a file.
# `--log FILE`: read a log of `nvcc -Xptxas -v` (or ptxas -v) instead of compiling (spec/ptxas_check_spec.lua's planted logs).
# SUMS=FILE: also write each kernel's machine code digest (md5 of its cubin .text section, one line a kernel,
# sorted by name) to FILE, so that two trees' SASS compare by `diff` where no cuobjdump is (this machine):
# a change of form whose digests all match needs no GPU timing (line numbers and comments do not enter .text).
# Why: a variant timed at 0.80x its base turned out to have had every wgmma of its kernel serialised (C7515),
# which a check for C7512 alone did not see (experiments/lab/attn/FA4-GAP.md section 28).
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
logfile=
if [ "${1:-}" = --log ]; then
  logfile=${2:?usage: scripts/ptxas-check.sh --log FILE}
  [ -f "$logfile" ] || { echo "ptxas-check: no $logfile" >&2; exit 2; }
else
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [ -x "$NVCC" ] || { echo "ptxas-check: no nvcc (PATH, /usr/local/cuda/bin)" >&2; exit 2; }
  CUDA_HOME=$(dirname "$(dirname "$NVCC")")
fi
for f in ${logfile:-kernels/*/hopper/*.cu}; do
  log=${logfile:-$tmp/$(basename "$f").log}
  if [ -z "$logfile" ] && ! "$NVCC" -DDL_WITH_CUDA -Icore -Icore/include -Ikernels -I"$CUDA_HOME/include" --forward-unknown-to-host-compiler \
    -std=c++20 -O3 -Xcompiler -fPIC --expt-relaxed-constexpr -lineinfo -gencode arch=compute_90a,code=sm_90a \
    -Xptxas -v -cubin "$@" -o "$tmp/out.cubin" "$f" >"$log" 2>&1; then
    echo "ptxas-check: $f does not compile:" >&2
    grep -m5 -E 'error' "$log" >&2
    exit 2
  fi
  if [ -n "${SUMS:-}" ] && [ -z "$logfile" ]; then
    python3 - "$tmp/out.cubin" "$f" >>"$tmp/sums" <<'EOF' || { echo "ptxas-check: $f: could not read the cubin's sections" >&2; exit 2; }
import hashlib, struct, sys
d = open(sys.argv[1], "rb").read()  # ELF64: the section headers, their names, each .text.<kernel>'s bytes
shoff, = struct.unpack_from("<Q", d, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
names = secs[shstrndx][4]
for s in secs:
    name = d[names + s[0]:d.index(b"\0", names + s[0])].decode()
    if name.startswith(".text."):
        print(hashlib.md5(d[s[4]:s[4] + s[5]]).hexdigest(), sys.argv[2], name[6:])
EOF
  fi
  python3 - "$f" "$log" <<'EOF' || status=1
import re, subprocess, sys
src, log = sys.argv[1], open(sys.argv[2]).read().splitlines()
kern, props, notes = [], {}, {}
cur = None
for line in log:
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        cur = m.group(1)
        kern.append(cur)
        continue
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and cur:
        props[cur] = [int(m.group(1)) + int(m.group(2)), None]
    m = re.search(r"Used (\d+) registers", line)
    if m and cur in props:
        props[cur][1] = int(m.group(1))
    m = re.search(r"\((C75\d\d)\) (.*?)(?: in (?:the )?function '([^']+)')", line)
    if m:
        notes.setdefault(m.group(3), []).append(m.group(1) + " " + m.group(2)[:110])
if not kern:
    print(f"ptxas-check: {src}: no kernel in ptxas's output (was it run with -v?)")
    sys.exit(1)
names = dict(zip(kern, subprocess.run(["c++filt"], input="\n".join(kern), capture_output=True, text=True).stdout.split("\n")))
bad = [k for k in kern if props.get(k, [0])[0] > 0 or k in notes]
print(f"ptxas-check: {src}: {len(kern)} kernels, {sum(props.get(k, [0])[0] > 0 for k in kern)} spilling, "
      f"{sum(k in notes for k in kern)} with a performance note")
for k in bad:
    spill, regs = props.get(k, [0, None])
    print(f"  {names.get(k, k)[:110]}: {regs} registers, {spill} bytes of spill stores and loads")
    for n in notes.get(k, []):
        print(f"    {n}")
sys.exit(1 if bad else 0)
EOF
done
if [ -n "${SUMS:-}" ] && [ -z "$logfile" ]; then
  LC_ALL=C sort -k3 "$tmp/sums" >"$SUMS"
  echo "ptxas-check: $(wc -l <"$SUMS") kernels' machine code digests in $SUMS"
fi
exit $status
