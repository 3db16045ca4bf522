//! Internal hashes of dm-integrity (`internal_hash:<alg>[:<hex key>]`): the tag of a block
//! is `H([salt ||] sector_le64 || block)` truncated or zero-padded to the tag size, where
//! `sector` is the block's first logical 512-byte sector and the salt (from the superblock)
//! is mixed in only with `fix_hmac`.
//!
//! Names are the kernel crypto API's (`crc32c`, `crc32`, `xxhash64`, `blake2b-256`,
//! `sha256`, `hmac(sha256)`); [`kernel_name`] turns integritysetup's spelling
//! (`hmac-sha256`) into them. Each algorithm's output bytes are what the kernel's shash
//! produces, which is not always the textbook form: the kernel's `crc32` starts from 0 and
//! is not inverted at the end, `crc32c` is, and both are stored little endian; `xxhash64`
//! (seed 0) is stored little endian. Kernel-made images in tests/integrity_fixtures pin
//! every one of them.
//!
//! A tag is computed for every block read or written, so this is the integrity target's
//! hot path: no allocation per tag, CRC-32C and CRC-32 with the CPU's CRC/carry-less
//! multiply instructions (crc32c, crc32fast), the SHA family through the sha1/sha2 crates
//! (SHA-NI where the CPU has it), HMAC from inner and outer states keyed once
//! ([`KeyedHmac`]) without copying the block.

use blake2::digest::consts::U32;
use cryptblk_cipher::hash::{HashAlgorithm, KeyedHmac};
use cryptblk_cipher::SecretBytes;
use sha2::Digest;
use std::hash::Hasher;

/// Longest digest of any supported hash (SHA-512, Whirlpool).
const MAX_DIGEST: usize = 64;

/// A supported internal hash.
pub enum InternalHash {
    /// CRC-32C (Castagnoli), the integritysetup default: 4-byte little-endian tag.
    Crc32c,
    /// The kernel's `crc32`: CRC-32 (IEEE, reflected) seeded with 0 and not inverted at the
    /// end, 4-byte little-endian tag.
    Crc32,
    /// The kernel's `xxhash64` with seed 0: 8-byte little-endian tag.
    XxHash64,
    /// BLAKE2b with a 32-byte output (`blake2b-256`).
    Blake2b256,
    /// BLAKE2s with a 32-byte output (`blake2s-256`; recent kernels no longer offer it).
    Blake2s256,
    /// A plain digest (`sha1`, `sha256`, ...).
    Digest(HashAlgorithm),
    /// `hmac(<digest>)` with a key, its inner and outer states computed once (no key
    /// setup per tag).
    Hmac(KeyedHmac),
}

/// The names [`InternalHash::new`] accepts, for error messages and `--help`.
pub const SUPPORTED: &str = "crc32c, crc32, xxhash64, blake2b-256, blake2s-256, sha1, sha256, \
     sha512, ..., hmac(sha1), hmac(sha256), hmac(sha512), ...";

/// The kernel crypto API name for an integritysetup/cryptsetup `--integrity` name:
/// `hmac-sha256` becomes `hmac(sha256)`; other names are the same in both.
pub fn kernel_name(integrity: &str) -> String {
    match integrity.strip_prefix("hmac-") {
        Some(h) => format!("hmac({h})"),
        None => integrity.to_string(),
    }
}

impl InternalHash {
    /// Parses the kernel crypto API name (`crc32c`, `sha256`, `hmac(sha256)`) and key.
    pub fn new(name: &str, key: Option<SecretBytes>) -> Result<Self, String> {
        if let Some(inner) = name.strip_prefix("hmac(").and_then(|s| s.strip_suffix(')')) {
            let alg = HashAlgorithm::from_name(inner).map_err(|_| {
                format!("unsupported internal hash '{name}' (supported: {SUPPORTED})")
            })?;
            let key = key.ok_or_else(|| format!("internal hash '{name}' needs a key"))?;
            if key.is_empty() {
                return Err(format!("internal hash '{name}' needs a non-empty key"));
            }
            return Ok(InternalHash::Hmac(KeyedHmac::new(alg, key.as_bytes())));
        }
        let hash = match name {
            "crc32c" => InternalHash::Crc32c,
            "crc32" => InternalHash::Crc32,
            "xxhash64" => InternalHash::XxHash64,
            "blake2b-256" => InternalHash::Blake2b256,
            "blake2s-256" => InternalHash::Blake2s256,
            _ => match HashAlgorithm::from_name(name) {
                Ok(alg) => InternalHash::Digest(alg),
                Err(_) => {
                    return Err(format!(
                        "unsupported internal hash '{name}' (supported: {SUPPORTED})"
                    ))
                }
            },
        };
        if key.is_some() {
            return Err(format!("internal hash '{name}' takes no key"));
        }
        Ok(hash)
    }

    /// The kernel crypto API name.
    pub fn name(&self) -> String {
        match self {
            InternalHash::Crc32c => "crc32c".into(),
            InternalHash::Crc32 => "crc32".into(),
            InternalHash::XxHash64 => "xxhash64".into(),
            InternalHash::Blake2b256 => "blake2b-256".into(),
            InternalHash::Blake2s256 => "blake2s-256".into(),
            InternalHash::Digest(a) => a.name().into(),
            InternalHash::Hmac(m) => format!("hmac({})", m.algorithm().name()),
        }
    }

    /// Digest length in bytes (the default tag size).
    pub fn digest_size(&self) -> usize {
        match self {
            InternalHash::Crc32c | InternalHash::Crc32 => 4,
            InternalHash::XxHash64 => 8,
            InternalHash::Blake2b256 | InternalHash::Blake2s256 => 32,
            InternalHash::Digest(a) => a.output_len(),
            InternalHash::Hmac(m) => m.algorithm().output_len(),
        }
    }

    /// Writes the tag of `block` at logical `sector` into `out` (its length is the tag
    /// size).
    pub fn tag(&self, salt: Option<&[u8; 16]>, sector: u64, block: &[u8], out: &mut [u8]) {
        let sector_le = sector.to_le_bytes();
        let salt: &[u8] = salt.map(|s| &s[..]).unwrap_or(&[]);
        let parts: [&[u8]; 3] = [salt, &sector_le, block];
        let mut digest = [0u8; MAX_DIGEST];
        let len = match self {
            InternalHash::Crc32c => {
                let c = parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p));
                digest[..4].copy_from_slice(&c.to_le_bytes());
                4
            }
            InternalHash::Crc32 => {
                // crc32fast keeps the textbook pre/post inversion internally; seeding it with
                // !0 and inverting its result gives the kernel's raw crc32_le(0, ...).
                let mut h = crc32fast::Hasher::new_with_initial(!0);
                parts.iter().for_each(|p| h.update(p));
                digest[..4].copy_from_slice(&(!h.finalize()).to_le_bytes());
                4
            }
            InternalHash::XxHash64 => {
                let mut h = twox_hash::XxHash64::with_seed(0);
                parts.iter().for_each(|p| h.write(p));
                digest[..8].copy_from_slice(&h.finish().to_le_bytes());
                8
            }
            InternalHash::Blake2b256 => digest_into::<blake2::Blake2b<U32>>(&parts, &mut digest),
            InternalHash::Blake2s256 => digest_into::<blake2::Blake2s256>(&parts, &mut digest),
            InternalHash::Digest(a) => match a {
                HashAlgorithm::Sha1 => digest_into::<sha1::Sha1>(&parts, &mut digest),
                HashAlgorithm::Sha224 => digest_into::<sha2::Sha224>(&parts, &mut digest),
                HashAlgorithm::Sha256 => digest_into::<sha2::Sha256>(&parts, &mut digest),
                HashAlgorithm::Sha384 => digest_into::<sha2::Sha384>(&parts, &mut digest),
                HashAlgorithm::Sha512 => digest_into::<sha2::Sha512>(&parts, &mut digest),
                other => copy_into(&other.digest(&parts), &mut digest),
            },
            InternalHash::Hmac(m) => m.mac_into(&parts, &mut digest),
        };
        let n = out.len().min(len);
        out[..n].copy_from_slice(&digest[..n]);
        out[n..].fill(0);
    }
}

impl InternalHash {
    /// The tags of consecutive blocks: `data` holds whole blocks of `block_size` bytes, the
    /// first at logical `sector`; the tag of block `k` goes to
    /// `out[k * tag_size..(k + 1) * tag_size]` (`out.len()` = blocks x tag size). Same result
    /// as [`InternalHash::tag`] per block; CRC-32C runs three or four blocks at once on x86-64
    /// (the CRC instruction's latency is three times its issue rate, so independent blocks
    /// interleave for free), which matters once a write path hashes whole requests.
    pub fn tags(
        &self,
        salt: Option<&[u8; 16]>,
        sector: u64,
        block_size: usize,
        data: &[u8],
        out: &mut [u8],
    ) {
        let n = data.len() / block_size.max(1);
        if n == 0 {
            return;
        }
        let ts = out.len() / n;
        let spb = (block_size / 512) as u64;
        let mut k = 0;
        #[cfg(target_arch = "x86_64")]
        if matches!(self, InternalHash::Crc32c)
            && block_size.is_multiple_of(8)
            && std::arch::is_x86_feature_detected!("sse4.2")
        {
            let seed = !crc32c::crc32c(salt.map(|s| &s[..]).unwrap_or(&[]));
            // Groups of three or four blocks, so that few lanes idle: the CRC instruction
            // issues once per cycle with a latency of three, so three or more independent
            // lanes keep it busy, and eight blocks (a 4 KiB request of 512-byte blocks) go
            // as 4 + 4 rather than 3 + 3 + 2 padded to 3. One or two blocks left still run
            // through three lanes (the last block repeated): a lane costs the same as three.
            let mut put = |k: usize, c: &[u32]| {
                for (j, crc) in c.iter().enumerate().take(n - k) {
                    put_tag(
                        &(!crc).to_le_bytes(),
                        &mut out[(k + j) * ts..(k + j + 1) * ts],
                    );
                }
            };
            while k < n {
                let left = n - k;
                if left >= 4 && !left.is_multiple_of(3) && left != 5 {
                    // SAFETY: SSE4.2 was detected at run time just above.
                    let c =
                        unsafe { self.crc_group::<4>(seed, sector, spb, block_size, data, k, n) };
                    put(k, &c);
                    k += 4;
                } else {
                    // SAFETY: as above.
                    let c =
                        unsafe { self.crc_group::<3>(seed, sector, spb, block_size, data, k, n) };
                    put(k, &c);
                    k += left.min(3);
                }
            }
        }
        while k < n {
            self.tag(
                salt,
                sector + k as u64 * spb,
                &data[k * block_size..(k + 1) * block_size],
                &mut out[k * ts..(k + 1) * ts],
            );
            k += 1;
        }
    }
}

impl InternalHash {
    /// Raw CRC-32C of blocks `k..k + L` of `data` (fewer when fewer are left: the last one
    /// fills the spare lanes, whose results the caller ignores), each `sector || block`
    /// continuing from `seed`.
    ///
    /// # Safety
    /// The CPU must have SSE4.2.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "sse4.2")]
    unsafe fn crc_group<const L: usize>(
        &self,
        seed: u32,
        sector: u64,
        spb: u64,
        block_size: usize,
        data: &[u8],
        k: usize,
        n: usize,
    ) -> [u32; L] {
        let j = |d: usize| (k + d).min(n - 1);
        let blocks: [&[u8]; L] =
            std::array::from_fn(|d| &data[j(d) * block_size..(j(d) + 1) * block_size]);
        let sectors: [[u8; 8]; L] =
            std::array::from_fn(|d| (sector + j(d) as u64 * spb).to_le_bytes());
        crc32c_lanes(seed, sectors, blocks)
    }
}

/// Copies a digest into a tag slot, truncating or zero-padding.
fn put_tag(digest: &[u8], out: &mut [u8]) {
    let n = out.len().min(digest.len());
    out[..n].copy_from_slice(&digest[..n]);
    out[n..].fill(0);
}

/// Raw (uninverted) CRC-32C of `sector || block` for `L` blocks at once, each continuing
/// from `seed`. Blocks are equally long multiples of 8 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_lanes<const L: usize>(
    seed: u32,
    sectors: [[u8; 8]; L],
    blocks: [&[u8]; L],
) -> [u32; L] {
    use std::arch::x86_64::_mm_crc32_u64;
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let mut c = [seed as u64; L];
    for j in 0..L {
        c[j] = _mm_crc32_u64(c[j], u64::from_le_bytes(sectors[j]));
    }
    let len = blocks[0].len();
    let mut i = 0;
    while i < len {
        for j in 0..L {
            c[j] = _mm_crc32_u64(c[j], word(blocks[j], i));
        }
        i += 8;
    }
    c.map(|x| x as u32)
}

/// Hashes the concatenation of `parts` with `D` into `out`; returns the digest length.
fn digest_into<D: Digest>(parts: &[&[u8]], out: &mut [u8; MAX_DIGEST]) -> usize {
    let mut d = D::new();
    parts.iter().for_each(|p| d.update(p));
    copy_into(&d.finalize(), out)
}

fn copy_into(d: &[u8], out: &mut [u8; MAX_DIGEST]) -> usize {
    out[..d.len()].copy_from_slice(d);
    d.len()
}

/// CRC-32C lookup table (reflected polynomial 0x82F63B78), for [`crc32c_update`].
const CRC32C_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Continues a CRC-32C over `data` (pre- and post-inversion are the caller's): a byte-wise
/// table version, kept as the independent reference the tests hold the fast path to.
pub fn crc32c_update(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC32C_TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(h: &InternalHash, salt: Option<&[u8; 16]>, sector: u64, block: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; h.digest_size()];
        h.tag(salt, sector, block, &mut out);
        out
    }

    #[test]
    fn crc32c_check_value() {
        // The CRC catalogue's check value for CRC-32/ISCSI.
        assert_eq!(!crc32c_update(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn crc32c_tag_matches_the_table_reference() {
        let salt = [7u8; 16];
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        for (s, sector) in [(None, 0u64), (Some(&salt), 12345)] {
            let mut c = crc32c_update(!0, s.map(|x| &x[..]).unwrap_or(&[]));
            c = crc32c_update(c, &sector.to_le_bytes());
            c = crc32c_update(c, &block);
            assert_eq!(
                tag(&InternalHash::Crc32c, s, sector, &block),
                (!c).to_le_bytes()
            );
        }
    }

    #[test]
    fn crc32_is_the_kernels_raw_form() {
        // Bit-at-a-time CRC-32 (reflected 0xEDB88320) from 0 without final inversion: the
        // kernel's crc32_le(0, ...), which its "crc32" shash returns.
        fn raw(data: &[u8]) -> u32 {
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
        let block = [0xa5u8; 512];
        let mut msg = 9u64.to_le_bytes().to_vec();
        msg.extend_from_slice(&block);
        assert_eq!(
            tag(&InternalHash::Crc32, None, 9, &block),
            raw(&msg).to_le_bytes()
        );
        // And the textbook CRC-32 is its complement, started from all ones.
        assert_eq!(!crc32fast::hash(b"123456789"), !0xCBF4_3926u32);
    }

    #[test]
    fn xxhash64_known_answer() {
        // XXH64 of the empty input with seed 0 (the reference implementation's test value),
        // so the 8-byte sector number alone must differ from it.
        let h = twox_hash::XxHash64::oneshot(0, b"");
        assert_eq!(h, 0xEF46_DB37_51D8_E999);
        let t = tag(&InternalHash::XxHash64, None, 0, b"");
        assert_eq!(t, twox_hash::XxHash64::oneshot(0, &[0u8; 8]).to_le_bytes());
    }

    #[test]
    fn blake2_known_answers() {
        // RFC 7693 appendix A gives BLAKE2b-512("abc") and BLAKE2s-256("abc"); the 256-bit
        // BLAKE2b is its own parameter block, so check it is not the 512 prefix.
        let abc_s = "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982";
        let mut d = [0u8; MAX_DIGEST];
        let n = digest_into::<blake2::Blake2s256>(&[b"ab", b"c"], &mut d);
        assert_eq!(hex::encode(&d[..n]), abc_s);
        let n = digest_into::<blake2::Blake2b<U32>>(&[b"abc"], &mut d);
        assert_eq!(
            hex::encode(&d[..n]),
            "bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319"
        );
    }

    #[test]
    fn digests_and_hmacs_agree_with_the_cipher_crate() {
        let key = SecretBytes::from_vec(vec![3u8; 77]);
        let salt = [1u8; 16];
        let block = [0x5au8; 1024];
        let mut msg = salt.to_vec();
        msg.extend_from_slice(&77u64.to_le_bytes());
        msg.extend_from_slice(&block);
        for alg in [
            HashAlgorithm::Sha1,
            HashAlgorithm::Sha256,
            HashAlgorithm::Sha512,
            HashAlgorithm::Ripemd160,
        ] {
            let d = InternalHash::new(alg.name(), None).unwrap();
            assert_eq!(tag(&d, Some(&salt), 77, &block), alg.digest(&[&msg]));
            let name = format!("hmac({})", alg.name());
            let h = InternalHash::new(&name, Some(key.clone())).unwrap();
            assert_eq!(h.name(), name);
            assert_eq!(
                tag(&h, Some(&salt), 77, &block),
                alg.hmac(key.as_bytes(), &msg)
            );
        }
    }

    #[test]
    fn batch_tags_equal_single_tags() {
        let key = SecretBytes::from_vec(vec![9u8; 32]);
        let data: Vec<u8> = (0..9 * 4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let salt = [0x33u8; 16];
        for (name, key) in [
            ("crc32c", None),
            ("crc32", None),
            ("sha256", None),
            ("hmac(sha256)", Some(key)),
        ] {
            let h = InternalHash::new(name, key).unwrap();
            for bs in [512usize, 4096] {
                for ts in [2usize, 4, 8] {
                    for salt in [None, Some(&salt)] {
                        for blocks in 1usize..=9 {
                            let d = &data[..blocks * bs];
                            let mut batch = vec![0xeeu8; blocks * ts];
                            h.tags(salt, 40, bs, d, &mut batch);
                            for k in 0..blocks {
                                let mut one = vec![0u8; ts];
                                h.tag(
                                    salt,
                                    40 + (k * bs / 512) as u64,
                                    &d[k * bs..(k + 1) * bs],
                                    &mut one,
                                );
                                assert_eq!(
                                    batch[k * ts..(k + 1) * ts],
                                    one[..],
                                    "{name} bs {bs} ts {ts} k {k}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tags_are_truncated_or_padded() {
        let h = InternalHash::new("sha256", None).unwrap();
        let full = tag(&h, None, 1, &[0u8; 512]);
        let mut short = [0xffu8; 16];
        h.tag(None, 1, &[0u8; 512], &mut short);
        assert_eq!(short[..], full[..16]);
        let mut long = [0xffu8; 8];
        InternalHash::Crc32c.tag(None, 1, &[0u8; 512], &mut long);
        assert_eq!(long[4..], [0, 0, 0, 0]);
    }

    #[test]
    fn names_and_keys() {
        assert_eq!(kernel_name("hmac-sha256"), "hmac(sha256)");
        assert_eq!(kernel_name("xxhash64"), "xxhash64");
        for n in [
            "crc32c",
            "crc32",
            "xxhash64",
            "blake2b-256",
            "blake2s-256",
            "sha1",
        ] {
            assert_eq!(InternalHash::new(n, None).unwrap().name(), n);
        }
        let e = InternalHash::new("md4", None).err().unwrap();
        assert!(e.contains("md4") && e.contains("crc32c"), "{e}");
        let key = SecretBytes::from_vec(vec![1; 32]);
        assert!(InternalHash::new("crc32", Some(key.clone()))
            .err()
            .unwrap()
            .contains("takes no key"));
        assert!(InternalHash::new("hmac(sha256)", None)
            .err()
            .unwrap()
            .contains("needs a key"));
        assert_eq!(
            InternalHash::new("hmac(sha256)", Some(key))
                .unwrap()
                .digest_size(),
            32
        );
    }
}
