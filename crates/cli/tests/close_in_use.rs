//! `close` never pulls a disk from under its user (issue 28): while the volume is in use (a
//! loop device over the FUSE file with ext4 mounted on it, a connected NBD client) `close`
//! is refused as cryptsetup refuses it ("Device NAME is still in use.", exit 5) and the
//! volume keeps serving; `status` says "is active and is in use."; `close --deferred` closes
//! after the last user has gone and `close --cancel-deferred` takes that back.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Waits until `cond` holds, `limit` at most (then fails naming `what`).
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A LUKS2 volume image (fast PBKDF) and its key file in `dir`.
fn volume(dir: &Path) -> (PathBuf, PathBuf) {
    let key = write_file(dir, "key", b"in use test key");
    let img = dir.join("vol.img");
    sparse_file(&img, 64 << 20);
    run_ok(
        cryptblk()
            .args(["luksFormat", "--batch-mode", "--type", "luks2"])
            .args(FAST)
            .arg("--key-file")
            .arg(&key)
            .arg(&img),
        b"",
    );
    (img, key)
}

/// `cryptblk close ARGS.. NAME`: (exit code, stdout, stderr).
fn close(name: &str, args: &[&str]) -> (i32, String, String) {
    let out = run(cryptblk().arg("close").args(args).arg(name), b"");
    (
        exit_code(&out),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts that `close NAME` is refused as cryptsetup refuses a busy device.
fn assert_close_refused(name: &str) {
    let (code, _, err) = close(name, &[]);
    assert_eq!(code, 5, "close of a volume in use: {err}");
    assert!(
        err.contains(&format!("Device {name} is still in use.")),
        "cryptsetup's message: {err}"
    );
}

/// The first line of the plain `status NAME`.
fn status_line(name: &str) -> String {
    let out = run_ok(cryptblk().args(["status", name]), b"");
    out.lines().next().unwrap_or_default().to_string()
}

/// True while `status NAME` answers (the daemon serves the volume).
fn served(name: &str) -> bool {
    run(cryptblk().args(["status", "--json", name]), b"")
        .status
        .success()
}

/// Users `status --json` reports.
fn users(name: &str) -> u64 {
    status(name)["users"]
        .as_u64()
        .expect("status reports users")
}

#[test]
fn a_mounted_fuse_loop_device_holds_the_volume_open() {
    assert!(
        can_loop_mount(&[]),
        "losetup, mkfs.ext4, fsck.ext4, mount, fusermount3 needed"
    );
    let dir = tempdir();
    let (img, key) = volume(dir.path());
    let name = "t-inuse-fuse";
    let fl = FuseLoop::new(dir.path(), name);
    let fs = &fl.fs;
    fl.open(&img, &key);
    assert_eq!(
        status_line(name),
        format!("{} is active.", fl.disk().display())
    );
    assert_eq!(users(name), 0);

    let lo = sh(
        "losetup",
        &[&"-f", &"--show", &"--direct-io=on", &fl.disk()],
    )
    .trim()
    .to_string();
    sh("mkfs.ext4", &[&"-q", &lo]);
    sh("mount", &[&lo, fs]);
    std::fs::write(fs.join("before.txt"), b"written before close\n").unwrap();

    assert_close_refused(name);
    assert_eq!(
        status_line(name),
        format!("{} is active and is in use.", fl.disk().display())
    );
    assert!(users(name) >= 1);
    // Still served: the file system writes and syncs through the refused close.
    std::fs::write(fs.join("after.txt"), b"written after the refused close\n").unwrap();
    sh("sync", &[&fs.join("after.txt")]);

    sh("umount", &[fs]);
    // Checked while the volume is still served, through the same loop device.
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("losetup", &[&"-d", &lo]);
    // The kernel releases the file after losetup returns.
    wait_for("the loop device to let go", Duration::from_secs(5), || {
        users(name) == 0
    });
    assert_eq!(
        status_line(name),
        format!("{} is active.", fl.disk().display())
    );
    let (code, _, err) = close(name, &[]);
    assert_eq!(code, 0, "close of an unused volume: {err}");
    assert!(!served(name), "closed");

    // The data made it: reopened, the file system is clean and holds both files.
    fl.open(&img, &key);
    let lo = sh("losetup", &[&"-f", &"--show", &fl.disk()])
        .trim()
        .to_string();
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("mount", &[&lo, fs]);
    assert_eq!(
        std::fs::read(fs.join("after.txt")).unwrap(),
        b"written after the refused close\n"
    );
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
}

#[test]
fn a_deferred_close_waits_for_the_last_user_and_can_be_cancelled() {
    assert!(
        can_loop_mount(&[]),
        "losetup, mkfs.ext4, fsck.ext4, mount, fusermount3 needed"
    );
    let dir = tempdir();
    let (img, key) = volume(dir.path());
    let name = "t-inuse-defer";
    let fl = FuseLoop::new(dir.path(), name);
    let fs = &fl.fs;
    fl.open(&img, &key);
    let lo = sh(
        "losetup",
        &[&"-f", &"--show", &"--direct-io=on", &fl.disk()],
    )
    .trim()
    .to_string();
    sh("mkfs.ext4", &[&"-q", &lo]);
    sh("mount", &[&lo, fs]);

    // Both flags at once: cryptsetup's refusal.
    let (code, _, err) = close(name, &["--deferred", "--cancel-deferred"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Options --cancel-deferred and --deferred cannot be used at the same time."),
        "{err}"
    );

    let (code, out, err) = close(name, &["--deferred"]);
    assert_eq!(code, 0, "deferred close of a volume in use: {err}");
    assert_eq!(
        out,
        format!("Device {name} is still active and scheduled for deferred removal.\n")
    );
    assert_eq!(status(name)["deferred_remove"], true);
    assert!(run_ok(cryptblk().args(["status", name]), b"").contains("  deferred:"));

    // Cancelled: the last user leaving no longer closes it.
    let (code, _, err) = close(name, &["--cancel-deferred"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(status(name)["deferred_remove"], false);
    assert!(!run_ok(cryptblk().args(["status", name]), b"").contains("  deferred:"));
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
    wait_for("the loop device to let go", Duration::from_secs(5), || {
        users(name) == 0
    });
    // The daemon closes a deferred volume right after the request that finds it unused:
    // a second answer proves it stayed.
    assert!(served(name), "a cancelled deferred close keeps the volume");

    // Deferred again, while mounted: the volume serves until the last user has gone.
    let lo = sh(
        "losetup",
        &[&"-f", &"--show", &"--direct-io=on", &fl.disk()],
    )
    .trim()
    .to_string();
    sh("mount", &[&lo, fs]);
    let (code, out, err) = close(name, &["--deferred"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("scheduled for deferred removal"), "{out}");
    std::fs::write(
        fs.join("deferred.txt"),
        b"written while a close was deferred\n",
    )
    .unwrap();
    sh("sync", &[&fs.join("deferred.txt")]);
    assert!(served(name), "still served while mounted");
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
    wait_for(
        "the deferred close after the last user",
        Duration::from_secs(10),
        || !served(name),
    );
    wait_for("the FUSE mount to go", Duration::from_secs(5), || {
        !fl.disk().exists()
    });

    // Everything written reached the image: reopened, clean, the file is there.
    fl.open(&img, &key);
    let lo = sh("losetup", &[&"-f", &"--show", &fl.disk()])
        .trim()
        .to_string();
    sh("fsck.ext4", &[&"-fn", &lo]);
    sh("mount", &[&lo, fs]);
    assert_eq!(
        std::fs::read(fs.join("deferred.txt")).unwrap(),
        b"written while a close was deferred\n"
    );
    sh("umount", &[fs]);
    sh("losetup", &[&"-d", &lo]);
    wait_for("the loop device to let go", Duration::from_secs(5), || {
        users(name) == 0
    });

    // Deferred on an unused volume: closed at once, as the kernel's deferred removal.
    let (code, out, err) = close(name, &["--deferred"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "", "nothing scheduled");
    assert!(!served(name), "closed at once");
}

/// `qemu-io` on an NBD URI, reading commands from a pipe: a client that stays connected
/// until told to quit.
struct QemuIo {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl QemuIo {
    fn connect(uri: &str) -> QemuIo {
        let mut child = Command::new("qemu-io")
            .args(["-f", "raw", uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("qemu-io runs");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        QemuIo {
            child,
            stdin,
            lines,
        }
    }

    /// Runs one command; waits (10 s at most) for an output line containing `expect`.
    fn command(&mut self, cmd: &str, expect: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(expect) => return,
                Ok(_) => {}
                Err(e) => panic!("qemu-io `{cmd}`: no `{expect}` ({e})"),
            }
        }
    }

    /// `quit`, then waits (10 s at most) for the process to end.
    fn quit(mut self) {
        let mut stdin = self.stdin.take().unwrap();
        writeln!(stdin, "quit").unwrap();
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().unwrap().is_none() {
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

#[test]
fn a_connected_nbd_client_holds_the_volume_open() {
    assert!(tool("qemu-io").is_some(), "qemu-io is needed");
    let dir = tempdir();
    let (img, key) = volume(dir.path());
    let name = "t-inuse-nbd";
    let sock = dir.path().join("nbd.sock");
    let _served = open_nbd(&img, &key, name, &sock, &[]);
    assert_eq!(status_line(name), format!("{} is active.", sock.display()));

    let mut client = QemuIo::connect(&nbd_uri(&sock));
    client.command("write -P 0x5a 0 4k", "wrote 4096/4096");
    assert_eq!(
        status_line(name),
        format!("{} is active and is in use.", sock.display())
    );
    assert_eq!(users(name), 1);
    assert_close_refused(name);
    // The client was not dropped: it still reads what it wrote.
    client.command("read -P 0x5a 0 4k", "read 4096/4096");
    client.quit();

    wait_for(
        "the server to see the client go",
        Duration::from_secs(5),
        || users(name) == 0,
    );
    assert_eq!(status_line(name), format!("{} is active.", sock.display()));
    let (code, _, err) = close(name, &[]);
    assert_eq!(code, 0, "close after the client left: {err}");
    assert!(!served(name), "closed");
}
