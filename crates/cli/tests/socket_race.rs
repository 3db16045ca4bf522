//! Another local user never gets in through a socket the daemon creates, whatever the
//! caller's umask: `open --nbd PATH` and `open --vhost-user PATH` run under umask 000 while
//! an ordinary user (`cryptblk-test-other`) keeps connecting to PATH from before the open
//! until well after the socket exists. The connector must never get a connection, let
//! alone NBD's greeting or a vhost-user reply; the socket ends mode 0600 and nothing the
//! daemon made in its runtime directory is open to group or others.
//!
//! The window this closes (between `bind` and `chmod`) lasts microseconds, so strace delays
//! every `chmod` the daemon makes by 1.5 s: without the fix the connector gets in every
//! time, with it the delay changes nothing.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The racing client, run as the other user: connects to argv[1] in a loop and reports, as
/// one JSON line, how each attempt ended and every byte any connection received. It stops
/// 300 attempts and half a second after the path first exists (or after 30 s).
const CONNECTOR: &str = r#"
import errno, json, os, socket, sys, time
path, mode = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 30
counts, data, seen, seen_at = {}, b"", 0, None
print("started", flush=True)
while time.monotonic() < deadline:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        counts["connected"] = counts.get("connected", 0) + 1
        s.settimeout(5)
        try:
            if mode == "vhost":
                # VHOST_USER_GET_FEATURES (1), flags: version 1, no payload.
                s.sendall((1).to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(4))
            data += s.recv(64)
        except OSError:
            pass
    except OSError as e:
        name = errno.errorcode.get(e.errno, str(e.errno))
        counts[name] = counts.get(name, 0) + 1
    finally:
        s.close()
    if os.path.lexists(path):
        seen += 1
        seen_at = seen_at or time.monotonic()
        if seen >= 300 and time.monotonic() - seen_at > 0.5:
            break
print(json.dumps({"counts": counts, "data": data.hex(), "seen": seen}), flush=True)
"#;

/// A child killed and reaped when dropped, so a failing test leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` to exit, failing the test after `secs`.
fn wait_exit(child: &mut Child, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "{what} did not exit in {secs} s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the race against volume `name` served with `export_flag` (`--nbd`, `--vhost-user`);
/// `mode` tells the connector what to say once connected.
fn race(mode: &str, name: &str, export_flag: &str) {
    require_root("to act as another user and to create it");
    tool("strace").expect("strace widens the race window");
    // The system's python (a user's pyenv under /root is out of the other user's reach).
    let python = Path::new("/usr/bin/python3");
    assert!(python.exists(), "/usr/bin/python3 runs the racing client");
    let (uid, _) = other_user();
    let dir = tempdir();
    // A directory anyone may enter, as /tmp or /run: only the socket's mode protects it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socks = dir.path().join("socks");
    std::fs::create_dir(&socks).unwrap();
    // Everyone may create files here, as in /tmp (sticky, so nobody removes another's).
    std::fs::set_permissions(&socks, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let sock = socks.join(format!("{name}.sock"));
    let script = write_file(dir.path(), "connector.py", CONNECTOR.as_bytes());
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let key = write_file(dir.path(), "key", b"race passphrase");
    let img = dir.path().join("vol.img");
    cryptblk_luks2(&img, &key, 20 << 20);

    let mut connector = as_other_user(python);
    connector
        .arg(&script)
        .arg(&sock)
        .arg(mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut connector = Reaped(connector.spawn().unwrap());
    let mut out = std::io::BufReader::new(connector.0.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    if line.trim() != "started" {
        let _ = connector.0.kill();
        let mut err = String::new();
        std::io::Read::read_to_string(connector.0.stderr.as_mut().unwrap(), &mut err).unwrap();
        panic!("the connector did not start: {line}{err}");
    }

    // The open under umask 000, every chmod it makes delayed (the daemon outlives the open,
    // and strace with it: it is reaped after `close`).
    let log = dir.path().join("open.log");
    let mut open = Command::new("sh");
    open.args([
        "-c",
        "umask 000; exec \"$@\"",
        "sh",
        "strace",
        "-f",
        "-qq",
        "-o",
    ])
    .arg(dir.path().join("strace.out"))
    .args([
        "-e",
        "trace=chmod,fchmodat",
        "-e",
        "inject=chmod,fchmodat:delay_enter=1500000",
        env!("CARGO_BIN_EXE_cryptblk"),
        "open",
        "--key-file",
    ])
    .arg(&key)
    .arg(&img)
    .arg(name)
    .arg(export_flag)
    .arg(&sock)
    .env("CRYPTBLK_RUNTIME_DIR", &rt)
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&log).unwrap())
    .stderr(std::fs::File::create(dir.path().join("open.err")).unwrap());
    let mut traced = Reaped(open.spawn().unwrap());
    let close = || {
        let _ = run(
            cryptblk()
                .env("CRYPTBLK_RUNTIME_DIR", &rt)
                .args(["close", name]),
            b"",
        );
    };

    wait_exit(&mut connector.0, 40, "the connector");
    let mut report = String::new();
    std::io::Read::read_to_string(&mut out, &mut report).unwrap();
    let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap_or_else(|e| {
        close();
        panic!("connector report {report:?}: {e}")
    });
    // Served by now (the connector saw the socket): status answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !run(
        cryptblk()
            .env("CRYPTBLK_RUNTIME_DIR", &rt)
            .args(["status", name]),
        b"",
    )
    .status
    .success()
    {
        if Instant::now() > deadline {
            close();
            panic!(
                "{name} never served: {}",
                std::fs::read_to_string(dir.path().join("open.err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sock_mode = std::fs::metadata(&sock).map(|m| m.mode() & 0o7777);
    let leftovers: Vec<_> = std::fs::read_dir(&socks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let loose: Vec<_> = std::fs::read_dir(&rt)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.metadata().unwrap().mode() & 0o077 != 0)
        .map(|e| {
            format!(
                "{} (mode {:o})",
                e.file_name().to_string_lossy(),
                e.metadata().unwrap().mode() & 0o7777
            )
        })
        .collect();
    close();
    wait_exit(&mut traced.0, 30, "the traced daemon");

    eprintln!("{mode}: connector as uid {uid}: {report}");
    let counts = &report["counts"];
    assert_eq!(
        report["data"], "",
        "uid {uid} got data from the {mode} export: {report}"
    );
    assert!(
        counts.get("connected").is_none(),
        "uid {uid} connected to the {mode} export: {report}"
    );
    assert!(
        report["seen"].as_u64().unwrap() >= 300 && counts.get("EACCES").is_some(),
        "the connector did not keep trying once the socket existed: {report}"
    );
    assert_eq!(sock_mode.unwrap(), 0o600, "{mode} socket mode");
    assert_eq!(
        leftovers,
        vec![format!("{name}.sock")],
        "files beside the socket"
    );
    assert!(
        loose.is_empty(),
        "runtime directory entries open to others: {loose:?}"
    );
}

#[test]
fn nbd_socket_under_umask_000_never_lets_another_user_in() {
    race("nbd", "race-nbd", "--nbd");
}

#[test]
fn vhost_user_socket_under_umask_000_never_lets_another_user_in() {
    race("vhost", "race-vhost", "--vhost-user");
}
