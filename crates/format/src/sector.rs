//! Keyslot-area encryption: the volume's cipher specification applied to 512-byte sectors
//! starting at IV sector 0, through the cipher crate.

use crate::error::Result;
use cryptblk_cipher::SectorCipher;

/// A sector cipher for `spec` under `key` with default options (512-byte sectors, IV offset 0).
pub(crate) fn open(spec: &str, key: &[u8]) -> Result<Box<dyn SectorCipher>> {
    Ok(cryptblk_cipher::open_cipher(
        spec,
        key,
        &cryptblk_cipher::SectorOptions::default(),
    )?)
}
