#!/usr/bin/env bash
# Installs the Debian package into a clean Debian root and runs it there: apt resolves its
# Depends from the archive, then `cryptblk luksFormat` on a file, `open --nbd`, `status`
# and `close` run inside the chroot, and the host's nbdinfo reads the export's size through
# the socket the chroot's daemon serves. A manual check (root, network to the Debian
# archive; about 2 minutes with the debootstrap, 20 s after: README "Install"), not in CI.
#
#   scripts/deb-check.sh [PACKAGE.deb]     (default: the newest target/debian/cryptblk_*.deb)
#
# The root is `debootstrap --variant=minbase bookworm`, made once into
# target-deb/root-template (the archive this host's apt uses) and copied afresh each run.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir=${CARGO_TARGET_DIR:-target}
deb=${1:-$(ls -t "$target_dir"/debian/cryptblk_*.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "deb-check: no package (run scripts/deb.sh first)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "deb-check: needs root (chroot, mounts)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
command -v nbdinfo >/dev/null || apt-get install -y -qq libnbd-bin >/dev/null

work=$(pwd)/target-deb
template=$work/root-template
root=$work/root
mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
if [ ! -x "$template/usr/bin/apt-get" ]; then
  rm -rf "$template"
  echo "deb-check: debootstrap --variant=minbase bookworm from $mirror (once)" >&2
  debootstrap --variant=minbase bookworm "$template" "$mirror" >"$work/debootstrap.log"
fi

mounted=()
cleanup() {
  # The daemon may still run if a step failed: end it before unmounting.
  [ -d "$root/proc" ] && chroot "$root" /usr/bin/cryptblk close vol >/dev/null 2>&1 || true
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[$i]}" 2>/dev/null || umount -l "${mounted[$i]}"; done
  rm -rf "$root"
}
trap cleanup EXIT
rm -rf "$root"
cp -a "$template" "$root"
mount_in() { # mount_in <mount args...> <dir under root>
  local dir=$root/${*: -1}
  mkdir -p "$dir"
  mount "${@:1:$#-1}" "$dir"
  mounted+=("$dir")
}
mount_in -t proc proc proc
mount_in --bind /dev dev
mount_in -t tmpfs tmpfs tmp
mount_in -t tmpfs tmpfs run
cp /etc/resolv.conf "$root/etc/resolv.conf"
cp "$deb" "$root/tmp/cryptblk.deb"

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
start=$(date +%s)
echo "== dpkg -i (fails on missing Depends), then apt-get -f install"
in_root dpkg -i /tmp/cryptblk.deb || true
in_root apt-get update -qq
DEBIAN_FRONTEND=noninteractive in_root apt-get -f install -y -qq --no-install-recommends >/dev/null
in_root dpkg -s cryptblk | grep -E '^(Status|Version|Depends):'
in_root dpkg -L cryptblk | grep -E 'bin/|man8/cryptblk(-luksFormat)?\.8|completions|systemd' 
# Units and the generator where every Debian's systemd reads them: /usr/lib/systemd
# (bookworm's systemd 252 also reads /lib/systemd, trixie's does not).
if in_root dpkg -L cryptblk | grep -q 'lib/systemd/'; then
  if in_root dpkg -L cryptblk | grep 'lib/systemd/' | grep -v '^/usr/lib/systemd/'; then
    echo "deb-check: systemd files outside /usr/lib/systemd (above)" >&2
    exit 1
  fi
  in_root test -x /usr/lib/systemd/system-generators/cryptblk-generator
  echo "systemd units and generator: under /usr/lib/systemd"
  # The udev rule that links /dev/cryptblk/NAME for ublk (the generator's units wait for
  # that device), installed where udev reads packaged rules, as the tree has it.
  if ! cmp -s "$root/usr/lib/udev/rules.d/60-cryptblk.rules" dist/udev/rules.d/60-cryptblk.rules; then
    echo "deb-check: /usr/lib/udev/rules.d/60-cryptblk.rules missing or not the tree's" >&2
    exit 1
  fi
  echo "udev rule: /usr/lib/udev/rules.d/60-cryptblk.rules"
fi

echo "== run"
in_root cryptblk --version
# The key goes through a file, never the command line.
head -c 32 /dev/urandom >"$root/tmp/key"
in_root truncate -s 64M /tmp/vol.img
in_root cryptblk luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
  --key-file /tmp/key /tmp/vol.img
in_root cryptblk isLuks /tmp/vol.img && echo "isLuks: yes"
in_root cryptblk open --key-file /tmp/key /tmp/vol.img vol --nbd /tmp/vol.sock
in_root cryptblk status vol
size=$(timeout 30 nbdinfo --size "nbd+unix:///?socket=$root/tmp/vol.sock")
echo "nbdinfo from the host: $size bytes"
[ "$size" -gt 0 ]
in_root cryptblk close vol
[ ! -e "$root/tmp/vol.sock" ] || { echo "deb-check: socket left after close" >&2; exit 1; }
echo "deb-check: OK ($(( $(date +%s) - start )) s after the root was copied)"
