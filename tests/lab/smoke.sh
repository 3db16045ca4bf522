#!/bin/bash
# Smoke test: cryptblk runs in the guest and serves a zero table over ublk.
. "$LAB_OUT/lib.sh"
modprobe ublk_drv || fail "modprobe ublk_drv"
$CB --version
out=$($CB dm create z --table "0 2048 zero" --ublk --queues 2 --queue-depth 16 --json) || fail "dm create --ublk"
echo "$out"
dev=$(echo "$out" | ublk_dev_of)
[ -b "$dev" ] && pass "ublk node $dev" || fail "no ublk node '$dev'"
blockdev --getsize64 "$dev"
head -c 4096 "$dev" | od -An -tx1 | sort -u
$CB dm remove z && pass "remove" || fail "remove"
sleep 0.5; [ -e "$dev" ] && fail "$dev still present after remove" || pass "device deleted"
ls /dev/ublk* 2>&1
cat /run/cryptblk/z.log 2>/dev/null
finish
