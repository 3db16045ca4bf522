#!/usr/bin/env bash
# Offline reencryption throughput: cryptblk beside cryptsetup on the same RAM-backed image.
#
#   scripts/reencrypt-bench.sh [SIZE_MIB=1024] [RESILIENCE=checksum] [RUNS=1]
#
# One LUKS2 image (aes-xts-plain64, 512-byte sectors, pbkdf2 with forced iterations so the
# KDF costs nothing) is made in /dev/shm; each run copies it, then times
# `cryptsetup reencrypt --force-offline-reencrypt` and `cryptblk reencrypt` (a re-key, the
# same resilience mode and hotzone rules for both) on their own copy, and prints MiB/s
# and the ratio. Needs SIZE_MIB * 3 MiB free in /dev/shm. Set CRYPTBLK to a built binary
# (default: target/release, else target/debug). Never run as a timed test: the machine
# is shared and figures vary run to run.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-1024}
RES=${2:-checksum}
RUNS=${3:-1}
B=${CRYPTBLK:-}
if [ -z "$B" ]; then
  if [ -x target/release/cryptblk ]; then B=$PWD/target/release/cryptblk; else
    cargo build -q -p cryptblk --bin cryptblk; B=$PWD/target/debug/cryptblk; fi
fi
command -v cryptsetup >/dev/null || { echo "cryptsetup is needed"; exit 1; }
W=$(mktemp -d /dev/shm/cryptblk-reenc-bench.XXXXXX)
trap 'rm -rf "$W"' EXIT
printf 'bench-pass' >"$W/key"
FAST=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
truncate -s "${SIZE}M" "$W/base.img"
cryptsetup luksFormat -q --type luks2 --sector-size 512 "${FAST[@]}" --key-file "$W/key" "$W/base.img"
now() { date +%s.%N; }
rate() { awk -v s="$SIZE" -v t="$1" 'BEGIN { printf "%.1f", s / t }'; }
echo "size ${SIZE} MiB, resilience ${RES}, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
printf '%-4s %-12s %10s %10s\n' run tool seconds MiB/s
for r in $(seq 1 "$RUNS"); do
  cp "$W/base.img" "$W/cs.img"
  t0=$(now)
  cryptsetup reencrypt -q --force-offline-reencrypt --resilience "$RES" "${FAST[@]}" \
    --key-file "$W/key" "$W/cs.img"
  cs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  rm -f "$W/cs.img"
  cp "$W/base.img" "$W/cb.img"
  t0=$(now)
  "$B" reencrypt --resilience "$RES" "${FAST[@]}" --key-file "$W/key" "$W/cb.img"
  cb=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { print b - a }')
  cryptsetup open --test-passphrase --key-file "$W/key" "$W/cb.img"
  rm -f "$W/cb.img"
  printf '%-4s %-12s %10.2f %10s\n' "$r" cryptsetup "$cs" "$(rate "$cs")"
  printf '%-4s %-12s %10.2f %10s\n' "$r" cryptblk "$cb" "$(rate "$cb")"
  awk -v a="$cs" -v b="$cb" 'BEGIN { printf "     cryptblk/cryptsetup speed: %.2fx\n", a / b }'
done
