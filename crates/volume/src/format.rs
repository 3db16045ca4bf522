//! `luksFormat`: a new LUKS1 or LUKS2 header from typed parameters, with cryptsetup 2.x
//! defaults where the caller leaves a choice open.

use crate::error::{Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks1::{Luks1FormatParams, Luks1Volume};
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header};
use std::path::Path;

/// cryptsetup's default cipher for LUKS.
pub const DEFAULT_LUKS_CIPHER: &str = "aes-xts-plain64";

/// What a new header is made of.
#[derive(Clone, Debug)]
pub enum FormatRequest {
    /// LUKS1.
    Luks1(Box<Luks1FormatParams>),
    /// LUKS2 (`params.keyslot` says how the first keyslot is made).
    Luks2(Box<FormatParams>),
}

/// The cipher and key size (bytes) of a new volume: `--cipher` or aes-xts-plain64, and
/// `--key-size` bits or cryptsetup's default (512 for XTS, 256 otherwise), checked against
/// the cipher.
pub fn cipher_and_key_bytes(
    cipher: Option<&str>,
    key_bits: Option<u32>,
) -> Result<(String, usize)> {
    let cipher = cipher.unwrap_or(DEFAULT_LUKS_CIPHER).to_string();
    let bits = key_bits_or_default(&cipher, key_bits)?;
    cryptblk_cipher::CipherSpec::parse(&cipher)?.check_key_size(bits / 8)?;
    Ok((cipher, bits / 8))
}

/// Bytes of a new volume key: the encryption key's `key_bytes`, plus the integrity key of
/// `integrity` (`--integrity`, with `--integrity-key-size` in bytes) when there is one.
pub fn new_volume_key_bytes(
    key_bytes: usize,
    integrity: Option<&str>,
    integrity_key_bytes: Option<usize>,
) -> Result<usize> {
    Ok(match integrity {
        Some(name) => {
            key_bytes
                + cryptblk_format::luks2::integrity::IntegrityAlgorithm::from_name(name)?
                    .key_size(integrity_key_bytes)?
        }
        None => key_bytes,
    })
}

/// A volume key from `--volume-key-file`: the first `key_bytes` bytes of the file, refused
/// with cryptsetup's message when it holds fewer (see
/// [`cryptblk_format::keyfile::read_volume_key_file`]).
pub fn read_volume_key_file(path: &Path, key_bytes: usize) -> Result<SecretBytes> {
    Ok(cryptblk_format::keyfile::read_volume_key_file(
        path, key_bytes,
    )?)
}

/// `--key-size` bits, or cryptsetup's default for `cipher` (512 for XTS, 256 otherwise); a
/// size that is no whole number of bytes is refused.
pub fn key_bits_or_default(cipher: &str, key_bits: Option<u32>) -> Result<usize> {
    let bits = match key_bits {
        Some(b) => b,
        None if cipher.contains("xts") => 512,
        None => 256,
    };
    if bits == 0 || bits % 8 != 0 {
        return Err(VolumeError::usage(format!(
            "Key size {bits} is not a multiple of 8 bits."
        )));
    }
    Ok(bits as usize)
}

/// A hash named on the command line (`--hash`), default sha256.
pub fn hash_or_default(name: Option<&str>) -> Result<HashAlgorithm> {
    match name {
        Some(h) => HashAlgorithm::from_name(h)
            .map_err(|_| VolumeError::usage(format!("Hash algorithm {h} not supported."))),
        None => Ok(HashAlgorithm::Sha256),
    }
}

/// The encryption sector size of a new LUKS2 volume whose data lives on `data_device`:
/// `requested` (`--sector-size`) when given, else cryptsetup 2.6's choice
/// ([`default_sector_size`] of the device's optimal size, its size and the explicit
/// `--offset` in 512-byte sectors).
pub fn luks2_sector_size(
    requested: Option<u32>,
    data_device: &Path,
    data_offset_sectors: Option<u64>,
) -> Result<u32> {
    if let Some(s) = requested {
        return Ok(s);
    }
    let optimal = crate::device::optimal_encryption_sector_size(data_device)?;
    let size = crate::device::device_size(data_device)?;
    Ok(default_sector_size(
        optimal,
        Some(size),
        data_offset_sectors,
    ))
}

/// cryptsetup 2.6's default LUKS2 sector size for a data device whose optimal encryption
/// sector size is `optimal` (4096 for image files, see
/// [`crate::device::optimal_encryption_sector_size`]): `optimal`, falling back to 512 when
/// the device size (`None`: a new image, always whole sectors) is no multiple of it, or when
/// an explicit data offset (`--offset`, 512-byte sectors) is no multiple of it *counted in
/// sectors*: cryptsetup 2.6 compares the offset's sector count with the sector size in bytes,
/// so `--offset 32776` (4 KiB aligned) gets 512 while `--offset 36864` gets 4096. A LUKS2
/// header's own default data offset (16 MiB) is never checked that way.
pub fn default_sector_size(
    optimal: u32,
    device_size: Option<u64>,
    data_offset_sectors: Option<u64>,
) -> u32 {
    let optimal_u64 = u64::from(optimal);
    if optimal <= 512
        || data_offset_sectors.is_some_and(|o| o % optimal_u64 != 0)
        || device_size.is_some_and(|s| s % optimal_u64 != 0)
    {
        return 512;
    }
    optimal
}

/// Keyslot parameters for a new LUKS2 keyslot.
pub fn keyslot_params(
    pbkdf: PbkdfRequest,
    af_hash: HashAlgorithm,
    slot: Option<usize>,
) -> KeyslotParams {
    let mut p = KeyslotParams::new(pbkdf);
    p.af_hash = af_hash;
    p.slot = slot;
    p
}

/// Writes the header `req` describes onto `dev` with a first keyslot for `passphrase`;
/// returns the volume key and the data offset in bytes.
pub fn format_header(
    dev: &dyn HeaderIo,
    req: &FormatRequest,
    passphrase: &[u8],
) -> Result<(SecretBytes, u64)> {
    match req {
        FormatRequest::Luks1(p) => {
            let (v, key) = Luks1Volume::format(dev, p, passphrase)?;
            Ok((key, v.header().data_offset_bytes()))
        }
        FormatRequest::Luks2(p) => {
            let (h, key, _slot) = Luks2Header::format(dev, p, passphrase)?;
            Ok((key, h.data_offset()))
        }
    }
}

/// Parses sizes such as `16384`, `16k`, `4m` (bytes), naming `what` on error.
pub fn parse_bytes(text: &str, what: &str) -> Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (num, mult) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (t.as_str(), 1u64),
        Some((i, _)) => {
            let m = match &t[i..] {
                "k" | "kib" | "kb" => 1 << 10,
                "m" | "mib" | "mb" => 1 << 20,
                "g" | "gib" | "gb" => 1 << 30,
                _ => return Err(VolumeError::usage(format!("invalid {what} '{text}'"))),
            };
            (&t[..i], m)
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| VolumeError::usage(format!("invalid {what} '{text}'")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("16k", "x").unwrap(), 16384);
        assert_eq!(parse_bytes("4m", "x").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("512", "x").unwrap(), 512);
        assert!(parse_bytes("12q", "x").is_err());
        assert!(parse_bytes("k", "x").is_err());
    }

    /// The cases were read off cryptsetup 2.6.1 (`luksFormat` then `luksDump`, or `--debug`'s
    /// "Reverting to 512 bytes").
    #[test]
    fn sector_size_defaults_follow_cryptsetup() {
        // A 32 MiB image file: 4096.
        assert_eq!(default_sector_size(4096, Some(32 << 20), None), 4096);
        // 32 MiB + 512 bytes: the size is not 4 KiB aligned.
        assert_eq!(default_sector_size(4096, Some((32 << 20) + 512), None), 512);
        // --offset 32776 and 32896 (4 KiB aligned bytes) fall back; multiples of 4096 don't.
        for (offset, want) in [(32776, 512), (32896, 512), (34816, 512), (32768, 4096)] {
            assert_eq!(
                default_sector_size(4096, Some(64 << 20), Some(offset)),
                want,
                "--offset {offset}"
            );
        }
        assert_eq!(default_sector_size(4096, Some(64 << 20), Some(36864)), 4096);
        // A 512-byte block device stays at 512.
        assert_eq!(default_sector_size(512, Some(64 << 20), None), 512);
        // A new image (size unknown, always padded to whole sectors).
        assert_eq!(default_sector_size(4096, None, None), 4096);
    }

    #[test]
    fn regular_files_suit_4096_byte_sectors() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        assert_eq!(
            crate::device::optimal_encryption_sector_size(&img).unwrap(),
            4096
        );
        assert_eq!(luks2_sector_size(None, &img, None).unwrap(), 4096);
        assert_eq!(luks2_sector_size(Some(512), &img, None).unwrap(), 512);
        std::fs::write(&img, vec![0u8; (1 << 20) + 512]).unwrap();
        assert_eq!(luks2_sector_size(None, &img, None).unwrap(), 512);
    }

    #[test]
    fn key_size_defaults_follow_cryptsetup() {
        assert_eq!(
            cipher_and_key_bytes(None, None).unwrap(),
            ("aes-xts-plain64".into(), 64)
        );
        assert_eq!(
            cipher_and_key_bytes(Some("aes-cbc-essiv:sha256"), None)
                .unwrap()
                .1,
            32
        );
        assert!(cipher_and_key_bytes(None, Some(100)).is_err());
    }
}
