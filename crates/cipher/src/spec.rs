//! Cipher specifications as dm-crypt tables and cryptsetup accept them.
//!
//! Two spellings exist: the legacy `cipher-chainmode-ivmode[:ivopts]` (`aes-xts-plain64`,
//! `aes-cbc-essiv:sha256`, `cipher_null-ecb`) and the kernel crypto API form
//! `capi:chainmode(cipher)-ivmode[:ivopts]` (`capi:xts(aes)-plain64`, `capi:ecb(cipher_null)`).
//! Both parse to the same [`CipherSpec`]. Kernel driver names (`aes-generic`, `ecb(aes-ni)`)
//! are refused as cryptsetup refuses them: their dash makes the split ambiguous.

use crate::hash::HashAlgorithm;
use crate::CipherError;
use std::fmt;
use std::str::FromStr;

/// The block cipher under the chaining mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockCipherName {
    /// AES (Rijndael with 128-bit blocks).
    Aes,
    /// Serpent, kernel byte order (the NESSIE one, not `tnepres`).
    Serpent,
    /// Twofish.
    Twofish,
    /// Camellia (RFC 3713), a VeraCrypt cipher.
    Camellia,
    /// Kuznyechik (GOST R 34.12-2015, 256-bit keys only), a VeraCrypt cipher.
    Kuznyechik,
    /// ARIA (RFC 5794, KS X 1213), kernel `aria` (cryptsetup 2.7+ lists it).
    Aria,
    /// Blowfish (64-bit blocks), only in TrueCrypt's `cbc-tcw` mode.
    Blowfish,
    /// CAST5 (64-bit blocks), only in TrueCrypt's `cbc-tcw` mode.
    Cast5,
    /// Triple DES EDE (64-bit blocks), only in TrueCrypt's `cbc-tcw` mode.
    Des3Ede,
    /// The identity "cipher" (`cipher_null`): no encryption, key ignored.
    Null,
}

impl BlockCipherName {
    /// Kernel/cryptsetup name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes => "aes",
            Self::Serpent => "serpent",
            Self::Twofish => "twofish",
            Self::Camellia => "camellia",
            Self::Kuznyechik => "kuznyechik",
            Self::Aria => "aria",
            Self::Blowfish => "blowfish",
            Self::Cast5 => "cast5",
            Self::Des3Ede => "des3_ede",
            Self::Null => "cipher_null",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "aes" => Self::Aes,
            "serpent" => Self::Serpent,
            "twofish" => Self::Twofish,
            "camellia" => Self::Camellia,
            "kuznyechik" => Self::Kuznyechik,
            "aria" => Self::Aria,
            "blowfish" => Self::Blowfish,
            "cast5" => Self::Cast5,
            "des3_ede" => Self::Des3Ede,
            "cipher_null" | "null" => Self::Null,
            _ => return None,
        })
    }

    /// Key sizes the bare block cipher accepts, in bytes.
    pub fn key_sizes(self) -> &'static [usize] {
        match self {
            Self::Aes | Self::Twofish | Self::Camellia | Self::Aria => &[16, 24, 32],
            Self::Kuznyechik => &[32],
            // The kernel pads shorter Serpent keys; RustCrypto accepts 16..=32 and cryptsetup
            // never creates shorter ones.
            Self::Serpent => &[16, 20, 24, 28, 32],
            // The key sizes TrueCrypt and cryptsetup use (the kernel takes more).
            Self::Blowfish => &[16, 24, 32, 40, 48, 56],
            Self::Cast5 => &[16],
            Self::Des3Ede => &[24],
            Self::Null => &[0],
        }
    }

    /// Block size in bytes (1 for `cipher_null`, as in the kernel).
    pub fn block_size(self) -> usize {
        match self {
            Self::Null => 1,
            Self::Blowfish | Self::Cast5 | Self::Des3Ede => 8,
            _ => 16,
        }
    }
}

/// The chaining (block) mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainMode {
    /// XEX-based tweaked codebook with ciphertext stealing (IEEE 1619).
    Xts,
    /// Cipher block chaining.
    Cbc,
    /// Electronic codebook (no IV).
    Ecb,
    /// Liskov-Rivest-Wagner tweakable mode (kernel `lrw`, LRW-32-AES).
    Lrw,
    /// HCTR2 (kernel `hctr2(aes)`): a wide-block tweakable cipher over the whole sector,
    /// with a 32-byte tweak (the IV); the crate's hctr2 module.
    Hctr2,
    /// Adiantum with XChaCha12 (kernel `adiantum(xchacha12,aes)`, cryptsetup's
    /// `xchacha12,aes-adiantum-plain64`): wide-block, 32-byte tweak, 256-bit key.
    AdiantumXChaCha12,
    /// Adiantum with XChaCha20 (`xchacha20,aes-adiantum-plain64`).
    AdiantumXChaCha20,
}

impl ChainMode {
    /// Kernel name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Xts => "xts",
            Self::Cbc => "cbc",
            Self::Ecb => "ecb",
            Self::Lrw => "lrw",
            Self::Hctr2 => "hctr2",
            Self::AdiantumXChaCha12 | Self::AdiantumXChaCha20 => "adiantum",
        }
    }

    /// True for the wide-block modes (HCTR2, Adiantum): one tweakable permutation of the
    /// whole sector, with the kernel's 32-byte IV.
    pub fn is_wide_block(self) -> bool {
        matches!(
            self,
            Self::Hctr2 | Self::AdiantumXChaCha12 | Self::AdiantumXChaCha20
        )
    }

    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "xts" => Self::Xts,
            "cbc" => Self::Cbc,
            "ecb" => Self::Ecb,
            "lrw" => Self::Lrw,
            "hctr2" => Self::Hctr2,
            _ => return None,
        })
    }
}

/// How each sector's IV is derived (dm-crypt "ivmode").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IvMode {
    /// No IV at all (ECB).
    None,
    /// All-zero IV (`null`).
    Null,
    /// Low 32 bits of the sector number, little-endian (`plain`).
    Plain,
    /// 64-bit sector number, little-endian (`plain64`).
    Plain64,
    /// 64-bit sector number, big-endian in the IV's last 8 bytes (`plain64be`).
    Plain64Be,
    /// plain64 encrypted with the block cipher keyed by a hash of the volume key.
    Essiv(HashAlgorithm),
    /// Big-endian narrow block count, starting at 1 (`benbi`).
    Benbi,
    /// The sector's byte offset (IV sector times the encryption sector size), little-endian,
    /// encrypted with the data key (`eboiv`, BitLocker's CBC IV).
    Eboiv,
    /// BitLocker's Elephant diffuser around CBC with `eboiv` IVs (`elephant`): the key is the
    /// data key followed by a tweak key of the same size.
    Elephant,
    /// TrueCrypt's legacy CBC (`tcw`): the IV seed XOR the sector number, and whitening of
    /// the ciphertext derived from the sector by CRC32; the key is the cipher key followed
    /// by the IV seed (one block) and 16 whitening bytes. See [`crate::tcrypt_cbc`].
    Tcw,
    /// loop-AES multi-key v2/v3 (`lmk`): CBC whose IV is an unpadded MD5 state over the
    /// sector's plaintext blocks 1-31, the sector number and (v3) a seed key.
    Lmk,
}

impl IvMode {
    /// The ivmode as written in a spec (`essiv:sha256`); empty for [`IvMode::None`].
    pub fn spec_name(self) -> String {
        match self {
            Self::None => String::new(),
            Self::Null => "null".into(),
            Self::Plain => "plain".into(),
            Self::Plain64 => "plain64".into(),
            Self::Plain64Be => "plain64be".into(),
            Self::Essiv(h) => format!("essiv:{}", h.name()),
            Self::Benbi => "benbi".into(),
            Self::Eboiv => "eboiv".into(),
            Self::Elephant => "elephant".into(),
            Self::Tcw => "tcw".into(),
            Self::Lmk => "lmk".into(),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        let (name, opts) = match s.split_once(':') {
            Some((n, o)) => (n, Some(o)),
            None => (s, None),
        };
        let mode = match (name, opts) {
            ("null", None) => Self::Null,
            ("plain", None) => Self::Plain,
            ("plain64", None) => Self::Plain64,
            ("plain64be", None) => Self::Plain64Be,
            ("benbi", None) => Self::Benbi,
            ("eboiv", None) => Self::Eboiv,
            ("elephant", None) => Self::Elephant,
            ("tcw", None) => Self::Tcw,
            ("lmk", None) => Self::Lmk,
            ("essiv", Some(h)) => Self::Essiv(HashAlgorithm::from_name(h).ok()?),
            _ => return None,
        };
        Some(mode)
    }
}

/// A parsed cipher specification.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CipherSpec {
    cipher: BlockCipherName,
    chain: ChainMode,
    iv: IvMode,
    /// Number of keys (dm-crypt's `cipher:<keycount>`, a power of two): sector `s` uses key
    /// `s % keys` (loop-AES multi-key: `aes:64-cbc-lmk`).
    keys: u32,
}

impl CipherSpec {
    /// Parses a dm-crypt/cryptsetup cipher specification (legacy or `capi:` form).
    ///
    /// Follows cryptsetup's rules: a bare `aes` or `aes-plain` means `aes-cbc-plain`, `null`
    /// and `cipher_null` mean `cipher_null-ecb`, and every chaining mode but ECB needs an
    /// IV mode (ECB ignores one, as the kernel does).
    pub fn parse(spec: &str) -> Result<Self, CipherError> {
        let unknown = || CipherError::UnknownSpec(spec.to_string());
        let capi_form = spec.starts_with("capi:");
        let (cipher, chain, iv) = if let Some(capi) = spec.strip_prefix("capi:") {
            // capi:chain(cipher)[-ivmode]; a ')' after the first dash means a driver name
            // such as aes-generic, which cryptsetup refuses.
            let (api, ivmode) = match capi.split_once('-') {
                Some((a, i)) => (a, Some(i)),
                None => (capi, None),
            };
            if ivmode.is_some_and(|i| i.contains(['(', ')'])) {
                return Err(unknown());
            }
            let inner = api.strip_suffix(')').ok_or_else(unknown)?;
            let (chain, cipher) = inner.split_once('(').ok_or_else(unknown)?;
            if cipher.contains(['(', ')']) {
                return Err(unknown());
            }
            (cipher, chain, ivmode)
        } else {
            if spec == "null" || spec == "cipher_null" {
                return Ok(Self::null());
            }
            let mut parts = spec.splitn(3, '-');
            let cipher = parts.next().unwrap_or_default();
            let chain = parts.next();
            let iv = parts.next();
            match (chain, iv) {
                (None, _) | (Some("plain"), None) => (cipher, "cbc", Some("plain")),
                (Some(c), i) => (cipher, c, i),
            }
        };
        // The legacy form may carry a key count ("aes:64-..."): a power of two, as the
        // kernel's "Bad cipher key count specification" check wants it.
        let (cipher, mut keys) = match cipher.split_once(':') {
            Some((_, n)) if capi_form || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) => {
                return Err(unknown())
            }
            Some((c, n)) => match n.parse::<u32>() {
                Ok(k) if k.is_power_of_two() => (c, k),
                _ => return Err(unknown()),
            },
            None => (cipher, 1),
        };
        // Adiantum names its stream cipher beside the block cipher (`xchacha12,aes`), as the
        // kernel's `adiantum(xchacha12,aes)` template does; AES is the only block cipher.
        let (cipher, chain) = match (chain, cipher) {
            ("adiantum", "xchacha12,aes") => (BlockCipherName::Aes, ChainMode::AdiantumXChaCha12),
            ("adiantum", "xchacha20,aes") => (BlockCipherName::Aes, ChainMode::AdiantumXChaCha20),
            ("adiantum", _) => return Err(unknown()),
            (chain, cipher) => (
                BlockCipherName::from_name(cipher).ok_or_else(unknown)?,
                ChainMode::from_name(chain).ok_or_else(unknown)?,
            ),
        };
        if chain == ChainMode::Hctr2 && cipher != BlockCipherName::Aes {
            return Err(unknown());
        }
        let iv = match (chain, iv) {
            // The kernel ignores an IV mode given with ECB (with a warning).
            (ChainMode::Ecb, _) => IvMode::None,
            (_, None) => return Err(unknown()),
            (_, Some(i)) => IvMode::parse(i).ok_or_else(unknown)?,
        };
        if cipher == BlockCipherName::Null && chain != ChainMode::Ecb {
            return Err(unknown());
        }
        // The kernel's elephant diffuser exists only for AES in CBC mode, as BitLocker uses it.
        if iv == IvMode::Elephant && (cipher != BlockCipherName::Aes || chain != ChainMode::Cbc) {
            return Err(unknown());
        }
        // dm-crypt's tcw is CBC only; cryptblk has TrueCrypt's ciphers there, and its 64-bit
        // block ciphers nowhere else.
        let tcw_cipher = matches!(
            cipher,
            BlockCipherName::Aes
                | BlockCipherName::Serpent
                | BlockCipherName::Twofish
                | BlockCipherName::Blowfish
                | BlockCipherName::Cast5
                | BlockCipherName::Des3Ede
        );
        if iv == IvMode::Tcw && (chain != ChainMode::Cbc || !tcw_cipher) {
            return Err(unknown());
        }
        if cipher.block_size() == 8 && iv != IvMode::Tcw {
            return Err(CipherError::Unsupported(format!(
                "{} is implemented only in TrueCrypt's cbc-tcw mode",
                cipher.name()
            )));
        }
        // lmk only makes sense around CBC: the IV is folded into the first plaintext block.
        if iv == IvMode::Lmk && chain != ChainMode::Cbc {
            return Err(unknown());
        }
        // The kernel's crypto API form has no key count; with lmk it uses 64 keys.
        if capi_form && iv == IvMode::Lmk {
            keys = 64;
        }
        if keys > 1 && cipher == BlockCipherName::Null {
            return Err(unknown());
        }
        // The wide-block modes take the kernel's 32-byte IV; cryptblk builds it for the IV
        // modes that leave its upper half zero (plain, plain64, null), the ones cryptsetup
        // documents for them.
        if chain.is_wide_block() {
            if keys > 1 {
                return Err(unknown());
            }
            if !matches!(iv, IvMode::Plain | IvMode::Plain64 | IvMode::Null) {
                return Err(CipherError::Unsupported(format!(
                    "{} with {} IVs (cryptblk runs it with plain, plain64 or null IVs)",
                    chain.name(),
                    iv.spec_name()
                )));
            }
        }
        Ok(Self {
            cipher,
            chain,
            iv,
            keys,
        })
    }

    /// The null cipher (`cipher_null-ecb`).
    pub fn null() -> Self {
        Self {
            cipher: BlockCipherName::Null,
            chain: ChainMode::Ecb,
            iv: IvMode::None,
            keys: 1,
        }
    }

    /// Builds a specification from its parts (for callers that hold them separately).
    pub fn from_parts(cipher: &str, mode: &str) -> Result<Self, CipherError> {
        Self::parse(&format!("{cipher}-{mode}"))
    }

    /// The block cipher.
    pub fn cipher(&self) -> BlockCipherName {
        self.cipher
    }

    /// The chaining mode.
    pub fn chain_mode(&self) -> ChainMode {
        self.chain
    }

    /// The IV mode.
    pub fn iv_mode(&self) -> IvMode {
        self.iv
    }

    /// The number of keys (`aes:64-cbc-lmk`: 64); 1 for ordinary specs.
    pub fn key_count(&self) -> u32 {
        self.keys
    }

    /// How a volume key of `len` bytes splits, as dm-crypt splits it: the size of each of
    /// the [`CipherSpec::key_count`] keys, and whether one more key of that size follows as
    /// the `lmk` seed (loop-AES v3: the kernel takes a seed when the key does not divide
    /// into `key_count` parts). `None` when it does not split evenly.
    pub fn key_layout(&self, len: usize) -> Option<(usize, bool)> {
        let n = self.keys as usize;
        if len.is_multiple_of(n) {
            Some((len / n, false))
        } else if self.iv == IvMode::Lmk && len.is_multiple_of(n + 1) {
            Some((len / (n + 1), true))
        } else {
            None
        }
    }

    /// Cipher name as LUKS1 stores it (`aes`, `serpent`, `cipher_null`).
    pub fn cipher_name(&self) -> &'static str {
        match self.chain {
            ChainMode::AdiantumXChaCha12 => "xchacha12,aes",
            ChainMode::AdiantumXChaCha20 => "xchacha20,aes",
            _ => self.cipher.name(),
        }
    }

    /// Mode string as LUKS1 stores it: `xts-plain64`, `cbc-essiv:sha256`, `ecb`.
    pub fn cipher_mode(&self) -> String {
        match self.iv {
            IvMode::None => self.chain.name().to_string(),
            iv => format!("{}-{}", self.chain.name(), iv.spec_name()),
        }
    }

    /// The full legacy specification (`aes-xts-plain64`, `aes:64-cbc-lmk`), as in dm tables
    /// and LUKS2 segments.
    pub fn spec_string(&self) -> String {
        if self.keys > 1 {
            format!(
                "{}:{}-{}",
                self.cipher_name(),
                self.keys,
                self.cipher_mode()
            )
        } else {
            format!("{}-{}", self.cipher_name(), self.cipher_mode())
        }
    }

    /// The kernel crypto API name of the data transform (`xts(aes)`, `ecb(cipher_null)`).
    pub fn kernel_api_name(&self) -> String {
        format!("{}({})", self.chain.name(), self.cipher_name())
    }

    /// True for `cipher_null` (no encryption).
    pub fn is_null(&self) -> bool {
        self.cipher == BlockCipherName::Null
    }

    /// IV length in bytes the kernel uses for this spec (0 for ECB).
    pub fn iv_size(&self) -> usize {
        match self.chain {
            ChainMode::Ecb => 0,
            c if c.is_wide_block() => 32,
            _ => self.cipher.block_size(),
        }
    }

    /// Volume key sizes (bytes) valid for this spec: XTS takes two cipher keys, LRW a cipher
    /// key plus a 16-byte tweak key, `cipher_null` an empty key.
    /// Multi-key specs take `key_count` such keys, and `lmk` with several keys optionally
    /// one more as its seed.
    pub fn valid_key_sizes(&self) -> Vec<usize> {
        let one = self.single_key_sizes();
        let n = self.keys as usize;
        let mut sizes: Vec<usize> = one.iter().map(|k| k * n).collect();
        if self.iv == IvMode::Lmk && n > 1 {
            sizes.extend(one.iter().map(|k| k * (n + 1)));
        }
        sizes
    }

    /// Key sizes of one key of this spec (what [`CipherSpec::valid_key_sizes`] is for a
    /// single-key spec).
    pub fn single_key_sizes(&self) -> Vec<usize> {
        let base = self.cipher.key_sizes();
        if self.iv == IvMode::Elephant {
            // dm-crypt accepts AES-128 and AES-256 data keys, each followed by its tweak key.
            return vec![32, 64];
        }
        if self.iv == IvMode::Tcw {
            // The cipher key, then the IV seed (one block) and 16 whitening bytes.
            let extra = self.cipher.block_size() + crate::tcrypt_cbc::WHITENING_SEED_LEN;
            return base.iter().map(|k| k + extra).collect();
        }
        match (self.cipher, self.chain) {
            (BlockCipherName::Null, _) => vec![0],
            // Adiantum's key is the XChaCha key, from which the AES and hash keys derive.
            (_, ChainMode::AdiantumXChaCha12 | ChainMode::AdiantumXChaCha20) => vec![32],
            (_, ChainMode::Xts) => base.iter().map(|k| 2 * k).collect(),
            (_, ChainMode::Lrw) => base.iter().map(|k| k + 16).collect(),
            _ => base.to_vec(),
        }
    }

    /// The key size cryptsetup picks by default (XTS: 2x256 bits; others: 256 bits).
    pub fn default_key_size(&self) -> usize {
        if self.iv == IvMode::Tcw {
            return self.valid_key_sizes().last().copied().unwrap_or(0);
        }
        let one = match (self.cipher, self.chain) {
            (BlockCipherName::Null, _) => 0,
            (_, ChainMode::Xts) => 64,
            (_, ChainMode::Lrw) => 48,
            _ => 32,
        };
        one * self.keys as usize
    }

    /// Checks a volume key length against [`CipherSpec::valid_key_sizes`].
    ///
    /// `cipher_null` accepts any key (the kernel ignores it); cryptsetup passes none.
    pub fn check_key_size(&self, len: usize) -> Result<(), CipherError> {
        if self.is_null() || self.valid_key_sizes().contains(&len) {
            Ok(())
        } else {
            Err(CipherError::KeySize {
                spec: self.spec_string(),
                got: len,
            })
        }
    }
}

impl FromStr for CipherSpec {
    type Err = CipherError;
    fn from_str(s: &str) -> Result<Self, CipherError> {
        Self::parse(s)
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec_string())
    }
}

/// How sectors map to IVs, as the dm-crypt table's optional parameters set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectorOptions {
    /// Encryption sector size in bytes (`sector_size:`), a power of two in 512..=4096.
    pub sector_size: usize,
    /// Added to every sector number before IV derivation, in 512-byte units (the table's
    /// `iv_offset` field).
    pub iv_offset: u64,
    /// `iv_large_sectors`: IVs count `sector_size` units instead of 512-byte units.
    pub iv_large_sectors: bool,
    /// An implementation name from [`crate::implementations`]; `None` picks the best.
    pub implementation: Option<String>,
}

impl Default for SectorOptions {
    fn default() -> Self {
        Self {
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            implementation: None,
        }
    }
}

impl SectorOptions {
    /// Checks the sector size rule (power of two, 512..=4096).
    pub fn check(&self) -> Result<(), CipherError> {
        let s = self.sector_size;
        if (512..=4096).contains(&s) && s.is_power_of_two() {
            Ok(())
        } else {
            Err(CipherError::SectorSize(s))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CipherSpec {
        CipherSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn legacy_specs() {
        let s = p("aes-xts-plain64");
        assert_eq!(s.cipher_name(), "aes");
        assert_eq!(s.cipher_mode(), "xts-plain64");
        assert_eq!(s.spec_string(), "aes-xts-plain64");
        assert_eq!(s.valid_key_sizes(), vec![32, 48, 64]);
        let s = p("aes-cbc-essiv:sha256");
        assert_eq!(s.cipher_mode(), "cbc-essiv:sha256");
        assert_eq!(s.iv_mode(), IvMode::Essiv(HashAlgorithm::Sha256));
        assert_eq!(s.valid_key_sizes(), vec![16, 24, 32]);
        assert_eq!(p("aes-lrw-plain64").valid_key_sizes(), vec![32, 40, 48]);
        assert_eq!(p("serpent-xts-plain64").cipher(), BlockCipherName::Serpent);
        assert_eq!(p("twofish-cbc-benbi").iv_mode(), IvMode::Benbi);
        assert_eq!(p("aes-xts-plain64be").iv_mode(), IvMode::Plain64Be);
        assert_eq!(p("aes-cbc-null").iv_mode(), IvMode::Null);
        assert_eq!(p("aes-xts-essiv:sha256").chain_mode(), ChainMode::Xts);
        assert_eq!(p("aes:1-cbc-plain").spec_string(), "aes-cbc-plain");
        assert_eq!(p("aes-cbc-eboiv").iv_mode(), IvMode::Eboiv);
        assert_eq!(p("aes-cbc-elephant").valid_key_sizes(), vec![32, 64]);
        assert!(CipherSpec::parse("aes-xts-elephant").is_err());
        assert!(CipherSpec::parse("serpent-cbc-elephant").is_err());
        let t = p("cast5-cbc-tcw");
        assert_eq!((t.iv_mode(), t.iv_size()), (IvMode::Tcw, 8));
        assert_eq!(t.valid_key_sizes(), vec![16 + 8 + 16]);
        assert_eq!(p("aes-cbc-tcw").valid_key_sizes(), vec![48, 56, 64]);
        assert_eq!(p("des3_ede-cbc-tcw").default_key_size(), 48);
        assert!(CipherSpec::parse("aes-xts-tcw").is_err());
        assert!(CipherSpec::parse("camellia-cbc-tcw").is_err());
        assert!(CipherSpec::parse("blowfish-cbc-plain").is_err());
    }

    #[test]
    fn multi_key_specs_as_dm_crypt_writes_them() {
        let s = p("aes:64-cbc-lmk");
        assert_eq!((s.key_count(), s.iv_mode()), (64, IvMode::Lmk));
        assert_eq!(s.spec_string(), "aes:64-cbc-lmk");
        assert_eq!(s.cipher_mode(), "cbc-lmk");
        // v2: 64 keys; v3: 65 (the last is the IV seed).
        assert!(s.check_key_size(64 * 16).is_ok());
        assert!(s.check_key_size(65 * 32).is_ok());
        assert!(s.check_key_size(63 * 16).is_err());
        assert_eq!(s.key_layout(64 * 24), Some((24, false)));
        assert_eq!(s.key_layout(65 * 16), Some((16, true)));
        assert_eq!(s.key_layout(65 * 16 + 1), None);
        // The crypto API form of lmk means 64 keys, as in the kernel.
        assert_eq!(p("capi:cbc(aes)-lmk"), s);
        let t = p("twofish:4-cbc-plain64");
        assert_eq!(
            (t.key_count(), t.spec_string()),
            (4, "twofish:4-cbc-plain64".into())
        );
        assert_eq!(t.key_layout(4 * 32), Some((32, false)));
        assert!(t.check_key_size(5 * 32).is_err());
        assert!(t.check_key_size(4 * 24).is_ok());
        assert_eq!(p("aes-cbc-lmk").key_count(), 1);
        assert_eq!(p("aes:1-cbc-plain64"), p("aes-cbc-plain64"));
    }

    #[test]
    fn cryptsetup_shorthands() {
        assert_eq!(p("aes").spec_string(), "aes-cbc-plain");
        assert_eq!(p("aes-plain").spec_string(), "aes-cbc-plain");
        assert_eq!(p("null"), CipherSpec::null());
        assert_eq!(p("cipher_null"), CipherSpec::null());
        let n = p("cipher_null-ecb");
        assert!(n.is_null());
        assert_eq!(
            (n.cipher_name(), n.cipher_mode()),
            ("cipher_null", "ecb".into())
        );
        assert!(n.check_key_size(0).is_ok());
    }

    #[test]
    fn capi_specs() {
        assert_eq!(p("capi:xts(aes)-plain64"), p("aes-xts-plain64"));
        assert_eq!(p("capi:cbc(aes)-essiv:sha256"), p("aes-cbc-essiv:sha256"));
        assert_eq!(p("capi:ecb(cipher_null)"), CipherSpec::null());
        assert_eq!(p("capi:xts(aes)-plain64").kernel_api_name(), "xts(aes)");
    }

    /// cryptsetup 2.7/2.8's ciphers, as cryptsetup and the kernel spell them.
    #[test]
    fn hctr2_adiantum_aria_specs() {
        let h = p("aes-hctr2-plain64");
        assert_eq!(h.chain_mode(), ChainMode::Hctr2);
        assert_eq!(h.kernel_api_name(), "hctr2(aes)");
        assert_eq!((h.iv_size(), h.default_key_size()), (32, 32));
        assert_eq!(h.valid_key_sizes(), vec![16, 24, 32]);
        assert_eq!(p("capi:hctr2(aes)-plain64"), h);
        for (name, mode) in [
            ("xchacha12,aes", ChainMode::AdiantumXChaCha12),
            ("xchacha20,aes", ChainMode::AdiantumXChaCha20),
        ] {
            let a = p(&format!("{name}-adiantum-plain64"));
            assert_eq!(a.chain_mode(), mode);
            assert_eq!(a.spec_string(), format!("{name}-adiantum-plain64"));
            assert_eq!(
                (a.cipher_name(), a.cipher_mode()),
                (name, "adiantum-plain64".into())
            );
            assert_eq!(a.kernel_api_name(), format!("adiantum({name})"));
            assert_eq!(a.valid_key_sizes(), vec![32]);
            assert_eq!((a.iv_size(), a.default_key_size()), (32, 32));
            assert_eq!(p(&format!("capi:adiantum({name})-plain64")), a);
            assert_eq!(CipherSpec::from_parts(name, "adiantum-plain64").unwrap(), a);
        }
        let x = p("aria-xts-plain64");
        assert_eq!(
            (x.cipher(), x.valid_key_sizes()),
            (BlockCipherName::Aria, vec![32, 48, 64])
        );
        assert_eq!(p("aria-cbc-essiv:sha256").kernel_api_name(), "cbc(aria)");
        for bad in [
            "xchacha8,aes-adiantum-plain64",
            "aes-adiantum-plain64",
            "serpent-hctr2-plain64",
            "aes:2-hctr2-plain64",
        ] {
            assert!(CipherSpec::parse(bad).is_err(), "{bad} was accepted");
        }
        assert!(matches!(
            CipherSpec::parse("aes-hctr2-essiv:sha256"),
            Err(CipherError::Unsupported(_))
        ));
    }

    #[test]
    fn refused_specs() {
        for bad in [
            "capi:xts(ecb(aes-generic))-plain64",
            "capi:xts(aes-generic)-plain64",
            "capi:xts(ecb(aes))-plain64",
            "aes-xts",
            "aes-cbc-essiv",
            "aes-cbc-essiv:md4x",
            "des-cbc-plain",
            "aes-gcm-random",
            "aes:3-cbc-lmk",
            "aes:0-cbc-plain64",
            "aes:-cbc-plain64",
            "aes:+4-cbc-plain64",
            "aes-xts-lmk",
            "cipher_null:2-ecb",
            "cipher_null-cbc-plain",
            "",
        ] {
            assert!(
                matches!(CipherSpec::parse(bad), Err(CipherError::UnknownSpec(_))),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn key_sizes_are_checked() {
        let s = p("aes-xts-plain64");
        assert!(s.check_key_size(64).is_ok());
        assert!(matches!(
            s.check_key_size(16),
            Err(CipherError::KeySize { got: 16, .. })
        ));
        assert!(p("aes-cbc-plain").check_key_size(64).is_err());
    }

    #[test]
    fn sector_options_check() {
        assert!(SectorOptions::default().check().is_ok());
        for bad in [0, 256, 1000, 8192] {
            let o = SectorOptions {
                sector_size: bad,
                ..Default::default()
            };
            assert!(o.check().is_err());
        }
    }
}
