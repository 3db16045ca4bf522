#!/bin/sh
# Runs inside the kernel lab (shared/lab/run-in-vm.sh) with $LAB_OUT holding pattern.bin
# and cryptblk's images ours-*.img. Makes the kernel images of integrity_recalc.rs and
# records the kernel's verdicts on cryptblk's images in results.txt. Driven by
# make-recalc-fixtures.sh; not run by CI.
set -u
modprobe loop; modprobe dm-integrity
LOSETUP=/usr/sbin/losetup
W=/tmp/recalc; mkdir -p $W
cp "$LAB_OUT"/pattern.bin "$LAB_OUT"/ours-*.img $W/
cd $W
: > results.txt
PSUM=$(sha256sum < pattern.bin | cut -d' ' -f1)
PLEN=$(stat -c %s pattern.bin)

# Reads the pattern and then everything from /dev/mapper/$1; one verdict line for $2.
verdict() {
    map=$1; label=$2
    sum=$(dd if=/dev/mapper/$1 bs=64k count=$((PLEN / 65536)) 2>/dev/null | sha256sum | cut -d' ' -f1)
    if dd if=/dev/mapper/$1 of=/dev/null bs=64k 2>/dev/null; then all=ok; else all=EIO; fi
    set -- $(dmsetup status $map)
    [ "$sum" = "$PSUM" ] && res=OK || res=MISMATCH
    echo "$label pattern=$res full_read=$all mismatches=$4 status_recalc=$6" >> results.txt
}

# 1. kdd: integritysetup format --data-device, the pattern written through the kernel.
truncate -s 2M kdd-meta.img; truncate -s 4M kdd-data.img
m=$($LOSETUP -f --show kdd-meta.img); d=$($LOSETUP -f --show kdd-data.img)
integritysetup format -q --data-device $d $m || echo "kdd format FAILED" >> results.txt
integritysetup open --data-device $d $m kint || echo "kdd open FAILED" >> results.txt
echo "kdd table: $(dmsetup table kint) (data $(cat /sys/block/${d#/dev/}/dev), meta $(cat /sys/block/${m#/dev/}/dev))" >> results.txt
dd if=pattern.bin of=/dev/mapper/kint bs=64k oflag=direct conv=fsync 2>/dev/null
integritysetup close kint
$LOSETUP -d $m; $LOSETUP -d $d
integritysetup dump kdd-meta.img > kdd.dump
echo "kdd kernel image made" >> results.txt

# 2. kr: format --no-wipe, the pattern written raw (untagged) to the data device, then
#    the kernel recalculates (--integrity-recalculate) until recalc_sector = size.
truncate -s 2M kr-meta.img; truncate -s 4M kr-data.img
dd if=pattern.bin of=kr-data.img conv=notrunc 2>/dev/null
m=$($LOSETUP -f --show kr-meta.img); d=$($LOSETUP -f --show kr-data.img)
integritysetup format -q --no-wipe --data-device $d $m || echo "kr format FAILED" >> results.txt
$LOSETUP -d $m; $LOSETUP -d $d
cp kr-meta.img kr-before-meta.img
m=$($LOSETUP -f --show kr-meta.img); d=$($LOSETUP -f --show kr-data.img)
integritysetup open --integrity-recalculate --data-device $d $m kint || echo "kr open FAILED" >> results.txt
echo "kr table: $(dmsetup table kint)" >> results.txt
i=0
while [ $i -lt 120 ]; do
    set -- $(dmsetup status kint)
    [ "$6" = "$5" ] && break
    sleep 1; i=$((i + 1))
done
echo "kr status after ${i}s: $(dmsetup status kint)" >> results.txt
verdict kint kr
integritysetup close kint
$LOSETUP -d $m; $LOSETUP -d $d
cp kr-meta.img kr-after-meta.img
integritysetup dump kr-after-meta.img > kr-after.dump

# 3. kb: bitmap mode with --bitmap-sectors-per-bit 1024.
truncate -s 16M kb.img
b=$($LOSETUP -f --show kb.img)
integritysetup format -q $b || echo "kb format FAILED" >> results.txt
integritysetup open -B --bitmap-sectors-per-bit 1024 $b kint || echo "kb open FAILED" >> results.txt
echo "kb table: $(dmsetup table kint)" >> results.txt
integritysetup close kint
$LOSETUP -d $b
integritysetup dump kb.img > kb.dump

# 4. cryptblk's images read by the kernel.
for name in ours-dd ours-rc; do
    m=$($LOSETUP -f --show $name-meta.img); d=$($LOSETUP -f --show $name-data.img)
    if integritysetup open --data-device $d $m oint; then
        verdict oint $name
        integritysetup close oint
    else
        echo "$name open FAILED" >> results.txt
    fi
    $LOSETUP -d $m; $LOSETUP -d $d
done
b=$($LOSETUP -f --show ours-rc1.img)
if integritysetup open $b oint; then
    verdict oint ours-rc1
    integritysetup close oint
else
    echo "ours-rc1 open FAILED" >> results.txt
fi
$LOSETUP -d $b

cp kdd-meta.img kdd-data.img kr-before-meta.img kr-after-meta.img kr-data.img kb.img *.dump results.txt "$LAB_OUT"/
cat results.txt
sync
