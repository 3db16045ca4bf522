//! Authenticated encryption in the crypt target (`integrity:<bytes>:aead|none`): the device
//! below must keep `<bytes>` of caller metadata per sector (dm-integrity without an
//! internal hash, or anything passing its tags through), where each sector's
//! authentication tag and, for `-random` IVs, its IV are stored.
//!
//! As in the kernel, a sector whose tag does not verify fails the read with `EILSEQ` and is
//! counted (`integrity_errors` in the status). Requests run inline on the calling thread;
//! queued flags are accepted and reported as falling back to inline.

use std::fmt;
use std::io;
use std::sync::Arc;

use cryptblk_cipher::aead::{open_aead_cipher, AeadError, AeadOptions, AeadSectorCipher};
use cryptblk_cipher::{CipherError, SectorCipher};

use super::{cipher_io, CryptParams, CryptTarget, WriteData};
use crate::device::{BlockDevice, WriteFlags};
use crate::error::{errno, DmError};
use crate::targets::integrity::with_scratch;
use crate::SECTOR_SIZE;

/// The kernel's limit on `integrity:<bytes>` (dm-crypt's `MAX_TAG_SIZE`).
const MAX_TUPLE: u32 = 480;

/// What the per-sector metadata holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntegrityKind {
    /// `aead`: an authentication tag (and the IV, for random IVs).
    Aead,
    /// `none`: only the IV of random-IV modes; nothing is authenticated.
    None,
}

impl IntegrityKind {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            IntegrityKind::Aead => "aead",
            IntegrityKind::None => "none",
        }
    }
}

/// The `integrity:<bytes>:<type>` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CryptIntegrity {
    /// Metadata bytes per encryption sector (the integrity device's tag size).
    pub tuple_size: u32,
    /// Tag type.
    pub kind: IntegrityKind,
}

impl CryptIntegrity {
    /// Parses `integrity:<bytes>:<type>`.
    pub fn parse(opt: &str) -> Result<Self, String> {
        let bad = || {
            format!("invalid integrity arguments '{opt}' (expected integrity:<bytes>:aead|none)")
        };
        let rest = opt.strip_prefix("integrity:").ok_or_else(bad)?;
        let (n, kind) = rest.split_once(':').ok_or_else(bad)?;
        let tuple_size: u32 = n.parse().map_err(|_| bad())?;
        if tuple_size == 0 || tuple_size > MAX_TUPLE {
            return Err(bad());
        }
        let kind = if kind.eq_ignore_ascii_case("aead") {
            IntegrityKind::Aead
        } else if kind.eq_ignore_ascii_case("none") {
            IntegrityKind::None
        } else {
            return Err(format!("unknown integrity profile '{kind}'"));
        };
        Ok(CryptIntegrity { tuple_size, kind })
    }
}

impl fmt::Display for CryptIntegrity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "integrity:{}:{}", self.tuple_size, self.kind.name())
    }
}

/// Stands in for the plain [`SectorCipher`] of an authenticated target (whose data cannot
/// be processed without its metadata): it reports the sector size and implementation, and
/// refuses to process data.
struct MetadataRequired {
    sector_size: usize,
    implementation: String,
}

impl SectorCipher for MetadataRequired {
    fn sector_size(&self) -> usize {
        self.sector_size
    }
    fn encrypt(&self, _: u64, _: &mut [u8]) -> Result<(), CipherError> {
        Err(CipherError::Unsupported(
            "authenticated encryption needs per-sector metadata".into(),
        ))
    }
    fn decrypt(&self, _: u64, _: &mut [u8]) -> Result<(), CipherError> {
        Err(CipherError::Unsupported(
            "authenticated encryption needs per-sector metadata".into(),
        ))
    }
    fn implementation(&self) -> &str {
        &self.implementation
    }
}

/// Builds a crypt target with `integrity:` in its flags.
pub(super) fn new_target(
    dev: Arc<dyn BlockDevice>,
    len: u64,
    params: CryptParams,
) -> Result<CryptTarget, DmError> {
    let shape = |msg: String| DmError::TableShape(format!("crypt target: {msg}"));
    let integrity = params
        .flags
        .integrity
        .ok_or_else(|| shape("no integrity option".into()))?;
    let aead = open_aead(&params, params.key.as_bytes())?;
    // The kernel's integrity-profile checks of the device below.
    let dev_tags = dev.tag_size();
    if dev_tags == 0 {
        return Err(shape(format!(
            "device {} has no integrity profile (integrity:{} needs dm-integrity without an internal hash below)",
            params.dev_spec, integrity.tuple_size
        )));
    }
    if dev_tags != integrity.tuple_size {
        return Err(shape(format!(
            "integrity profile tag size mismatch: device {} keeps {dev_tags} bytes per sector, the table says {}",
            params.dev_spec, integrity.tuple_size
        )));
    }
    if dev.logical_block_size() != params.flags.sector_size {
        return Err(shape(format!(
            "integrity profile sector size mismatch: device {} has {}-byte blocks, sector_size is {}",
            params.dev_spec,
            dev.logical_block_size(),
            params.flags.sector_size
        )));
    }
    let stand_in = stand_in(aead.as_ref());
    CryptTarget::build(dev, len, params, stand_in, Some(aead))
}

/// Opens the authenticated cipher of `params` (whose flags carry `integrity:`) with `key`.
pub(super) fn open_aead(
    params: &CryptParams,
    key: &[u8],
) -> Result<Arc<dyn AeadSectorCipher>, DmError> {
    let integrity = params
        .flags
        .integrity
        .ok_or_else(|| DmError::TableShape("crypt target: no integrity option".into()))?;
    let opts = AeadOptions {
        sector_size: params.flags.sector_size as usize,
        iv_offset: params.iv_offset,
        iv_large_sectors: params.flags.iv_large_sectors,
        tuple_size: integrity.tuple_size as usize,
        authenticated: integrity.kind == IntegrityKind::Aead,
        integrity_key_size: params.flags.integrity_key_size.map(|n| n as usize),
    };
    Ok(Arc::from(open_aead_cipher(
        &params.cipher_spec,
        key,
        &opts,
    )?))
}

/// The plain-cipher stand-in that describes an authenticated cipher (its sector size and
/// implementation) where a [`SectorCipher`] is expected.
pub(super) fn stand_in(aead: &dyn AeadSectorCipher) -> Arc<dyn SectorCipher> {
    Arc::new(MetadataRequired {
        sector_size: aead.sector_size(),
        implementation: aead.implementation().to_string(),
    })
}

impl CryptTarget {
    /// Metadata bytes of a `len`-byte request.
    fn tags_len(&self, len: usize) -> usize {
        let ss = self.params.flags.sector_size as usize;
        let tuple = self.params.flags.integrity.map_or(0, |i| i.tuple_size) as usize;
        len / ss * tuple
    }

    pub(super) fn read_aead(
        &self,
        aead: &dyn AeadSectorCipher,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        with_scratch(self.tags_len(buf.len()), |tags| {
            self.dev.read_with_tags(self.base() + offset, buf, tags)?;
            self.open_sectors(aead, offset, buf, tags)
        })
    }

    fn open_sectors(
        &self,
        aead: &dyn AeadSectorCipher,
        offset: u64,
        buf: &mut [u8],
        tags: &[u8],
    ) -> io::Result<()> {
        match aead.decrypt(offset / SECTOR_SIZE, buf, tags) {
            Ok(()) => Ok(()),
            Err(AeadError::Auth { sector }) => {
                self.stats.integrity_error();
                eprintln!(
                    "device-mapper: crypt: {}: INTEGRITY AEAD ERROR, sector {sector}",
                    self.params.dev_spec
                );
                // Never hand out unauthenticated plaintext.
                buf.fill(0);
                Err(errno(libc::EILSEQ))
            }
            Err(AeadError::Cipher(e)) => Err(cipher_io(e)),
        }
    }

    pub(super) fn write_aead(
        &self,
        aead: &dyn AeadSectorCipher,
        offset: u64,
        data: WriteData<'_>,
        flags: WriteFlags,
    ) -> io::Result<()> {
        let mut owned;
        let buf: &mut [u8] = match data {
            WriteData::Scratch(b) => b,
            WriteData::Borrowed(b) => {
                owned = b.to_vec();
                &mut owned
            }
        };
        with_scratch(self.tags_len(buf.len()), |tags| {
            aead.encrypt(offset / SECTOR_SIZE, buf, tags)
                .map_err(|e| match e {
                    AeadError::Cipher(c) => cipher_io(c),
                    AeadError::Auth { .. } => errno(libc::EIO),
                })?;
            self.dev
                .write_with_tags(self.base() + offset, buf, tags, flags)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::crypt::CryptFlags;

    #[test]
    fn integrity_option_parses_and_prints_in_kernel_order() {
        let opts: Vec<String> = [
            "no_write_workqueue",
            "sector_size:4096",
            "integrity:28:aead",
            "no_read_workqueue",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let f = CryptFlags::parse(&opts).unwrap();
        assert_eq!(
            f.integrity,
            Some(CryptIntegrity {
                tuple_size: 28,
                kind: IntegrityKind::Aead
            })
        );
        // The kernel's order: workqueue flags, integrity, sector_size.
        assert_eq!(
            f.format(),
            [
                "no_read_workqueue",
                "no_write_workqueue",
                "integrity:28:aead",
                "sector_size:4096"
            ]
        );
        let f = CryptFlags::parse(&["integrity:16:NONE".to_string()]).unwrap();
        assert_eq!(f.integrity.unwrap().kind, IntegrityKind::None);
        assert_eq!(f.format(), ["integrity:16:none"]);
        for bad in [
            "integrity:0:aead",
            "integrity:481:aead",
            "integrity:28:hmac",
            "integrity:28",
            "integrity:x:aead",
            "integrity_key_size:0",
        ] {
            assert!(CryptFlags::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
        let f = CryptFlags::parse(&[
            "integrity_key_size:33".to_string(),
            "integrity:32:aead".to_string(),
        ])
        .unwrap();
        assert_eq!(f.format(), ["integrity:32:aead", "integrity_key_size:33"]);
    }
}
