//! How `cryptblk` talks to the daemons that serve open volumes.
//!
//! Each open volume (or raw `dm create` mapping) is served by one daemon process. It listens on
//! a Unix control socket `<runtime dir>/<name>.ctl` for one-line JSON requests and answers each
//! with one JSON line. The runtime directory is private to the user (mode 0700), so only its
//! owner can reach a daemon; requests never carry passphrases, and key material appears only in
//! `reload` tables, which travel over this socket and never on a command line.

use crate::exit::{ExitCode, Failure};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// The directory holding control sockets, logs and metadata of running daemons:
/// `$CRYPTBLK_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/cryptblk`, else `/run/cryptblk` for root,
/// else `/tmp/cryptblk-<uid>`.
pub fn runtime_dir() -> Result<PathBuf, Failure> {
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
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            Failure::usage(format!(
                "cannot create runtime directory {}: {e}",
                dir.display()
            ))
        })?;
    let meta = std::fs::metadata(&dir)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// Checks that a mapping name is usable as a file name and as a dm name.
pub fn check_name(name: &str) -> Result<(), Failure> {
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
        Err(Failure::usage(format!(
            "invalid mapping name '{name}' (use letters, digits, '-', '_', '.', '+')"
        )))
    }
}

/// Path of the control socket for `name`.
pub fn socket_path(name: &str) -> Result<PathBuf, Failure> {
    check_name(name)?;
    Ok(runtime_dir()?.join(format!("{name}.ctl")))
}

/// Names of the mappings whose daemons answer.
pub fn list() -> Result<Vec<String>, Failure> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(runtime_dir()?)? {
        let entry = entry?;
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".ctl")) else {
            continue;
        };
        if UnixStream::connect(entry.path()).is_ok() {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Sends one request to the daemon serving `name` and returns its answer.
///
/// A missing daemon is exit 4 ("device does not exist") as with cryptsetup; an answer with
/// `"ok": false` becomes a [`Failure`] carrying the daemon's message and code.
pub fn request(name: &str, req: &Value) -> Result<Value, Failure> {
    let path = socket_path(name)?;
    let stream = UnixStream::connect(&path)
        .map_err(|_| Failure::device(format!("Device {name} is not active.")))?;
    // Suspend waits for in-flight I/O to drain; give it time but never hang forever.
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut writer = stream.try_clone()?;
    writer.write_all(format!("{req}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let answer: Value = serde_json::from_str(&line)
        .map_err(|e| Failure::device(format!("daemon for {name} gave a malformed answer: {e}")))?;
    if answer["ok"].as_bool() == Some(true) {
        Ok(answer)
    } else {
        let code = match answer["code"].as_i64() {
            Some(2) => ExitCode::NoPermission,
            Some(4) => ExitCode::WrongDevice,
            Some(5) => ExitCode::Busy,
            _ => ExitCode::WrongParameters,
        };
        Err(Failure::new(
            code,
            answer["error"]
                .as_str()
                .unwrap_or("daemon refused the request")
                .to_string(),
        ))
    }
}

/// A successful answer carrying `fields`.
pub fn ok(fields: Value) -> Value {
    let mut v = json!({ "ok": true });
    if let (Some(dst), Value::Object(src)) = (v.as_object_mut(), fields) {
        dst.extend(src);
    }
    v
}

/// A failed answer.
pub fn err(code: ExitCode, message: impl Into<String>) -> Value {
    json!({ "ok": false, "code": code as i32, "error": message.into() })
}
