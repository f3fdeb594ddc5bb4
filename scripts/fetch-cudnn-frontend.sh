#!/usr/bin/env bash
# Fetch cuDNN's frontend headers (header-only C++, Apache-2.0) into
# .deps/cudnn-frontend/include (ignored by git; never committed). They come
# from the nvidia-cudnn-frontend wheel on PyPI, pinned below: the wheel's
# include/ is the same for every Python version and platform, so any one
# wheel of the release serves. core/ops/attn/cudnn_sdpa.cpp is compiled
# against them when they are present (premake5.lua); without them the build
# has no cudnn attention backend and says so at run time.
# `./distlab build` runs this once when the headers are missing and nvcc is
# found; GPU hosts have no registry, so carry .deps/ there (as .debs/).
#   scripts/fetch-cudnn-frontend.sh          fetch unless present
#   scripts/fetch-cudnn-frontend.sh --force  fetch again
set -euo pipefail
VERSION=1.32.0
cd "$(dirname "$0")/.."
DEST=.deps/cudnn-frontend
if [ "${1:-}" != "--force" ] && [ -f "$DEST/include/cudnn_frontend.h" ] &&
  [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  exit 0
fi
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch-cudnn-frontend: python3 (with pip) is needed to download the wheel" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --timeout 20 --retries 1 \
  --python-version 3.11 --platform manylinux_2_28_x86_64 \
  -d "$TMP" "nvidia-cudnn-frontend==$VERSION" >&2 ||
  { echo "fetch-cudnn-frontend: pip could not download nvidia-cudnn-frontend==$VERSION" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" - "$TMP" "$DEST" <<'PYEOF'
import glob, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(src + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    names += [n for n in z.namelist() if n.endswith("dist-info/LICENSE") or n.endswith("licenses/LICENSE")]
    z.extractall(dest, names)
PYEOF
echo "$VERSION" >"$DEST/VERSION"
echo "fetch-cudnn-frontend: cuDNN frontend $VERSION headers in $DEST/include" >&2
