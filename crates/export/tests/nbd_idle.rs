//! Idle NBD connections cost a file descriptor, not a thread: 400 clients that connect and
//! never speak leave the process under 100 threads while a real client (qemu-io) is served,
//! and the handshake timeout then closes them. Alone in its test binary so that the thread
//! count is this server's.

mod common;

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{pattern, require_tool, run_text, MemDisk, TempDir};
use cryptblk_export::{NbdConfig, NbdServer};

const IDLE: usize = 400;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn idle_connections_hold_no_threads_and_time_out() {
    if !require_tool("qemu-io", "QEMU_IO") {
        return;
    }
    let disk = MemDisk::new(4 << 20, 512);
    disk.fill(&pattern(44, 4 << 20));
    let dir = TempDir::new("idle400");
    let sock = dir.join("nbd.sock");
    let timeout = Duration::from_secs(3);
    let server = NbdServer::start(
        disk.clone(),
        NbdConfig::unix(&sock).with_handshake_timeout(timeout),
    )
    .unwrap();
    let mut idle: Vec<UnixStream> = (0..IDLE)
        .map(|_| UnixStream::connect(&sock).expect("connect"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connection_count() < IDLE && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.connection_count(), IDLE, "all idle clients accepted");
    let count = threads();
    assert!(count < 100, "{count} threads with {IDLE} idle connections");

    // A real client is served meanwhile.
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let out = run_text(Command::new("qemu-io").args(["-f", "raw"]).arg(&uri).args([
        "-c",
        "write -P 0x5a 65536 65536",
        "-c",
        "read -P 0x5a 65536 65536",
    ]));
    assert!(!out.contains("fail"), "qemu-io: {out}");
    assert!(disk.snapshot()[65536..131072].iter().all(|&b| b == 0x5a));
    // qemu-io's own connection closes asynchronously after it exits: wait for that, then
    // every idle client must still be there.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.connection_count() > IDLE && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        server.connection_count(),
        IDLE,
        "the idle clients were still connected while the real one was served"
    );

    // After the handshake timeout every idle client has been closed: greeting, then EOF.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        match s.read_to_end(&mut rest) {
            Ok(_) => assert_eq!(rest.len(), 18, "only the greeting"),
            Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.connection_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.connection_count(), 0);
    server.stop().unwrap();
}
