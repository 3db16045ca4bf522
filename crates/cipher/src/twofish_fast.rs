//! Twofish with precomputed key-dependent S-boxes ("full keying" in the Twofish paper).
//!
//! The `twofish` 0.7 crate evaluates the q permutations and GF(2^8) MDS products for every
//! byte of every round (about 2 MiB/s in XTS); no faster maintained crate exists for the
//! cipher 0.4 traits, so this computes the same key schedule once and folds the key-dependent
//! S-boxes and the MDS matrix into four 256-entry tables, making each g() four lookups.
//! Constants (q-permutation nibble tables, RS and MDS matrices, field polynomials) are the
//! Twofish specification's. Checked against the `twofish` crate, the paper's vectors and
//! cryptsetup's twofish-xts LUKS1 images.

use cipher::consts::{U16, U32};
use cipher::{AlgorithmName, BlockCipher, InvalidLength, Key, KeyInit, KeySizeUser};
use zeroize::Zeroize;

/// The 4-bit tables t0..t3 defining q0 (index 0) and q1 (index 1).
const Q_NIBBLES: [[[u8; 16]; 4]; 2] = [
    [
        [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
        [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
        [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
        [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
    ],
    [
        [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
        [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
        [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
        [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
    ],
];

/// Reed-Solomon matrix that derives the S-box key words.
const RS: [[u8; 8]; 4] = [
    [0x01, 0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e],
    [0xa4, 0x56, 0x82, 0xf3, 0x1e, 0xc6, 0x68, 0xe5],
    [0x02, 0xa1, 0xfc, 0xc1, 0x47, 0xae, 0x3d, 0x19],
    [0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e, 0x03],
];

/// x^8 + x^6 + x^5 + x^3 + 1 (MDS) and x^8 + x^6 + x^3 + x^2 + 1 (RS), low 8 bits.
const MDS_POLY: u8 = 0x69;
const RS_POLY: u8 = 0x4d;

fn gf_mul(mut a: u8, mut b: u8, poly: u8) -> u8 {
    let mut r = 0;
    while a != 0 {
        if a & 1 == 1 {
            r ^= b;
        }
        a >>= 1;
        b = (b << 1) ^ if b & 0x80 != 0 { poly } else { 0 };
    }
    r
}

/// The permutation q0 (`which` = 0) or q1 (`which` = 1).
fn q(which: usize, x: u8) -> u8 {
    let t = &Q_NIBBLES[which];
    let ror4 = |v: u8| ((v >> 1) | (v << 3)) & 15;
    let (a0, b0) = (x >> 4, x & 15);
    let (a1, b1) = (a0 ^ b0, (a0 ^ ror4(b0) ^ (a0 << 3)) & 15);
    let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
    let (a3, b3) = (a2 ^ b2, (a2 ^ ror4(b2) ^ (a2 << 3)) & 15);
    let (a4, b4) = (t[2][a3 as usize], t[3][b3 as usize]);
    (b4 << 4) | a4
}

/// Column `col` of the MDS matrix times `x`, as a little-endian word.
fn mds_column(x: u8, col: usize) -> u32 {
    let x5b = gf_mul(x, 0x5b, MDS_POLY);
    let xef = gf_mul(x, 0xef, MDS_POLY);
    u32::from_le_bytes(match col {
        0 => [x, x5b, xef, xef],
        1 => [xef, xef, x5b, x],
        2 => [x5b, xef, x, xef],
        _ => [x5b, x, xef, x5b],
    })
}

/// The q permutations byte `i` of h() passes through, outermost (applied first) first, for
/// the 4-word key case; shorter keys skip the leading stages.
const Q_ORDER: [[usize; 4]; 4] = [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1], [1, 0, 1, 1]];
/// The final q applied to each byte before the MDS multiply.
const Q_LAST: [usize; 4] = [1, 0, 1, 0];

/// h(): byte `i` of `x` through the q chain keyed by `words` (the list L of the paper, word
/// 0 first), all columns combined through the MDS matrix.
fn h(x: u32, words: &[[u8; 4]]) -> u32 {
    let k = words.len();
    let mut out = 0;
    for (i, b) in x.to_le_bytes().into_iter().enumerate() {
        out ^= mds_column(h_byte(b, i, words, k), i);
    }
    out
}

fn h_byte(mut y: u8, i: usize, words: &[[u8; 4]], k: usize) -> u8 {
    // Stages for L[3], L[2] (only with longer keys), then L[1], L[0].
    for stage in (4 - k)..4 {
        y = q(Q_ORDER[i][stage], y) ^ words[3 - stage][i];
    }
    q(Q_LAST[i], y)
}

/// Twofish with 128-, 192- or 256-bit keys.
pub(crate) struct Twofish {
    subkeys: [u32; 40],
    /// `sbox[i][b]`: byte `i` of g()'s input through the keyed q chain and MDS column `i`.
    sbox: Box<[[u32; 256]; 4]>,
}

impl KeySizeUser for Twofish {
    type KeySize = U32;
}

impl KeyInit for Twofish {
    fn new(key: &Key<Self>) -> Self {
        Self::new_from_slice(key).expect("a 32-byte Twofish key is valid")
    }

    fn new_from_slice(key: &[u8]) -> Result<Self, InvalidLength> {
        if !matches!(key.len(), 16 | 24 | 32) {
            return Err(InvalidLength);
        }
        let k = key.len() / 8;
        let word = |i: usize| -> [u8; 4] { key[4 * i..4 * i + 4].try_into().expect("4 bytes") };
        let mut even: Vec<[u8; 4]> = (0..k).map(|i| word(2 * i)).collect();
        let mut odd: Vec<[u8; 4]> = (0..k).map(|i| word(2 * i + 1)).collect();
        // S-box key words, in reverse order of the 8-byte key chunks they come from.
        let mut s: Vec<[u8; 4]> = (0..k)
            .rev()
            .map(|i| {
                let m = &key[8 * i..8 * i + 8];
                let mut v = [0u8; 4];
                for (r, out) in v.iter_mut().enumerate() {
                    *out = (0..8).fold(0, |acc, j| acc ^ gf_mul(m[j], RS[r][j], RS_POLY));
                }
                v
            })
            .collect();
        let mut subkeys = [0u32; 40];
        const RHO: u32 = 0x0101_0101;
        for i in 0..20u32 {
            let a = h(RHO.wrapping_mul(2 * i), &even);
            let b = h(RHO.wrapping_mul(2 * i + 1), &odd).rotate_left(8);
            subkeys[2 * i as usize] = a.wrapping_add(b);
            subkeys[2 * i as usize + 1] = a.wrapping_add(b.wrapping_mul(2)).rotate_left(9);
        }
        let mut sbox = Box::new([[0u32; 256]; 4]);
        for (i, table) in sbox.iter_mut().enumerate() {
            for (b, slot) in table.iter_mut().enumerate() {
                *slot = mds_column(h_byte(b as u8, i, &s, k), i);
            }
        }
        even.zeroize();
        odd.zeroize();
        s.zeroize();
        Ok(Self { subkeys, sbox })
    }
}

impl Drop for Twofish {
    fn drop(&mut self) {
        self.subkeys.zeroize();
        for t in self.sbox.iter_mut() {
            t.zeroize();
        }
    }
}

impl Twofish {
    #[inline(always)]
    fn g(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.sbox[0][b[0] as usize]
            ^ self.sbox[1][b[1] as usize]
            ^ self.sbox[2][b[2] as usize]
            ^ self.sbox[3][b[3] as usize]
    }

    fn words(b: &[u8]) -> [u32; 4] {
        core::array::from_fn(|i| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4")))
    }

    fn encrypt16(&self, input: &[u8], output: &mut [u8]) {
        let k = &self.subkeys;
        let mut p = Self::words(input);
        for (i, w) in p.iter_mut().enumerate() {
            *w ^= k[i];
        }
        for r in 0..8 {
            let sk = 8 + 4 * r;
            let t0 = self.g(p[0]);
            let t1 = self.g(p[1].rotate_left(8));
            p[2] = (p[2] ^ t0.wrapping_add(t1).wrapping_add(k[sk])).rotate_right(1);
            p[3] =
                p[3].rotate_left(1) ^ t0.wrapping_add(t1.wrapping_mul(2)).wrapping_add(k[sk + 1]);
            let t0 = self.g(p[2]);
            let t1 = self.g(p[3].rotate_left(8));
            p[0] = (p[0] ^ t0.wrapping_add(t1).wrapping_add(k[sk + 2])).rotate_right(1);
            p[1] =
                p[1].rotate_left(1) ^ t0.wrapping_add(t1.wrapping_mul(2)).wrapping_add(k[sk + 3]);
        }
        let out = [p[2] ^ k[4], p[3] ^ k[5], p[0] ^ k[6], p[1] ^ k[7]];
        for (i, w) in out.iter().enumerate() {
            output[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
    }

    fn decrypt16(&self, input: &[u8], output: &mut [u8]) {
        let k = &self.subkeys;
        let c = Self::words(input);
        let mut p = [c[2] ^ k[6], c[3] ^ k[7], c[0] ^ k[4], c[1] ^ k[5]];
        for r in (0..8).rev() {
            let sk = 8 + 4 * r;
            let t0 = self.g(p[2]);
            let t1 = self.g(p[3].rotate_left(8));
            p[0] = p[0].rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[sk + 2]);
            p[1] = (p[1] ^ t0.wrapping_add(t1.wrapping_mul(2)).wrapping_add(k[sk + 3]))
                .rotate_right(1);
            let t0 = self.g(p[0]);
            let t1 = self.g(p[1].rotate_left(8));
            p[2] = p[2].rotate_left(1) ^ t0.wrapping_add(t1).wrapping_add(k[sk]);
            p[3] = (p[3] ^ t0.wrapping_add(t1.wrapping_mul(2)).wrapping_add(k[sk + 1]))
                .rotate_right(1);
        }
        for (i, w) in p.iter().enumerate() {
            output[4 * i..4 * i + 4].copy_from_slice(&(w ^ k[i]).to_le_bytes());
        }
    }
}

impl AlgorithmName for Twofish {
    fn write_alg_name(f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Twofish")
    }
}

cipher::impl_simple_block_encdec!(
    Twofish, U16, cipher, block,
    encrypt: {
        let mut out = [0u8; 16];
        cipher.encrypt16(block.get_in(), &mut out);
        block.get_out().copy_from_slice(&out);
    }
    decrypt: {
        let mut out = [0u8; 16];
        cipher.decrypt16(block.get_in(), &mut out);
        block.get_out().copy_from_slice(&out);
    }
);

impl BlockCipher for Twofish {}

#[cfg(test)]
mod tests {
    use super::*;
    use cipher::generic_array::GenericArray;
    use cipher::{BlockDecrypt, BlockEncrypt};

    /// Same output as the `twofish` crate for every key size, both directions.
    #[test]
    fn matches_twofish_crate() {
        for len in [16usize, 24, 32] {
            for seed in 0..4u8 {
                let key: Vec<u8> = (0..len as u8)
                    .map(|i| i.wrapping_mul(97) ^ seed.wrapping_mul(31))
                    .collect();
                let fast = Twofish::new_from_slice(&key).unwrap();
                let slow = twofish::Twofish::new_from_slice(&key).unwrap();
                let plain = GenericArray::clone_from_slice(&[seed ^ len as u8; 16]);
                let (mut a, mut b) = (plain, plain);
                fast.encrypt_block(&mut a);
                slow.encrypt_block(&mut b);
                assert_eq!(a, b, "key length {len}, seed {seed}");
                fast.decrypt_block(&mut a);
                assert_eq!(a, plain);
            }
        }
    }
}
