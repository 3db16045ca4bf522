# Shared helpers of the guest scripts (sourced from $LAB_OUT/lib.sh inside the lab VM).
set -u
S=${LAB_OUT:-/mnt/share}
CB=$S/cryptblk
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
# sha256 of every file under a directory, relative names, sorted.
tree_sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
# The kernel's ext4 (staged by run.sh: the lab image lacks fs/ext4).
load_ext4() {
  grep -qw ext4 /proc/filesystems && return 0
  modprobe crc16 2>/dev/null
  for m in mbcache jbd2 ext4; do insmod "$S"/mod/$m.ko* 2>/dev/null; done
  grep -qw ext4 /proc/filesystems || { fail "cannot load the ext4 module"; return 1; }
}
finish() {
  if [ "$FAILS" -eq 0 ]; then log "ALL PASSED"; exit 0; fi
  log "$FAILS check(s) FAILED"; exit 1
}
