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
finish() {
  if [ "$FAILS" -eq 0 ]; then log "ALL PASSED"; exit 0; fi
  log "$FAILS check(s) FAILED"; exit 1
}
