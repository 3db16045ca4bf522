#!/usr/bin/env bash
# Encryption over Ceph RBD, two ways on the same cluster, image and client machine, in one run:
#   cryptblk: `cryptblk open rbd:POOL/IMG` (cryptblk decrypts, librbd moves ciphertext),
#   librbd:   qemu-storage-daemon's rbd driver with `encrypt.format=luks2` (librbd's own LUKS2),
# both served over NBD on a Unix socket and driven by fio's nbd engine with the same jobs; the
# image is formatted once by `rbd encryption format ... luks2`, so both read the same header and
# ciphertext. A raw librbd export (no encryption) is the baseline. Prints one line per job and
# the cryptblk/librbd ratios.
#
# usage: CEPH_CONF=... scripts/bench-rbd.sh [POOL] [SECONDS per job]
#   (start a cluster first, e.g. ../shared/ceph/up.sh; needs fio, qemu-storage-daemon, rbd)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${CEPH_CONF:?set CEPH_CONF to the ceph.conf of the cluster}"
POOL=${1:-testpool}
SECS=${2:-10}
BIN=${CRYPTBLK:-target/debug/cryptblk}
[ -x "$BIN" ] || cargo build -q -p cryptblk
IMG=cryptblk-bench-$$
DIR=$(mktemp -d)
export CRYPTBLK_RUNTIME_DIR=$DIR/rt
mkdir -m 700 "$CRYPTBLK_RUNTIME_DIR"
QSD_PID=
cleanup() {
  "$BIN" close bench-rbd >/dev/null 2>&1 || true
  [ -n "$QSD_PID" ] && kill "$QSD_PID" 2>/dev/null && wait "$QSD_PID" 2>/dev/null
  rbd rm --no-progress "$POOL/$IMG" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

# 4 KiB blocks at queue depth 16 and 1 MiB blocks at queue depth 4, over 128 MiB of the image.
JOBS=(
  "randread-4k  --rw=randread  --bs=4k --iodepth=16"
  "randwrite-4k --rw=randwrite --bs=4k --iodepth=16"
  "read-1m      --rw=read      --bs=1m --iodepth=4"
  "write-1m     --rw=write     --bs=1m --iodepth=4"
)

printf 'bench pass' > "$DIR/pass"
rbd create --size 192M "$POOL/$IMG"
rbd encryption format "$POOL/$IMG" luks2 "$DIR/pass" >/dev/null

declare -A MIBS
run_jobs() { # run_jobs LABEL NBD-URI
  local label=$1 uri=$2 job name bw
  for job in "${JOBS[@]}"; do
    name=${job%% *}
    # shellcheck disable=SC2086
    fio --name="$name" --ioengine=nbd --uri="$uri" \
      ${job#* } --size=128m --time_based --runtime="$SECS" --ramp_time=1 \
      --output-format=json --output="$DIR/fio.json" >/dev/null
    bw=$(python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
print(round((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20, 1))' <"$DIR/fio.json")
    MIBS[$label,$name]=$bw
    printf '%-9s %-13s %8s MiB/s\n' "$label" "$name" "$bw"
  done
}

qsd() { # qsd SOCKET BLOCKDEV-OPTIONS: serve the image with qemu-storage-daemon until killed
  local sock=$1 opts=$2
  qemu-storage-daemon --nbd-server "addr.type=unix,addr.path=$sock" \
    --object "secret,id=s,file=$DIR/pass" \
    --blockdev "$opts,node-name=r" \
    --export type=nbd,id=e,node-name=r,writable=on &
  QSD_PID=$!
  for _ in $(seq 100); do [ -S "$sock" ] && return; sleep 0.1; done
  echo "qemu-storage-daemon did not start" >&2
  exit 1
}

# Every object the jobs touch holds data before the first job: a read of a never-written
# object costs the cluster nothing, which would favour whichever side runs first. The fill is
# raw (past the 16 MiB LUKS2 header), so the ciphertext is random data to both sides.
qsd "$DIR/f.sock" "driver=rbd,pool=$POOL,image=$IMG"
fio --name=fill --ioengine=nbd --uri="nbd+unix:///r?socket=$DIR/f.sock" --rw=write --bs=1m \
  --iodepth=4 --offset=16m --size=144m --output="$DIR/fill.json" >/dev/null
kill "$QSD_PID"; wait "$QSD_PID" 2>/dev/null || true; QSD_PID=

"$BIN" open --key-file "$DIR/pass" "rbd:$POOL/$IMG" bench-rbd --nbd "$DIR/c.sock"
run_jobs cryptblk "nbd+unix:///?socket=$DIR/c.sock"
"$BIN" close bench-rbd

qsd "$DIR/l.sock" "driver=rbd,pool=$POOL,image=$IMG,encrypt.format=luks2,encrypt.key-secret=s"
run_jobs librbd "nbd+unix:///r?socket=$DIR/l.sock"
kill "$QSD_PID"; wait "$QSD_PID" 2>/dev/null || true; QSD_PID=

qsd "$DIR/r.sock" "driver=rbd,pool=$POOL,image=$IMG"
run_jobs raw "nbd+unix:///r?socket=$DIR/r.sock"
kill "$QSD_PID"; wait "$QSD_PID" 2>/dev/null || true; QSD_PID=

echo
printf '%-13s %10s %10s\n' job cryptblk/librbd cryptblk/raw
for job in "${JOBS[@]}"; do
  name=${job%% *}
  python3 -c "import sys; c, l, r = map(float, sys.argv[2:]); print(f'{sys.argv[1]:<13} {c / l:10.2f} {c / r:10.2f}')" \
    "$name" "${MIBS[cryptblk,$name]}" "${MIBS[librbd,$name]}" "${MIBS[raw,$name]}"
done
