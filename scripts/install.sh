#!/usr/bin/env bash
# Installs cryptblk as a system tool: the binary, its man pages (section 8, generated from the
# argument definitions by `cryptblk __generate-docs`), bash/zsh/fish completions, and, when the
# tree has them, the systemd units (dist/systemd/*), the generator (cryptblk-generator) and
# the udev rule that names served ublk devices /dev/cryptblk/NAME (dist/udev/rules.d/*).
#
#   scripts/install.sh [--prefix /usr/local] [--destdir DIR] [--binary PATH] [--generator PATH]
#
# Without --binary it builds the release binary first (`cargo build --release -p cryptblk`,
# CARGO_TARGET_DIR respected). --destdir stages the tree under DIR (for packaging or a test)
# as `make DESTDIR=... install` does. Prints each installed file.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/usr/local
destdir=
binary=
generator=
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --binary) binary=${2:?--binary needs a file}; shift 2 ;;
    --binary=*) binary=${1#*=}; shift ;;
    --generator) generator=${2:?--generator needs a file}; shift 2 ;;
    --generator=*) generator=${1#*=}; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 1 ;; esac

target_dir=${CARGO_TARGET_DIR:-target}
# The package that builds the systemd generator, if the tree has one.
generator_pkg=$(grep -l '"cryptblk-generator"' crates/*/Cargo.toml 2>/dev/null | head -1 || true)
if [ -z "$binary" ]; then
  cargo build --release -p cryptblk
  binary=$target_dir/release/cryptblk
  if [ -n "$generator_pkg" ] && [ -z "$generator" ]; then
    cargo build --release --manifest-path "$generator_pkg" --bin cryptblk-generator
    generator=$target_dir/release/cryptblk-generator
  fi
fi
[ -x "$binary" ] || { echo "install.sh: $binary is not an executable" >&2; exit 1; }
# A generator built beside the given binary is installed with it.
if [ -z "$generator" ] && [ -x "$(dirname "$binary")/cryptblk-generator" ]; then
  generator=$(dirname "$binary")/cryptblk-generator
fi

root=$destdir$prefix
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
"$binary" __generate-docs "$docs" >/dev/null

put() { # put <mode> <source> <destination file>
  install -D -m "$1" "$2" "$3"
  echo "$3"
}
put 755 "$binary" "$root/bin/cryptblk"
for page in "$docs"/man8/*.8; do
  put 644 "$page" "$root/share/man/man8/$(basename "$page")"
done
put 644 "$docs/completions/cryptblk.bash" "$root/share/bash-completion/completions/cryptblk"
put 644 "$docs/completions/_cryptblk" "$root/share/zsh/site-functions/_cryptblk"
put 644 "$docs/completions/cryptblk.fish" "$root/share/fish/vendor_completions.d/cryptblk.fish"

# systemd reads units and generators under /usr/lib and /usr/local/lib alike. Units may name
# the binary as @bindir@, set here to where it went.
if [ -d dist/systemd ]; then
  for unit in dist/systemd/*; do
    [ -f "$unit" ] || continue
    dest=$root/lib/systemd/system/$(basename "$unit")
    install -d "$(dirname "$dest")"
    sed "s|@bindir@|$prefix/bin|g" "$unit" >"$dest"
    chmod 644 "$dest"
    echo "$dest"
  done
fi
# The generator's units run PREFIX/bin/cryptblk: it looks for the binary installed beside it
# (PREFIX/lib/systemd/system-generators/../../../bin/cryptblk), so any --prefix agrees.
if [ -n "$generator" ]; then
  put 755 "$generator" "$root/lib/systemd/system-generators/cryptblk-generator"
fi
# udev reads rules under /usr/lib and /usr/local/lib alike (udevadm lists both).
if [ -d dist/udev/rules.d ]; then
  for rule in dist/udev/rules.d/*.rules; do
    [ -f "$rule" ] && put 644 "$rule" "$root/lib/udev/rules.d/$(basename "$rule")"
  done
fi
