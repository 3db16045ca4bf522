//! On-disk volume formats: LUKS1, LUKS2 and plain dm-crypt; BitLocker, TrueCrypt/VeraCrypt and
//! FileVault2 (read and unlock only).
//!
//! Shared keyslot machinery lives in small modules used by every format: [`af`] (the
//! anti-forensic splitter), [`kdf`] (PBKDF2/Argon2 and their calibration), [`keyfile`]
//! (passphrase and key-file reading), [`hdrio`] (crash-testable header I/O) and [`error`].

pub mod af;
pub mod bitlk;
pub mod error;
pub mod fvault2;
pub mod hdrio;
pub mod kdf;
pub mod keyfile;
pub mod loopaes;
pub mod luks1;
pub mod plain;
mod sector;
pub mod tcrypt;

pub use error::{FormatError, Result};

/// The LUKS version announced at the start of a device (`Some(1)`, `Some(2)`), or `None` when
/// there is no LUKS magic. Only the magic and version field are read: use the version's own
/// loader to validate the header (`cryptsetup isLuks` / `--type` dispatch).
pub fn luks_version(io: &dyn hdrio::HeaderIo) -> Result<Option<u16>> {
    let size = io
        .size()
        .map_err(|e| FormatError::io("getting device size", e))?;
    if size < 8 {
        return Ok(None);
    }
    let mut start = [0u8; 8];
    io.read_at(0, &mut start)
        .map_err(|e| FormatError::io("reading LUKS magic", e))?;
    if start[..6] != luks1::LUKS1_MAGIC {
        return Ok(None);
    }
    Ok(Some(u16::from_be_bytes([start[6], start[7]])))
}
pub mod integrity;
pub mod luks2;
pub mod verity;
pub mod verity_fec;
