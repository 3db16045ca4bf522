#!/bin/bash
# A/B of the NBD server's large requests in pieces (issue 15): one cryptblk binary serves the
# same crypt table over a RAM disk twice, A with pieces (the default) and B with
# CRYPTBLK_NBD_OVERLAP_MIN=0; fio's nbd engine runs the same job against A and B in
# alternating rounds (A B B A A B ...), and the median A/B ratio of read and write bandwidth
# is printed with the load average. On a shared machine the figures are noisy: read the
# ratios, never the absolutes.
#
#   scripts/nbd-overlap-ab.sh            # 1 MiB randrw QD1, 4096-byte sectors, 7 rounds
#   BS=64k ROUNDS=9 SS=512 scripts/nbd-overlap-ab.sh
set -euo pipefail

BIN=${CRYPTBLK:-target/release/cryptblk}
ROUNDS=${ROUNDS:-7}
RUNTIME=${RUNTIME:-3}
BS=${BS:-1m}
RW=${RW:-randrw}
QD=${QD:-1}
SS=${SS:-4096}
SIZE=$((256 << 20))

dir=$(mktemp -d /tmp/nbd-overlap-ab.XXXXXX)
chmod 700 "$dir"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

# A random key in a 0600 table file (never on a command line); removed with the directory.
key=$(head -c 64 /dev/urandom | od -An -v -tx1 | tr -d ' \n')
opts="2 no_read_workqueue no_write_workqueue"
[ "$SS" != 512 ] && opts="3 no_read_workqueue no_write_workqueue sector_size:$SS"
(umask 077; echo "0 $((SIZE / 512)) crypt aes-xts-plain64 $key 0 ram:$SIZE 0 $opts" >"$dir/t.tbl")
unset key

export CRYPTBLK_RUNTIME_DIR="$dir/run"
mkdir -p "$CRYPTBLK_RUNTIME_DIR"
"$BIN" dm create abA --table-file "$dir/t.tbl" --nbd "$dir/a.sock" --foreground &
pids+=($!)
CRYPTBLK_NBD_OVERLAP_MIN=0 "$BIN" dm create abB --table-file "$dir/t.tbl" --nbd "$dir/b.sock" --foreground &
pids+=($!)
for s in a b; do
    for _ in $(seq 100); do [ -S "$dir/$s.sock" ] && break; sleep 0.1; done
    [ -S "$dir/$s.sock" ] || { echo "server $s did not start" >&2; exit 1; }
done

# Fill both RAM disks once so reads decrypt real data.
for s in a b; do
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$dir/$s.sock" --rw=write \
        --bs=1m --size=$SIZE --output-format=terse >/dev/null
done

run() { # socket -> "read_kB/s write_kB/s"
    fio --name=ab --ioengine=nbd --uri="nbd+unix:///?socket=$dir/$1.sock" --rw="$RW" \
        --bs="$BS" --iodepth="$QD" --size=$SIZE --time_based=1 --runtime="${RUNTIME}s" \
        --randrepeat=0 --output-format=terse --terse-version=3 |
        awk -F';' '$1 == "3" {print $7, $48}' # fio's nbd engine prints a line of its own first
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
RA=() RB=() WA=() WB=()
for i in $(seq "$ROUNDS"); do
    if ((i % 2)); then order="a b"; else order="b a"; fi
    for s in $order; do
        read -r r w < <(run "$s")
        if [ "$s" = a ]; then ra=$r wa=$w; else rb=$r wb=$w; fi
    done
    RA+=("$ra") RB+=("$rb") WA+=("$wa") WB+=("$wb")
    printf 'round %d: A read %s kB/s write %s | B read %s write %s | A/B read %s write %s | load %s\n' \
        "$i" "$ra" "$wa" "$rb" "$wb" "$(awk -v a="$ra" -v b="$rb" 'BEGIN{printf "%.3f", a / b}')" \
        "$(awk -v a="$wa" -v b="$wb" 'BEGIN{printf "%.3f", (b > 0) ? a / b : 0}')" \
        "$(cut -d' ' -f1 /proc/loadavg)"
done
median_ratio() { # two space-separated lists -> median of pairwise ratios
    paste <(tr ' ' '\n' <<<"$1") <(tr ' ' '\n' <<<"$2") |
        awk '$2 > 0 {print $1 / $2}' | sort -g | awk '{v[NR]=$1} END {printf "%.3f", v[int((NR + 1) / 2)]}'
}
echo "A/B (pieces on / off), $RW bs=$BS QD$QD sector_size=$SS, medians of $ROUNDS rounds:" \
    "read $(median_ratio "${RA[*]}" "${RB[*]}")" \
    "write $(median_ratio "${WA[*]}" "${WB[*]}")" \
    "| load after: $(cut -d' ' -f1-3 /proc/loadavg) (NOISY on a shared machine)"
