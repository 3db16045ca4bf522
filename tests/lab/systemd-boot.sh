#!/bin/bash
# crypttab and fstab under systemd itself: boots the lab's kernel (Debian 6.12, ublk_drv) with
# systemd as PID 1 on a Debian root (tests/lab/systemd-root.sh, cached) into which
# scripts/install.sh installed cryptblk, cryptblk-generator, the units and the udev rule
# (--prefix /usr). The root's /etc/crypttab has two LUKS2 volumes served over ublk:
#   keyed   /dev/vdb  key file                     -> /mnt/keyed  (fstab, /dev/cryptblk/keyed)
#   tanged  /dev/vdc  none (clevis tang token)     -> /mnt/tanged (fstab, /dev/cryptblk/tanged)
#           x-systemd.requires=tangd.socket: the tang server is the guest's own
# The volumes are made here with the real tools: mkfs.ext4 -d (a marker file), then
# `cryptsetup reencrypt --encrypt` (LUKS2), and for tanged `clevis luks bind` to the guest's
# own tang server (tangd.socket on 127.0.0.1:80 in the guest, keys made here with
# tangd-keygen). At the end of the boot cryptblk-lab-check.service (tests/lab/systemd-check.sh)
# checks units, device units, mounts and markers, prints the cryptblk units' journal on the
# second serial port and powers off. Exit status: 0 when every check passed.
#
# usage: tests/lab/systemd-boot.sh [--no-build]
# env:   CARGO_TARGET_DIR, CRYPTBLK_BIN / CRYPTBLK_GENERATOR (use these binaries), LAB_DIR,
#        LAB_CACHE (the lab's kernel cache), LAB_KERNEL, LAB_TIMEOUT (s, default 1200),
#        LAB_LOGDIR (keep console.log/out.log), KEEP_WORK=1 (keep the work dir),
#        WITHOUT_UDEV_RULE=1 (leave the udev rule out: the checks must fail).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WS=$(cd "$HERE/../.." && pwd)
if [ -z "${LAB_DIR:-}" ]; then
  LAB_DIR=$WS/../shared/lab
  [ -x "$LAB_DIR/build.sh" ] || LAB_DIR=$WS/../../shared/lab
fi
[ -x "$LAB_DIR/build.sh" ] || { echo "systemd-lab: $LAB_DIR/build.sh not found" >&2; exit 1; }
build=1
[ "${1:-}" = "--no-build" ] && build=0
KVER=${LAB_KERNEL:-6.12.117+deb12-amd64}
CACHE=${LAB_CACHE:-/var/tmp/cryptblk-lab}

for t in qemu-system-x86_64 mkfs.ext4 cryptsetup clevis jose /usr/libexec/tangd-keygen /usr/libexec/tangd; do
  command -v "$t" >/dev/null || { echo "systemd-lab: $t missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
done

target=${CARGO_TARGET_DIR:-$WS/target}
if [ $build = 1 ] && [ -z "${CRYPTBLK_BIN:-}" ]; then
  (cd "$WS" && cargo build -q --workspace --bins) >&2
fi
bin=${CRYPTBLK_BIN:-$target/debug/cryptblk}
gen=${CRYPTBLK_GENERATOR:-$(dirname "$bin")/cryptblk-generator}
[ -x "$bin" ] && [ -x "$gen" ] || { echo "systemd-lab: no $bin or $gen" >&2; exit 1; }

"$LAB_DIR/build.sh" "$KVER" >&2           # the lab's kernel (vmlinux) and busybox initramfs
root=$("$HERE/systemd-root.sh" "$bin" "$gen")

W=$(mktemp -d /var/tmp/cryptblk-systemd-lab.XXXXXX)
qpid=
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null
  [ "${KEEP_WORK:-0}" = 1 ] && { echo "systemd-lab: work dir kept: $W" >&2; return; }
  rm -rf "$W"
}
trap cleanup EXIT
T=$W; [ -n "${LAB_LOGDIR:-}" ] && mkdir -p "$LAB_LOGDIR" && T=$(cd "$LAB_LOGDIR" && pwd)

# 1. The volumes. ext4 with a marker file, encrypted in place by cryptsetup (offline LUKS2
#    encryption needs no device-mapper, which this host kernel lacks).
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
make_volume() { # make_volume NAME KEYFILE
  mkdir -p "$W/fs-$1"; echo "marker of $1" > "$W/fs-$1/marker"
  truncate -s 48M "$W/$1.img"
  mkfs.ext4 -q -L "$1" -d "$W/fs-$1" "$W/$1.img"
  truncate -s 80M "$W/$1.img"
  cryptsetup reencrypt --encrypt --type luks2 --reduce-device-size 32M "${KDF[@]}" \
    --key-file "$2" --force-offline-reencrypt -q "$W/$1.img"
}
head -c 64 /dev/urandom > "$W/keyed.key"
make_volume keyed "$W/keyed.key"
head -c 32 /dev/urandom | base64 -w0 > "$W/tanged.pass"
make_volume tanged "$W/tanged.pass"
#    The guest's tang keys, and their advertisement as tangd serves it, for an offline bind.
mkdir -p "$W/tang"
/usr/libexec/tangd-keygen "$W/tang" >/dev/null
printf 'GET /adv HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' |
  /usr/libexec/tangd "$W/tang" 2>/dev/null | sed '1,/^\r$/d' > "$W/adv.jws"
jose fmt --json="$(cat "$W/adv.jws")" --object >/dev/null ||
  { echo "systemd-lab: tangd gave no advertisement" >&2; exit 1; }
clevis luks bind -y -d "$W/tanged.img" -k "$W/tanged.pass" tang \
  "{\"url\":\"http://127.0.0.1\",\"adv\":\"$W/adv.jws\"}"
cryptsetup luksDump "$W/tanged.img" | grep -q clevis || { echo "systemd-lab: no clevis token" >&2; exit 1; }

# 2. The root: the cached Debian tree, the kernel's modules, cryptblk as installed by
#    scripts/install.sh, and the configuration a sysadmin would write.
R=$W/root
cp -a "$root" "$R"
mkdir -p "$R/usr/lib/modules"
cp -a "$CACHE/pkg/$KVER/lib/modules/$KVER" "$R/usr/lib/modules/"
bash "$WS/scripts/install.sh" --prefix /usr --destdir "$R" --binary "$bin" --generator "$gen" >"$W/installed"
# WITHOUT_UDEV_RULE=1 boots without the udev rule (to see the check fail: no device unit).
[ "${WITHOUT_UDEV_RULE:-0}" = 1 ] && rm -f "$R"/usr/lib/udev/rules.d/60-cryptblk.rules
install -D -m 400 "$W/keyed.key" "$R/etc/cryptblk/keyed.key"
# tangd runs as the root's _tang user: keys readable by all, in the package's directory.
install -m 444 "$W"/tang/*.jwk "$R/var/lib/tang/"
cat > "$R/etc/crypttab" <<'EOF'
# <name> <device> <key file> <options>
keyed   /dev/vdb  /etc/cryptblk/keyed.key  luks,x-cryptblk.export=ublk
tanged  /dev/vdc  none                     luks,headless=true,x-systemd.requires=tangd.socket,x-cryptblk.export=ublk
EOF
# How long a mount waits for its device (without the udev rule it never comes).
dt=600; [ "${WITHOUT_UDEV_RULE:-0}" = 1 ] && dt=60
cat > "$R/etc/fstab" <<EOF
/dev/vda              /            ext4  defaults                                    0 0
/dev/cryptblk/keyed   /mnt/keyed   ext4  nofail,x-systemd.device-timeout=$dt         0 2
/dev/cryptblk/tanged  /mnt/tanged  ext4  _netdev,nofail,x-systemd.device-timeout=$dt 0 2
EOF
mkdir -p "$R/mnt/keyed" "$R/mnt/tanged"
echo cryptblk-lab > "$R/etc/hostname"
# glibc off AVX-512 string functions under TCG's -cpu max (as the lab's init does).
tunables=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-BMI2
mkdir -p "$R/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultEnvironment=GLIBC_TUNABLES=%s\nDefaultTimeoutStartSec=600\n' "$tunables" > "$R/etc/systemd/system.conf.d/lab.conf"
# fio for the check's crash and upgrade run (the root has no fio): the host's (same Debian
# release), with the libraries the root lacks beside it.
install -D -m 755 "$(command -v fio)" "$R/usr/local/bin/fio"
mkdir -p "$R/usr/local/lib/fio"
for l in $(ldd "$(command -v fio)" | grep -o '/[^ ]*\.so[^ ]*'); do
  [ -e "$R$l" ] || [ -e "$R/usr$l" ] || cp -Ln "$l" "$R/usr/local/lib/fio/"
done
# The check that ends the boot.
install -D -m 755 "$HERE/systemd-check.sh" "$R/usr/local/sbin/cryptblk-lab-check"
cat > "$R/etc/systemd/system/cryptblk-lab-check.service" <<'EOF'
[Unit]
Description=cryptblk lab: check the crypttab volumes and their mounts, then power off
After=multi-user.target local-fs.target remote-fs.target cryptsetup.target remote-cryptsetup.target mnt-keyed.mount mnt-tanged.mount
Wants=mnt-keyed.mount mnt-tanged.mount

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/cryptblk-lab-check
StandardOutput=file:/dev/ttyS1
StandardError=inherit

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/cryptblk-lab-check.service "$R/etc/systemd/system/multi-user.target.wants/"
# No getty on the consoles: nothing reads them.
rm -f "$R"/etc/systemd/system/getty.target.wants/*
truncate -s 2G "$W/root.img"
mkfs.ext4 -q -d "$R" "$W/root.img"
rm -rf "$R"

# 3. The initramfs: the lab's busybox image with an /init that mounts /dev/vda and hands over
#    to systemd.
mkdir -p "$W/init"
cat > "$W/init/init" <<'EOF'
#!/bin/sh
export PATH=/sbin:/usr/sbin:/usr/bin:/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
modprobe virtio_pci; modprobe virtio_blk; modprobe ext4
i=0; while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || { echo "init: cannot mount /dev/vda"; poweroff -f; }
umount /proc /sys /dev
exec switch_root /newroot /lib/systemd/systemd
EOF
chmod 755 "$W/init/init"
(cd "$W/init" && echo init | cpio -o -H newc --quiet | zstd -q) | cat "$CACHE/$KVER/initramfs.img" - > "$W/initrd"

# 4. Boot. Console on ttyS0 (console.log), the check's report on ttyS1 (out.log).
ACCEL=${LAB_ACCEL:-$([ -d /sys/module/kvm_pvm ] && echo tcg || echo kvm)}
case $ACCEL in
  kvm) accel=(-enable-kvm -cpu host) ;;
  tcg) accel=(-accel tcg,thread=multi,tb-size=512 -cpu max) ;;
esac
: > "$T/out.log"
start=$(date +%s)
qemu-system-x86_64 "${accel[@]}" -smp "${LAB_CPUS:-2}" -m "${LAB_MEM:-2G}" \
  -display none -monitor none -no-reboot -nodefaults \
  -kernel "$CACHE/$KVER/vmlinux" -initrd "$W/initrd" \
  -append "console=ttyS0 panic=-1 quiet systemd.show_status=1 GLIBC_TUNABLES=$tunables" \
  -drive "file=$W/root.img,format=raw,if=virtio" \
  -drive "file=$W/keyed.img,format=raw,if=virtio" \
  -drive "file=$W/tanged.img,format=raw,if=virtio" \
  -serial "file:$T/console.log" -serial "file:$T/out.log" 2> "$T/qemu.err" & qpid=$!
deadline=$(( start + ${LAB_TIMEOUT:-1200} ))
while kill -0 "$qpid" 2>/dev/null; do
  [ "$(date +%s)" -gt "$deadline" ] && { echo "systemd-lab: timeout, killing the VM" >&2; kill "$qpid"; }
  sleep 1
done
wait "$qpid" || true; qpid=
cat "$T/out.log"
echo "systemd-lab: VM ran $(( $(date +%s) - start )) s ($ACCEL)" >&2
rc=$(sed -n 's/^LAB_EXIT=\([0-9]*\).*/\1/p' "$T/out.log" | tail -1)
if [ -z "$rc" ]; then
  echo "systemd-lab: no result from the guest; last console lines:" >&2; tail -n 40 "$T/console.log" >&2
  exit 125
fi
exit "$rc"
