#!/usr/bin/env bash
# vhost-user-blk benchmark in the kernel lab (../shared/lab): `cryptblk bench --transport
# vhost-user` (crates/bench/src/lab.rs). The guest's fio jobs run on virtio disks served from
# the host by qemu-storage-daemon's vhost-user-blk export of a raw file (the baseline),
# `cryptblk open --vhost-user` of LUKS2 volumes (inline and --perf-queued) and a cryptblk
# linear table, beside the guest kernel's dm-crypt on a RAM disk; the bench prints its table
# and the ratios.
#
#   scripts/vhost-bench.sh [cryptblk bench options, e.g. --quick --runtime 10 --repeats 3]
#
# The lab runs under TCG where /dev/kvm cannot boot a stock kernel: every guest instruction
# is emulated, so absolute figures are not a speed reference, only the ratios between rows of
# the same run are. Set CRYPTBLK to a built binary (default: target/release, else
# target/debug; the dev profile is optimised).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${CRYPTBLK:-}
if [ -z "$B" ]; then
  if [ -x target/release/cryptblk ]; then B=$PWD/target/release/cryptblk; else
    cargo build -q -p cryptblk --bin cryptblk; B=$PWD/target/debug/cryptblk; fi
fi
command -v qemu-storage-daemon >/dev/null || { echo "qemu-storage-daemon is needed (scripts/install-deps.sh, or apt-get install qemu-system-common)"; exit 1; }
LAB_DIR=${LAB_DIR:-$(cd .. && pwd)/shared/lab} exec "$B" bench --transport vhost-user "$@"
