#!/bin/bash
# AES-XTS per hand-written path and key size against `openssl speed -evp aes-{128,256}-xts
# -bytes 4096` in the same sitting (issue 26 item 1). For each CRYPTBLK_CPU_MASK (none: the
# AVX-512 path; avx512: VAES + AVX2; vaes: AES-NI with VEX; vaes,avx2: AES-NI with the legacy
# SSE encodings) the xts_paths example alternates cryptblk's rows with `openssl speed` round by
# round on one pinned CPU and prints medians of per-thread CPU time (openssl: user CPU time).
# The aes_roofline example first prints the CPU's AES ceiling per register width.
#
# usage: scripts/xts-speed.sh [ROUNDS (5)] [SECONDS_PER_FIGURE (0.5)]   (XTS_CPU=N pins to N)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-0.5}
cpu=${XTS_CPU:-1}
target=${CARGO_TARGET_DIR:-target}
CARGO_INCREMENTAL=0 cargo build --release --workspace --example xts_paths --example aes_roofline
echo "# $(grep -m1 'model name' /proc/cpuinfo | sed 's/\s*:\s*/: /')"
echo "# flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
  grep -xE 'aes|pclmulqdq|avx|avx2|vaes|vpclmulqdq|avx512f|avx512bw|avx512vl|sha_ni' | tr '\n' ' ')"
echo "# $(openssl version); load: $(cut -d' ' -f1-3 /proc/loadavg); pinned to CPU $cpu"
taskset -c "$cpu" "$target/release/examples/aes_roofline" "$rounds"
for mask in "" avx512 vaes vaes,avx2; do
  echo
  echo "## CRYPTBLK_CPU_MASK=$mask"
  CRYPTBLK_CPU_MASK=$mask taskset -c "$cpu" "$target/release/examples/xts_paths" "$rounds" "$secs"
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
