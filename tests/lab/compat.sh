#!/bin/bash
# Guest script: cryptblk (served over ublk) and the kernel's dm-crypt read each other's
# writes, byte for byte, on the same brd RAM disk.
#  - LUKS2 aes-xts-plain64 (512- and 4096-byte sectors) and LUKS1 aes-cbc-essiv:sha256:
#    A) cryptblk luksFormat; fio --verify=crc32c through /dev/ublkbN, re-verified by fio
#       through kernel dm-crypt; ext4 + files written through cryptblk, fsck'd and
#       sha256-compared through kernel dm-crypt;
#    B) cryptsetup luksFormat; ext4 + files written through kernel dm-crypt, fsck'd and
#       sha256-compared through cryptblk over ublk.
#  - Plain dm-crypt tables (dmsetup create vs cryptblk dm create with the same table):
#    aes-xts-plain64 512 and sector_size:4096, aes-cbc-essiv:sha256; data both ways.
. "$LAB_OUT/lib.sh"
crypt_setup 2     # /dev/ram0, /dev/ram1; $W, $W/key, $KDF
load_ext4
mkdir -p /mnt/x
FIO="--filename=DEV --size=16M --bs=4k --rw=randwrite --direct=1 --ioengine=libaio --iodepth=8 --verify=crc32c --verify_fatal=1 --randrepeat=1 --output-format=terse"

open_cb() {   # open_cb NAME [open args...] -> prints /dev/ublkbN
  local name=$1; shift
  cb_serve "$name" open -d $W/key "$@" /dev/ram0 "$name"
}
write_files() {  # write_files DEV: fresh ext4 with random files, sums to $W/sums
  mkfs.ext4 -q -F "$1" >/dev/null && mount "$1" /mnt/x || return 1
  mkdir -p /mnt/x/d
  for i in 1 2 3 5 8; do head -c $((i * 100000 + 17)) /dev/urandom > /mnt/x/f$i; done
  for i in $(seq 1 40); do echo "small file $i $RANDOM" > /mnt/x/d/s$i; done
  dd if=/dev/urandom of=/mnt/x/big bs=1M count=6 2>/dev/null
  tree_sums /mnt/x > $W/sums; umount /mnt/x
}
check_files() {  # check_files DEV WHAT: fsck clean and the same sums
  fsck.ext4 -fn "$1" >$W/fsck.log 2>&1 || { cat $W/fsck.log; fail "$2: fsck"; return 1; }
  mount -o ro "$1" /mnt/x || { fail "$2: mount"; return 1; }
  tree_sums /mnt/x > $W/sums2; umount /mnt/x
  if cmp -s $W/sums $W/sums2 && [ "$(wc -l < $W/sums)" -ge 46 ]; then pass "$2: $(wc -l < $W/sums) files identical, fsck clean"
  else diff $W/sums $W/sums2 | head; fail "$2: files differ"; fi
}

luks_case() {  # luks_case TYPE CIPHER KEYBITS SECTOR
  local type=$1 cipher=$2 bits=$3 sector=$4 tag="$1 $2 sector $4" dev
  local fmt="--type $type --cipher $cipher --key-size $bits $KDF"
  # LUKS2 names its sector size: without it both tools pick 4096 on brd (4 KiB physical blocks).
  [ "$type" = luks2 ] && fmt="$fmt --sector-size $sector"
  # A) cryptblk formats and writes, the kernel reads.
  dd if=/dev/zero of=/dev/ram0 bs=1M count=8 2>/dev/null
  must "$tag: cryptblk luksFormat" $CB luksFormat -q $fmt -d $W/key /dev/ram0 || return
  dev=$(open_cb A) || { fail "$tag: cryptblk open --ublk"; return; }
  [ "$(blockdev --getss "$dev")" = "$sector" ] && pass "$tag: ublk logical block size $sector" \
    || fail "$tag: ublk logical block size $(blockdev --getss "$dev") != $sector"
  if fio --name=w ${FIO//DEV/$dev} >$W/fio.log 2>&1; then pass "$tag: fio write+verify crc32c via cryptblk/ublk"
  else tail -5 $W/fio.log; fail "$tag: fio via ublk"; fi
  cb_stop A
  must "$tag: cryptsetup open (kernel)" cryptsetup open --key-file $W/key /dev/ram0 K || return
  if fio --name=w ${FIO//DEV//dev/mapper/K} --verify_only >$W/fio.log 2>&1; then pass "$tag: kernel dm-crypt verifies fio data written by cryptblk"
  else tail -5 $W/fio.log; fail "$tag: kernel fio verify_only"; fi
  cryptsetup close K
  dev=$(open_cb A) || { fail "$tag: cryptblk reopen"; return; }
  write_files "$dev" || fail "$tag: ext4 via cryptblk"
  cb_stop A
  cryptsetup open --key-file $W/key /dev/ram0 K && check_files /dev/mapper/K "$tag: cryptblk wrote, kernel read"
  cryptsetup close K
  # B) cryptsetup formats, the kernel writes, cryptblk reads.
  dd if=/dev/zero of=/dev/ram0 bs=1M count=8 2>/dev/null
  must "$tag: cryptsetup luksFormat" cryptsetup luksFormat -q $fmt --key-file $W/key /dev/ram0 || return
  cryptsetup open --key-file $W/key /dev/ram0 K || { fail "$tag: cryptsetup open"; return; }
  write_files /dev/mapper/K || fail "$tag: ext4 via kernel"
  # The status lines scripts read, as cryptsetup prints them for the kernel's mapping (the
  # device and key location lines name different things, and cryptblk's default inline pipeline
  # shows as flags the kernel default has not, so those are left out).
  local st='^  (type|cipher|keysize|sector size|offset|size|mode):'
  cryptsetup status K | grep -E "$st" > $W/st.cs
  cryptsetup close K
  dev=$(open_cb B) || { fail "$tag: cryptblk open of cryptsetup's volume"; return; }
  check_files "$dev" "$tag: kernel wrote, cryptblk/ublk read"
  $CB status B | grep -E "$st" > $W/st.cb
  if [ -s $W/st.cs ] && cmp -s $W/st.cs $W/st.cb; then pass "$tag: status lines as cryptsetup's ($(wc -l < $W/st.cs))"
  else diff $W/st.cs $W/st.cb; fail "$tag: status lines differ from cryptsetup's"; fi
  cb_stop B
}

plain_case() {  # plain_case CIPHER KEYBYTES [OPTS]: same dm table in both
  local cipher=$1 kb=$2 opts=${3:-} tag="dmsetup $1${3:+ $3}"
  local key; key=$(head -c "$kb" /dev/urandom | od -An -tx1 -v | tr -d ' \n')
  local S; S=$(blockdev --getsz /dev/ram1)
  local table="0 $S crypt $cipher $key 0 /dev/ram1 0${opts:+ $opts}"
  echo "$table" > $W/table
  head -c $((8 << 20)) /dev/urandom > $W/d1; head -c $((8 << 20)) /dev/urandom > $W/d2
  local dev
  dev=$(cb_serve P dm create P --table-file $W/table) || { fail "$tag: cryptblk dm create"; return; }
  dd if=$W/d1 of="$dev" bs=1M oflag=direct conv=fsync 2>/dev/null || fail "$tag: write via cryptblk"
  cb_stop P dm remove
  dmsetup create P --table "$table" || { fail "$tag: dmsetup create"; return; }
  if head -c $((8 << 20)) /dev/mapper/P | cmp -s - $W/d1; then pass "$tag: cryptblk wrote, kernel read"
  else fail "$tag: kernel reads other data than cryptblk wrote"; fi
  dd if=$W/d2 of=/dev/mapper/P bs=1M seek=8 oflag=direct conv=fsync 2>/dev/null || fail "$tag: write via kernel"
  dmsetup remove P
  dev=$(cb_serve P dm create P --table-file $W/table) || { fail "$tag: cryptblk dm create (2)"; return; }
  if dd if="$dev" bs=1M skip=8 count=8 iflag=direct 2>/dev/null | cmp -s - $W/d2; then pass "$tag: kernel wrote, cryptblk read"
  else fail "$tag: cryptblk reads other data than the kernel wrote"; fi
  cb_stop P dm remove
}

log "cryptblk $($CB --version) on $(uname -r)"
luks_case luks2 aes-xts-plain64 512 512
luks_case luks2 aes-xts-plain64 512 4096
luks_case luks1 aes-cbc-essiv:sha256 256 512
plain_case aes-xts-plain64 64
plain_case aes-xts-plain64 64 "1 sector_size:4096"
plain_case aes-cbc-essiv:sha256 32
if ls /dev/ublkb* >/dev/null 2>&1; then fail "ublk devices left after close: $(ls /dev/ublkb*)"
else pass "no ublk block devices left after close"; fi
finish
