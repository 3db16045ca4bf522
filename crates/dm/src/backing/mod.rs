//! Backings: the devices at the bottom of a stack (files, block devices, RAM disks, and
//! remote stores: Ceph RBD images, NBD exports).

pub mod file;
pub mod nbd;
pub mod ram;
#[cfg(feature = "rbd")]
pub mod rbd;

pub use file::{FileBacking, FileOptions};
pub use nbd::{is_nbd_uri, NbdBacking};
pub use ram::RamDisk;

use std::io;
use std::sync::Arc;

use crate::device::BlockDevice;
use crate::error::DmError;
use crate::SECTOR_SIZE;

/// Prefix of a Ceph RBD image spec: `rbd:pool[/namespace]/image[@snap]`.
pub const RBD_PREFIX: &str = "rbd:";

/// Whether this build opens RBD images (the `rbd` feature, which links librbd).
pub const RBD_SUPPORTED: bool = cfg!(feature = "rbd");

/// The one line a build without the `rbd` feature answers an `rbd:` spec with.
pub const RBD_UNSUPPORTED: &str = "cryptblk was built without rbd support";

/// True if `spec` names a remote backing store, which [`open_remote`] opens (never a file
/// path, and never a mapping).
pub fn is_remote(spec: &str) -> bool {
    spec.starts_with(RBD_PREFIX) || is_nbd_uri(spec)
}

/// Opens the remote backing store `spec` names (read-only when `read_only`), or `None` if
/// `spec` is not a remote store's spec.
pub fn open_remote(spec: &str, read_only: bool) -> Option<io::Result<Arc<dyn BlockDevice>>> {
    if let Some(image) = spec.strip_prefix(RBD_PREFIX) {
        return Some(open_rbd(image, read_only));
    }
    if is_nbd_uri(spec) {
        // A read-only table over a writable export is fine: it only reads.
        return Some(NbdBacking::open(spec).map(|b| b as Arc<dyn BlockDevice>));
    }
    None
}

#[cfg(feature = "rbd")]
fn open_rbd(image: &str, read_only: bool) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(Arc::new(rbd::RbdBacking::open(image, read_only)?))
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(_image: &str, _read_only: bool) -> io::Result<Arc<dyn BlockDevice>> {
    Err(io::Error::new(io::ErrorKind::Unsupported, RBD_UNSUPPORTED))
}

/// Parses a size such as `4G`, `512M`, `64K`, `1048576s` (sectors) or `4096` (bytes).
///
/// Suffixes are binary (K = 1024). The result must be a non-zero multiple of 512 bytes.
pub fn parse_size(text: &str) -> Result<u64, DmError> {
    let bad = || DmError::Size(text.to_string());
    let t = text.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                's' => SECTOR_SIZE,
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return Err(bad()),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(mult).ok_or_else(bad)?;
    if bytes == 0 || !bytes.is_multiple_of(SECTOR_SIZE) {
        return Err(bad());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1048576s").unwrap(), 512 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        for bad in [
            "",
            "G",
            "0",
            "100",
            "1.5G",
            "-1M",
            "12X",
            "99999999999999999999T",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }
}
