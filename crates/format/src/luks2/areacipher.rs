//! Keyslot area and data cipher checks through the shared sector-cipher registry.

use crate::error::{FormatError, Result};
use cryptblk_cipher::SectorOptions;

/// Encrypts (or decrypts) `buf` in place with cipher `spec` under `key`, 512-byte sectors,
/// IV sector 0 at the start of `buf` (keyslot areas count IVs from their own start).
pub(super) fn crypt(spec: &str, key: &[u8], encrypt: bool, buf: &mut [u8]) -> Result<()> {
    let c = cryptblk_cipher::open_cipher(spec, key, &SectorOptions::default())?;
    if encrypt {
        c.encrypt(0, buf)?;
    } else {
        c.decrypt(0, buf)?;
    }
    Ok(())
}

/// Checks that `spec` with a `key_len`-byte key and `sector_size` can encrypt data.
pub(super) fn check(spec: &str, key_len: usize, sector_size: u32) -> Result<()> {
    let key = vec![0u8; key_len];
    let opts = SectorOptions {
        sector_size: sector_size as usize,
        ..SectorOptions::default()
    };
    cryptblk_cipher::open_cipher(spec, &key, &opts)
        .map(|_| ())
        .map_err(|e| match e {
            cryptblk_cipher::CipherError::UnknownSpec(_) => FormatError::Cipher(e),
            other => FormatError::InvalidParameter(format!("cipher {spec}: {other}")),
        })
}
