//! On-disk volume formats: LUKS1, LUKS2 and plain dm-crypt.
//!
//! Shared keyslot machinery lives in small modules used by every format: [`af`] (the
//! anti-forensic splitter), [`kdf`] (PBKDF2/Argon2 and their calibration), [`keyfile`]
//! (passphrase and key-file reading), [`hdrio`] (crash-testable header I/O) and [`error`].

pub mod af;
pub mod error;
pub mod hdrio;
pub mod kdf;
pub mod keyfile;
pub mod luks1;
pub mod plain;
mod sector;

pub use error::{FormatError, Result};
pub mod luks2;
pub mod verity;
