//! A served volume outlives its daemon (issue 28, "survive the daemon"): an NBD client that
//! reconnects (qemu's `reconnect-delay=`) carries on, data verified, after the daemon is
//! killed with SIGKILL and the same `open` is run again, and across `cryptblk upgrade`,
//! which replaces the daemon by a new process without failing a request.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long any one qemu-io command may take, reconnects included.
const STEP: Duration = Duration::from_secs(60);

/// An interactive `qemu-io` on the NBD export at a Unix socket, with qemu's own reconnect:
/// requests issued while the server is away wait (up to `reconnect-delay` seconds) and are
/// sent again once qemu is connected again.
struct QemuIo {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl QemuIo {
    fn connect(sock: &Path) -> QemuIo {
        let opts = format!(
            "driver=nbd,server.type=unix,server.path={},reconnect-delay=30",
            sock.display()
        );
        let mut child = Command::new("qemu-io")
            .args(["--image-opts", &opts])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-io runs");
        let stdin = child.stdin.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        QemuIo {
            child,
            stdin,
            lines,
        }
    }

    /// Runs one read or write command and waits for it to complete (qemu-io reads its next
    /// command only when stdin becomes readable again, so commands go one at a time).
    fn run(&mut self, cmd: &str, context: &str) {
        self.send(cmd);
        self.expect_done(1, context);
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("qemu-io takes commands");
        self.stdin.flush().unwrap();
    }

    /// Waits for `n` completed reads or writes and fails on any error qemu-io reports.
    fn expect_done(&mut self, n: usize, context: &str) {
        let mut done = 0;
        let deadline = Instant::now() + STEP;
        let mut seen = Vec::new();
        while done < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(l) => l,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{context}: qemu-io answered {done} of {n} requests: {seen:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{context}: qemu-io ended after {done} of {n}: {seen:?}")
                }
            };
            // Strip the prompt qemu-io may print before an answer.
            let text = line.trim_start_matches("qemu-io> ").to_string();
            let lower = text.to_ascii_lowercase();
            assert!(
                !(lower.contains("fail") || lower.contains("error") || lower.contains("mismatch")),
                "{context}: qemu-io reported {text:?} (after {seen:?})"
            );
            if text.starts_with("wrote ") || text.starts_with("read ") {
                done += 1;
            }
            seen.push(text);
        }
    }

    fn quit(mut self) {
        self.send("quit");
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "qemu-io exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "qemu-io did not quit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for QemuIo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A LUKS2 volume made by cryptsetup (key file `key`), opened over NBD at `sock`.
fn served_volume(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, Served) {
    let key = write_file(dir, "key", b"survive the daemon");
    let img = dir.join("vol.img");
    cryptsetup_luks2(&img, &key, 40 << 20).expect("cryptsetup formats");
    let sock = dir.join("nbd.sock");
    let served = open_nbd(&img, &key, name, &sock, &[]);
    (img, key, served)
}

fn daemon_pid(name: &str) -> i32 {
    status(name)["pid"].as_i64().expect("status has the pid") as i32
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Waits (bounded) until process `pid` is gone; the daemon is not our child, so its end is
/// seen by polling.
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + STEP;
    while alive(pid) {
        assert!(Instant::now() < deadline, "process {pid} did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The command writing 64 KiB block `i` filled with byte `seed + i`.
fn write_cmd(i: u32, seed: u8) -> String {
    format!(
        "write -P {} {} 64k",
        seed.wrapping_add(i as u8),
        u64::from(i) << 16
    )
}

/// Writes `count` 64 KiB blocks from block `first` ([`write_cmd`]).
fn writes(io: &mut QemuIo, first: u32, count: u32, seed: u8, context: &str) {
    for i in first..first + count {
        io.run(&write_cmd(i, seed), context);
    }
}

/// Reads back what [`writes`] wrote, qemu-io checking each byte (`-P`).
fn reads(io: &mut QemuIo, first: u32, count: u32, seed: u8, context: &str) {
    for i in first..first + count {
        let pattern = seed.wrapping_add(i as u8);
        io.run(
            &format!("read -P {pattern} {} 64k", u64::from(i) << 16),
            context,
        );
    }
}

/// Runs `during` while another thread writes block after block through `io` (from block
/// `first`); returns `io` and how many blocks were written once at least `before` were
/// written before `during` began and `after` after it returned.
fn writing_during(
    mut io: QemuIo,
    first: u32,
    seed: u8,
    (before, after): (u32, u32),
    during: impl FnOnce(),
) -> (QemuIo, u32) {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    let written = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, stop) = (written.clone(), stop.clone());
        std::thread::spawn(move || {
            // The volume holds 384 blocks past its header; 300 are plenty.
            while !stop.load(Ordering::SeqCst) && first + written.load(Ordering::SeqCst) < 300 {
                let i = first + written.load(Ordering::SeqCst);
                io.run(&write_cmd(i, seed), "writing across the upgrade");
                written.fetch_add(1, Ordering::SeqCst);
            }
            io
        })
    };
    let wait_for = |n: u32| {
        let deadline = Instant::now() + STEP;
        while written.load(Ordering::SeqCst) < n && !writer.is_finished() {
            assert!(
                Instant::now() < deadline,
                "writes stalled at {}",
                written.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_for(before);
    during();
    let at_end = written.load(Ordering::SeqCst);
    wait_for(at_end + after);
    stop.store(true, Ordering::SeqCst);
    let io = writer.join().expect("the writer thread failed");
    let n = written.load(Ordering::SeqCst);
    assert!(
        n >= at_end + after,
        "only {n} writes, {at_end} when the upgrade returned"
    );
    (io, n)
}

#[test]
fn an_nbd_client_with_reconnect_carries_on_after_kill_9_and_the_same_open() {
    let dir = tempdir();
    let name = "t-survive-kill";
    let (img, key, _served) = served_volume(dir.path(), name);
    let sock = dir.path().join("nbd.sock");
    let mut io = QemuIo::connect(&sock);
    writes(&mut io, 0, 32, 1, "before the kill");

    let pid = daemon_pid(name);
    // SAFETY: plain kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_gone(pid);
    // A dead daemon is not reported as active: `status` is cryptsetup's exit 4, `dm ls`
    // does not list it.
    let (code, text) = code(cryptblk().args(["status", name]));
    assert_eq!(code, 4, "status of a killed daemon: {text}");
    let ls = run_ok(cryptblk().args(["dm", "ls"]), b"");
    assert!(!ls.lines().any(|l| l == name), "dm ls lists it: {ls}");

    // A request issued while no daemon serves waits for the reconnect.
    io.send(&write_cmd(32, 1));
    // The same open again: the stale NBD socket, control socket and log of the killed
    // daemon must not stand in its way.
    std::mem::forget(open_nbd(&img, &key, name, &sock, &[]));
    io.expect_done(1, "across the kill and re-open");
    assert_ne!(daemon_pid(name), pid);
    writes(&mut io, 33, 31, 1, "after the re-open");
    reads(&mut io, 0, 64, 1, "reading back after the re-open");
    io.quit();
}

#[test]
fn upgrade_replaces_the_daemon_without_failing_a_request() {
    let dir = tempdir();
    let name = "t-survive-upg";
    let (img, key, _served) = served_volume(dir.path(), name);
    let sock = dir.path().join("nbd.sock");
    let before = status(name);
    let pid = daemon_pid(name);
    let mut io = QemuIo::connect(&sock);
    writes(&mut io, 0, 16, 7, "before the upgrade");

    // Writes go on, one after the other, while the daemon is replaced.
    let (mut io, n) = writing_during(io, 16, 7, (4, 8), || {
        let out = run(cryptblk().args(["upgrade", name]), b"");
        assert!(
            out.status.success(),
            "upgrade failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    // The old daemon exited; the volume is the same, served by a new process.
    wait_gone(pid);
    let after = status(name);
    assert_ne!(after["pid"], before["pid"]);
    for field in ["name", "size", "export", "info", "readonly"] {
        assert_eq!(
            after[field], before[field],
            "{field} changed across the upgrade"
        );
    }
    reads(&mut io, 0, 16 + n, 7, "reading back after the upgrade");
    // A new client connects to the new daemon.
    let (ok, text) = qemu_io_nbd(&sock, "read -P 7 0 64k");
    assert!(ok && !text.contains("fail"), "{text}");
    io.quit();
    // The key went through a pipe: not on the new daemon's command line or environment,
    // not in the log.
    let vk = cryptsetup_volume_key(&img, &key, &[]).expect("cryptsetup dumps the key");
    let new_pid = after["pid"].as_u64().unwrap();
    let log = runtime_dir().join(format!("{name}.log"));
    for file in [
        format!("/proc/{new_pid}/cmdline"),
        format!("/proc/{new_pid}/environ"),
        log.display().to_string(),
    ] {
        let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).to_lowercase();
        assert!(
            !text.contains(&vk.to_lowercase()),
            "the volume key is in {file}"
        );
    }
}

#[test]
fn upgrade_refuses_a_suspended_volume_and_it_serves_on() {
    let dir = tempdir();
    let name = "t-survive-susp";
    let (_img, _key, _served) = served_volume(dir.path(), name);
    let pid = daemon_pid(name);
    run_ok(cryptblk().args(["dm", "suspend", name]), b"");
    let out = run(cryptblk().args(["upgrade", name]), b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(exit_code(&out), 5, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("suspended"), "{err}");
    run_ok(cryptblk().args(["dm", "resume", name]), b"");
    assert_eq!(daemon_pid(name), pid);
    let (ok, text) = qemu_io_nbd(&dir.path().join("nbd.sock"), "write -P 9 0 64k");
    assert!(ok && !text.contains("fail"), "{text}");
}

#[test]
fn upgrade_to_a_binary_that_fails_keeps_the_old_daemon_serving() {
    let dir = tempdir();
    let name = "t-survive-bad";
    let (_img, _key, _served) = served_volume(dir.path(), name);
    let sock = dir.path().join("nbd.sock");
    let pid = daemon_pid(name);
    let mut io = QemuIo::connect(&sock);
    writes(&mut io, 0, 8, 3, "before the upgrade");
    // A "binary" that exits at once without serving.
    let bad = dir.path().join("bad-cryptblk");
    std::fs::write(&bad, "#!/bin/sh\necho broken >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&bad, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (mut io, n) = writing_during(io, 8, 3, (4, 8), || {
        let out = run(
            cryptblk().args(["upgrade", name, "--binary"]).arg(&bad),
            b"",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "upgrade to a broken binary succeeded"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains("serves on"), "{err}");
    });
    assert_eq!(daemon_pid(name), pid, "the old daemon no longer serves");
    reads(&mut io, 0, 8 + n, 3, "after the failed upgrade");
    io.quit();
}

#[test]
fn upgrade_refuses_a_fuse_export_and_an_unknown_volume() {
    let (code4, text) = code(cryptblk().args(["upgrade", "t-survive-none"]));
    assert_eq!(code4, 4, "{text}");
    if !can_loop_mount(&[]) {
        return;
    }
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"survive the daemon");
    let img = dir.path().join("vol.img");
    cryptsetup_luks2(&img, &key, 40 << 20).expect("cryptsetup formats");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let name = "t-survive-fuse";
    run_ok(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(name)
            .arg("--fuse")
            .arg(&mnt),
        b"",
    );
    let _served = Served::volume(name);
    let pid = daemon_pid(name);
    let out = run(cryptblk().args(["upgrade", name]), b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(exit_code(&out), 1, "{err}");
    assert!(err.contains("FUSE"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(daemon_pid(name), pid);
}

/// A stack (LUKS2 `--integrity`: dm-crypt over its `NAME_dif` integrity mapping) is handed
/// over whole: both mappings answer from the new daemon, and what was written reads back
/// (every read checked against its tag).
#[test]
fn upgrade_hands_over_a_stack_with_its_lower_mapping() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"survive the daemon");
    let img = dir.path().join("vol.img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    run_ok(
        luks_format_integrity("aes-xts-plain64", "hmac-sha256")
            .arg("--integrity-no-wipe")
            .args(FAST)
            .arg("-d")
            .arg(&key)
            .arg(&img),
        b"",
    );
    let name = "t-survive-stack";
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    let lower = format!("{name}_dif");
    let pid = daemon_pid(name);
    assert_eq!(status(&lower)["pid"].as_i64(), Some(i64::from(pid)));
    let (ok, text) = qemu_io_nbd(&sock, "write -P 5 0 256k");
    assert!(ok && !text.contains("fail"), "{text}");
    let out = run(cryptblk().args(["upgrade", name]), b"");
    assert!(
        out.status.success(),
        "upgrade failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_gone(pid);
    let new_pid = daemon_pid(name);
    assert_ne!(new_pid, pid);
    assert_eq!(status(&lower)["pid"].as_i64(), Some(i64::from(new_pid)));
    let ls = run_ok(cryptblk().args(["dm", "ls"]), b"");
    assert!(
        ls.lines().any(|l| l == name) && ls.lines().any(|l| l == lower),
        "{ls}"
    );
    let (ok, text) = qemu_io_nbd(&sock, "read -P 5 0 256k");
    assert!(ok && !text.contains("fail"), "{text}");
}

/// NBD on TCP port 0: the successor inherits the listener, so the port the kernel chose is
/// the port it serves on (its config still says 0).
#[test]
fn upgrade_keeps_an_nbd_tcp_port() {
    let dir = tempdir();
    let key = write_file(dir.path(), "key", b"survive the daemon");
    let img = dir.path().join("vol.img");
    cryptsetup_luks2(&img, &key, 40 << 20).expect("cryptsetup formats");
    let name = "t-survive-tcp";
    run_ok(
        cryptblk()
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(name)
            .args(["--nbd", "127.0.0.1:0"]),
        b"",
    );
    let _served = Served::volume(name);
    let before = status(name);
    let uri = before["export"]["uri"].as_str().unwrap().to_string();
    assert!(!uri.contains(":0/"), "{uri}");
    let io = |cmd: &str| {
        let out = run(
            Command::new("qemu-io").args(["-f", "raw", "-c", cmd, &uri]),
            b"",
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && !text.contains("fail"),
            "{cmd}: {text}"
        );
    };
    io("write -P 11 0 64k");
    run_ok(cryptblk().args(["upgrade", name]), b"");
    let after = status(name);
    assert_ne!(after["pid"], before["pid"]);
    assert_eq!(after["export"], before["export"]);
    io("read -P 11 0 64k");
}
