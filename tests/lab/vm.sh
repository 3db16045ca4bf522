#!/bin/bash
# The lab's run-in-vm.sh (same arguments, same environment, same exit status) with one thing
# added: a guest kernel that dies while it boots, before the guest script has printed a single
# line, is booted again (at most twice more).
#
# Why: under TCG the Debian kernel now and then oopses in an early initcall (seen in CI:
# "Fatal exception in interrupt" from sched_clock_cpu under cpu_latency_qos_init, 6 s into the
# boot). Nothing of ours has run at that point, so the boot says nothing about cryptblk. Once
# the script has printed anything its result stands, whatever happens after: a retry never
# hides a failure of the code under test.
#
# env: LAB_DIR (default: shared/lab beside the workspace, or one level further up for a
#      worktree in /work/wt/NAME), LAB_BOOT_TRIES (default 3), and everything run-in-vm.sh reads.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WS=$(cd "$HERE/../.." && pwd)
if [ -z "${LAB_DIR:-}" ]; then
  LAB_DIR=$WS/../shared/lab
  [ -x "$LAB_DIR/run-in-vm.sh" ] || LAB_DIR=$WS/../../shared/lab
fi
[ -x "$LAB_DIR/run-in-vm.sh" ] || { echo "lab: $LAB_DIR/run-in-vm.sh not found" >&2; exit 1; }

# run-in-vm.sh keeps its logs where LAB_LOGDIR says: use the caller's, or a private one.
own_logs=0
if [ -z "${LAB_LOGDIR:-}" ]; then
  LAB_LOGDIR=$(mktemp -d /tmp/cryptblk-vm-logs.XXXXXX); own_logs=1
fi
export LAB_LOGDIR
tries=${LAB_BOOT_TRIES:-3}
rc=0
for attempt in $(seq 1 "$tries"); do
  rc=0
  "$LAB_DIR/run-in-vm.sh" "$@" || rc=$?
  # 125 is run-in-vm.sh's "no exit marker"; out.log is the guest script's whole output.
  if [ "$rc" = 125 ] && [ ! -s "$LAB_LOGDIR/out.log" ] && [ "$attempt" -lt "$tries" ] &&
     grep -q 'Kernel panic' "$LAB_LOGDIR/console.log" 2>/dev/null; then
    echo "lab: the guest kernel panicked while booting, before the script ran (boot $attempt of $tries); booting again" >&2
    continue
  fi
  break
done
[ $own_logs = 1 ] && rm -rf "$LAB_LOGDIR"
exit "$rc"
