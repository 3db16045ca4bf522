//! The portable implementation: RustCrypto block ciphers under the `xts-mode` and `cbc`
//! crates (ECB and LRW are a few lines over the block cipher itself).

use crate::dmcipher::{Direction, IvRun, ModeEngine};
use crate::iv::IV_LEN;
use crate::lrw::LrwEngine;
use crate::spec::{BlockCipherName, ChainMode, CipherSpec};
use crate::CipherError;
use cipher::block_padding::NoPadding;
use cipher::generic_array::GenericArray;
use cipher::typenum::U16;
use cipher::{
    BlockCipher, BlockDecrypt, BlockDecryptMut, BlockEncrypt, BlockEncryptMut, BlockSizeUser,
    InnerIvInit, KeyInit,
};
use xts_mode::Xts128;

/// Block ciphers usable here: 16-byte blocks, shareable between threads.
pub(crate) trait Block16:
    BlockCipher
    + BlockEncrypt
    + BlockDecrypt
    + BlockSizeUser<BlockSize = U16>
    + KeyInit
    + Send
    + Sync
    + 'static
{
}

impl<C> Block16 for C where
    C: BlockCipher
        + BlockEncrypt
        + BlockDecrypt
        + BlockSizeUser<BlockSize = U16>
        + KeyInit
        + Send
        + Sync
        + 'static
{
}

pub(crate) fn new_cipher<C: KeyInit>(key: &[u8]) -> Result<C, CipherError> {
    C::new_from_slice(key).map_err(|_| CipherError::Backend("block cipher rejected its key".into()))
}

struct XtsEngine<C: Block16>(Xts128<C>);

impl<C: Block16> ModeEngine for XtsEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        buf: &mut [u8],
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        let mut iv = [0u8; IV_LEN];
        for (i, sector) in buf.chunks_exact_mut(unit).enumerate() {
            ivs.fill(i, &mut iv);
            match dir {
                Direction::Encrypt => self.0.encrypt_sector(sector, iv),
                Direction::Decrypt => self.0.decrypt_sector(sector, iv),
            }
        }
        Ok(())
    }
}

struct CbcEngine<C: Block16>(C);

impl<C: Block16> ModeEngine for CbcEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        buf: &mut [u8],
        unit: usize,
        ivs: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        let mut iv = [0u8; IV_LEN];
        let pad_err = || CipherError::Backend("CBC over a partial block".into());
        for (i, sector) in buf.chunks_exact_mut(unit).enumerate() {
            ivs.fill(i, &mut iv);
            let iv = GenericArray::from_slice(&iv);
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
        }
        Ok(())
    }
}

struct EcbEngine<C: Block16>(C);

impl<C: Block16> ModeEngine for EcbEngine<C> {
    fn crypt(
        &self,
        dir: Direction,
        buf: &mut [u8],
        _: usize,
        _: &IvRun<'_>,
    ) -> Result<(), CipherError> {
        for block in buf.chunks_exact_mut(16) {
            let b = GenericArray::from_mut_slice(block);
            match dir {
                Direction::Encrypt => self.0.encrypt_block(b),
                Direction::Decrypt => self.0.decrypt_block(b),
            }
        }
        Ok(())
    }
}

fn build<C: Block16>(chain: ChainMode, key: &[u8]) -> Result<Box<dyn ModeEngine>, CipherError> {
    Ok(match chain {
        ChainMode::Xts => {
            // Kernel xts: first half keys the data cipher, second half the tweak cipher.
            let (k1, k2) = key.split_at(key.len() / 2);
            Box::new(XtsEngine(Xts128::new(
                new_cipher::<C>(k1)?,
                new_cipher::<C>(k2)?,
            )))
        }
        ChainMode::Cbc => Box::new(CbcEngine(new_cipher::<C>(key)?)),
        ChainMode::Ecb => Box::new(EcbEngine(new_cipher::<C>(key)?)),
        ChainMode::Lrw => {
            // Kernel lrw: the last 16 bytes are the tweak multiplier, the rest the cipher key.
            let (k1, k2) = key.split_at(key.len() - 16);
            Box::new(LrwEngine::new(new_cipher::<C>(k1)?, k2))
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
            16 => build::<aes::Aes128>(chain, key),
            24 => build::<aes::Aes192>(chain, key),
            32 => build::<aes::Aes256>(chain, key),
            _ => Err(CipherError::KeySize {
                spec: spec.spec_string(),
                got: key.len(),
            }),
        },
        BlockCipherName::Serpent => build::<serpent::Serpent>(chain, key),
        BlockCipherName::Twofish => build::<twofish::Twofish>(chain, key),
        BlockCipherName::Null => Ok(Box::new(crate::dmcipher::NullEngine)),
    }
}

/// Everything except `cipher_null` (which belongs to the "null" implementation).
pub(crate) fn supports(spec: &CipherSpec) -> bool {
    !spec.is_null()
}
