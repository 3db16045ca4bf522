//! What an idle served volume costs in threads (issue 28's scale goal: a thousand idle
//! volumes on one host, each at most 4 threads). Not timed: the figures for time and memory
//! come from `scripts/scale-bench.sh`.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// The daemon's threads by name, for the failure message.
fn threads(pid: u64) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the daemon's /proc/PID/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

/// The libraries a volume on a file never needs, which cost every process that maps them
/// their relocated pages and static initialisers (librbd's libceph-common fills about 0.7 MB
/// at load): loaded only by an `rbd:` store or a TPM2 token.
const LOADED_ON_USE: [&str; 5] = [
    "librbd",
    "librados",
    "libceph-common",
    "libtss2",
    "libcrypto",
];

/// An idle NBD-served volume's daemon runs at most 4 threads (no idle worker pool) and maps
/// none of [`LOADED_ON_USE`]; a client that connects is still served (workers start on
/// demand), and once it leaves the daemon goes back to at most 4 threads.
#[test]
fn an_idle_nbd_volume_costs_at_most_four_threads_and_still_serves() {
    let dir = tempdir();
    let img = dir.path().join("img");
    let key = write_file(dir.path(), "key", b"scale idle key");
    cryptblk_luks2(&img, &key, 32 << 20);
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, "scale_idle", &sock, &[]);
    let pid = status("scale_idle")["pid"]
        .as_u64()
        .expect("status --json gives the daemon's pid");

    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the daemon's maps");
    for lib in LOADED_ON_USE {
        assert!(
            !maps.contains(&format!("/{lib}")),
            "an idle LUKS2 volume over NBD maps {lib}:\n{maps}"
        );
    }

    let idle = threads(pid);
    assert!(
        idle.len() <= 4,
        "an idle served volume runs {} threads: {idle:?}",
        idle.len()
    );

    let (ok, out) = qemu_io_nbd(&sock, "write -P 0x5a 4096 64k");
    assert!(ok, "a client writes through the idle volume: {out}");
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0x5a 4096 64k");
    assert!(ok, "a client reads back what it wrote: {out}");

    // The workers the clients started end once idle (after seconds); a bound, not a sleep.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut now = threads(pid);
    while now.len() > 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        now = threads(pid);
    }
    assert!(
        now.len() <= 4,
        "after its clients left the volume still runs {} threads: {now:?}",
        now.len()
    );
}
