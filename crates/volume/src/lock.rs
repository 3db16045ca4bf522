//! One writer per backing store.
//!
//! The kernel opens the block devices of a dm table exclusively, so cryptsetup cannot map one
//! device twice, nor format or map it while it is mounted. A userspace volume has no such
//! guard, so a daemon takes [`DataLock`]s on every file its tables use: exclusive for a
//! read-write table, shared for a read-only one, held for the daemon's life. The locks are
//! open file description (OFD) locks on the file's inode, so every path, symbolic link or
//! hard link to the file meets the same lock, and the kernel drops them when the holder dies.
//!
//! Header-only actions (adding or removing a keyslot) keep working while the volume is open, as
//! cryptsetup's do: they take [`lock_header`], which is another byte of the same lock space,
//! so it never meets the data lock but serialises two header writers.
//!
//! The locks lie past any real file size (OFD locks need not cover existing bytes), away from
//! the bytes other tools lock (QEMU's image locking uses low offsets).

use crate::error::{Result, VolumeError};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The byte the data lock covers.
const DATA_BYTE: i64 = i64::MAX - 1;
/// The byte the header lock covers.
const HEADER_BYTE: i64 = i64::MAX - 2;

/// Sets (`wait`: waits for) an OFD lock of one byte at `at` on `file`.
fn ofd_lock(file: &File, at: i64, exclusive: bool, wait: bool) -> io::Result<()> {
    // SAFETY: flock is plain data; all-zero is a valid value before the fields are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    } as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = at;
    fl.l_len = 1;
    // l_pid must be 0 for OFD locks (zeroed above).
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: fl is a valid flock for the duration of the call.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The message of a device another holder uses (cryptsetup's for a busy device).
pub fn in_use_message(path: &Path) -> String {
    format!(
        "Cannot use device {} which is in use (already mapped or mounted).",
        path.display()
    )
}

/// A held data lock: the open file that carries it (the lock goes with it when dropped).
#[derive(Debug)]
pub struct DataLock {
    _file: File,
    path: PathBuf,
}

impl DataLock {
    /// Locks the file or block device at `path` against other users: `exclusive` (a writer)
    /// or shared (a reader). Never waits: a conflict is [`crate::ErrorClass::Busy`] with
    /// cryptsetup's message. A block device is also opened exclusively (`O_EXCL`), which the
    /// kernel refuses while it is mounted or mapped by dm.
    pub fn take(path: &Path, exclusive: bool) -> Result<DataLock> {
        let meta = std::fs::metadata(path).map_err(|e| {
            VolumeError::device(format!(
                "Device {} does not exist or access denied ({e}).",
                path.display()
            ))
        })?;
        let mut open = OpenOptions::new();
        open.read(true).write(exclusive);
        if exclusive && meta.file_type().is_block_device() {
            open.custom_flags(libc::O_EXCL);
        }
        let file = open.open(path).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) {
                VolumeError::busy(in_use_message(path))
            } else {
                VolumeError::device(format!(
                    "Device {} does not exist or access denied ({e}).",
                    path.display()
                ))
            }
        })?;
        match ofd_lock(&file, DATA_BYTE, exclusive, false) {
            Ok(()) => Ok(DataLock {
                _file: file,
                path: path.to_path_buf(),
            }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => {
                Err(VolumeError::busy(in_use_message(path)))
            }
            Err(e) => Err(VolumeError::device(format!(
                "cannot lock {}: {e}",
                path.display()
            ))),
        }
    }

    /// The path the lock was taken through.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The data locks of one daemon, one per file whatever the paths (two OFD locks of one
/// process on one file would meet each other).
#[derive(Debug, Default)]
pub struct DataLocks {
    held: HashMap<(u64, u64), (DataLock, bool)>,
}

impl DataLocks {
    /// No locks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks `path` (see [`DataLock::take`]) unless this set already holds the file with at
    /// least that mode; a shared lock held here is upgraded (replaced) for a writer.
    pub fn add(&mut self, path: &Path, exclusive: bool) -> Result<()> {
        let meta = std::fs::metadata(path).map_err(|e| {
            VolumeError::device(format!(
                "Device {} does not exist or access denied ({e}).",
                path.display()
            ))
        })?;
        let id = (meta.dev(), meta.ino());
        if let Some((_, held_exclusive)) = self.held.get(&id) {
            if *held_exclusive || !exclusive {
                return Ok(());
            }
            // Our own shared lock would meet the exclusive one: let it go first.
            self.held.remove(&id);
        }
        let lock = DataLock::take(path, exclusive)?;
        self.held.insert(id, (lock, exclusive));
        Ok(())
    }

    /// Locks every file a table names: `devices` are the table's device fields; those
    /// `is_mapping` says are mappings, and `ram:` disks, are not files. A device that does
    /// not exist is left to the table's load, which reports it in its context.
    pub fn add_devices<'a>(
        &mut self,
        devices: impl IntoIterator<Item = &'a str>,
        exclusive: bool,
        is_mapping: impl Fn(&str) -> bool,
    ) -> Result<()> {
        for dev in devices {
            let name = dev.strip_prefix("/dev/mapper/").unwrap_or(dev);
            if dev.starts_with("ram:") || is_mapping(name) || std::fs::metadata(dev).is_err() {
                continue;
            }
            self.add(Path::new(dev), exclusive)?;
        }
        Ok(())
    }

    /// How many files are locked.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// True if no file is locked.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// Exclusive data locks for an action that is about to write a new format onto `paths`
/// (each file once): a device in use is refused (exit 5) with cryptsetup's format message. A
/// path that does not exist yet is left to the action.
pub fn for_format(paths: &[&Path]) -> Result<DataLocks> {
    let mut locks = DataLocks::new();
    for path in paths.iter().filter(|p| p.exists()) {
        locks.add(path, true).map_err(|e| {
            if e.code == crate::ErrorClass::Busy {
                VolumeError::busy(format!("Cannot format device {} in use.", path.display()))
            } else {
                e
            }
        })?;
    }
    Ok(locks)
}

/// Takes the header lock on an open header `file` (exclusive for a writer, shared for a
/// reader), waiting while another action holds a conflicting one; it lasts as long as
/// `file` stays open. The data lock of an open volume does not meet it.
pub fn lock_header(file: &File, exclusive: bool) -> io::Result<()> {
    ofd_lock(file, HEADER_BYTE, exclusive, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    #[test]
    fn a_writer_excludes_everyone_through_any_link() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        std::fs::hard_link(&a, dir.path().join("hard")).unwrap();
        std::os::unix::fs::symlink(&a, dir.path().join("soft")).unwrap();
        let held = DataLock::take(&a, true).unwrap();
        for other in ["a", "hard", "soft"] {
            let p = dir.path().join(other);
            for exclusive in [true, false] {
                let e = DataLock::take(&p, exclusive).unwrap_err();
                assert_eq!(e.code, ErrorClass::Busy);
                assert_eq!(e.message, in_use_message(&p));
            }
        }
        // The header lock is another byte: header actions go on.
        let f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
        lock_header(&f, true).unwrap();
        drop(held);
        DataLock::take(&a, true).unwrap();
    }

    #[test]
    fn readers_share_and_keep_writers_out() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        let r1 = DataLock::take(&a, false).unwrap();
        let _r2 = DataLock::take(&a, false).unwrap();
        assert_eq!(DataLock::take(&a, true).unwrap_err().code, ErrorClass::Busy);
        drop(r1);
        assert_eq!(DataLock::take(&a, true).unwrap_err().code, ErrorClass::Busy);
    }

    #[test]
    fn one_set_holds_a_file_once_whatever_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        std::fs::hard_link(&a, dir.path().join("hard")).unwrap();
        let mut set = DataLocks::new();
        set.add(&a, false).unwrap();
        set.add(&dir.path().join("hard"), true).unwrap();
        set.add_devices(["data_dif", "ram:1M", "/nonexistent/x"], true, |n| {
            n == "data_dif"
        })
        .unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(
            DataLock::take(&a, false).unwrap_err().code,
            ErrorClass::Busy
        );
    }
}
