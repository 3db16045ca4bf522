//! The one logger of every cryptblk process (env_logger over the `log` records the library
//! layers emit), set up for where its output goes:
//!
//! - a command (`cryptblk open`, `luksFormat`, ...) prints cryptblk's own warnings and
//!   errors on standard error, `--debug` adds debug lines; other crates stay quiet, so a
//!   failure reads as cryptsetup's one line;
//! - a daemon logs cryptblk's info records too (start, export ready, clients connecting and
//!   leaving, suspend/resume/resize/refresh, I/O errors with their sector), and other
//!   crates' warnings;
//! - under systemd (standard error is the journal stream named by `$JOURNAL_STREAM`) each
//!   line starts with its syslog priority, `<3>` for errors to `<7>` for debug, which
//!   journald turns into the entry's priority, and carries no timestamp (the journal has
//!   one);
//! - a daemon whose standard error is its `<name>.log` file keeps that file under a size cap
//!   (`CRYPTBLK_LOG_MAX_BYTES`, default 1 MiB): past it the file becomes `<name>.log.1`
//!   (replacing an older one) and a new `<name>.log` is started, so a volume served for
//!   years cannot fill its runtime directory.
//!
//! `CRYPTBLK_LOG` (env_logger's syntax: `debug`, `cryptblk_dm=trace`, ...) overrides the
//! levels. Nothing logged carries a key: the layers log names, sectors and errors only.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

/// Which process the logger is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// A command run by a user or a script; `debug` is `--debug`.
    Command { debug: bool },
    /// A daemon serving a volume.
    Daemon,
}

/// Installs the logger for `process`. A later call replaces it: `open --foreground` starts
/// as a command and turns into a daemon once it serves.
pub fn install(process: Process) {
    let journal = stderr_is_journal();
    let mut b = env_logger::Builder::new();
    match process {
        Process::Command { debug } => {
            b.filter_level(log::LevelFilter::Off).filter_module(
                "cryptblk",
                if debug {
                    log::LevelFilter::Debug
                } else {
                    log::LevelFilter::Warn
                },
            );
        }
        Process::Daemon => {
            b.filter_level(log::LevelFilter::Warn)
                .filter_module("cryptblk", log::LevelFilter::Info);
        }
    }
    b.parse_env("CRYPTBLK_LOG");
    if journal {
        b.format(|buf, record| {
            writeln!(
                buf,
                "<{}>{}: {}",
                syslog_priority(record.level()),
                record.target(),
                record.args()
            )
        });
    } else if matches!(process, Process::Command { .. }) {
        // A command's lines read as cryptsetup's; a daemon's log keeps env_logger's
        // timestamps.
        b.format_timestamp(None);
    }
    let target = match process {
        Process::Daemon if !journal => match CappedStderr::new() {
            Some(w) => env_logger::Target::Pipe(Box::new(w)),
            None => env_logger::Target::Stderr,
        },
        _ => env_logger::Target::Stderr,
    };
    let logger = b.target(target).build();
    let max = logger.filter();
    *ACTIVE.write().unwrap_or_else(|e| e.into_inner()) = Some(logger);
    // The first call installs the dispatcher; it fails harmlessly after that.
    let _ = log::set_logger(&Dispatch);
    log::set_max_level(max);
}

/// The logger `log` calls: whichever [`install`] built last.
static ACTIVE: std::sync::RwLock<Option<env_logger::Logger>> = std::sync::RwLock::new(None);

/// Forwards records to [`ACTIVE`] (the `log` crate takes one logger for the process's life;
/// this lets [`install`] change it).
struct Dispatch;

impl log::Log for Dispatch {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        ACTIVE
            .read()
            .map(|l| l.as_ref().is_some_and(|l| l.enabled(metadata)))
            .unwrap_or(false)
    }
    fn log(&self, record: &log::Record) {
        if let Ok(l) = ACTIVE.read() {
            if let Some(l) = l.as_ref() {
                l.log(record);
            }
        }
    }
    fn flush(&self) {
        if let Ok(l) = ACTIVE.read() {
            if let Some(l) = l.as_ref() {
                l.flush();
            }
        }
    }
}

/// The syslog priority journald reads from a `<N>` prefix (sd-daemon(3)).
fn syslog_priority(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// True when standard error is the journal stream systemd connected (its device and inode
/// are those `$JOURNAL_STREAM` names, as systemd.exec(5) says to check).
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The largest `<name>.log` before it is rotated: `CRYPTBLK_LOG_MAX_BYTES`, else 1 MiB.
fn log_cap() -> u64 {
    std::env::var("CRYPTBLK_LOG_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u64| n >= 4096)
        .unwrap_or(1 << 20)
}

/// Standard error when it is a daemon's `<name>.log` file, kept under [`log_cap`]: each
/// record is written to fd 2, and once the file is past the cap it is renamed to
/// `<name>.log.1` and a fresh `<name>.log` is put on fd 2 (with `dup2`, so panics and
/// anything else written to standard error follow it).
struct CappedStderr {
    path: PathBuf,
    cap: u64,
}

impl CappedStderr {
    /// `None` unless standard error is a regular file whose name ends in `.log`.
    fn new() -> Option<Self> {
        let path = std::fs::read_link("/proc/self/fd/2").ok()?;
        let meta = std::fs::metadata("/proc/self/fd/2").ok()?;
        (meta.is_file() && path.extension().is_some_and(|e| e == "log")).then(|| CappedStderr {
            path,
            cap: log_cap(),
        })
    }

    /// Starts a new log file if the current one is past the cap.
    fn rotate_if_full(&self) -> io::Result<()> {
        let len = std::fs::metadata("/proc/self/fd/2")?.len();
        if len < self.cap {
            return Ok(());
        }
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        // A new file only (never one someone else put there), owner-only, as the first.
        let fresh = std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)?;
        // SAFETY: dup2 onto fd 2 replaces standard error atomically; `fresh` stays valid.
        if unsafe { libc::dup2(fresh.as_raw_fd(), 2) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Write for CappedStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // A failed rotation (the directory gone, say) must not lose the record.
        let _ = self.rotate_if_full();
        // SAFETY: write(2) reads `buf.len()` bytes of a live slice; fd 2 stays open for
        // the life of the process (rotation replaces it with dup2, never closes it).
        let n = unsafe { libc::write(2, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_are_syslogs() {
        assert_eq!(syslog_priority(log::Level::Error), 3);
        assert_eq!(syslog_priority(log::Level::Warn), 4);
        assert_eq!(syslog_priority(log::Level::Info), 6);
        assert_eq!(syslog_priority(log::Level::Debug), 7);
    }
}
