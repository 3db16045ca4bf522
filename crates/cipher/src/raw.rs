//! Raw AES-CBC, AES-CTR and ChaCha20 over whole buffers (AWS-LC), for on-disk formats that
//! use a cipher outside dm-crypt's per-sector model: dm-integrity's `journal_crypt` runs
//! one keystream across the whole journal, or CBC per journal section with its own IVs.
//! [`crate::SectorCipher`] cannot express either, so this small module keeps the FFI here,
//! in the cipher layer, and callers stay free of `unsafe`.

use std::os::raw::c_uint;

use zeroize::Zeroize;

use crate::locked::LockedBox;

/// An expanded AES key of AWS-LC, in locked memory of its own (out of swap and core dumps)
/// and wiped on drop, like every other key schedule of this crate.
pub struct RawAes(LockedBox<aws_lc_sys::AES_KEY>);

impl RawAes {
    /// Expands `key` (16, 24 or 32 bytes) for encryption or, with `encrypt` false, CBC
    /// decryption.
    pub fn new(key: &[u8], encrypt: bool) -> Result<Self, String> {
        if ![16, 24, 32].contains(&key.len()) {
            return Err(format!(
                "invalid AES key size {} (16, 24 or 32 bytes)",
                key.len()
            ));
        }
        // Expanded in place: no copy of the schedule outside locked memory.
        let mut k = LockedBox::new(aws_lc_sys::AES_KEY {
            rd_key: [0; 60],
            rounds: 0,
        });
        let bits = (key.len() * 8) as c_uint;
        // SAFETY: the set-key functions fill the AES_KEY from `key`, whose length in bits
        // they are given.
        let r = unsafe {
            if encrypt {
                aws_lc_sys::AES_set_encrypt_key(key.as_ptr(), bits, &mut *k)
            } else {
                aws_lc_sys::AES_set_decrypt_key(key.as_ptr(), bits, &mut *k)
            }
        };
        if r != 0 {
            return Err("AES key setup failed".into());
        }
        Ok(RawAes(k))
    }

    /// AES-CBC over `buf` (a multiple of 16 bytes) in place.
    pub fn cbc(&self, buf: &mut [u8], iv: &[u8; 16], encrypt: bool) {
        let mut ivec = *iv;
        // SAFETY: in and out are the same valid buffer (AWS-LC allows in-place CBC), the
        // length is a multiple of the block size, `ivec` is 16 bytes.
        unsafe {
            aws_lc_sys::AES_cbc_encrypt(
                buf.as_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &*self.0,
                ivec.as_mut_ptr(),
                encrypt as i32,
            )
        }
    }

    /// AES-CTR keystream (128-bit big-endian counter from zero) XORed over `buf`.
    pub fn ctr_zero_iv(&self, buf: &mut [u8]) {
        let mut ivec = [0u8; 16];
        let mut ecount = [0u8; 16];
        let mut num: c_uint = 0;
        // SAFETY: in-place CTR over a valid buffer; ivec/ecount are 16 bytes each.
        unsafe {
            aws_lc_sys::AES_ctr128_encrypt(
                buf.as_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &*self.0,
                ivec.as_mut_ptr(),
                ecount.as_mut_ptr(),
                &mut num,
            )
        }
        ecount.zeroize();
    }
}

/// ChaCha20 (RFC 8439 layout: 32-bit block counter from 0, 96-bit nonce) XORed over `buf`
/// in place, with a 32-byte `key` and an all-zero nonce (what the kernel's all-zero 16-byte
/// IV means for `chacha20`).
pub fn chacha20_zero_nonce(key: &[u8], buf: &mut [u8]) -> Result<(), String> {
    if key.len() != 32 {
        return Err(format!(
            "invalid key size {} for chacha20 (32 bytes)",
            key.len()
        ));
    }
    let nonce = [0u8; 12];
    // SAFETY: in-place ChaCha20 over a valid buffer; key is 32 bytes, nonce 12.
    unsafe {
        aws_lc_sys::CRYPTO_chacha_20(
            buf.as_mut_ptr(),
            buf.as_ptr(),
            buf.len(),
            key.as_ptr(),
            nonce.as_ptr(),
            0,
        )
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// CBC against NIST SP 800-38A F.2.1 (CBC-AES128, first block) both ways; CTR from a
    /// zero counter block starts with AES_K(0^128) (taken from the checked CBC with a zero
    /// IV); ChaCha20 inverts itself and refuses short keys. The kernel-made journal images
    /// in crates/dm/tests/integrity_journal_crypt.rs check all three against the kernel.
    #[test]
    fn known_answers_and_round_trips() {
        let key = unhex("2b7e151628aed2a6abf7158809cf4f3c");
        let iv: [u8; 16] = unhex("000102030405060708090a0b0c0d0e0f")
            .try_into()
            .unwrap();
        let plain = unhex("6bc1bee22e409f96e93d7e117393172a");
        let mut buf = plain.clone();
        RawAes::new(&key, true).unwrap().cbc(&mut buf, &iv, true);
        assert_eq!(hex::encode(&buf), "7649abac8119b246cee98e9b12e9197d");
        RawAes::new(&key, false).unwrap().cbc(&mut buf, &iv, false);
        assert_eq!(buf, plain);

        // CTR from a zero counter block: the first keystream block is AES_K(0^128).
        let mut ks = [0u8; 16];
        RawAes::new(&key, true).unwrap().ctr_zero_iv(&mut ks);
        let mut zero = [0u8; 16];
        RawAes::new(&key, true)
            .unwrap()
            .cbc(&mut zero, &[0; 16], true);
        assert_eq!(ks, zero);

        let k = [7u8; 32];
        let mut data = vec![0x5au8; 200];
        chacha20_zero_nonce(&k, &mut data).unwrap();
        assert_ne!(data, vec![0x5au8; 200]);
        chacha20_zero_nonce(&k, &mut data).unwrap();
        assert_eq!(data, vec![0x5au8; 200]);
        assert!(chacha20_zero_nonce(&[0; 16], &mut data).is_err());
        assert!(RawAes::new(&[0; 15], true).is_err());
    }
}
