//! Unix sockets that only their owner can ever connect to.
//!
//! `bind(2)` creates the socket file with mode `0777 & !umask`, and a client that connects
//! before a following `chmod` is queued and then accepted: with a permissive umask another
//! local user could read the decrypted volume over NBD or attach as a vhost-user frontend.
//! The umask cannot be tightened around `bind` here (it is per process and the daemon runs
//! threads), so the socket is bound inside a fresh directory only the owner can enter, made
//! mode 0600 there, and only then linked under its public name.

use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// Binds a listening Unix socket at `path` with mode 0600 such that no connection can be
/// made through `path` before the mode is 0600. Fails with `AddrInUse` when `path` exists,
/// as `bind` does; callers remove a stale socket first.
pub fn bind_owner_only(path: &Path) -> io::Result<UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let private = PrivateDir::create(parent)?;
    // Everything inside goes through the directory's descriptor (and /proc/self/fd for
    // bind, which takes only a path), never its name: in a directory others may write, the
    // name could be swapped for a directory of theirs. Short, too: sun_path holds 108 bytes.
    let inner = PathBuf::from(format!("/proc/self/fd/{}/s", private.fd.as_raw_fd()));
    let listener = UnixListener::bind(&inner)?;
    // SAFETY: the descriptor is a directory we own, the name a NUL-terminated literal.
    if unsafe { libc::fchmodat(private.fd.as_raw_fd(), c"s".as_ptr(), 0o600, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // A hard link, not a rename: it never replaces what appeared at `path` meanwhile. The
    // socket is found by its inode, so clients connecting through `path` reach `listener`.
    let target = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in socket path"))?;
    // SAFETY: both names are NUL-terminated; the descriptor is open.
    let linked = unsafe {
        libc::linkat(
            private.fd.as_raw_fd(),
            c"s".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            0,
        )
    };
    if linked != 0 {
        let e = io::Error::last_os_error();
        return Err(if e.kind() == io::ErrorKind::AlreadyExists {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} exists", path.display()),
            )
        } else {
            e
        });
    }
    Ok(listener)
}

/// A directory made by `mkdtemp` (mode 0700 whatever the umask), held open and checked to
/// be ours; emptied and removed when dropped.
struct PrivateDir {
    name: PathBuf,
    fd: OwnedFd,
}

impl PrivateDir {
    fn create(parent: &Path) -> io::Result<PrivateDir> {
        let mut template = parent.as_os_str().as_bytes().to_vec();
        template.extend_from_slice(b"/.cryptblk-sock-XXXXXX");
        let template = CString::new(template)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in socket path"))?;
        let mut buf = template.into_bytes_with_nul();
        // SAFETY: `buf` is a NUL-terminated, writable template ending in XXXXXX.
        if unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) }.is_null() {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `buf` now holds the NUL-terminated name mkdtemp made.
        let raw = unsafe {
            libc::open(
                buf.as_ptr().cast(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let open_error = io::Error::last_os_error();
        buf.pop();
        let name = PathBuf::from(OsString::from_vec(buf));
        if raw < 0 {
            let _ = fs::remove_dir(&name);
            return Err(open_error);
        }
        // SAFETY: `raw` is a descriptor just opened and owned by nobody else.
        let dir = PrivateDir {
            name,
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        };
        // What was opened must be the directory made: ours, and closed to everyone else.
        let meta = fs::metadata(format!("/proc/self/fd/{raw}"))?;
        // SAFETY: geteuid has no preconditions.
        if meta.uid() != unsafe { libc::geteuid() } || meta.mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} was replaced by another user", dir.name.display()),
            ));
        }
        Ok(dir)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // SAFETY: the descriptor is open; the name is a NUL-terminated literal.
        unsafe { libc::unlinkat(self.fd.as_raw_fd(), c"s".as_ptr(), 0) };
        let _ = fs::remove_dir(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    #[test]
    fn socket_is_0600_reachable_and_leaves_no_directory() {
        let dir = std::env::temp_dir().join(format!("cbsock-{}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let path = dir.join("x.sock");
        // (Under umask 000 from another user: crates/cli/tests/socket_race.rs.)
        let listener = bind_owner_only(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        let _c = UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.sock")]);
        let again = bind_owner_only(&path).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        fs::remove_dir_all(&dir).unwrap();
    }
}
