#!/usr/bin/env bash
# Local step (a machine with Debian's package registry): download the Debian
# packages a GPU host needs to build and test distlab into .debs/ (ignored by
# git, carried to the GPU machine with `carry: [".debs"]`). The GPU hosts have
# no package registry; scripts/gpu/setup.sh unpacks these under /tmp there.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="luajit libluajit-5.1-2 libluajit-5.1-common premake4 liblua5.1-0 lua5.1 lua-busted lua-cliargs
  lua-dkjson lua-filesystem lua-luassert lua-mediator lua-penlight lua-say lua-system lua-term
  lua-readline libreadline8 readline-common rlwrap make"
mkdir -p .debs
cd .debs
rm -f ./*.deb
apt-get download $PKGS >/dev/null
ls -1 ./*.deb | wc -l | xargs echo "downloaded .debs/:"
du -sh . | cut -f1 | xargs echo "size:"
