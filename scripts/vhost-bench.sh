#!/usr/bin/env bash
# vhost-user-blk benchmark in the kernel lab (../shared/lab): the same guest fio jobs on
# /dev/vda served by qemu-storage-daemon's vhost-user-blk export of a raw file (baseline),
# then by `cryptblk open --vhost-user` of a LUKS2 volume (aes-xts-plain64, 4096-byte
# sectors). Prints MB/s per job and cryptblk/qsd ratios at 4k and 1M.
#
#   scripts/vhost-bench.sh [RUNTIME_SECONDS=10] [QUEUES=1]
#
# The lab runs under TCG where /dev/kvm cannot boot a stock kernel: every guest instruction
# is emulated, so absolute figures are not a speed reference, only the ratio between the
# two backends in the same lab is. Set CRYPTBLK to a built binary (default: target/release,
# else target/debug; the dev profile is optimised).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-10}
QUEUES=${2:-1}
LAB=${LAB_DIR:-$(cd .. && pwd)/shared/lab}
B=${CRYPTBLK:-}
if [ -z "$B" ]; then
  if [ -x target/release/cryptblk ]; then B=$PWD/target/release/cryptblk; else
    cargo build -q -p cryptblk --bin cryptblk; B=$PWD/target/debug/cryptblk; fi
fi
command -v qemu-storage-daemon >/dev/null || { echo "qemu-storage-daemon is needed (scripts/install-deps.sh, or apt-get install qemu-system-common)"; exit 1; }

W=$(mktemp -d /var/tmp/cryptblk-vhost-bench.XXXXXX)
export CRYPTBLK_RUNTIME_DIR=$W/run
QSD=
cleanup() {
  [ -n "$QSD" ] && kill "$QSD" 2>/dev/null && wait "$QSD" 2>/dev/null
  "$B" close vbench 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

cat > "$W/guest.sh" <<'GUEST'
#!/bin/sh
# One fio job per line: sequential read and write at 4k and 1M, direct, iodepth 1.
modprobe virtio_pci; modprobe virtio_blk
for i in 1 2 3 4 5; do [ -b /dev/vda ] && break; sleep 1; done
RT=$1
for bs in 4k 1M; do
  for rw in read write; do
    line=$(fio --name=b --filename=/dev/vda --rw=$rw --bs=$bs --direct=1 --ioengine=psync \
      --size=128M --time_based --runtime="$RT" --minimal)
    if [ $rw = read ]; then kib=$(echo "$line" | cut -d';' -f7); else kib=$(echo "$line" | cut -d';' -f48); fi
    echo "RESULT $bs $rw $kib"
  done
done
GUEST
chmod +x "$W/guest.sh"

boot() { # socket -> RESULT lines
  LAB_SHARED_MEM=1 LAB_MEM=1G LAB_TIMEOUT=900 \
    LAB_QEMU_ARGS="-chardev socket,id=vu0,path=$1 -device vhost-user-blk-pci,chardev=vu0,num-queues=$QUEUES" \
    "$LAB/run-in-vm.sh" "$W/guest.sh" "$RUNTIME" | grep '^RESULT'
}

truncate -s 256M "$W/raw.img"
qemu-storage-daemon --blockdev "driver=file,filename=$W/raw.img,node-name=d,cache.direct=off" \
  --export "type=vhost-user-blk,id=e,node-name=d,addr.type=unix,addr.path=$W/qsd.sock,writable=on,num-queues=$QUEUES" &
QSD=$!
for _ in $(seq 50); do [ -S "$W/qsd.sock" ] && break; sleep 0.1; done
echo "== qemu-storage-daemon vhost-user-blk, raw file" >&2
boot "$W/qsd.sock" > "$W/qsd.txt"
kill "$QSD"; wait "$QSD" 2>/dev/null || true; QSD=

head -c 32 /dev/urandom > "$W/key"
truncate -s 272M "$W/luks.img"
"$B" luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
  --key-file "$W/key" "$W/luks.img"
"$B" open --key-file "$W/key" "$W/luks.img" vbench --vhost-user "$W/cb.sock" --queues "$QUEUES"
echo "== cryptblk vhost-user-blk, LUKS2 aes-xts-plain64" >&2
boot "$W/cb.sock" > "$W/cb.txt"
"$B" close vbench

echo
echo "vhost-user-blk in the lab VM (TCG: compare ratios only), fio psync QD1, ${RUNTIME}s, $QUEUES queue(s)"
printf '| %-4s | %-5s | %12s | %14s | %6s |\n' bs rw "qsd raw MB/s" "cryptblk MB/s" ratio
printf '|------|-------|--------------|----------------|--------|\n'
join -j1 <(awk '{print $2"-"$3, $4}' "$W/qsd.txt" | sort) <(awk '{print $2"-"$3, $4}' "$W/cb.txt" | sort) |
  awk '{split($1, k, "-"); q=$2/1024; c=$3/1024; printf "| %-4s | %-5s | %12.1f | %14.1f | %6.2f |\n", k[1], k[2], q, c, (q>0? c/q : 0)}'
