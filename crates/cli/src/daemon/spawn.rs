//! Starting a daemon: run `cryptblk __serve` detached, hand it the spec through a pipe, and
//! wait for its one-line verdict, `READY <facts>` or `ERROR <code> <message>`. Both ends of
//! that pipe are here: the parent's [`spawn_stack`] and the daemon's [`read_handover`],
//! [`report_ready`] and [`report_error`].

use crate::exit::{ExitCode, Failure};
use cryptblk_volume::control as client;
use cryptblk_volume::serve::{check_stack, LowerTable, ReadyFacts, ServeSpec};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use zeroize::Zeroizing;

/// What `cryptblk __serve` reads from its stdin.
#[derive(Serialize)]
struct DaemonSpecRef<'a> {
    spec: &'a ServeSpec,
    lower: &'a [LowerTable],
}

/// The daemon's side of [`DaemonSpecRef`].
#[derive(Deserialize)]
struct DaemonSpec {
    spec: ServeSpec,
    #[serde(default)]
    lower: Vec<LowerTable>,
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
            serde_json::to_string(&DaemonSpecRef { spec, lower }).expect("spec serialises"),
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
pub(super) fn read_handover() -> Result<(ServeSpec, Vec<LowerTable>), i32> {
    let Ok(text) = read_wiped(std::io::stdin()) else {
        return Err(1);
    };
    match serde_json::from_slice::<DaemonSpec>(&text) {
        Ok(DaemonSpec { spec, lower }) => Ok((spec, lower)),
        Err(e) => {
            println!("ERROR 1 malformed serve spec: {e}");
            Err(1)
        }
    }
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
