//! LUKS2 authenticated encryption (`cryptsetup luksFormat --integrity ...`): the segment's
//! `integrity` object, the split of the volume key into encryption and integrity keys, the
//! per-sector tag size, and the two device-mapper layers that activation stacks
//! (`integrity` without an internal hash at the data offset, `crypt` with
//! `integrity:<tag bytes>:aead` on top of it).
//!
//! Facts follow cryptsetup 2.6 (`lib/integrity`, `lib/luks2`) and the kernel's dm-crypt:
//! - `--integrity` names map to kernel names (`hmac-sha256` -> `hmac(sha256)`); the HMAC
//!   key is appended to the encryption key (dm-crypt takes `<enc key><mac key>` for
//!   `authenc`), so a keyslot stores `enc + mac` bytes.
//! - The tag stored per sector is the authentication tag plus the IV when the IV is random
//!   (`*-random` modes store it; `plain64`/`essiv` derive it).
//! - The dm-integrity superblock lives at the segment offset of the *whole* data device and
//!   is formatted with the kernel's defaults (journal 1/128 of the device, at most 64 MiB;
//!   32768 interleave sectors; 128 buffer sectors); cryptsetup passes none of them.

use super::Luks2Header;
use crate::error::{FormatError, Result};
use crate::integrity::IntegritySuperblock;
use serde_json::{json, Value};

/// Sectors the temporary format mapping covers (cryptsetup's `INTEGRITY_format` maps 8).
pub const FORMAT_MAPPING_SECTORS: u64 = 8;
/// Kernel default: data sectors between two tag areas.
pub const DEFAULT_INTERLEAVE_SECTORS: u32 = 32768;
/// Kernel default: metadata buffer size in sectors.
pub const DEFAULT_BUFFER_SECTORS: u32 = 128;
/// Kernel default: largest journal, in sectors (64 MiB).
pub const MAX_JOURNAL_SECTORS: u64 = 131072;

/// An `--integrity` choice as cryptsetup understands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityAlgorithm {
    /// Kernel name stored in the LUKS2 segment (`hmac(sha256)`, `aead`, `poly1305`).
    pub kernel_name: String,
    /// Default integrity key size in bytes (0 for AEAD modes, whose cipher authenticates).
    pub default_key_size: usize,
    /// Authentication tag bytes per sector.
    pub auth_tag_size: u32,
}

impl IntegrityAlgorithm {
    /// Parses a cryptsetup `--integrity` name (`hmac-sha256`, `hmac-sha512`, `hmac-sha1`,
    /// `cmac-aes`, `aead`, `poly1305`) or the kernel spelling a header stores
    /// (`hmac(sha256)`).
    pub fn from_name(name: &str) -> Result<Self> {
        let (kernel, key, tag) = match name {
            "hmac-sha1" | "hmac(sha1)" => ("hmac(sha1)", 20, 20),
            "hmac-sha256" | "hmac(sha256)" => ("hmac(sha256)", 32, 32),
            "hmac-sha512" | "hmac(sha512)" => ("hmac(sha512)", 64, 64),
            "cmac-aes" | "cmac(aes)" => ("cmac(aes)", 16, 16),
            "aead" => ("aead", 0, 16),
            "poly1305" => ("poly1305", 0, 16),
            other => {
                return Err(FormatError::Unsupported(format!(
                    "No known integrity specification pattern detected ('{other}'; cryptblk \
                     supports hmac-sha1, hmac-sha256, hmac-sha512, cmac-aes, aead, poly1305)."
                )))
            }
        };
        Ok(IntegrityAlgorithm {
            kernel_name: kernel.into(),
            default_key_size: key,
            auth_tag_size: tag,
        })
    }

    /// True for keyed MACs that dm-crypt runs as `authenc(<mac>,<cipher>)`.
    pub fn is_authenc(&self) -> bool {
        self.default_key_size > 0
    }

    /// The integrity key size for `--integrity-key-size` bytes (`None` = default). Only
    /// keyed MACs take a key; any non-zero size up to 512 bytes is accepted for them.
    pub fn key_size(&self, requested: Option<usize>) -> Result<usize> {
        match requested {
            None => Ok(self.default_key_size),
            Some(n) if self.is_authenc() && n > 0 && n <= 512 => Ok(n),
            Some(n) => Err(FormatError::InvalidParameter(format!(
                "Cannot use specified integrity key size ({} bits for {}).",
                n * 8,
                self.kernel_name
            ))),
        }
    }
}

/// A cipher specification split the way cryptsetup splits it (`aes`, `xts`, `random`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityCipher {
    /// Cipher name (`aes`, `chacha20`, `aegis128`).
    pub cipher: String,
    /// Chaining mode (`xts`, `cbc`, `gcm`, `ccm`), empty for stream/AEAD primitives.
    pub chain: String,
    /// IV generator (`plain64`, `random`, `essiv:sha256`).
    pub iv: String,
}

impl IntegrityCipher {
    /// Parses `aes-xts-plain64`, `aes-gcm-random`, `chacha20-random`, `aegis128-random`.
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = || {
            FormatError::InvalidParameter(format!(
                "No known cipher specification pattern detected for '{spec}'."
            ))
        };
        let mut parts = spec.splitn(3, '-');
        let cipher = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
        let second = parts.next().ok_or_else(bad)?;
        let (chain, iv) = match parts.next() {
            Some(iv) => (second, iv),
            None => ("", second),
        };
        if spec.starts_with("capi:") || iv.is_empty() {
            return Err(bad());
        }
        Ok(IntegrityCipher {
            cipher: cipher.into(),
            chain: chain.into(),
            iv: iv.into(),
        })
    }

    /// True when the mode itself authenticates (GCM, CCM, AEGIS, ChaCha20-Poly1305).
    fn is_aead_mode(&self) -> bool {
        matches!(self.chain.as_str(), "gcm" | "ccm")
            || self.cipher.starts_with("aegis")
            || self.cipher == "chacha20"
    }

    /// IV bytes stored in the tag (cryptsetup's `INTEGRITY_tag_size` rules).
    fn stored_iv_size(&self, alg: &IntegrityAlgorithm) -> u32 {
        if self.iv != "random" {
            return 0;
        }
        if alg.kernel_name == "poly1305" {
            return 12;
        }
        match (self.cipher.as_str(), self.chain.as_str()) {
            (_, "xts") => 16,
            (_, "gcm") => 12,
            (_, "ccm") => 8,
            (_, "ctr") => 16,
            ("aegis256", _) => 32,
            _ => 16,
        }
    }

    /// Encryption key sizes (bytes) the kernel accepts for this cipher.
    fn key_sizes(&self) -> &'static [usize] {
        match (self.cipher.as_str(), self.chain.as_str()) {
            ("aes", "xts") => &[32, 48, 64],
            ("aes", "ccm") => &[19, 27, 35],
            ("aes", _) => &[16, 24, 32],
            ("chacha20", _) => &[32],
            ("aegis128", _) => &[16],
            ("aegis256", _) => &[32],
            ("serpent" | "twofish", "xts") => &[32, 48, 64],
            ("serpent" | "twofish", _) => &[16, 24, 32],
            _ => &[],
        }
    }

    /// The kernel crypto API name of the cipher part (`xts(aes)`, `gcm(aes)`).
    fn kernel_mode(&self) -> String {
        match (self.cipher.as_str(), self.chain.as_str()) {
            ("aes", "ccm") => "rfc4309(ccm(aes))".into(),
            (c, "") => c.to_string(),
            (c, m) => format!("{m}({c})"),
        }
    }
}

/// Tag bytes per sector for `cipher` with `alg` (authentication tag + stored IV).
pub fn tag_size(alg: &IntegrityAlgorithm, cipher: &IntegrityCipher) -> u32 {
    alg.auth_tag_size + cipher.stored_iv_size(alg)
}

/// Checks that `cipher` with `enc_key_size` bytes can run under `alg`, with cryptsetup-
/// style messages, and returns the dm-crypt cipher string in the kernel's `capi:` form
/// (`capi:authenc(hmac(sha256),xts(aes))-plain64`, `capi:gcm(aes)-random`,
/// `capi:rfc7539(chacha20,poly1305)-random`).
pub fn dm_cipher(
    alg: &IntegrityAlgorithm,
    cipher: &IntegrityCipher,
    enc_key_size: usize,
) -> Result<String> {
    let spec = format!(
        "{}{}{}-{}",
        cipher.cipher,
        if cipher.chain.is_empty() { "" } else { "-" },
        cipher.chain,
        cipher.iv
    );
    let sizes = cipher.key_sizes();
    if sizes.is_empty() {
        return Err(FormatError::Unsupported(format!(
            "Cipher {spec} is not supported with integrity protection."
        )));
    }
    if !sizes.contains(&enc_key_size) {
        return Err(FormatError::InvalidParameter(format!(
            "Invalid key size {} bits for cipher {spec} (valid: {}).",
            enc_key_size * 8,
            sizes
                .iter()
                .map(|s| (s * 8).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mode = match alg.kernel_name.as_str() {
        "aead" => {
            if !cipher.is_aead_mode() || cipher.cipher == "chacha20" {
                return Err(FormatError::Unsupported(format!(
                    "Integrity aead needs an AEAD cipher mode (aes-gcm-random, \
                     aes-ccm-random, aegis128-random), not {spec}."
                )));
            }
            cipher.kernel_mode()
        }
        "poly1305" => {
            if cipher.cipher != "chacha20" || !cipher.chain.is_empty() {
                return Err(FormatError::Unsupported(format!(
                    "Integrity poly1305 needs a chacha20 cipher (chacha20-random, \
                     chacha20-plain64), not {spec}."
                )));
            }
            "rfc7539(chacha20,poly1305)".into()
        }
        mac => {
            if cipher.is_aead_mode() {
                return Err(FormatError::Unsupported(format!(
                    "Cipher {spec} already authenticates: use --integrity aead."
                )));
            }
            format!("authenc({mac},{})", cipher.kernel_mode())
        }
    };
    if cipher.iv != "random" && cipher.iv != "plain64" && !cipher.iv.starts_with("essiv:") {
        return Err(FormatError::Unsupported(format!(
            "IV mode {} is not supported with integrity protection.",
            cipher.iv
        )));
    }
    Ok(format!("capi:{mode}-{}", cipher.iv))
}

/// The `integrity` object of a LUKS2 crypt segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentIntegrity {
    /// Kernel integrity name (`hmac(sha256)`, `aead`, `poly1305`).
    pub kind: String,
    /// Journal encryption (`none`: cryptsetup never sets one for LUKS2).
    pub journal_encryption: String,
    /// Journal integrity (`none`).
    pub journal_integrity: String,
    /// Integrity key size in bytes when not the algorithm's default (cryptsetup 2.7's
    /// optional `key_size`).
    pub key_size: Option<usize>,
}

impl SegmentIntegrity {
    /// The object for a new segment.
    pub fn new(alg: &IntegrityAlgorithm, key_size: usize) -> Self {
        SegmentIntegrity {
            kind: alg.kernel_name.clone(),
            journal_encryption: "none".into(),
            journal_integrity: "none".into(),
            key_size: (key_size != alg.default_key_size).then_some(key_size),
        }
    }

    /// Reads the object from segment JSON.
    pub fn from_json(v: &Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        Some(SegmentIntegrity {
            kind: s("type")?,
            journal_encryption: s("journal_encryption")?,
            journal_integrity: s("journal_integrity")?,
            key_size: v
                .get("key_size")
                .and_then(Value::as_u64)
                .map(|n| n as usize),
        })
    }

    /// The object as cryptsetup writes it (key order included).
    pub fn to_json(&self) -> Value {
        let mut o = json!({
            "type": self.kind,
            "journal_encryption": self.journal_encryption,
            "journal_integrity": self.journal_integrity,
        });
        if let Some(k) = self.key_size {
            o["key_size"] = json!(k);
        }
        o
    }
}

/// Where and how an integrity-protected LUKS2 segment lives on the data device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityLayout {
    /// Byte offset of the dm-integrity superblock (= the segment offset).
    pub superblock_offset: u64,
    /// Tag bytes per sector.
    pub tag_size: u32,
    /// Encryption (and integrity block) sector size.
    pub sector_size: u32,
    /// Encryption key bytes (the first part of the volume key).
    pub encryption_key_size: usize,
    /// Integrity key bytes (the rest of the volume key).
    pub integrity_key_size: usize,
    /// dm-crypt cipher string (`capi:` form).
    pub dm_cipher: String,
    /// IV offset in 512-byte sectors.
    pub iv_tweak: u64,
    /// The segment's integrity object.
    pub integrity: SegmentIntegrity,
}

/// Journal size, in sectors, that the kernel chooses when formatting a device of
/// `device_size` bytes (cryptsetup passes no journal size for LUKS2).
pub fn default_journal_sectors(device_size: u64) -> u64 {
    ((device_size / 512) >> 7).min(MAX_JOURNAL_SECTORS)
}

impl IntegrityLayout {
    /// The layout for a segment with `integrity`, cipher `encryption` and a volume key of
    /// `vk_size` bytes.
    pub fn new(
        integrity: SegmentIntegrity,
        encryption: &str,
        vk_size: usize,
        offset: u64,
        sector_size: u32,
        iv_tweak: u64,
    ) -> Result<Self> {
        let alg = IntegrityAlgorithm::from_name(&integrity.kind)?;
        let cipher = IntegrityCipher::parse(encryption)?;
        let ikey = alg.key_size(integrity.key_size)?;
        let enc = vk_size
            .checked_sub(ikey)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                FormatError::Corrupt(format!(
                    "volume key of {vk_size} bytes cannot hold a {ikey}-byte integrity key"
                ))
            })?;
        let dm_cipher = dm_cipher(&alg, &cipher, enc)?;
        if !offset.is_multiple_of(512) {
            return Err(FormatError::InvalidParameter(format!(
                "integrity segment offset {offset} is not sector aligned"
            )));
        }
        Ok(IntegrityLayout {
            superblock_offset: offset,
            tag_size: tag_size(&alg, &cipher),
            sector_size,
            encryption_key_size: enc,
            integrity_key_size: ikey,
            dm_cipher,
            iv_tweak,
            integrity,
        })
    }

    /// Refuses a superblock that does not belong to this segment.
    pub fn check_superblock(&self, sb: &IntegritySuperblock) -> Result<()> {
        if u32::from(sb.integrity_tag_size) != self.tag_size {
            return Err(FormatError::Corrupt(format!(
                "integrity superblock tag size {} does not match the segment's {}",
                sb.integrity_tag_size, self.tag_size
            )));
        }
        if sb.sector_size() != self.sector_size {
            return Err(FormatError::Corrupt(format!(
                "integrity superblock block size {} does not match the segment's sector size {}",
                sb.sector_size(),
                self.sector_size
            )));
        }
        Ok(())
    }
}

impl Luks2Header {
    /// The integrity object of the default segment, if it has one.
    pub fn segment_integrity(&self) -> Option<SegmentIntegrity> {
        let seg = self.default_segment().ok()?;
        let v = self.json["segments"].get(seg.id.to_string())?;
        SegmentIntegrity::from_json(v.get("integrity")?)
    }

    /// The data layout of the default segment when it is integrity protected (`None` for
    /// plain dm-crypt segments).
    pub fn integrity_layout(&self) -> Result<Option<IntegrityLayout>> {
        if self.segment_integrity().is_none() {
            return Ok(None);
        }
        let vk_size = self
            .volume_key_size()
            .ok_or_else(|| FormatError::Corrupt("no keyslot tells the volume key size".into()))?;
        self.integrity_layout_for_key(vk_size)
    }

    /// [`Luks2Header::integrity_layout`] for a volume key of `vk_size` bytes known from
    /// elsewhere (`--volume-key-file` on a header without keyslots).
    pub fn integrity_layout_for_key(&self, vk_size: usize) -> Result<Option<IntegrityLayout>> {
        self.check_requirements()?;
        let seg = self.default_segment()?;
        let Some(integrity) = self.segment_integrity() else {
            return Ok(None);
        };
        if integrity.journal_encryption != "none" || integrity.journal_integrity != "none" {
            return Err(FormatError::Unsupported(format!(
                "integrity journal encryption/integrity ({}/{}) is not supported",
                integrity.journal_encryption, integrity.journal_integrity
            )));
        }
        IntegrityLayout::new(
            integrity,
            &seg.encryption,
            vk_size,
            seg.offset,
            seg.sector_size,
            seg.iv_tweak,
        )
        .map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(cipher: &str, integ: &str, vk: usize) -> IntegrityLayout {
        let alg = IntegrityAlgorithm::from_name(integ).unwrap();
        let si = SegmentIntegrity::new(&alg, alg.default_key_size);
        IntegrityLayout::new(si, cipher, vk, 4 << 20, 512, 0).unwrap()
    }

    #[test]
    fn tag_sizes_follow_cryptsetup() {
        assert_eq!(layout("aes-xts-plain64", "hmac-sha256", 64).tag_size, 32);
        assert_eq!(layout("aes-xts-random", "hmac-sha256", 64).tag_size, 48);
        assert_eq!(
            layout("aes-cbc-essiv:sha256", "hmac-sha512", 96).tag_size,
            64
        );
        assert_eq!(layout("aes-xts-plain64", "hmac-sha1", 84).tag_size, 20);
        assert_eq!(layout("aes-gcm-random", "aead", 16).tag_size, 28);
        assert_eq!(layout("aes-ccm-random", "aead", 19).tag_size, 24);
        assert_eq!(layout("chacha20-random", "poly1305", 32).tag_size, 28);
        assert_eq!(layout("chacha20-plain64", "poly1305", 32).tag_size, 16);
        assert_eq!(layout("aegis128-random", "aead", 16).tag_size, 32);
    }

    #[test]
    fn kernel_cipher_names() {
        assert_eq!(
            layout("aes-xts-plain64", "hmac-sha256", 64).dm_cipher,
            "capi:authenc(hmac(sha256),xts(aes))-plain64"
        );
        assert_eq!(
            layout("aes-cbc-essiv:sha256", "hmac-sha256", 48).dm_cipher,
            "capi:authenc(hmac(sha256),cbc(aes))-essiv:sha256"
        );
        assert_eq!(
            layout("aes-gcm-random", "aead", 32).dm_cipher,
            "capi:gcm(aes)-random"
        );
        assert_eq!(
            layout("chacha20-random", "poly1305", 32).dm_cipher,
            "capi:rfc7539(chacha20,poly1305)-random"
        );
        assert_eq!(
            layout("aes-ccm-random", "aead", 19).dm_cipher,
            "capi:rfc4309(ccm(aes))-random"
        );
    }

    #[test]
    fn bad_combinations_are_refused() {
        let hmac = IntegrityAlgorithm::from_name("hmac-sha256").unwrap();
        let gcm = IntegrityCipher::parse("aes-gcm-random").unwrap();
        assert!(dm_cipher(&hmac, &gcm, 16).is_err());
        let aead = IntegrityAlgorithm::from_name("aead").unwrap();
        let xts = IntegrityCipher::parse("aes-xts-plain64").unwrap();
        assert!(dm_cipher(&aead, &xts, 64).is_err());
        assert!(dm_cipher(&hmac, &xts, 20).is_err());
        assert!(IntegrityAlgorithm::from_name("crc32c").is_err());
    }
}
