#!/usr/bin/env bash
# The scale benchmark (issue 28): opens N LUKS2 volumes, each served over NBD by its own
# cryptblk daemon, and reports what the idle ones cost: the time to open them all, threads
# and private memory per daemon (median and max), total RSS and how much the machine's
# available memory dropped; then checks that one of them still serves a client and closes
# them all. A benchmark, not a test: it asserts nothing about speed.
#
#   scripts/scale-bench.sh [N]            (default 1000; as root)
#   CRYPTBLK=target/release/cryptblk PARALLEL=8 SCALE_DIR=/var/tmp/scale scripts/scale-bench.sh 1000
#
# "Private memory" is the daemon's Private_Dirty from /proc/PID/smaps_rollup: its anonymous
# memory (heap, stacks) plus the pages of the binary and its shared libraries that the
# dynamic loader relocated (those are copied per process). Private_Clean is not counted: it
# is file pages only this one process maps, which become shared as soon as a second daemon
# runs. Each volume uses a sparse copy of one small LUKS2 image (PBKDF2 with 1000
# iterations, so unlocking does not dominate) and a shared key file.
set -euo pipefail

N=${1:-1000}
PARALLEL=${PARALLEL:-8}
DIR=${SCALE_DIR:-/var/tmp/cryptblk-scale}
PREFIX=${SCALE_PREFIX:-scale}
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${CRYPTBLK:-}" ]; then
    if [ -x "$here/target/release/cryptblk" ]; then
        CRYPTBLK=$here/target/release/cryptblk
    else
        CRYPTBLK=$here/target/debug/cryptblk
    fi
fi
[ "$(id -u)" = 0 ] || { echo "scale-bench: run as root" >&2; exit 1; }
for t in cryptsetup qemu-io; do
    command -v "$t" >/dev/null || { echo "scale-bench: $t missing (scripts/install-deps.sh)" >&2; exit 1; }
done

# A thousand daemons, each with a few descriptors and threads: far below the system-wide
# limits, but the shell's own descriptor limit matters for xargs' children.
ulimit -n 65536 2>/dev/null || true

mkdir -p "$DIR"
# Its own runtime directory: the volumes, control sockets and logs of this run stay apart
# from a user's served volumes (and `cryptblk ls` lists only these).
export CRYPTBLK_RUNTIME_DIR=${CRYPTBLK_RUNTIME_DIR:-$DIR/run}
cleanup() {
    # Close whatever this run opened, also after a failure halfway.
    "$CRYPTBLK" ls 2>/dev/null | awk -v p="$PREFIX-" 'index($1, p) == 1 {print $1}' |
        xargs -r -P "$PARALLEL" -n 1 "$CRYPTBLK" close 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

head -c 32 /dev/urandom >"$DIR/key"
# Small headers and images: a thousand copies take about 300 MB of disk.
truncate -s 8M "$DIR/base.img"
cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --luks2-metadata-size 16k --luks2-keyslots-size 256k \
    --key-file "$DIR/key" "$DIR/base.img"
for i in $(seq 1 "$N"); do
    cp --sparse=always "$DIR/base.img" "$DIR/$i.img"
done

avail_kb() { awk '/^MemAvailable:/ {print $2}' /proc/meminfo; }
avail_before=$(avail_kb)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# CPU time in clock ticks: this shell's waited-for children (fields 16-17 of its stat,
# counted after the ")" of the command name) and a process's own (fields 14-15).
child_ticks() { sed 's/.*) //' "/proc/$$/stat" | awk '{print $14 + $15}'; }
own_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
hz=$(getconf CLK_TCK)
ticks_before=$(child_ticks)
start=$(date +%s.%N)
seq 1 "$N" | xargs -P "$PARALLEL" -I{} \
    "$CRYPTBLK" open --key-file "$DIR/key" "$DIR/{}.img" "$PREFIX-{}" --nbd "$DIR/{}.sock"
end=$(date +%s.%N)
open_s=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')

# The daemons of this run, by the PID column of `cryptblk ls`.
mapfile -t pids < <("$CRYPTBLK" ls | awk -v p="$PREFIX-" 'index($1, p) == 1 {print $5}')
[ "${#pids[@]}" = "$N" ] || { echo "scale-bench: ${#pids[@]} of $N volumes listed" >&2; exit 1; }

open_cpu=$(( $(child_ticks) - ticks_before ))

# Let the opens' transient threads and the machine settle: idle means idle.
sleep 2
avail_after=$(avail_kb)

stats() { # median and max of the numbers on stdin
    sort -n | awk '{v[NR] = $1} END {printf "median %s, max %s", v[int((NR + 1) / 2)], v[NR]}'
}
threads=$(for p in "${pids[@]}"; do ls "/proc/$p/task" | wc -l; done)
field() { # FIELD: that smaps_rollup field (kB) of every daemon
    for p in "${pids[@]}"; do awk -v f="$1:" '$1 == f {print $2}' "/proc/$p/smaps_rollup"; done
}
private=$(field Private_Dirty)
daemon_cpu=$(for p in "${pids[@]}"; do own_ticks "$p"; done | awk '{s += $1} END {print s}')
cpu_s=$(awk -v a="$open_cpu" -v b="$daemon_cpu" -v hz="$hz" 'BEGIN {printf "%.1f", (a + b) / hz}')
rss_total=$(field Rss | awk '{s += $1} END {print s}')
pss_total=$(field Pss | awk '{s += $1} END {print s}')

# One daemon's private memory by where it lies, to show what it is made of.
p=${pids[0]}
split=$(awk '/^[0-9a-f]+-[0-9a-f]+ / {w = ($6 == "") ? "anonymous" : (($6 ~ /^\[/) ? $6 : "relocated file pages")}
    $1 == "Private_Dirty:" {s[w] += $2} END {for (k in s) if (s[k]) printf "%s %s kB; ", k, s[k]}' "/proc/$p/smaps")

# Still served: a client reads through one of them (its workers start on demand).
qemu-io -f raw -c "read 0 64k" "nbd+unix:///?socket=$DIR/1.sock" >/dev/null

start=$(date +%s.%N)
"$CRYPTBLK" ls | awk -v p="$PREFIX-" 'index($1, p) == 1 {print $1}' |
    xargs -P "$PARALLEL" -n 1 "$CRYPTBLK" close
end=$(date +%s.%N)
close_s=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "cryptblk scale benchmark: $N LUKS2 volumes over NBD, one daemon each ($CRYPTBLK)"
echo "CPU: $cpu, $(nproc) CPUs; load before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "open all: ${open_s} s ($PARALLEL at a time); close all: ${close_s} s"
echo "CPU time the opens took: ${cpu_s} s (open commands $(awk -v t="$open_cpu" -v hz="$hz" 'BEGIN {printf "%.1f", t / hz}') s, daemons $(awk -v t="$daemon_cpu" -v hz="$hz" 'BEGIN {printf "%.1f", t / hz}') s), about $(awk -v c="$cpu_s" -v n="$(nproc)" 'BEGIN {printf "%.0f", c / n}') s of wall time on $(nproc) otherwise idle CPUs"
echo "threads per idle daemon: $(echo "$threads" | stats)"
echo "private memory per idle daemon (Private_Dirty, kB): $(echo "$private" | stats)"
echo "  one daemon's by place: $split"
echo "total RSS: $((rss_total / 1024)) MiB; total PSS: $((pss_total / 1024)) MiB; MemAvailable dropped by $(((avail_before - avail_after) / 1024)) MiB"
