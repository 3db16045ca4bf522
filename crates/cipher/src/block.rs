//! The block-cipher bound shared by the portable chaining modes.
//!
//! Its own module so that the modes built over it (`rustcrypto`'s XTS, CBC, ECB and `lrw`'s
//! LRW) all import it from below instead of from each other.

use cipher::typenum::U16;
use cipher::{BlockCipher, BlockDecrypt, BlockEncrypt, BlockSizeUser, KeyInit};

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
