//! The daemon's NBD server bounds from the command line: 400 clients that never speak leave
//! the daemon under 100 threads while qemu-io is served, `--handshake-timeout` then closes
//! them, and `--max-clients` refuses clients over the cap.

mod common;
use common::*;
use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Reads until the server closes; returns the bytes (the 18-byte greeting, or nothing for a
/// client refused over the cap).
fn until_closed(s: &mut UnixStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => got,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => got,
        Err(e) => panic!("the server did not close the connection: {e}"),
    }
}

fn create(dir: &Path, name: &str, sock: &Path, extra: &[&str]) -> Served {
    let table = dir.join("table");
    std::fs::write(&table, "0 65536 linear ram:32M 0\n").unwrap();
    run_ok(
        cryptblk()
            .args(["dm", "create", name, "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(sock)
            .args(extra),
        b"",
    );
    Served::volume(name)
}

#[test]
fn idle_clients_hold_no_daemon_threads_and_time_out() {
    let Some(_) = tool("qemu-io") else { return };
    let dir = tempdir();
    let sock = dir.path().join("idle.sock");
    let _s = create(
        dir.path(),
        "t-nbd-idle",
        &sock,
        &["--handshake-timeout", "3"],
    );
    let st = run_ok(cryptblk().args(["status", "t-nbd-idle", "--json"]), b"");
    let v: serde_json::Value = serde_json::from_str(&st).unwrap();
    let pid = v["pid"].as_u64().expect("status names the daemon's pid");

    let mut idle: Vec<UnixStream> = (0..400)
        .map(|_| UnixStream::connect(&sock).expect("connect"))
        .collect();
    // Every idle client has been accepted and greeted.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
    }
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    assert!(
        threads < 100,
        "daemon has {threads} threads with 400 idle clients"
    );
    let (ok, out) = qemu_io_nbd(&sock, "write -P 0x3c 0 64k");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0x3c 0 64k");
    assert!(ok && !out.contains("fail"), "{out}");
    // The handshake timeout closes every idle client, after its greeting.
    for s in &mut idle {
        assert_eq!(until_closed(s).len(), 0, "nothing after the greeting");
    }
}

#[test]
fn clients_over_max_clients_are_refused() {
    let Some(_) = tool("qemu-io") else { return };
    let dir = tempdir();
    let sock = dir.path().join("cap.sock");
    let _s = create(dir.path(), "t-nbd-cap", &sock, &["--max-clients", "1"]);
    let mut first = UnixStream::connect(&sock).unwrap();
    let mut hello = [0u8; 18];
    first.read_exact(&mut hello).unwrap();
    let mut second = UnixStream::connect(&sock).unwrap();
    assert!(until_closed(&mut second).is_empty(), "refused: no greeting");
    let (ok, _) = qemu_io_nbd(&sock, "read 0 4k");
    assert!(!ok, "qemu-io is refused while the one place is taken");
    drop(first);
    std::thread::sleep(Duration::from_millis(300));
    let (ok, out) = qemu_io_nbd(&sock, "read 0 4k");
    assert!(ok, "{out}");
    // A bad value is a usage error.
    let out = run(
        cryptblk()
            .args(["dm", "create", "t-nbd-cap0", "--table", "0 8 zero", "--nbd"])
            .arg(dir.path().join("x.sock"))
            .args(["--max-clients", "0"]),
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "--max-clients 0 is refused");
}
