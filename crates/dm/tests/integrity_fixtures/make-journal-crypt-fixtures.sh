#!/bin/bash
# Regenerates the journal_crypt / journal_mac fixtures with the kernel lab (shared/lab, QEMU
# guest with dm-integrity; a few minutes under TCG emulation):
#  1. cryptblk writes ours-j*.img with encrypted / MACed journals, most with committed
#     journal entries never written home (ignored test write_images_for_kernel),
#  2. the guest (lab-journal-crypt.sh) makes j*-live.img with integritysetup + the kernel,
#     records the kernel's verdict on tampered copies and opens cryptblk's images with the
#     kernel (results-jc.txt),
#  3. the kernel images are stored here xz-compressed for integrity_journal_crypt.rs.
# usage: crates/dm/tests/integrity_fixtures/make-journal-crypt-fixtures.sh [LAB_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../../.." && pwd)
LAB=${1:-$ROOT/../shared/lab}
WORK=$(mktemp -d /tmp/cryptblk-jcfix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
(cd "${CRYPTBLK_WORKSPACE:-$ROOT}" && CRYPTBLK_FIXTURE_OUT=$WORK cargo test -p cryptblk-dm \
    --test integrity_journal_crypt -- --ignored write_images_for_kernel --exact)
LAB_SHARE=$WORK LAB_TIMEOUT=${LAB_TIMEOUT:-1800} "$LAB/run-in-vm.sh" "$HERE/lab-journal-crypt.sh"
for f in "$WORK"/j*-live.img; do xz -9 -T1 -c "$f" > "$HERE/$(basename "$f").xz"; done
for f in "$WORK"/j*.dump "$WORK"/j*.table; do cp "$f" "$HERE/"; done
cp "$WORK/results-jc.txt" "$HERE/"
cat "$HERE/results-jc.txt"
