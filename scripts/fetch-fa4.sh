#!/usr/bin/env bash
# Fetch FlashAttention-4 (PyPI flash-attn-4, CuTe DSL kernels, sm90 and sm100) and the packages it
# needs that the GPU hosts' PyTorch venv lacks, pinned, as wheels into .deps/fa4/ (ignored by git;
# never committed), for the attention anchors of experiments/attn/attn_bench_torch.py.
#
# The GPU hosts have no package registry and a device call carries at most 64 MiB beside the tree,
# while the CuTe DSL's compiler wheel (nvidia-cutlass-dsl-libs-cu13) is ~92 MB. So the wheels are
# packed into two carry sets, .deps/fa4/1 and .deps/fa4/2 (~36 MB each; the big wheel unpacked,
# packed with xz and cut into parts): name .deps/fa4/1 in one call's carry and .deps/fa4/2 in the
# next call's, on the same warm machine; scripts/gpu/steps.sh's fa4_site keeps what each call
# brings under build/fa4-wheels (kept between calls), installs once every file that FILES (in both
# sets) names is there (pip --no-deps --target build/fa4site) and puts build/fa4site on PYTHONPATH. cuda-bindings, einops, protobuf and
# typing-extensions are in the hosts' venv already (device/KINDS.md), hence not fetched.
#   scripts/fetch-fa4.sh          fetch unless present
#   scripts/fetch-fa4.sh --force  fetch again
set -euo pipefail
PINS="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5"
cd "$(dirname "$0")/.."
DEST=.deps/fa4
pins_line="$(echo $PINS)"
if [ "${1:-}" != "--force" ] && [ "$(cat "$DEST/PINS" 2>/dev/null)" = "$pins_line" ]; then
  exit 0
fi
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch-fa4: python3 (with pip) is needed to download the wheels" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# cp312 manylinux x86_64: the hosts' venv (Python 3.12)
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --timeout 60 --retries 2 \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$TMP" $PINS >&2 ||
  { echo "fetch-fa4: pip could not download: $pins_line" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/1" "$DEST/2"
# a wheel over 40 MiB (the CuTe DSL compiler) unpacked and packed again with xz (92 -> ~66 MB, as
# pip would install it: its files and dist-info), in parts of at most 34 MiB; then every file,
# largest first, into the set with more room (~38 MB each)
big=$((40 * 1024 * 1024))
for f in "$TMP"/*.whl; do
  if [ "$(stat -c %s "$f")" -gt "$big" ]; then
    command -v xz >/dev/null || { echo "fetch-fa4: xz is needed (apt-get install xz-utils)" >&2; exit 1; }
    mkdir "$TMP/unpacked"
    "$PY" -m zipfile -e "$f" "$TMP/unpacked"
    echo "fetch-fa4: packing $(basename "$f") with xz" >&2
    tar -C "$TMP/unpacked" -cf - . | xz -T0 -9 -c | split -b $((34 * 1024 * 1024)) -d -a 2 - "$TMP/$(basename "$f" .whl).tar.xz.part-"
    rm -rf "$f" "$TMP/unpacked"
  fi
done
for f in $(ls -S "$TMP"); do
  s1=$(du -sb "$DEST/1" | cut -f1) s2=$(du -sb "$DEST/2" | cut -f1)
  if [ "$s1" -le "$s2" ]; then mv "$TMP/$f" "$DEST/1/"; else mv "$TMP/$f" "$DEST/2/"; fi
done
(cd "$DEST" && ls 1 2 | grep -v ':' | grep . | sort) >"$TMP/FILES"
cp "$TMP/FILES" "$DEST/1/FILES"
cp "$TMP/FILES" "$DEST/2/FILES"
echo "$pins_line" >"$DEST/PINS"
du -sh "$DEST"/1 "$DEST"/2 >&2
