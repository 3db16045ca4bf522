#!/bin/bash
# Host-side runner of the cryptblk kernel-lab checks: builds cryptblk, stages it (plus the
# helper programs the guest image lacks: nbd-client, fusermount3, with their libraries) in a
# LAB_SHARE directory and runs guest scripts from tests/lab/ in the lab VM
# (/work/shared/lab/run-in-vm.sh: Debian 6.12 kernel with ublk_drv, dm-crypt, brd, nbd).
#
# usage: tests/lab/run.sh [--no-build] SCRIPT.sh [ARGS...]
# env:   LAB_DIR (default <workspace>/../shared/lab), LAB_SHARE (default: a fresh temp dir,
#        removed afterwards unless KEEP_SHARE=1), CARGO_TARGET_DIR, CRYPTBLK_BIN (use this
#        binary instead of building).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WS=$(cd "$HERE/../.." && pwd)
# Beside the workspace, or one level further up for a worktree in /work/wt/NAME (as vm.sh).
if [ -z "${LAB_DIR:-}" ]; then
  LAB_DIR=$WS/../shared/lab
  [ -x "$LAB_DIR/run-in-vm.sh" ] || LAB_DIR=$WS/../../shared/lab
fi
build=1
[ "${1:-}" = "--no-build" ] && { build=0; shift; }
[ $# -ge 1 ] || { sed -n '2,10p' "$0"; exit 2; }
script=$1; shift
[ -f "$script" ] || script=$HERE/$script
[ -x "$LAB_DIR/run-in-vm.sh" ] || { echo "lab: $LAB_DIR/run-in-vm.sh not found" >&2; exit 1; }

bin=${CRYPTBLK_BIN:-}
if [ -z "$bin" ]; then
  target=${CARGO_TARGET_DIR:-$WS/target}
  if [ $build = 1 ]; then (cd "$WS" && cargo build -q -p cryptblk) >&2; fi
  bin=$target/debug/cryptblk
fi
[ -x "$bin" ] || { echo "lab: no cryptblk binary at $bin" >&2; exit 1; }

own_share=0
if [ -z "${LAB_SHARE:-}" ]; then
  LAB_SHARE=$(mktemp -d /var/tmp/cryptblk-lab-share.XXXXXX); own_share=1
fi
export LAB_SHARE
cleanup() { [ $own_share = 1 ] && [ "${KEEP_SHARE:-0}" != 1 ] && rm -rf "$LAB_SHARE"; true; }
trap cleanup EXIT
mkdir -p "$LAB_SHARE/lib" "$LAB_SHARE/bin"
cp "$bin" "$LAB_SHARE/cryptblk"
# The guest image has the host's glibc at the same paths; the binary's other libraries and
# the helpers' libraries go to lib/ (used through LD_LIBRARY_PATH in the guest).
stage_libs() { for l in $(ldd "$1" | grep -o '/[^ ]*\.so[^ ]*'); do cp -Ln "$l" "$LAB_SHARE/lib/" 2>/dev/null || true; done; }
stage_libs "$bin"
for h in nbd-client fusermount3; do
  p=$(command -v "$h" || true)
  [ -n "$p" ] || continue
  cp -L "$p" "$LAB_SHARE/bin/"; stage_libs "$p"
done
# glibc itself must come from the image (mixing loaders breaks); drop it from lib/.
rm -f "$LAB_SHARE"/lib/{libc.so.6,ld-linux-x86-64.so.2,libm.so.6,libpthread.so.0,libdl.so.2}
# ext4 is not among the lab image's module trees: stage it (and its fs/ dependencies) from
# the lab's kernel package for the guest to insmod (lib.sh: load_ext4).
KVER=${LAB_KERNEL:-6.12.117+deb12-amd64}
M=${LAB_CACHE:-/var/tmp/cryptblk-lab}/pkg/$KVER/lib/modules/$KVER
mkdir -p "$LAB_SHARE/mod"
if [ -f "$M/modules.dep" ]; then
  for m in fs/mbcache fs/jbd2/jbd2 fs/ext4/ext4; do cp "$M/kernel/$m".ko* "$LAB_SHARE/mod/" 2>/dev/null || true; done
fi
cp "$HERE"/lib.sh "$LAB_SHARE/"
start=$(date +%s)
rc=0
LAB_TIMEOUT=${LAB_TIMEOUT:-1500} LAB_DIR=$LAB_DIR "$HERE/vm.sh" "$script" "$@" || rc=$?
echo "lab: $(basename "$script") finished rc=$rc in $(( $(date +%s) - start )) s" >&2
exit $rc
