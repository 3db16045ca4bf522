//! A request's encryption or decryption as a [`CopyTransform`], so a backing that holds its
//! data in memory (the RAM disk) moves and transforms it in one pass: reading the ciphertext
//! straight out of the backing into the caller's buffer while decrypting, instead of
//! copying it there and then decrypting in place.

use std::io;

use cryptblk_cipher::SectorCipher;

use super::cipher_io;
use crate::device::CopyTransform;
use crate::SECTOR_SIZE;

/// Which way a [`SectorTransform`] goes.
#[derive(Clone, Copy)]
pub(crate) enum Way {
    Encrypt,
    Decrypt,
}

/// Encryption or decryption of a request starting at 512-byte sector `sector`.
pub(crate) struct SectorTransform<'a> {
    pub(crate) cipher: &'a dyn SectorCipher,
    pub(crate) sector: u64,
    pub(crate) way: Way,
}

impl SectorTransform<'_> {
    fn sector_at(&self, pos: usize) -> u64 {
        self.sector + pos as u64 / SECTOR_SIZE
    }
}

impl CopyTransform for SectorTransform<'_> {
    fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()> {
        let s = self.sector_at(pos);
        match self.way {
            Way::Encrypt => self.cipher.encrypt(s, buf),
            Way::Decrypt => self.cipher.decrypt(s, buf),
        }
        .map_err(cipher_io)
    }

    fn copy(&self, pos: usize, src: &[u8], dst: &mut [u8]) -> io::Result<()> {
        let s = self.sector_at(pos);
        match self.way {
            Way::Encrypt => self.cipher.encrypt_to(s, src, dst),
            Way::Decrypt => self.cipher.decrypt_to(s, src, dst),
        }
        .map_err(cipher_io)
    }
}
