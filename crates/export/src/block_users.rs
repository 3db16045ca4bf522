//! Who holds a kernel block device open: what a ublk export reports as its users.
//!
//! The kernel keeps a block device's open count to itself (device-mapper's own count is what
//! `cryptsetup close` asks about; a ublk disk has none userspace can read), so this looks
//! from the outside, the way `fuser`, `lsblk` and `losetup -j` do:
//!
//! - stacked block devices: `/sys/class/block/<dev>/holders/` (dm, md, bcache...);
//! - loop devices backed by it: `/sys/class/block/loop*/loop/backing_file`;
//! - processes with a descriptor on it: `/proc/<pid>/fd/*` whose target has its device
//!   number (this process's own are left out: it is the server, not a user);
//! - anything else that claims it exclusively (a mounted file system, swap, `O_EXCL`
//!   openers): an `O_EXCL` open of our own then fails with `EBUSY`.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// How many users hold the block device at `path`: stacked devices, loop devices over it and
/// other processes' descriptors on it, or 1 when none of those but an exclusive claim (a
/// mount, swap) holds it. 0 when it is free or gone; an error only if `path` exists but is
/// not a block device.
pub fn block_device_users(path: &Path) -> io::Result<usize> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_block_device() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a block device", path.display()),
        ));
    }
    let rdev = meta.rdev();
    let sys = Path::new("/sys/dev/block").join(format!("{}:{}", major(rdev), minor(rdev)));
    let holders = count_entries(&sys.join("holders"));
    let users = holders + loop_backings(path, rdev) + other_openers(rdev);
    if users > 0 {
        return Ok(users);
    }
    Ok(usize::from(exclusively_claimed(path)))
}

fn major(rdev: u64) -> u64 {
    libc::major(rdev as libc::dev_t) as u64
}

fn minor(rdev: u64) -> u64 {
    libc::minor(rdev as libc::dev_t) as u64
}

/// Entries of a directory; 0 when it cannot be read.
fn count_entries(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

/// Loop devices whose backing file is the device (by path or device number).
fn loop_backings(path: &Path, rdev: u64) -> usize {
    let Ok(blocks) = fs::read_dir("/sys/class/block") else {
        return 0;
    };
    blocks
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|backing| {
            let backing = Path::new(backing.trim_end());
            backing == path
                || fs::metadata(backing)
                    .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
        })
        .count()
}

/// Descriptors other processes hold on the device.
fn other_openers(rdev: u64) -> usize {
    let me = std::process::id().to_string();
    let Ok(procs) = fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter(|p| {
            let name = p.file_name();
            let name = name.to_string_lossy();
            name != me && name.bytes().all(|b| b.is_ascii_digit())
        })
        .filter_map(|p| fs::read_dir(p.path().join("fd")).ok())
        .flat_map(|fds| fds.flatten())
        .filter(|fd| {
            // Following the link stats the open file itself.
            fs::metadata(fd.path())
                .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
        })
        .count()
}

/// True when an exclusive open of `path` fails with `EBUSY` (mounted, swap, or held by
/// another exclusive opener).
fn exclusively_claimed(path: &Path) -> bool {
    // O_EXCL on a block device (without O_CREAT) claims it for the duration of the open.
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBUSY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A loop device over a scratch file, detached on drop.
    struct Loop(String);

    impl Loop {
        fn new(file: &Path) -> Loop {
            let out = Command::new("losetup")
                .args(["-f", "--show"])
                .arg(file)
                .output()
                .expect("losetup runs (tests run as root)");
            assert!(out.status.success(), "losetup: {out:?}");
            Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
        }
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }

    #[test]
    fn a_block_device_is_used_while_claimed_opened_or_looped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk");
        fs::write(&file, vec![0u8; 1 << 20]).unwrap();
        let dev = Loop::new(&file);
        let path = Path::new(&dev.0);
        assert_eq!(block_device_users(path).unwrap(), 0, "a fresh loop device");

        // An exclusive claim, as a mount makes (this process's own descriptors are not
        // counted, so only the claim shows).
        let claim = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .unwrap();
        assert_eq!(block_device_users(path).unwrap(), 1, "claimed with O_EXCL");
        drop(claim);
        assert_eq!(block_device_users(path).unwrap(), 0, "claim released");

        // Another process holding it open (as qemu or dd would).
        let mut holder = Command::new("sleep")
            .arg("30")
            .stdin(fs::File::open(path).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let held = block_device_users(path);
        holder.kill().unwrap();
        holder.wait().unwrap();
        assert_eq!(held.unwrap(), 1, "another process's descriptor");
        assert_eq!(block_device_users(path).unwrap(), 0, "that process gone");

        // A loop device stacked on it.
        let upper = Loop::new(path);
        assert_eq!(
            block_device_users(path).unwrap(),
            1,
            "a loop device over it"
        );
        drop(upper);
        assert_eq!(block_device_users(path).unwrap(), 0, "loop device detached");
    }

    #[test]
    fn a_missing_device_has_no_users_and_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(block_device_users(&dir.path().join("gone")).unwrap(), 0);
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(block_device_users(&file).is_err());
    }
}
