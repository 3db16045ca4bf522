//! `rfc4309(ccm(aes))` (cryptsetup's `aes-ccm-random`): AES-CCM with a 16-byte tag and an
//! 11-byte nonce made of a 3-byte salt (the last 3 bytes of the table key) and the 8-byte
//! per-sector IV. As in the kernel's RFC 4309 template, the IV that ends dm-crypt's
//! associated data is not authenticated again: CCM's AAD is the sector number alone (the
//! IV is bound through the nonce). RustCrypto's `ccm` does the mode.

use super::AeadPrimitive;
use crate::secret::SecretBytes;
use crate::CipherError;
use ccm::aead::generic_array::GenericArray;
use ccm::aead::{AeadInPlace, KeyInit};
use ccm::consts::{U11, U16};

type Ccm128 = ccm::Ccm<aes::Aes128, U16, U11>;
type Ccm192 = ccm::Ccm<aes::Aes192, U16, U11>;
type Ccm256 = ccm::Ccm<aes::Aes256, U16, U11>;

enum Inner {
    A128(Box<Ccm128>),
    A192(Box<Ccm192>),
    A256(Box<Ccm256>),
}

/// AES-CCM as the kernel's `rfc4309(ccm(aes))`.
pub(crate) struct Rfc4309Ccm {
    inner: Inner,
    salt: SecretBytes,
}

impl Rfc4309Ccm {
    /// Key = AES key (16, 24 or 32 bytes) || 3-byte salt; `None` for other lengths.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        let (k, salt) = key.split_at(key.len().checked_sub(3)?);
        let inner = match k.len() {
            16 => Inner::A128(Box::new(Ccm128::new_from_slice(k).ok()?)),
            24 => Inner::A192(Box::new(Ccm192::new_from_slice(k).ok()?)),
            32 => Inner::A256(Box::new(Ccm256::new_from_slice(k).ok()?)),
            _ => return None,
        };
        Some(Rfc4309Ccm {
            inner,
            salt: SecretBytes::from_slice(salt),
        })
    }

    fn nonce(&self, iv: &[u8]) -> [u8; 11] {
        let mut n = [0u8; 11];
        n[..3].copy_from_slice(self.salt.as_bytes());
        n[3..].copy_from_slice(iv);
        n
    }
}

/// The part of dm-crypt's associated data RFC 4309 authenticates (all but the trailing IV).
fn aad<'a>(ad: &'a [u8], iv: &[u8]) -> &'a [u8] {
    &ad[..ad.len() - iv.len()]
}

impl AeadPrimitive for Rfc4309Ccm {
    fn iv_size(&self) -> usize {
        8
    }

    fn max_tag_size(&self) -> usize {
        16
    }

    fn tag_size_ok(&self, n: usize) -> bool {
        n == 16
    }

    fn seal(
        &self,
        iv: &[u8],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8],
    ) -> Result<(), CipherError> {
        let nonce = self.nonce(iv);
        let n = GenericArray::from_slice(&nonce);
        let a = aad(ad, iv);
        let t = match &self.inner {
            Inner::A128(c) => c.encrypt_in_place_detached(n, a, data),
            Inner::A192(c) => c.encrypt_in_place_detached(n, a, data),
            Inner::A256(c) => c.encrypt_in_place_detached(n, a, data),
        }
        .map_err(|_| CipherError::Backend("AES-CCM seal failed".into()))?;
        tag.copy_from_slice(&t);
        Ok(())
    }

    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError> {
        let nonce = self.nonce(iv);
        let n = GenericArray::from_slice(&nonce);
        let a = aad(ad, iv);
        let t = GenericArray::from_slice(tag);
        let r = match &self.inner {
            Inner::A128(c) => c.decrypt_in_place_detached(n, a, data, t),
            Inner::A192(c) => c.decrypt_in_place_detached(n, a, data, t),
            Inner::A256(c) => c.decrypt_in_place_detached(n, a, data, t),
        };
        Ok(r.is_ok())
    }

    fn implementation(&self) -> &'static str {
        "rustcrypto"
    }
}
