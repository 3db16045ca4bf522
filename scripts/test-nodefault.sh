#!/usr/bin/env bash
# Tests the container build (`--no-default-features`: no rbd, no tpm2; README "Install"): the
# unit tests of the crates those features change (cryptblk-dm, cryptblk-volume, the cli's
# own) and crates/cli/tests/features.rs (`--version` names the features, `ldd` lists no
# librbd/libtss2, rbd: stores and TPM2 enrollment refused with one line, luksFormat +
# open --nbd + close with cryptsetup checking the result), then asserts `ldd` of the binary
# once more here. Extra arguments go to `cargo test`.
#
# The build goes to $CARGO_TARGET_DIR/nodefault (default target/nodefault), so the default
# build's binaries stay in place. That directory starts as hard links to the default build's
# artifacts (deps, build scripts, fingerprints): units whose features are the same keep their
# hash and are reused, only the crates the features change (and what depends on them) are
# compiled again. Cargo names each unit by a hash of its features, so a changed unit is a new
# file, and rustc replaces an output by renaming, so a linked artifact is never rewritten.
# Fingerprints and build-script outputs are written in place, though: they are copied, not
# linked, or a later default build would mark this directory's old artifacts fresh (seen: a
# reused target, cryptblk-dm built against a cipher rlib from before its change).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_INCREMENTAL=0
base=${CARGO_TARGET_DIR:-target}
dir=$base/nodefault
if [ ! -d "$dir/debug/deps" ] && [ -d "$base/debug/deps" ]; then
  mkdir -p "$dir/debug"
  cp -al "$base/debug/deps" "$dir/debug/"
  cp -a "$base/debug/build" "$base/debug/.fingerprint" "$dir/debug/"
fi
start=$(date +%s)
CARGO_TARGET_DIR=$dir cargo test --no-default-features \
  -p cryptblk-dm -p cryptblk-volume -p cryptblk --lib --bins --test features "$@"
bin=$dir/debug/cryptblk
"$bin" --version | grep -q -- '(-rbd -tpm2 -blkid)' || { echo "test-nodefault: $("$bin" --version)" >&2; exit 1; }
if ldd "$bin" | grep -E 'librbd|librados|libtss2'; then
  echo "test-nodefault: the --no-default-features binary links the libraries above" >&2
  exit 1
fi
echo "test-nodefault: OK in $(( $(date +%s) - start )) s"
