#!/bin/bash
# Guest script: SIGKILL the cryptblk daemon serving a LUKS2 volume over ublk while fio and a
# flushing writer have I/O in flight; after reopening, every write acknowledged by a
# completed flush must be intact (checked through cryptblk and through kernel dm-crypt).
#
# The writer copies numbered 256 KiB batches of a random source file to the device, each
# with O_DIRECT and fsync (dd conv=fsync), and records a batch number only after its dd
# returned success: batches 0..N are acknowledged and flushed. fio meanwhile runs random
# writes with periodic fsync on a separate region, so requests are in flight at the kill.
. "$LAB_OUT/lib.sh"
crypt_setup 1     # /dev/ram0; $W, $W/key, $KDF
BATCH=262144; NB=240   # 60 MiB of batches below the fio region at 64 MiB
head -c $((BATCH * NB)) /dev/urandom > $W/src
$CB luksFormat -q --type luks2 --cipher aes-xts-plain64 --key-size 512 $KDF -d $W/key /dev/ram0 \
  || { fail "luksFormat"; finish; }
out=$($CB open -d $W/key /dev/ram0 C --ublk --json) || { fail "open --ublk"; finish; }
dev=$(echo "$out" | ublk_dev_of); pid=$(echo "$out" | sed -n 's/.*"pid":\([0-9]*\).*/\1/p')
log "serving on $dev, daemon pid $pid"

fio --name=bg --filename="$dev" --allow_file_create=0 --offset=64M --size=32M --rw=randwrite --bs=16k --direct=1 \
  --ioengine=libaio --iodepth=8 --fsync=4 --time_based --runtime=120 >$W/fio.log 2>&1 &
fiopid=$!
echo -1 > $W/acked
(
  # Write through a descriptor opened while the device exists: once the killed daemon's disk
  # is removed, a write by path would create a regular file in /dev and "succeed".
  exec 3<>"$dev" || exit 0
  i=0
  while [ $i -lt $NB ]; do
    dd if=$W/src of=/dev/fd/3 bs=$BATCH skip=$i seek=$i count=1 oflag=direct conv=fsync,notrunc 2>/dev/null || exit 0
    echo $i > $W/acked.new && mv $W/acked.new $W/acked
    i=$((i + 1))
  done
) &
wpid=$!
# Kill once enough batches are acknowledged (not after a fixed time: on a fast host the
# writer could finish first, on a slow one acknowledge nothing), leaving most still to go.
KILL_AT=${KILL_AT:-16}
for _ in $(seq 1 3000); do [ "$(cat $W/acked)" -ge "$KILL_AT" ] && break; sleep 0.1; done
kill -9 "$pid"
killed_at=$(cat $W/acked)
log "SIGKILL sent; last acknowledged batch when killed: $killed_at"
# Writers see errors once the kernel aborts the dead server's requests; wait (bounded).
for _ in $(seq 1 120); do kill -0 $wpid 2>/dev/null || kill -0 $fiopid 2>/dev/null || break; sleep 0.5; done
for p in $wpid $fiopid; do kill -0 $p 2>/dev/null && { fail "process $p still blocked 60 s after the kill"; kill -9 $p; }; done
wait 2>/dev/null
N=$(cat $W/acked)
log "writer stopped; last acknowledged batch: $N (fio: $(grep -o 'err=[^,]*' $W/fio.log | head -1))"
[ "$N" -ge 2 ] && pass "writer got $((N + 1)) flushed batches acknowledged before the kill" \
  || fail "only $((N + 1)) batches acknowledged: the test proves nothing"
[ "$N" -lt $((NB - 1)) ] && pass "the kill interrupted the writer" || fail "writer finished before the kill (raise NB or lower KILL_AT)"

verify() {  # verify DEV WHAT
  if dd if="$1" bs=$BATCH count=$((N + 1)) iflag=direct 2>/dev/null | cmp -s - <(head -c $((BATCH * (N + 1))) $W/src)
  then pass "$2: all $((N + 1)) acknowledged batches intact"
  else fail "$2: acknowledged data lost or corrupt"; fi
}
dev2=$(cb_serve C open -d $W/key /dev/ram0 C) || { fail "reopen after SIGKILL"; finish; }
log "reopened on $dev2"
verify "$dev2" "cryptblk reopen"
cb_stop C
cryptsetup open --key-file $W/key /dev/ram0 K && verify /dev/mapper/K "kernel dm-crypt" && cryptsetup close K
finish
