//! `aegis128` (cryptsetup's `aegis128-random`): AEGIS-128 as in its CAESAR submission
//! (v1.1), which the kernel's `aegis128` implements — five 128-bit state words updated with
//! one AES round each per 16-byte block, 16-byte key and IV, tag up to 16 bytes.
//!
//! Written here because no maintained crate offers AEGIS-128 (the `aegis` crate has the
//! later AEGIS-128L/-256 family only); the AES round is the `aes` crate's. Checked against
//! sectors the kernel wrote (aead_fixtures/d-aegis128-random).

use super::AeadPrimitive;
use crate::secret::{ct_eq, SecretBytes};
use crate::CipherError;
use aes::hazmat::cipher_round;
use aes::Block;

const C0: [u8; 16] = [
    0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62,
];
const C1: [u8; 16] = [
    0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd,
];

type W = [u8; 16];

fn xor(a: &W, b: &W) -> W {
    let mut o = *a;
    o.iter_mut().zip(b).for_each(|(x, y)| *x ^= y);
    o
}

fn and(a: &W, b: &W) -> W {
    let mut o = *a;
    o.iter_mut().zip(b).for_each(|(x, y)| *x &= y);
    o
}

/// One AES encryption round of `a` with round key `b`.
fn aes_round(a: &W, b: &W) -> W {
    let mut blk = Block::clone_from_slice(a);
    cipher_round(&mut blk, Block::from_slice(b));
    blk.into()
}

struct State([W; 5]);

impl State {
    fn update(&mut self, m: &W) {
        let s = &self.0;
        let n = [
            aes_round(&s[4], &xor(&s[0], m)),
            aes_round(&s[0], &s[1]),
            aes_round(&s[1], &s[2]),
            aes_round(&s[2], &s[3]),
            aes_round(&s[3], &s[4]),
        ];
        self.0 = n;
    }

    fn keystream(&self) -> W {
        let s = &self.0;
        xor(&xor(&s[1], &s[4]), &and(&s[2], &s[3]))
    }

    fn new(key: &W, iv: &W, ad: &[u8]) -> Self {
        let kiv = xor(key, iv);
        let mut st = State([kiv, C1, C0, xor(key, &C0), xor(key, &C1)]);
        for _ in 0..5 {
            st.update(key);
            st.update(&kiv);
        }
        for chunk in ad.chunks(16) {
            let mut m = [0u8; 16];
            m[..chunk.len()].copy_from_slice(chunk);
            st.update(&m);
        }
        st
    }

    fn tag(mut self, ad_len: usize, msg_len: usize) -> W {
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&((ad_len as u64) * 8).to_le_bytes());
        lens[8..].copy_from_slice(&((msg_len as u64) * 8).to_le_bytes());
        let t = xor(&self.0[3], &lens);
        for _ in 0..7 {
            self.update(&t);
        }
        let s = &self.0;
        xor(&xor(&xor(&s[0], &s[1]), &xor(&s[2], &s[3])), &s[4])
    }
}

/// AEGIS-128 with a 16-byte key.
pub(crate) struct Aegis128 {
    key: SecretBytes,
}

impl Aegis128 {
    /// `None` unless the key is 16 bytes.
    pub(crate) fn new(key: &[u8]) -> Option<Self> {
        (key.len() == 16).then(|| Aegis128 {
            key: SecretBytes::from_slice(key),
        })
    }

    fn start(&self, iv: &[u8], ad: &[u8]) -> Result<State, CipherError> {
        let key: W = self.key.as_bytes().try_into().expect("16-byte key");
        let iv: W = iv
            .try_into()
            .map_err(|_| CipherError::Backend("AEGIS-128 IV is not 16 bytes".into()))?;
        Ok(State::new(&key, &iv, ad))
    }
}

impl AeadPrimitive for Aegis128 {
    fn iv_size(&self) -> usize {
        16
    }

    fn max_tag_size(&self) -> usize {
        16
    }

    fn tag_size_ok(&self, n: usize) -> bool {
        (8..=16).contains(&n)
    }

    fn seal(
        &self,
        iv: &[u8],
        ad: &[u8],
        data: &mut [u8],
        tag: &mut [u8],
    ) -> Result<(), CipherError> {
        let mut st = self.start(iv, ad)?;
        for chunk in data.chunks_mut(16) {
            let mut p = [0u8; 16];
            p[..chunk.len()].copy_from_slice(chunk);
            let z = st.keystream();
            chunk.iter_mut().zip(&z).for_each(|(c, k)| *c ^= k);
            st.update(&p);
        }
        let t = st.tag(ad.len(), data.len());
        tag.copy_from_slice(&t[..tag.len()]);
        Ok(())
    }

    fn open(&self, iv: &[u8], ad: &[u8], data: &mut [u8], tag: &[u8]) -> Result<bool, CipherError> {
        let mut st = self.start(iv, ad)?;
        for chunk in data.chunks_mut(16) {
            let z = st.keystream();
            chunk.iter_mut().zip(&z).for_each(|(c, k)| *c ^= k);
            let mut p = [0u8; 16];
            p[..chunk.len()].copy_from_slice(chunk);
            st.update(&p);
        }
        let t = st.tag(ad.len(), data.len());
        if !ct_eq(&t[..tag.len()], tag) {
            // Leave no unauthenticated plaintext behind.
            data.fill(0);
            return Ok(false);
        }
        Ok(true)
    }

    fn implementation(&self) -> &'static str {
        "cryptblk"
    }
}
