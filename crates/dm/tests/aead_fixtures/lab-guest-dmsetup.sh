#!/bin/sh
# Runs inside the kernel lab with $LAB_OUT holding pattern.bin. Builds dm-crypt over
# dm-integrity stacks with plain dmsetup tables (no LUKS) for table options cryptsetup does
# not emit: a non-zero iv_offset, a truncated GCM tag, integrity:<n>:none, iv_large_sectors.
# Each stack gets a zeroed 2 MiB file; the kernel's dm-integrity formats it on load (a
# one-sector table first, then the provided size from its status), dm-crypt writes
# pattern.bin at offset 0, both tables are recorded (d-NAME.tables) and the stack closed.
# When $LAB_OUT holds cryptblk-written copies (ours-d-NAME.img, pattern2.bin written at
# offset 0 through the recorded tables), it only loads the recorded tables over each copy
# and compares instead (results-dmsetup-check.txt); lab-guest.sh calls it that way.
# Made by make-dmsetup-fixtures.sh; the check runs in aead_kernel's lab test.
set -u
modprobe loop; modprobe dm-crypt; modprobe dm-integrity
for m in gcm chacha20poly1305 xts ccm aegis128 authenc; do modprobe $m 2>/dev/null; done
LOSETUP=/usr/sbin/losetup
W=/tmp/aeaddm; mkdir -p $W; cp "$LAB_OUT"/pattern.bin $W/; cd $W

if ls "$LAB_OUT"/ours-d-*.img >/dev/null 2>&1; then
    cp "$LAB_OUT"/pattern2.bin "$LAB_OUT"/d-*.tables $W/
    : > check.txt
    p2len=$(stat -c %s pattern2.bin)
    dd if=pattern.bin of=rest.bin bs=$p2len skip=1 count=1 2>/dev/null
    for img in "$LAB_OUT"/ours-d-*.img; do
        b=$(basename "$img" .img); n=${b#ours-}
        cp "$img" $W/; dev=$($LOSETUP -f --show "$W/$b.img")
        int=$(sed -n 's/^dint: //p' $n.tables | sed "s# 7:0 # $dev #")
        cry=$(sed -n 's/^dcrypt: //p' $n.tables | sed "s# 254:0 # /dev/mapper/dint #")
        if [ -n "$int" ] && [ -n "$cry" ] && dmsetup create dint --table "$int" &&
           dmsetup create dcrypt --table "$cry"; then
            dd if=/dev/mapper/dcrypt bs=$p2len count=1 iflag=direct 2>/dev/null | cmp -s - pattern2.bin && r=OK || r=MISMATCH
            dd if=/dev/mapper/dcrypt bs=$p2len skip=1 count=1 iflag=direct 2>/dev/null | cmp -s - rest.bin && k=OK || k=MISMATCH
            echo "$b pattern2=$r kernel_pattern_after_it=$k" >> check.txt
        else
            echo "$b tables FAILED" >> check.txt
        fi
        dmsetup remove dcrypt 2>/dev/null; dmsetup remove dint 2>/dev/null; $LOSETUP -d $dev
    done
    cp check.txt "$LAB_OUT"/results-dmsetup-check.txt
    cat check.txt
    sync
    exit 0
fi
: > results.txt
PLEN=$(stat -c %s pattern.bin)
K32=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
K64=${K32}202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f

# NAME TUPLE BLOCK_SIZE CIPHER KEY IV_OFFSET CRYPT_OPTS...
stack_make() {
    name=$1 tuple=$2 bs=$3 cipher=$4 key=$5 ivoff=$6; shift 6
    truncate -s 2M "d-$name.img"
    dev=$($LOSETUP -f --show "d-$name.img")
    iopts=0; [ "$bs" != 512 ] && iopts="1 block_size:$bs"
    # A journal large enough that a few journaled blocks stay below the watermark.
    [ -n "${LIVE:-}" ] && iopts="1 journal_sectors:1024"
    dmsetup create dint --table "0 8 integrity $dev 0 $tuple J $iopts" || { echo "$name integrity FAILED" >> results.txt; $LOSETUP -d $dev; return; }
    provided=$(dmsetup status dint | cut -d' ' -f5)
    dmsetup remove dint
    dmsetup create dint --table "0 $provided integrity $dev 0 $tuple J $iopts"
    copts="$#"; for o in "$@"; do copts="$copts $o"; done
    if ! dmsetup create dcrypt --table "0 $provided crypt $cipher $key $ivoff /dev/mapper/dint 0 $copts"; then
        echo "$name crypt FAILED" >> results.txt; dmsetup remove dint; $LOSETUP -d $dev; return
    fi
    {
        echo "# loop device: $dev $(cat /sys/block/$(basename $dev)/dev)"
        echo "# dmsetup table --showkeys (integrity layer first, then crypt):"
        dmsetup table --showkeys dint | sed 's/^/dint: /'
        dmsetup table --showkeys dcrypt | sed 's/^/dcrypt: /'
        echo "# dmsetup ls:"; dmsetup ls
    } > "d-$name.tables"
    dd if=pattern.bin of=/dev/mapper/dcrypt bs=64k oflag=direct conv=fsync 2>/dev/null || echo "$name write FAILED" >> results.txt
    if [ -n "${LIVE:-}" ]; then
        # Then the pattern's last 8 KiB over its first 8 KiB, flushed: too little for the
        # journal watermark, so it stays committed in the journal only. A copy of the file
        # taken now needs a journal replay (with dm-crypt's tags in the journal entries).
        # (512-byte writes: the kernel may write larger ones straight home.)
        dd if=pattern.bin bs=8192 skip=$((PLEN / 8192 - 1)) count=1 2>/dev/null > tail.bin
        # conv=fsync: the closing flush commits the journal section holding them.
        dd if=tail.bin of=/dev/mapper/dcrypt bs=512 oflag=direct conv=fsync 2>/dev/null
        sync; cp "d-$name.img" "d-$name-live.img"
        cp "d-$name.tables" "d-$name-live.tables"
    fi
    rd=$(dd if=/dev/mapper/dcrypt bs=64k count=$((PLEN / 65536)) iflag=direct 2>/dev/null | cmp - pattern.bin >/dev/null 2>&1 && echo OK || echo MISMATCH)
    echo "$name kernel stack made readback=$rd" >> results.txt
    dmsetup remove dcrypt; dmsetup remove dint; $LOSETUP -d $dev
}

# With arguments, only the named stacks are made (and the LUKS2 name probes when "probe").
ONLY="$*"
want() { [ -z "$ONLY" ] || case " $ONLY " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
stack() { want "$1" && stack_make "$@"; return 0; }

stack chacha-plain64-ivoffset 16 512 'capi:rfc7539(chacha20,poly1305)-plain64' $K32 100 integrity:16:aead
stack gcm-random-tag12 24 512 'capi:gcm(aes)-random' $K32 0 integrity:24:aead
stack xts-random-none 16 512 'capi:xts(aes)-random' $K64 0 integrity:16:none
stack chacha-plain64-4k-large 16 4096 'capi:rfc7539(chacha20,poly1305)-plain64' $K32 64 integrity:16:aead sector_size:4096 iv_large_sectors
stack hmac-sha1-xts-plain64-ivoffset 20 512 'capi:authenc(hmac(sha1),xts(aes))-plain64' ${K64}${K32%????????????????????????} 8 integrity:20:aead
K33=${K32}20
stack hmac-sha256-xts-plain64-keysize33 32 512 'capi:authenc(hmac(sha256),xts(aes))-plain64' ${K64}${K33} 0 integrity:32:aead integrity_key_size:33
stack ccm-random 24 512 'capi:rfc4309(ccm(aes))-random' ${K32%????????????????????????????????}202122 0 integrity:24:aead
stack gcm-rfc4106-random 24 512 'capi:rfc4106(gcm(aes))-random' ${K32}a0a1a2a3 0 integrity:24:aead
stack aegis128-random 32 512 'capi:aegis128-random' ${K32%????????????????????????????????} 0 integrity:32:aead

want gcm-random-live && { LIVE=1 stack_make gcm-random-journal 28 512 'capi:gcm(aes)-random' $K32 0 integrity:28:aead; rm -f d-gcm-random-journal.img d-gcm-random-journal.tables; }

# Which kernel names cryptsetup uses for the LUKS2 AEAD ciphers not in lab-guest.sh.
if want probe; then
    printf 'p' > pk
    for c in "aes-ccm-random aead 152" "aegis128-random aead 128" "aes-xts-plain64 hmac-sha256 512"; do
        set -- $c
        truncate -s 4M probe.img; rm -f probe.img; truncate -s 4M probe.img
        ks=""; [ "$1" = aes-xts-plain64 ] && ks="--integrity-key-size 33"
        if cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
                --luks2-metadata-size 16k --luks2-keyslots-size 1m --integrity-no-wipe --sector-size 512 \
                --key-file pk -c $1 --integrity $2 -s $3 $ks probe.img > probe.log 2>&1 &&
           cryptsetup open --disable-keyring --key-file pk probe.img kprobe >> probe.log 2>&1; then
            echo "## $c $ks" >> d-luks-probe.txt; dmsetup table --showkeys >> d-luks-probe.txt
            cryptsetup close kprobe
        else
            echo "## $c $ks FAILED: $(cat probe.log)" >> d-luks-probe.txt
        fi
    done
fi
cp d-*.img d-*.tables d-luks-probe.txt "$LAB_OUT"/ 2>/dev/null
cp results.txt "$LAB_OUT"/results-dmsetup.txt
cat results.txt
for f in d-*.tables; do echo "== $f"; cat "$f"; done
sync
