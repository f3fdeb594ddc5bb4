#!/usr/bin/env bash
# Fetch NVIDIA's NCCL EP for dl.ep.buffer{backend = "nccl_ep"} into .deps/nccl-ep
# (ignored by git; never committed): from the nccl-extensions wheel on PyPI, pinned
# below, its CUDA 13 library (lib/libnccl_ep.so, ~9 MB) and its headers (include/:
# nccl_ep.h and the nccl_ep/ kernel headers its JIT compiles). core/ops/ep/nccl_ep_lib.c
# opens the library from there (DISTLAB_NCCL_EP names another) and points NCCL_EP_HOME
# at the folder. The wheel's library is the same for every Python version.
#
# NCCL EP needs NCCL 2.29.2 or newer (it calls ncclCommQueryProperties,
# ncclGetPeerDevicePointer, ncclWinGetUserPtr; the wheel asks for nvidia-nccl-cu13
# 2.30.7); the GPU hosts have 2.28. --nccl also fetches that NCCL, libnccl.so.2 (~300
# MB) and its headers (NCCL EP's JIT reads nccl_device/ there: NCCL_HOME), into
# .deps/nccl-ep/nccl; run with LD_LIBRARY_PATH=$PWD/.deps/nccl-ep/nccl/lib so that
# the communicator's NCCL is that one. GPU hosts have no registry: carry .deps/ there.
#   scripts/fetch-nccl-ep.sh          fetch unless present
#   scripts/fetch-nccl-ep.sh --nccl   and the NCCL it needs
#   scripts/fetch-nccl-ep.sh --force  fetch again
#   scripts/fetch-nccl-ep.sh --nccl --carry   and .deps/nccl-ep-carry (~50 MB): what a GPU
#       host needs of both, to carry in one call: libnccl_ep.so and a copy of libnccl.so.2
#       with only Hopper's device code (scripts/prune-fatbin.py ... 90: 38 MB under xz
#       instead of 150), both xz'd, and the headers; scripts/gpu/steps.sh's
#       unpack_carried_nccl_ep makes .deps/nccl-ep of it there (CARRY_SM=100: Blackwell's)
set -euo pipefail
VERSION=0.1.0      # nccl-extensions
NCCL_VERSION=2.30.7 # nvidia-nccl-cu13, as nccl-extensions 0.1.0's [cu13] extra pins it
cd "$(dirname "$0")/.."
DEST=.deps/nccl-ep
FORCE=0 WITH_NCCL=0 CARRY=0
for a in "$@"; do
  case "$a" in
  --force) FORCE=1 ;;
  --nccl) WITH_NCCL=1 ;;
  --carry) CARRY=1 ;;
  *) echo "fetch-nccl-ep: unknown option $a (--nccl, --carry, --force)" >&2; exit 2 ;;
  esac
done
PY="$(command -v python3 || true)"
[ -n "$PY" ] || { echo "fetch-nccl-ep: python3 (with pip) is needed to download the wheels" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# download <requirement> <dir>: one manylinux wheel for CPython 3.12, no dependencies
download() {
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --timeout 60 --retries 2 \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux_2_18_x86_64 -d "$2" "$1" >&2 ||
    { echo "fetch-nccl-ep: pip could not download $1" >&2; exit 1; }
}

# unpack <dir> <dest> <prefix=to>...: the members of the one wheel in dir under each
# prefix into dest/to (a member named exactly prefix: the file dest/to)
unpack() {
  "$PY" - "$@" <<'PYEOF'
import glob, os, shutil, sys, zipfile
src, dest, maps = sys.argv[1], sys.argv[2], [m.split("=", 1) for m in sys.argv[3:]]
with zipfile.ZipFile(glob.glob(src + "/*.whl")[0]) as z:
    for n in z.namelist():
        for prefix, to in maps:
            if n.endswith("/") or not n.startswith(prefix):
                continue
            rest = n[len(prefix):].lstrip("/")
            out = os.path.join(dest, to, rest) if rest else os.path.join(dest, to)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as f, open(out, "wb") as g:
                shutil.copyfileobj(f, g)
PYEOF
}

if [ "$FORCE" = 1 ] || [ ! -f "$DEST/lib/libnccl_ep.so" ] || [ "$(cat "$DEST/VERSION" 2>/dev/null)" != "$VERSION" ]; then
  download "nccl-extensions==$VERSION" "$TMP/ep"
  rm -rf "$DEST/lib" "$DEST/include"
  mkdir -p "$DEST"
  unpack "$TMP/ep" "$DEST" "nccl/ep/lib/cu13/libnccl_ep.so=lib/libnccl_ep.so" "nccl/ep/include/=include" \
    "nccl_extensions-$VERSION.dist-info/licenses/LICENSE.txt=LICENSE.txt"
  chmod 755 "$DEST/lib/libnccl_ep.so"
  echo "$VERSION" >"$DEST/VERSION"
  echo "fetch-nccl-ep: NCCL EP of nccl-extensions $VERSION in $DEST (lib/, include/)" >&2
fi

if [ "$WITH_NCCL" = 1 ] && { [ "$FORCE" = 1 ] || [ "$(cat "$DEST/nccl/VERSION" 2>/dev/null)" != "$NCCL_VERSION" ]; }; then
  download "nvidia-nccl-cu13==$NCCL_VERSION" "$TMP/nccl"
  rm -rf "$DEST/nccl"
  mkdir -p "$DEST/nccl"
  unpack "$TMP/nccl" "$DEST/nccl" "nvidia/nccl/lib/=lib" "nvidia/nccl/include/=include"
  echo "$NCCL_VERSION" >"$DEST/nccl/VERSION"
  echo "fetch-nccl-ep: NCCL $NCCL_VERSION in $DEST/nccl (run with LD_LIBRARY_PATH=$PWD/$DEST/nccl/lib)" >&2
fi

if [ "$CARRY" = 1 ]; then
  [ -f "$DEST/nccl/lib/libnccl.so.2" ] || { echo "fetch-nccl-ep: --carry needs --nccl (NCCL $NCCL_VERSION)" >&2; exit 1; }
  SM="${CARRY_SM:-90}"
  C=.deps/nccl-ep-carry
  rm -rf "$C"
  mkdir -p "$C/lib" "$C/nccl"
  cp -r "$DEST/include" "$DEST/VERSION" "$C/"
  cp -r "$DEST/nccl/include" "$DEST/nccl/VERSION" "$C/nccl/"
  xz -T0 -6 -c "$DEST/lib/libnccl_ep.so" >"$C/lib/libnccl_ep.so.xz"
  "$PY" scripts/prune-fatbin.py "$DEST/nccl/lib/libnccl.so.2" "$TMP/libnccl.so.2" "$SM" >&2
  xz -T0 -6 -c "$TMP/libnccl.so.2" >"$C/nccl/libnccl.so.2.xz"
  echo "$SM" >"$C/nccl/SM"
  echo "fetch-nccl-ep: $C ($(du -sh "$C" | cut -f1)): carry it to a GPU host (sm_$SM device code only in its NCCL)" >&2
fi
