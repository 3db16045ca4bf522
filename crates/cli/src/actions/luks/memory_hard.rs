//! `open --serialize-memory-hard-pbkdf`: cryptsetup's global lock around memory-hard
//! (Argon2) keyslot unlocks, so that many volumes opened at once at boot do not run their
//! Argon2 KDFs side by side and exhaust memory.
//!
//! The lock is cryptsetup's, so cryptblk and cryptsetup serialize against each other: an
//! exclusive `flock(2)` on `/run/cryptsetup/LN_memory-hard-access`, created when missing
//! and, on release, removed when no other process holds it (cryptsetup's named-lock
//! protocol: after unlocking, a non-blocking exclusive lock that succeeds on the same file
//! means nobody waits on it). cryptsetup holds it around each Argon2 KDF; cryptblk holds it
//! around the whole passphrase check when a keyslot that may be tried is Argon2, which
//! serializes the same work. Hand-written: no crate implements this protocol.

use crate::exit::Failure;
use cryptblk_volume::Volume;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// cryptsetup's locking directory (its build default, which Debian keeps).
const LOCK_DIR: &str = "/run/cryptsetup";
/// The named lock's file in [`LOCK_DIR`] (`LN_` marks a lock by name).
const LOCK_FILE: &str = "LN_memory-hard-access";

/// The held lock; released (and its file removed when free) on drop.
pub struct MemoryHardLock {
    file: File,
    path: PathBuf,
}

/// Takes the lock when `wanted` and a keyslot of `vol` that the unlock may try (`slot`, or
/// any) uses a memory-hard KDF; `None` otherwise.
pub fn take_if_needed(
    wanted: bool,
    vol: &Volume,
    slot: Option<u32>,
) -> Result<Option<MemoryHardLock>, Failure> {
    if !wanted || !memory_hard_keyslot(vol, slot) {
        return Ok(None);
    }
    MemoryHardLock::take(Path::new(LOCK_DIR)).map(Some)
}

/// True if a LUKS2 keyslot (`slot`, or any) derives its key with Argon2.
fn memory_hard_keyslot(vol: &Volume, slot: Option<u32>) -> bool {
    let Some(h) = vol.luks2() else {
        return false;
    };
    let Some(slots) = h.json()["keyslots"].as_object() else {
        return false;
    };
    slots
        .iter()
        .filter(|(id, _)| slot.is_none_or(|s| id.parse::<u32>() == Ok(s)))
        .any(|(_, ks)| {
            ks["kdf"]["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("argon2"))
        })
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this File owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// True when `file` is still the one at `path` (not removed or replaced by a releaser).
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

impl MemoryHardLock {
    /// Waits for the exclusive lock in `dir` (created, owner-only, when missing).
    fn take(dir: &Path) -> Result<MemoryHardLock, Failure> {
        let failed =
            || Failure::usage("Failed to acquire global memory-hard access serialization lock.");
        if !dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|_| failed())?;
        }
        let path = dir.join(LOCK_FILE);
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|_| failed())?;
            flock(&file, libc::LOCK_EX).map_err(|_| failed())?;
            // A releaser may have removed the file between our open and our lock: then
            // lock the new one.
            if same_file(&file, &path) {
                return Ok(MemoryHardLock { file, path });
            }
        }
    }
}

impl Drop for MemoryHardLock {
    fn drop(&mut self) {
        let _ = flock(&self.file, libc::LOCK_UN);
        // Nobody else holds or waits on it: remove it, as cryptsetup does.
        if flock(&self.file, libc::LOCK_EX | libc::LOCK_NB).is_ok()
            && same_file(&self.file, &self.path)
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
