//! Per-sector IV derivation with dm-crypt's semantics.
//!
//! Facts from the kernel's dm-crypt documentation: `plain` is the 32-bit little-endian sector
//! number, `plain64` the 64-bit one, `plain64be` the 64-bit big-endian number in the IV's
//! last 8 bytes, `essiv:hash` the plain64 IV encrypted with the block cipher keyed by
//! hash(volume key), `benbi` the big-endian count of cipher blocks (starting at 1) in the
//! last 8 bytes, `null` all zeros, `eboiv` the sector's byte offset (IV sector times the
//! encryption sector size) as a little-endian block encrypted with the data key (BitLocker's
//! CBC IV; `elephant` uses it too, see [`crate::elephant`]). "Sector" is the IV sector the caller computed (512-byte
//! units, or encryption-sector units with `iv_large_sectors`).

use crate::hash::HashAlgorithm;
use crate::spec::{BlockCipherName, IvMode};
use crate::CipherError;
use cipher::generic_array::GenericArray;
use cipher::{BlockEncrypt, KeyInit};

/// Length of every IV cryptblk generates (all supported block ciphers have 16-byte blocks).
pub(crate) const IV_LEN: usize = 16;

/// The cipher ESSIV encrypts sector numbers with: the data cipher keyed by the digest.
pub(crate) enum EssivCipher {
    Aes128(aes::Aes128),
    Aes192(aes::Aes192),
    Aes256(aes::Aes256),
    Serpent(Box<crate::serpent_fast::Serpent>),
    Twofish(Box<crate::twofish_fast::Twofish>),
    Aria128(Box<aria::Aria128>),
    Aria192(Box<aria::Aria192>),
    Aria256(Box<aria::Aria256>),
}

impl EssivCipher {
    /// AES keyed with `key` (16, 24 or 32 bytes), for `eboiv` and the elephant tweak key.
    pub(crate) fn aes(key: &[u8]) -> Result<Self, CipherError> {
        let bad = || CipherError::Unsupported(format!("AES takes no {}-byte key", key.len()));
        Ok(match key.len() {
            16 => Self::Aes128(aes::Aes128::new_from_slice(key).map_err(|_| bad())?),
            24 => Self::Aes192(aes::Aes192::new_from_slice(key).map_err(|_| bad())?),
            32 => Self::Aes256(aes::Aes256::new_from_slice(key).map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }

    pub(crate) fn encrypt(&self, block: &mut [u8; IV_LEN]) {
        let b = GenericArray::from_mut_slice(block);
        match self {
            Self::Aes128(c) => c.encrypt_block(b),
            Self::Aes192(c) => c.encrypt_block(b),
            Self::Aes256(c) => c.encrypt_block(b),
            Self::Serpent(c) => c.encrypt_block(b),
            Self::Twofish(c) => c.encrypt_block(b),
            Self::Aria128(c) => c.encrypt_block(b),
            Self::Aria192(c) => c.encrypt_block(b),
            Self::Aria256(c) => c.encrypt_block(b),
        }
    }
}

/// Derives IVs for one cipher instance.
pub(crate) enum IvGenerator {
    /// ECB: no IV is used.
    None,
    Null,
    Plain,
    Plain64,
    Plain64Be,
    Essiv(Box<EssivCipher>),
    /// Shift that turns 512-byte sectors into cipher blocks: 9 - log2(block size).
    Benbi(u32),
    /// The byte offset (IV sector times this sector size) encrypted with the data key.
    Eboiv(Box<EssivCipher>, u64),
}

impl IvGenerator {
    /// Builds the generator for `mode` over `cipher`, given the whole volume key.
    pub(crate) fn new(
        mode: IvMode,
        cipher: BlockCipherName,
        volume_key: &[u8],
        sector_size: usize,
    ) -> Result<Self, CipherError> {
        Ok(match mode {
            IvMode::None => Self::None,
            IvMode::Null => Self::Null,
            IvMode::Plain => Self::Plain,
            IvMode::Plain64 => Self::Plain64,
            IvMode::Plain64Be => Self::Plain64Be,
            // lmk's IV depends on the sector's plaintext: the engine runs with a zero IV and
            // the IV is folded into the first block around it (`crate::lmk`).
            IvMode::Lmk => Self::Null,
            IvMode::Benbi => {
                let bs = cipher.block_size();
                Self::Benbi(9 - bs.trailing_zeros())
            }
            // Boxed so the enum stays small; ESSIV key schedules are large.
            IvMode::Essiv(hash) => Self::Essiv(Box::new(essiv_cipher(hash, cipher, volume_key)?)),
            IvMode::Eboiv | IvMode::Elephant => {
                if cipher != BlockCipherName::Aes {
                    return Err(CipherError::Unsupported(format!(
                        "{} IVs need AES, not {}",
                        mode.spec_name(),
                        cipher.name()
                    )));
                }
                // elephant's key is the data key and a tweak key of the same size; the IV
                // uses the data key only.
                let data_key = match mode {
                    IvMode::Elephant => &volume_key[..volume_key.len() / 2],
                    _ => volume_key,
                };
                Self::Eboiv(Box::new(EssivCipher::aes(data_key)?), sector_size as u64)
            }
            // tcw keeps its IVs in its own engine (crate::tcrypt_cbc), which the registry
            // opens instead of an IV generator and a mode engine.
            IvMode::Tcw => {
                return Err(CipherError::Unsupported(
                    "tcw IVs are made by the TrueCrypt CBC engine".into(),
                ))
            }
        })
    }

    /// Writes the IV for `iv_sector` into `iv`.
    #[inline]
    pub(crate) fn fill(&self, iv_sector: u64, iv: &mut [u8; IV_LEN]) {
        *iv = [0; IV_LEN];
        match self {
            Self::None | Self::Null => {}
            Self::Plain => iv[..4].copy_from_slice(&(iv_sector as u32).to_le_bytes()),
            Self::Plain64 => iv[..8].copy_from_slice(&iv_sector.to_le_bytes()),
            Self::Plain64Be => iv[8..].copy_from_slice(&iv_sector.to_be_bytes()),
            Self::Essiv(c) => {
                iv[..8].copy_from_slice(&iv_sector.to_le_bytes());
                c.encrypt(iv);
            }
            Self::Benbi(shift) => {
                let count = (iv_sector << shift).wrapping_add(1);
                iv[8..].copy_from_slice(&count.to_be_bytes());
            }
            Self::Eboiv(c, sector_size) => {
                iv[..8].copy_from_slice(&iv_sector.wrapping_mul(*sector_size).to_le_bytes());
                c.encrypt(iv);
            }
        }
    }
}

fn essiv_cipher(
    hash: HashAlgorithm,
    cipher: BlockCipherName,
    volume_key: &[u8],
) -> Result<EssivCipher, CipherError> {
    // The salt is a key: keep it in locked, zeroized memory while the schedule is built.
    let salt = crate::SecretBytes::from_vec(hash.digest(&[volume_key]));
    let salt = salt.as_bytes();
    let bad = || {
        CipherError::Unsupported(format!(
            "essiv:{} gives a {}-byte key, which {} does not accept",
            hash.name(),
            salt.len(),
            cipher.name()
        ))
    };
    Ok(match cipher {
        BlockCipherName::Aes => match salt.len() {
            16 => EssivCipher::Aes128(aes::Aes128::new_from_slice(salt).map_err(|_| bad())?),
            24 => EssivCipher::Aes192(aes::Aes192::new_from_slice(salt).map_err(|_| bad())?),
            32 => EssivCipher::Aes256(aes::Aes256::new_from_slice(salt).map_err(|_| bad())?),
            _ => return Err(bad()),
        },
        BlockCipherName::Serpent => EssivCipher::Serpent(Box::new(
            crate::serpent_fast::Serpent::new_from_slice(salt).map_err(|_| bad())?,
        )),
        BlockCipherName::Twofish => EssivCipher::Twofish(Box::new(
            crate::twofish_fast::Twofish::new_from_slice(salt).map_err(|_| bad())?,
        )),
        // aria-cbc-essiv:sha256 (cryptsetup 2.7+): ARIA keyed by the digest, as for AES.
        BlockCipherName::Aria => match salt.len() {
            16 => EssivCipher::Aria128(Box::new(
                aria::Aria128::new_from_slice(salt).map_err(|_| bad())?,
            )),
            24 => EssivCipher::Aria192(Box::new(
                aria::Aria192::new_from_slice(salt).map_err(|_| bad())?,
            )),
            32 => EssivCipher::Aria256(Box::new(
                aria::Aria256::new_from_slice(salt).map_err(|_| bad())?,
            )),
            _ => return Err(bad()),
        },
        // No cryptsetup format pairs ESSIV with the VeraCrypt-only ciphers.
        BlockCipherName::Camellia
        | BlockCipherName::Kuznyechik
        | BlockCipherName::Blowfish
        | BlockCipherName::Cast5
        | BlockCipherName::Des3Ede
        | BlockCipherName::Null => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(g: &IvGenerator, s: u64) -> [u8; 16] {
        let mut v = [0xaa; 16];
        g.fill(s, &mut v);
        v
    }

    #[test]
    fn counters_have_kernel_layout() {
        let s = 0x0102_0304_0506_0708u64;
        let plain = iv(&IvGenerator::Plain, s);
        assert_eq!(plain[..4], [8, 7, 6, 5]);
        assert!(plain[4..].iter().all(|&b| b == 0));
        let p64 = iv(&IvGenerator::Plain64, s);
        assert_eq!(p64[..8], [8, 7, 6, 5, 4, 3, 2, 1]);
        let be = iv(&IvGenerator::Plain64Be, s);
        assert_eq!(be[8..], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(be[..8].iter().all(|&b| b == 0));
        assert_eq!(iv(&IvGenerator::Null, s), [0; 16]);
        // 16-byte blocks: 32 per 512-byte sector; sector 1 starts at block 32, counted from 1.
        let benbi = IvGenerator::new(IvMode::Benbi, BlockCipherName::Aes, &[], 512).unwrap();
        assert_eq!(iv(&benbi, 1)[8..], 33u64.to_be_bytes());
    }

    #[test]
    fn essiv_rejects_digest_sizes_the_cipher_cannot_take() {
        let e = IvGenerator::new(
            IvMode::Essiv(HashAlgorithm::Sha1),
            BlockCipherName::Aes,
            &[0; 32],
            512,
        );
        assert!(matches!(e, Err(CipherError::Unsupported(_))));
    }
}
