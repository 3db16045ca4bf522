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

echo "----- systemctl status cryptblk@*"
SYSTEMD_COLORS=0 systemctl status --no-pager --lines=0 'cryptblk@*' 2>&1
echo "----- journal of the cryptblk units and their mounts"
journalctl -b --no-pager -o short-monotonic -u 'cryptblk@*' -u 'mnt-*.mount' -u tangd.socket -u 'tangd@*' 2>&1
echo "----- units that failed"
systemctl --failed --no-pager --plain 2>&1
echo "LAB_EXIT=$FAILS"
sync
systemctl --no-block start poweroff.target
