//! Devices and image files as the library opens them: errors that name the device, absolute
//! paths a dm table can hold, sizes.

use crate::error::{ErrorClass, Result, VolumeError};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Opens `path` for reading (and writing when `write`), naming the device on failure as
/// cryptsetup does.
pub fn open_file(path: &Path, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::PermissionDenied => ErrorClass::NoPermission,
                _ => ErrorClass::WrongDevice,
            };
            VolumeError::new(
                code,
                format!(
                    "Device {} does not exist or access denied ({e}).",
                    path.display()
                ),
            )
        })
}

/// True if `p` names a remote backing store (`rbd:pool/image`) rather than a file: such a
/// device is opened through `cryptblk_dm::backing::open_remote`, here and in the daemon.
pub fn is_remote(p: &Path) -> bool {
    p.to_str().is_some_and(cryptblk_dm::backing::is_remote)
}

/// Opens the remote store `p` names (see [`is_remote`]), read-only unless `write`, naming the
/// device on failure as cryptsetup does.
pub fn open_remote(p: &Path, write: bool) -> Result<std::sync::Arc<dyn cryptblk_dm::BlockDevice>> {
    let spec = p.to_string_lossy();
    // Not a device problem: this build cannot open such a store at all (exit 1, as
    // cryptsetup answers a request for something it was built without).
    if spec.starts_with(cryptblk_dm::backing::RBD_PREFIX) && !cryptblk_dm::backing::RBD_SUPPORTED {
        return Err(VolumeError::usage(format!(
            "{}.",
            cryptblk_dm::backing::RBD_UNSUPPORTED
        )));
    }
    match cryptblk_dm::backing::open_remote(&spec, !write) {
        Some(Ok(dev)) => Ok(dev),
        // librbd, loaded on first use, is missing: as if built without it (exit 1).
        Some(Err(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
            Err(VolumeError::usage(format!("{e}.")))
        }
        Some(Err(e)) => Err(VolumeError::new(
            ErrorClass::WrongDevice,
            format!("Device {spec} does not exist or access denied ({e})."),
        )),
        None => Err(VolumeError::device(format!(
            "Device {spec} is not a remote store."
        ))),
    }
}

/// An absolute path usable in a dm table (no whitespace); a remote store's spec as given.
pub fn table_path(p: &Path) -> Result<PathBuf> {
    if is_remote(p) {
        // The spec parser of the store refuses white space when the table is loaded.
        return Ok(p.to_path_buf());
    }
    let abs = std::fs::canonicalize(p).map_err(|e| {
        VolumeError::device(format!("Device {} does not exist ({e}).", p.display()))
    })?;
    if abs.to_string_lossy().chars().any(char::is_whitespace) {
        return Err(VolumeError::usage(format!(
            "device path {} contains white space, which a dm table cannot hold",
            abs.display()
        )));
    }
    Ok(abs)
}

// Block-layer ioctls (linux/fs.h): logical and physical block size of a block device.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127b;

/// The encryption sector size the data device `p` suits best, as cryptsetup 2.6 detects it:
/// 4096 for a regular file; for a block device the larger of its logical and physical block
/// sizes when that is a power of two from 512 to 4096, else its logical block size (512 when
/// even that is out of range).
pub fn optimal_encryption_sector_size(p: &Path) -> Result<u32> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::io::AsRawFd;
    if is_remote(p) {
        // Like a regular file: any sector size works, and 4096 costs the least.
        return Ok(4096);
    }
    let f = open_file(p, false)?;
    if !f.metadata()?.file_type().is_block_device() {
        return Ok(4096);
    }
    let block_size = |request: libc::c_ulong| {
        let mut v: libc::c_int = 0;
        // SAFETY: BLKSSZGET and BLKPBSZGET write one int through the pointer.
        if unsafe { libc::ioctl(f.as_raw_fd(), request, &mut v) } != 0 {
            return 0;
        }
        u32::try_from(v).unwrap_or(0)
    };
    let usable = |s: u32| (512..=4096).contains(&s) && s.is_power_of_two();
    let (logical, physical) = (block_size(BLKSSZGET), block_size(BLKPBSZGET));
    Ok([logical.max(physical), logical]
        .into_iter()
        .find(|&s| usable(s))
        .unwrap_or(512))
}

/// Size in bytes of a file, block device or remote store.
pub fn device_size(p: &Path) -> Result<u64> {
    if is_remote(p) {
        return Ok(open_remote(p, false)?.size());
    }
    let f = open_file(p, false)?;
    let mut f = &f;
    Ok(std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))?)
}
