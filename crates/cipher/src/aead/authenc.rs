//! `authenc(hmac(H),xts(aes))` / `authenc(hmac(H),cbc(aes))`: encrypt-then-MAC as the
//! kernel's authenc template does it — the data is encrypted with the IV, and the tag is
//! HMAC(auth key, associated data || ciphertext) truncated to the tag size. Without a MAC
//! (`integrity:<n>:none`) only the cipher runs.
//!
//! The table key is `enc key || auth key`, the auth key as long as H's digest (dm-crypt's
//! `key_mac_size`) or `integrity_key_size:<bytes>` when the table gives it.

use super::{AeadPrimitive, EssivInput};
use crate::hash::HashAlgorithm;
use crate::secret::{ct_eq, SecretBytes};
use crate::CipherError;
use cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit, KeyInit};
use hmac::{Hmac, Mac};
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
    Xts128(Box<Xts128<aes::Aes128>>),
    Xts192(Box<Xts128<aes::Aes192>>),
    Xts256(Box<Xts128<aes::Aes256>>),
    Cbc128(aes::Aes128),
    Cbc192(aes::Aes192),
    Cbc256(aes::Aes256),
}

enum Hm {
    Sha1(Hmac<sha1::Sha1>),
    Sha224(Hmac<sha2::Sha224>),
    Sha256(Hmac<sha2::Sha256>),
    Sha384(Hmac<sha2::Sha384>),
    Sha512(Hmac<sha2::Sha512>),
}

impl Hm {
    fn new(hash: HashAlgorithm, key: &[u8]) -> Option<Self> {
        Some(match hash {
            HashAlgorithm::Sha1 => Hm::Sha1(<Hmac<sha1::Sha1> as Mac>::new_from_slice(key).ok()?),
            HashAlgorithm::Sha224 => {
                Hm::Sha224(<Hmac<sha2::Sha224> as Mac>::new_from_slice(key).ok()?)
            }
            HashAlgorithm::Sha256 => {
                Hm::Sha256(<Hmac<sha2::Sha256> as Mac>::new_from_slice(key).ok()?)
            }
            HashAlgorithm::Sha384 => {
                Hm::Sha384(<Hmac<sha2::Sha384> as Mac>::new_from_slice(key).ok()?)
            }
            HashAlgorithm::Sha512 => {
                Hm::Sha512(<Hmac<sha2::Sha512> as Mac>::new_from_slice(key).ok()?)
            }
            _ => return None,
        })
    }

    /// HMAC over `ad || data` into `out` (up to 64 bytes); returns the digest length.
    fn mac(&self, ad: &[u8], data: &[u8], out: &mut [u8; 64]) -> usize {
        fn run<M: Mac + Clone>(m: &M, ad: &[u8], data: &[u8], out: &mut [u8; 64]) -> usize {
            let mut m = m.clone();
            m.update(ad);
            m.update(data);
            let d = m.finalize().into_bytes();
            out[..d.len()].copy_from_slice(&d);
            d.len()
        }
        match self {
            Hm::Sha1(m) => run(m, ad, data, out),
            Hm::Sha224(m) => run(m, ad, data, out),
            Hm::Sha256(m) => run(m, ad, data, out),
            Hm::Sha384(m) => run(m, ad, data, out),
            Hm::Sha512(m) => run(m, ad, data, out),
        }
    }
}

/// Encrypt-then-MAC over AES-XTS or AES-CBC.
pub(crate) struct Authenc {
    enc: Enc,
    mac: Option<(Hm, usize)>,
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
        let enc = match (mode, ek.len()) {
            (Mode::Xts, 32 | 48 | 64) => {
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
            (Mode::Cbc, 16) => Enc::Cbc128(aes::Aes128::new_from_slice(ek).ok()?),
            (Mode::Cbc, 24) => Enc::Cbc192(aes::Aes192::new_from_slice(ek).ok()?),
            (Mode::Cbc, 32) => Enc::Cbc256(aes::Aes256::new_from_slice(ek).ok()?),
            _ => return None,
        };
        let mac = match mac {
            Some(h) => Some((Hm::new(h, ak)?, mac_len)),
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
            m.mac(ad, data, &mut full);
            tag.copy_from_slice(&full[..tag.len()]);
        }
        Ok(())
    }

    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError> {
        if let Some((m, _)) = &self.mac {
            let mut full = [0u8; 64];
            m.mac(ad, data, &mut full);
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
        "rustcrypto"
    }
}
