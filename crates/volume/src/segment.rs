//! The data segment of an unlocked volume and the dm-crypt table that maps it.

use crate::device::{device_size, table_path};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{CryptConfig, CryptFlags, CryptKey, TableSpec};
use std::path::Path;
use zeroize::Zeroizing;

/// The data segment of an unlocked volume, as a crypt table needs it.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Cipher specification.
    pub cipher: String,
    /// Byte offset of the data on the data device.
    pub offset: u64,
    /// Length in bytes; `None` to the end of the data device.
    pub size: Option<u64>,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Encryption sector size.
    pub sector_size: u32,
    /// Integrity (LUKS2 `--integrity`), activated as a stack of its own.
    pub integrity: Option<String>,
}

impl Segment {
    /// The segment's length in bytes on a data device of `dev_size` bytes, rounded down to
    /// whole encryption sectors; an error naming `data_dev` when nothing is left.
    pub fn mapped_len(&self, dev_size: u64, data_dev: &Path) -> Result<u64> {
        let too_small = |what: &str| {
            VolumeError::device(format!("Device {} is too small{what}.", data_dev.display()))
        };
        let len = match self.size {
            Some(s) => s,
            None => dev_size
                .checked_sub(self.offset)
                .filter(|&n| n > 0)
                .ok_or_else(|| too_small(" (no data area after the header)"))?,
        };
        let len = len - len % u64::from(self.sector_size);
        if len == 0 {
            return Err(too_small(""));
        }
        Ok(len)
    }

    /// The dm table of this segment over `data_dev`, keyed with `vk` (keys included: only
    /// ever sent over a pipe); `flags` are extra dm-crypt options (activation flags).
    pub fn crypt_table(
        &self,
        vk: &SecretBytes,
        data_dev: &Path,
        flags: &[String],
    ) -> Result<Zeroizing<String>> {
        if let Some(i) = &self.integrity {
            return Err(VolumeError::usage(format!(
                "a segment with integrity ({i}) is activated as a stack (plan::luks), not a single crypt table"
            )));
        }
        cryptblk_cipher::CipherSpec::parse(&self.cipher)?;
        let path = table_path(data_dev)?;
        let len = self.mapped_len(device_size(data_dev)?, data_dev)?;
        let mut cfg = CryptConfig::new(
            &self.cipher,
            CryptKey::for_cipher(&self.cipher, vk),
            self.iv_offset,
            &path.display().to_string(),
            self.offset / 512,
        );
        cfg.flags = CryptFlags::parse(flags).map_err(VolumeError::usage)?;
        cfg.flags.sector_size = self.sector_size;
        Ok(TableSpec::single(len / 512, cfg).to_text(true))
    }
}
