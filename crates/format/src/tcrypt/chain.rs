//! Cipher chains (cascades) and their modes, and how the header's key area feeds them.
//!
//! A chain keeps cryptsetup's name and its order of ciphers: the order encryption applies
//! them, which is also the order of their keys in the key area. A read therefore decrypts
//! with the last cipher first; cryptsetup maps the last cipher on the device and stacks
//! the others over it, one dm-crypt device per cipher. (TrueCrypt's and VeraCrypt's own
//! names list the ciphers the other way round: their "AES-Twofish-Serpent" is
//! cryptsetup's `serpent-twofish-aes`.)
//!
//! The legacy CBC chains of TrueCrypt 1.0-4.3 put a 32-byte IV/whitening area in front of
//! the cipher keys (see [`cryptblk_cipher::tcrypt_cbc`]). Single 128-bit and CAST5/3DES
//! ciphers map to dm-crypt's `cbc-tcw`; cascades (`cbci-tcrypt`: one CBC over all ciphers)
//! and TrueCrypt's little-endian Blowfish (`cbc-tcrypt`) exist nowhere in the kernel, so
//! cryptsetup only dumps them, and cryptblk decrypts them with its own engine.

use super::header::{TcryptHeader, HEADER_LEN, SALT_LEN};
use super::TcryptLayer;
use crate::error::{FormatError, Result};
use cryptblk_cipher::tcrypt_cbc::{LegacyCipher, TcryptCbc, SEED_AREA_LEN};
use cryptblk_cipher::{open_cipher, CipherError, SecretBytes, SectorCipher, SectorOptions};

/// Size of each cipher key in XTS and LRW chains (all 256-bit).
const CIPHER_KEY_LEN: usize = 32;
/// LRW's tweak multiplier (one cipher block).
const LRW_TWEAK_LEN: usize = 16;
/// Whitening bytes in a legacy CBC volume key.
const WHITENING_LEN: usize = 16;

/// The block-chaining mode of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainMode {
    /// XTS with the sector number as tweak (TrueCrypt 5.0 and later, VeraCrypt).
    Xts,
    /// LRW with big-endian block numbers counted from 1 (TrueCrypt 4.1 to 4.3).
    Lrw,
    /// CBC of one cipher with the `tcw` IV and whitening (TrueCrypt 1.0 to 4.3).
    CbcTcw,
    /// "Outer" CBC: one CBC over a cascade of 128-bit ciphers (`cbci-tcrypt`).
    OuterCbc,
    /// "Inner" CBC: a CBC per cipher, for TrueCrypt's Blowfish (`cbc-tcrypt`).
    InnerCbc,
}

impl ChainMode {
    /// The mode cryptsetup names (dm-crypt's mode and IV where the kernel has it).
    pub fn spec(self) -> &'static str {
        match self {
            ChainMode::Xts => "xts-plain64",
            ChainMode::Lrw => "lrw-benbi",
            ChainMode::CbcTcw => "cbc-tcw",
            ChainMode::OuterCbc => "cbci-tcrypt",
            ChainMode::InnerCbc => "cbc-tcrypt",
        }
    }

    /// One of TrueCrypt 1.0-4.3's CBC modes.
    pub fn is_cbc(self) -> bool {
        matches!(
            self,
            ChainMode::CbcTcw | ChainMode::OuterCbc | ChainMode::InnerCbc
        )
    }
}

/// A cipher chain in one mode.
#[derive(Debug)]
pub struct CipherChain {
    /// cryptsetup's name (`serpent-twofish-aes`): the ciphers joined by dashes.
    pub name: &'static str,
    /// The ciphers in the order encryption applies them (and of their keys).
    pub ciphers: &'static [&'static str],
    /// The mode of the chain.
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

/// Every chain and mode cryptsetup knows, in the order it tries them.
pub static TCRYPT_CHAINS: &[CipherChain] = chains! {
    Xts "aes": "aes";
    Xts "serpent": "serpent";
    Xts "twofish": "twofish";
    Xts "twofish-aes": "twofish", "aes";
    Xts "serpent-twofish-aes": "serpent", "twofish", "aes";
    Xts "aes-serpent": "aes", "serpent";
    Xts "aes-twofish-serpent": "aes", "twofish", "serpent";
    Xts "serpent-twofish": "serpent", "twofish";
    Xts "camellia": "camellia";
    Xts "kuznyechik": "kuznyechik";
    Xts "kuznyechik-camellia": "kuznyechik", "camellia";
    Xts "twofish-kuznyechik": "twofish", "kuznyechik";
    Xts "serpent-camellia": "serpent", "camellia";
    Xts "aes-kuznyechik": "aes", "kuznyechik";
    Xts "camellia-serpent-kuznyechik": "camellia", "serpent", "kuznyechik";
    Lrw "aes": "aes";
    Lrw "serpent": "serpent";
    Lrw "twofish": "twofish";
    Lrw "twofish-aes": "twofish", "aes";
    Lrw "serpent-twofish-aes": "serpent", "twofish", "aes";
    Lrw "aes-serpent": "aes", "serpent";
    Lrw "aes-twofish-serpent": "aes", "twofish", "serpent";
    Lrw "serpent-twofish": "serpent", "twofish";
    CbcTcw "aes": "aes";
    CbcTcw "serpent": "serpent";
    CbcTcw "twofish": "twofish";
    OuterCbc "twofish-aes": "twofish", "aes";
    OuterCbc "serpent-twofish-aes": "serpent", "twofish", "aes";
    OuterCbc "aes-serpent": "aes", "serpent";
    OuterCbc "aes-twofish-serpent": "aes", "twofish", "serpent";
    OuterCbc "serpent-twofish": "serpent", "twofish";
    CbcTcw "cast5": "cast5";
    CbcTcw "des3_ede": "des3_ede";
    InnerCbc "blowfish_le": "blowfish_le";
    InnerCbc "blowfish_le-aes": "blowfish_le", "aes";
    InnerCbc "serpent-blowfish_le-aes": "serpent", "blowfish_le", "aes";
};

/// The chains `--cipher` allows: all, or as cryptsetup, those whose name contains it. A
/// cipher no chain uses is refused.
pub(super) fn candidates(cipher: Option<&str>) -> Result<Vec<&'static CipherChain>> {
    let v: Vec<_> = TCRYPT_CHAINS
        .iter()
        .filter(|c| match cipher {
            None => true,
            Some(want) => c.name.contains(want.to_ascii_lowercase().as_str()),
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

fn legacy(name: &str) -> LegacyCipher {
    LegacyCipher::from_name(name).expect("the CBC chains name legacy ciphers only")
}

fn short_key() -> FormatError {
    FormatError::Cipher(CipherError::Backend("TCRYPT key area too short".into()))
}

impl CipherChain {
    /// Byte offset in the key area of cipher `j`'s key (XTS: its primary key).
    fn key_offset(&self, j: usize) -> usize {
        match self.mode {
            ChainMode::Xts => CIPHER_KEY_LEN * j,
            ChainMode::Lrw => CIPHER_KEY_LEN * (j + 1),
            _ => {
                SEED_AREA_LEN
                    + self.ciphers[..j]
                        .iter()
                        .map(|c| legacy(c).tcrypt_key_size())
                        .sum::<usize>()
            }
        }
    }

    /// The key of cipher `j` as dm-crypt (and cryptsetup's volume key) lays it out: XTS its
    /// two keys, LRW the key and the tweak multiplier, CBC the key and, for the last cipher
    /// only, the IV seed and whitening that follow it in a `tcw` key.
    fn cipher_key(&self, keys: &[u8], j: usize) -> Option<Vec<u8>> {
        let n = self.ciphers.len();
        let at = self.key_offset(j);
        let mut k = Vec::with_capacity(2 * CIPHER_KEY_LEN);
        match self.mode {
            ChainMode::Xts => {
                let second = CIPHER_KEY_LEN * (n + j);
                k.extend_from_slice(keys.get(at..at + CIPHER_KEY_LEN)?);
                k.extend_from_slice(keys.get(second..second + CIPHER_KEY_LEN)?);
            }
            ChainMode::Lrw => {
                k.extend_from_slice(keys.get(at..at + CIPHER_KEY_LEN)?);
                k.extend_from_slice(keys.get(..LRW_TWEAK_LEN)?);
            }
            _ => {
                let c = legacy(self.ciphers[j]);
                k.extend_from_slice(keys.get(at..at + c.tcrypt_key_size())?);
                if j + 1 == n {
                    k.extend_from_slice(keys.get(..c.block_size() + WHITENING_LEN)?);
                }
            }
        }
        Some(k)
    }

    /// Bytes of the volume key as cryptsetup reports it (`MK bits`, `--dump-volume-key`):
    /// the dm-crypt keys of all ciphers, one after the other.
    pub fn volume_key_len(&self) -> usize {
        let n = self.ciphers.len();
        match self.mode {
            ChainMode::Xts => 2 * CIPHER_KEY_LEN * n,
            ChainMode::Lrw => (CIPHER_KEY_LEN + LRW_TWEAK_LEN) * n,
            _ => {
                let last = legacy(self.ciphers[n - 1]);
                self.ciphers
                    .iter()
                    .map(|c| legacy(c).tcrypt_key_size())
                    .sum::<usize>()
                    + last.block_size()
                    + WHITENING_LEN
            }
        }
    }

    /// cryptsetup's volume key of the header key area `keys` (256 bytes).
    pub fn volume_key(&self, keys: &[u8]) -> SecretBytes {
        let mut v = Vec::with_capacity(self.volume_key_len());
        for j in 0..self.ciphers.len() {
            match self.cipher_key(keys, j) {
                Some(mut k) => {
                    v.extend_from_slice(&k);
                    zeroize::Zeroize::zeroize(&mut k);
                }
                None => break,
            }
        }
        // A key area too short for the chain (never from a real header) gives no key.
        let out = if v.len() == self.volume_key_len() {
            SecretBytes::from_slice(&v)
        } else {
            SecretBytes::zeroed(0)
        };
        zeroize::Zeroize::zeroize(&mut v);
        out
    }

    /// Whether the kernel maps this chain (one dm-crypt device per cipher): not the legacy
    /// cascades and not TrueCrypt's Blowfish.
    pub fn kernel_mappable(&self) -> bool {
        !matches!(self.mode, ChainMode::OuterCbc | ChainMode::InnerCbc)
    }

    /// The dm-crypt layers over the key area `keys`, in the order a read applies them (the
    /// last cipher first), or `None` for chains the kernel does not map (or a short area).
    pub fn layers(&self, keys: &[u8]) -> Option<Vec<TcryptLayer>> {
        if !self.kernel_mappable() {
            return None;
        }
        (0..self.ciphers.len())
            .rev()
            .map(|j| {
                Some(TcryptLayer {
                    spec: format!("{}-{}", self.ciphers[j], self.mode.spec()),
                    key: SecretBytes::from_vec(self.cipher_key(keys, j)?),
                })
            })
            .collect()
    }

    /// The legacy CBC engine for the key area `keys`: each cipher keyed at its offset, the
    /// IV/whitening area from the area's start.
    fn cbc_engine(&self, keys: &[u8], iv_offset: u64) -> Result<TcryptCbc> {
        let mut owned = Vec::new();
        for (j, c) in self.ciphers.iter().enumerate() {
            let c = legacy(c);
            let at = self.key_offset(j);
            let k = keys
                .get(at..at + c.tcrypt_key_size())
                .ok_or_else(short_key)?;
            owned.push((c, k));
        }
        let seed = keys.get(..SEED_AREA_LEN).ok_or_else(short_key)?;
        Ok(TcryptCbc::new(&owned, seed, iv_offset)?)
    }

    /// The whole chain as one sector cipher over the key area `keys`, `iv_offset` added to
    /// every sector number: the stacked layers, or the legacy CBC engine.
    pub fn data_cipher(
        &self,
        keys: &[u8],
        iv_offset: u64,
        implementation: Option<String>,
    ) -> Result<Box<dyn SectorCipher>> {
        if matches!(self.mode, ChainMode::OuterCbc | ChainMode::InnerCbc) {
            return Ok(Box::new(self.cbc_engine(keys, iv_offset)?));
        }
        let layers = self.layers(keys).ok_or_else(short_key)?;
        let opts = SectorOptions {
            sector_size: 512,
            iv_offset,
            iv_large_sectors: false,
            implementation,
        };
        let layers = layers
            .iter()
            .map(|l| open_cipher(&l.spec, l.key.as_bytes(), &opts))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Box::new(Stack { layers }))
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
        if self.mode.is_cbc() {
            // TrueCrypt's header CBC: IV and whitening straight from the header key.
            self.cbc_engine(key, 0)
                .ok()?
                .decrypt_header(&mut unit[..HEADER_LEN - SALT_LEN]);
        } else {
            for layer in self.layers(key)? {
                let c = open_cipher(&layer.spec, layer.key.as_bytes(), &SectorOptions::default())
                    .ok()?;
                c.decrypt(0, &mut unit).ok()?;
            }
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

/// Stacked dm-crypt layers as one sector cipher: reads decrypt with the first layer first,
/// writes encrypt with the last first, each with the same sector numbers, as the stacked
/// devices do.
struct Stack {
    layers: Vec<Box<dyn SectorCipher>>,
}

impl SectorCipher for Stack {
    fn sector_size(&self) -> usize {
        512
    }

    fn encrypt(&self, sector: u64, buf: &mut [u8]) -> std::result::Result<(), CipherError> {
        for l in self.layers.iter().rev() {
            l.encrypt(sector, buf)?;
        }
        Ok(())
    }

    fn decrypt(&self, sector: u64, buf: &mut [u8]) -> std::result::Result<(), CipherError> {
        for l in &self.layers {
            l.decrypt(sector, buf)?;
        }
        Ok(())
    }

    fn implementation(&self) -> &str {
        self.layers.first().map_or("", |l| l.implementation())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are the ciphers joined, volume keys have cryptsetup's sizes (its
    /// `chain_key_size`), and every chain's data cipher opens over a 256-byte key area.
    #[test]
    fn table_is_consistent() {
        let keys: Vec<u8> = (0..=255u8).collect();
        for c in TCRYPT_CHAINS {
            assert_eq!(c.name, c.ciphers.join("-"));
            assert_eq!(c.volume_key(&keys).len(), c.volume_key_len(), "{}", c.name);
            assert!(c.data_cipher(&keys, 1, None).is_ok(), "{}", c.name);
            assert_eq!(c.layers(&keys).is_some(), c.kernel_mappable());
        }
        let size = |name: &str, mode: ChainMode| {
            TCRYPT_CHAINS
                .iter()
                .find(|c| c.name == name && c.mode == mode)
                .unwrap()
                .volume_key_len()
        };
        assert_eq!(size("aes", ChainMode::Lrw), 48);
        assert_eq!(size("aes", ChainMode::CbcTcw), 64);
        assert_eq!(size("cast5", ChainMode::CbcTcw), 40);
        assert_eq!(size("des3_ede", ChainMode::CbcTcw), 48);
        assert_eq!(size("blowfish_le", ChainMode::InnerCbc), 80);
        assert_eq!(size("serpent-blowfish_le-aes", ChainMode::InnerCbc), 152);
        assert_eq!(size("aes-twofish-serpent", ChainMode::OuterCbc), 128);
    }

    /// The XTS key layout: cipher j's keys at 32j and 32(n+j); a read decrypts with the last
    /// cipher first, keyed at the highest offset.
    #[test]
    fn xts_layers_read_last_cipher_first() {
        let keys: Vec<u8> = (0..=255u8).collect();
        let c = TCRYPT_CHAINS
            .iter()
            .find(|c| c.name == "serpent-twofish-aes" && c.mode == ChainMode::Xts)
            .unwrap();
        let l = c.layers(&keys).unwrap();
        assert_eq!(l[0].spec, "aes-xts-plain64");
        assert_eq!(l[0].key.as_bytes()[0], 64);
        assert_eq!(l[0].key.as_bytes()[32], 160);
        assert_eq!(l[2].spec, "serpent-xts-plain64");
        assert_eq!(l[2].key.as_bytes()[0], 0);
        let tcw = TCRYPT_CHAINS
            .iter()
            .find(|c| c.name == "cast5")
            .unwrap()
            .layers(&keys)
            .unwrap();
        assert_eq!(tcw[0].spec, "cast5-cbc-tcw");
        assert_eq!(tcw[0].key.as_bytes()[..16], keys[32..48]);
        assert_eq!(tcw[0].key.as_bytes()[16..], keys[..24]);
    }
}
