#!/bin/sh
# Kernel facts behind cryptblk's dm-integrity commit timer and read-only opens (see
# integrity_commit_timer.rs and src/targets/integrity/mod.rs). Runs in the kernel lab:
#   /work/shared/lab/run-in-vm.sh crates/dm/tests/integrity_timer_readonly_lab.sh
# Not run by CI. Output on 2026-11-21 (kernel 6.12.117+deb12-amd64, tcg):
#   commit_time=100 after 1s: new          (an unflushed O_DIRECT write was committed)
#   commit_time=60000 after 1s: old        (not yet: only the timer commits an idle journal)
#   State: ACTIVE (READ-ONLY)
#   ro-table read: new (replayed)
#   ro-table: backing CHANGED              (read-only table, writable device: replay WRITES)
#   ro-loop read: FAILED: Input/output error
#   ro-loop: backing unchanged             (read-only device: "Trying to write to read-only
#                                           block-device", "integrity: Error on copying from
#                                           journal: -5", the mapping fails)
set -u
modprobe loop; modprobe dm-integrity
L=/usr/sbin/losetup
W=/tmp/w; mkdir -p $W; cd $W
dd if=/dev/urandom of=pat bs=8192 count=1 2>/dev/null
PS=$(sha256sum < pat | cut -d' ' -f1)

readback() { # image -> "data=new|old" after a read-write kernel open (replays)
    d=$($L -f --show "$1")
    integritysetup open --integrity crc32c "$d" chk >/dev/null 2>&1 || { echo "open-failed"; $L -d $d; return; }
    s=$(dd if=/dev/mapper/chk bs=8192 count=1 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    integritysetup close chk; $L -d $d
    [ "$s" = "$PS" ] && echo new || echo old
}

# 1. commit_time: a direct write without flush; copy the backing after 1 s.
for ct in 100 60000; do
    truncate -s 16M ct.img
    d=$($L -f --show ct.img)
    integritysetup format -q --integrity crc32c --journal-size 1048576 $d
    integritysetup open --integrity crc32c --journal-commit-time $ct $d k
    dmsetup table k
    dd if=pat of=/dev/mapper/k bs=8192 oflag=direct 2>/dev/null
    sleep 1
    cp ct.img ct-copy.img
    echo "commit_time=$ct after 1s: $(readback ct-copy.img)"
    integritysetup close k; $L -d $d
done

# 2. read-only table over a journal that needs replay.
truncate -s 16M a.img
d=$($L -f --show a.img)
integritysetup format -q --integrity crc32c --journal-size 1048576 $d
integritysetup open --integrity crc32c $d k
dd if=pat of=/dev/mapper/k bs=8192 oflag=direct conv=fsync 2>/dev/null
sync; cp a.img live.img
integritysetup close k; $L -d $d
cp live.img live2.img
S0=$(sha256sum < live.img | cut -d' ' -f1)
# 2a. writable loop device, read-only table
d=$($L -f --show live.img)
N=$(integritysetup dump $d | sed -n "s/^provided_data_sectors //p")
if dmsetup create ro --readonly --table "0 $N integrity $d 0 4 J 1 internal_hash:crc32c"; then
    dmsetup table ro
    dmsetup info ro | grep -i state
    s=$(dd if=/dev/mapper/ro bs=8192 count=1 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
    [ "$s" = "$PS" ] && echo "ro-table read: new (replayed)" || echo "ro-table read: old"
    dmsetup remove ro
else
    echo "ro-table open FAILED"
fi
$L -d $d; sync
S1=$(sha256sum < live.img | cut -d' ' -f1)
[ "$S0" = "$S1" ] && echo "ro-table: backing unchanged" || echo "ro-table: backing CHANGED"
# 2b. read-only loop device, read-only table
d=$($L -f --show -r live2.img)
if dmsetup create ro2 --readonly --table "0 $N integrity $d 0 4 J 1 internal_hash:crc32c"; then
    if dd if=/dev/mapper/ro2 of=ro2.out bs=8192 count=1 iflag=direct 2>ro2.err; then
        s=$(sha256sum < ro2.out | cut -d' ' -f1)
        [ "$s" = "$PS" ] && echo "ro-loop read: new" || echo "ro-loop read: old (stale, not replayed)"
    else
        echo "ro-loop read: FAILED: $(cat ro2.err | head -1)"
    fi
    dmsetup status ro2
    dmsetup remove ro2
else
    echo "ro-loop open FAILED"
fi
$L -d $d; sync
S2=$(sha256sum < live2.img | cut -d' ' -f1)
[ "$S0" = "$S2" ] && echo "ro-loop: backing unchanged" || echo "ro-loop: backing CHANGED"
dmesg | grep -i "device-mapper\|read-only\|I/O error" | tail -20
