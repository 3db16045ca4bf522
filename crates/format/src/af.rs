//! The anti-forensic information splitter of the LUKS specification.
//!
//! A key of `n` bytes is stored as `stripes` blocks of `n` bytes each. All but the last block
//! are random; the last is the key XORed with a hash-diffused combination of the others, so
//! losing any single block (e.g. to a partial overwrite) destroys the key. LUKS1 and LUKS2
//! (`"af": {"type": "luks1"}`) use the same construction.
//!
//! Hand-written because it is a small on-disk format detail with no maintained crate.

use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;

/// The stripe count every LUKS1 keyslot (and every cryptsetup-created LUKS2 keyslot) uses.
pub const LUKS_STRIPES: u32 = 4000;

/// Keyslot areas start on multiples of this many bytes in new headers (`LUKS_ALIGN_KEYSLOTS`).
pub const KEYSLOT_ALIGN: u64 = 4096;

/// Size of the split material for a key of `key_len` bytes: `key_len * stripes`.
pub fn split_len(key_len: usize, stripes: u32) -> usize {
    key_len.saturating_mul(stripes as usize)
}

/// Sectors (512 bytes) the split material occupies, rounded up to whole sectors, as
/// cryptsetup's `AF_split_sectors` computes it (LUKS1 keyslot validation and I/O use this;
/// only the layout chosen at format time aligns slots to [`KEYSLOT_ALIGN`]).
pub fn split_sectors(key_len: usize, stripes: u32) -> u64 {
    (key_len as u64 * stripes as u64).div_ceil(512)
}

/// The diffusion step: each hash-sized chunk `j` of `block` (the last one possibly short) is
/// replaced by `H(be32(j) || chunk)` truncated to the chunk's length.
fn diffuse(block: &mut [u8], hash: HashAlgorithm) {
    let digest_len = hash.output_len();
    for (j, chunk) in block.chunks_mut(digest_len).enumerate() {
        let index = (j as u32).to_be_bytes();
        let digest = zeroize::Zeroizing::new(hash.digest(&[&index, chunk]));
        let len = chunk.len();
        chunk.copy_from_slice(&digest[..len]);
    }
}

fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

fn check(key_len: usize, stripes: u32) -> Result<()> {
    if key_len == 0 || stripes == 0 {
        return Err(FormatError::InvalidParameter(format!(
            "anti-forensic split of {key_len} bytes into {stripes} stripes"
        )));
    }
    Ok(())
}

/// Splits `key` into `stripes` blocks using random filler from the OS CSPRNG.
pub fn split(key: &[u8], stripes: u32, hash: HashAlgorithm) -> Result<SecretBytes> {
    split_with(key, stripes, hash, |buf| {
        getrandom::getrandom(buf).map_err(|e| FormatError::Kdf(format!("random source: {e}")))
    })
}

/// Splits `key` into `stripes` blocks, taking the random blocks from `fill` (tests pass a
/// deterministic source). The result is `key.len() * stripes` bytes.
pub fn split_with(
    key: &[u8],
    stripes: u32,
    hash: HashAlgorithm,
    mut fill: impl FnMut(&mut [u8]) -> Result<()>,
) -> Result<SecretBytes> {
    check(key.len(), stripes)?;
    let n = key.len();
    let mut out = SecretBytes::zeroed(split_len(n, stripes));
    let mut acc = SecretBytes::zeroed(n);
    let material = out.as_mut_bytes();
    let (random, last) = material.split_at_mut(n * (stripes as usize - 1));
    fill(random)?;
    for block in random.chunks(n) {
        xor_into(acc.as_mut_bytes(), block);
        diffuse(acc.as_mut_bytes(), hash);
    }
    last.copy_from_slice(acc.as_bytes());
    xor_into(last, key);
    Ok(out)
}

/// Recovers a `key_len`-byte key from `stripes` split blocks. `material` may be longer than
/// `key_len * stripes` (sector padding); the excess is ignored.
pub fn merge(
    material: &[u8],
    key_len: usize,
    stripes: u32,
    hash: HashAlgorithm,
) -> Result<SecretBytes> {
    check(key_len, stripes)?;
    let needed = split_len(key_len, stripes);
    if material.len() < needed {
        return Err(FormatError::InvalidParameter(format!(
            "anti-forensic material is {} bytes, {needed} needed",
            material.len()
        )));
    }
    let material = &material[..needed];
    let (random, last) = material.split_at(key_len * (stripes as usize - 1));
    let mut acc = SecretBytes::zeroed(key_len);
    for block in random.chunks(key_len) {
        xor_into(acc.as_mut_bytes(), block);
        diffuse(acc.as_mut_bytes(), hash);
    }
    xor_into(acc.as_mut_bytes(), last);
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_round_trips_for_every_hash() {
        for hash in [
            HashAlgorithm::Sha1,
            HashAlgorithm::Sha256,
            HashAlgorithm::Sha512,
            HashAlgorithm::Ripemd160,
            HashAlgorithm::Whirlpool,
        ] {
            // 33 bytes: not a multiple of any digest size, so the short last chunk is used.
            let key: Vec<u8> = (0..33u8).collect();
            let split = split(&key, 17, hash).unwrap();
            assert_eq!(split.len(), 33 * 17);
            let merged = merge(split.as_bytes(), 33, 17, hash).unwrap();
            assert_eq!(merged.as_bytes(), &key[..]);
        }
    }

    #[test]
    fn one_stripe_is_the_key_itself() {
        let key = [7u8; 16];
        let s = split(&key, 1, HashAlgorithm::Sha1).unwrap();
        assert_eq!(s.as_bytes(), &key);
    }

    #[test]
    fn damaging_any_stripe_destroys_the_key() {
        let key = [0x5au8; 32];
        let mut s = split(&key, 8, HashAlgorithm::Sha256).unwrap();
        s.as_mut_bytes()[32 * 3 + 5] ^= 1;
        let merged = merge(s.as_bytes(), 32, 8, HashAlgorithm::Sha256).unwrap();
        assert_ne!(merged.as_bytes(), &key);
    }

    /// Two stripes with an all-zero random block: stripe 1 = key XOR diffuse(0), computed
    /// by hand from the definition (SHA-1, 20-byte key = one chunk with index 0).
    #[test]
    fn matches_definition_for_two_stripes() {
        let key = [0x11u8; 20];
        let s = split_with(&key, 2, HashAlgorithm::Sha1, |b| {
            b.fill(0);
            Ok(())
        })
        .unwrap();
        let d = HashAlgorithm::Sha1.digest(&[&[0, 0, 0, 0], &[0u8; 20]]);
        let expected: Vec<u8> = d.iter().map(|x| x ^ 0x11).collect();
        assert_eq!(&s.as_bytes()[20..], &expected[..]);
    }

    #[test]
    fn sectors_are_rounded_to_512() {
        assert_eq!(split_sectors(16, 4000), 125);
        assert_eq!(split_sectors(32, 4000), 250);
        assert_eq!(split_sectors(64, 4000), 500);
        assert_eq!(split_sectors(20, 30), 2);
    }
}
