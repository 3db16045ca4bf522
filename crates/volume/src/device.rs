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

/// An absolute path usable in a dm table (no whitespace).
pub fn table_path(p: &Path) -> Result<PathBuf> {
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

/// Size in bytes of a file or block device.
pub fn device_size(p: &Path) -> Result<u64> {
    let f = open_file(p, false)?;
    let mut f = &f;
    Ok(std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))?)
}
