#!/bin/bash
# Guest script: SIGKILL the cryptblk daemon serving a LUKS2 volume over ublk while fio (with
# crc32c verification) and a flushing writer have I/O in flight. The ublk device has user
# recovery: the disk stays and I/O waits; running the same `open` again takes the same
# /dev/ublkbN over, and both writers finish without one error: fio verifies every block
# it wrote, and every batch of the writer is intact (read through cryptblk and through
# kernel dm-crypt). A second kill, with no I/O, is survived the same way (the record
# that finds the device is rewritten by the process that took it over).
#
# The writer copies numbered 256 KiB batches of a random source file to the device, each
# with O_DIRECT and fsync (dd conv=fsync); a failed dd is recorded and fails the test.
. "$LAB_OUT/lib.sh"
crypt_setup 1     # /dev/ram0; $W, $W/key, $KDF
BATCH=262144; NB=96   # 24 MiB of batches below the fio region at 64 MiB
head -c $((BATCH * NB)) /dev/urandom > $W/src
$CB luksFormat -q --type luks2 --cipher aes-xts-plain64 --key-size 512 $KDF -d $W/key /dev/ram0 \
  || { fail "luksFormat"; finish; }
out=$($CB open -d $W/key /dev/ram0 C --ublk --json) || { fail "open --ublk"; finish; }
pid_of() { sed -n 's/.*"pid":\([0-9]*\).*/\1/p'; }
dev=$(echo "$out" | ublk_dev_of); pid=$(echo "$out" | pid_of)
log "serving on $dev, daemon pid $pid"

fio --name=verify --filename="$dev" --allow_file_create=0 --offset=64M --size=32M --rw=randwrite --bs=16k \
  --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 >$W/fio.log 2>&1 &
fiopid=$!
echo -1 > $W/acked
(
  exec 3<>"$dev" || { echo open > $W/writer.failed; exit 1; }
  i=0
  while [ $i -lt $NB ]; do
    dd if=$W/src of=/dev/fd/3 bs=$BATCH skip=$i seek=$i count=1 oflag=direct conv=fsync,notrunc 2>>$W/dd.err \
      || { echo "batch $i" > $W/writer.failed; exit 1; }
    echo $i > $W/acked.new && mv $W/acked.new $W/acked
    i=$((i + 1))
  done
) &
wpid=$!
# Kill once enough batches are acknowledged (not after a fixed time: on a fast host the
# writer could finish first, on a slow one acknowledge nothing), leaving most still to go.
KILL_AT=${KILL_AT:-8}
for _ in $(seq 1 3000); do [ "$(cat $W/acked)" -ge "$KILL_AT" ] && break; sleep 0.1; done
kill -0 $fiopid 2>/dev/null && pass "fio still running at the kill" || fail "fio finished before the kill"
kill -9 "$pid"
killed_at=$(cat $W/acked)
log "SIGKILL sent; last acknowledged batch when killed: $killed_at"
# The daemon is gone once its pid is (bounded wait); the device must stay and I/O wait.
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { fail "daemon $pid still alive 30 s after SIGKILL"; finish; }
[ -b "$dev" ] && pass "$dev stays after the daemon's SIGKILL" || fail "$dev vanished with its daemon"
[ -e $W/writer.failed ] && fail "the writer saw an error at the kill ($(cat $W/writer.failed))"
kill -0 $wpid 2>/dev/null && pass "the writer waits (no error) while no daemon serves" \
  || fail "the writer ended while no daemon served"

# Taking over: the same command as the first open.
out2=$($CB open -d $W/key /dev/ram0 C --ublk --json) || { fail "open again after SIGKILL"; finish; }
echo "$out2" > /tmp/cb-serve.C
dev2=$(echo "$out2" | ublk_dev_of); pid2=$(echo "$out2" | pid_of)
log "reopened on $dev2, daemon pid $pid2"
[ "$dev2" = "$dev" ] && pass "the new daemon took $dev over" || fail "the new daemon serves $dev2, not $dev"

# Both writers finish (bounded).
for _ in $(seq 1 3000); do kill -0 $wpid 2>/dev/null || kill -0 $fiopid 2>/dev/null || break; sleep 0.2; done
for p in $wpid $fiopid; do kill -0 $p 2>/dev/null && { fail "process $p still running 10 min after the take-over"; kill -9 $p; }; done
wait $fiopid; frc=$?
wait $wpid; wrc=$?
N=$(cat $W/acked)
log "writer: last acknowledged batch $N (exit $wrc); fio exit $frc: $(grep -o 'err= *[0-9]*' $W/fio.log | head -1)"
[ $wrc = 0 ] && [ ! -e $W/writer.failed ] && [ "$N" = $((NB - 1)) ] \
  && pass "the writer finished all $NB flushed batches without an error" \
  || { fail "the writer failed ($(cat $W/writer.failed 2>/dev/null), $(tail -2 $W/dd.err 2>/dev/null))"; }
if [ $frc = 0 ] && grep -q 'err= *0' $W/fio.log && ! grep -qi 'verify.*fail\|bad magic\|crc32c.*wanted' $W/fio.log; then
  pass "fio: 0 errors, crc32c verification passed"
else
  fail "fio failed (exit $frc)"; cat $W/fio.log
fi

# A second kill, without I/O: the taken-over device is found again.
kill -9 "$pid2"
for _ in $(seq 1 300); do kill -0 "$pid2" 2>/dev/null || break; sleep 0.1; done
out3=$($CB open -d $W/key /dev/ram0 C --ublk --json) || { fail "open again after the second SIGKILL"; finish; }
echo "$out3" > /tmp/cb-serve.C
dev3=$(echo "$out3" | ublk_dev_of)
[ "$dev3" = "$dev" ] && pass "a second SIGKILL is survived on $dev too" || fail "after a second kill: $dev3, not $dev"

verify() {  # verify DEV WHAT
  if dd if="$1" bs=$BATCH count=$NB iflag=direct 2>/dev/null | cmp -s - $W/src
  then pass "$2: all $NB batches intact"
  else fail "$2: data lost or corrupt"; fi
}
verify "$dev" "cryptblk after the take-overs"
# Closing still deletes the device (cb_stop checks the node is gone).
cb_stop C
cryptsetup open --key-file $W/key /dev/ram0 K && verify /dev/mapper/K "kernel dm-crypt" && cryptsetup close K
finish
