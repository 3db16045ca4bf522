//! Hash functions by their cryptsetup/kernel names, with HMAC and PBKDF2 on top.
//!
//! One place maps names such as `sha256` or `ripemd160` to implementations, so ESSIV, LUKS
//! digests, PBKDF2 keyslots and plain-mode passphrase hashing all accept the same set.

use crate::CipherError;
use hmac::{Hmac, Mac};
use sha2::Digest;

/// A hash algorithm known to cryptblk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashAlgorithm {
    /// SHA-1 (LUKS1 default before cryptsetup 1.7).
    Sha1,
    /// SHA-224.
    Sha224,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
    /// RIPEMD-160.
    Ripemd160,
    /// Whirlpool (512-bit).
    Whirlpool,
    /// The kernel's `wp256`: Whirlpool truncated to 256 bits (seen as `essiv:wp256`).
    Wp256,
    /// The kernel's `wp384`: Whirlpool truncated to 384 bits.
    Wp384,
    /// GOST R 34.11-2012 Streebog, 512-bit (cryptsetup's `stribog512`, a VeraCrypt PRF).
    Stribog512,
    /// BLAKE2s with a 256-bit digest (`blake2s-256`, a VeraCrypt PRF).
    Blake2s256,
}

impl HashAlgorithm {
    /// Looks a hash up by the name cryptsetup and the kernel use (case-insensitive).
    pub fn from_name(name: &str) -> Result<Self, CipherError> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sha1" => Self::Sha1,
            "sha224" => Self::Sha224,
            "sha256" => Self::Sha256,
            "sha384" => Self::Sha384,
            "sha512" => Self::Sha512,
            "ripemd160" | "rmd160" => Self::Ripemd160,
            "whirlpool" | "wp512" => Self::Whirlpool,
            "wp256" => Self::Wp256,
            "wp384" => Self::Wp384,
            "stribog512" | "streebog512" => Self::Stribog512,
            "blake2s-256" | "blake2s" => Self::Blake2s256,
            _ => return Err(CipherError::UnknownHash(name.to_string())),
        })
    }

    /// The canonical (cryptsetup) name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha224 => "sha224",
            Self::Sha256 => "sha256",
            Self::Sha384 => "sha384",
            Self::Sha512 => "sha512",
            Self::Ripemd160 => "ripemd160",
            Self::Whirlpool => "whirlpool",
            Self::Wp256 => "wp256",
            Self::Wp384 => "wp384",
            Self::Stribog512 => "stribog512",
            Self::Blake2s256 => "blake2s-256",
        }
    }

    /// Digest length in bytes.
    pub fn output_len(self) -> usize {
        match self {
            Self::Sha1 | Self::Ripemd160 => 20,
            Self::Sha224 => 28,
            Self::Sha256 | Self::Wp256 | Self::Blake2s256 => 32,
            Self::Sha384 | Self::Wp384 => 48,
            Self::Sha512 | Self::Whirlpool | Self::Stribog512 => 64,
        }
    }

    /// The digest of the concatenation of `parts`.
    pub fn digest(self, parts: &[&[u8]]) -> Vec<u8> {
        fn run<D: Digest>(parts: &[&[u8]]) -> Vec<u8> {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            d.finalize().to_vec()
        }
        match self {
            Self::Sha1 => run::<sha1::Sha1>(parts),
            Self::Sha224 => run::<sha2::Sha224>(parts),
            Self::Sha256 => run::<sha2::Sha256>(parts),
            Self::Sha384 => run::<sha2::Sha384>(parts),
            Self::Sha512 => run::<sha2::Sha512>(parts),
            Self::Ripemd160 => run::<ripemd::Ripemd160>(parts),
            Self::Whirlpool => run::<whirlpool::Whirlpool>(parts),
            Self::Stribog512 => run::<streebog::Streebog512>(parts),
            Self::Blake2s256 => run::<blake2::Blake2s256>(parts),
            Self::Wp256 | Self::Wp384 => {
                let mut d = run::<whirlpool::Whirlpool>(parts);
                d.truncate(self.output_len());
                d
            }
        }
    }

    /// Writes the digest of the concatenation of `parts` to the first [`Self::output_len`]
    /// bytes of `out` without allocating (for hot paths such as verity reads) and returns
    /// that length.
    ///
    /// # Panics
    /// If `out` is shorter than [`Self::output_len`] (at most 64 bytes), a caller's bug.
    pub fn digest_into(self, parts: &[&[u8]], out: &mut [u8]) -> usize {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut d = D::new();
            for p in parts {
                d.update(p);
            }
            let r = d.finalize();
            // Truncates for wp256/wp384, whose `out` is shorter than Whirlpool's output.
            let n = out.len();
            out.copy_from_slice(&r[..n]);
        }
        let n = self.output_len();
        assert!(
            out.len() >= n,
            "digest_into: {}-byte buffer for a {n}-byte {} digest",
            out.len(),
            self.name()
        );
        let out = &mut out[..n];
        match self {
            Self::Sha1 => run::<sha1::Sha1>(parts, out),
            Self::Sha224 => run::<sha2::Sha224>(parts, out),
            Self::Sha256 => run::<sha2::Sha256>(parts, out),
            Self::Sha384 => run::<sha2::Sha384>(parts, out),
            Self::Sha512 => run::<sha2::Sha512>(parts, out),
            Self::Ripemd160 => run::<ripemd::Ripemd160>(parts, out),
            Self::Whirlpool | Self::Wp256 | Self::Wp384 => run::<whirlpool::Whirlpool>(parts, out),
            Self::Stribog512 => run::<streebog::Streebog512>(parts, out),
            Self::Blake2s256 => run::<blake2::Blake2s256>(parts, out),
        }
        n
    }

    /// HMAC of `data` under `key`.
    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
            let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC accepts keys of any length");
            m.update(data);
            m.finalize().into_bytes().to_vec()
        }
        match self {
            Self::Sha1 => run::<Hmac<sha1::Sha1>>(key, data),
            Self::Sha224 => run::<Hmac<sha2::Sha224>>(key, data),
            Self::Sha256 => run::<Hmac<sha2::Sha256>>(key, data),
            Self::Sha384 => run::<Hmac<sha2::Sha384>>(key, data),
            Self::Sha512 => run::<Hmac<sha2::Sha512>>(key, data),
            Self::Ripemd160 => run::<Hmac<ripemd::Ripemd160>>(key, data),
            Self::Whirlpool => run::<Hmac<whirlpool::Whirlpool>>(key, data),
            Self::Stribog512 => run::<Hmac<streebog::Streebog512>>(key, data),
            Self::Blake2s256 => run::<hmac::SimpleHmac<blake2::Blake2s256>>(key, data),
            Self::Wp256 | Self::Wp384 => self.manual_hmac(key, data),
        }
    }

    /// PBKDF2-HMAC with this hash, filling `out` (RFC 8018).
    pub fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac;
        match self {
            Self::Sha1 => pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
            Self::Sha224 => pbkdf2_hmac::<sha2::Sha224>(password, salt, iterations, out),
            Self::Sha256 => pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
            Self::Sha384 => pbkdf2_hmac::<sha2::Sha384>(password, salt, iterations, out),
            Self::Sha512 => pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
            Self::Ripemd160 => pbkdf2_hmac::<ripemd::Ripemd160>(password, salt, iterations, out),
            Self::Whirlpool => pbkdf2_hmac::<whirlpool::Whirlpool>(password, salt, iterations, out),
            Self::Stribog512 => {
                pbkdf2_hmac::<streebog::Streebog512>(password, salt, iterations, out)
            }
            Self::Blake2s256 => pbkdf2::pbkdf2::<hmac::SimpleHmac<blake2::Blake2s256>>(
                password, salt, iterations, out,
            )
            .expect("HMAC accepts keys of any length"),
            Self::Wp256 | Self::Wp384 => self.manual_pbkdf2(password, salt, iterations, out),
        }
    }

    /// HMAC (RFC 2104) built on [`Self::digest`], for the truncated Whirlpools that have no
    /// `Digest` type of their own. Valid for hashes with 64-byte blocks.
    fn manual_hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        const BLOCK: usize = 64;
        let mut k = [0u8; BLOCK];
        if key.len() > BLOCK {
            let d = self.digest(&[key]);
            k[..d.len()].copy_from_slice(&d);
        } else {
            k[..key.len()].copy_from_slice(key);
        }
        let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        let inner = self.digest(&[&ipad, data]);
        let out = self.digest(&[&opad, &inner]);
        zeroize::Zeroize::zeroize(&mut k);
        out
    }

    /// PBKDF2 (RFC 8018) over [`Self::manual_hmac`].
    fn manual_pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        let hlen = self.output_len();
        for (i, chunk) in out.chunks_mut(hlen).enumerate() {
            let index = (i as u32 + 1).to_be_bytes();
            let mut u = self.manual_hmac(password, &[salt, &index].concat());
            let mut t = u.clone();
            for _ in 1..iterations {
                u = self.manual_hmac(password, &u);
                t.iter_mut().zip(&u).for_each(|(a, b)| *a ^= b);
            }
            chunk.copy_from_slice(&t[..chunk.len()]);
        }
    }
}

/// HMAC with a fixed key, its inner and outer hash states computed once: a MAC per sector
/// (dm-integrity's `internal_hash:hmac(...)`, dm-crypt's `authenc(hmac(...),...)`) then costs
/// a copy of those states instead of two compressions of the padded key, and allocates
/// nothing. The states are as secret as the key: they live in locked memory, wiped on drop
/// (the per-call copy lives on the stack, like any key schedule in registers and spills).
pub struct KeyedHmac {
    alg: HashAlgorithm,
    state: crate::locked::LockedBox<KeyedState>,
}

/// The precomputed states per hash; hashes without an HMAC type of their own keep the key.
enum KeyedState {
    Sha1(Hmac<sha1::Sha1>),
    Sha224(Hmac<sha2::Sha224>),
    Sha256(Hmac<sha2::Sha256>),
    Sha384(Hmac<sha2::Sha384>),
    Sha512(Hmac<sha2::Sha512>),
    Other(crate::SecretBytes),
}

impl KeyedHmac {
    /// Keys HMAC-`alg` with `key` (any length, as RFC 2104 allows).
    pub fn new(alg: HashAlgorithm, key: &[u8]) -> Self {
        fn keyed<M: Mac + hmac::digest::KeyInit>(key: &[u8]) -> M {
            <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC accepts keys of any length")
        }
        let state = match alg {
            HashAlgorithm::Sha1 => KeyedState::Sha1(keyed(key)),
            HashAlgorithm::Sha224 => KeyedState::Sha224(keyed(key)),
            HashAlgorithm::Sha256 => KeyedState::Sha256(keyed(key)),
            HashAlgorithm::Sha384 => KeyedState::Sha384(keyed(key)),
            HashAlgorithm::Sha512 => KeyedState::Sha512(keyed(key)),
            _ => KeyedState::Other(crate::SecretBytes::from_slice(key)),
        };
        KeyedHmac {
            alg,
            state: crate::locked::LockedBox::new(state),
        }
    }

    /// The hash algorithm.
    pub fn algorithm(&self) -> HashAlgorithm {
        self.alg
    }

    /// Writes the HMAC of the concatenation of `parts` to the first
    /// [`HashAlgorithm::output_len`] bytes of `out` and returns that length.
    ///
    /// # Panics
    /// If `out` is shorter than the digest (at most 64 bytes), a caller's bug.
    pub fn mac_into(&self, parts: &[&[u8]], out: &mut [u8]) -> usize {
        fn run<M: Mac + Clone>(m: &M, parts: &[&[u8]], out: &mut [u8]) -> usize {
            let mut m = m.clone();
            parts.iter().for_each(|p| m.update(p));
            let d = m.finalize().into_bytes();
            out[..d.len()].copy_from_slice(&d);
            d.len()
        }
        match &*self.state {
            KeyedState::Sha1(m) => run(m, parts, out),
            KeyedState::Sha224(m) => run(m, parts, out),
            KeyedState::Sha256(m) => run(m, parts, out),
            KeyedState::Sha384(m) => run(m, parts, out),
            KeyedState::Sha512(m) => run(m, parts, out),
            KeyedState::Other(k) => {
                let d = self.alg.hmac(k.as_bytes(), &parts.concat());
                out[..d.len()].copy_from_slice(&d);
                d.len()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(v: &[u8]) -> String {
        v.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_known_answer() {
        assert_eq!(
            hex(&HashAlgorithm::Sha256.digest(&[b"ab", b"c"])),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn pbkdf2_rfc6070_vector() {
        let mut out = [0u8; 20];
        HashAlgorithm::Sha1.pbkdf2(b"password", b"salt", 2, &mut out);
        assert_eq!(hex(&out), "ea6c014dc72d6f8ccd1ed92ace1d41f0d8de8957");
    }

    #[test]
    fn truncated_whirlpool_is_the_digest_prefix() {
        let full = HashAlgorithm::Whirlpool.digest(&[b"abc"]);
        assert_eq!(HashAlgorithm::Wp256.digest(&[b"abc"]), full[..32]);
        assert_eq!(HashAlgorithm::Wp384.digest(&[b"a", b"bc"]), full[..48]);
    }

    #[test]
    fn manual_hmac_and_pbkdf2_agree_with_the_crates() {
        // The construction used for wp256/wp384, run over SHA-256 and Whirlpool (64-byte
        // blocks like them), must equal the hmac and pbkdf2 crates.
        for h in [HashAlgorithm::Sha256, HashAlgorithm::Whirlpool] {
            for key in [&b"k"[..], &[9u8; 64][..], &[3u8; 100][..]] {
                assert_eq!(h.manual_hmac(key, b"message"), h.hmac(key, b"message"));
            }
            let (mut a, mut b) = ([0u8; 70], [0u8; 70]);
            h.manual_pbkdf2(b"password", b"salt", 3, &mut a);
            h.pbkdf2(b"password", b"salt", 3, &mut b);
            assert_eq!(a, b);
        }
    }

    /// Every hash the dm targets name.
    const EVERY_HASH: [HashAlgorithm; 9] = [
        HashAlgorithm::Sha1,
        HashAlgorithm::Sha224,
        HashAlgorithm::Sha256,
        HashAlgorithm::Sha384,
        HashAlgorithm::Sha512,
        HashAlgorithm::Ripemd160,
        HashAlgorithm::Whirlpool,
        HashAlgorithm::Wp256,
        HashAlgorithm::Wp384,
    ];

    #[test]
    fn digest_into_equals_digest_for_every_algorithm() {
        for h in EVERY_HASH {
            let mut out = [0xeeu8; 80];
            let n = h.digest_into(&[b"salt", &[7u8; 4096]], &mut out);
            assert_eq!(n, h.output_len(), "{}", h.name());
            assert_eq!(
                out[..n],
                h.digest(&[b"salt", &[7u8; 4096]])[..],
                "{}",
                h.name()
            );
            assert!(
                out[n..].iter().all(|&b| b == 0xee),
                "{} wrote past its digest",
                h.name()
            );
        }
        // An independent known answer: SHA-256("abc").
        let mut out = [0u8; 32];
        HashAlgorithm::Sha256.digest_into(&[b"a", b"bc"], &mut out);
        assert_eq!(
            hex(&out),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn keyed_hmac_equals_hmac_for_every_algorithm() {
        for h in EVERY_HASH {
            for key in [&b"k"[..], &[9u8; 64][..], &[3u8; 200][..]] {
                let k = KeyedHmac::new(h, key);
                assert_eq!(k.algorithm(), h);
                // Used twice: the first call must leave the precomputed states untouched.
                for _ in 0..2 {
                    let mut out = [0xeeu8; 80];
                    let n = k.mac_into(&[b"sector", &[7u8; 4096]], &mut out);
                    assert_eq!(n, h.output_len(), "{}", h.name());
                    let mut msg = b"sector".to_vec();
                    msg.extend_from_slice(&[7u8; 4096]);
                    assert_eq!(out[..n], h.hmac(key, &msg)[..], "{}", h.name());
                    assert!(out[n..].iter().all(|&b| b == 0xee));
                }
            }
        }
        // RFC 4231 test case 2 (HMAC-SHA-256, key "Jefe").
        let mut out = [0u8; 32];
        KeyedHmac::new(HashAlgorithm::Sha256, b"Jefe")
            .mac_into(&[b"what do ya want ", b"for nothing?"], &mut out);
        assert_eq!(
            hex(&out),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn unknown_names_are_rejected() {
        assert!(HashAlgorithm::from_name("md5x").is_err());
        assert_eq!(
            HashAlgorithm::from_name("SHA512").unwrap(),
            HashAlgorithm::Sha512
        );
    }
}
