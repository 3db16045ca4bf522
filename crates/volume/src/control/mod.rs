//! Talking to the daemons that serve open volumes.
//!
//! Each open volume (or raw `dm create` mapping) is served by one daemon process. It listens
//! on a Unix control socket `<runtime dir>/<name>.ctl` for one [`Request`] per connection and
//! answers it with one [`Response`], each a JSON line (see [`protocol`] for the wire form and
//! its version). The runtime directory is private to the user (mode 0700), so only its owner
//! can reach a daemon; requests never carry passphrases, and key material appears only in
//! `reload` tables, which travel over this socket and never on a command line.

pub mod io_report;
pub mod protocol;

pub use io_report::{DirectionReport, IoReport, LatencyReport, TargetReport};

pub use protocol::{
    BackingStatus, ExportDescription, Pipeline, Queueing, Request, Response, Status,
    PROTOCOL_VERSION,
};

use crate::error::{ErrorClass, Result, VolumeError};
use cryptblk_cipher::SecretText;
use protocol::AnswerError;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The directory holding control sockets, logs and metadata of running daemons:
/// `$CRYPTBLK_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/cryptblk`, else `/run/cryptblk` for root,
/// else `/tmp/cryptblk-<uid>`. Created (mode 0700) if missing. Whoever controls this
/// directory can read keys sent to daemons and impersonate them, so it must be the caller's
/// own (see [`check_private_dir`]); it is refused otherwise, never repaired (its mode is
/// never changed).
pub fn runtime_dir() -> Result<PathBuf> {
    let dir = if let Some(d) = std::env::var_os("CRYPTBLK_RUNTIME_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("cryptblk")
    } else {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        if uid == 0 {
            PathBuf::from("/run/cryptblk")
        } else {
            PathBuf::from(format!("/tmp/cryptblk-{uid}"))
        }
    };
    let dir = std::path::absolute(&dir)?;
    // Refuse a hostile parent before creating anything in it.
    check_private_dir(&dir, true)?;
    if std::fs::symlink_metadata(&dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                VolumeError::usage(format!(
                    "cannot create runtime directory {}: {e}",
                    dir.display()
                ))
            })?;
    }
    check_private_dir(&dir, false)?;
    Ok(dir)
}

/// The effective uid of this process.
/// This process's effective uid: the owner of its runtime directory and of the daemons it
/// starts.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Checks that `dir` (absolute) is private to the caller: a real directory (no symbolic
/// link) owned by the caller and writable by nobody else; and that no other user can replace
/// it: every ancestor is owned by root or the caller and, when others may write it, sticky
/// (as `/tmp`); a symbolic link among the ancestors must be root's (as `/var/run`). With
/// `ancestors_only`, `dir` itself (which may not exist yet) is not checked, nor are missing
/// ancestors.
pub fn check_private_dir(dir: &Path, ancestors_only: bool) -> Result<()> {
    let me = euid();
    let refuse = |path: &Path, why: String| {
        let fix = "set CRYPTBLK_RUNTIME_DIR to a directory only you own and can write \
                   (mode 0700)";
        VolumeError::usage(if path == dir {
            format!(
                "unsafe runtime directory {}: it {why}; {fix}",
                dir.display()
            )
        } else {
            format!(
                "unsafe runtime directory {}: {} {why}; {fix}",
                dir.display(),
                path.display()
            )
        })
    };
    let mut path = PathBuf::new();
    let comps: Vec<_> = dir.components().collect();
    for (i, comp) in comps.iter().enumerate() {
        path.push(comp);
        let last = i + 1 == comps.len();
        if last && ancestors_only {
            break;
        }
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && ancestors_only => break,
            Err(e) => return Err(refuse(&path, format!("cannot be examined ({e})"))),
        };
        let mode = meta.permissions().mode();
        if meta.file_type().is_symlink() {
            if last || meta.uid() != 0 {
                return Err(refuse(
                    &path,
                    format!("is a symbolic link (owned by uid {})", meta.uid()),
                ));
            }
            continue;
        }
        if last {
            if !meta.is_dir() {
                return Err(refuse(&path, "is not a directory".into()));
            }
            if meta.uid() != me {
                return Err(refuse(
                    &path,
                    format!("is owned by uid {}, not by you (uid {me})", meta.uid()),
                ));
            }
            if mode & 0o022 != 0 {
                return Err(refuse(
                    &path,
                    format!("is writable by other users (mode {:o})", mode & 0o7777),
                ));
            }
        } else {
            if meta.uid() != 0 && meta.uid() != me {
                return Err(refuse(
                    &path,
                    format!(
                        "is owned by uid {}, who could replace what it holds",
                        meta.uid()
                    ),
                ));
            }
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(refuse(
                    &path,
                    format!(
                        "is writable by other users and not sticky (mode {:o})",
                        mode & 0o7777
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Connects to the control socket at `path` and checks that the process listening runs as
/// the caller: in a directory someone else reached, a stranger's listener
/// would otherwise receive the request and any key it carries.
pub fn connect(path: &Path) -> std::io::Result<UnixStream> {
    let stream = UnixStream::connect(path)?;
    let uid = peer_uid(&stream)?;
    if uid != euid() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("its listener runs as uid {uid}, not as you, so nothing is sent to it"),
        ));
    }
    Ok(stream)
}

/// The uid of the process at the other end of `stream` (`SO_PEERCRED`).
pub fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data; the kernel fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Checks that a mapping name is usable as a file name and as a dm name.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 127
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(VolumeError::usage(format!(
            "invalid mapping name '{name}' (use letters, digits, '-', '_', '.', '+')"
        )))
    }
}

/// Path of the control socket for `name`.
pub fn socket_path(name: &str) -> Result<PathBuf> {
    check_name(name)?;
    Ok(runtime_dir()?.join(format!("{name}.ctl")))
}

/// Names of the mappings whose daemons answer, sorted.
pub fn list() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(runtime_dir()?)? {
        let entry = entry?;
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".ctl")) else {
            continue;
        };
        if connect(&entry.path()).is_ok() {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Sends `req` to the daemon serving `name` and returns its answer.
///
/// A missing daemon is exit 4 ("device does not exist") as with cryptsetup; a refusal
/// ([`Response::Error`]) becomes the [`VolumeError`] carrying the daemon's message and class,
/// so an `Ok` answer is never [`Response::Error`]. A daemon speaking another protocol version
/// is refused (exit 1) with a message saying to close and reopen the volume; `close` itself
/// still reaches a daemon from before versions, so that advice can be followed.
pub fn request(name: &str, req: &Request) -> Result<Response> {
    request_at(&socket_path(name)?, name, req)
}

/// [`request`] for [`Request::Status`], returning the report.
pub fn status(name: &str) -> Result<Status> {
    match request(name, &Request::Status)? {
        Response::Status(s) => Ok(*s),
        other => Err(unexpected(name, &other)),
    }
}

/// [`request`] for [`Request::Table`], returning the live table (locked text, wiped on drop).
pub fn table(name: &str, showkeys: bool) -> Result<SecretText> {
    match request(name, &Request::Table { showkeys })? {
        Response::Table(t) => Ok(t),
        other => Err(unexpected(name, &other)),
    }
}

fn unexpected(name: &str, answer: &Response) -> VolumeError {
    VolumeError::device(format!(
        "daemon for {name} gave an unexpected answer: {answer:?}"
    ))
}

/// The request a daemon of protocol 0 (before versions) understood as `close`.
const CLOSE_PROTOCOL_0: &str = "{\"cmd\":\"close\"}\n";

/// [`request`] to the daemon listening at `path`.
fn request_at(path: &Path, name: &str, req: &Request) -> Result<Response> {
    let line = exchange(path, name, &req.encode())?;
    match Response::decode(&line, req) {
        Ok(answer) => answer.into_result(),
        // Closing is how a user leaves an old daemon behind (the refusal below says so),
        // and a daemon before versions ignored our envelope without acting: ask it its way.
        Err(AnswerError::Version(0)) if *req == Request::Close => {
            let line = exchange(path, name, CLOSE_PROTOCOL_0)?;
            let answer: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
                VolumeError::device(format!("daemon for {name} gave a malformed answer: {e}"))
            })?;
            if answer["ok"].as_bool() == Some(true) {
                Ok(Response::Done)
            } else {
                Err(VolumeError::new(
                    ErrorClass::WrongParameters,
                    answer["error"]
                        .as_str()
                        .unwrap_or("daemon refused the request")
                        .to_string(),
                ))
            }
        }
        Err(AnswerError::Version(theirs)) => Err(VolumeError::usage(format!(
            "daemon for {name} speaks control protocol {theirs}, this cryptblk speaks \
             {PROTOCOL_VERSION}; close and reopen the volume with this version"
        ))),
        Err(AnswerError::Malformed(e)) => Err(VolumeError::device(format!(
            "daemon for {name} gave a malformed answer: {e}"
        ))),
    }
}

/// Writes one request line to the socket at `path` and reads one answer line.
fn exchange(path: &Path, name: &str, line: &str) -> Result<String> {
    let stream = connect(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            VolumeError::new(
                ErrorClass::NoPermission,
                format!(
                    "cannot talk to the daemon of {name} at {}: {e}",
                    path.display()
                ),
            )
        } else {
            VolumeError::device(format!("Device {name} is not active."))
        }
    })?;
    // Suspend waits for in-flight I/O to drain; give it time but never hang forever.
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut writer = stream.try_clone()?;
    writer.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    if answer.is_empty() {
        return Err(VolumeError::device(format!(
            "{NO_ANSWER} (daemon of {name})"
        )));
    }
    Ok(answer)
}

/// What a request fails with when the daemon closed the connection without answering (it
/// died, or an upgrade's successor died before it could answer).
pub const NO_ANSWER: &str = "the connection closed without an answer";

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A daemon at a fresh socket answering each connection's line with `answer(line)`,
    /// for `n` connections; returns the socket path and the lines it received.
    fn fake_daemon(
        n: usize,
        answer: fn(&str) -> String,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        std::thread::JoinHandle<Vec<String>>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.ctl");
        let listener = UnixListener::bind(&path).unwrap();
        let seen = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for _ in 0..n {
                let (stream, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(stream.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                (&stream).write_all(answer(&line).as_bytes()).unwrap();
                seen.push(line);
            }
            seen
        });
        (dir, path, seen)
    }

    /// How a daemon from before versions answered: `cmd` at the top level or nothing.
    fn protocol_0(line: &str) -> String {
        let req: serde_json::Value = serde_json::from_str(line).unwrap();
        match req["cmd"].as_str() {
            Some("close") => "{\"ok\":true}\n".into(),
            Some("status") => "{\"ok\":true,\"name\":\"v\"}\n".into(),
            other => format!(
                "{{\"ok\":false,\"code\":1,\"error\":\"unknown request '{}'\"}}\n",
                other.unwrap_or("")
            ),
        }
    }

    #[test]
    fn a_client_refuses_a_daemon_from_before_versions() {
        let (_dir, path, seen) = fake_daemon(1, protocol_0);
        let e = request_at(&path, "v", &Request::Suspend).unwrap_err();
        assert_eq!(e.code, ErrorClass::WrongParameters);
        assert_eq!(
            e.message,
            "daemon for v speaks control protocol 0, this cryptblk speaks 1; close and \
             reopen the volume with this version"
        );
        // The old daemon saw no command it knows, so it did nothing.
        assert_eq!(
            seen.join().unwrap(),
            ["{\"v\":1,\"request\":{\"cmd\":\"suspend\"}}\n"]
        );
    }

    #[test]
    fn a_client_refuses_a_daemon_of_a_newer_version() {
        let (_dir, path, _seen) = fake_daemon(1, |_| {
            "{\"v\":7,\"ok\":false,\"code\":1,\"error\":\"protocol 1?\"}\n".into()
        });
        let e = request_at(&path, "v", &Request::Status).unwrap_err();
        assert_eq!(e.code, ErrorClass::WrongParameters);
        assert!(e
            .message
            .starts_with("daemon for v speaks control protocol 7, this cryptblk speaks 1;"));
    }

    #[test]
    fn close_still_reaches_a_daemon_from_before_versions() {
        let (_dir, path, seen) = fake_daemon(2, protocol_0);
        assert_eq!(
            request_at(&path, "v", &Request::Close).unwrap(),
            Response::Done
        );
        let seen = seen.join().unwrap();
        assert_eq!(seen[1], "{\"cmd\":\"close\"}\n");
    }

    #[test]
    fn refusals_come_back_as_errors_of_their_class() {
        let (_dir, path, _seen) = fake_daemon(1, |_| {
            Response::error(ErrorClass::Busy, "Device x is still in use (by y).")
                .encode()
                .as_str()
                .to_owned()
        });
        let e = request_at(&path, "x", &Request::Close).unwrap_err();
        assert_eq!(e.code, ErrorClass::Busy);
        assert_eq!(e.message, "Device x is still in use (by y).");
    }

    #[test]
    fn a_missing_daemon_is_an_inactive_device() {
        let dir = tempfile::tempdir().unwrap();
        let e = request_at(&dir.path().join("gone.ctl"), "gone", &Request::Status).unwrap_err();
        assert_eq!(e.code, ErrorClass::WrongDevice);
        assert_eq!(e.message, "Device gone is not active.");
    }

    #[test]
    fn names_are_checked() {
        for good in ["a", "v_dif", "x-1.2+3"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(128)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
