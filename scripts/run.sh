#!/usr/bin/env bash
# The main job on a built-in default, no external disk: a LUKS2 volume is made by cryptblk,
# checked by the real cryptsetup, served over NBD (no root needed), written and verified by
# fio, switched between the queued and inline pipelines under load, and (as root) served as
# a FUSE file that losetup + mkfs.ext4 + mount use. Then the benchmark's quick run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -q -p cryptblk
# Where cargo put it: ./target, or $CARGO_TARGET_DIR when set (CI shares one).
B=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/cryptblk

W=$(mktemp -d /tmp/cryptblk-run.XXXXXX)
export CRYPTBLK_RUNTIME_DIR=$W/run
cleanup() {
  mountpoint -q "$W/fs" 2>/dev/null && umount "$W/fs"
  [ -n "${LOOP:-}" ] && losetup -d "$LOOP" 2>/dev/null
  "$B" close demo 2>/dev/null || true
  "$B" close demo-fuse 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }

step "luksFormat a 256 MiB LUKS2 image with cryptblk (key from a file, never argv)"
head -c 32 /dev/urandom > "$W/key"
truncate -s 256M "$W/vol.img"
"$B" luksFormat --batch-mode --type luks2 --iter-time 200 --key-file "$W/key" "$W/vol.img"

step "cryptsetup reads the header cryptblk wrote and accepts the key"
cryptsetup luksDump "$W/vol.img" | sed -n '1,20p'
cryptsetup open --test-passphrase --key-file "$W/key" "$W/vol.img" && echo "cryptsetup: passphrase OK"

step "open: serve the volume over NBD on a Unix socket (inline pipeline by default)"
"$B" open --key-file "$W/key" "$W/vol.img" demo --nbd "$W/nbd.sock"
URI="nbd+unix:///?socket=$W/nbd.sock"
"$B" status demo
nbdinfo "$URI" | sed -n '1,6p'

step "fio over NBD with crc32c verification, flipping queued <-> inline while it runs"
(cd "$W" && fio --name=verify --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --size=64M \
    --iodepth=8 --verify=crc32c --verify_backlog=64 --verify_fatal=1 --loops=2 \
    --output-format=terse > "$W/fio.out") &
FIO=$!
flips=0
while kill -0 $FIO 2>/dev/null; do
  "$B" refresh demo --perf-queued; "$B" refresh demo; flips=$((flips + 2)); sleep 0.2
done
wait $FIO && echo "fio: verification passed across $flips live pipeline switches"
"$B" close demo

if [ "$(id -u)" -eq 0 ] && [ -e /dev/fuse ] && [ -e /dev/loop-control ]; then
  step "FUSE export: losetup + mkfs.ext4 + mount on the encrypted volume"
  mkdir -p "$W/mnt" "$W/fs"
  "$B" open --key-file "$W/key" "$W/vol.img" demo-fuse --fuse "$W/mnt"
  LOOP=$(losetup -f --show --direct-io=on "$W/mnt/disk")
  echo "the reference's fio command on $LOOP (10 s):"
  fio --name=crypt --filename="$LOOP" --readwrite=readwrite --bs=4k --direct=1 --size=64M \
      --runtime=10 --time_based --group_reporting | grep -E '^ *(READ|WRITE):'
  mkfs.ext4 -q "$LOOP"
  mount "$LOOP" "$W/fs"
  echo "written through cryptblk" > "$W/fs/hello.txt"
  df -h "$W/fs" | tail -1
  umount "$W/fs"; losetup -d "$LOOP"; LOOP=
  "$B" close demo-fuse
else
  step "FUSE + loop part skipped (needs root, /dev/fuse and /dev/loop-control)"
fi

if "$B" bench --help >/dev/null 2>&1; then
  step "cryptblk bench --quick (RAM disk; the full run is: cryptblk bench)"
  "$B" bench --quick --json-file "$W/bench.json"
fi
step "done"
