//! `authenc(hmac(H),xts(aes))` / `authenc(hmac(H),cbc(aes))`: encrypt-then-MAC as the
//! kernel's authenc template does it — the data is encrypted with the IV, and the tag is
//! HMAC(auth key, associated data || ciphertext) truncated to the tag size. Without a MAC
//! (`integrity:<n>:none`) only the cipher runs.
//!
//! The table key is `enc key || auth key`, the auth key as long as H's digest (dm-crypt's
//! `key_mac_size`) or `integrity_key_size:<bytes>` when the table gives it.
//!
//! Every sector is MACed and encrypted, so both halves are the hot path: AES-128-XTS and
//! AES-256-XTS run on the fastest of the hand-written x86 paths this CPU has
//! ([`XtsAes`], as the plain crypt target uses), AES-192-XTS and CBC on RustCrypto; the
//! HMAC's inner and outer states are keyed once ([`KeyedHmac`], SHA-NI through the sha2
//! crate), so a sector costs one pass of the hash over its bytes and one of the cipher,
//! nothing allocated and no lock taken.

use super::{AeadPrimitive, EssivInput};
use crate::hash::{HashAlgorithm, KeyedHmac};
use crate::secret::{ct_eq, SecretBytes};
use crate::xts_x86::{XtsAes, XtsPath};
use crate::CipherError;
use cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit, KeyInit};
use xts_mode::Xts128;

/// The encryption mode inside authenc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `xts(aes)`: two AES keys, the IV is the XTS tweak.
    Xts,
    /// `cbc(aes)`.
    Cbc,
}

impl Mode {
    /// Parses the crypto API name of the mode (`xts(aes)`, `cbc(aes)`).
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "xts(aes)" => Some(Mode::Xts),
            "cbc(aes)" => Some(Mode::Cbc),
            _ => None,
        }
    }
}

enum Enc {
    /// AES-128/256-XTS on a hand-written x86 path.
    Fast(XtsAes),
    Xts128(Box<Xts128<aes::Aes128>>),
    Xts192(Box<Xts128<aes::Aes192>>),
    Xts256(Box<Xts128<aes::Aes256>>),
    Cbc128(aes::Aes128),
    Cbc192(aes::Aes192),
    Cbc256(aes::Aes256),
}

/// Encrypt-then-MAC over AES-XTS or AES-CBC.
pub(crate) struct Authenc {
    enc: Enc,
    mac: Option<(KeyedHmac, usize)>,
    enc_key: SecretBytes,
    auth_key: SecretBytes,
}

impl Authenc {
    /// Splits the table key (the auth key is `auth_key_len` bytes, by default the digest
    /// size) and keys both parts; `None` if the sizes do not fit.
    pub(crate) fn new(
        mac: Option<HashAlgorithm>,
        mode: Mode,
        key: &[u8],
        auth_key_len: Option<usize>,
    ) -> Option<Self> {
        let mac_len = mac.map_or(0, HashAlgorithm::output_len);
        let auth_len = if mac.is_some() {
            auth_key_len.unwrap_or(mac_len)
        } else {
            0
        };
        let enc_len = key.len().checked_sub(auth_len)?;
        let (ek, ak) = key.split_at(enc_len);
        let fast = XtsPath::ALL.iter().rev().find(|p| p.available());
        let enc = match (mode, ek.len(), fast) {
            (Mode::Xts, 32 | 64, Some(&path)) => Enc::Fast(XtsAes::new(path, ek).ok()?),
            (Mode::Xts, 32 | 48 | 64, _) => {
                let (k1, k2) = ek.split_at(ek.len() / 2);
                match ek.len() {
                    32 => Enc::Xts128(Box::new(Xts128::new(
                        aes::Aes128::new_from_slice(k1).ok()?,
                        aes::Aes128::new_from_slice(k2).ok()?,
                    ))),
                    48 => Enc::Xts192(Box::new(Xts128::new(
                        aes::Aes192::new_from_slice(k1).ok()?,
                        aes::Aes192::new_from_slice(k2).ok()?,
                    ))),
                    _ => Enc::Xts256(Box::new(Xts128::new(
                        aes::Aes256::new_from_slice(k1).ok()?,
                        aes::Aes256::new_from_slice(k2).ok()?,
                    ))),
                }
            }
            (Mode::Cbc, 16, _) => Enc::Cbc128(aes::Aes128::new_from_slice(ek).ok()?),
            (Mode::Cbc, 24, _) => Enc::Cbc192(aes::Aes192::new_from_slice(ek).ok()?),
            (Mode::Cbc, 32, _) => Enc::Cbc256(aes::Aes256::new_from_slice(ek).ok()?),
            _ => return None,
        };
        let mac = match mac {
            Some(h)
                if matches!(
                    h,
                    HashAlgorithm::Sha1
                        | HashAlgorithm::Sha224
                        | HashAlgorithm::Sha256
                        | HashAlgorithm::Sha384
                        | HashAlgorithm::Sha512
                ) =>
            {
                Some((KeyedHmac::new(h, ak), mac_len))
            }
            Some(_) => return None,
            None => None,
        };
        Some(Authenc {
            enc,
            mac,
            enc_key: SecretBytes::from_slice(ek),
            auth_key: SecretBytes::from_slice(ak),
        })
    }

    fn crypt(&self, encrypt: bool, iv: &[u8], data: &mut [u8]) -> Result<(), CipherError> {
        let iv16: [u8; 16] = iv
            .try_into()
            .map_err(|_| CipherError::Backend("authenc IV is not 16 bytes".into()))?;
        let misaligned = || CipherError::Misaligned {
            len: data.len(),
            sector_size: 16,
        };
        if !data.len().is_multiple_of(16) {
            return Err(misaligned());
        }
        macro_rules! xts {
            ($x:expr) => {
                if encrypt {
                    $x.encrypt_sector(data, iv16)
                } else {
                    $x.decrypt_sector(data, iv16)
                }
            };
        }
        macro_rules! cbc {
            ($aes:ty, $c:expr) => {{
                let blocks = to_blocks(data);
                if encrypt {
                    cbc::Encryptor::<$aes>::inner_iv_init($c.clone(), &iv16.into())
                        .encrypt_blocks_mut(blocks)
                } else {
                    cbc::Decryptor::<$aes>::inner_iv_init($c.clone(), &iv16.into())
                        .decrypt_blocks_mut(blocks)
                }
            }};
        }
        match &self.enc {
            Enc::Fast(x) if encrypt => x.encrypt_unit(&iv16, data)?,
            Enc::Fast(x) => x.decrypt_unit(&iv16, data)?,
            Enc::Xts128(x) => xts!(x),
            Enc::Xts192(x) => xts!(x),
            Enc::Xts256(x) => xts!(x),
            Enc::Cbc128(c) => cbc!(aes::Aes128, c),
            Enc::Cbc192(c) => cbc!(aes::Aes192, c),
            Enc::Cbc256(c) => cbc!(aes::Aes256, c),
        }
        Ok(())
    }
}

fn to_blocks(
    data: &mut [u8],
) -> &mut [cipher::generic_array::GenericArray<u8, cipher::consts::U16>] {
    let n = data.len() / 16;
    // SAFETY: GenericArray<u8, U16> is a repr(transparent) [u8; 16] with alignment 1, and
    // data.len() is a multiple of 16 (checked by the caller), so the cast covers exactly
    // the same bytes with the same lifetime.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), n) }
}

impl AeadPrimitive for Authenc {
    fn iv_size(&self) -> usize {
        16
    }

    fn max_tag_size(&self) -> usize {
        self.mac.as_ref().map_or(0, |m| m.1)
    }

    fn tag_size_ok(&self, n: usize) -> bool {
        n <= self.max_tag_size()
    }

    fn seal(
        &self,
        iv: &[u8],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8],
    ) -> Result<(), CipherError> {
        self.crypt(true, iv, data)?;
        if let Some((m, _)) = &self.mac {
            let mut full = [0u8; 64];
            m.mac_into(&[ad, data], &mut full);
            tag.copy_from_slice(&full[..tag.len()]);
        }
        Ok(())
    }

    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError> {
        if let Some((m, _)) = &self.mac {
            let mut full = [0u8; 64];
            m.mac_into(&[ad, data], &mut full);
            if !ct_eq(&full[..tag.len()], tag) {
                return Ok(false);
            }
        }
        self.crypt(false, iv, data)?;
        Ok(true)
    }

    fn essiv_parts(&self) -> Option<EssivInput<'_>> {
        Some(EssivInput {
            enc_key: self.enc_key.as_bytes(),
            auth_key: self.auth_key.as_bytes(),
        })
    }

    fn implementation(&self) -> &'static str {
        match &self.enc {
            // The cipher's path: the HMAC is always the sha1/sha2 crates'.
            Enc::Fast(x) => x.path().name(),
            _ => "rustcrypto",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::{Hmac, Mac};

    /// The construction computed the textbook way with RustCrypto (`xts-mode` one block at a
    /// time, the `hmac` crate keyed per call): AES-XTS of the sector under the IV as tweak,
    /// then HMAC-SHA256 over the associated data and the ciphertext.
    fn reference(key: &[u8], iv: [u8; 16], ad: &[u8], plain: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let (ek, ak) = key.split_at(key.len() - 32);
        let (k1, k2) = ek.split_at(ek.len() / 2);
        let mut data = plain.to_vec();
        match k1.len() {
            16 => Xts128::new(
                aes::Aes128::new_from_slice(k1).unwrap(),
                aes::Aes128::new_from_slice(k2).unwrap(),
            )
            .encrypt_sector(&mut data, iv),
            _ => Xts128::new(
                aes::Aes256::new_from_slice(k1).unwrap(),
                aes::Aes256::new_from_slice(k2).unwrap(),
            )
            .encrypt_sector(&mut data, iv),
        }
        let mut m = <Hmac<sha2::Sha256> as Mac>::new_from_slice(ak).unwrap();
        m.update(ad);
        m.update(&data);
        (data, m.finalize().into_bytes().to_vec())
    }

    /// Whatever XTS path the CPU gives, seal and open equal the textbook construction for
    /// both key sizes, sector sizes 512 and 4096 and tweaks near 2^64; a tag that does not
    /// match is refused and leaves the data as it was.
    #[test]
    fn seal_and_open_equal_the_textbook_construction() {
        for enc_len in [32usize, 64] {
            let key: Vec<u8> = (0..enc_len + 32).map(|i| (i * 7 + 1) as u8).collect();
            let a = Authenc::new(Some(HashAlgorithm::Sha256), Mode::Xts, &key, None).unwrap();
            for (size, sector) in [(512usize, 0u64), (4096, u64::MAX - 3), (512, 1 << 40)] {
                let plain: Vec<u8> = (0..size).map(|i| (i * 13 + 5) as u8).collect();
                let mut iv = [0u8; 16];
                iv[..8].copy_from_slice(&sector.to_le_bytes());
                let mut ad = sector.to_le_bytes().to_vec();
                ad.extend_from_slice(&iv);
                let (want_ct, want_tag) = reference(&key, iv, &ad, &plain);
                let mut data = plain.clone();
                let mut tag = [0u8; 32];
                a.seal(&iv, &ad, &mut data, &mut tag).unwrap();
                let what = format!("{} {enc_len} {size}", a.implementation());
                assert_eq!(data, want_ct, "{what}");
                assert_eq!(tag[..], want_tag[..], "{what}");
                let mut bad = tag;
                bad[31] ^= 1;
                let mut copy = data.clone();
                assert!(!a.open(&iv, &ad, &mut copy, &bad).unwrap(), "{what}");
                assert_eq!(copy, data, "{what}");
                assert!(a.open(&iv, &ad, &mut data, &tag).unwrap(), "{what}");
                assert_eq!(data, plain, "{what}");
            }
        }
    }
}
