#!/bin/sh
# Runs inside the kernel lab (shared/lab/run-in-vm.sh) with $LAB_OUT holding pattern.bin,
# the journal keys jcrypt.key / jmac.key and the cryptblk-made images ours-j*.img (+ .opts).
#  1. Makes dm-integrity images with an encrypted and/or MACed journal with the real kernel
#     (integritysetup --journal-crypt / --journal-integrity), copying each while the mapping
#     is live so that its last writes are still only in the journal (j*-live.img);
#  2. tampers with the journal MAC'd live images (bit 0 of every section's first entry's
#     sector field) and records what the kernel does with them;
#  3. opens cryptblk's images with the kernel and reads the pattern back.
# Verdicts go to results-jc.txt. Driven by make-journal-crypt-fixtures.sh; not run by CI.
set -u
modprobe loop; modprobe dm-integrity
LOSETUP=/usr/sbin/losetup
W=/tmp/jcfix; mkdir -p $W
cp "$LAB_OUT"/pattern.bin "$LAB_OUT"/jcrypt.key "$LAB_OUT"/jmac.key $W/
cp "$LAB_OUT"/ours-* $W/ 2>/dev/null
cd $W
: > results-jc.txt
PSUM=$(sha256sum < pattern.bin | cut -d' ' -f1)
PLEN=$(stat -c %s pattern.bin)
CKEY="--journal-crypt-key-file jcrypt.key --journal-crypt-key-size 32"
MAC="--journal-integrity hmac-sha256 --journal-integrity-key-file jmac.key --journal-integrity-key-size 32"

# NAME OPTIONS...: format (256 KiB journal, crc32c), write the pattern, then the pattern's
# last 8 KiB over its first 8 KiB (both committed by their fsync, too little to reach the
# journal watermark, so they stay in the journal), copy the image while mapped, close.
kernel_image() {
    name=$1; shift
    truncate -s 4M "$name.img"
    dev=$($LOSETUP -f --show "$name.img")
    if ! integritysetup format -q --journal-size 262144 "$@" "$dev"; then
        echo "$name format FAILED" >> results-jc.txt; $LOSETUP -d "$dev"; return
    fi
    # A high watermark: the kernel closes a section at every commit, and with the default
    # 50 % the second fsync's commit would start writing the journal home.
    if ! integritysetup open --journal-watermark 90 "$@" "$dev" kint; then
        echo "$name open FAILED" >> results-jc.txt; $LOSETUP -d "$dev"; return
    fi
    # The table as the kernel holds it (keys masked): the algorithm names integritysetup
    # passed.
    dmsetup table kint | sed 's/:[0-9a-f]\{16,\}/:KEY/g' > "$name.table"
    dd if=pattern.bin of=/dev/mapper/kint bs=64k oflag=direct conv=fsync 2>/dev/null
    dd if=pattern.bin bs=8192 skip=$((PLEN / 8192 - 1)) count=1 2>/dev/null |
        dd of=/dev/mapper/kint bs=8192 oflag=direct conv=fsync 2>/dev/null
    sync; cp "$name.img" "$name-live.img"
    integritysetup close kint
    $LOSETUP -d "$dev"
    integritysetup dump "$name.img" > "$name.dump"
    echo "$name kernel image made: $(cat "$name.table")" >> results-jc.txt
}
kernel_image jc-ctr-hmac --journal-crypt ctr-aes $CKEY $MAC
kernel_image jc-cbc-hmac --journal-crypt cbc-aes $CKEY $MAC
kernel_image jc-chacha20 --journal-crypt chacha20 $CKEY
kernel_image jm-hmac $MAC

# Flips bit 0 of byte OFFSET of FILE.
flip() {
    v=$(dd if="$1" bs=1 skip="$2" count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
    v=$((v ^ 1))
    printf "\\$(printf %o "$v")" | dd of="$1" bs=1 seek="$2" count=1 conv=notrunc 2>/dev/null
}

# Tamper: crc32c tags, 512-byte blocks and a journal MAC give 24-byte entries, 20 per
# sector (496 usable bytes), 160 per section, sections of 168 sectors from sector 8.
for name in jm-hmac jc-ctr-hmac; do
    [ -e "$name-live.img" ] || continue
    cp "$name-live.img" "$name-tampered.img"
    n=$(sed -n 's/^journal_sections //p' "$name.dump")
    i=0
    while [ "$i" -lt "$n" ]; do
        flip "$name-tampered.img" $((4096 + i * 168 * 512))
        i=$((i + 1))
    done
    opts="$MAC"
    [ "$name" = jc-ctr-hmac ] && opts="--journal-crypt ctr-aes $CKEY $MAC"
    dev=$($LOSETUP -f --show "$name-tampered.img")
    if integritysetup open $opts "$dev" tint 2> open.err; then
        if err=$(dd if=/dev/mapper/tint of=/dev/null bs=4096 count=1 iflag=direct 2>&1); then
            rd=ok
        else
            rd="ERROR($(echo "$err" | grep -o 'Input/output error\|Invalid or incomplete multibyte or wide character\|Invalid argument' | head -1))"
        fi
        mism=$(dmsetup status tint | cut -d' ' -f4)
        echo "$name tampered: open=ok read=$rd mismatches=$mism" >> results-jc.txt
        integritysetup close tint
    else
        echo "$name tampered: open=FAILED($(tr '\n' ' ' < open.err))" >> results-jc.txt
    fi
    dmesg | grep -i 'integrity' | tail -3 | sed 's/^\[[ 0-9.]*\] //; s/^/  dmesg: /' >> results-jc.txt
    $LOSETUP -d "$dev"
done

# cryptblk -> kernel: open each of our images and read the pattern back.
for img in ours-*.img; do
    [ -e "$img" ] || continue
    opts=$(cat "${img%.img}.opts")
    dev=$($LOSETUP -f --show "$img")
    if integritysetup open $opts "$dev" oint 2> open.err; then
        sum=$(dd if=/dev/mapper/oint bs=64k count=$((PLEN / 65536)) 2>/dev/null | sha256sum | cut -d' ' -f1)
        # Reading everything checks every tag (a mismatch is an I/O error).
        if dd if=/dev/mapper/oint of=/dev/null bs=64k 2>/dev/null; then all=ok; else all=EIO; fi
        mism=$(dmsetup status oint | cut -d' ' -f4)
        [ "$sum" = "$PSUM" ] && res=OK || res=MISMATCH
        echo "$img pattern=$res full_read=$all mismatches=$mism" >> results-jc.txt
        integritysetup close oint
    else
        echo "$img open FAILED: $(tr '\n' ' ' < open.err)" >> results-jc.txt
    fi
    $LOSETUP -d "$dev"
done
cp j*-live.img j*.dump j*.table results-jc.txt "$LAB_OUT"/ 2>/dev/null
cat results-jc.txt
sync
