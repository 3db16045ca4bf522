#!/bin/bash
# Guest side of `cryptblk bench --transport ublk|vhost-user` (crates/bench/src/lab.rs): the
# bench writes the matrix into $LAB_OUT/bench/ and this script runs it in the lab VM.
#
#   params   shell assignments: REPS, DISK_MB (each RAM disk), REGION_MB (fio's area)
#   configs  one device per line: NAME KIND [ARG]; KIND is
#              brd        the line's own RAM disk (/dev/ramN, N = line number - 1)
#              kcrypt     kernel dm-crypt: dmsetup table tables/NAME over that RAM disk
#              ublk       cryptblk dm create tables/NAME over that RAM disk, served over ublk
#              nbd        the same served over NBD, attached with the kernel's nbd-client
#              fuse-loop  the same served over FUSE, attached with losetup --direct-io
#              vhost      a virtio disk served from the host (vhost-user-blk) whose size in
#                         bytes is ARG
#            tables/NAME holds @SECTORS@, @KEY@ (a random 512-bit key made here) and @DEV@
#   jobs     one fio job per line: WORKLOAD ARGS..., @DEV@ and @OUT@ to fill in
#
# Per workload, each repeat runs every device once, in order (A B C .. A B C ..). Results:
# out/NAME.WORKLOAD.REP.json (fio JSON), out/NAME.error (why a device was not set up),
# out/NAME.status (`cryptblk status --json` of cryptblk's devices), out/guest (the VM).
# The whole run shares one guest: its ratios compare like with like.
. "$LAB_OUT/lib.sh"
B=$LAB_OUT/bench; O=$B/out
if [ ! -f "$B/jobs" ]; then
  fail "no $B/jobs: run 'cryptblk bench --transport ublk' (or vhost-user), which drives this script"
  finish
fi
. "$B/params"
mkdir -p "$O"; rm -f "$O"/*
W=/tmp/w; mkdir -p $W
NCONF=$(grep -c . "$B/configs")
modprobe brd rd_nr="$NCONF" rd_size=$((DISK_MB * 1024)) && modprobe dm-crypt || { fail "modules brd, dm-crypt"; finish; }
for m in ublk_drv nbd fuse loop virtio_pci virtio_blk; do modprobe $m 2>/dev/null; done
KEY=$(head -c 64 /dev/urandom | od -An -tx1 -v | tr -d ' \n')
{
  echo "kernel=$(uname -r)"
  echo "cpus=$(nproc)"
  echo "cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)"
  echo "fio=$(fio --version)"
} > "$O/guest"

# The virtio disk of ARG bytes (vhost-user disks appear a little after boot).
vhost_dev() {
  for _ in $(seq 1 50); do
    for d in /sys/block/vd*; do
      [ -e "$d/size" ] || continue
      [ $(( $(cat "$d/size") * 512 )) = "$1" ] && { echo "/dev/${d##*/}"; return 0; }
    done
    sleep 0.2
  done
  echo "no virtio disk of $1 bytes (have: $(cat /sys/block/vd*/size 2>/dev/null | tr '\n' ' ')sectors)" >&2
  return 1
}

# setup NAME KIND ARG RAMDISK: prints the device to run fio on; undo NAME KIND DEV.
setup() {
  local n=$1 kind=$2 arg=$3 ram=$4
  local t=$W/$n.table
  if [ -f "$B/tables/$n" ]; then
    sed -e "s/@SECTORS@/$(blockdev --getsz "$ram")/" -e "s/@KEY@/$KEY/" -e "s#@DEV@#$ram#" \
      "$B/tables/$n" > "$t"
  fi
  case $kind in
    brd) echo "$ram" ;;
    kcrypt) dmsetup create "$n" < "$t" >&2 && echo "/dev/mapper/$n" ;;
    ublk)
      local out; out=$($CB dm create "$n" --table-file "$t" --ublk --json) || return 1
      $CB status "$n" --json > "$O/$n.status" 2>/dev/null
      echo "$out" | ublk_dev_of ;;
    nbd)
      local k=$(( $(ls $W/*.nbd 2>/dev/null | wc -l) ))
      $CB dm create "$n" --table-file "$t" --nbd "/run/cb-$n.sock" >/dev/null || return 1
      $CB status "$n" --json > "$O/$n.status" 2>/dev/null
      helper nbd-client -unix "/run/cb-$n.sock" "/dev/nbd$k" -b 4096 >&2 \
        || helper nbd-client -unix "/run/cb-$n.sock" "/dev/nbd$k" -b 4096 -nonetlink >&2 || return 1
      touch "$W/$n.nbd"; echo "/dev/nbd$k" ;;
    fuse-loop)
      mkdir -p "/mnt/$n"
      $CB dm create "$n" --table-file "$t" --fuse "/mnt/$n" >/dev/null || return 1
      $CB status "$n" --json > "$O/$n.status" 2>/dev/null
      losetup -f --show --direct-io=on "/mnt/$n/disk" ;;
    vhost) vhost_dev "$arg" ;;
    *) echo "unknown kind $kind" >&2; return 1 ;;
  esac
}
undo() {
  case $2 in
    kcrypt) dmsetup remove "$1" ;;
    ublk) $CB dm remove "$1" ;;
    nbd) helper nbd-client -d "$3" >/dev/null 2>&1; $CB dm remove "$1" ;;
    fuse-loop) losetup -d "$3"; sleep 0.5; $CB dm remove "$1" ;;
  esac
}

i=0; : > $W/devs
while read -r -u 3 name kind arg; do
  [ -n "$name" ] || continue
  ram=/dev/ram$i; i=$((i + 1))
  # Pages of a RAM disk are allocated when first written: fill it, so no run pays for that.
  [ "$kind" = vhost ] || dd if=/dev/zero of="$ram" bs=1M count="$DISK_MB" oflag=direct 2>/dev/null
  if dev=$(setup "$name" "$kind" "$arg" "$ram" 2> "$W/$name.err") && [ -b "$dev" ]; then
    echo "$name $kind $dev" >> $W/devs
    # fio's area written once through the device, so reads return written blocks.
    dd if=/dev/zero of="$dev" bs=1M count="$REGION_MB" oflag=direct 2>/dev/null
    log "set up $name ($kind): $dev"
  else
    { echo "setting up $name ($kind) failed:"; tail -3 "$W/$name.err"; } | tr '\n' ' ' > "$O/$name.error"
    fail "$(cat "$O/$name.error")"
  fi
done 3< "$B/configs"

while read -r -u 4 wl args; do
  for rep in $(seq 1 "$REPS"); do
    while read -r -u 5 name kind dev; do
      out=$O/$name.$wl.$rep.json
      a=${args//@DEV@/$dev}; a=${a//@OUT@/$out}
      # shellcheck disable=SC2086 # the job's arguments are words without spaces
      if fio $a > /dev/null 2> "$O/$name.$wl.$rep.err"; then
        bw=$(grep -m2 '"bw_bytes"' "$out" | tr -dc '0-9\n' | awk '{printf "%.1f ", $1/1e6}')
        log "$name $wl #$rep: ${bw}MB/s read/write"
      else
        fail "fio $name $wl #$rep: $(tail -2 "$O/$name.$wl.$rep.err" | tr '\n' ' ')"
      fi
    done 5< $W/devs
  done
done 4< "$B/jobs"

while read -r -u 3 name kind dev; do undo "$name" "$kind" "$dev"; done 3< $W/devs
sync
finish
