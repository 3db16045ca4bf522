#!/bin/sh
# Runs inside the kernel lab (shared/lab/run-in-vm.sh) with $LAB_OUT holding pattern.bin,
# pattern2.bin and pass.key. Makes LUKS2 images with authenticated encryption (dm-crypt over
# dm-integrity with tags from dm-crypt) using the real kernel and cryptsetup, writes
# pattern.bin through each, and records both dm table lines (with keys), luksDump and the
# volume key. When $LAB_OUT holds cryptblk-written images (ours-NAME.img, written through the
# recorded tables with pattern2.bin at offset 0), opens each with cryptsetup and compares
# (results.txt). Driven by make-fixtures.sh; not run by CI.
set -u
modprobe loop; modprobe dm-crypt; modprobe dm-integrity
modprobe authenc 2>/dev/null; modprobe gcm 2>/dev/null; modprobe chacha20poly1305 2>/dev/null
LOSETUP=/usr/sbin/losetup
W=/tmp/aeadfix; mkdir -p $W
cp "$LAB_OUT"/pattern.bin "$LAB_OUT"/pattern2.bin "$LAB_OUT"/pass.key $W/
for f in "$LAB_OUT"/ours-*.img; do case $f in */ours-d-*) ;; *) cp "$f" $W/ ;; esac; done 2>/dev/null
cd $W
: > results.txt
PLEN=$(stat -c %s pattern.bin)
P2SUM=$(sha256sum < pattern2.bin | cut -d' ' -f1)
FAST="--pbkdf pbkdf2 --pbkdf-force-iterations 1000 --luks2-metadata-size 16k --luks2-keyslots-size 1m"

# NAME SIZE_MIB WIPE(yes|no) LUKSFORMAT-OPTIONS...
kernel_image() {
    name=$1; size=$2; wipe=$3; shift 3
    truncate -s ${size}M "$name.img"
    nw=--integrity-no-wipe; [ "$wipe" = yes ] && nw=
    if ! cryptsetup luksFormat -q --type luks2 $FAST $nw --key-file pass.key "$@" "$name.img" \
            > "$name.format.log" 2>&1; then
        echo "$name luksFormat FAILED: $(cat $name.format.log)" >> results.txt; return
    fi
    dev=$($LOSETUP -f --show "$name.img")
    if ! cryptsetup open --disable-keyring --key-file pass.key "$dev" kaead; then
        echo "$name open FAILED" >> results.txt; $LOSETUP -d "$dev"; return
    fi
    {
        echo "# loop device: $dev $(cat /sys/block/$(basename $dev)/dev)"
        echo "# dmsetup table --showkeys (integrity layer first, then crypt):"
        dmsetup table --showkeys kaead_dif | sed 's/^/kaead_dif: /'
        dmsetup table --showkeys kaead | sed 's/^/kaead: /'
        echo "# dmsetup ls:"; dmsetup ls
        echo "# dmsetup status:"; dmsetup status
        echo "# blockdev --getsz kaead, kaead_dif: $(blockdev --getsz /dev/mapper/kaead) $(blockdev --getsz /dev/mapper/kaead_dif)"
    } > "$name.tables"
    dd if=pattern.bin of=/dev/mapper/kaead bs=64k oflag=direct conv=fsync 2>/dev/null ||
        echo "$name pattern write FAILED" >> results.txt
    # A second, small write further in (other tag area).
    dd if=pattern.bin of=/dev/mapper/kaead bs=4096 count=2 seek=256 oflag=direct conv=fsync 2>/dev/null
    rd=$(dd if=/dev/mapper/kaead bs=64k count=$((PLEN / 65536)) iflag=direct 2>/dev/null | cmp - pattern.bin && echo OK || echo MISMATCH)
    # An unwritten sector past the pattern: EILSEQ/EIO unless wiped.
    if dd if=/dev/mapper/kaead of=/dev/null bs=4096 count=1 skip=400 iflag=direct 2>/dev/null; then unw=readable; else unw=error; fi
    echo "$name kernel image made readback=$rd unwritten_read=$unw" >> results.txt
    cryptsetup close kaead
    $LOSETUP -d "$dev"
    cryptsetup luksDump "$name.img" > "$name.dump"
    cryptsetup luksDump -q --dump-volume-key --key-file pass.key "$name.img" > "$name.vk"
}

if ! ls ours-*.img >/dev/null 2>&1; then
kernel_image xts-plain64-hmac-sha256 4 no -c aes-xts-plain64 --integrity hmac-sha256 --sector-size 512
kernel_image xts-random-hmac-sha256 4 no -c aes-xts-random --integrity hmac-sha256 --sector-size 512
kernel_image gcm-random 4 no -c aes-gcm-random --integrity aead --sector-size 512
kernel_image chacha20-random-poly1305 4 no -c chacha20-random --integrity poly1305 --sector-size 512
kernel_image chacha20-plain64-poly1305 4 no -c chacha20-plain64 --integrity poly1305 --sector-size 512
kernel_image cbc-essiv-hmac-sha512 4 no -c aes-cbc-essiv:sha256 --integrity hmac-sha512 --sector-size 512
kernel_image gcm-random-4k 4 no -c aes-gcm-random --integrity aead --sector-size 4096
kernel_image xts-random-hmac-sha256-4k 4 no -c aes-xts-random --integrity hmac-sha256 --sector-size 4096
kernel_image gcm-random-wiped 4 yes -c aes-gcm-random --integrity aead --sector-size 512
fi

# cryptblk -> kernel: open each of our images and read pattern2 back.
for img in ours-*.img; do
    [ -e "$img" ] || continue
    dev=$($LOSETUP -f --show "$img")
    if cryptsetup open --key-file pass.key "$dev" oaead; then
        sum=$(dd if=/dev/mapper/oaead bs=64k count=$(($(stat -c %s pattern2.bin) / 65536)) iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
        [ "$sum" = "$P2SUM" ] && res=OK || res=MISMATCH
        # The kernel's own pattern after it must be untouched (tags of the neighbours).
        p2len=$(stat -c %s pattern2.bin)
        dd if=pattern.bin of=rest.bin bs=$p2len skip=1 count=1 2>/dev/null
        if dd if=/dev/mapper/oaead bs=$p2len skip=1 count=1 iflag=direct 2>/dev/null | cmp -s - rest.bin; then
            rest=OK
        else
            rest=MISMATCH
        fi
        echo "$img pattern2=$res kernel_pattern_after_it=$rest" >> results.txt
        cryptsetup close oaead
    else
        echo "$img open FAILED" >> results.txt
    fi
    $LOSETUP -d "$dev"
done
# The dmsetup-made stacks (d-*), checked by their own script when cryptblk wrote copies.
if ls "$LAB_OUT"/ours-d-*.img >/dev/null 2>&1 && [ -f "$LAB_OUT"/lab-guest-dmsetup.sh ]; then
    (sh "$LAB_OUT"/lab-guest-dmsetup.sh)
fi
cd $W
cp *.img *.dump *.vk *.tables *.format.log results.txt "$LAB_OUT"/ 2>/dev/null
cat results.txt
for f in *.tables; do echo "== $f"; cat "$f"; done
sync
