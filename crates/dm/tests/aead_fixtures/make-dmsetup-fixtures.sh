#!/bin/bash
# Regenerates the d-* fixtures: dm-crypt over dm-integrity stacks built by the kernel lab
# from plain dmsetup tables (lab-guest-dmsetup.sh) for options cryptsetup does not emit
# (iv_offset, truncated GCM tag, integrity:<n>:none, iv_large_sectors, hmac(sha1)).
# usage: crates/dm/tests/aead_fixtures/make-dmsetup-fixtures.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-aeaddm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
python3 -c "
import hashlib
open('$WORK/pattern.bin', 'wb').write(b''.join(hashlib.sha256(b'cryptblk-aead-pattern-%d' % i).digest() for i in range(8192)))
"
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-900} "$LAB/run-in-vm.sh" "$HERE/lab-guest-dmsetup.sh"
for t in "$WORK"/d-*.tables; do
    n=$(basename "$t" .tables)
    xz -9 -T1 -c "$WORK/$n.img" > "$HERE/$n.img.xz"
    cp "$t" "$HERE/"
done
cp "$WORK/results-dmsetup.txt" "$HERE/"
cat "$HERE/results-dmsetup.txt"
