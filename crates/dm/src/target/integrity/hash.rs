//! Internal hashes of dm-integrity (`internal_hash:<alg>[:<hex key>]`): the tag of a block
//! is `H([salt ||] sector_le64 || block)` truncated or zero-padded to the tag size, where
//! `sector` is the block's first logical 512-byte sector and the salt (from the superblock)
//! is mixed in only with `fix_hmac`.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;

/// A supported internal hash.
pub enum InternalHash {
    /// CRC-32C (Castagnoli), the integritysetup default: 4-byte little-endian tag.
    Crc32c,
    /// A plain digest (`sha1`, `sha256`, ...).
    Digest(HashAlgorithm),
    /// `hmac(<digest>)` with a key.
    Hmac(HashAlgorithm, SecretBytes),
}

impl InternalHash {
    /// Parses the kernel crypto API name (`crc32c`, `sha256`, `hmac(sha256)`) and key.
    pub fn new(name: &str, key: Option<SecretBytes>) -> Result<Self, String> {
        if let Some(inner) = name.strip_prefix("hmac(").and_then(|s| s.strip_suffix(')')) {
            let alg = HashAlgorithm::from_name(inner)
                .map_err(|_| format!("unsupported internal hash '{name}'"))?;
            let key = key.ok_or_else(|| format!("internal hash '{name}' needs a key"))?;
            return Ok(InternalHash::Hmac(alg, key));
        }
        if key.is_some() {
            return Err(format!("internal hash '{name}' takes no key"));
        }
        if name == "crc32c" {
            return Ok(InternalHash::Crc32c);
        }
        match HashAlgorithm::from_name(name) {
            Ok(alg) => Ok(InternalHash::Digest(alg)),
            Err(_) => Err(format!(
                "unsupported internal hash '{name}' (supported: crc32c, sha1, sha256, sha512, hmac(sha*))"
            )),
        }
    }

    /// Digest length in bytes (the default tag size).
    pub fn digest_size(&self) -> usize {
        match self {
            InternalHash::Crc32c => 4,
            InternalHash::Digest(a) | InternalHash::Hmac(a, _) => a.output_len(),
        }
    }

    /// Writes the tag of `block` at logical `sector` into `out` (its length is the tag
    /// size).
    pub fn tag(&self, salt: Option<&[u8; 16]>, sector: u64, block: &[u8], out: &mut [u8]) {
        let sector_le = sector.to_le_bytes();
        let salt: &[u8] = salt.map(|s| &s[..]).unwrap_or(&[]);
        let digest = match self {
            InternalHash::Crc32c => {
                let mut c = crc32c_update(!0, salt);
                c = crc32c_update(c, &sector_le);
                c = crc32c_update(c, block);
                (!c).to_le_bytes().to_vec()
            }
            InternalHash::Digest(a) => a.digest(&[salt, &sector_le, block]),
            InternalHash::Hmac(a, key) => {
                let mut msg = Vec::with_capacity(salt.len() + 8 + block.len());
                msg.extend_from_slice(salt);
                msg.extend_from_slice(&sector_le);
                msg.extend_from_slice(block);
                a.hmac(key.as_bytes(), &msg)
            }
        };
        let n = out.len().min(digest.len());
        out[..n].copy_from_slice(&digest[..n]);
        out[n..].fill(0);
    }
}

/// CRC-32C lookup table (reflected polynomial 0x82F63B78).
///
/// Hand-written rather than a crate dependency: the dm crate's manifest belongs to another
/// engineer, and the function is a dozen lines checked against the standard check value.
const CRC32C_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Continues a CRC-32C over `data` (pre- and post-inversion are the caller's).
pub fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC32C_TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The CRC catalogue's check value for CRC-32/ISCSI.
        assert_eq!(!crc32c_update(!0, b"123456789"), 0xE306_9283);
    }
}
