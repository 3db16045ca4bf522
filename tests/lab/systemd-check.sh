#!/bin/bash
# Guest side of tests/lab/systemd-boot.sh, run by cryptblk-lab-check.service once the boot
# is done (systemd as PID 1): every crypttab volume is served by its cryptblk@ unit, has its
# dev-cryptblk-NAME.device, is mounted from /dev/cryptblk/NAME through fstab and holds the
# marker written on the host before encryption. Prints the journal of the cryptblk units,
# then LAB_EXIT=<number of failed checks>, and powers the machine off.
set -u
FAILS=0
log()  { echo "[$(cut -d' ' -f1 /proc/uptime)s] $*"; }
pass() { log "PASS $*"; }
fail() { log "FAIL $*"; FAILS=$((FAILS + 1)); }

log "systemd $(systemctl --version | head -1 | cut -d' ' -f2), kernel $(uname -r), system state: $(systemctl is-system-running)"
for name in keyed tanged; do
  unit=cryptblk@$name.service
  state=$(systemctl show -P ActiveState "$unit"); sub=$(systemctl show -P SubState "$unit")
  [ "$state" = active ] && [ "$sub" = running ] && pass "$unit is $state ($sub)" || fail "$unit is $state ($sub)"
  [ "$(systemctl show -P Type "$unit")" = notify ] && pass "$unit is Type=notify" || fail "$unit is not Type=notify"
  dev=dev-cryptblk-$name.device
  [ "$(systemctl show -P ActiveState "$dev")" = active ] && pass "$dev active: $(systemctl show -P SysFSPath "$dev")" ||
    fail "$dev is $(systemctl show -P ActiveState "$dev")"
  link=$(readlink -f "/dev/cryptblk/$name")
  case "$link" in /dev/ublkb[0-9]*) pass "/dev/cryptblk/$name -> $link" ;; *) fail "/dev/cryptblk/$name -> '$link'" ;; esac
  # systemd-cryptsetup-generator reads the line too: its unit is cryptblk-generator's stand-in.
  frag=$(systemctl show -P FragmentPath "systemd-cryptsetup@$name.service")
  [ "$frag" = "/run/systemd/generator.early/systemd-cryptsetup@$name.service" ] &&
    pass "systemd-cryptsetup@$name.service is the stand-in ($frag)" || fail "systemd-cryptsetup@$name.service from '$frag'"
  [ ! -e "/dev/mapper/$name" ] && pass "no dm-crypt /dev/mapper/$name" || fail "/dev/mapper/$name exists (opened twice)"
  mnt=mnt-$name.mount
  [ "$(systemctl show -P ActiveState "$mnt")" = active ] && pass "$mnt active" || fail "$mnt is $(systemctl show -P ActiveState "$mnt")"
  src=$(findmnt -n -o SOURCE "/mnt/$name")
  [ "$(readlink -f "$src")" = "$link" ] && pass "/mnt/$name mounted from $src" || fail "/mnt/$name source '$src'"
  [ "$(cat "/mnt/$name/marker" 2>&1)" = "marker of $name" ] && pass "/mnt/$name/marker reads back" ||
    fail "/mnt/$name/marker: $(cat "/mnt/$name/marker" 2>&1)"
  mountpoint -q "/mnt/$name" && echo "written at boot" > "/mnt/$name/boot" && sync -f "/mnt/$name/boot" &&
    pass "write to /mnt/$name" || fail "write to /mnt/$name"
done
# The tang volume waited for the network; the key-file one did not.
systemctl show -P After cryptblk@tanged.service | grep -qw network-online.target &&
  pass "cryptblk@tanged.service is after network-online.target" || fail "tanged not after network-online.target"
systemctl show -P Requires cryptblk@tanged.service | grep -qw tangd.socket &&
  pass "cryptblk@tanged.service requires tangd.socket (x-systemd.requires=)" || fail "tanged does not require tangd.socket"
# The ordering systemd computed: fstab-generator puts the mount after the device's
# blockdev@ target, which the cryptblk unit is before; the device requires the unit.
for name in keyed tanged; do
  t=blockdev@dev-cryptblk-$name.target
  log "mnt-$name.mount After=$(systemctl show -P After mnt-$name.mount)"
  log "mnt-$name.mount BindsTo=$(systemctl show -P BindsTo mnt-$name.mount)"
  log "cryptblk@$name.service Before=$(systemctl show -P Before cryptblk@$name.service)"
  log "dev-cryptblk-$name.device Requires=$(systemctl show -P Requires dev-cryptblk-$name.device)"
  systemctl show -P After "mnt-$name.mount" | tr ' ' '\n' | grep -qx "$t" &&
    systemctl show -P Before "cryptblk@$name.service" | tr ' ' '\n' | grep -qx "$t" &&
    pass "cryptblk@$name.service before $t before mnt-$name.mount" || fail "no $t between cryptblk@$name.service and mnt-$name.mount"
  systemctl show -P Requires "dev-cryptblk-$name.device" | tr ' ' '\n' | grep -qx "cryptblk@$name.service" &&
    pass "dev-cryptblk-$name.device requires cryptblk@$name.service" || fail "dev-cryptblk-$name.device does not require its unit"
done

# Survive the daemon under systemd (issue 28 item 3): fio --verify=crc32c on a file of the
# ublk volume's mounted ext4 across a kill -9 of cryptblk@keyed's daemon (Restart= brings it
# back, and it takes the same /dev/ublkbN over) and across `cryptblk upgrade keyed` (the
# successor becomes the unit's main process; the unit is not restarted).
unit=cryptblk@keyed.service
dev=$(readlink -f /dev/cryptblk/keyed)
FIO="env LD_LIBRARY_PATH=/usr/local/lib/fio /usr/local/bin/fio"
main_pid() { systemctl show -P MainPID "$unit"; }
# wait_main OLD: until the unit is active with a main process other than OLD (bounded).
wait_main() {
  for _ in $(seq 1 1200); do
    p=$(main_pid)
    [ "$p" != 0 ] && [ "$p" != "$1" ] && [ "$(systemctl show -P ActiveState "$unit")" = active ] &&
      [ "$(systemctl show -P SubState "$unit")" = running ] && { echo "$p"; return 0; }
    sleep 0.1
  done
  return 1
}
pid0=$(main_pid); restarts0=$(systemctl show -P NRestarts "$unit")
$FIO --name=sd --filename=/mnt/keyed/fio.dat --size=16M --loops=3 --rw=randwrite --bs=16k --direct=1 \
  --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 > /tmp/fio-sd.log 2>&1 &
fiopid=$!
# Kill once fio has laid its file out and writes (not after a fixed time).
for _ in $(seq 1 1200); do [ "$(stat -c %s /mnt/keyed/fio.dat 2>/dev/null || echo 0)" -ge $((16 << 20)) ] && break; sleep 0.1; done
kill -0 $fiopid 2>/dev/null && pass "fio running on /mnt/keyed at the kill" || fail "fio ended before the kill: $(tail -3 /tmp/fio-sd.log)"
t0=$(date +%s%N)
kill -9 "$pid0"
if pid1=$(wait_main "$pid0"); then
  pass "kill -9 of $unit's daemon $pid0: systemd restarted it as $pid1 in $(( ($(date +%s%N) - t0) / 1000000 )) ms (NRestarts $restarts0 -> $(systemctl show -P NRestarts "$unit"))"
else fail "$unit not active again after kill -9 of $pid0: $(systemctl show -P ActiveState "$unit")"; pid1=0; fi
[ "$(readlink -f /dev/cryptblk/keyed)" = "$dev" ] && [ -b "$dev" ] && pass "still $dev after the kill" ||
  fail "after the kill /dev/cryptblk/keyed -> '$(readlink -f /dev/cryptblk/keyed)', was $dev"
kill -0 $fiopid 2>/dev/null && pass "fio running at the upgrade" || fail "fio ended before the upgrade: $(tail -3 /tmp/fio-sd.log)"
restarts1=$(systemctl show -P NRestarts "$unit")
t0=$(date +%s%N)
if out=$(cryptblk upgrade keyed 2>&1); then
  pass "cryptblk upgrade keyed exited 0 in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
else fail "cryptblk upgrade keyed: $out"; fi
if pid2=$(wait_main "$pid1"); then
  pass "after the upgrade $unit's main process is $pid2 (was $pid1)"
else fail "after the upgrade $unit: $(systemctl show -P ActiveState "$unit")/$(systemctl show -P SubState "$unit"), main $(main_pid)"; fi
[ "$(systemctl show -P NRestarts "$unit")" = "$restarts1" ] && pass "the upgrade did not restart $unit" ||
  fail "the upgrade restarted $unit (NRestarts $restarts1 -> $(systemctl show -P NRestarts "$unit"))"
st=$(cryptblk status --json keyed 2>&1)
echo "$st" | grep -q "\"pid\":$pid2[,}]" && echo "$st" | grep -q "\"dev\":\"$dev\"" &&
  pass "cryptblk status: pid $pid2 serves keyed on $dev" || fail "status after the upgrade: $st"
for _ in $(seq 1 6000); do kill -0 $fiopid 2>/dev/null || break; sleep 0.1; done
kill -0 $fiopid 2>/dev/null && { fail "fio still running 10 min after the upgrade"; kill -9 $fiopid; }
wait $fiopid; frc=$?
if [ $frc = 0 ] && grep -q 'err= *0' /tmp/fio-sd.log; then
  pass "fio across kill -9 + Restart= and upgrade: 0 errors, crc32c verified ($(grep -o 'write: IOPS=[^,]*' /tmp/fio-sd.log | head -1))"
else fail "fio (exit $frc):"; cat /tmp/fio-sd.log; fi
[ "$(systemctl show -P ActiveState mnt-keyed.mount)" = active ] && [ "$(cat /mnt/keyed/marker 2>&1)" = "marker of keyed" ] &&
  pass "mnt-keyed.mount still active, marker reads back" || fail "mnt-keyed.mount: $(systemctl show -P ActiveState mnt-keyed.mount)"

echo "----- systemctl status cryptblk@*"
SYSTEMD_COLORS=0 systemctl status --no-pager --lines=0 'cryptblk@*' 2>&1
echo "----- journal of the cryptblk units and their mounts"
journalctl -b --no-pager -o short-monotonic -u 'cryptblk@*' -u 'mnt-*.mount' -u tangd.socket -u 'tangd@*' 2>&1
echo "----- units that failed"
systemctl --failed --no-pager --plain 2>&1
echo "LAB_EXIT=$FAILS"
sync
systemctl --no-block start poweroff.target
