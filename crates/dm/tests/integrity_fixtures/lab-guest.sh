#!/bin/sh
# Runs inside the kernel lab (shared/lab/run-in-vm.sh) with $LAB_OUT holding pattern.bin and
# the cryptblk-made images ours-*.img. Makes dm-integrity images with the real kernel
# (k-*.img) and checks that the kernel opens cryptblk's images and reads pattern.bin back
# from them (results.txt). Driven by make-fixtures.sh; not run by CI.
set -u
modprobe loop; modprobe dm-integrity
# Loop devices over local tmpfs files (not the 9p share); util-linux losetup, not busybox's.
LOSETUP=/usr/sbin/losetup
W=/tmp/intfix; mkdir -p $W
cp "$LAB_OUT"/pattern.bin "$LAB_OUT"/hmac.key "$LAB_OUT"/ours-* $W/
cd $W
: > results.txt
PSUM=$(sha256sum < pattern.bin | cut -d' ' -f1)
PLEN=$(stat -c %s pattern.bin)

# Kernel -> cryptblk: format, write the pattern through the mapping, flush.
# NAME "FORMAT-ONLY-OPTIONS" INTEGRITYSETUP-OPTIONS...
kernel_image() {
    name=$1; fmt=$2; shift 2
    truncate -s 16M "$name.img"
    dev=$($LOSETUP -f --show "$name.img")
    integritysetup format -q $fmt "$@" "$dev" || { echo "$name format FAILED" >> results.txt; return; }
    integritysetup open "$@" "$dev" kint || { echo "$name open FAILED" >> results.txt; return; }
    dd if=pattern.bin of=/dev/mapper/kint bs=64k oflag=direct conv=fsync 2>/dev/null
    # Then the pattern's last 8 KiB over its first 8 KiB: too little to reach the journal
    # watermark, so after the flush it stays committed in the journal, not written home.
    dd if=pattern.bin bs=8192 skip=$((PLEN / 8192 - 1)) count=1 2>/dev/null |
        dd of=/dev/mapper/kint bs=8192 oflag=direct conv=fsync 2>/dev/null
    # A copy taken while the mapping is live: reading it needs a journal replay.
    sync; cp "$name.img" "$name-live.img"
    integritysetup close kint
    $LOSETUP -d "$dev"
    integritysetup dump "$name.img" > "$name.dump"
    echo "$name kernel image made" >> results.txt
}
kernel_image k-sha256 "--journal-size 1048576" --integrity sha256
kernel_image k-crc32c-4k "--sector-size 4096 --journal-size 2097152" --integrity crc32c
kernel_image k-legacy "--integrity-legacy-padding --integrity-legacy-hmac" --integrity sha1

# cryptblk -> kernel: open each of our images and read the pattern back.
for img in ours-*.img; do
    [ -e "$img" ] || continue
    opts=$(cat "${img%.img}.opts")
    dev=$($LOSETUP -f --show "$img")
    if integritysetup open $opts "$dev" oint; then
        sum=$(dd if=/dev/mapper/oint bs=64k count=$((PLEN / 65536)) 2>/dev/null | sha256sum | cut -d' ' -f1)
        # Reading everything checks every tag (a mismatch is an I/O error).
        if dd if=/dev/mapper/oint of=/dev/null bs=64k 2>/dev/null; then all=ok; else all=EIO; fi
        mism=$(dmsetup status oint | cut -d' ' -f4)
        [ "$sum" = "$PSUM" ] && res=OK || res=MISMATCH
        echo "$img pattern=$res full_read=$all mismatches=$mism" >> results.txt
        integritysetup close oint
    else
        echo "$img open FAILED" >> results.txt
    fi
    $LOSETUP -d "$dev"
done
cp k-*.img k-*.dump results.txt "$LAB_OUT"/
cat results.txt
sync
