#!/bin/bash
# Guest script: the kernel's dm-crypt and cryptblk read each other's volumes for the ciphers
# cryptsetup 2.7/2.8 added (issue 25 item 2), 64 KiB of random data each, 512- and
# 4096-byte sectors:
#   A) `cryptblk encrypt` makes a LUKS2 volume (keyslot and data in that cipher) from random
#      data; the kernel (cryptsetup open: AF_ALG for the keyslot, dm-crypt for the data)
#      must read the same bytes back;
#   B) the kernel writes other random data into it; `cryptblk decrypt` must give those
#      bytes;
#   C) a plain dm-crypt mapping made by the kernel (cryptsetup open --type plain, key file)
#      is read by cryptblk's `open --type plain` over ublk.
# Adiantum (xchacha12/xchacha20) must work: the lab kernel has adiantum, nhpoly1305 and
# chacha as modules. HCTR2 and ARIA are tried too; a kernel without them (the lab's Debian
# 6.12 builds neither) is logged as NOT PROVEN, never as a pass.
. "$LAB_OUT/lib.sh"
crypt_setup 1     # /dev/ram0, $W, $W/key, $KDF

# kernel_has SPEC: the kernel can instantiate the cipher of SPEC (modules load on demand).
kernel_has() {
  local api=$1
  modprobe "crypto-$api" 2>/dev/null
  grep -q "^name *: $api\$" /proc/crypto && return 0
  # Instantiating a template registers it: cryptsetup's own benchmark asks the kernel.
  cryptsetup benchmark -c "$2" -s "$3" >/dev/null 2>&1 && return 0
  return 1
}

check_luks() {
  local spec=$1 bits=$2 sector=$3
  local tag="$spec $bits-bit key, $sector-byte sectors"
  head -c $((64 << 10)) /dev/urandom > $W/p1; head -c $((64 << 10)) /dev/urandom > $W/p2
  rm -f $W/v
  must "$tag: cryptblk encrypt" $CB encrypt -q --type luks2 --cipher "$spec" \
    --key-size $bits --sector-size $sector $KDF -d $W/key $W/p1 $W/v || return
  dd if=$W/v of=/dev/ram0 bs=1M conv=fsync 2>/dev/null
  must "$tag: cryptsetup open (kernel)" cryptsetup open --key-file $W/key /dev/ram0 K || return
  if head -c $((64 << 10)) /dev/mapper/K | cmp -s - $W/p1; then pass "$tag: cryptblk wrote, kernel read"
  else fail "$tag: the kernel reads other data than cryptblk wrote"; fi
  local table; table=$(dmsetup table K | awk '{print $4}')
  [ "$table" = "$spec" ] || [ "$table" = "capi:$4" ] || fail "$tag: kernel table cipher is $table"
  dd if=$W/p2 of=/dev/mapper/K bs=64k oflag=direct conv=fsync 2>/dev/null || fail "$tag: kernel write"
  cryptsetup close K
  rm -f $W/out $W/v2
  head -c "$(stat -c %s $W/v)" /dev/ram0 > $W/v2
  must "$tag: cryptblk decrypt" $CB decrypt -q -d $W/key $W/v2 $W/out || return
  if head -c $((64 << 10)) $W/out | cmp -s - $W/p2; then pass "$tag: kernel wrote, cryptblk read"
  else fail "$tag: cryptblk reads other data than the kernel wrote"; fi
}

check_plain() {
  local spec=$1 bits=$2
  local tag="plain $spec $bits-bit key"
  head -c $((bits / 8)) /dev/urandom > $W/pk
  head -c $((64 << 10)) /dev/urandom > $W/p3
  dd if=/dev/zero of=/dev/ram0 bs=1M count=1 conv=fsync 2>/dev/null
  must "$tag: cryptsetup open --type plain" cryptsetup open --type plain -c "$spec" -s $bits \
    --key-file $W/pk /dev/ram0 P || return
  dd if=$W/p3 of=/dev/mapper/P bs=64k oflag=direct conv=fsync 2>/dev/null || fail "$tag: kernel write"
  cryptsetup close P
  local dev; dev=$(cb_serve PL open --type plain -c "$spec" -s $bits --key-file $W/pk /dev/ram0 PL) \
    || { fail "$tag: cryptblk open --type plain"; return; }
  if head -c $((64 << 10)) "$dev" | cmp -s - $W/p3; then pass "$tag: kernel wrote, cryptblk read"
  else fail "$tag: cryptblk reads other plain data than the kernel wrote"; fi
  cb_stop PL
}

for variant in xchacha12 xchacha20; do
  spec="$variant,aes-adiantum-plain64"
  api="adiantum($variant,aes)"
  kernel_has "$api" "$spec" 256 || { fail "the lab kernel cannot run $api"; continue; }
  for sector in 512 4096; do check_luks "$spec" 256 $sector "$api-plain64"; done
  check_plain "$spec" 256
done

for c in "aes-hctr2-plain64 256 hctr2(aes)" "aria-xts-plain64 512 xts(aria)" "aria-cbc-essiv:sha256 256 cbc(aria)"; do
  set -- $c
  if kernel_has "$3" "$1" "$2"; then
    check_luks "$1" "$2" 512 "$3-${1##*-}"
  else
    log "NOT PROVEN $1: this kernel has no $3 ($(uname -r))"
  fi
done
finish
