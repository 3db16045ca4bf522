//! BitLocker's Elephant diffuser, as dm-crypt's `elephant` IV mode applies it around AES-CBC
//! (`aes-cbc-elephant`).
//!
//! Facts from Niels Ferguson's "AES-CBC + Elephant diffuser" (Microsoft, 2006) and the
//! BitLocker format notes: a sector is read as little-endian 32-bit words `d[0..n]`.
//! Diffuser A runs 5 cycles with rotations (9, 0, 13, 0), its decryption step being
//! `d[i] += d[i-2] ^ rotl(d[i-5], Ra[i % 4])`; diffuser B runs 3 cycles with rotations
//! (0, 10, 0, 25) and the step `d[i] += d[i+2] ^ rotl(d[i+5], Rb[i % 4])` (indices modulo
//! `n`); encryption runs the steps backwards with subtraction. The 32-byte sector key is the
//! sector's byte offset as a little-endian 16-byte block encrypted with the tweak key,
//! followed by the same block with its last byte set to 0x80, encrypted likewise. Reading a
//! sector: CBC decryption, diffuser B, diffuser A, XOR with the sector key repeated over the
//! sector; writing is the exact reverse.

use crate::iv::EssivCipher;
use crate::CipherError;

const A_CYCLES: usize = 5;
const B_CYCLES: usize = 3;
const RA: [u32; 4] = [9, 0, 13, 0];
const RB: [u32; 4] = [0, 10, 0, 25];

/// The diffuser and sector-key layer of one `elephant` cipher.
pub(crate) struct Elephant {
    tweak: EssivCipher,
    sector_size: u64,
}

impl Elephant {
    /// The layer for `tweak_key` (16 or 32 bytes) and `sector_size`-byte sectors.
    pub(crate) fn new(tweak_key: &[u8], sector_size: usize) -> Result<Self, CipherError> {
        Ok(Self {
            tweak: EssivCipher::aes(tweak_key)?,
            sector_size: sector_size as u64,
        })
    }

    fn sector_key(&self, iv_sector: u64) -> [u8; 32] {
        let mut lo = [0u8; 16];
        lo[..8].copy_from_slice(&iv_sector.wrapping_mul(self.sector_size).to_le_bytes());
        let mut hi = lo;
        hi[15] = 0x80;
        self.tweak.encrypt(&mut lo);
        self.tweak.encrypt(&mut hi);
        let mut k = [0u8; 32];
        k[..16].copy_from_slice(&lo);
        k[16..].copy_from_slice(&hi);
        k
    }

    /// After CBC decryption of one sector: undoes the diffusers and the sector key.
    pub(crate) fn after_decrypt(&self, iv_sector: u64, sector: &mut [u8]) {
        let mut words = to_words(sector);
        let d = &mut words[..sector.len() / 4];
        let n = d.len();
        for i in 0..n * B_CYCLES {
            let v = d[(i + 2) % n] ^ d[(i + 5) % n].rotate_left(RB[i % 4]);
            d[i % n] = d[i % n].wrapping_add(v);
        }
        for i in 0..n * A_CYCLES {
            let v = d[(i + n - 2) % n] ^ d[(i + n - 5) % n].rotate_left(RA[i % 4]);
            d[i % n] = d[i % n].wrapping_add(v);
        }
        from_words(d, sector);
        xor_key(sector, &self.sector_key(iv_sector));
    }

    /// Before CBC encryption of one sector: applies the sector key and the diffusers.
    pub(crate) fn before_encrypt(&self, iv_sector: u64, sector: &mut [u8]) {
        xor_key(sector, &self.sector_key(iv_sector));
        let mut words = to_words(sector);
        let d = &mut words[..sector.len() / 4];
        let n = d.len();
        for i in (0..n * A_CYCLES).rev() {
            let v = d[(i + n - 2) % n] ^ d[(i + n - 5) % n].rotate_left(RA[i % 4]);
            d[i % n] = d[i % n].wrapping_sub(v);
        }
        for i in (0..n * B_CYCLES).rev() {
            let v = d[(i + 2) % n] ^ d[(i + 5) % n].rotate_left(RB[i % 4]);
            d[i % n] = d[i % n].wrapping_sub(v);
        }
        from_words(d, sector);
    }
}

/// Sector words on the stack (sectors are at most 4096 bytes); the plaintext they hold is
/// wiped when done, as the sector buffer is the caller's.
fn to_words(sector: &[u8]) -> zeroize::Zeroizing<[u32; 1024]> {
    let mut w = zeroize::Zeroizing::new([0u32; 1024]);
    for (o, c) in w.iter_mut().zip(sector.chunks_exact(4)) {
        *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

fn from_words(words: &[u32], sector: &mut [u8]) {
    for (c, w) in sector.chunks_exact_mut(4).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
    }
}

fn xor_key(sector: &mut [u8], key: &[u8; 32]) {
    for chunk in sector.chunks_exact_mut(32) {
        for (b, k) in chunk.iter_mut().zip(key) {
            *b ^= k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encrypt_then_decrypt_is_identity_and_diffuses() {
        for ss in [512usize, 4096] {
            let e = Elephant::new(&[7u8; 16], ss).unwrap();
            let orig: Vec<u8> = (0..ss).map(|i| (i * 31 % 251) as u8).collect();
            let mut buf = orig.clone();
            e.before_encrypt(9, &mut buf);
            assert_ne!(buf, orig);
            // One flipped input bit changes most of the diffused sector.
            let mut flipped = orig.clone();
            flipped[0] ^= 1;
            e.before_encrypt(9, &mut flipped);
            let differing = buf.iter().zip(&flipped).filter(|(a, b)| a != b).count();
            assert!(differing > ss / 2, "{differing} of {ss} bytes differ");
            e.after_decrypt(9, &mut buf);
            assert_eq!(buf, orig);
        }
    }
}
