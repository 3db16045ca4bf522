//! The daemon's log as an operator needs it (issue 29): clients connecting and leaving and
//! I/O errors in it; under systemd (standard error is `$JOURNAL_STREAM`) every line carries
//! its syslog priority for journald; outside, `<name>.log` stays under its size cap. A FUSE
//! export logs its first open (with the opener's pid) and its last release.

mod common;
use common::*;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A table of 4 MiB `linear` on a fresh file then 4 MiB `error`.
fn table(dir: &Path) -> std::path::PathBuf {
    let img = dir.join("lin.img");
    sparse_file(&img, 4 << 20);
    write_file(
        dir,
        "table",
        format!("0 8192 linear {} 0\n8192 8192 error\n", img.display()).as_bytes(),
    )
}

/// Waits until `path` exists (a server's socket), 30 s at most.
fn wait_for_path(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn log_file_stays_under_its_cap_and_rotates() {
    let dir = tempdir();
    let table = table(dir.path());
    let sock = dir.path().join("r.sock");
    run_ok(
        cryptblk()
            .env("CRYPTBLK_LOG_MAX_BYTES", "4096")
            .args(["dm", "create", "log-rot", "--table-file"])
            .arg(&table)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let _served = Served::volume("log-rot");
    let log = runtime_dir().join("log-rot.log");
    let old = runtime_dir().join("log-rot.log.1");
    // Each client logs a connect and a close line (about 150 bytes): 60 of them are twice
    // the cap.
    for _ in 0..60 {
        let (ok, out) = qemu_io_nbd(&sock, "read 0 4k");
        assert!(ok, "{out}");
    }
    let now = std::fs::read_to_string(&log).expect("the current log");
    let before = std::fs::read_to_string(&old).expect("the rotated log exists");
    // The cap is checked before each record: a file ends at most one record past it.
    for (what, text) in [("log", &now), ("log.1", &before)] {
        assert!(text.len() <= 4096 + 512, "{what} is {} bytes", text.len());
    }
    assert!(
        before.contains("connected") && now.contains("connected"),
        "both files hold client lines:\n{before}\n---\n{now}"
    );
    assert!(
        now.lines()
            .any(|l| l.contains("client unix socket (pid ") && l.contains("connected")),
        "the client is named by pid and uid:\n{now}"
    );
    let mode = std::fs::metadata(&log).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "the new log is the owner's only");
}

#[test]
fn under_systemd_the_log_carries_syslog_priorities() {
    let dir = tempdir();
    let table = table(dir.path());
    let sock = dir.path().join("j.sock");
    // Standard error is this file, and JOURNAL_STREAM names it, as systemd sets both.
    let journal = dir.path().join("journal");
    let err = std::fs::File::create(&journal).unwrap();
    let meta = err.metadata().unwrap();
    let mut child = cryptblk()
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .args([
            "dm",
            "create",
            "log-journal",
            "--foreground",
            "--table-file",
        ])
        .arg(&table)
        .arg("--nbd")
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap();
    wait_for_path(&sock);
    let (ok, out) = qemu_io_nbd(&sock, "read 0 4k");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(&sock, "read 4M 4k");
    assert!(!ok, "a read of the error target fails: {out}");
    run_ok(cryptblk().args(["dm", "suspend", "log-journal"]), b"");
    run_ok(cryptblk().args(["dm", "resume", "log-journal"]), b"");
    run_ok(cryptblk().args(["close", "log-journal"]), b"");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the foreground daemon did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("<6>cryptblk_export::nbd") && l.contains("connected")),
        "client lines at priority 6 (info):\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("<3>") && l.contains("I/O error, read at sector 8192")),
        "the I/O error at priority 3 (err):\n{text}"
    );
    // The close itself fails: the error target fails the final flush, as the kernel's does.
    for event in [
        "starting",
        "ready, serving",
        "suspend",
        "resume",
        "Close",
        "closing",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("<6>") && l.contains(&format!("log-journal: {event}"))),
            "'{event}' logged at priority 6:\n{text}"
        );
    }
    // journald adds its own timestamps; lines carry none.
    assert!(!text.contains("[20"), "no timestamps:\n{text}");
}

/// Waits until the log at `path` has a line for which `pred` holds, 30 s at most; returns
/// the log.
fn wait_for_line(path: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().any(&pred) {
            return text;
        }
        assert!(Instant::now() < deadline, "no {what} line in:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fuse_export_logs_first_open_and_last_release() {
    use std::io::Read;
    let dir = tempdir();
    let table = table(dir.path());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run_ok(
        cryptblk()
            .args(["dm", "create", "log-fuse", "--table-file"])
            .arg(&table)
            .arg("--fuse")
            .arg(&mnt),
        b"",
    );
    let _served = Served::volume("log-fuse");
    let log = runtime_dir().join("log-fuse.log");
    let disk = mnt.join("disk");
    // Two opens at once: one line when the first comes, one when the last goes.
    let mut first = std::fs::File::open(&disk).unwrap();
    let second = std::fs::File::open(&disk).unwrap();
    let mut buf = [0u8; 4096];
    first.read_exact(&mut buf).unwrap();
    let me = format!("opened by pid {} ", std::process::id());
    let text = wait_for_line(&log, "first-open", |l| l.contains(&me));
    assert!(!text.contains("no longer in use"), "still open:\n{text}");
    drop(first);
    drop(second);
    let text = wait_for_line(&log, "last-release", |l| {
        // The daemon names the file under the canonical mount point.
        let disk = mnt.canonicalize().unwrap().join("disk");
        l.contains(&format!("FUSE {}: last open released", disk.display()))
    });
    let opens = text.lines().filter(|l| l.contains("opened by pid")).count();
    assert_eq!(opens, 1, "one line for the first of two opens:\n{text}");
}
