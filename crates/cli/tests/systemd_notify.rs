//! cryptblk under systemd (issue 28 item 2): the `ExecStart=` command that
//! `cryptblk-generator` writes for a crypttab line, run as systemd runs a `Type=notify`
//! unit: with `NOTIFY_SOCKET` naming a datagram socket that this test reads as the manager
//! would. READY=1 must come only once the NBD export accepts a connection (the test
//! connects the moment READY arrives, and reads and writes through it with qemu-io), then
//! STATUS=, watchdog pings for `WATCHDOG_USEC`, and STOPPING=1 on `cryptblk close`.
//! Without a key file the unit asks through the real `systemd-ask-password`, answered by
//! this test acting as a password agent (systemd's agent protocol): a wrong passphrase is
//! asked again (`tries=`), and the passphrase is never on any process's command line.

mod common;
use common::*;

use cryptblk_systemd::{crypttab, plan, unit};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The argv of the unit's `ExecStart=` for crypttab line `line`.
fn exec_start(line: &str) -> Vec<String> {
    let (e, bad) = crypttab::parse(line);
    assert!(bad.is_empty(), "{bad:?}");
    let v = plan::plan(&e[0], &mut |w| panic!("unexpected warning: {w}"))
        .unwrap()
        .expect("a cryptblk line");
    let paths = unit::Paths {
        cryptblk: env!("CARGO_BIN_EXE_cryptblk").to_string(),
        ..unit::Paths::default()
    };
    unit::exec_start(&v, &paths)
}

/// The manager's end of NOTIFY_SOCKET.
struct Manager {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Manager {
    fn new(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        Manager { sock, path }
    }

    /// The next message, waiting at most `secs` while `child` runs.
    fn next(&self, child: &mut Child, secs: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        self.sock
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.recv(&mut buf) {
                Ok(n) => return String::from_utf8(buf[..n].to_vec()).unwrap(),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("notify socket: {e}"),
            }
            if let Some(st) = child.try_wait().unwrap() {
                let out = std::mem::replace(child, Command::new("true").spawn().unwrap())
                    .wait_with_output()
                    .unwrap();
                panic!(
                    "the service exited ({st}) before notifying: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(Instant::now() < deadline, "no notification within {secs} s");
        }
    }

    /// Messages up to and including the one that has `field` as a line.
    fn until(&self, child: &mut Child, field: &str, secs: u64) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let m = self.next(child, secs);
            let done = m.lines().any(|l| l == field);
            seen.push(m);
            if done {
                return seen;
            }
        }
    }
}

/// Waits (30 s at most) for `child` to exit; its status.
fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the service did not exit within 30 s of close");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The service's command run as systemd would run it (no stdin, NOTIFY_SOCKET set).
fn start_service(argv: &[String], m: &Manager, watchdog_usec: Option<u64>) -> Child {
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..])
        .env("CRYPTBLK_RUNTIME_DIR", runtime_dir())
        .env("NOTIFY_SOCKET", &m.path)
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match watchdog_usec {
        Some(u) => c.env("WATCHDOG_USEC", u.to_string()),
        None => c.env_remove("WATCHDOG_USEC"),
    };
    c.spawn().unwrap()
}

/// READY=1 has come: the export must take a connection now, and serve I/O through it.
fn check_ready_and_serving(ready: &str, name: &str, sock: &Path) {
    let conn = UnixStream::connect(sock);
    assert!(
        conn.is_ok(),
        "READY=1 sent before the NBD socket accepts: {conn:?}"
    );
    drop(conn);
    assert!(
        ready.lines().any(|l| l
            == format!(
                "STATUS=Serving {name} at nbd+unix:///?socket={}",
                sock.display()
            )),
        "{ready:?}"
    );
    let (ok, out) = qemu_io_nbd(sock, "write -P 0x5a 0 64k");
    assert!(ok, "{out}");
    let (ok, out) = qemu_io_nbd(sock, "read -P 0x5a 0 64k");
    assert!(ok, "{out}");
}

#[test]
fn notify_unit_with_a_key_file_is_ready_only_when_serving_and_stops_on_close() {
    tool("qemu-io").expect("qemu-io is needed");
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let key = write_file(dir.path(), "key", b"notify key file");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is needed");
    let sock = dir.path().join("nbd.sock");
    let name = "t-sdnotify-key";
    let argv = exec_start(&format!(
        "{name} {} {} luks,x-cryptblk.export=nbd:{}",
        img.display(),
        key.display(),
        sock.display()
    ));
    assert_eq!(
        argv[0],
        env!("CARGO_BIN_EXE_cryptblk"),
        "no shell with a key file"
    );
    let m = Manager::new(dir.path());
    let mut child = start_service(&argv, &m, Some(200_000));
    let _served = Served::volume(name);

    let msgs = m.until(&mut child, "READY=1", 60);
    let ready = msgs.last().unwrap();
    check_ready_and_serving(ready, name, &sock);
    // WATCHDOG_USEC=200000: pings every 100 ms.
    m.until(&mut child, "WATCHDOG=1", 10);

    run_ok(cryptblk().args(["close", name]), b"");
    let msgs = m.until(&mut child, "STOPPING=1", 30);
    assert!(msgs.iter().all(|s| !s.contains("notify key file")));
    let st = wait_exit(&mut child);
    assert!(st.success(), "{st}");
}

/// The manager's messages until one has `field` as a line, whoever sends them (the main
/// process may change), waiting at most `secs`.
fn messages_until(m: &Manager, field: &str, secs: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    m.sock
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match m.sock.recv(&mut buf) {
            Ok(n) => {
                let msg = String::from_utf8(buf[..n].to_vec()).unwrap();
                let done = msg.lines().any(|l| l == field);
                seen.push(msg);
                if done {
                    return seen;
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("notify socket: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "no {field} within {secs} s; got {seen:?}"
        );
    }
}

/// `cryptblk upgrade` of a unit's `open --foreground` (issue 28): the successor names itself
/// the unit's main process (`MAINPID=`) before the old one exits (0), then says READY=1;
/// the volume's data is served by it, and `close` stops it with STOPPING=1. (Before, such
/// an upgrade was refused: the old main process's exit would have ended the unit.)
#[test]
fn upgrade_under_a_notify_unit_hands_the_main_process_over() {
    tool("qemu-io").expect("qemu-io is needed");
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let key = write_file(dir.path(), "key", b"upgrade notify key");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is needed");
    let sock = dir.path().join("nbd.sock");
    let name = "t-sdnotify-upgrade";
    let argv = exec_start(&format!(
        "{name} {} {} luks,x-cryptblk.export=nbd:{}",
        img.display(),
        key.display(),
        sock.display()
    ));
    let m = Manager::new(dir.path());
    let mut child = start_service(&argv, &m, None);
    let _served = Served::volume(name);
    let msgs = m.until(&mut child, "READY=1", 60);
    check_ready_and_serving(msgs.last().unwrap(), name, &sock);

    run_ok(cryptblk().args(["upgrade", name]), b"");
    let st = wait_exit(&mut child);
    assert!(st.success(), "the old main process: {st}");
    let msgs = messages_until(&m, "READY=1", 30);
    let new_pid: u32 = msgs
        .iter()
        .flat_map(|s| s.lines())
        .find_map(|l| l.strip_prefix("MAINPID="))
        .unwrap_or_else(|| panic!("no MAINPID= before READY=1: {msgs:?}"))
        .parse()
        .unwrap();
    assert_ne!(new_pid, child.id(), "{msgs:?}");
    let first_mainpid = msgs.iter().position(|s| s.starts_with("MAINPID="));
    let ready = msgs.iter().position(|s| s.lines().any(|l| l == "READY=1"));
    assert!(first_mainpid < ready, "MAINPID= must come first: {msgs:?}");
    let status = run_ok(cryptblk().args(["status", "--json", name]), b"");
    assert!(status.contains(&format!("\"pid\":{new_pid}")), "{status}");
    check_ready_and_serving(msgs.last().unwrap(), name, &sock);

    run_ok(cryptblk().args(["close", name]), b"");
    let msgs = messages_until(&m, "STOPPING=1", 30);
    assert!(msgs.iter().all(|s| !s.contains("upgrade notify key")));
    // Its socket goes last before it returns: it ends within moments (zombie or reaped).
    let gone = || {
        std::fs::read_to_string(format!("/proc/{new_pid}/stat")).map_or(true, |s| s.contains(") Z"))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone() {
        assert!(
            Instant::now() < deadline,
            "the new main process {new_pid} still runs 10 s after close"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_detached_open_does_not_notify() {
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let key = write_file(dir.path(), "key", b"detached key");
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is needed");
    let sock = dir.path().join("nbd.sock");
    let m = Manager::new(dir.path());
    let name = "t-sdnotify-detached";
    run_ok(
        cryptblk()
            .env("NOTIFY_SOCKET", &m.path)
            .args(["open", "--key-file"])
            .arg(&key)
            .arg(&img)
            .arg(name)
            .arg("--nbd")
            .arg(&sock),
        b"",
    );
    let served = Served::volume(name);
    // `close` returns once the daemon's socket is gone, after the point where a foreground
    // open sends STOPPING=1: anything sent would be queued by now.
    drop(served);
    m.sock.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let r = m.sock.recv(&mut buf);
    assert!(
        matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a detached daemon notified: {:?}",
        r.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    );
}

/// systemd's password agent protocol, for one request: waits (`secs` at most) for a new
/// `/run/systemd/ask-password/ask.*` file whose `Id=` is `id`, and answers on its `Socket=`
/// with `+` and the passphrase. Returns the request's text.
fn answer_password(id: &str, pass: &[u8], answered: &mut Vec<PathBuf>, secs: u64) -> String {
    let dir = Path::new("/run/systemd/ask-password");
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let is_ask = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ask."));
            if !is_ask || answered.contains(&p) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            if !text.lines().any(|l| l == format!("Id={id}")) {
                continue;
            }
            let Some(socket) = text.lines().find_map(|l| l.strip_prefix("Socket=")) else {
                continue; // still being written
            };
            let mut reply = b"+".to_vec();
            reply.extend_from_slice(pass);
            UnixDatagram::unbound()
                .unwrap()
                .send_to(&reply, socket)
                .unwrap();
            answered.push(p);
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no password request with Id={id} within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process's command line holding `secret`.
fn processes_with(secret: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            if c.windows(secret.len()).any(|w| w == secret) {
                found.push(String::from_utf8_lossy(&c).replace('\0', " "));
            }
        }
    }
    found
}

#[test]
fn notify_unit_without_a_key_asks_systemd_ask_password_and_retries() {
    tool("qemu-io").expect("qemu-io is needed");
    tool("systemd-ask-password").expect("systemd-ask-password is needed");
    require_root("systemd-ask-password answers only root's agents");
    let dir = tempdir();
    let img = dir.path().join("vol.img");
    let pass = b"asked passphrase 28";
    let key = write_file(dir.path(), "key", pass);
    cryptsetup_luks2(&img, &key, 32 << 20).expect("cryptsetup is needed");
    let sock = dir.path().join("nbd.sock");
    let name = "t-sdnotify-ask";
    let argv = exec_start(&format!(
        "{name} {} none x-cryptblk.export=nbd:{},tries=2",
        img.display(),
        sock.display()
    ));
    assert_eq!(argv[0], "/bin/sh");
    let m = Manager::new(dir.path());
    let mut child = start_service(&argv, &m, None);
    let _served = Served::volume(name);

    // No token in the header: the unit asks, a wrong answer is asked again.
    let id = format!("cryptblk:{name}");
    let mut answered = Vec::new();
    let first = answer_password(&id, b"wrong passphrase", &mut answered, 60);
    assert!(
        first.contains(&format!("Message=Please enter passphrase for disk {name}:")),
        "{first}"
    );
    answer_password(&id, pass, &mut answered, 60);
    let msgs = m.until(&mut child, "READY=1", 60);
    assert!(
        processes_with(pass).is_empty(),
        "{:?}",
        processes_with(pass)
    );
    check_ready_and_serving(msgs.last().unwrap(), name, &sock);

    run_ok(cryptblk().args(["close", name]), b"");
    m.until(&mut child, "STOPPING=1", 30);
    let st = wait_exit(&mut child);
    assert!(st.success(), "{st}");
}

#[test]
fn plain_unit_without_a_key_takes_the_asked_line_as_a_passphrase() {
    // cryptsetup hashes an asked plain passphrase and would not hash a key file: data the
    // unit wrote must read back through `open --type plain` given the same passphrase on
    // standard input (to the newline), as a user would type it.
    tool("qemu-io").expect("qemu-io is needed");
    tool("systemd-ask-password").expect("systemd-ask-password is needed");
    require_root("systemd-ask-password answers only root's agents");
    let dir = tempdir();
    let img = dir.path().join("plain.img");
    sparse_file(&img, 8 << 20);
    let sock = dir.path().join("nbd.sock");
    let name = "t-sdnotify-plain";
    let opts = "plain,cipher=aes-xts-plain64,size=256,hash=sha256";
    let argv = exec_start(&format!(
        "{name} {} none {opts},x-cryptblk.export=nbd:{}",
        img.display(),
        sock.display()
    ));
    let m = Manager::new(dir.path());
    let mut child = start_service(&argv, &m, None);
    let served = Served::volume(name);
    let mut answered = Vec::new();
    answer_password(
        &format!("cryptblk:{name}"),
        b"plain words",
        &mut answered,
        60,
    );
    let msgs = m.until(&mut child, "READY=1", 60);
    check_ready_and_serving(msgs.last().unwrap(), name, &sock);
    drop(served);
    m.until(&mut child, "STOPPING=1", 30);
    assert!(wait_exit(&mut child).success());

    let again = "t-sdnotify-plain2";
    run_ok(
        cryptblk()
            .args(["open", "--type", "plain", "--cipher", "aes-xts-plain64"])
            .args(["--key-size", "256", "--hash", "sha256"])
            .arg(&img)
            .arg(again)
            .arg("--nbd")
            .arg(&sock),
        b"plain words\n",
    );
    let _again = Served::volume(again);
    let (ok, out) = qemu_io_nbd(&sock, "read -P 0x5a 0 64k");
    assert!(ok && !out.contains("Pattern verification failed"), "{out}");
}
