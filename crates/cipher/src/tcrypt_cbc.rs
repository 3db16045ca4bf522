//! TrueCrypt's legacy CBC modes (TrueCrypt 1.0 to 4.3), and dm-crypt's `tcw` IV that maps
//! the single-cipher ones.
//!
//! Facts from the kernel's dm-crypt documentation and the TrueCrypt volume format: a legacy
//! volume keeps a 32-byte area in front of its cipher keys. For a cipher with `bs`-byte
//! blocks, its first `bs` bytes seed the IV and the next 16 the whitening. Each 512-byte
//! sector `s` (a little-endian 64-bit number) gets
//! - the IV: the IV seed XOR `s` (repeated for 16-byte blocks);
//! - the whitening: the whitening seed XOR `s` (twice), taken as four 4-byte words
//!   `w0..w3`, each replaced by its CRC32; the 8-byte whitening is `w0^w3 ‖ w1^w2` (little
//!   endian), and it is XORed over every 8 bytes of the ciphertext.
//!
//! Between whitening and IV the sector is plain CBC. A cascade of ciphers with one block size
//! ("outer CBC", cryptsetup's `cbci-tcrypt`) runs CBC once over the ciphers applied to each
//! block in turn; a cascade that mixes block sizes ("inner CBC", cryptsetup's `cbc-tcrypt`,
//! the Blowfish ones) runs whitening and CBC once per cipher, each with the IV and whitening
//! of its own block size. A single cipher is both. TrueCrypt's Blowfish reads its two block
//! words little-endian (`blowfish_le`); the kernel's `blowfish` is the big-endian standard.
//!
//! dm-crypt's `tcw` is the single-cipher case: its key is the cipher key, then the IV seed
//! (one block) and the 16 whitening bytes. The cascades exist nowhere in the kernel (so
//! cryptsetup only dumps them); [`TcryptCbc`] serves both as a [`SectorCipher`].

use crate::locked::LockedBox;
use crate::{CipherError, SectorCipher};
use cipher::generic_array::GenericArray;
use cipher::{BlockDecrypt, BlockEncrypt, KeyInit};

/// Bytes of the IV and whitening area in front of a legacy volume's cipher keys.
pub const SEED_AREA_LEN: usize = 32;
/// Bytes of the whitening seed (after the IV seed).
pub const WHITENING_SEED_LEN: usize = 16;
/// Most ciphers in one cascade.
pub const MAX_CASCADE: usize = 3;
/// The only sector size: the IV and whitening are per 512-byte sector.
const SECTOR: usize = 512;

/// A block cipher of TrueCrypt's legacy modes, by cryptsetup's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyCipher {
    /// AES (16-byte blocks).
    Aes,
    /// Serpent (16-byte blocks).
    Serpent,
    /// Twofish (16-byte blocks).
    Twofish,
    /// Blowfish as the kernel has it: block words big-endian (8-byte blocks).
    Blowfish,
    /// TrueCrypt's Blowfish: block words little-endian (cryptsetup's `blowfish_le`).
    BlowfishLe,
    /// CAST5 (CAST-128, 8-byte blocks).
    Cast5,
    /// Triple DES, encrypt-decrypt-encrypt with three keys (8-byte blocks).
    Des3Ede,
}

impl LegacyCipher {
    /// Parses cryptsetup's (and the kernel's) name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "aes" => Self::Aes,
            "serpent" => Self::Serpent,
            "twofish" => Self::Twofish,
            "blowfish" => Self::Blowfish,
            "blowfish_le" => Self::BlowfishLe,
            "cast5" => Self::Cast5,
            "des3_ede" => Self::Des3Ede,
            _ => return None,
        })
    }

    /// cryptsetup's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes => "aes",
            Self::Serpent => "serpent",
            Self::Twofish => "twofish",
            Self::Blowfish => "blowfish",
            Self::BlowfishLe => "blowfish_le",
            Self::Cast5 => "cast5",
            Self::Des3Ede => "des3_ede",
        }
    }

    /// Block size in bytes.
    pub fn block_size(self) -> usize {
        match self {
            Self::Aes | Self::Serpent | Self::Twofish => 16,
            _ => 8,
        }
    }

    /// The key size TrueCrypt uses (bytes).
    pub fn tcrypt_key_size(self) -> usize {
        match self {
            Self::Aes | Self::Serpent | Self::Twofish => 32,
            Self::Blowfish | Self::BlowfishLe => 56,
            Self::Cast5 => 16,
            Self::Des3Ede => 24,
        }
    }
}

/// A keyed block cipher. Blowfish's key schedule is about 4 KiB, so the whole engine state
/// lives in one locked box rather than in boxes of its own.
enum Keyed {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
    Serpent(crate::serpent_fast::Serpent),
    Twofish(crate::twofish_fast::Twofish),
    Blowfish(blowfish::Blowfish),
    BlowfishLe(blowfish::BlowfishLE),
    Cast5(cast5::Cast5),
    Des3Ede(des::TdesEde3),
}

fn keyed<C: KeyInit>(c: LegacyCipher, key: &[u8]) -> Result<C, CipherError> {
    C::new_from_slice(key).map_err(|_| {
        CipherError::Unsupported(format!("{} takes no {}-byte key", c.name(), key.len()))
    })
}

macro_rules! each_cipher {
    ($self:expr, $c:ident => $body:expr) => {
        match $self {
            Keyed::Aes128($c) => $body,
            Keyed::Aes192($c) => $body,
            Keyed::Aes256($c) => $body,
            Keyed::Serpent($c) => $body,
            Keyed::Twofish($c) => $body,
            Keyed::Blowfish($c) => $body,
            Keyed::BlowfishLe($c) => $body,
            Keyed::Cast5($c) => $body,
            Keyed::Des3Ede($c) => $body,
        }
    };
}

impl Keyed {
    fn new(c: LegacyCipher, key: &[u8]) -> Result<Self, CipherError> {
        Ok(match c {
            LegacyCipher::Aes => match key.len() {
                16 => Self::Aes128(keyed(c, key)?),
                24 => Self::Aes192(keyed(c, key)?),
                _ => Self::Aes256(keyed(c, key)?),
            },
            LegacyCipher::Serpent => Self::Serpent(keyed(c, key)?),
            LegacyCipher::Twofish => Self::Twofish(keyed(c, key)?),
            LegacyCipher::Blowfish => Self::Blowfish(keyed(c, key)?),
            LegacyCipher::BlowfishLe => Self::BlowfishLe(keyed(c, key)?),
            LegacyCipher::Cast5 => Self::Cast5(keyed(c, key)?),
            LegacyCipher::Des3Ede => Self::Des3Ede(keyed(c, key)?),
        })
    }

    /// `block` is exactly one block of this cipher.
    fn decrypt(&self, block: &mut [u8]) {
        each_cipher!(self, c => c.decrypt_block(GenericArray::from_mut_slice(block)))
    }

    fn encrypt(&self, block: &mut [u8]) {
        each_cipher!(self, c => c.encrypt_block(GenericArray::from_mut_slice(block)))
    }
}

/// One cipher of a cascade with its block size.
struct Slot {
    cipher: Keyed,
    block: usize,
}

struct State {
    /// The ciphers in the order encryption applies them (cryptsetup's order, key order).
    slots: [Option<Slot>; MAX_CASCADE],
    count: usize,
    /// The IV seed then the whitening seed, for the largest block size (zero-padded).
    seed: [u8; SEED_AREA_LEN],
    /// One CBC over the whole cascade (one block size) or one per cipher.
    outer: bool,
}

impl Drop for State {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.seed);
    }
}

/// XORs `pattern` (8 bytes) over every 8 bytes of `buf`.
fn xor_whitening(buf: &mut [u8], pattern: &[u8; 8]) {
    for chunk in buf.chunks_exact_mut(8) {
        for (b, w) in chunk.iter_mut().zip(pattern) {
            *b ^= w;
        }
    }
}

impl State {
    fn slots(&self) -> impl DoubleEndedIterator<Item = &Slot> {
        self.slots[..self.count].iter().flatten()
    }

    /// The IV and whitening of IV sector `sector` for `block`-byte blocks.
    fn sector_iv(&self, block: usize, sector: u64, iv: &mut [u8; 16], wh: &mut [u8; 8]) {
        let s = sector.to_le_bytes();
        for (i, v) in iv[..block].iter_mut().enumerate() {
            *v = self.seed[i] ^ s[i % 8];
        }
        let mut w = [0u8; WHITENING_SEED_LEN];
        for (i, v) in w.iter_mut().enumerate() {
            *v = self.seed[block + i] ^ s[i % 8];
        }
        let crc = |i: usize| crc32fast::hash(&w[4 * i..4 * i + 4]);
        wh[..4].copy_from_slice(&(crc(0) ^ crc(3)).to_le_bytes());
        wh[4..].copy_from_slice(&(crc(1) ^ crc(2)).to_le_bytes());
        zeroize::Zeroize::zeroize(&mut w);
    }

    /// TrueCrypt's buffer decryption: whitening off each block, the ciphers (last first),
    /// then CBC with `iv`.
    fn decrypt_buffer(&self, which: Which, iv: &[u8], wh: &[u8; 8], buf: &mut [u8]) {
        let block = which.block(self);
        let mut prev = [0u8; 16];
        let mut ct = [0u8; 16];
        prev[..block].copy_from_slice(&iv[..block]);
        for b in buf.chunks_exact_mut(block) {
            xor_whitening(b, wh);
            ct[..block].copy_from_slice(b);
            match which {
                Which::All => self.slots().rev().for_each(|s| s.cipher.decrypt(b)),
                Which::One(i) => self
                    .slots()
                    .nth(i)
                    .into_iter()
                    .for_each(|s| s.cipher.decrypt(b)),
            }
            for (x, p) in b.iter_mut().zip(&prev) {
                *x ^= p;
            }
            prev[..block].copy_from_slice(&ct[..block]);
        }
        zeroize::Zeroize::zeroize(&mut prev);
        zeroize::Zeroize::zeroize(&mut ct);
    }

    /// The inverse of [`State::decrypt_buffer`].
    fn encrypt_buffer(&self, which: Which, iv: &[u8], wh: &[u8; 8], buf: &mut [u8]) {
        let block = which.block(self);
        let mut prev = [0u8; 16];
        prev[..block].copy_from_slice(&iv[..block]);
        for b in buf.chunks_exact_mut(block) {
            for (x, p) in b.iter_mut().zip(&prev) {
                *x ^= p;
            }
            match which {
                Which::All => self.slots().for_each(|s| s.cipher.encrypt(b)),
                Which::One(i) => self
                    .slots()
                    .nth(i)
                    .into_iter()
                    .for_each(|s| s.cipher.encrypt(b)),
            }
            prev[..block].copy_from_slice(b);
            xor_whitening(b, wh);
        }
        zeroize::Zeroize::zeroize(&mut prev);
    }

    fn crypt_sector(&self, decrypt: bool, iv_sector: u64, sector: &mut [u8]) {
        let mut iv = [0u8; 16];
        let mut wh = [0u8; 8];
        let mut run = |w: Which| {
            self.sector_iv(w.block(self), iv_sector, &mut iv, &mut wh);
            if decrypt {
                self.decrypt_buffer(w, &iv, &wh, sector);
            } else {
                self.encrypt_buffer(w, &iv, &wh, sector);
            }
        };
        if self.outer {
            run(Which::All);
        } else if decrypt {
            // Decryption undoes the last cipher's pass first.
            (0..self.count).rev().for_each(|i| run(Which::One(i)));
        } else {
            (0..self.count).for_each(|i| run(Which::One(i)));
        }
        zeroize::Zeroize::zeroize(&mut iv);
        zeroize::Zeroize::zeroize(&mut wh);
    }
}

/// Which ciphers one CBC pass runs.
#[derive(Clone, Copy)]
enum Which {
    /// The whole cascade (outer CBC).
    All,
    /// The `n`-th cipher alone (inner CBC).
    One(usize),
}

impl Which {
    fn block(self, st: &State) -> usize {
        match self {
            Which::All => st.slots().next().map_or(16, |s| s.block),
            Which::One(i) => st.slots().nth(i).map_or(16, |s| s.block),
        }
    }
}

/// A TrueCrypt legacy CBC cipher (one cipher or a cascade of up to three) over 512-byte
/// sectors, as a [`SectorCipher`].
pub struct TcryptCbc {
    state: LockedBox<State>,
    iv_offset: u64,
}

impl TcryptCbc {
    /// The cascade `ciphers` (each with its key, in the order encryption applies them, which
    /// is cryptsetup's and the key area's order) over the 32-byte IV/whitening area `seed`
    /// (shorter areas are zero-padded). `iv_offset` is added to every sector number.
    pub fn new(
        ciphers: &[(LegacyCipher, &[u8])],
        seed: &[u8],
        iv_offset: u64,
    ) -> Result<Self, CipherError> {
        if ciphers.is_empty() || ciphers.len() > MAX_CASCADE || seed.len() > SEED_AREA_LEN {
            return Err(CipherError::Unsupported(format!(
                "a TrueCrypt CBC cascade of {} ciphers with a {}-byte IV area",
                ciphers.len(),
                seed.len()
            )));
        }
        let mut state = LockedBox::new(State {
            slots: [None, None, None],
            count: ciphers.len(),
            seed: [0; SEED_AREA_LEN],
            outer: ciphers
                .iter()
                .all(|(c, _)| c.block_size() == ciphers[0].0.block_size()),
        });
        state.seed[..seed.len()].copy_from_slice(seed);
        for (slot, (c, key)) in state.slots.iter_mut().zip(ciphers) {
            *slot = Some(Slot {
                cipher: Keyed::new(*c, key)?,
                block: c.block_size(),
            });
        }
        Ok(TcryptCbc { state, iv_offset })
    }

    /// dm-crypt's `<cipher>-cbc-tcw` with its key: the cipher key, the IV seed (one block)
    /// and 16 whitening bytes.
    pub fn tcw(cipher: LegacyCipher, key: &[u8], iv_offset: u64) -> Result<Self, CipherError> {
        let extra = cipher.block_size() + WHITENING_SEED_LEN;
        if key.len() <= extra {
            return Err(CipherError::KeySize {
                spec: format!("{}-cbc-tcw", cipher.name()),
                got: key.len(),
            });
        }
        let (k, seed) = key.split_at(key.len() - extra);
        Self::new(&[(cipher, k)], seed, iv_offset)
    }

    /// Decrypts a TrueCrypt legacy header's encrypted part: CBC whose IV is the IV area's
    /// first block and whose whitening is the area's bytes 8 to 16, the same for every
    /// block (no sector number). `buf` is a whole number of the largest block size.
    pub fn decrypt_header(&self, buf: &mut [u8]) {
        let st = &*self.state;
        let mut wh = [0u8; 8];
        wh.copy_from_slice(&st.seed[8..16]);
        if st.outer {
            st.decrypt_buffer(Which::All, &st.seed, &wh, buf);
        } else {
            for i in (0..st.count).rev() {
                st.decrypt_buffer(Which::One(i), &st.seed, &wh, buf);
            }
        }
        zeroize::Zeroize::zeroize(&mut wh);
    }

    fn run(&self, decrypt: bool, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        if !buf.len().is_multiple_of(SECTOR) {
            return Err(CipherError::Misaligned {
                len: buf.len(),
                sector_size: SECTOR,
            });
        }
        let first = sector.wrapping_add(self.iv_offset);
        for (i, s) in buf.chunks_exact_mut(SECTOR).enumerate() {
            self.state
                .crypt_sector(decrypt, first.wrapping_add(i as u64), s);
        }
        Ok(())
    }
}

impl SectorCipher for TcryptCbc {
    fn sector_size(&self) -> usize {
        SECTOR
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(false, sector, buf)
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(true, sector, buf)
    }

    fn implementation(&self) -> &str {
        "rustcrypto"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whitening as the kernel computes it: the kernel's `crc32` (seed 0, no final
    /// inversion) differs from the standard CRC32 by a constant, which the XOR of two
    /// CRCs cancels; checked here against a bitwise model of the kernel's.
    #[test]
    fn whitening_matches_the_kernels_crc_convention() {
        fn crc_kernel(data: &[u8]) -> u32 {
            let mut c = 0u32;
            for &b in data {
                c ^= b as u32;
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ 0xEDB8_8320
                    } else {
                        c >> 1
                    };
                }
            }
            c
        }
        let seed: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
        let key = [7u8; 32];
        let c = TcryptCbc::new(&[(LegacyCipher::Aes, &key[..])], &seed, 0).unwrap();
        for sector in [0u64, 1, 0x0102_0304_0506_0708] {
            let (mut iv, mut wh) = ([0u8; 16], [0u8; 8]);
            c.state.sector_iv(16, sector, &mut iv, &mut wh);
            let s = sector.to_le_bytes();
            let mut w: Vec<u8> = (0..16).map(|i| seed[16 + i] ^ s[i % 8]).collect();
            let words: Vec<u32> = (0..4).map(|i| crc_kernel(&w[4 * i..4 * i + 4])).collect();
            for (i, x) in words.iter().enumerate() {
                w[4 * i..4 * i + 4].copy_from_slice(&x.to_le_bytes());
            }
            for i in 0..4 {
                w[i] ^= w[12 + i];
                w[4 + i] ^= w[8 + i];
            }
            assert_eq!(wh[..], w[..8], "sector {sector}");
            let want_iv: Vec<u8> = (0..16).map(|i| seed[i] ^ s[i % 8]).collect();
            assert_eq!(iv[..], want_iv[..]);
        }
    }

    /// Every cascade shape round-trips, and a sector's bytes depend on its number.
    #[test]
    fn cascades_round_trip() {
        let k32 = [0x11u8; 32];
        let k56 = [0x22u8; 56];
        let k16 = [0x33u8; 16];
        let k24: Vec<u8> = (0..24u8).collect();
        let seed = [0x5au8; 32];
        let shapes: Vec<Vec<(LegacyCipher, &[u8])>> = vec![
            vec![(LegacyCipher::Aes, &k32[..])],
            vec![(LegacyCipher::Cast5, &k16[..])],
            vec![(LegacyCipher::Des3Ede, &k24[..])],
            vec![(LegacyCipher::BlowfishLe, &k56[..])],
            vec![
                (LegacyCipher::Twofish, &k32[..]),
                (LegacyCipher::Aes, &k32[..]),
            ],
            vec![
                (LegacyCipher::Serpent, &k32[..]),
                (LegacyCipher::BlowfishLe, &k56[..]),
                (LegacyCipher::Aes, &k32[..]),
            ],
        ];
        let plain: Vec<u8> = (0..2048).map(|i| (i * 7 % 251) as u8).collect();
        for shape in shapes {
            let c = TcryptCbc::new(&shape, &seed, 3).unwrap();
            let mut buf = plain.clone();
            c.encrypt(10, &mut buf).unwrap();
            assert_ne!(buf, plain);
            assert_ne!(buf[..512], buf[512..1024], "sectors differ by number");
            let mut other = plain[512..1024].to_vec();
            c.encrypt(11, &mut other).unwrap();
            assert_eq!(buf[512..1024], other[..], "sector 11 is sector 11");
            c.decrypt(10, &mut buf).unwrap();
            assert_eq!(buf, plain);
        }
        let c = TcryptCbc::new(&[(LegacyCipher::Aes, &k32[..])], &seed, 0).unwrap();
        assert!(c.decrypt(0, &mut [0u8; 100]).is_err());
    }

    /// Blowfish little-endian is the standard cipher with each 32-bit word byte-swapped.
    #[test]
    fn blowfish_le_swaps_words() {
        let key = [0x42u8; 56];
        let be = Keyed::new(LegacyCipher::Blowfish, &key).unwrap();
        let le = Keyed::new(LegacyCipher::BlowfishLe, &key).unwrap();
        let block = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut a = block;
        le.encrypt(&mut a);
        let mut b = [4u8, 3, 2, 1, 8, 7, 6, 5];
        be.encrypt(&mut b);
        let swapped = [b[3], b[2], b[1], b[0], b[7], b[6], b[5], b[4]];
        assert_eq!(a, swapped);
    }
}
