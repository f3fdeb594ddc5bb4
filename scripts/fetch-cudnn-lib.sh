#!/usr/bin/env bash
# Fetch a pinned cuDNN library newer than the GPU hosts' (system 9.14, PyTorch's wheel 9.19) for
# dl.attn's cudnn backend, into .deps/cudnn-lib/ (ignored by git; never committed), compressed so
# that it fits the 64 MiB a device call carries beside the tree, .debs/ and .deps/cudnn-frontend.
#
# Only the sub-libraries of cuDNN's GRAPH_JIT_ONLY configuration are kept (cuDNN frontend docs,
# "cuDNN Library Configuration": libcudnn.so, libcudnn_graph.so and
# libcudnn_engines_runtime_compiled.so, with CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY): the graph API and
# its JIT engines, which is all dl.attn uses. The whole wheel is ~0.5 GB; these three, xz -9e,
# ~56 MB; its headers (~0.6 MB) beside them, which premake5.lua prefers when present (so a build
# on the GPU host compiles the frontend for this version). On the host, scripts/gpu/steps.sh
# (unpack_carried_cudnn, pick_cudnn) unpacks them into .deps/cudnn-lib/lib, where libdistlab's
# pick finds them and, the newest cuDNN there, takes them (core/ops/attn/cudnn_lib.c: with
# CUDNN_LIB_CONFIG=GRAPH_JIT_ONLY and an NVRTC 13 loaded first); scripts/gpu/cudnn.sh times them
# beside the other candidates; the results name the version that ran.
#   scripts/fetch-cudnn-lib.sh          fetch unless present
#   scripts/fetch-cudnn-lib.sh --force  fetch again
set -euo pipefail
VERSION=9.28.1.4 # nvidia-cudnn-cu13 on PyPI
LIBS="libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9"
cd "$(dirname "$0")/.."
DEST=.deps/cudnn-lib
if [ "${1:-}" != "--force" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch-cudnn-lib: python3 (with pip) is needed to download the wheel" >&2; exit 1; }
command -v xz >/dev/null || { echo "fetch-cudnn-lib: xz is needed (apt-get install xz-utils)" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --timeout 60 --retries 2 \
  --python-version 3.11 --platform manylinux_2_27_x86_64 \
  -d "$TMP" "nvidia-cudnn-cu13==$VERSION" >&2 ||
  { echo "fetch-cudnn-lib: pip could not download nvidia-cudnn-cu13==$VERSION" >&2; exit 1; }
"$PY" - "$TMP" $LIBS <<'PYEOF'
import glob, os, sys, zipfile
src, libs = sys.argv[1], sys.argv[2:]
whl = glob.glob(src + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    for lib in libs:
        name = "nvidia/cudnn/lib/" + lib
        with z.open(name) as f, open(os.path.join(src, lib), "wb") as out:
            out.write(f.read())
    # its headers (without the *_v9.h copies): a build against them compiles the frontend's
    # paths for this version (e.g. the unified SDPA node with cu_seqlens, cuDNN 9.24+)
    os.makedirs(os.path.join(src, "include"), exist_ok=True)
    for n in z.namelist():
        if n.startswith("nvidia/cudnn/include/") and n.endswith(".h") and not n.endswith("_v9.h"):
            with z.open(n) as f, open(os.path.join(src, "include", os.path.basename(n)), "wb") as out:
                out.write(f.read())
    lic = [n for n in z.namelist() if n.endswith("LICENSE") or n.endswith("License.txt")]
    for n in lic:
        with z.open(n) as f, open(os.path.join(src, "License.txt"), "wb") as out:
            out.write(f.read())
PYEOF
rm -rf "$DEST"
mkdir -p "$DEST"
for lib in $LIBS; do
  echo "fetch-cudnn-lib: compressing $lib" >&2
  xz -T0 -9e -c "$TMP/$lib" >"$DEST/$lib.xz"
done
cp -r "$TMP/include" "$DEST/"
[ -f "$TMP/License.txt" ] && cp "$TMP/License.txt" "$DEST/"
echo "$VERSION" >"$DEST/VERSION"
du -sh "$DEST" >&2
