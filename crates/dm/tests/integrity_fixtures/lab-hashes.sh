#!/bin/sh
# Runs inside the kernel lab (shared/lab/run-in-vm.sh) with $LAB_OUT holding pattern.bin.
# For each internal hash, integritysetup formats a small image (kernel dm-integrity wipes
# it), the pattern is written through the kernel mapping and flushed, and the image plus
# `integritysetup dump` are kept as h-<hash>.img / .dump. Driven by make-hash-fixtures.sh;
# not run by CI. hashes.txt records what the kernel accepted.
set -u
modprobe loop; modprobe dm-integrity
for m in crc32_generic crc32c_generic xxhash_generic blake2b_generic blake2s_generic sha1_generic; do
    modprobe $m 2>/dev/null
done
LOSETUP=/usr/sbin/losetup
W=/tmp/hashfix; mkdir -p $W
cp "$LAB_OUT"/pattern.bin $W/
cd $W
: > hashes.txt
# HASH[:TAG_SIZE]: libcryptsetup does not know the digest size of the blake2 hashes, so
# they need --tag-size (as in cryptsetup's integrity-compat-test).
for spec in crc32 xxhash64 blake2b-256:32 blake2s-256:32 sha1; do
    h=${spec%%:*}; tag=
    [ "$h" != "$spec" ] && tag="--tag-size ${spec#*:}"
    name=h-$h
    truncate -s 4M "$name.img"
    dev=$($LOSETUP -f --show "$name.img")
    if ! integritysetup format -q --integrity $h $tag --journal-size 65536 "$dev" > err.txt 2>&1; then
        echo "$h format FAILED: $(tr '\n' ' ' < err.txt)" >> hashes.txt
        $LOSETUP -d "$dev"; rm -f "$name.img"; continue
    fi
    if ! integritysetup open --integrity $h "$dev" kint > err.txt 2>&1; then
        echo "$h open FAILED: $(tr '\n' ' ' < err.txt)" >> hashes.txt
        $LOSETUP -d "$dev"; rm -f "$name.img"; continue
    fi
    dd if=pattern.bin of=/dev/mapper/kint bs=64k oflag=direct conv=fsync 2>/dev/null
    dmsetup table kint >> hashes.txt
    integritysetup close kint
    $LOSETUP -d "$dev"
    integritysetup dump "$name.img" > "$name.dump"
    echo "$h kernel image made" >> hashes.txt
done
# cryptblk -> kernel: images that `cryptblk integrity format` made and cryptblk wrote the
# pattern into (over NBD) must open in the kernel, show the pattern and pass every tag check.
cp "$LAB_OUT"/hmac.key "$LAB_OUT"/ours-cli-* $W/ 2>/dev/null
PSUM=$(sha256sum < pattern.bin | cut -d' ' -f1)
for img in ours-cli-*.img; do
    [ -e "$img" ] || continue
    opts=$(sed "s#/KEY#$W/hmac.key#" "${img%.img}.opts")
    dev=$($LOSETUP -f --show "$img")
    if integritysetup open $opts "$dev" oint > err.txt 2>&1; then
        sum=$(dd if=/dev/mapper/oint bs=64k count=4 2>/dev/null | sha256sum | cut -d' ' -f1)
        if dd if=/dev/mapper/oint of=/dev/null bs=64k 2>/dev/null; then all=ok; else all=EIO; fi
        mism=$(dmsetup status oint | cut -d' ' -f4)
        [ "$sum" = "$PSUM" ] && res=OK || res=MISMATCH
        echo "$img pattern=$res full_read=$all mismatches=$mism" >> hashes.txt
        integritysetup close oint
    else
        echo "$img open FAILED: $(tr '\n' ' ' < err.txt)" >> hashes.txt
    fi
    $LOSETUP -d "$dev"
done
cp h-*.img h-*.dump hashes.txt "$LAB_OUT"/
cat hashes.txt
sync
