#!/bin/bash
# Regenerates the kernel dm-integrity images with the internal hashes crc32, xxhash64,
# blake2b-256, blake2s-256 and sha1 (h-<hash>.img.xz, .dump, hashes.txt) with the kernel lab
# (shared/lab; a few minutes under TCG). The guest (lab-hashes.sh) formats each image with
# integritysetup and writes the 256 KiB xorshift pattern of integrity_kernel.rs through the
# kernel mapping; integrity_hashes.rs then reads it back with cryptblk, tags verified.
# It also goes the other way: `cryptblk integrity format` makes ours-cli-<hash>.img, the pattern
# is written through `cryptblk integrity open --nbd` + nbdcopy, and the guest opens them with
# integritysetup and the kernel, reads the pattern and every tag (verdicts in hashes.txt).
# usage: crates/dm/tests/integrity_fixtures/make-hash-fixtures.sh [LAB_DIR]
# env: CRYPTBLK_BIN (default <workspace>/target/debug/cryptblk, built if missing)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-hashfix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# The pattern of integrity_kernel.rs: xorshift64 (13, 7, 17) from seed 0x5eed, little endian.
python3 - "$WORK/pattern.bin" <<'PY'
import struct, sys
x, out, M = 0x5eed, bytearray(), (1 << 64) - 1
while len(out) < 256 << 10:
    x ^= (x << 13) & M; x ^= x >> 7; x ^= (x << 17) & M
    out += struct.pack('<Q', x)
open(sys.argv[1], 'wb').write(out)
PY
BIN=${CRYPTBLK_BIN:-$ROOT/target/debug/cryptblk}
[ -x "$BIN" ] || (cd "$ROOT" && cargo build -q -p cryptblk)
export CRYPTBLK_RUNTIME_DIR=$WORK/rt
head -c 32 /dev/urandom > "$WORK/hmac.key"
# NAME|OPEN AND FORMAT OPTIONS[|FORMAT-ONLY OPTIONS]
for spec in "crc32|--integrity crc32" "xxhash64|--integrity xxhash64" \
    "blake2b-256|--integrity blake2b-256" "sha1|--integrity sha1" \
    "hmac-sha256|--integrity hmac-sha256 --integrity-key-file /KEY --integrity-key-size 32" \
    "crc32-4k|--integrity crc32|--sector-size 4096"; do
    name=${spec%%|*}; rest=${spec#*|}; opts=${rest%%|*}; fmt=
    [ "$rest" != "$opts" ] && fmt=${rest#*|}
    img=$WORK/ours-cli-$name.img
    truncate -s 4M "$img"
    # shellcheck disable=SC2086
    "$BIN" integrity format -q --journal-size 65536 $fmt ${opts//\/KEY/$WORK/hmac.key} "$img"
    # shellcheck disable=SC2086
    "$BIN" integrity open ${opts//\/KEY/$WORK/hmac.key} "$img" hashfix --nbd "$WORK/n.sock"
    nbdcopy "$WORK/pattern.bin" "nbd+unix:///?socket=$WORK/n.sock"
    "$BIN" integrity close hashfix
    echo "$opts" > "$WORK/ours-cli-$name.opts"
done
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/run-in-vm.sh" "$HERE/lab-hashes.sh"
for f in "$WORK"/h-*.img; do xz -9 -T1 -c "$f" > "$HERE/$(basename "$f").xz"; done
cp "$WORK"/h-*.dump "$WORK/hashes.txt" "$HERE/"
cat "$HERE/hashes.txt"
