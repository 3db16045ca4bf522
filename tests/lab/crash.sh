#!/bin/bash
# Guest script: SIGKILL the cryptblk daemon serving a LUKS2 volume over ublk while fio (with
# crc32c verification) and a flushing writer have I/O in flight. The ublk device has user
# recovery: the disk stays and I/O waits; running the same `open` again takes the same
# /dev/ublkbN over, and both writers finish without one error: fio verifies every block
# it wrote, and every batch of the writer is intact (read through cryptblk and through
# kernel dm-crypt). A second kill, with no I/O, is survived the same way (the record
# that finds the device is rewritten by the process that took it over). Then `cryptblk
# upgrade` twice under the same load, and an upgrade whose successor dies (see below).
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

verify() {  # verify DEV WHAT [SRC SKIP]: NB batches of SRC at batch SKIP of DEV
  if dd if="$1" bs=$BATCH skip=${4:-0} count=$NB iflag=direct 2>/dev/null | cmp -s - ${3:-$W/src}
  then pass "$2: all $NB batches intact"
  else fail "$2: data lost or corrupt"; fi
}
verify "$dev" "cryptblk after the take-overs"

# `cryptblk upgrade` (issue 28): the daemon holds I/O, hands the key to its successor over
# a pipe and exits; the successor takes the same device over and answers. Twice, under a
# new fio region and a second flushing writer; then a successor that dies right after it
# took the stack (the device must wait for the same open, and upgrade say so).
head -c $((BATCH * NB)) /dev/urandom > $W/src2
SKIP2=128   # batch 128 = 32 MiB: between the first writer's 24 MiB and fio's 64 MiB
fio --name=verify2 --filename="$dev" --allow_file_create=0 --offset=96M --size=32M --rw=randwrite --bs=16k \
  --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 >$W/fio2.log 2>&1 &
fiopid=$!
echo -1 > $W/acked2
(
  exec 3<>"$dev" || { echo open > $W/writer2.failed; exit 1; }
  i=0
  while [ $i -lt $NB ]; do
    dd if=$W/src2 of=/dev/fd/3 bs=$BATCH skip=$i seek=$((SKIP2 + i)) count=1 oflag=direct conv=fsync,notrunc 2>>$W/dd2.err \
      || { echo "batch $i" > $W/writer2.failed; exit 1; }
    echo $i > $W/acked2.new && mv $W/acked2.new $W/acked2
    i=$((i + 1))
  done
) &
wpid=$!
pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' /tmp/cb-serve.C)
for round in 1 2; do
  at=$((round * 8))
  for _ in $(seq 1 3000); do [ "$(cat $W/acked2)" -ge "$at" ] && break; sleep 0.1; done
  kill -0 $fiopid 2>/dev/null && kill -0 $wpid 2>/dev/null && pass "upgrade $round: fio and the writer still running" \
    || fail "upgrade $round: fio or the writer finished before the upgrade"
  t0=$(cut -d' ' -f1 /proc/uptime)
  if $CB upgrade C 2>$W/upgrade$round.err; then
    pass "upgrade $round exited 0 after $(echo "$(cut -d' ' -f1 /proc/uptime) $t0" | awk '{printf "%.2f", $1 - $2}') s"
  else fail "upgrade $round exited $?: $(cat $W/upgrade$round.err)"; fi
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "upgrade $round: the old daemon $pid still runs" || pass "upgrade $round: the old daemon $pid exited"
  st=$($CB status --json C) || fail "upgrade $round: status after the upgrade"
  npid=$(echo "$st" | grep -o '"pid":[0-9]*' | head -1 | cut -d: -f2)
  ndev=$(echo "$st" | ublk_dev_of)
  [ -n "$npid" ] && [ "$npid" != "$pid" ] && kill -0 "$npid" 2>/dev/null && pass "upgrade $round: pid $npid serves C now" \
    || fail "upgrade $round: serving pid '$npid' (was $pid): $st"
  [ "$ndev" = "$dev" ] && pass "upgrade $round: still $dev" || fail "upgrade $round: serves '$ndev', not $dev"
  [ -e $W/writer2.failed ] && fail "upgrade $round: the writer saw an error ($(cat $W/writer2.failed))"
  pid=$npid
  sed -i "s/\"pid\":[0-9]*/\"pid\":$pid/" /tmp/cb-serve.C
done
# The upgrade's own log lines (no key in them: survive.rs checks that for NBD).
grep -h 'upgrad\|taking\|taken over\|holds the stack' /run/cryptblk/C.log | tail -8 | sed 's/^/  log: /'

# A successor that dies right after saying it takes over: the old daemon has exited, so
# nothing serves; the device stays, I/O waits, upgrade exits non-zero with one line naming
# the same open, and that open takes the device over.
cat > $W/dying-successor <<EOS
#!/bin/bash
mkfifo $W/succ.out
$S/cryptblk "\$@" <&0 >$W/succ.out &
child=\$!
exec 9<$W/succ.out
read -r line <&9
echo "\$line"
[ "\$line" = TAKING ] && kill -9 \$child
wait \$child
EOS
chmod +x $W/dying-successor
LD_LIBRARY_PATH=$S/lib $S/cryptblk upgrade C --binary $W/dying-successor 2>$W/upgrade3.err; rc=$?
log "failing upgrade: exit $rc: $(cat $W/upgrade3.err)"
[ $rc != 0 ] && [ "$(wc -l < $W/upgrade3.err)" = 1 ] && grep -q 'same open' $W/upgrade3.err \
  && pass "a successor dying after the take-over: upgrade exits $rc with one line naming the same open" \
  || fail "failing upgrade: exit $rc, '$(cat $W/upgrade3.err)'"
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
[ -b "$dev" ] && pass "$dev stays with no daemon" || fail "$dev vanished"
# (The second writer may be done by now: the upgrades are slow under TCG.) A flushed write
# of one more batch now must wait, not fail, and land once the same open serves again.
dd if=$W/src2 of="$dev" bs=$BATCH skip=0 seek=$((SKIP2 + NB)) count=1 oflag=direct conv=fsync,notrunc 2>$W/dd3.err &
ddpid=$!
kill -0 $ddpid 2>/dev/null && pass "a flushed write waits while nothing serves" \
  || { wait $ddpid; fail "a write while nothing served ended at once (exit $?: $(cat $W/dd3.err))"; }
out4=$($CB open -d $W/key /dev/ram0 C --ublk --json) || { fail "the same open after the failed upgrade"; finish; }
echo "$out4" > /tmp/cb-serve.C
[ "$(echo "$out4" | ublk_dev_of)" = "$dev" ] && pass "the same open took $dev over after the failed upgrade" \
  || fail "after the failed upgrade: $(echo "$out4" | ublk_dev_of), not $dev"

for _ in $(seq 1 3000); do kill -0 $wpid 2>/dev/null || kill -0 $fiopid 2>/dev/null || kill -0 $ddpid 2>/dev/null || break; sleep 0.2; done
for p in $wpid $fiopid $ddpid; do kill -0 $p 2>/dev/null && { fail "process $p still running 10 min after the upgrades"; kill -9 $p; }; done
wait $ddpid && dd if="$dev" bs=$BATCH skip=$((SKIP2 + NB)) count=1 iflag=direct 2>/dev/null | cmp -s - <(head -c $BATCH $W/src2) \
  && pass "the write held while nothing served landed after the same open" || fail "the held write failed or is not there ($(cat $W/dd3.err))"
wait $fiopid; frc=$?
wait $wpid; wrc=$?
log "writer 2: last acknowledged batch $(cat $W/acked2) (exit $wrc); fio 2 exit $frc: $(grep -o 'err= *[0-9]*' $W/fio2.log | head -1)"
[ $wrc = 0 ] && [ ! -e $W/writer2.failed ] && [ "$(cat $W/acked2)" = $((NB - 1)) ] \
  && pass "across the upgrades the writer finished all $NB flushed batches without an error" \
  || fail "the writer failed across the upgrades ($(cat $W/writer2.failed 2>/dev/null), $(tail -2 $W/dd2.err 2>/dev/null))"
if [ $frc = 0 ] && grep -q 'err= *0' $W/fio2.log && ! grep -qi 'verify.*fail\|bad magic\|crc32c.*wanted' $W/fio2.log; then
  pass "fio across the upgrades: 0 errors, crc32c verification passed"
else
  fail "fio across the upgrades failed (exit $frc)"; cat $W/fio2.log
fi
verify "$dev" "cryptblk after the upgrades" $W/src2 $SKIP2
# Closing still deletes the device (cb_stop checks the node is gone).
cb_stop C
cryptsetup open --key-file $W/key /dev/ram0 K && verify /dev/mapper/K "kernel dm-crypt" \
  && verify /dev/mapper/K "kernel dm-crypt, the upgrades' batches" $W/src2 $SKIP2 && cryptsetup close K
finish
