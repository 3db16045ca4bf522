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
//! - `datashift` (and the first, in-place hotzone of `datashift-checksum`/`-journal`
//!   aside): the hotzone's new place does not overlap its old data, which therefore is
//!   still whole where it was (the moved segment for the first `shift` bytes); recovery
//!   reads it from there.
//!
//! Plaintext sides (an encryption's old data, a decryption's new data) go through an
//! identity "cipher".

use super::keys::ReencryptKeys;
use super::state::{ReencryptState, StateSegment};
use crate::error::{Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::{SecretBytes, SectorCipher, SectorOptions};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::luks2::{Resilience, SegmentInfo};

/// A whole-device cipher of a backup segment (old or new parameters) under `key`; none
/// for a linear (plaintext) segment.
pub struct SideCipher {
    cipher: Option<Box<dyn SectorCipher>>,
    offset: u64,
}

impl SideCipher {
    /// The cipher of `seg` (`backup-previous` or `backup-final`) keyed with `key`.
    pub fn new(seg: &SegmentInfo, key: &[u8]) -> Result<SideCipher> {
        if seg.kind == "linear" {
            return Ok(Self::plain(seg));
        }
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
            cipher: Some(cipher),
            offset: seg.offset,
        })
    }

    /// The identity "cipher" of a linear segment.
    pub fn plain(seg: &SegmentInfo) -> SideCipher {
        SideCipher {
            cipher: None,
            offset: seg.offset,
        }
    }

    /// Encrypts `buf`, which is to lie at byte `pos` of the data device.
    pub fn encrypt_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let rel = pos.checked_sub(self.offset).ok_or_else(|| {
            VolumeError::device(format!("byte {pos} lies before its segment's start"))
        })?;
        self.encrypt_logical(rel, buf)
    }

    /// Decrypts `buf`, which lies at byte `pos` of the data device.
    pub fn decrypt_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        let rel = pos.checked_sub(self.offset).ok_or_else(|| {
            VolumeError::device(format!("byte {pos} lies before its segment's start"))
        })?;
        self.decrypt_logical(rel, buf)
    }

    /// Encrypts `buf` holding the volume's bytes from logical offset `l` (IVs count from
    /// the segment's start, wherever a data shift puts the bytes).
    pub fn encrypt_logical(&self, l: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(c) = &self.cipher {
            c.encrypt(l / 512, buf)?;
        }
        Ok(())
    }

    /// Decrypts `buf` holding the volume's bytes from logical offset `l`.
    pub fn decrypt_logical(&self, l: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(c) = &self.cipher {
            c.decrypt(l / 512, buf)?;
        }
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
        let side = |seg: &SegmentInfo, key: Option<&SecretBytes>| -> Result<Option<SideCipher>> {
            if seg.kind == "linear" {
                return Ok(Some(SideCipher::plain(seg)));
            }
            key.map(|k| SideCipher::new(seg, k.as_bytes())).transpose()
        };
        Ok(Ciphers {
            old: side(&state.previous, keys.old.as_ref())?,
            new: side(&state.fin, keys.new.as_ref())?,
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

/// Reads the old data of logical `[l, l + buf.len())` from where it lies (the moved
/// segment for the first `shift` bytes of a datashift) and decrypts it.
pub fn read_old(
    state: &ReencryptState,
    ciphers: &Ciphers,
    data: &dyn HeaderIo,
    l: u64,
    buf: &mut [u8],
) -> Result<()> {
    read_old_raw(state, data, l, buf)?;
    ciphers.old()?.decrypt_logical(l, buf)
}

/// The old data of logical `[l, l + buf.len())` as it lies on disk (still under the old
/// key), read from wherever it lies (the moved segment for the first `shift` bytes).
pub(crate) fn read_old_raw(
    state: &ReencryptState,
    data: &dyn HeaderIo,
    l: u64,
    buf: &mut [u8],
) -> Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let pos = l + done as u64;
        let mut n = buf.len() - done;
        if let Some(m) = &state.moved {
            let ms = m.size.unwrap_or(0);
            if pos < ms {
                n = n.min((ms - pos) as usize);
            }
        }
        data.read_at(state.old_phys(pos), &mut buf[done..done + n])
            .map_err(|e| VolumeError::device(format!("reading the old data: {e}")))?;
        done += n;
    }
    Ok(())
}

/// The plaintext of the hotzone `hz` (`len` bytes), recovered without changing anything
/// on disk: where the data moves (datashift) the old data is still whole in its old
/// place; in place, the resilience data decides block by block.
pub fn hotzone_plaintext(
    state: &ReencryptState,
    ciphers: &Ciphers,
    header: &dyn HeaderIo,
    data: &dyn HeaderIo,
    hz: &StateSegment,
    len: u64,
) -> Result<Vec<u8>> {
    let ks = &state.keyslot;
    let l = hz.logical;
    let mut buf = vec![0u8; len as usize];
    if !state.in_place(l, len) {
        read_old(state, ciphers, data, l, &mut buf)?;
        return Ok(buf);
    }
    if state.old_phys(l) != state.new_phys(l) {
        return Err(VolumeError::device(
            "the reencryption hotzone overlaps its own old data: it cannot be recovered",
        ));
    }
    let phys = state.new_phys(l);
    match &ks.resilience {
        Resilience::Checksum { hash, sector_size }
        | Resilience::DatashiftChecksum {
            hash, sector_size, ..
        } => {
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
            data.read_at(phys, &mut buf)?;
            for (i, block) in buf.chunks_mut(bs as usize).enumerate() {
                let bl = l + i as u64 * bs;
                let old = alg.digest(&[block]) == sums[i * hlen..(i + 1) * hlen];
                if old {
                    ciphers.old()?.decrypt_logical(bl, block)?;
                } else {
                    ciphers.new_side()?.decrypt_logical(bl, block)?;
                }
            }
        }
        Resilience::Journal | Resilience::DatashiftJournal { .. } => {
            if len > ks.area_size {
                return Err(VolumeError::device(
                    "hotzone is larger than the reencrypt journal",
                ));
            }
            header
                .read_at(ks.area_offset, &mut buf)
                .map_err(|e| VolumeError::device(format!("reading hotzone journal: {e}")))?;
            ciphers.old()?.decrypt_logical(l, &mut buf)?;
        }
        Resilience::None | Resilience::Datashift { .. } => {
            return Err(VolumeError::device(
                "The reencryption hotzone was interrupted with resilience 'none': its data \
                 cannot be recovered.",
            ))
        }
    }
    Ok(buf)
}
