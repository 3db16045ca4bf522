//! Starting a daemon: run `cryptblk __serve` detached, hand it the spec through a pipe, and
//! wait for its one-line verdict, `READY <facts>` or `ERROR <code> <message>` (a successor
//! taking a ublk device over says `TAKING` first: its predecessor exits on it). Both ends of
//! that pipe are here: the parent's [`spawn_stack`] and [`spawn_successor`], and the
//! daemon's [`read_handover`], [`report_taking_over`], [`report_ready`] and [`report_error`].

use crate::exit::{ExitCode, Failure};
use cryptblk_volume::control as client;
use cryptblk_volume::serve::{
    check_stack, HandedFd, Handover, Inherited, LowerTable, ReadyFacts, ServeSpec, Succession,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use zeroize::Zeroizing;

/// What `cryptblk __serve` reads from its stdin.
#[derive(Serialize)]
struct DaemonSpecRef<'a> {
    spec: &'a ServeSpec,
    lower: &'a [LowerTable],
    /// Listening sockets inherited from a predecessor (`upgrade`): the i-th is descriptor
    /// `FIRST_INHERITED_FD + i`.
    #[serde(skip_serializing_if = "<[HandedFd]>::is_empty")]
    fds: &'a [HandedFd],
}

/// The first descriptor a successor inherits (after stdin, stdout, stderr).
const FIRST_INHERITED_FD: RawFd = 3;

/// How long a successor may take to serve before `upgrade` gives up on it (it unlocks
/// nothing: this is building the stack and starting the export).
const SUCCESSOR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The daemon's side of [`DaemonSpecRef`].
#[derive(Deserialize)]
struct DaemonSpec {
    spec: ServeSpec,
    #[serde(default)]
    lower: Vec<LowerTable>,
    #[serde(default)]
    fds: Vec<HandedFd>,
}

/// Starts a daemon for `spec` and waits until it serves (or failed). Returns the daemon's
/// READY facts (pid, export address, lower mappings). `lower` (`dm create --lower`, else
/// empty) are created first, in order, in the same registry, each answering on its own
/// control socket.
pub fn spawn_stack(spec: &ServeSpec, lower: &[LowerTable]) -> Result<ReadyFacts, Failure> {
    check_stack(spec, lower)?;
    let log = client::runtime_dir()?.join(format!("{}.log", spec.name));
    let log_file = create_log(&log)?;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("__serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        // A detached daemon is no service manager's main process: only `--foreground`
        // speaks sd_notify (cryptblk_systemd::notify).
        .env_remove("NOTIFY_SOCKET");
    // Detach from the terminal's session so the daemon outlives the shell that opened it.
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no Rust state.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let text = Zeroizing::new(
            serde_json::to_string(&DaemonSpecRef {
                spec,
                lower,
                fds: &[],
            })
            .expect("spec serialises"),
        );
        stdin.write_all(text.as_bytes())?;
    }
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout is piped")).read_line(&mut line)?;
    if let Some(rest) = line.strip_prefix("READY ") {
        return serde_json::from_str(rest)
            .map_err(|e| Failure::device(format!("malformed READY line from the daemon: {e}")));
    }
    let _ = child.wait();
    let detail = line
        .strip_prefix("ERROR ")
        .map(str::to_string)
        .unwrap_or_else(|| format!("daemon exited before serving; see {}", log.display()));
    let (code, msg) = match detail.split_once(' ') {
        Some((c, m)) if c.parse::<i64>().is_ok() => (c.parse::<i64>().unwrap(), m.to_string()),
        _ => (ExitCode::WrongDevice as i64, detail.clone()),
    };
    Err(Failure::new(
        ExitCode::from_code(code),
        msg.trim().to_string(),
    ))
}

/// A fresh log file at `log`: the old one removed, the new one created exclusively without
/// following a symbolic link (mode 0600), so nothing planted under that name is written.
fn create_log(log: &std::path::Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(log) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Failure::device(format!(
                "cannot replace {}: {e}",
                log.display()
            )))
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(log)
        .map_err(|e| Failure::device(format!("cannot create {}: {e}", log.display())))
}

/// The daemon's side: the spec and the secret lower tables from stdin, or the exit status
/// to end with (after telling the parent why, when it can be told).
pub(super) fn read_handover() -> Result<(ServeSpec, Vec<LowerTable>, Inherited), i32> {
    let Ok(text) = read_wiped(std::io::stdin()) else {
        return Err(1);
    };
    match serde_json::from_slice::<DaemonSpec>(&text) {
        Ok(DaemonSpec { spec, lower, fds }) => {
            let mut owned = Vec::new();
            for (i, what) in fds.into_iter().enumerate() {
                let fd = FIRST_INHERITED_FD + i as RawFd;
                // SAFETY: F_SETFD on a descriptor number; fails harmlessly if it is closed.
                if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
                    println!("ERROR 1 inherited descriptor {fd} is not open");
                    return Err(1);
                }
                // SAFETY: the predecessor placed this socket at `fd` for us alone; it is
                // open (checked above) and nothing else in this process owns it.
                owned.push((what, unsafe { OwnedFd::from_raw_fd(fd) }));
            }
            match Inherited::new(owned) {
                Ok(inherited) => Ok((spec, lower, inherited)),
                Err(f) => {
                    println!("ERROR {} {}", f.code as i32, f.message);
                    Err(f.code as i32)
                }
            }
        }
        Err(e) => {
            println!("ERROR 1 malformed serve spec: {e}");
            Err(1)
        }
    }
}

/// Starts the successor of this daemon (`upgrade`): `BINARY __serve`, handed the spec
/// (keys included) through its stdin pipe, which only the two processes share, and the
/// listening sockets as descriptors 3, 4, ...; waits (at most [`SUCCESSOR_TIMEOUT`]) for
/// its READY line, or its TAKING line (it holds the stack and takes a ublk device over once
/// this process has exited). Its log is ours: it inherits stderr.
pub fn spawn_successor(h: Handover) -> Result<Succession, Failure> {
    let Handover {
        spec,
        lower,
        binary,
        fds,
    } = h;
    let kinds: Vec<HandedFd> = fds.iter().map(|(k, _)| k.clone()).collect();
    let raw: Vec<RawFd> = fds.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
    let mut cmd = Command::new(&binary);
    cmd.arg("__serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls (fcntl, dup2, close) on descriptors the parent
    // keeps open across the fork.
    unsafe {
        cmd.pre_exec(move || {
            let n = raw.len() as RawFd;
            // Out of the way first, so placing one never overwrites another's source.
            let mut moved = Vec::with_capacity(raw.len());
            for fd in &raw {
                let m = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, FIRST_INHERITED_FD + n);
                if m < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved.push(m);
            }
            for (i, m) in moved.iter().enumerate() {
                // dup2 leaves the new descriptor without close-on-exec: it is inherited.
                if libc::dup2(*m, FIRST_INHERITED_FD + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure::device(format!("cannot start {}: {e}", binary.display())))?;
    drop(fds);
    {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let text = Zeroizing::new(
            serde_json::to_string(&DaemonSpecRef {
                spec: &spec,
                lower: &lower,
                fds: &kinds,
            })
            .expect("spec serialises"),
        );
        drop((spec, lower));
        // A successor that died at once closed its end: its verdict (or silence) says why.
        let _ = stdin.write_all(text.as_bytes());
    }
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(SUCCESSOR_TIMEOUT) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::device(format!(
                "{} did not serve within {} s",
                binary.display(),
                SUCCESSOR_TIMEOUT.as_secs()
            )));
        }
    };
    if line.trim_end() == TAKING {
        // It outlives this process (reparented): nobody waits for it here.
        return Ok(Succession::TakingOver);
    }
    if let Some(rest) = line.strip_prefix("READY ") {
        return serde_json::from_str(rest)
            .map(Succession::Serving)
            .map_err(|e| {
                let _ = child.kill();
                Failure::device(format!("malformed READY line from the successor: {e}"))
            });
    }
    let status = child.wait();
    let why = match line.strip_prefix("ERROR ") {
        Some(detail) => detail
            .split_once(' ')
            .map_or(detail, |(_, m)| m)
            .trim()
            .to_string(),
        None => format!(
            "{} exited ({}) before serving",
            binary.display(),
            status.map_or_else(|e| e.to_string(), |s| s.to_string())
        ),
    };
    Err(Failure::device(why))
}

/// Everything `r` gives, in a buffer that never leaves an unwiped copy behind: the spec holds
/// the key, and a growing `Vec` would free its smaller copies as they are.
fn read_wiped(mut r: impl Read) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut out = Zeroizing::new(Vec::with_capacity(64 << 10));
    let mut buf = Zeroizing::new([0u8; 8192]);
    loop {
        let n = match r.read(&mut buf[..]) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if out.len() + n > out.capacity() {
            let mut bigger = Zeroizing::new(Vec::with_capacity((out.len() + n) * 2));
            bigger.extend_from_slice(&out);
            // Dropping the old buffer wipes it.
            out = bigger;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// The line a successor prints once it holds the stack and is about to take its
/// predecessor's ublk device over.
const TAKING: &str = "TAKING";

/// Tells the predecessor that this successor holds the stack and takes its ublk device over
/// once it has exited (it exits on reading this).
pub(super) fn report_taking_over() {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{TAKING}");
    let _ = out.flush();
}

/// Tells the parent the daemon serves, with `facts` for it to print.
pub(super) fn report_ready(facts: &ReadyFacts) {
    let mut ready = std::io::stdout();
    let facts = serde_json::to_string(facts).expect("facts serialise");
    let _ = writeln!(ready, "READY {facts}");
    let _ = ready.flush();
    // Closing stdout tells the parent we are up even if it stops reading.
    // SAFETY: fd 1 is ours; later prints go nowhere, logs go to stderr.
    unsafe { libc::close(1) };
}

/// Tells the parent why serving failed (a no-op once READY closed stdout).
pub(super) fn report_error(f: &Failure) {
    let _ = writeln!(std::io::stdout(), "ERROR {} {}", f.code as i32, f.message);
}
