//! dm-crypt's `lmk` IV mode: loop-AES multi-key compatibility (loop-AES v2 with 64 keys,
//! v3 with 64 keys and a 65th as the IV seed).
//!
//! Facts (dm-crypt documentation and behaviour, loop-AES): sectors are 512 bytes, the chain
//! is CBC, and a sector's IV is the MD5 *state* (no MD5 padding or length block) after
//! compressing, in this order, the 64-byte seed block (v3 only: the first 16 bytes of the
//! seed key, then zeros), the sector's plaintext from byte 16 to 512 (CBC blocks 1-31), and a
//! 16-byte block of four little-endian 32-bit words: the IV sector's low 32 bits, its next
//! 24 bits with bit 31 set, 4024, and 0. That is 8 or 9 whole MD5 blocks. The IV is the four
//! state words, little-endian.
//!
//! Because the IV depends on plaintext blocks 1-31, which CBC decryption recovers without the
//! IV, dm-crypt decrypts with a zero IV and then XORs the IV into the first block; encrypting
//! with IV `v` equals XORing `v` into the first plaintext block and encrypting with a zero IV.
//! Both directions are therefore one XOR around a zero-IV CBC engine.

use crate::SecretBytes;

/// MD5's initial state (RFC 1321, section 3.3).
const MD5_INIT: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
/// The sector size lmk works on.
pub(crate) const LMK_SECTOR: usize = 512;
/// Bytes of the seed key that go into the seed block (the MD5 digest size).
const SEED_LEN: usize = 16;

/// The `lmk` layer of one cipher: its optional seed.
pub(crate) struct Lmk {
    /// The 64-byte seed block (v3), key material.
    seed: Option<SecretBytes>,
}

impl Lmk {
    /// The layer with `seed_key` (loop-AES v3: the 65th key; only its first 16 bytes count)
    /// or without a seed (v2).
    pub(crate) fn new(seed_key: Option<&[u8]>) -> Self {
        let seed = seed_key.map(|k| {
            let mut block = SecretBytes::zeroed(64);
            let n = k.len().min(SEED_LEN);
            block.as_mut_bytes()[..n].copy_from_slice(&k[..n]);
            block
        });
        Self { seed }
    }

    /// The IV of the 512-byte plaintext `sector` at IV sector `iv_sector`.
    pub(crate) fn iv(&self, iv_sector: u64, sector: &[u8]) -> [u8; 16] {
        debug_assert_eq!(sector.len(), LMK_SECTOR);
        // Up to 9 blocks: seed, 496 data bytes and the 16-byte sector block. The buffer holds
        // plaintext and the seed, so it is wiped before it is dropped.
        let mut blocks = [[0u8; 64]; 9];
        let mut n = 0;
        if let Some(seed) = &self.seed {
            blocks[0].copy_from_slice(seed.as_bytes());
            n = 1;
        }
        {
            let flat = blocks[n..n + 8].as_flattened_mut();
            flat[..496].copy_from_slice(&sector[16..LMK_SECTOR]);
            let tail = &mut flat[496..];
            tail[..4].copy_from_slice(&(iv_sector as u32).to_le_bytes());
            let high = ((iv_sector >> 32) as u32 & 0x00ff_ffff) | 0x8000_0000;
            tail[4..8].copy_from_slice(&high.to_le_bytes());
            tail[8..12].copy_from_slice(&4024u32.to_le_bytes());
            tail[12..16].copy_from_slice(&0u32.to_le_bytes());
        }
        let mut state = MD5_INIT;
        md5::block_api::compress(&mut state, &blocks[..n + 8]);
        zeroize::Zeroize::zeroize(blocks.as_flattened_mut());
        let mut iv = [0u8; 16];
        for (out, word) in iv.chunks_exact_mut(4).zip(state) {
            out.copy_from_slice(&word.to_le_bytes());
        }
        iv
    }

    /// Folds the IV into the first block of a 512-byte sector: before encryption of
    /// plaintext, or after zero-IV decryption (the operation is its own inverse, since
    /// blocks 1-31 do not change).
    pub(crate) fn tweak(&self, iv_sector: u64, sector: &mut [u8]) {
        let iv = self.iv(iv_sector, sector);
        for (b, v) in sector[..16].iter_mut().zip(iv) {
            *b ^= v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The raw compression function is MD5's: padding a message by hand and compressing it
    /// gives the digest of RFC 1321's test vector.
    #[test]
    fn compress_is_md5() {
        // RFC 1321 A.5: MD5("abc") = 900150983cd24fb0d6963f7d28e17f72.
        let mut block = [0u8; 64];
        block[..3].copy_from_slice(b"abc");
        block[3] = 0x80;
        block[56..].copy_from_slice(&(3u64 * 8).to_le_bytes());
        let mut state = MD5_INIT;
        md5::block_api::compress(&mut state, &[block]);
        let digest: Vec<u8> = state.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(
            digest,
            [
                0x90, 0x01, 0x50, 0x98, 0x3c, 0xd2, 0x4f, 0xb0, 0xd6, 0x96, 0x3f, 0x7d, 0x28, 0xe1,
                0x7f, 0x72
            ]
        );
    }

    #[test]
    fn iv_depends_on_blocks_1_to_31_sector_and_seed_only() {
        let mut sector = [0u8; 512];
        for (i, b) in sector.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let v2 = Lmk::new(None);
        let base = v2.iv(5, &sector);
        // Block 0 is not hashed: the tweak is its own inverse.
        let mut other = sector;
        other[..16].fill(0xee);
        assert_eq!(v2.iv(5, &other), base);
        other[300] ^= 1;
        assert_ne!(v2.iv(5, &other), base);
        assert_ne!(v2.iv(6, &sector), base);
        // Bits above 56 of the sector are cropped.
        assert_eq!(v2.iv(5 | (0xff << 56), &sector), base);
        assert_ne!(v2.iv(5 | (1 << 40), &sector), base);
        // Only the first 16 bytes of the seed key count.
        let v3 = Lmk::new(Some(&[9u8; 32]));
        let mut seed16 = [9u8; 32];
        seed16[16..].fill(1);
        assert_eq!(Lmk::new(Some(&seed16)).iv(5, &sector), v3.iv(5, &sector));
        assert_ne!(v3.iv(5, &sector), base);
        let mut t = sector;
        v3.tweak(5, &mut t);
        assert_ne!(t, sector);
        v3.tweak(5, &mut t);
        assert_eq!(t, sector);
    }
}
