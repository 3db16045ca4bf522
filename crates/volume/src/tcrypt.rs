//! TrueCrypt and VeraCrypt volumes (`--type tcrypt`): unlock through
//! [`cryptblk_format::tcrypt`], the data segment, the cipher chain as one sector cipher (for
//! offline decryption) and the activation plan.
//!
//! cryptsetup maps a chain of ciphers as one dm-crypt device per cipher, stacked. A plan here
//! carries its key only in the top table (lower tables are keyless by design), so a
//! single-cipher volume activates through one crypt table and a chain is refused for
//! activation with a clear message; `decrypt` reads every chain through [`ChainCipher`].

use crate::error::{ErrorClass, Result, VolumeError};
use crate::plan::ActivationPlan;
use crate::segment::Segment;
use cryptblk_cipher::{CipherError, SectorCipher, SectorOptions};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::tcrypt::{self, TcryptParams, TcryptVolume};
use cryptblk_format::FormatError;
use serde_json::json;
use std::fs::File;
use std::path::Path;

/// Finds and decrypts the header of the TCRYPT volume at `path` (or of `header`, for
/// `--header`). No header that decrypts is cryptsetup's "No device header detected with
/// this passphrase." (exit 2); an unknown `--hash`/`--cipher` exits 1.
pub fn unlock(path: &Path, params: &TcryptParams) -> Result<TcryptVolume> {
    let file = File::open(path).map_err(|_| {
        VolumeError::device(format!(
            "Device {} does not exist or access denied.",
            path.display()
        ))
    })?;
    tcrypt::unlock(&file as &dyn HeaderIo, params).map_err(|e| match e {
        FormatError::WrongPassphrase => {
            VolumeError::new(ErrorClass::NoPermission, tcrypt::NO_HEADER)
        }
        other => other.into(),
    })
}

/// The data segment of the volume's first (outermost) layer; the others share its offsets.
pub fn segment(vol: &TcryptVolume) -> Segment {
    let layers = vol.layers();
    Segment {
        cipher: layers[0].spec.clone(),
        offset: vol.data_offset_sectors() * 512,
        size: Some(vol.data_size_sectors() * 512),
        iv_offset: vol.iv_offset_sectors(),
        sector_size: 512,
        integrity: None,
    }
}

/// A cipher chain as one sector cipher: reads decrypt with the outermost cipher first,
/// writes encrypt with the innermost first, each layer with the same sector numbers, as the
/// stacked dm-crypt devices do.
pub struct ChainCipher {
    layers: Vec<Box<dyn SectorCipher>>,
}

impl ChainCipher {
    /// The chain of `vol`, each layer keyed from the header's key area; `iv_offset` is added
    /// to every sector number.
    pub fn new(
        vol: &TcryptVolume,
        iv_offset: u64,
        implementation: Option<String>,
    ) -> Result<ChainCipher> {
        let layers = vol
            .layers()
            .iter()
            .map(|l| {
                cryptblk_cipher::open_cipher(
                    &l.spec,
                    l.key.as_bytes(),
                    &SectorOptions {
                        sector_size: 512,
                        iv_offset,
                        iv_large_sectors: false,
                        implementation: implementation.clone(),
                    },
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(ChainCipher { layers })
    }
}

impl SectorCipher for ChainCipher {
    fn sector_size(&self) -> usize {
        512
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> std::result::Result<(), CipherError> {
        for l in self.layers.iter().rev() {
            l.encrypt(sector, buf)?;
        }
        Ok(())
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> std::result::Result<(), CipherError> {
        for l in &self.layers {
            l.decrypt(sector, buf)?;
        }
        Ok(())
    }

    fn implementation(&self) -> &str {
        self.layers.first().map_or("", |l| l.implementation())
    }
}

/// The activation plan of an unlocked volume on `device`: one crypt table for a single
/// cipher. A chain of ciphers is refused (see the module notes).
pub fn plan(
    vol: &TcryptVolume,
    device: &Path,
    name: &str,
    crypt_flags: &[String],
) -> Result<ActivationPlan> {
    let layers = vol.layers();
    if layers.len() != 1 {
        return Err(VolumeError::usage(format!(
            "Activation of the TCRYPT cipher chain {} (one dm-crypt layer per cipher) is not \
             supported yet; 'cryptblk decrypt --type tcrypt' reads it.",
            vol.chain.name
        )));
    }
    let seg = segment(vol);
    let table = seg.crypt_table(&layers[0].key, device, crypt_flags)?;
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        info: json!({
            "type": "TCRYPT",
            "cipher": seg.cipher,
            "keysize": format!("{} bits", layers[0].key.len() * 8),
            "device": device.display().to_string(),
            "sector_size": 512,
            "offset": format!("{} sectors", seg.offset / 512),
            "skipped": format!("{} sectors", seg.iv_offset),
        }),
    })
}
