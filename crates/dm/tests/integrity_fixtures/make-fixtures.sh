#!/bin/bash
# Regenerates the kernel dm-integrity fixtures with the kernel lab (shared/lab, QEMU guest
# with dm-integrity; slow under TCG emulation, a few minutes):
#  1. cryptblk writes ours-*.img (ignored test write_images_for_kernel),
#  2. the guest (lab-guest.sh) formats k-*.img with integritysetup + kernel dm-integrity and
#     opens cryptblk's images with the kernel, recording verdicts in results.txt,
#  3. the kernel images are stored here xz-compressed for kernel_images_open_in_cryptblk.
# usage: crates/dm/tests/integrity_fixtures/make-fixtures.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-intfix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
(cd "${CRYPTBLK_WORKSPACE:-$ROOT}" && CRYPTBLK_FIXTURE_OUT=$WORK cargo test -p cryptblk-dm --test integrity_kernel \
    -- --ignored write_images_for_kernel --exact)
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/run-in-vm.sh" "$HERE/lab-guest.sh"
for f in "$WORK"/k-*.img; do xz -9 -T1 -c "$f" > "$HERE/$(basename "$f").xz"; done
cp "$WORK"/k-*.dump "$WORK/results.txt" "$HERE/"
cat "$HERE/results.txt"
