#!/bin/bash
# Guest script: a ublk export handed over to a successor process (Export::hand_over, what an
# upgrading daemon calls) keeps /dev/ublkbN, and fio (crc32c verify) and a flushing writer
# running across the hand-over finish without an error. The serving processes are the
# export crate's example `ublk_hand_over` (a linear table over /dev/ram0), which the
# caller stages in $LAB_SHARE/bin, until `cryptblk upgrade` drives the same call:
#
#   cargo build --workspace --example ublk_hand_over
#   mkdir -p /var/tmp/ho/bin && cp target/debug/examples/ublk_hand_over /var/tmp/ho/bin/
#   LAB_SHARE=/var/tmp/ho tests/lab/run.sh handover.sh
. "$LAB_OUT/lib.sh"
crypt_setup 1     # /dev/ram0, $W
H="env LD_LIBRARY_PATH=$S/lib $S/bin/ublk_hand_over"
[ -x "$S/bin/ublk_hand_over" ] || { fail "ublk_hand_over is not staged in \$LAB_SHARE/bin"; finish; }
TABLE="0 $((128 << 11)) linear /dev/ram0 0"
BATCH=262144; NB=96
head -c $((BATCH * NB)) /dev/urandom > $W/src

# serve N: starts a server reading its command from the fifo $W/ctlN (kept open on fd $CTLN)
# and waits for its device line in $W/outN (bounded).
serve() {
  mkfifo $W/ctl$1
  $H V "$TABLE" < $W/ctl$1 > $W/out$1 2>$W/err$1 &
  echo $! > $W/pid$1
  exec {fd}> $W/ctl$1; eval "CTL$1=$fd"
  for _ in $(seq 1 600); do [ -s $W/out$1 ] && break; kill -0 $(cat $W/pid$1) 2>/dev/null || break; sleep 0.1; done
}
serve 1; dev=$(head -1 $W/out1)
[ -b "$dev" ] || { fail "first server: no device ($(cat $W/err1))"; finish; }
log "first server on $dev"

fio --name=verify --filename="$dev" --allow_file_create=0 --offset=64M --size=32M --rw=randwrite --bs=16k \
  --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 >$W/fio.log 2>&1 {CTL1}>&- &
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
) {CTL1}>&- &
wpid=$!
for _ in $(seq 1 3000); do [ "$(cat $W/acked)" -ge 8 ] && break; sleep 0.1; done
kill -0 $fiopid 2>/dev/null && pass "fio still running at the hand-over" || fail "fio finished before the hand-over"

# The upgrade order: the old server hands over, the successor starts while the old one still
# runs (and serves), then the old one exits; the successor waits for that, then takes over.
echo hand-over >&$CTL1
pid1=$(cat $W/pid1)
for _ in $(seq 1 300); do grep -q 'handed over' $W/out1 && break; kill -0 $pid1 2>/dev/null || break; sleep 0.1; done
grep -q 'handed over' $W/out1 && pass "hand_over returned Ok" || fail "hand_over failed: $(cat $W/err1)"
mkfifo $W/ctl2
# (No child but the first server may hold its fifo, or it never sees the end of its input.)
$H V "$TABLE" < $W/ctl2 > $W/out2 2>$W/err2 {CTL1}>&- &
echo $! > $W/pid2
exec {CTL2}> $W/ctl2
# A negative property needs a window: for 5 s the successor must not serve (it waits for
# its live predecessor, up to 30 s) and the predecessor keeps running.
sleep 5
[ -s $W/out2 ] && fail "the successor started serving before its predecessor exited: $(cat $W/out2)"
kill -0 $pid1 2>/dev/null && pass "the successor waits while the first server still runs" \
  || fail "the first server exited early"
exec {CTL1}>&-
for _ in $(seq 1 300); do kill -0 $pid1 2>/dev/null || break; sleep 0.1; done
kill -0 $pid1 2>/dev/null && fail "first server still running 30 s after its input closed"
wait $pid1 && pass "the first server exited" || fail "the first server failed: $(cat $W/err1)"
[ -b "$dev" ] && pass "$dev stays after the hand-over" || fail "$dev vanished at the hand-over"
for _ in $(seq 1 600); do [ -s $W/out2 ] && break; kill -0 $(cat $W/pid2) 2>/dev/null || break; sleep 0.1; done
dev2=$(head -1 $W/out2)
[ "$dev2" = "$dev" ] && pass "the successor took $dev over" || fail "the successor serves '$dev2', not $dev ($(cat $W/err2))"

for _ in $(seq 1 3000); do kill -0 $wpid 2>/dev/null || kill -0 $fiopid 2>/dev/null || break; sleep 0.2; done
for p in $wpid $fiopid; do kill -0 $p 2>/dev/null && { fail "process $p still running 10 min after the take-over"; kill -9 $p; }; done
wait $fiopid; frc=$?
wait $wpid; wrc=$?
[ $wrc = 0 ] && [ ! -e $W/writer.failed ] && [ "$(cat $W/acked)" = $((NB - 1)) ] \
  && pass "the writer finished all $NB flushed batches without an error" \
  || fail "the writer failed ($(cat $W/writer.failed 2>/dev/null))"
if [ $frc = 0 ] && grep -q 'err= *0' $W/fio.log; then pass "fio: 0 errors, crc32c verification passed"
else fail "fio failed (exit $frc)"; cat $W/fio.log; fi
dd if=/dev/ram0 bs=$BATCH count=$NB 2>/dev/null | cmp -s - $W/src \
  && pass "all $NB batches on the backing device" || fail "batches lost or corrupt"

echo stop >&$CTL2
pid2=$(cat $W/pid2)
for _ in $(seq 1 300); do kill -0 $pid2 2>/dev/null || break; sleep 0.1; done
[ -e "$dev" ] && fail "$dev still exists after the successor stopped" || pass "stopping the successor deletes $dev"
finish
