#!/usr/bin/env bash
# scripts/ab-pack.sh NAME [TREE]: pack the library a checkout built (TREE/build/lib/libdistlab.so; TREE absolute
# or from the repository root, default the repository) for scripts/gpu/attn_ab.sh: stripped (strip
# --strip-unneeded) and xz'd into .ab/libNAME.so.xz, its commit (TREE's HEAD) into .ab/NAME.commit. Refuses a
# tree whose tracked files differ from HEAD, or a library older than a tracked source under core/ or kernels/,
# so that the commit names what was built.
set -eu
cd "$(dirname "$0")/.."
NAME=${1:?usage: scripts/ab-pack.sh NAME [TREE]}
TREE=${2:-.}
[[ "$NAME" =~ ^[a-z0-9]+$ ]] || { echo "ab-pack: NAME is [a-z0-9]+, got $NAME" >&2; exit 2; }
LIB="$TREE/build/lib/libdistlab.so"
[ -f "$LIB" ] || { echo "ab-pack: no $LIB (./distlab build in $TREE first)" >&2; exit 2; }
[ -z "$(git -C "$TREE" status --porcelain --untracked-files=no)" ] ||
  { echo "ab-pack: $TREE has uncommitted changes to tracked files: commit them, build, then pack" >&2; exit 2; }
newer=$(git -C "$TREE" ls-files core kernels | (cd "$TREE" && xargs -r find 2>/dev/null -newer build/lib/libdistlab.so) | head -3)
[ -z "$newer" ] || { echo "ab-pack: sources newer than $LIB (rebuild): $newer" >&2; exit 2; }
mkdir -p .ab
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
strip --strip-unneeded -o "$tmp" "$LIB"
xz -T2 -6 -c "$tmp" >".ab/lib$NAME.so.xz"
git -C "$TREE" rev-parse --short HEAD >".ab/$NAME.commit"
echo "ab-pack: .ab/lib$NAME.so.xz ($(stat -c %s ".ab/lib$NAME.so.xz") bytes) from $LIB at $(cat ".ab/$NAME.commit")"
