//! Cipher chains (cascades) and their modes, and how the header's key area feeds them.
//!
//! A chain keeps cryptsetup's name and its ciphers outermost first: a read decrypts with the
//! first cipher, then the second, and so on (cryptsetup stacks one dm-crypt device per
//! cipher). Keys are laid out in the opposite order, innermost first, as the programs that
//! wrote them encrypt with the innermost cipher first.

use super::header::{TcryptHeader, HEADER_LEN, SALT_LEN};
use super::TcryptLayer;
use crate::error::{FormatError, Result};
use cryptblk_cipher::{open_cipher, SecretBytes, SectorOptions};

/// Size of each cipher's key (all TCRYPT ciphers use 256-bit keys).
const CIPHER_KEY_LEN: usize = 32;
/// LRW's tweak multiplier (one cipher block).
const LRW_TWEAK_LEN: usize = 16;

/// The block-chaining mode of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainMode {
    /// XTS with the sector number as tweak (TrueCrypt 5.0 and later, VeraCrypt).
    Xts,
    /// LRW with big-endian block numbers counted from 1 (TrueCrypt 4.1 to 4.3).
    Lrw,
}

impl ChainMode {
    /// The dm-crypt mode and IV of each layer.
    pub fn spec(self) -> &'static str {
        match self {
            ChainMode::Xts => "xts-plain64",
            ChainMode::Lrw => "lrw-benbi",
        }
    }
}

/// A cipher chain in one mode.
#[derive(Debug)]
pub struct CipherChain {
    /// cryptsetup's name (`aes-twofish-serpent`).
    pub name: &'static str,
    /// The ciphers, outermost first.
    pub ciphers: &'static [&'static str],
    /// The mode every layer uses.
    pub mode: ChainMode,
}

macro_rules! chains {
    ($($mode:ident $name:literal: $($c:literal),+;)*) => {
        &[$(CipherChain {
            name: $name,
            ciphers: &[$($c),+],
            mode: ChainMode::$mode,
        }),*]
    };
}

/// Every chain and mode cryptsetup maps, in the order they are tried. The chains VeraCrypt
/// added with Camellia and Kuznyechik carry cryptsetup's names, which list their ciphers
/// innermost first (the reverse of VeraCrypt's names).
pub static TCRYPT_CHAINS: &[CipherChain] = chains! {
    Xts "aes": "aes";
    Xts "serpent": "serpent";
    Xts "twofish": "twofish";
    Xts "twofish-aes": "twofish", "aes";
    Xts "serpent-twofish-aes": "serpent", "twofish", "aes";
    Xts "serpent-aes": "serpent", "aes";
    Xts "aes-twofish": "aes", "twofish";
    Xts "aes-twofish-serpent": "aes", "twofish", "serpent";
    Xts "twofish-serpent": "twofish", "serpent";
    Xts "camellia": "camellia";
    Xts "kuznyechik": "kuznyechik";
    Xts "kuznyechik-camellia": "camellia", "kuznyechik";
    Xts "twofish-kuznyechik": "kuznyechik", "twofish";
    Xts "serpent-camellia": "camellia", "serpent";
    Xts "aes-kuznyechik": "kuznyechik", "aes";
    Xts "camellia-serpent-kuznyechik": "kuznyechik", "serpent", "camellia";
    Lrw "aes": "aes";
    Lrw "serpent": "serpent";
    Lrw "twofish": "twofish";
    Lrw "twofish-aes": "twofish", "aes";
    Lrw "serpent-twofish-aes": "serpent", "twofish", "aes";
    Lrw "serpent-aes": "serpent", "aes";
    Lrw "aes-twofish": "aes", "twofish";
    Lrw "aes-twofish-serpent": "aes", "twofish", "serpent";
    Lrw "twofish-serpent": "twofish", "serpent";
};

/// The chains `--cipher` allows: all, those whose outermost cipher it names, or the chain
/// it spells out. A cipher no chain uses is refused.
pub(super) fn candidates(cipher: Option<&str>) -> Result<Vec<&'static CipherChain>> {
    let v: Vec<_> = TCRYPT_CHAINS
        .iter()
        .filter(|c| match cipher {
            None => true,
            Some(want) => {
                let want = want.to_ascii_lowercase();
                let name = c.name;
                name == want || name.split('-').next() == Some(want.as_str())
            }
        })
        .collect();
    if v.is_empty() {
        return Err(FormatError::InvalidParameter(format!(
            "cipher {} is not supported for TCRYPT devices",
            cipher.unwrap_or_default()
        )));
    }
    Ok(v)
}

impl CipherChain {
    /// Bytes of the key area this chain uses.
    pub fn volume_key_len(&self) -> usize {
        let n = self.ciphers.len();
        match self.mode {
            ChainMode::Xts => 2 * CIPHER_KEY_LEN * n,
            ChainMode::Lrw => CIPHER_KEY_LEN * (n + 1),
        }
    }

    /// The used part of a key area (the header's, or a derived header key).
    pub(super) fn volume_key(&self, keys: &[u8]) -> SecretBytes {
        SecretBytes::from_slice(&keys[..self.volume_key_len().min(keys.len())])
    }

    /// The layers over `key` (a key area or derived key), outermost first.
    pub fn layers(&self, key: &[u8]) -> Vec<TcryptLayer> {
        let n = self.ciphers.len();
        self.ciphers
            .iter()
            .enumerate()
            .map(|(i, c)| {
                // Innermost cipher first in the key area.
                let k = n - 1 - i;
                let mut layer = Vec::with_capacity(2 * CIPHER_KEY_LEN);
                match self.mode {
                    ChainMode::Xts => {
                        let primary = k * CIPHER_KEY_LEN;
                        let secondary = (n + k) * CIPHER_KEY_LEN;
                        layer.extend_from_slice(&key[primary..primary + CIPHER_KEY_LEN]);
                        layer.extend_from_slice(&key[secondary..secondary + CIPHER_KEY_LEN]);
                    }
                    ChainMode::Lrw => {
                        // The tweak multiplier leads the key area, the cipher keys follow.
                        let at = CIPHER_KEY_LEN * (k + 1);
                        layer.extend_from_slice(&key[at..at + CIPHER_KEY_LEN]);
                        layer.extend_from_slice(&key[..LRW_TWEAK_LEN]);
                    }
                }
                TcryptLayer {
                    spec: format!("{c}-{}", self.mode.spec()),
                    key: SecretBytes::from_vec(layer),
                }
            })
            .collect()
    }

    /// Decrypts the 448 encrypted bytes of `raw` with the header key `key` and returns the
    /// header if it checks out.
    pub(super) fn decrypt_header(
        &self,
        key: &[u8],
        raw: &[u8; HEADER_LEN],
        veracrypt: bool,
    ) -> Option<TcryptHeader> {
        // One 512-byte unit holding the 448 bytes at its start: XTS and LRW tweak each block
        // by its position, so the padding behind them changes nothing.
        let mut unit = [0u8; 512];
        unit[..HEADER_LEN - SALT_LEN].copy_from_slice(&raw[SALT_LEN..]);
        for layer in self.layers(key) {
            let c =
                open_cipher(&layer.spec, layer.key.as_bytes(), &SectorOptions::default()).ok()?;
            c.decrypt(0, &mut unit).ok()?;
        }
        let mut plain = [0u8; HEADER_LEN];
        plain[..SALT_LEN].copy_from_slice(&raw[..SALT_LEN]);
        plain[SALT_LEN..].copy_from_slice(&unit[..HEADER_LEN - SALT_LEN]);
        let h = TcryptHeader::parse(&plain, veracrypt);
        zeroize::Zeroize::zeroize(&mut unit);
        zeroize::Zeroize::zeroize(&mut plain);
        h
    }
}
