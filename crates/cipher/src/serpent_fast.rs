//! Serpent from the `serpent` 0.6 crate behind the cipher 0.4 traits.
//!
//! `serpent` 0.5 (the release matching cipher 0.4) applies each S-box one bit at a time and
//! runs at about 4 MiB/s; 0.6 uses bitsliced S-box circuits but implements cipher 0.5's
//! traits, which the `xts-mode`/`cbc` crates of this generation cannot use. This adapter
//! bridges the two; the byte order is the same (checked against NESSIE vectors and
//! cryptsetup's serpent-xts LUKS1 images in the tests).

use cipher::consts::{U1, U16, U32};
use cipher::inout::InOut;
use cipher::{
    Block, BlockBackend, BlockCipher, BlockClosure, BlockDecrypt, BlockEncrypt, BlockSizeUser,
    InvalidLength, Key, KeyInit, KeySizeUser, ParBlocksSizeUser,
};
use serpent_bitsliced::cipher::{
    BlockCipherDecrypt as _, BlockCipherEncrypt as _, KeyInit as KeyInit05,
};

/// Serpent with the kernel's (NESSIE) byte order; keys of 16 to 32 bytes.
pub(crate) struct Serpent(serpent_bitsliced::Serpent);

impl BlockSizeUser for Serpent {
    type BlockSize = U16;
}

impl BlockCipher for Serpent {}

impl KeySizeUser for Serpent {
    type KeySize = U32;
}

impl KeyInit for Serpent {
    fn new(key: &Key<Self>) -> Self {
        Self::new_from_slice(key).expect("a 32-byte Serpent key is valid")
    }

    fn new_from_slice(key: &[u8]) -> Result<Self, InvalidLength> {
        serpent_bitsliced::Serpent::new_from_slice(key)
            .map(Self)
            .map_err(|_| InvalidLength)
    }
}

struct Backend<'a, const ENCRYPT: bool>(&'a serpent_bitsliced::Serpent);

impl<const ENCRYPT: bool> BlockSizeUser for Backend<'_, ENCRYPT> {
    type BlockSize = U16;
}

impl<const ENCRYPT: bool> ParBlocksSizeUser for Backend<'_, ENCRYPT> {
    type ParBlocksSize = U1;
}

impl<const ENCRYPT: bool> BlockBackend for Backend<'_, ENCRYPT> {
    #[inline]
    fn proc_block(&mut self, mut block: InOut<'_, '_, Block<Self>>) {
        let mut b = serpent_bitsliced::cipher::Block::<serpent_bitsliced::Serpent>::default();
        b.copy_from_slice(block.get_in());
        if ENCRYPT {
            self.0.encrypt_block(&mut b);
        } else {
            self.0.decrypt_block(&mut b);
        }
        block.get_out().copy_from_slice(&b);
    }
}

impl BlockEncrypt for Serpent {
    fn encrypt_with_backend(&self, f: impl BlockClosure<BlockSize = U16>) {
        f.call(&mut Backend::<true>(&self.0))
    }
}

impl BlockDecrypt for Serpent {
    fn decrypt_with_backend(&self, f: impl BlockClosure<BlockSize = U16>) {
        f.call(&mut Backend::<false>(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipher::generic_array::GenericArray;

    /// Same output as the 0.5 crate for all key sizes, both directions.
    #[test]
    fn matches_serpent_0_5() {
        for len in [16usize, 20, 24, 32] {
            let key: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(53) ^ 0xc3).collect();
            let fast = Serpent::new_from_slice(&key).unwrap();
            let slow = serpent::Serpent::new_from_slice(&key).unwrap();
            let mut a = GenericArray::clone_from_slice(&[len as u8; 16]);
            let mut b = a;
            fast.encrypt_block(&mut a);
            slow.encrypt_block(&mut b);
            assert_eq!(a, b, "key length {len}");
            fast.decrypt_block(&mut a);
            assert_eq!(a, GenericArray::clone_from_slice(&[len as u8; 16]));
        }
    }
}
