//! `luksFormat`: a new LUKS1 or LUKS2 header from typed parameters, with cryptsetup 2.x
//! defaults where the caller leaves a choice open.

use crate::error::{Result, VolumeError};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks1::{Luks1FormatParams, Luks1Volume};
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header};

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
