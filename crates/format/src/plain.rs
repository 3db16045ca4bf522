//! Plain dm-crypt: no header; the volume key comes from a hashed passphrase or a raw key file.
//!
//! Matches cryptsetup 2.6 `open --type plain`:
//! - defaults `aes-cbc-essiv:sha256`, 256-bit key, passphrase hash `ripemd160`;
//! - a passphrase (typed, piped, or `--key-file -`) is hashed with `--hash`: round `r`
//!   (0, 1, ...) appends `H("A" * r || passphrase)` until the key is full (the hashalot
//!   scheme), `hash:N` hashes only the first N key bytes and zero-pads the rest, and
//!   `plain` uses the passphrase bytes as they are;
//! - a key file (not stdin) is never hashed: exactly `key size` bytes are read after
//!   `--keyfile-offset` (`--keyfile-size` is ignored);
//! - `--offset` is the data start and `--skip` the IV offset, both in 512-byte sectors;
//!   `--size` limits the mapping (default: the rest of the device).

use crate::error::{FormatError, Result};
use crate::keyfile::{self, KeyFileLimits};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use std::path::Path;

/// cryptsetup 2.6's default plain-mode cipher.
pub const DEFAULT_PLAIN_CIPHER: &str = "aes-cbc-essiv:sha256";
/// cryptsetup 2.6's default plain-mode key size in bytes (256 bits).
pub const DEFAULT_PLAIN_KEY_BYTES: usize = 32;
/// cryptsetup 2.6's default plain-mode passphrase hash.
pub const DEFAULT_PLAIN_HASH: &str = "ripemd160";

/// Options of `open --type plain`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlainParams {
    /// dm-crypt cipher specification.
    pub cipher_spec: String,
    /// Key length in bytes.
    pub key_bytes: usize,
    /// Passphrase hash spec (`ripemd160`, `sha256:16`, `plain`).
    pub hash: String,
    /// Data start on the device, in 512-byte sectors (`--offset`).
    pub offset_sectors: u64,
    /// IV offset in 512-byte sectors (`--skip`).
    pub iv_offset_sectors: u64,
    /// Mapping length in 512-byte sectors (`--size`); `None` = to the end of the device.
    pub size_sectors: Option<u64>,
    /// Encryption sector size in bytes (`--sector-size`).
    pub sector_size: u32,
}

impl Default for PlainParams {
    fn default() -> Self {
        PlainParams {
            cipher_spec: DEFAULT_PLAIN_CIPHER.into(),
            key_bytes: DEFAULT_PLAIN_KEY_BYTES,
            hash: DEFAULT_PLAIN_HASH.into(),
            offset_sectors: 0,
            iv_offset_sectors: 0,
            size_sectors: None,
            sector_size: 512,
        }
    }
}

/// A plain volume ready to be mapped: the dm-crypt target parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlainVolume {
    /// dm-crypt cipher specification.
    pub cipher_spec: String,
    /// The volume key.
    pub volume_key: SecretBytes,
    /// Data start on the device, in 512-byte sectors.
    pub offset_sectors: u64,
    /// IV offset in 512-byte sectors.
    pub iv_offset_sectors: u64,
    /// Mapping length in 512-byte sectors.
    pub size_sectors: u64,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
}

/// Derives a plain-mode key from a passphrase as cryptsetup's `crypt_plain_hash` does.
pub fn plain_hash(hash_spec: &str, passphrase: &[u8], key_bytes: usize) -> Result<SecretBytes> {
    let (name, hashed_len) = match hash_spec.split_once(':') {
        Some((name, n)) => {
            let n: usize = n.parse().map_err(|_| {
                FormatError::InvalidParameter(format!(
                    "hash length in '{hash_spec}' is not a number"
                ))
            })?;
            if n > key_bytes {
                return Err(FormatError::InvalidParameter(format!(
                    "hash length {n} is longer than the key ({key_bytes} bytes)"
                )));
            }
            (name, n)
        }
        None => (hash_spec, key_bytes),
    };
    let mut key = SecretBytes::zeroed(key_bytes);
    if name == "plain" {
        if passphrase.len() < hashed_len {
            return Err(FormatError::InvalidParameter(
                "passphrase is shorter than the key for hash 'plain'".into(),
            ));
        }
        key.as_mut_bytes()[..hashed_len].copy_from_slice(&passphrase[..hashed_len]);
        return Ok(key);
    }
    let hash = HashAlgorithm::from_name(name)?;
    let mut filled = 0;
    let mut round = 0usize;
    while filled < hashed_len {
        // Each round prefixes one more 'A' (hashalot's trick against NUL bytes in keys).
        let prefix = vec![b'A'; round];
        let digest = zeroize::Zeroizing::new(hash.digest(&[&prefix, passphrase]));
        let n = digest.len().min(hashed_len - filled);
        key.as_mut_bytes()[filled..filled + n].copy_from_slice(&digest[..n]);
        filled += n;
        round += 1;
    }
    Ok(key)
}

impl PlainVolume {
    /// A plain volume keyed by a passphrase (typed, piped or `--key-file -`), hashed per
    /// `params.hash`. `device_size` is the backing device size in bytes.
    pub fn from_passphrase(
        params: &PlainParams,
        passphrase: &[u8],
        device_size: u64,
    ) -> Result<Self> {
        let key = plain_hash(&params.hash, passphrase, params.key_bytes)?;
        Self::from_key(params, key, device_size)
    }

    /// A plain volume keyed by a key file, read raw: exactly `key_bytes` bytes after
    /// `keyfile_offset` (the file may be longer).
    pub fn from_key_file(
        params: &PlainParams,
        path: &Path,
        keyfile_offset: u64,
        device_size: u64,
    ) -> Result<Self> {
        let key = keyfile::read_key_file(
            path,
            KeyFileLimits {
                offset: keyfile_offset,
                size: Some(params.key_bytes),
            },
        )?;
        Self::from_key(params, key, device_size)
    }

    /// A plain volume with a ready volume key.
    pub fn from_key(
        params: &PlainParams,
        volume_key: SecretBytes,
        device_size: u64,
    ) -> Result<Self> {
        if volume_key.len() != params.key_bytes {
            return Err(FormatError::InvalidParameter(format!(
                "key is {} bytes, key size is {}",
                volume_key.len(),
                params.key_bytes
            )));
        }
        cryptblk_cipher::CipherSpec::parse(&params.cipher_spec)?
            .check_key_size(params.key_bytes)?;
        let device_sectors = device_size / 512;
        let size_sectors = match params.size_sectors {
            Some(s) => s,
            None => device_sectors
                .checked_sub(params.offset_sectors)
                .ok_or_else(|| {
                    FormatError::TooSmall(format!(
                        "offset {} sectors is beyond the device ({device_sectors} sectors)",
                        params.offset_sectors
                    ))
                })?,
        };
        if size_sectors == 0 {
            return Err(FormatError::TooSmall("no space left for data".into()));
        }
        if params.offset_sectors + size_sectors > device_sectors {
            return Err(FormatError::TooSmall(format!(
                "offset {} + size {size_sectors} sectors exceeds the device ({device_sectors} sectors)",
                params.offset_sectors
            )));
        }
        let ss = params.sector_size as u64;
        if !(512..=4096).contains(&ss)
            || !ss.is_power_of_two()
            || !(size_sectors * 512).is_multiple_of(ss)
        {
            return Err(FormatError::InvalidParameter(format!(
                "sector size {ss} does not fit a mapping of {size_sectors} sectors"
            )));
        }
        Ok(PlainVolume {
            cipher_spec: params.cipher_spec.clone(),
            volume_key,
            offset_sectors: params.offset_sectors,
            iv_offset_sectors: params.iv_offset_sectors,
            size_sectors,
            sector_size: params.sector_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_keys_are_a_truncated_digest() {
        let k = plain_hash("sha256", b"abc", 16).unwrap();
        assert_eq!(k.to_hex(), "ba7816bf8f01cfea414140de5dae2223");
    }

    #[test]
    fn long_keys_append_rounds_with_a_prefix() {
        let k = plain_hash("sha1", b"pw", 48).unwrap();
        let r0 = HashAlgorithm::Sha1.digest(&[b"pw"]);
        let r1 = HashAlgorithm::Sha1.digest(&[b"A", b"pw"]);
        let r2 = HashAlgorithm::Sha1.digest(&[b"AA", b"pw"]);
        let expect: Vec<u8> = [&r0[..], &r1[..], &r2[..8]].concat();
        assert_eq!(k.as_bytes(), &expect[..]);
    }

    #[test]
    fn hash_length_suffix_pads_with_zeros() {
        let k = plain_hash("sha256:4", b"abc", 8).unwrap();
        assert_eq!(k.to_hex(), "ba7816bf00000000");
        assert!(plain_hash("sha256:9", b"abc", 8).is_err());
        assert!(plain_hash("sha256:x", b"abc", 8).is_err());
    }

    #[test]
    fn plain_hash_copies_bytes() {
        let k = plain_hash("plain", b"0123456789", 4).unwrap();
        assert_eq!(k.as_bytes(), b"0123");
        assert!(plain_hash("plain", b"01", 4).is_err());
    }

    #[test]
    fn table_and_size() {
        let p = PlainParams {
            offset_sectors: 8,
            iv_offset_sectors: 3,
            ..Default::default()
        };
        let v = PlainVolume::from_key(&p, SecretBytes::from_slice(&[0x11; 32]), 1 << 20).unwrap();
        assert_eq!(v.size_sectors, 2048 - 8);
        // The fields of its crypt line (printed by the dm crate's CryptConfig; its tests
        // check this volume's line).
        assert_eq!(
            (
                v.cipher_spec.as_str(),
                v.volume_key.to_hex().as_str(),
                v.iv_offset_sectors,
                v.offset_sectors,
                v.sector_size
            ),
            ("aes-cbc-essiv:sha256", "11".repeat(32).as_str(), 3, 8, 512)
        );
        let too_big = PlainParams {
            size_sectors: Some(4096),
            ..Default::default()
        };
        assert!(
            PlainVolume::from_key(&too_big, SecretBytes::from_slice(&[0; 32]), 1 << 20).is_err()
        );
    }
}
