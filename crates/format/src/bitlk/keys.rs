//! Unlocking a BitLocker volume: from a passphrase, recovery password, startup key file or
//! clear key to the VMK, and from the VMK to the data key.
//!
//! Facts from the public BitLocker format documentation: keys are AES-256-CCM encrypted
//! (12-byte nonce stored before the 16-byte MAC and the ciphertext); the plaintext is a key
//! entry (8-byte entry header, 4-byte method, key). A passphrase is taken as UTF-16LE, hashed
//! twice with SHA-256; a recovery password's eight groups, each divided by 11, are 16-bit
//! little-endian words hashed once. Both are then stretched: SHA-256 of
//! `{last hash, initial hash, salt, counter (u64)}` 0x100000 times. A startup key file
//! (`.BEK`) holds an external key entry whose GUID names the VMK it opens.

use super::{entries, value, BitlkHeader, EncryptedKey, Encryption, Protection};
use crate::error::{FormatError, Result};
use ccm::aead::generic_array::GenericArray;
use ccm::aead::{AeadInPlace, KeyInit};
use ccm::consts::{U12, U16};
use cryptblk_cipher::SecretBytes;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

type Ccm256 = ccm::Ccm<aes::Aes256, U16, U12>;

/// What unlocks a BitLocker volume.
pub enum BitlkKey<'a> {
    /// A passphrase or a recovery password (both are tried where they fit), or the bytes of
    /// a startup key file (recognised by its header).
    Secret(&'a [u8]),
    /// Nothing: only a clear-key protector can open the volume.
    None,
}

const STRETCH_ROUNDS: u64 = 0x10_0000;

/// The stretched key of `initial` (a hash of the secret) with `salt`.
fn stretch(initial: &[u8; 32], salt: &[u8; 16]) -> Zeroizing<[u8; 32]> {
    // {last[32], initial[32], salt[16], count u64}, hashed whole each round.
    let mut block = Zeroizing::new([0u8; 88]);
    block[32..64].copy_from_slice(initial);
    block[64..80].copy_from_slice(salt);
    for count in 0..STRETCH_ROUNDS {
        block[80..88].copy_from_slice(&count.to_le_bytes());
        let h = Sha256::digest(&block[..]);
        block[..32].copy_from_slice(&h);
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&block[..32]);
    out
}

/// The 16-byte key a recovery password stands for, or `None` if `text` is not one (eight
/// groups of six digits, each a multiple of 11 below 720896, dashes between them).
pub fn recovery_key(text: &[u8]) -> Option<Zeroizing<[u8; 16]>> {
    let text = std::str::from_utf8(text).ok()?;
    let groups: Vec<&str> = text.split('-').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut key = Zeroizing::new([0u8; 16]);
    for (i, g) in groups.iter().enumerate() {
        if g.len() != 6 || !g.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let v: u32 = g.parse().ok()?;
        if !v.is_multiple_of(11) || v / 11 > 0xffff {
            return None;
        }
        key[2 * i..2 * i + 2].copy_from_slice(&((v / 11) as u16).to_le_bytes());
    }
    Some(key)
}

fn passphrase_hash(pass: &[u8]) -> Option<Zeroizing<[u8; 32]>> {
    let text = std::str::from_utf8(pass).ok()?;
    let utf16: Zeroizing<Vec<u8>> =
        Zeroizing::new(text.encode_utf16().flat_map(|u| u.to_le_bytes()).collect());
    let mut once = Zeroizing::new([0u8; 32]);
    once.copy_from_slice(&Sha256::digest(&utf16[..]));
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&Sha256::digest(&once[..]));
    Some(out)
}

/// Decrypts `k` with `key`; `None` when the MAC does not match (a wrong key).
fn ccm_decrypt(key: &[u8], k: &EncryptedKey) -> Option<Zeroizing<Vec<u8>>> {
    if key.len() != 32 || k.data.len() < 16 {
        return None;
    }
    let cipher = Ccm256::new(GenericArray::from_slice(key));
    let (mac, ct) = k.data.split_at(16);
    let mut buf = Zeroizing::new(ct.to_vec());
    cipher
        .decrypt_in_place_detached(
            GenericArray::from_slice(&k.nonce),
            b"",
            &mut buf[..],
            GenericArray::from_slice(mac),
        )
        .ok()?;
    Some(buf)
}

/// The key bytes of a decrypted key entry (after its 8-byte header and 4-byte method).
fn entry_key(plain: &[u8]) -> Result<&[u8]> {
    let size = plain
        .get(..2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    match size {
        Some(s) if s > 12 && s <= plain.len() => Ok(&plain[12..s]),
        _ => Err(FormatError::Corrupt(
            "BITLK decrypted key entry has an invalid size".into(),
        )),
    }
}

/// The external key (GUID and 32-byte key) of a startup key file, if `data` is one.
fn startup_key(data: &[u8]) -> Option<(String, Zeroizing<Vec<u8>>)> {
    if data.len() < 48 + 8 {
        return None;
    }
    let size = u32::from_le_bytes(data[..4].try_into().ok()?) as usize;
    let version = u32::from_le_bytes(data[4..8].try_into().ok()?);
    let header = u32::from_le_bytes(data[8..12].try_into().ok()?) as usize;
    if size != data.len() || version != 1 || header != 48 {
        return None;
    }
    for e in entries(&data[48..]).ok()? {
        if e.value_type != value::EXTERNAL_KEY || e.data.len() < 24 {
            continue;
        }
        let guid = super::guid_text(&e.data[..16]);
        for p in entries(&e.data[24..]).ok()? {
            if p.value_type == value::KEY && p.data.len() >= 4 + 32 {
                return Some((guid, Zeroizing::new(p.data[4..4 + 32].to_vec())));
            }
        }
    }
    None
}

impl BitlkHeader {
    /// True when a clear-key protector can open the volume without any secret.
    pub fn has_clear_key(&self) -> bool {
        self.vmks
            .iter()
            .any(|v| v.protection == Protection::ClearKey && v.clear_key.is_some())
    }

    /// The VMK from `key`: a clear key first, then a startup key file, then each passphrase
    /// and recovery-password protector. A secret that fits none is a wrong passphrase
    /// (cryptsetup's "No key available with this passphrase.", exit 2).
    fn vmk(&self, key: &BitlkKey<'_>) -> Result<Zeroizing<Vec<u8>>> {
        for v in &self.vmks {
            if let (Protection::ClearKey, Some(ck), Some(k)) = (v.protection, &v.clear_key, &v.key)
            {
                if let Some(p) = ccm_decrypt(ck, k) {
                    return Ok(Zeroizing::new(entry_key(&p)?.to_vec()));
                }
            }
        }
        let BitlkKey::Secret(secret) = key else {
            return Err(FormatError::WrongPassphrase);
        };
        if let Some((guid, ext)) = startup_key(secret) {
            for v in &self.vmks {
                if v.protection != Protection::StartupKey || v.guid != guid {
                    continue;
                }
                if let Some(p) = v.key.as_ref().and_then(|k| ccm_decrypt(&ext, k)) {
                    return Ok(Zeroizing::new(entry_key(&p)?.to_vec()));
                }
            }
            return Err(FormatError::WrongPassphrase);
        }
        let recovery = recovery_key(secret).map(|k| {
            let mut h = Zeroizing::new([0u8; 32]);
            h.copy_from_slice(&Sha256::digest(&k[..]));
            h
        });
        let pass = passphrase_hash(secret);
        for v in &self.vmks {
            let initial = match v.protection {
                Protection::Passphrase => pass.as_ref(),
                Protection::RecoveryPassphrase => recovery.as_ref(),
                _ => None,
            };
            let (Some(initial), Some(k)) = (initial, &v.key) else {
                continue;
            };
            let stretched = stretch(initial, &v.salt);
            if let Some(p) = ccm_decrypt(&stretched[..], k) {
                return Ok(Zeroizing::new(entry_key(&p)?.to_vec()));
            }
        }
        Err(FormatError::WrongPassphrase)
    }

    /// The dm-crypt volume key (data key, then the tweak key for Elephant) from `key`.
    pub fn unlock(&self, key: &BitlkKey<'_>) -> Result<SecretBytes> {
        let vmk = self.vmk(key)?;
        let plain = ccm_decrypt(&vmk, &self.fvek).ok_or_else(|| {
            FormatError::Corrupt("BITLK FVEK does not decrypt with the VMK".into())
        })?;
        let k = entry_key(&plain)?;
        let short = || FormatError::Corrupt("BITLK FVEK is too short".into());
        let vk: Vec<u8> = match self.encryption {
            // The entry holds a 256-bit FVEK slot and a 256-bit tweak slot; AES-128 uses the
            // first half of each.
            Encryption::CbcElephant(bits) => {
                let n = bits as usize / 8;
                if k.len() < 64 {
                    return Err(short());
                }
                [&k[..n], &k[32..32 + n]].concat()
            }
            e => k.get(..e.key_bytes()).ok_or_else(short)?.to_vec(),
        };
        Ok(SecretBytes::from_vec(vk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_password_words() {
        let k = recovery_key(b"000011-000022-000033-000044-000055-000066-000077-720885").unwrap();
        assert_eq!(k[..4], [1, 0, 2, 0]);
        assert_eq!(k[14..], [0xff, 0xff]);
        assert!(recovery_key(b"000012-000022-000033-000044-000055-000066-000077-000088").is_none());
        assert!(recovery_key(b"anaconda").is_none());
        assert!(recovery_key(b"720896-000022-000033-000044-000055-000066-000077-000088").is_none());
    }
}
