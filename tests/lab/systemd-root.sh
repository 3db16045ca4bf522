#!/bin/bash
# Builds (once) the Debian root the systemd lab guest boots (tests/lab/systemd-boot.sh):
# debootstrap of bookworm with systemd, udev, tang and the libraries the cryptblk binary
# links, cached in $ROOT_CACHE/<hash of this script> (default /var/tmp/cryptblk-systemd-root)
# so a rerun reuses it. Prints the root's path on stdout.
#
# usage: tests/lab/systemd-root.sh [BINARY...]   (the packages of the binaries' shared
#        libraries, found with ldd and dpkg -S on this Debian host, are installed too)
# env:   ROOT_CACHE, DEBIAN_MIRROR (default http://deb.debian.org/debian)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${ROOT_CACHE:-/var/tmp/cryptblk-systemd-root}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# systemd as PID 1 with udev; tang serves the guest's own tang key; then the packages of the
# given binaries' libraries.
PKGS=systemd,systemd-sysv,udev,kmod,e2fsprogs,util-linux,procps,tang
libs=$(for b in "$@"; do ldd "$b" | grep -o '/[^ ]*\.so[^ ]*'; done | sort -u)
for l in $libs; do
  # glibc's own libraries (libm, libc ...) dpkg may not name by these paths: debootstrap
  # installs glibc anyway.
  p=$(dpkg -S "$(readlink -f "$l")" 2>/dev/null || dpkg -S "$l" 2>/dev/null) || continue
  PKGS+=",${p%%:*}"
done
PKGS=$(echo "$PKGS" | tr ',' '\n' | sort -u | paste -sd,)
key=$( (cat "$HERE/systemd-root.sh"; echo "$PKGS") | md5sum | cut -c1-12)
ROOT=$CACHE/$key
if [ -f "$ROOT/.complete" ]; then echo "$ROOT"; exit 0; fi
command -v debootstrap >/dev/null || {
  echo "systemd-root: installing debootstrap" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap) >/dev/null
}
echo "systemd-root: debootstrap $SUITE into $ROOT (once; a few minutes)" >&2
rm -rf "$ROOT.tmp"; mkdir -p "$CACHE"
debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT.tmp" "$MIRROR" >&2
# Package caches are not needed to boot.
rm -rf "$ROOT.tmp"/var/cache/apt/archives/*.deb "$ROOT.tmp"/var/lib/apt/lists/*
# Older roots of this cache (another version of this script) go.
for old in "$CACHE"/*; do [ "$old" = "$ROOT.tmp" ] || rm -rf "$old"; done
mv "$ROOT.tmp" "$ROOT"
touch "$ROOT/.complete"
echo "$ROOT"
