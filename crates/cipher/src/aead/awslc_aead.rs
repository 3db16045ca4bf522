//! AES-GCM (`gcm(aes)`), its RFC 4106 form (`rfc4106(gcm(aes))`: the last 4 key bytes are
//! a salt that, with the 8-byte IV, makes the 12-byte nonce; the trailing IV of dm-crypt's
//! associated data is not authenticated again) and ChaCha20-Poly1305
//! (`rfc7539(chacha20,poly1305)`) through AWS-LC's `EVP_AEAD` interface with detached tags.

use super::AeadPrimitive;
use crate::CipherError;
use aws_lc_sys as sys;

/// A keyed AWS-LC AEAD context.
pub(crate) struct AwsLcAead {
    ctx: *mut sys::EVP_AEAD_CTX,
    kind: Kind,
    /// RFC 4106 nonce salt.
    salt: [u8; 4],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gcm,
    Rfc4106,
    ChaCha,
}

// SAFETY: after construction the context is only passed to EVP_AEAD_CTX_seal_scatter and
// EVP_AEAD_CTX_open_gather, which take it as `const` and keep no per-call state in it, so
// concurrent use from several threads is sound; it is freed once, in Drop.
unsafe impl Send for AwsLcAead {}
// SAFETY: see Send.
unsafe impl Sync for AwsLcAead {}

impl Drop for AwsLcAead {
    fn drop(&mut self) {
        // SAFETY: ctx came from EVP_AEAD_CTX_new and is freed once (freeing cleanses the key).
        unsafe { sys::EVP_AEAD_CTX_free(self.ctx) };
    }
}

impl AwsLcAead {
    /// AES-GCM with a 16-, 24- or 32-byte key; `None` for other key sizes.
    pub(crate) fn gcm(key: &[u8]) -> Option<Self> {
        // SAFETY: these return pointers to static algorithm descriptions.
        let aead = unsafe {
            match key.len() {
                16 => sys::EVP_aead_aes_128_gcm(),
                24 => sys::EVP_aead_aes_192_gcm(),
                32 => sys::EVP_aead_aes_256_gcm(),
                _ => return None,
            }
        };
        Self::new(aead, key, Kind::Gcm)
    }

    /// `rfc4106(gcm(aes))`: an AES key (16, 24 or 32 bytes) followed by a 4-byte salt.
    pub(crate) fn rfc4106(key: &[u8]) -> Option<Self> {
        let (k, salt) = key.split_at(key.len().checked_sub(4)?);
        let mut g = Self::gcm(k)?;
        g.kind = Kind::Rfc4106;
        g.salt.copy_from_slice(salt);
        Some(g)
    }

    /// The nonce and associated data the underlying AEAD sees.
    fn shape<'a>(
        &self,
        iv: &'a [u8],
        ad: &'a [u8],
        nonce: &'a mut [u8; 12],
    ) -> (&'a [u8], &'a [u8]) {
        if self.kind == Kind::Rfc4106 {
            nonce[..4].copy_from_slice(&self.salt);
            nonce[4..].copy_from_slice(iv);
            (&nonce[..], &ad[..ad.len() - iv.len()])
        } else {
            (iv, ad)
        }
    }

    /// ChaCha20-Poly1305 (RFC 7539) with a 32-byte key.
    pub(crate) fn chacha20_poly1305(key: &[u8]) -> Option<Self> {
        if key.len() != 32 {
            return None;
        }
        // SAFETY: returns a pointer to a static algorithm description.
        let aead = unsafe { sys::EVP_aead_chacha20_poly1305() };
        Self::new(aead, key, Kind::ChaCha)
    }

    fn new(aead: *const sys::EVP_AEAD, key: &[u8], kind: Kind) -> Option<Self> {
        // The context holds the key schedule: it must come from locked memory.
        crate::lock_backend_memory();
        // The context is created with the full 16-byte tag; shorter tags are the prefix of
        // the full one for both algorithms, so truncation happens here, not in AWS-LC.
        // SAFETY: key points to key.len() readable bytes; a null result is handled.
        let ctx = unsafe { sys::EVP_AEAD_CTX_new(aead, key.as_ptr(), key.len(), 16) };
        (!ctx.is_null()).then_some(AwsLcAead {
            ctx,
            kind,
            salt: [0; 4],
        })
    }

    fn full_tag(&self, iv: &[u8], ad: &[u8], data: &mut [u8]) -> Result<[u8; 16], CipherError> {
        let mut tag = [0u8; 16];
        let mut tag_len = 0usize;
        // SAFETY: in and out alias exactly (allowed in-place use); every pointer covers the
        // length passed with it; the context is valid for self's lifetime.
        let ok = unsafe {
            sys::EVP_AEAD_CTX_seal_scatter(
                self.ctx,
                data.as_mut_ptr(),
                tag.as_mut_ptr(),
                &mut tag_len,
                tag.len(),
                iv.as_ptr(),
                iv.len(),
                data.as_ptr(),
                data.len(),
                std::ptr::null(),
                0,
                ad.as_ptr(),
                ad.len(),
            )
        };
        if ok != 1 || tag_len != 16 {
            return Err(CipherError::Backend("aws-lc AEAD seal failed".into()));
        }
        Ok(tag)
    }
}

impl AeadPrimitive for AwsLcAead {
    fn iv_size(&self) -> usize {
        if self.kind == Kind::Rfc4106 {
            8
        } else {
            12
        }
    }

    fn max_tag_size(&self) -> usize {
        16
    }

    fn tag_size_ok(&self, n: usize) -> bool {
        match self.kind {
            // The kernel's GCM authsizes.
            Kind::Gcm => matches!(n, 4 | 8 | 12..=16),
            // RFC 4106 allows 8, 12 and 16.
            Kind::Rfc4106 => matches!(n, 8 | 12 | 16),
            Kind::ChaCha => n == 16,
        }
    }

    fn seal(
        &self,
        iv: &[u8],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8],
    ) -> Result<(), CipherError> {
        let mut nonce = [0u8; 12];
        let (iv, ad) = self.shape(iv, ad, &mut nonce);
        let full = self.full_tag(iv, ad, data)?;
        tag.copy_from_slice(&full[..tag.len()]);
        Ok(())
    }

    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError> {
        let mut nonce = [0u8; 12];
        let (iv, ad) = self.shape(iv, ad, &mut nonce);
        if tag.len() == 16 {
            // SAFETY: in and out alias exactly; pointers cover their lengths.
            let ok = unsafe {
                sys::EVP_AEAD_CTX_open_gather(
                    self.ctx,
                    data.as_mut_ptr(),
                    iv.as_ptr(),
                    iv.len(),
                    data.as_ptr(),
                    data.len(),
                    tag.as_ptr(),
                    tag.len(),
                    ad.as_ptr(),
                    ad.len(),
                )
            };
            // A failed open zeroes nothing we rely on: the caller discards the data.
            // SAFETY: clears this thread's error queue only.
            unsafe { sys::ERR_clear_error() };
            return Ok(ok == 1);
        }
        // Truncated GCM tag: AWS-LC only verifies whole tags. CTR is its own inverse, so
        // sealing the ciphertext yields the plaintext; sealing that again yields the
        // ciphertext with its genuine tag, whose prefix is compared.
        let mut plain = data.to_vec();
        self.full_tag(iv, ad, &mut plain)?;
        let mut again = plain.clone();
        let expect = self.full_tag(iv, ad, &mut again)?;
        if !crate::secret::ct_eq(&expect[..tag.len()], tag) {
            return Ok(false);
        }
        data.copy_from_slice(&plain);
        Ok(true)
    }

    fn implementation(&self) -> &'static str {
        "aws-lc"
    }
}
