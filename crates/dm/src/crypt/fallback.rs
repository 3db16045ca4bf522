//! Private stand-in for `cryptblk_cipher::open_cipher`, which is being written concurrently:
//! just `aes-xts-plain64` (plus `capi:xts(aes)-plain64`) and the null cipher, enough to run
//! the crypt pipelines. [`super::open_sector_cipher`] prefers the cipher crate's factory once
//! it exists.

use aes::cipher::KeyInit;
use aes::{Aes128, Aes256};
use cryptblk_cipher::{CipherError, SectorCipher};
use xts_mode::Xts128;

enum Xts {
    Aes128(Xts128<Aes128>),
    Aes256(Xts128<Aes256>),
}

/// AES-XTS with the plain64 IV: the tweak is the little-endian sector number.
struct AesXtsPlain64 {
    xts: Xts,
    sector_size: usize,
    iv_offset: u64,
    iv_large_sectors: bool,
}

/// No encryption (`cipher_null-ecb`, `capi:ecb(cipher_null)`).
struct NullCipher {
    sector_size: usize,
}

fn check(len: usize, sector_size: usize) -> Result<(), CipherError> {
    if len % sector_size != 0 {
        return Err(CipherError::Misaligned { len, sector_size });
    }
    Ok(())
}

impl AesXtsPlain64 {
    fn run(&self, sector: u64, buf: &mut [u8], encrypt: bool) -> Result<(), CipherError> {
        check(buf.len(), self.sector_size)?;
        let step = (self.sector_size / 512) as u64;
        for (i, chunk) in buf.chunks_exact_mut(self.sector_size).enumerate() {
            let s512 = sector + i as u64 * step + self.iv_offset;
            let iv_sector = if self.iv_large_sectors {
                s512 / step
            } else {
                s512
            };
            let mut tweak = [0u8; 16];
            tweak[..8].copy_from_slice(&iv_sector.to_le_bytes());
            match (&self.xts, encrypt) {
                (Xts::Aes128(x), true) => x.encrypt_sector(chunk, tweak),
                (Xts::Aes128(x), false) => x.decrypt_sector(chunk, tweak),
                (Xts::Aes256(x), true) => x.encrypt_sector(chunk, tweak),
                (Xts::Aes256(x), false) => x.decrypt_sector(chunk, tweak),
            }
        }
        Ok(())
    }
}

impl SectorCipher for AesXtsPlain64 {
    fn sector_size(&self) -> usize {
        self.sector_size
    }
    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(sector, buf, true)
    }
    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        self.run(sector, buf, false)
    }
    fn implementation(&self) -> &str {
        "dm-fallback-rustcrypto"
    }
}

impl SectorCipher for NullCipher {
    fn sector_size(&self) -> usize {
        self.sector_size
    }
    fn encrypt(&self, _sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        check(buf.len(), self.sector_size)
    }
    fn decrypt(&self, _sector: u64, buf: &mut [u8]) -> Result<(), CipherError> {
        check(buf.len(), self.sector_size)
    }
    fn implementation(&self) -> &str {
        "dm-fallback-null"
    }
}

/// Opens one of the few specs this stand-in knows.
pub(crate) fn open(
    spec: &str,
    key: &[u8],
    sector_size: usize,
    iv_offset: u64,
    iv_large_sectors: bool,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    if !sector_size.is_power_of_two() || !(512..=4096).contains(&sector_size) {
        return Err(CipherError::SectorSize(sector_size));
    }
    let key_err = || CipherError::KeySize {
        spec: spec.to_string(),
        got: key.len(),
    };
    match spec {
        "cipher_null-ecb" | "capi:ecb(cipher_null)" | "capi:ecb(cipher_null)-" | "cipher_null" => {
            Ok(Box::new(NullCipher { sector_size }))
        }
        "aes-xts-plain64" | "capi:xts(aes)-plain64" => {
            let half = key.len() / 2;
            let xts = match key.len() {
                32 => Xts::Aes128(Xts128::new(
                    Aes128::new_from_slice(&key[..half]).map_err(|_| key_err())?,
                    Aes128::new_from_slice(&key[half..]).map_err(|_| key_err())?,
                )),
                64 => Xts::Aes256(Xts128::new(
                    Aes256::new_from_slice(&key[..half]).map_err(|_| key_err())?,
                    Aes256::new_from_slice(&key[half..]).map_err(|_| key_err())?,
                )),
                _ => return Err(key_err()),
            };
            Ok(Box::new(AesXtsPlain64 {
                xts,
                sector_size,
                iv_offset,
                iv_large_sectors,
            }))
        }
        other => Err(CipherError::UnknownSpec(other.to_string())),
    }
}
