#!/bin/bash
# Regenerates the kernel LUKS2 authenticated-encryption fixtures with the kernel lab
# (shared/lab, QEMU guest with dm-crypt + dm-integrity; about 1.5 minutes under TCG):
# the guest (lab-guest.sh) formats NAME.img with cryptsetup, writes the pattern through the
# kernel and records tables, dumps and keys; here the unused tail of each keyslots area is
# zeroed (luksFormat fills it with random bytes) and the images are stored xz-compressed.
# usage: crates/dm/tests/aead_fixtures/make-fixtures.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-aeadfix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
python3 - "$WORK" <<'PY'
import hashlib, sys
w = sys.argv[1]
def pat(tag, n):
    return b''.join(hashlib.sha256(b'cryptblk-aead-%s-%d' % (tag, i)).digest() for i in range(n))
open(w + '/pattern.bin', 'wb').write(pat(b'pattern', 8192))
open(w + '/pattern2.bin', 'wb').write(pat(b'pattern2', 4096))
PY
printf 'cryptblk-aead-fixture' > "$WORK/pass.key"
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/run-in-vm.sh" "$HERE/lab-guest.sh"
for t in "$WORK"/*.tables; do
    n=$(basename "$t" .tables)
    len=$(grep -m1 'Area length' "$WORK/$n.dump" | grep -o '[0-9]*' | head -1)
    python3 - "$WORK/$n.img" $((32768 + len)) <<'PY'
import sys
with open(sys.argv[1], 'r+b') as f:
    start = int(sys.argv[2]); f.seek(start); f.write(b'\0' * (1081344 - start))
PY
    xz -9 -T1 -c "$WORK/$n.img" > "$HERE/$n.img.xz"
    cp "$t" "$WORK/$n.dump" "$HERE/"
    grep -A6 'MK dump' "$WORK/$n.vk" > "$HERE/$n.vk"
done
cp "$WORK/results.txt" "$HERE/"
cat "$HERE/results.txt"
