# shellcheck shell=bash
# Sourced by scripts/gpu/steps.sh on a GPU host, from the repo root: unpack the carried
# Debian packages (.debs/, from scripts/fetch-debs.sh) under /tmp/debroot
# and put their programs and Lua modules on the paths. Idempotent.
DEBROOT=/tmp/debroot
if [ ! -x "$DEBROOT/usr/bin/luajit" ]; then
  [ -d .debs ] || { echo "setup.sh: no .debs/ here: run scripts/fetch-debs.sh locally and carry .debs" >&2; return 1; }
  mkdir -p "$DEBROOT"
  for f in .debs/*.deb; do dpkg -x "$f" "$DEBROOT"; done
  # Debian's luajit is a symlink to luajit-2.1.0-beta3 in the same folder
  ls "$DEBROOT/usr/bin" >/dev/null
fi
export PATH="$DEBROOT/usr/bin:$PATH"
export LD_LIBRARY_PATH="$DEBROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LUA_PATH="$DEBROOT/usr/share/lua/5.1/?.lua;$DEBROOT/usr/share/lua/5.1/?/init.lua;;"
export LUA_CPATH="$DEBROOT/usr/lib/x86_64-linux-gnu/lua/5.1/?.so;;"
# busted's launcher runs `lua`; under distlab it must be LuaJIT
mkdir -p "$DEBROOT/bin"
cat >"$DEBROOT/bin/busted" <<BUSTED
#!/bin/sh
exec luajit -e "package.path='$DEBROOT/usr/share/lua/5.1/?.lua;$DEBROOT/usr/share/lua/5.1/?/init.lua;'..package.path" $DEBROOT/usr/bin/busted "\$@"
BUSTED
chmod +x "$DEBROOT/bin/busted"
export PATH="$DEBROOT/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the hosts reach no package registry: ./distlab's set-up must not try to install gnuplot here
mkdir -p build && : >build/.no-gnuplot
