#!/bin/bash
# cryptblk -> kernel round trip for the stored fixtures (about 1 minute, mostly the VM):
#  1. cryptblk writes pattern2 (128 KiB, in two writes, the second FUA) at offset 0 of each
#     kernel image through the kernel's own table lines (ignored test
#     aead_kernel::write_images_for_kernel) and closes the stack;
#     (it also stages pattern files, the key file, the d-* tables and lab-guest-dmsetup.sh);
#  2. the lab guest (lab-guest.sh) opens each ours-NAME.img with `cryptsetup open`, and
#     each ours-d-NAME.img with its recorded dmsetup tables, and compares pattern2 and the
#     kernel's pattern after it; verdicts are appended to results.txt.
# The same check runs as the test aead_kernel::lab_kernel_reads_what_cryptblk_wrote.
# usage: crates/dm/tests/aead_fixtures/roundtrip.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-aeadrt.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
(cd "${CRYPTBLK_WORKSPACE:-$ROOT}" && CRYPTBLK_FIXTURE_OUT=$WORK cargo test -q -p cryptblk-dm \
    --test aead_kernel -- --ignored write_images_for_kernel --exact)
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-900} "$LAB/run-in-vm.sh" "$HERE/lab-guest.sh" > "$WORK/lab.log" 2>&1 ||
    { cat "$WORK/lab.log"; exit 1; }
{
    echo "# cryptblk -> kernel ($(date -u +%Y-%m-%d), roundtrip.sh): cryptblk wrote pattern2 through"
    echo "# the kernel's tables, the kernel read it (cryptsetup open; d-*: the recorded dmsetup tables)"
    grep '^ours-' "$WORK/results.txt"
    cat "$WORK/results-dmsetup-check.txt"
} > "$WORK/rt.txt"
grep -v '^ours-\|^# cryptblk -> kernel\|^# the kernel' "$HERE/results.txt" > "$WORK/kernel.txt" || true
cat "$WORK/kernel.txt" "$WORK/rt.txt" > "$HERE/results.txt"
cat "$WORK/rt.txt"
! grep -q 'MISMATCH\|FAILED' "$WORK/rt.txt"
