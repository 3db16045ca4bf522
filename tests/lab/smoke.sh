#!/bin/bash
# Smoke test: cryptblk runs in the guest and serves a zero table over ublk; the device is
# gone when `dm remove` returns.
. "$LAB_OUT/lib.sh"
modprobe ublk_drv || fail "modprobe ublk_drv"
$CB --version
dev=$(cb_serve z dm create z --table "0 2048 zero" --queues 2 --queue-depth 16) || fail "dm create --ublk"
cat /tmp/cb-serve.z
[ -b "$dev" ] && pass "ublk node $dev" || fail "no ublk node '$dev'"
[ "$(blockdev --getsize64 "$dev")" = 1048576 ] && pass "size 1 MiB" || fail "size $(blockdev --getsize64 "$dev")"
[ "$(head -c 1048576 "$dev" | tr -d "\\000" | wc -c)" = 0 ] && pass "reads zeros" || fail "zero table reads non-zero"
n=$(ls /sys/block/${dev#/dev/}/mq | wc -l); [ "$n" = 2 ] && pass "--queues 2: 2 hardware queues" || fail "--queues 2 gave $n queues"
d=$(cat /sys/block/${dev#/dev/}/mq/0/nr_tags 2>/dev/null); [ "$d" = 16 ] && pass "--queue-depth 16" || fail "queue depth $d"
cb_stop z dm remove && pass "removed"
# Defaults: one queue per CPU.
dev=$(cb_serve d dm create d --table "0 2048 zero") || fail "dm create --ublk (defaults)"
n=$(ls /sys/block/${dev#/dev/}/mq | wc -l); [ "$n" = "$(nproc)" ] && pass "default: one queue per CPU ($n)" || fail "default gave $n queues for $(nproc) CPUs"
cb_stop d dm remove
ls /dev/ublk* 2>&1
finish
