//! Hostile vhost-user frontends against the daemon `cryptblk open --vhost-user` leaves
//! behind (not the export in the test's own process, as crates/export/tests/vhost_user.rs
//! does): a memory table past the end of its memfd and a memfd shrunk after
//! SET_MEM_TABLE end that frontend's connection, the daemon lives on (same pid, volume still
//! served, data written before intact) and its log names what the frontend did.

mod common;
#[path = "../../export/tests/vhost_frontend/mod.rs"]
mod vhost_frontend;

use common::*;
use vhost_frontend::*;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};

/// Whether process `pid` runs: it exists and is not a zombie (a dead daemon nobody has
/// reaped yet still answers `kill(pid, 0)`).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[test]
fn hostile_frontends_leave_the_daemon_serving_and_are_logged() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"vhost hostile");
    let img = dir.path().join("vol.img");
    cryptblk_luks2(&img, &key, 32 << 20);
    let socket = dir.path().join("vu.sock");
    let name = format!("cbvuhost-{}", std::process::id() % 100_000);
    let facts = run_ok(
        cryptblk()
            .args(["open", "--json", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(&name)
            .arg("--vhost-user")
            .arg(&socket),
        b"",
    );
    let _served = Served::volume(&name);
    let facts: serde_json::Value = serde_json::from_str(&facts).unwrap();
    let pid = facts["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("open --json names the daemon's pid: {facts}"))
        as i32;
    assert!(alive(pid));

    // 1. A memory table whose region starts at the end of its file: refused on the table.
    let s = socket.clone();
    within(30, "the hostile table", move || {
        let mut g = connect_with(&s, 1, |r| r.mmap_offset = MEM_SIZE, false);
        wait_closed(&mut g.frontend);
    });

    // 2. Data written, then the memory cut to nothing under a kicked request: SIGBUS in
    //    the daemon, which fails that request and drops the frontend.
    let before = pattern(47, 4096);
    let (s, written) = (socket.clone(), before.clone());
    within(30, "the shrinking frontend", move || {
        let mut g = connect(&s, 1);
        assert_eq!(g.queues[0].write(64, &written), VIRTIO_BLK_S_OK);
        let q = &mut g.queues[0];
        let chain = [
            q.header(VIRTIO_BLK_T_IN, 64),
            (q.buf(), 4096, true),
            q.status_buf(),
        ];
        q.place(&chain);
        memfd(&q.mem).set_len(0).unwrap();
        q.kick.write(1).unwrap();
        wait_closed(&mut g.frontend);
    });

    // The same daemon still serves the volume, and the data survived.
    assert!(
        alive(pid),
        "the daemon (pid {pid}) died of a hostile frontend"
    );
    run_ok(cryptblk().arg("status").arg(&name), b"");
    let s = socket.clone();
    within(30, "the next frontend", move || {
        let mut g = connect(&s, 1);
        let (st, back) = g.queues[0].read(64, 4096);
        assert_eq!(st, VIRTIO_BLK_S_OK);
        assert!(
            back == before,
            "the data written before the hostile frontend survived"
        );
    });

    // Its log says what each frontend did.
    let log = std::fs::read_to_string(runtime_dir().join(format!("{name}.log")))
        .expect("the daemon's log");
    assert!(
        log.contains("refusing the frontend's memory table"),
        "the bad table is logged:\n{log}"
    );
    assert!(
        log.contains("truncated the guest memory"),
        "the shrunk memory is logged:\n{log}"
    );
}

/// The test's own data pattern (the frontend module has none).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
