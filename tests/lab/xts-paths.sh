#!/bin/bash
# Guest script: the kernel's dm-crypt reads what each hand-written AES-XTS path of cryptblk
# wrote, and each path reads what the kernel wrote (issue 26 item 2): every path `cryptblk
# ciphers` offers (vaes-avx512-xts, vaes-avx2-xts, aesni-xts; AWS-LC, the default for 512-bit
# keys, is covered by compat.sh), both key sizes (256-bit: AES-128-XTS, 512-bit: AES-256-XTS),
# 512- and 4096-byte sectors, 64 KiB each (under the lab's TCG, AES runs at about 50 MB/s):
#   A) `cryptblk encrypt --cipher-implementation PATH` makes a LUKS2 volume from random data;
#      the kernel (cryptsetup open) must read the same bytes back;
#   B) the kernel writes other random data into it; `cryptblk decrypt
#      --cipher-implementation PATH` must give those bytes.
# A path whose CPU features the guest CPU shows must be offered. Under TCG (-cpu max) the
# guest has AES-NI but no VAES, so only aesni-xts runs there; with KVM (-cpu host) on a VAES or
# AVX-512 CPU the others run too. The log names the paths expected.
. "$LAB_OUT/lib.sh"
crypt_setup 1     # /dev/ram0, $W, $W/key, $KDF
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
expect=()
has aes pclmulqdq && expect+=(aesni-xts)
has aes pclmulqdq avx2 vaes vpclmulqdq && expect+=(vaes-avx2-xts)
has aes pclmulqdq avx2 vaes vpclmulqdq avx512f avx512bw avx512vl && expect+=(vaes-avx512-xts)
log "guest CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); paths expected: ${expect[*]}"
$CB ciphers > $W/ciphers || fail "cryptblk ciphers"

# implementations of xts(aes) with KEYBITS-bit keys that are available here
impls_for() {
  awk -v want="xts(aes)" -v bits="$1" '
    /^name/ {n=$3} /^available/ {a=$3}
    /^algorithms/ { if (a == "yes" && (index($0, want " (" bits "-bit keys)") || index($0, want ",") || $0 ~ /xts\(aes\)$/)) print n }' $W/ciphers
}

for bits in 256 512; do
  got=$(impls_for $bits | grep -E -- '-xts$' | tr '\n' ' ')
  [ -n "$got" ] || fail "no hand-written AES-XTS path offered for $bits-bit keys"
  for e in "${expect[@]}"; do
    [[ " $got " == *" $e "* ]] || fail "$e: not offered for $bits-bit keys (offered: $got)"
  done
  for impl in $got; do
    for sector in 512 4096; do
      tag="$impl aes-xts-plain64 $bits-bit key, $sector-byte sectors"
      head -c $((64 << 10)) /dev/urandom > $W/p1; head -c $((64 << 10)) /dev/urandom > $W/p2
      rm -f $W/v
      must "$tag: cryptblk encrypt" $CB encrypt -q --type luks2 --cipher aes-xts-plain64 \
        --key-size $bits --sector-size $sector $KDF -d $W/key --cipher-implementation "$impl" \
        $W/p1 $W/v || continue
      dd if=$W/v of=/dev/ram0 bs=1M conv=fsync 2>/dev/null
      must "$tag: cryptsetup open (kernel)" cryptsetup open --key-file $W/key /dev/ram0 K || continue
      if head -c $((64 << 10)) /dev/mapper/K | cmp -s - $W/p1; then pass "$tag: cryptblk wrote, kernel read"
      else fail "$tag: the kernel reads other data than cryptblk wrote"; fi
      dd if=$W/p2 of=/dev/mapper/K bs=64k oflag=direct conv=fsync 2>/dev/null || fail "$tag: kernel write"
      cryptsetup close K
      rm -f $W/out $W/v2
      # The volume's own extent only (the RAM disk is larger): what the kernel wrote into it.
      head -c "$(stat -c %s $W/v)" /dev/ram0 > $W/v2
      must "$tag: cryptblk decrypt" $CB decrypt -q -d $W/key --cipher-implementation "$impl" \
        $W/v2 $W/out || continue
      if head -c $((64 << 10)) $W/out | cmp -s - $W/p2; then pass "$tag: kernel wrote, cryptblk read"
      else fail "$tag: cryptblk reads other data than the kernel wrote"; fi
    done
  done
done
finish
