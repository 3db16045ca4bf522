# Shared helpers of the guest scripts (sourced from $LAB_OUT/lib.sh inside the lab VM).
set -u
S=${LAB_OUT:-/mnt/share}
# The binary's own libraries (libtss2, librbd, ...) are staged in lib/ by run.sh: the guest
# image only has what its own programs need.
CB="env LD_LIBRARY_PATH=$S/lib $S/cryptblk"
export PATH=$S/bin:$PATH
export CRYPTBLK_RUNTIME_DIR=/run/cryptblk
FAILS=0
log()  { echo "[$(cut -d' ' -f1 /proc/uptime)s] $*"; }
pass() { log "PASS $*"; }
fail() { log "FAIL $*"; FAILS=$((FAILS + 1)); }
# Run a command; a non-zero status is a failure of check $1.
must() { local what=$1; shift; "$@" || { fail "$what: '$*' exited $?"; return 1; }; }
helper() { LD_LIBRARY_PATH=$S/lib "$@"; }
# Device node of a cryptblk ublk export, from `open/dm create --json` output.
ublk_dev_of() { sed -n 's/.*"dev":"\([^"]*\)".*/\1/p'; }
# Serve a volume over ublk: cb_serve NAME CRYPTBLK-ARGS... (e.g. open ... or dm create ...);
# prints /dev/ublkbN and keeps the daemon's facts for cb_stop.
cb_serve() {
  local name=$1; shift
  local out; out=$($CB "$@" --ublk --json) || return 1
  echo "$out" > /tmp/cb-serve.$name
  local dev; dev=$(echo "$out" | ublk_dev_of)
  [ -b "$dev" ] || { echo "no ublk block device in: $out" >&2; return 1; }
  echo "$dev"
}
# Close a volume served by cb_serve: cb_stop NAME [close|dm remove]. When `cryptblk close`
# returns, the export must be stopped (and so the volume flushed): the ublk node must be
# gone. A daemon still finishing is waited for, so later checks stay meaningful.
cb_stop() {
  local name=$1; shift
  local how=${*:-close}
  local dev pid; dev=$(ublk_dev_of < /tmp/cb-serve.$name); pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' /tmp/cb-serve.$name)
  $CB $how "$name" || { fail "cryptblk $how $name exited $?"; return 1; }
  if [ -e "$dev" ]; then
    fail "cryptblk $how $name returned while $dev still existed (export not yet stopped and flushed)"
  fi
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "daemon $pid of $name still running 30 s after $how"
  return 0
}
# sha256 of every file under a directory, relative names, sorted.
tree_sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
# The kernel's ext4: from the lab image's module tree where it has fs/ext4 (it does since the
# lab added it), else the copies run.sh staged from the lab's kernel package.
load_ext4() {
  grep -qw ext4 /proc/filesystems && return 0
  modprobe ext4 2>/dev/null && grep -qw ext4 /proc/filesystems && return 0
  modprobe crc16 2>/dev/null
  for m in mbcache jbd2 ext4; do insmod "$S"/mod/$m.ko* 2>/dev/null; done
  grep -qw ext4 /proc/filesystems || { fail "cannot load the ext4 module"; return 1; }
}
# Setup of the dm-crypt guest scripts: crypt_setup NR_RAMDISKS loads ublk_drv, dm-crypt and
# brd with NR_RAMDISKS 128 MiB RAM disks (/dev/ram0...), makes the work directory $W with a
# random 64-byte passphrase file $W/key (binary is fine for cryptsetup and cryptblk) and sets
# $KDF, the luksFormat options that keep key slots cheap under TCG. A module that does not
# load ends the script.
crypt_setup() {
  modprobe ublk_drv && modprobe dm-crypt && modprobe brd rd_nr="$1" rd_size=131072 || { fail "modules"; finish; }
  W=/tmp/w; mkdir -p $W
  head -c 64 /dev/urandom > $W/key
  KDF="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
}
finish() {
  if [ "$FAILS" -eq 0 ]; then log "ALL PASSED"; exit 0; fi
  log "$FAILS check(s) FAILED"; exit 1
}
