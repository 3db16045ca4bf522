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
cb_stop z dm remove && pass "removed"
ls /dev/ublk* 2>&1
finish
