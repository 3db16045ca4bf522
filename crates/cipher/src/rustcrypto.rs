//! The portable implementation: RustCrypto block ciphers under the `xts-mode` and `cbc`
//! crates (ECB and LRW are a few lines over the block cipher itself).

use crate::block::Block16;
use crate::dmcipher::{Direction, IvRun, ModeEngine, Sectors};
use crate::iv::IV_LEN;
use crate::locked::LockedBox;
use crate::lrw::LrwEngine;
use crate::spec::{BlockCipherName, ChainMode, CipherSpec};
use crate::CipherError;
use cipher::block_padding::NoPadding;
use cipher::generic_array::GenericArray;
use cipher::typenum::U16;
use cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit, KeyInit};
use xts_mode::Xts128;

pub(crate) fn new_cipher<C: KeyInit>(key: &[u8]) -> Result<C, CipherError> {
    C::new_from_slice(key).map_err(|_| CipherError::Backend("block cipher rejected its key".into()))
}

struct XtsEngine<C: Block16>(Xts128<C>);

impl<C: Block16> ModeEngine for XtsEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        sectors.each_in_place(unit, ivs, |iv, sector| {
            match dir {
                Direction::Encrypt => self.0.encrypt_sector(sector, *iv),
                Direction::Decrypt => self.0.decrypt_sector(sector, *iv),
            }
            Ok(())
        })
    }
}

/// XTS that encrypts many blocks per cipher call, so AES-NI can pipeline them (the `xts-mode`
/// crate goes one block at a time, about 20x slower with AES-NI). Sector sizes are
/// multiples of 512, so no ciphertext stealing is ever needed.
struct ParallelXtsEngine<C: Block16> {
    data: C,
    tweak: C,
}

/// Multiplication by x in GF(2^128), IEEE 1619 little-endian convention.
#[inline]
fn xts_mul_x(t: u128) -> u128 {
    (t << 1) ^ if t >> 127 == 1 { 0x87 } else { 0 }
}

impl<C: Block16> ParallelXtsEngine<C> {
    fn crypt_sector(&self, dir: Direction, sector: &mut [u8], iv: &[u8; IV_LEN]) {
        let mut t = GenericArray::clone_from_slice(iv);
        self.tweak.encrypt_block(&mut t);
        let mut t = u128::from_le_bytes(t.into());
        // 32 blocks per cipher call: enough to fill AES-NI's pipeline, small on the stack.
        for chunk in sector.chunks_mut(512) {
            let mut tweaks = [0u128; 32];
            for (block, slot) in chunk.chunks_exact_mut(16).zip(tweaks.iter_mut()) {
                *slot = t;
                xor_block(block, t);
                t = xts_mul_x(t);
            }
            let (blocks, _) = cipher::inout::InOutBuf::from(&mut *chunk).into_chunks::<U16>();
            match dir {
                Direction::Encrypt => self.data.encrypt_blocks_inout(blocks),
                Direction::Decrypt => self.data.decrypt_blocks_inout(blocks),
            }
            for (block, slot) in chunk.chunks_exact_mut(16).zip(tweaks.iter()) {
                xor_block(block, *slot);
            }
        }
    }
}

#[inline]
fn xor_block(block: &mut [u8], t: u128) {
    let v = u128::from_le_bytes(block[..16].try_into().expect("16-byte block")) ^ t;
    block.copy_from_slice(&v.to_le_bytes());
}

impl<C: Block16> ModeEngine for ParallelXtsEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        sectors.each_in_place(unit, ivs, |iv, sector| {
            self.crypt_sector(dir, sector, iv);
            Ok(())
        })
    }
}

struct CbcEngine<C: Block16>(C);

impl<C: Block16> ModeEngine for CbcEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        let pad_err = || CipherError::Backend("CBC over a partial block".into());
        sectors.each_in_place(unit, ivs, |iv, sector| {
            let iv = GenericArray::from_slice(&iv[..]);
            // Borrowing the cipher keeps the key schedule shared: no re-keying per sector.
            let len = sector.len();
            match dir {
                Direction::Encrypt => {
                    cbc::Encryptor::<&C>::inner_iv_init(&self.0, iv)
                        .encrypt_padded_mut::<NoPadding>(sector, len)
                        .map_err(|_| pad_err())?;
                }
                Direction::Decrypt => {
                    cbc::Decryptor::<&C>::inner_iv_init(&self.0, iv)
                        .decrypt_padded_mut::<NoPadding>(sector)
                        .map_err(|_| pad_err())?;
                }
            }
            Ok(())
        })
    }
}

struct EcbEngine<C: Block16>(C);

impl<C: Block16> ModeEngine for EcbEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        sectors.each_in_place(unit, ivs, |_, sector| {
            for block in sector.chunks_exact_mut(16) {
                let b = GenericArray::from_mut_slice(block);
                match dir {
                    Direction::Encrypt => self.0.encrypt_block(b),
                    Direction::Decrypt => self.0.decrypt_block(b),
                }
            }
            Ok(())
        })
    }
}

/// An engine whose key schedules live in locked memory, wiped when it is dropped.
fn locked<E: ModeEngine + 'static>(engine: E) -> Box<dyn ModeEngine> {
    Box::new(LockedBox::new(engine))
}

impl<E: ModeEngine> ModeEngine for LockedBox<E> {
    fn crypt(
        &self,
        dir: Direction,
        sectors: Sectors<'_>,
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        (**self).crypt(dir, sectors, unit, ivs)
    }
}

fn build<C: Block16>(chain: ChainMode, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    build_with_xts::<C>(chain, key, false)
}

/// `parallel_xts`: use [`ParallelXtsEngine`] (worth it for ciphers with a multi-block
/// backend, i.e. AES) instead of the `xts-mode` crate.
fn build_with_xts<C: Block16>(
    chain: ChainMode,
    key: &[u8],
    parallel_xts: bool,
) -> Result<Box<dyn ModeEngine>, CipherError> {
    Ok(match chain {
        ChainMode::Xts if parallel_xts => {
            let (k1, k2) = key.split_at(key.len() / 2);
            locked(ParallelXtsEngine {
                data: new_cipher::<C>(k1)?,
                tweak: new_cipher::<C>(k2)?,
            })
        }
        ChainMode::Xts => {
            // Kernel xts: first half keys the data cipher, second half the tweak cipher.
            let (k1, k2) = key.split_at(key.len() / 2);
            locked(XtsEngine(Xts128::new(
                new_cipher::<C>(k1)?,
                new_cipher::<C>(k2)?,
            )))
        }
        ChainMode::Cbc => locked(CbcEngine(new_cipher::<C>(key)?)),
        ChainMode::Ecb => locked(EcbEngine(new_cipher::<C>(key)?)),
        // The wide-block modes have engines of their own (crate::hctr2, crate::adiantum_mode).
        ChainMode::Hctr2 | ChainMode::AdiantumXChaCha12 | ChainMode::AdiantumXChaCha20 => {
            return Err(CipherError::NoImplementation(format!(
                "rustcrypto for {} mode",
                chain.name()
            )))
        }
        ChainMode::Lrw => {
            // Kernel lrw: the last 16 bytes are the tweak multiplier, the rest the cipher key.
            let (k1, k2) = key.split_at(key.len() - 16);
            locked(LrwEngine::new(new_cipher::<C>(k1)?, k2))
        }
    })
}

/// Builds the RustCrypto engine for `spec`; the key length has already been validated.
pub(crate) fn engine(spec: &CipherSpec, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    let chain = spec.chain_mode();
    let cipher_key_len = match chain {
        ChainMode::Xts => key.len() / 2,
        ChainMode::Lrw => key.len().saturating_sub(16),
        _ => key.len(),
    };
    match spec.cipher() {
        BlockCipherName::Aes => match cipher_key_len {
            16 => build_with_xts::<aes::Aes128>(chain, key, true),
            24 => build_with_xts::<aes::Aes192>(chain, key, true),
            32 => build_with_xts::<aes::Aes256>(chain, key, true),
            _ => Err(CipherError::KeySize {
                spec: spec.spec_string(),
                got: key.len(),
            }),
        },
        BlockCipherName::Serpent => build::<crate::serpent_fast::Serpent>(chain, key),
        BlockCipherName::Twofish => build::<crate::twofish_fast::Twofish>(chain, key),
        BlockCipherName::Camellia => match cipher_key_len {
            16 => build::<camellia::Camellia128>(chain, key),
            24 => build::<camellia::Camellia192>(chain, key),
            32 => build::<camellia::Camellia256>(chain, key),
            _ => Err(CipherError::KeySize {
                spec: spec.spec_string(),
                got: key.len(),
            }),
        },
        BlockCipherName::Kuznyechik => build::<kuznyechik::Kuznyechik>(chain, key),
        BlockCipherName::Aria => match cipher_key_len {
            16 => build::<aria::Aria128>(chain, key),
            24 => build::<aria::Aria192>(chain, key),
            32 => build::<aria::Aria256>(chain, key),
            _ => Err(CipherError::KeySize {
                spec: spec.spec_string(),
                got: key.len(),
            }),
        },
        BlockCipherName::Null => Ok(Box::new(crate::dmcipher::NullEngine)),
        // 64-bit-block ciphers run only in TrueCrypt's CBC engine (crate::tcrypt_cbc).
        BlockCipherName::Blowfish | BlockCipherName::Cast5 | BlockCipherName::Des3Ede => Err(
            CipherError::Unsupported(format!("{} outside cbc-tcw", spec.cipher_name())),
        ),
    }
}

/// Everything except `cipher_null` (which belongs to the "null" implementation) and the
/// wide-block modes (the "hctr2" and "adiantum" implementations).
pub(crate) fn supports(spec: &CipherSpec) -> bool {
    !spec.is_null() && !spec.chain_mode().is_wide_block()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iv::IvGenerator;

    fn run(engine: &dyn ModeEngine, dir: Direction, buf: &mut [u8], unit: usize, first: u64) {
        let gen = IvGenerator::Plain64;
        engine
            .crypt(
                dir,
                Sectors::in_place(buf),
                unit,
                &IvRun::for_test(&gen, first),
            )
            .unwrap();
    }

    /// The parallel XTS engine equals the `xts-mode` crate for all AES key sizes (AES-192-XTS
    /// has no pyca/OpenSSL implementation to compare with).
    #[test]
    fn parallel_xts_equals_xts_mode_crate() {
        let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(29) ^ 0x5a).collect();
        for (key_len, unit) in [(32, 512), (48, 512), (48, 4096), (64, 1024)] {
            let k = &key[..key_len];
            let (fast, slow): (Box<dyn ModeEngine>, Box<dyn ModeEngine>) = match key_len {
                32 => (
                    build_with_xts::<aes::Aes128>(ChainMode::Xts, k, true).unwrap(),
                    build_with_xts::<aes::Aes128>(ChainMode::Xts, k, false).unwrap(),
                ),
                48 => (
                    build_with_xts::<aes::Aes192>(ChainMode::Xts, k, true).unwrap(),
                    build_with_xts::<aes::Aes192>(ChainMode::Xts, k, false).unwrap(),
                ),
                _ => (
                    build_with_xts::<aes::Aes256>(ChainMode::Xts, k, true).unwrap(),
                    build_with_xts::<aes::Aes256>(ChainMode::Xts, k, false).unwrap(),
                ),
            };
            let plain: Vec<u8> = (0..unit * 3).map(|i| (i * 13 + key_len) as u8).collect();
            let (mut a, mut b) = (plain.clone(), plain.clone());
            run(fast.as_ref(), Direction::Encrypt, &mut a, unit, 77);
            run(slow.as_ref(), Direction::Encrypt, &mut b, unit, 77);
            assert!(a == b, "key {key_len}, unit {unit}");
            assert!(a != plain);
            run(fast.as_ref(), Direction::Decrypt, &mut a, unit, 77);
            assert!(a == plain);
        }
    }
}
