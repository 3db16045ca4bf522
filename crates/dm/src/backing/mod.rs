//! Backings: the devices at the bottom of a stack (files, block devices, RAM disks).

pub mod file;
pub mod ram;

pub use file::{FileBacking, FileOptions};
pub use ram::RamDisk;

use crate::error::DmError;
use crate::SECTOR_SIZE;

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
