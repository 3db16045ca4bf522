//! The LUKS1 partition header (`phdr`): 592 big-endian bytes at offset 0, its validation and
//! its serialisation. Hand-written: a fixed on-disk layout (LUKS1 On-Disk Format
//! Specification 1.2.3) with cryptsetup's sanity rules.

use crate::af::{self, LUKS_STRIPES};
use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;

/// Size of the on-disk header structure.
pub const LUKS1_HEADER_SIZE: usize = 592;
/// `"LUKS\xba\xbe"`.
pub const LUKS1_MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
/// Number of keyslots.
pub const LUKS1_NUM_KEYSLOTS: usize = 8;
/// `active` value of an enabled keyslot.
pub const KEYSLOT_ENABLED: u32 = 0x00AC_71F3;
/// `active` value of a disabled keyslot.
pub const KEYSLOT_DISABLED: u32 = 0x0000_DEAD;
/// Length of the volume key digest (SHA-1 sized, whatever the hash).
pub const LUKS1_DIGEST_SIZE: usize = 20;
/// Length of salts.
pub const LUKS1_SALT_SIZE: usize = 32;
/// First keyslot alignment: keyslots start at 4096 bytes (8 sectors) in cryptsetup >= 1.1.
pub const LUKS1_KEYSLOTS_ALIGN_SECTORS: u32 = 8;

const CIPHER_NAME_LEN: usize = 32;
const CIPHER_MODE_LEN: usize = 32;
const HASH_SPEC_LEN: usize = 32;
const UUID_LEN: usize = 40;
const KEYSLOTS_AT: usize = 208;
const KEYSLOT_LEN: usize = 48;

/// The state of one keyslot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyslotState {
    /// Holds a key.
    Enabled,
    /// Free.
    Disabled,
    /// Neither marker: damaged metadata (never tried, never overwritten).
    Invalid(u32),
}

/// One of the eight keyslot descriptors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Luks1Keyslot {
    /// Raw `active` marker ([`KEYSLOT_ENABLED`] / [`KEYSLOT_DISABLED`]).
    pub active: u32,
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: [u8; LUKS1_SALT_SIZE],
    /// Start of the key material, in 512-byte sectors from the header start.
    pub key_material_offset: u32,
    /// Anti-forensic stripe count (always 4000).
    pub stripes: u32,
}

impl Luks1Keyslot {
    /// Decoded `active` marker.
    pub fn state(&self) -> KeyslotState {
        match self.active {
            KEYSLOT_ENABLED => KeyslotState::Enabled,
            KEYSLOT_DISABLED => KeyslotState::Disabled,
            other => KeyslotState::Invalid(other),
        }
    }

    /// True for an enabled slot.
    pub fn is_enabled(&self) -> bool {
        self.active == KEYSLOT_ENABLED
    }
}

/// A parsed, validated LUKS1 header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Luks1Header {
    /// Cipher name (`aes`, `serpent`, `cipher_null`, ...).
    pub cipher_name: String,
    /// Cipher mode with IV generator (`xts-plain64`, `cbc-essiv:sha256`, ...).
    pub cipher_mode: String,
    /// Hash for PBKDF2, the digest and the AF splitter.
    pub hash_spec: String,
    /// Data start in 512-byte sectors (0 for a detached header without data offset).
    pub payload_offset: u32,
    /// Volume key length in bytes.
    pub key_bytes: u32,
    /// PBKDF2(volume key) truncated to 20 bytes.
    pub mk_digest: [u8; LUKS1_DIGEST_SIZE],
    /// Salt of the digest.
    pub mk_digest_salt: [u8; LUKS1_SALT_SIZE],
    /// Iterations of the digest.
    pub mk_digest_iterations: u32,
    /// Volume UUID (text form).
    pub uuid: String,
    /// The keyslot descriptors.
    pub keyslots: [Luks1Keyslot; LUKS1_NUM_KEYSLOTS],
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn text_field(b: &[u8], what: &str) -> Result<String> {
    // The last byte is always treated as NUL, as cryptsetup's loader forces it.
    let b = &b[..b.len() - 1];
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    std::str::from_utf8(&b[..end])
        .map(str::to_owned)
        .map_err(|_| FormatError::Corrupt(format!("{what} is not valid text")))
}

fn put_text(dst: &mut [u8], s: &str, what: &str) -> Result<()> {
    // One byte stays NUL, as cryptsetup's strncpy(.., L-1) leaves it.
    if s.len() >= dst.len() {
        return Err(FormatError::InvalidParameter(format!(
            "{what} '{s}' is longer than {} bytes",
            dst.len() - 1
        )));
    }
    dst[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
}

impl Luks1Header {
    /// True when `bytes` starts with the LUKS magic and version 1 (cheap probe, no checks).
    pub fn probe(bytes: &[u8]) -> bool {
        bytes.len() >= 8 && bytes[..6] == LUKS1_MAGIC && bytes[6..8] == [0, 1]
    }

    /// Parses and validates a header from at least [`LUKS1_HEADER_SIZE`] bytes, applying
    /// cryptsetup's loader rules (magic, version, hash, keyslot geometry). The device size
    /// check is separate: [`Luks1Header::check_device_size`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < LUKS1_HEADER_SIZE {
            return Err(FormatError::TooSmall(format!(
                "LUKS1 header needs {LUKS1_HEADER_SIZE} bytes, got {}",
                bytes.len()
            )));
        }
        if bytes[..6] != LUKS1_MAGIC {
            return Err(FormatError::NotLuks);
        }
        let version = u16::from_be_bytes([bytes[6], bytes[7]]);
        if version != 1 {
            return Err(FormatError::UnsupportedVersion(version as u32));
        }
        let mut keyslots: [Luks1Keyslot; LUKS1_NUM_KEYSLOTS] =
            std::array::from_fn(|_| Luks1Keyslot {
                active: 0,
                iterations: 0,
                salt: [0; LUKS1_SALT_SIZE],
                key_material_offset: 0,
                stripes: 0,
            });
        for (i, ks) in keyslots.iter_mut().enumerate() {
            let at = KEYSLOTS_AT + i * KEYSLOT_LEN;
            ks.active = be32(bytes, at);
            ks.iterations = be32(bytes, at + 4);
            ks.salt.copy_from_slice(&bytes[at + 8..at + 40]);
            ks.key_material_offset = be32(bytes, at + 40);
            ks.stripes = be32(bytes, at + 44);
        }
        let mut header = Luks1Header {
            cipher_name: text_field(&bytes[8..40], "cipher name")?,
            cipher_mode: text_field(&bytes[40..72], "cipher mode")?,
            hash_spec: text_field(&bytes[72..104], "hash spec")?,
            payload_offset: be32(bytes, 104),
            key_bytes: be32(bytes, 108),
            mk_digest: bytes[112..132].try_into().expect("20-byte field"),
            mk_digest_salt: bytes[132..164].try_into().expect("32-byte field"),
            mk_digest_iterations: be32(bytes, 164),
            uuid: String::new(),
            keyslots,
        };
        header.uuid = text_field(&bytes[168..208], "UUID")?;
        header.validate()?;
        Ok(header)
    }

    /// Checks the rules cryptsetup's LUKS1 loader enforces; the error names the first
    /// violation (keyslot and values).
    pub fn validate(&self) -> Result<()> {
        let hash = HashAlgorithm::from_name(&self.hash_spec).map_err(|_| {
            FormatError::Corrupt(format!(
                "Requested LUKS hash {} is not supported.",
                self.hash_spec
            ))
        })?;
        if hash.output_len() < LUKS1_DIGEST_SIZE {
            return Err(FormatError::Corrupt(format!(
                "Requested LUKS hash {} is not supported.",
                self.hash_spec
            )));
        }
        if self.key_bytes == 0 || self.key_bytes as usize * LUKS_STRIPES as usize > 0x100_0000 {
            return Err(FormatError::Corrupt(format!(
                "Invalid volume key size {} bytes.",
                self.key_bytes
            )));
        }
        let area = self.keyslot_sectors();
        for (i, ks) in self.keyslots.iter().enumerate() {
            if ks.stripes != LUKS_STRIPES {
                return Err(FormatError::Corrupt(format!(
                    "Invalid stripes count {} in keyslot {i}.",
                    ks.stripes
                )));
            }
            if (ks.key_material_offset as u64) * 512 < LUKS1_HEADER_SIZE as u64 {
                return Err(FormatError::Corrupt(format!(
                    "Invalid offset {} in keyslot {i}.",
                    ks.key_material_offset
                )));
            }
            // A detached header without data offset has nothing to protect.
            if self.payload_offset == 0 {
                continue;
            }
            if self.payload_offset <= ks.key_material_offset {
                return Err(FormatError::Corrupt(format!(
                    "Invalid offset {} in keyslot {i} (beyond data area offset {}).",
                    ks.key_material_offset, self.payload_offset
                )));
            }
            if (self.payload_offset as u64) < ks.key_material_offset as u64 + area {
                return Err(FormatError::Corrupt(format!(
                    "Invalid keyslot size {area} (offset {}, stripes {}) in keyslot {i} \
                     (beyond data area offset {}).",
                    ks.key_material_offset, ks.stripes, self.payload_offset
                )));
            }
        }
        let order = self.slots_by_offset();
        for pair in order.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            if (self.keyslots[next].key_material_offset as u64)
                < self.keyslots[prev].key_material_offset as u64 + area
            {
                return Err(FormatError::Corrupt(format!(
                    "Not enough space in LUKS keyslot {prev}."
                )));
            }
        }
        Ok(())
    }

    /// Keyslot indices sorted by key material offset (stable, as cryptsetup's insertion sort).
    fn slots_by_offset(&self) -> [usize; LUKS1_NUM_KEYSLOTS] {
        let mut order: [usize; LUKS1_NUM_KEYSLOTS] = std::array::from_fn(|i| i);
        order.sort_by_key(|&i| self.keyslots[i].key_material_offset);
        order
    }

    /// Sectors one keyslot's key material occupies.
    pub fn keyslot_sectors(&self) -> u64 {
        af::split_sectors(self.key_bytes as usize, LUKS_STRIPES)
    }

    /// Bytes the header plus all keyslot areas need (cryptsetup's `LUKS_device_sectors`).
    pub fn required_size(&self) -> u64 {
        let last = self
            .keyslots
            .iter()
            .map(|k| k.key_material_offset as u64)
            .max()
            .unwrap_or(0);
        (last + self.keyslot_sectors()) * 512
    }

    /// Fails with cryptsetup's "too small" message when the device cannot hold the keyslots.
    pub fn check_device_size(&self, device_size: u64) -> Result<()> {
        let need = self.required_size();
        if need > device_size {
            return Err(FormatError::TooSmall(format!(
                "LUKS1 requires at least {need} bytes, device has {device_size}."
            )));
        }
        Ok(())
    }

    /// The hash as an algorithm.
    pub fn hash(&self) -> Result<HashAlgorithm> {
        Ok(HashAlgorithm::from_name(&self.hash_spec)?)
    }

    /// dm-crypt cipher specification: `<cipher_name>-<cipher_mode>`.
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }

    /// Byte offset of the encrypted data.
    pub fn data_offset_bytes(&self) -> u64 {
        self.payload_offset as u64 * 512
    }

    /// Byte range `(offset, length)` of a keyslot's key material (whole sectors).
    pub fn keyslot_area(&self, slot: usize) -> (u64, u64) {
        let ks = &self.keyslots[slot];
        (
            ks.key_material_offset as u64 * 512,
            af::split_sectors(self.key_bytes as usize, ks.stripes) * 512,
        )
    }

    /// Serialises the header (592 bytes, every string NUL-padded).
    pub fn to_bytes(&self) -> Result<[u8; LUKS1_HEADER_SIZE]> {
        let mut b = [0u8; LUKS1_HEADER_SIZE];
        b[..6].copy_from_slice(&LUKS1_MAGIC);
        b[6..8].copy_from_slice(&1u16.to_be_bytes());
        put_text(
            &mut b[8..8 + CIPHER_NAME_LEN],
            &self.cipher_name,
            "cipher name",
        )?;
        put_text(
            &mut b[40..40 + CIPHER_MODE_LEN],
            &self.cipher_mode,
            "cipher mode",
        )?;
        put_text(&mut b[72..72 + HASH_SPEC_LEN], &self.hash_spec, "hash spec")?;
        b[104..108].copy_from_slice(&self.payload_offset.to_be_bytes());
        b[108..112].copy_from_slice(&self.key_bytes.to_be_bytes());
        b[112..132].copy_from_slice(&self.mk_digest);
        b[132..164].copy_from_slice(&self.mk_digest_salt);
        b[164..168].copy_from_slice(&self.mk_digest_iterations.to_be_bytes());
        put_text(&mut b[168..168 + UUID_LEN], &self.uuid, "UUID")?;
        for (i, ks) in self.keyslots.iter().enumerate() {
            let at = KEYSLOTS_AT + i * KEYSLOT_LEN;
            b[at..at + 4].copy_from_slice(&ks.active.to_be_bytes());
            b[at + 4..at + 8].copy_from_slice(&ks.iterations.to_be_bytes());
            b[at + 8..at + 40].copy_from_slice(&ks.salt);
            b[at + 40..at + 44].copy_from_slice(&ks.key_material_offset.to_be_bytes());
            b[at + 44..at + 48].copy_from_slice(&ks.stripes.to_be_bytes());
        }
        Ok(b)
    }

    /// True when `volume_key` matches the header's digest.
    pub fn verify_volume_key(&self, volume_key: &[u8]) -> Result<bool> {
        if volume_key.len() != self.key_bytes as usize {
            return Ok(false);
        }
        if self.mk_digest_iterations == 0 {
            return Err(FormatError::Corrupt(
                "volume key digest has 0 iterations".into(),
            ));
        }
        let mut digest = [0u8; LUKS1_DIGEST_SIZE];
        self.hash()?.pbkdf2(
            volume_key,
            &self.mk_digest_salt,
            self.mk_digest_iterations,
            &mut digest,
        );
        Ok(cryptblk_cipher::secret::ct_eq(&digest, &self.mk_digest))
    }

    /// Number of enabled keyslots.
    pub fn active_keyslots(&self) -> usize {
        self.keyslots.iter().filter(|k| k.is_enabled()).count()
    }

    /// `cryptsetup luksDump` text for this header on `device` (a path as the user gave it).
    pub fn dump(&self, device: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "LUKS header information for {device}\n");
        let _ = writeln!(s, "Version:       \t1");
        let _ = writeln!(s, "Cipher name:   \t{}", self.cipher_name);
        let _ = writeln!(s, "Cipher mode:   \t{}", self.cipher_mode);
        let _ = writeln!(s, "Hash spec:     \t{}", self.hash_spec);
        let _ = writeln!(s, "Payload offset:\t{}", self.payload_offset);
        let _ = writeln!(s, "MK bits:       \t{}", self.key_bytes * 8);
        let _ = writeln!(s, "MK digest:     \t{}", hex_spaced(&self.mk_digest));
        let _ = writeln!(
            s,
            "MK salt:       \t{}",
            hex_spaced(&self.mk_digest_salt[..16])
        );
        let _ = writeln!(
            s,
            "               \t{}",
            hex_spaced(&self.mk_digest_salt[16..])
        );
        let _ = writeln!(s, "MK iterations: \t{}", self.mk_digest_iterations);
        let _ = writeln!(s, "UUID:          \t{}\n", self.uuid);
        for (i, ks) in self.keyslots.iter().enumerate() {
            if ks.is_enabled() {
                let _ = writeln!(s, "Key Slot {i}: ENABLED");
                let _ = writeln!(s, "\tIterations:         \t{}", ks.iterations);
                let _ = writeln!(s, "\tSalt:               \t{}", hex_spaced(&ks.salt[..16]));
                let _ = writeln!(
                    s,
                    "\t                      \t{}",
                    hex_spaced(&ks.salt[16..])
                );
                let _ = writeln!(s, "\tKey material offset:\t{}", ks.key_material_offset);
                let _ = writeln!(s, "\tAF stripes:            \t{}", ks.stripes);
            } else {
                let _ = writeln!(s, "Key Slot {i}: DISABLED");
            }
        }
        s
    }
}

/// Bytes as lower-case hex pairs each followed by a space (cryptsetup's dump style).
pub(crate) fn hex_spaced(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x} ")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Luks1Header {
        Luks1Header {
            cipher_name: "aes".into(),
            cipher_mode: "xts-plain64".into(),
            hash_spec: "sha256".into(),
            payload_offset: 4096,
            key_bytes: 64,
            mk_digest: [1; 20],
            mk_digest_salt: [2; 32],
            mk_digest_iterations: 1000,
            uuid: "60b3a114-8449-4ba3-9c90-e836827479df".into(),
            keyslots: std::array::from_fn(|i| Luks1Keyslot {
                active: KEYSLOT_DISABLED,
                iterations: 0,
                salt: [0; 32],
                key_material_offset: 8 + 504 * i as u32, // cryptsetup's layout for 64-byte keys
                stripes: 4000,
            }),
        }
    }

    #[test]
    fn version_probe() {
        let b = sample().to_bytes().unwrap();
        assert_eq!(
            crate::luks_version(&crate::hdrio::MemIo::new(b.to_vec())).unwrap(),
            Some(1)
        );
        assert_eq!(
            crate::luks_version(&crate::hdrio::MemIo::new(vec![0; 4096])).unwrap(),
            None
        );
    }

    #[test]
    fn round_trip() {
        let h = sample();
        let b = h.to_bytes().unwrap();
        assert_eq!(Luks1Header::parse(&b).unwrap(), h);
        assert_eq!(h.required_size(), (8 + 504 * 7 + 500) * 512);
    }

    #[test]
    fn rejects_bad_magic_version_hash() {
        let mut b = sample().to_bytes().unwrap();
        b[7] = 2;
        assert!(matches!(
            Luks1Header::parse(&b),
            Err(FormatError::UnsupportedVersion(2))
        ));
        b[7] = 1;
        b[0] = b'X';
        assert!(matches!(Luks1Header::parse(&b), Err(FormatError::NotLuks)));
        let mut h = sample();
        h.hash_spec = "md4".into();
        let e = Luks1Header::parse(&h.to_bytes().unwrap()).unwrap_err();
        assert!(e.to_string().contains("hash md4"), "{e}");
    }

    #[test]
    fn rejects_overlap_and_payload_overwrite() {
        let mut h = sample();
        h.keyslots[3].key_material_offset = h.keyslots[2].key_material_offset + 10;
        let e = h.validate().unwrap_err().to_string();
        assert!(e.contains("Not enough space in LUKS keyslot 2"), "{e}");
        let mut h = sample();
        h.keyslots[7].key_material_offset = 4000;
        let e = h.validate().unwrap_err().to_string();
        assert!(e.contains("beyond data area offset 4096"), "{e}");
    }
}
