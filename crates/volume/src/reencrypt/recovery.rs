//! The hotzone after a crash, decided from its resilience data as cryptsetup's recovery
//! decides it (facts from cryptsetup 2.6 images cut at every write):
//!
//! - `checksum`: before the header names a hotzone, cryptsetup writes one hash (of the
//!   keyslot's `hash`) per `sector_size` block of the hotzone's *old* ciphertext, packed
//!   from the start of the keyslot area. A block whose hash still matches holds old data;
//!   any other block was rewritten under the new key.
//! - `journal`: the keyslot area holds a verbatim copy of the hotzone's old ciphertext (the
//!   hotzone is at most the area's size), so the old data is read from there.
//! - `none`: nothing records the hotzone; a cut step cannot be recovered.

use super::keys::ReencryptKeys;
use super::state::{ReencryptState, StateSegment};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::{SectorCipher, SectorOptions};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks2::{Resilience, SegmentInfo};

/// A whole-device cipher of a backup segment (old or new parameters) under `key`.
pub struct SideCipher {
    cipher: Box<dyn SectorCipher>,
    offset: u64,
}

impl SideCipher {
    /// The cipher of `seg` (`backup-previous` or `backup-final`) keyed with `key`.
    pub fn new(seg: &SegmentInfo, key: &[u8]) -> Result<SideCipher> {
        let spec = seg.encryption.as_deref().unwrap_or("");
        let cipher = cryptblk_cipher::open_cipher(
            spec,
            key,
            &SectorOptions {
                sector_size: seg.sector_size as usize,
                iv_offset: seg.iv_tweak,
                iv_large_sectors: false,
                implementation: None,
            },
        )?;
        Ok(SideCipher {
            cipher,
            offset: seg.offset,
        })
    }

    /// Encrypts `buf`, which is to lie at byte `pos` of the data device.
    pub fn encrypt_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let rel = pos.checked_sub(self.offset).ok_or_else(|| {
            VolumeError::device(format!("byte {pos} lies before its segment's start"))
        })?;
        self.cipher.encrypt(rel / 512, buf)?;
        Ok(())
    }

    /// Decrypts `buf`, which lies at byte `pos` of the data device.
    pub fn decrypt_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let rel = pos.checked_sub(self.offset).ok_or_else(|| {
            VolumeError::device(format!("byte {pos} lies before its segment's start"))
        })?;
        self.cipher.decrypt(rel / 512, buf)?;
        Ok(())
    }
}

/// The old and the new cipher of a reencryption (each when its key was needed).
pub struct Ciphers {
    old: Option<SideCipher>,
    new: Option<SideCipher>,
}

impl Ciphers {
    /// The ciphers of `state` under `keys`.
    pub fn new(state: &ReencryptState, keys: &ReencryptKeys) -> Result<Ciphers> {
        Ok(Ciphers {
            old: keys
                .old
                .as_ref()
                .map(|k| SideCipher::new(&state.previous, k.as_bytes()))
                .transpose()?,
            new: keys
                .new
                .as_ref()
                .map(|k| SideCipher::new(&state.fin, k.as_bytes()))
                .transpose()?,
        })
    }

    /// The old side's cipher.
    pub fn old(&self) -> Result<&SideCipher> {
        self.old
            .as_ref()
            .ok_or_else(|| VolumeError::device("the old volume key was not unlocked"))
    }

    /// The new side's cipher.
    pub fn new_side(&self) -> Result<&SideCipher> {
        self.new
            .as_ref()
            .ok_or_else(|| VolumeError::device("the new volume key was not unlocked"))
    }
}

/// The plaintext of the hotzone `hz` (`len` bytes), recovered from its resilience data
/// without changing anything on disk.
pub fn hotzone_plaintext(
    state: &ReencryptState,
    ciphers: &Ciphers,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
    hz: &StateSegment,
    len: u64,
) -> Result<Vec<u8>> {
    let ks = &state.keyslot;
    let mut buf = vec![0u8; len as usize];
    match &ks.resilience {
        Resilience::Checksum { hash, sector_size } => {
            let alg = HashAlgorithm::from_name(hash)?;
            let bs = *sector_size as u64;
            if !len.is_multiple_of(bs) {
                return Err(VolumeError::device(format!(
                    "hotzone of {len} bytes is not a whole number of {bs}-byte checksum blocks"
                )));
            }
            let hlen = alg.output_len();
            let blocks = (len / bs) as usize;
            if (blocks * hlen) as u64 > ks.area_size {
                return Err(VolumeError::device(
                    "hotzone checksums do not fit the reencrypt keyslot area",
                ));
            }
            let mut sums = vec![0u8; blocks * hlen];
            header
                .read_at(ks.area_offset, &mut sums)
                .map_err(|e| VolumeError::device(format!("reading hotzone checksums: {e}")))?;
            data.read_at(hz.offset, &mut buf)?;
            for (i, block) in buf.chunks_mut(bs as usize).enumerate() {
                let pos = hz.offset + i as u64 * bs;
                let old = alg.digest(&[block]) == sums[i * hlen..(i + 1) * hlen];
                if old {
                    ciphers.old()?.decrypt_at(pos, block)?;
                } else {
                    ciphers.new_side()?.decrypt_at(pos, block)?;
                }
            }
        }
        Resilience::Journal => {
            if len > ks.area_size {
                return Err(VolumeError::device(
                    "hotzone is larger than the reencrypt journal",
                ));
            }
            header
                .read_at(ks.area_offset, &mut buf)
                .map_err(|e| VolumeError::device(format!("reading hotzone journal: {e}")))?;
            ciphers.old()?.decrypt_at(hz.offset, &mut buf)?;
        }
        Resilience::None => {
            return Err(VolumeError::device(
                "The reencryption hotzone was interrupted with resilience 'none': its data \
                 cannot be recovered.",
            ))
        }
        other => {
            return Err(VolumeError::usage(format!(
                "hotzone recovery of {other:?} is not supported yet"
            )))
        }
    }
    Ok(buf)
}
