//! The daemon's control protocol version, both directions, through the real binary:
//!
//! - `daemon_refuses_requests_of_other_versions`: a served mapping answers a request without
//!   a version (a cryptblk from before versions) and one of a newer version with a clear
//!   refusal, acts on neither, and keeps serving this version's requests.
//! - `client_refuses_a_daemon_from_before_versions`: against a daemon that answers as one
//!   from before versions did, `status` and `dm suspend` exit 1 with the message saying to
//!   close and reopen; `close` still ends it.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Sends one raw line to the control socket at `ctl` and returns the raw answer line.
fn raw_request(ctl: &Path, line: &str) -> String {
    let mut s = UnixStream::connect(ctl).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    answer
}

#[test]
fn daemon_refuses_requests_of_other_versions() {
    let dir = tempdir();
    let sock = dir.path().join("nbd.sock");
    run_ok(
        cryptblk()
            .args([
                "dm",
                "create",
                "t-proto-new",
                "--table",
                "0 8 zero",
                "--nbd",
            ])
            .arg(&sock),
        b"",
    );
    let ctl = runtime_dir().join("t-proto-new.ctl");
    let old: serde_json::Value =
        serde_json::from_str(&raw_request(&ctl, "{\"cmd\":\"close\"}\n")).unwrap();
    assert_eq!(old["ok"], false, "{old}");
    assert_eq!(old["code"], 1, "{old}");
    assert_eq!(
        old["error"],
        "this daemon speaks control protocol 1, the request is protocol 0; use the cryptblk \
         version that opened the volume"
    );
    let newer: serde_json::Value = serde_json::from_str(&raw_request(
        &ctl,
        "{\"v\":2,\"request\":{\"cmd\":\"suspend\"}}\n",
    ))
    .unwrap();
    assert_eq!(newer["ok"], false, "{newer}");
    assert_eq!(newer["v"], 1, "{newer}");
    assert!(
        newer["error"]
            .as_str()
            .unwrap()
            .contains("the request is protocol 2"),
        "{newer}"
    );
    // Neither closed nor suspended it.
    let st: serde_json::Value = serde_json::from_str(&run_ok(
        cryptblk().args(["status", "--json", "t-proto-new"]),
        b"",
    ))
    .unwrap();
    assert_eq!(st["ok"], true, "{st}");
    assert_eq!(st["suspended"], false, "{st}");
    run_ok(cryptblk().args(["close", "t-proto-new"]), b"");
    assert!(!ctl.exists());
}

/// Answers each connection on `listener` as a daemon from before versions did (commands at
/// the top level; an envelope is an unknown request), until it is asked to close.
fn protocol_0_daemon(listener: UnixListener, ctl: std::path::PathBuf) -> Vec<String> {
    let mut seen = Vec::new();
    for stream in listener.incoming() {
        let stream = stream.unwrap();
        let mut line = String::new();
        BufReader::new(stream.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        let req: serde_json::Value = serde_json::from_str(&line).unwrap();
        let closing = req["cmd"] == "close";
        let answer = if closing {
            "{\"ok\":true}\n".to_string()
        } else {
            format!(
                "{{\"ok\":false,\"code\":1,\"error\":\"unknown request '{}'\"}}\n",
                req["cmd"].as_str().unwrap_or("")
            )
        };
        seen.push(line);
        if closing {
            // As a real daemon: the socket goes before the answer's reader sees it gone.
            std::fs::remove_file(&ctl).unwrap();
        }
        (&stream).write_all(answer.as_bytes()).unwrap();
        if closing {
            break;
        }
    }
    seen
}

#[test]
fn client_refuses_a_daemon_from_before_versions() {
    let ctl = runtime_dir().join("t-proto-old.ctl");
    let _ = std::fs::remove_file(&ctl);
    let listener = UnixListener::bind(&ctl).unwrap();
    let daemon = {
        let ctl = ctl.clone();
        std::thread::spawn(move || protocol_0_daemon(listener, ctl))
    };
    let refusal = "daemon for t-proto-old speaks control protocol 0, this cryptblk speaks 1; \
                   close and reopen the volume with this version\n";
    for args in [
        &["status", "t-proto-old"][..],
        &["dm", "suspend", "t-proto-old"],
        &["dm", "table", "t-proto-old"],
    ] {
        let out = run(cryptblk().args(args), b"");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), refusal, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    run_ok(cryptblk().args(["close", "t-proto-old"]), b"");
    let seen = daemon.join().unwrap();
    // Three envelopes it could not act on, then close: the envelope, and its own form.
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(seen[..4]
        .iter()
        .all(|l| l.starts_with("{\"v\":1,\"request\":")));
    assert_eq!(seen[4], "{\"cmd\":\"close\"}\n");
    let t = Instant::now();
    while ctl.exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!ctl.exists());
}

/// A client that connects to a daemon's control socket and then sends nothing does not hold
/// the daemon's other clients off for good: it is dropped after the daemon's client timeout
/// and `status` is answered. (Before the timeout existed, `status` waited forever; the test
/// gives it a minute and fails rather than hang.)
#[test]
fn a_silent_control_client_does_not_block_the_others() {
    let dir = tempdir();
    let sock = dir.path().join("nbd.sock");
    run_ok(
        cryptblk()
            .args([
                "dm",
                "create",
                "t-proto-silent",
                "--table",
                "0 8 zero",
                "--nbd",
            ])
            .arg(&sock),
        b"",
    );
    let ctl = runtime_dir().join("t-proto-silent.ctl");
    let silent = UnixStream::connect(&ctl).unwrap();
    let mut status = cryptblk()
        .args(["status", "--json", "t-proto-silent"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let finished = loop {
        if let Some(st) = status.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = status.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = status.wait_with_output().unwrap();
    drop(silent);
    run_ok(cryptblk().args(["close", "t-proto-silent"]), b"");
    let finished = finished.expect("status never answered while a silent client was connected");
    assert!(finished.success());
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["ok"], true, "{st}");
}

/// A daemon answers only its owner: run as an ordinary user, it refuses root's request (root
/// can reach any socket) with exit class 2 and does not act on it.
#[test]
fn the_daemon_answers_only_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    require_root("to run a daemon as uid 65534 and connect to it as root");
    tool("setpriv").expect("setpriv (util-linux) runs the daemon as another user");
    let dir = tempdir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&rt, Some(65534), Some(65534)).unwrap();
    let sock = rt.join("nbd.sock");
    run_ok(
        as_nobody(&rt)
            .args([
                "dm",
                "create",
                "t-proto-owner",
                "--table",
                "0 8 zero",
                "--nbd",
            ])
            .arg(&sock),
        b"",
    );
    let ctl = rt.join("t-proto-owner.ctl");
    // The refusal comes before the request is read, so the write may find the connection
    // already closed; what matters is the answer and that nothing was done.
    let mut s = UnixStream::connect(&ctl).unwrap();
    let _ = s.write_all(b"{\"v\":1,\"request\":{\"cmd\":\"close\"}}\n");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
    let still: serde_json::Value = serde_json::from_str(&run_ok(
        as_nobody(&rt).args(["status", "--json", "t-proto-owner"]),
        b"",
    ))
    .unwrap();
    run_ok(as_nobody(&rt).args(["close", "t-proto-owner"]), b"");
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["code"], 2, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("answers only uid 65534, not 0"),
        "{answer}"
    );
    assert_eq!(still["ok"], true, "root's close was not acted on: {still}");
}
