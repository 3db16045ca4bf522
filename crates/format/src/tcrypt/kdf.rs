//! Header key derivation: the PRFs, their TrueCrypt and VeraCrypt iteration counts, PIM, and
//! the key-file pool that mixes key files into the password.

use super::TcryptParams;
use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;

/// Bytes of derived key: enough for the longest chain (three ciphers, two 32-byte keys each).
pub const DERIVED_KEY_LEN: usize = 192;
/// The key-file pool of TrueCrypt (and VeraCrypt for passwords of up to 64 bytes).
pub const KEYFILE_POOL_LEN: usize = 64;
/// VeraCrypt's key-file pool for longer passwords.
pub const KEYFILE_POOL_LEN_LONG: usize = 128;
/// Only the first MiB of a key file counts.
pub const KEYFILE_MAX_READ: usize = 1 << 20;

/// A header key derivation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prf {
    /// PBKDF2-HMAC with a hash.
    Pbkdf2(HashAlgorithm),
    /// VeraCrypt's Argon2id, with memory and passes from the PIM.
    Argon2id,
}

impl Prf {
    /// The name `tcryptDump` prints and `--hash` selects.
    pub fn name(self) -> &'static str {
        match self {
            Prf::Pbkdf2(h) => h.name(),
            Prf::Argon2id => "argon2id",
        }
    }

    /// Derives [`DERIVED_KEY_LEN`] bytes; `cost` is the PBKDF2 iteration count or, for
    /// Argon2id, the PIM (0 for VeraCrypt's default).
    pub fn derive(self, password: &[u8], salt: &[u8], cost: u32) -> Result<SecretBytes> {
        let mut out = SecretBytes::zeroed(DERIVED_KEY_LEN);
        match self {
            Prf::Pbkdf2(h) => h.pbkdf2(password, salt, cost, out.as_mut_bytes()),
            Prf::Argon2id => {
                let (m_kib, t) = argon2_cost(cost);
                let params = argon2::Params::new(m_kib, t, 1, Some(DERIVED_KEY_LEN))
                    .map_err(|e| FormatError::Kdf(e.to_string()))?;
                argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
                    .hash_password_into(password, salt, out.as_mut_bytes())
                    .map_err(|e| FormatError::Kdf(e.to_string()))?;
            }
        }
        Ok(out)
    }
}

/// VeraCrypt's Argon2id cost for a PIM: memory 64 MiB plus 32 MiB per PIM step above 1
/// (at most 1 GiB), passes 3 plus one per three PIM steps up to PIM 31, then one per step.
/// PIM 0 means VeraCrypt's default, PIM 12.
fn argon2_cost(pim: u32) -> (u32, u32) {
    let pim = if pim == 0 { 12 } else { pim };
    let mib = (64 + (pim - 1).min(30) * 32).min(1024);
    let t = if pim <= 31 {
        3 + (pim - 1) / 3
    } else {
        13 + (pim - 31)
    };
    (mib * 1024, t)
}

/// (hash, TrueCrypt count, TrueCrypt system count, VeraCrypt count, VeraCrypt system count);
/// 0: the program never used this hash there.
const PBKDF2_COUNTS: &[(HashAlgorithm, u32, u32, u32, u32)] = &[
    (HashAlgorithm::Ripemd160, 2000, 1000, 655331, 327661),
    (HashAlgorithm::Sha512, 1000, 1000, 500000, 500000),
    (HashAlgorithm::Whirlpool, 1000, 1000, 500000, 500000),
    (HashAlgorithm::Sha1, 2000, 0, 0, 0),
    (HashAlgorithm::Sha256, 0, 0, 500000, 200000),
    (HashAlgorithm::Blake2s256, 0, 0, 500000, 200000),
    (HashAlgorithm::Stribog512, 0, 0, 500000, 200000),
];

/// The (PRF, cost) pairs to try, restricted by `--hash`, `--disable-veracrypt`, PIM and
/// system encryption; none for a hash no TCRYPT variant uses.
pub(super) fn candidates(params: &TcryptParams) -> Result<Vec<(Prf, u32)>> {
    let wanted = match params.hash.as_deref() {
        None => None,
        Some(h) if h.eq_ignore_ascii_case("argon2id") => Some(Prf::Argon2id),
        Some(h) => match HashAlgorithm::from_name(h) {
            Ok(a) if PBKDF2_COUNTS.iter().any(|c| c.0 == a) => Some(Prf::Pbkdf2(a)),
            // As cryptsetup: a hash no TCRYPT variant uses finds no header (exit 2).
            _ => return Ok(Vec::new()),
        },
    };
    let mut v = Vec::new();
    for &(h, tc, tc_sys, vc, vc_sys) in PBKDF2_COUNTS {
        if wanted.is_some_and(|w| w != Prf::Pbkdf2(h)) {
            continue;
        }
        let tc = if params.system { tc_sys } else { tc };
        if tc != 0 {
            v.push((Prf::Pbkdf2(h), tc));
        }
        if !params.veracrypt {
            continue;
        }
        let vc = if params.system { vc_sys } else { vc };
        if vc == 0 {
            continue;
        }
        let count = match params.pim {
            0 => vc,
            pim if params.system
                && !matches!(h, HashAlgorithm::Sha512 | HashAlgorithm::Whirlpool) =>
            {
                pim.saturating_mul(2048)
            }
            pim => pim.saturating_mul(1000).saturating_add(15000),
        };
        v.push((Prf::Pbkdf2(h), count));
    }
    // Argon2id is costly (hundreds of MiB): tried only when asked for, and never for system
    // encryption, which VeraCrypt keeps on PBKDF2.
    if wanted == Some(Prf::Argon2id) && params.veracrypt && !params.system {
        v.push((Prf::Argon2id, params.pim));
    }
    Ok(v)
}

/// TrueCrypt's CRC32 register update (reflected 0xEDB88320), without the final inversion:
/// the pool takes the running register, not finished checksums.
fn crc32_step(crc: u32, byte: u8) -> u32 {
    let mut c = (crc ^ byte as u32) & 0xff;
    for _ in 0..8 {
        c = if c & 1 != 0 {
            (c >> 1) ^ 0xEDB8_8320
        } else {
            c >> 1
        };
    }
    (crc >> 8) ^ c
}

/// Mixes key files into a pool of `pool_len` bytes: for each file, a CRC32 register runs
/// over its first MiB and, after every byte, its four bytes (most significant first) are
/// added to the pool at a cursor that wraps around. The cursor restarts for each file.
pub fn pool_keyfiles(keyfiles: &[SecretBytes], pool_len: usize) -> SecretBytes {
    let mut pool = SecretBytes::zeroed(pool_len);
    let p = pool.as_mut_bytes();
    for kf in keyfiles {
        let mut crc = 0xffff_ffffu32;
        let mut at = 0;
        for &b in kf.as_bytes().iter().take(KEYFILE_MAX_READ) {
            crc = crc32_step(crc, b);
            for x in crc.to_be_bytes() {
                p[at] = p[at].wrapping_add(x);
                at = (at + 1) % pool_len;
            }
        }
    }
    pool
}

/// The password the KDF sees: the passphrase, or with key files the pool with the
/// passphrase added byte by byte.
pub(super) fn password(params: &TcryptParams) -> Result<SecretBytes> {
    let pass = params.passphrase.as_bytes();
    if params.keyfiles.is_empty() {
        return Ok(params.passphrase.clone());
    }
    let pool_len = if params.veracrypt && pass.len() > KEYFILE_POOL_LEN {
        KEYFILE_POOL_LEN_LONG
    } else {
        KEYFILE_POOL_LEN
    };
    if pass.len() > pool_len {
        return Err(FormatError::InvalidParameter(format!(
            "maximum TCRYPT passphrase length ({pool_len}) exceeded"
        )));
    }
    let mut pool = pool_keyfiles(&params.keyfiles, pool_len);
    for (p, b) in pool.as_mut_bytes().iter_mut().zip(pass) {
        *p = p.wrapping_add(*b);
    }
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_step_is_crc32_before_its_final_inversion() {
        let crc = b"123456789"
            .iter()
            .fold(0xffff_ffff, |c, &b| crc32_step(c, b));
        assert_eq!(!crc, 0xCBF4_3926, "the CRC-32 check value");
    }

    #[test]
    fn pool_adds_the_register_bytes_and_wraps() {
        let one = pool_keyfiles(&[SecretBytes::from_slice(b"a")], 64);
        let crc = crc32_step(0xffff_ffff, b'a').to_be_bytes();
        assert_eq!(&one.as_bytes()[..4], &crc);
        assert!(one.as_bytes()[4..].iter().all(|&b| b == 0));
        // 17 bytes write 68 pool bytes: the last four land on the first four again.
        let long = pool_keyfiles(&[SecretBytes::from_slice(&[7u8; 17])], 64);
        let mut c = 0xffff_ffff;
        let regs: Vec<[u8; 4]> = (0..17)
            .map(|_| {
                c = crc32_step(c, 7);
                c.to_be_bytes()
            })
            .collect();
        let want0 = regs[0][0].wrapping_add(regs[16][0]);
        assert_eq!(long.as_bytes()[0], want0);
    }

    #[test]
    fn pim_and_system_counts() {
        let mut p = TcryptParams::new(SecretBytes::from_slice(b"x"));
        p.hash = Some("sha256".into());
        assert_eq!(
            candidates(&p).unwrap(),
            vec![(Prf::Pbkdf2(HashAlgorithm::Sha256), 500000)]
        );
        p.pim = 1234;
        assert_eq!(candidates(&p).unwrap()[0].1, 15000 + 1234 * 1000);
        p.system = true;
        assert_eq!(candidates(&p).unwrap()[0].1, 1234 * 2048);
        p.veracrypt = false;
        assert!(
            candidates(&p).unwrap().is_empty(),
            "sha256 is VeraCrypt's only"
        );
        p.hash = Some("nosuchhash".into());
        assert!(candidates(&p).unwrap().is_empty());
        assert_eq!(argon2_cost(12), (416 * 1024, 6));
        assert_eq!(argon2_cost(31), (1024 * 1024, 13));
        assert_eq!(argon2_cost(33), (1024 * 1024, 15));
    }
}
