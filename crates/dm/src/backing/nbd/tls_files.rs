//! Reading TLS certificate and key files only when no other user could have planted them,
//! as ssh treats its keys: a CA someone else can write lets them sign their own client
//! certificate, and a private key others can read is no longer private.
//!
//! A file must be a regular file owned by the caller or root and writable by nobody else;
//! every directory on the way to it (after resolving symbolic links) must be owned by the
//! caller or root and writable by nobody else, unless sticky (as `/tmp`). A private key must
//! also not be readable by others; it may be readable by its group, as Debian's `ssl-cert`
//! group shares keys with services (mode 0640 root:ssl-cert).

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use zeroize::Zeroizing;

/// What a checked file holds, for the rules and the messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// A certificate or certificate authority: public, but nobody else may write it.
    Certificate,
    /// A private key: nobody else may write it, nor others read it.
    PrivateKey,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn mode_of(meta: &fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}

/// Checks `dir` and each directory above it (symbolic links resolved) as the module says.
/// The error is one line naming the offending directory and the fix.
pub fn check_tls_dir(dir: &Path) -> Result<(), String> {
    let real = fs::canonicalize(dir)
        .map_err(|e| format!("TLS certificate directory {}: {e}", dir.display()))?;
    let me = euid();
    for d in real.ancestors() {
        let meta = fs::symlink_metadata(d)
            .map_err(|e| format!("TLS certificate directory {}: {e}", d.display()))?;
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "refusing TLS certificate directory {}: {} is owned by uid {}, not by you \
                 (uid {me}) or root; chown it or move the certificates",
                dir.display(),
                d.display(),
                meta.uid()
            ));
        }
        let mode = mode_of(&meta);
        let sticky = mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !(sticky && d != real) {
            return Err(format!(
                "refusing TLS certificate directory {}: {} is writable by other users \
                 (mode {mode:o}); fix with chmod go-w {}",
                dir.display(),
                d.display(),
                d.display()
            ));
        }
    }
    Ok(())
}

/// The contents of `path` once it passed the checks the module describes: its directories,
/// then the file itself as opened (so what is checked is what is read). The error is one
/// line naming the file and the fix.
pub fn read_tls_file(path: &Path, kind: TlsFile) -> Result<Zeroizing<Vec<u8>>, String> {
    let what = match kind {
        TlsFile::Certificate => "certificate",
        TlsFile::PrivateKey => "key",
    };
    let real = fs::canonicalize(path)
        .map_err(|e| format!("reading TLS {what} {}: {e}", path.display()))?;
    if let Some(parent) = real.parent() {
        check_tls_dir(parent)?;
    }
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&real)
        .map_err(|e| format!("reading TLS {what} {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("reading TLS {what} {}: {e}", path.display()))?;
    let refuse = |why: String, fix: String| {
        format!("refusing TLS {what} {}: it {why}; {fix}", path.display())
    };
    if !meta.is_file() {
        return Err(refuse(
            "is not a regular file".into(),
            "give a regular file".into(),
        ));
    }
    let me = euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(refuse(
            format!(
                "is owned by uid {}, not by you (uid {me}) or root",
                meta.uid()
            ),
            format!("fix with chown {me} {}", path.display()),
        ));
    }
    let mode = mode_of(&meta);
    if mode & 0o022 != 0 {
        return Err(refuse(
            format!("is writable by other users (mode {mode:o})"),
            format!("fix with chmod go-w {}", path.display()),
        ));
    }
    if kind == TlsFile::PrivateKey && mode & 0o007 != 0 {
        return Err(refuse(
            format!("is accessible to all users (mode {mode:o})"),
            format!("fix with chmod 600 {}", path.display()),
        ));
    }
    // Room for the whole file and the read that finds its end: a Vec that grew would leave an
    // unwiped copy of the key behind.
    let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize + 4096));
    file.read_to_end(&mut bytes)
        .map_err(|e| format!("reading TLS {what} {}: {e}", path.display()))?;
    Ok(bytes)
}
