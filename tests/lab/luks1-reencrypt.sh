#!/bin/bash
# Guest script: LUKS1 re-key between cryptsetup 2.6's legacy LUKS1 code (which needs
# device-mapper) and cryptblk. The host test (crates/cli/tests/reencrypt_luks1.rs, lab_*)
# prepares $LAB_OUT/luks1: the key file `key`, images with their expected plaintext sha256
# in IMG.sha, and directories holding an image with its reencryption files. Here:
#  A) a.img, re-keyed by cryptblk: `cryptsetup open` reads the plaintext back;
#  B) b/b.img: `cryptsetup reencrypt` re-keys it (the host then reads it with cryptblk);
#  C) c-int/c.img and c-kill/c.img: cryptsetup's re-key interrupted mid-way (SIGINT; and
#     SIGKILL with --write-log), left for cryptblk to finish on the host;
#  D) d-N/d.img: cryptblk killed at its Nth write on the host; cryptsetup resumes it, or
#     refuses it ("Wrong log format.", nothing changed) when a block was in flight.
# Results go back to $LAB_OUT/luks1-out (the images, files and `results`).
. "$LAB_OUT/lib.sh"
modprobe dm-crypt || { fail "modprobe dm-crypt"; exit 1; }
# cryptsetup attaches an autoclear loop device to an image file; it needs the module.
modprobe loop || { fail "modprobe loop"; exit 1; }
attach() { losetup -f --show "$1"; }
W=/tmp/luks1
rm -rf $W; cp -a "$S/luks1" $W; cd $W || exit 1
KEY=$W/key
CS="cryptsetup -q --key-file $KEY --pbkdf-force-iterations 1000"
: > $W/results
plain_sum() {   # plain_sum IMG: sha256 of the plaintext cryptsetup's dm-crypt reads
  local dev; dev=$(attach "$1") || return 1
  cryptsetup open --key-file $KEY "$dev" chk || { losetup -d "$dev"; return 1; }
  sha256sum < /dev/mapper/chk | cut -d' ' -f1
  cryptsetup close chk; losetup -d "$dev"
}
# cryptsetup reencrypt of DIR/IMG run in DIR, on the file itself: cryptsetup 2.6.1 finds
# a LUKS1 reencryption in progress only on a path whose stat size is at least a page (a
# regular file; a block device's is 0, and it then calls the device "not a valid LUKS
# device").
reenc() {       # reenc DIR IMG [ARGS...]
  local dir=$1 img=$2; shift 2
  (cd "$dir" && $CS reencrypt "$@" "$img")
}
same_plain() {  # same_plain WHAT IMG EXPECTED-SHA-FILE
  local got; got=$(plain_sum "$2")
  if [ "$got" = "$(cat "$3")" ]; then pass "$1: plaintext read by cryptsetup open"; else fail "$1: plaintext $got"; fi
}

# A
same_plain "A cryptblk re-keyed" a.img a.img.sha

# B
if reenc b b.img; then pass "B cryptsetup reencrypt"; else fail "B cryptsetup reencrypt"; fi
same_plain "B after cryptsetup" b/b.img b.img.sha

# C
for mode in int kill; do
  d=c-$mode; extra=; sig=INT
  [ $mode = kill ] && { extra=--write-log; sig=KILL; }
  (cd $d && exec $CS reencrypt --block-size 1 $extra c.img) &
  pid=$!
  for _ in $(seq 1 600); do ls /dev/mapper/LUKS-*.new >/dev/null 2>&1 && break; sleep 0.05; done
  sleep 1.5
  kill -$sig $pid; wait $pid; rc=$?
  sync
  for m in /dev/mapper/LUKS-*; do [ -e "$m" ] && dmsetup remove "$(basename "$m")"; done
  losetup -D; sync
  off=$(sed -n 's/^offset = //p' $d/LUKS-*.log 2>/dev/null)
  echo "C-$mode rc=$rc offset=$off" >> $W/results
  if [ -n "$off" ] && [ -e $d/LUKS-*.new ]; then pass "C $mode: cryptsetup stopped at offset $off (rc $rc)"
  else fail "C $mode: no run in progress left (rc $rc, offset '$off')"; fi
done

# D
for d in d-*; do
  [ -d "$d" ] || continue
  before=$(sha256sum < $d/d.img)
  if grep -q '^cryptblk-hotzone' $d/LUKS-*.log 2>/dev/null; then
    out=$(reenc $d d.img 2>&1); rc=$?
    if [ $rc -ne 0 ] && [ "$(sha256sum < $d/d.img)" = "$before" ] && echo "$out" | grep -q "Wrong log format"; then
      pass "$d: cryptsetup refuses a block in flight and changes nothing ($out)"
      echo "$d refused" >> $W/results
    else fail "$d: cryptsetup rc $rc on a block in flight: $out"; fi
  else
    if reenc $d d.img; then pass "$d: cryptsetup finished cryptblk's run"
    else fail "$d: cryptsetup could not finish cryptblk's run"; fi
    same_plain "$d after cryptsetup" $d/d.img d.img.sha
    echo "$d finished" >> $W/results
  fi
done

rm -rf "$S/luks1-out"; cp -a $W "$S/luks1-out"; sync
[ $FAILS = 0 ] && log "ALL PASSED" || log "$FAILS FAILED"
