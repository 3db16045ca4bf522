#!/bin/bash
# Regenerates the fixtures of crates/dm/tests/integrity_recalc.rs with the kernel lab
# (shared/lab; QEMU guest with dm-integrity and integritysetup):
#  1. cryptblk writes ours-*.img (ignored test write_images_for_kernel),
#  2. the guest (lab-recalc.sh) makes the kernel images (data device, kernel
#     recalculation, bitmap granularity) and opens cryptblk's images with the kernel,
#     recording verdicts in results.txt,
#  3. the kernel images are stored here xz-compressed.
# usage: crates/dm/tests/integrity_recalc_fixtures/make-recalc-fixtures.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-recalcfix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
(cd "${CRYPTBLK_WORKSPACE:-$ROOT}" && CRYPTBLK_FIXTURE_OUT=$WORK cargo test -p cryptblk-dm --test integrity_recalc \
    -- --ignored write_images_for_kernel --exact)
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/run-in-vm.sh" "$HERE/lab-recalc.sh"
for f in kdd-meta kdd-data kr-before-meta kr-after-meta kr-data kb; do
    xz -9 -T1 -c "$WORK/$f.img" > "$HERE/$f.img.xz"
done
cp "$WORK"/*.dump "$WORK/results.txt" "$HERE/"
cat "$HERE/results.txt"
