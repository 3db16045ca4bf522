//! The 4096-byte binary part of a LUKS2 header copy, and its checksum.
//!
//! Layout (all integers big-endian), as in the LUKS2 on-disk format specification:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 6 | magic `LUKS\xba\xbe` (primary) or `SKUL\xba\xbe` (secondary) |
//! | 6 | 2 | version (2) |
//! | 8 | 8 | hdr_size: binary header + JSON area |
//! | 16 | 8 | seqid |
//! | 24 | 48 | label (NUL-terminated) |
//! | 72 | 32 | checksum_alg (e.g. `sha256`) |
//! | 104 | 64 | salt (unique per copy) |
//! | 168 | 40 | uuid |
//! | 208 | 48 | subsystem |
//! | 256 | 8 | hdr_offset: where this copy lives |
//! | 264 | 184 | padding |
//! | 448 | 64 | csum over the whole hdr_size area with this field zeroed |
//! | 512 | 3584 | padding |

use crate::error::{FormatError, Result};
use cryptblk_cipher::hash::HashAlgorithm;

/// Size of the binary header.
pub const BIN_HDR_LEN: usize = 4096;
/// Magic of the primary copy.
pub const MAGIC_PRIMARY: &[u8; 6] = b"LUKS\xba\xbe";
/// Magic of the secondary copy.
pub const MAGIC_SECONDARY: &[u8; 6] = b"SKUL\xba\xbe";
/// The metadata (header copy) sizes LUKS2 allows; also the offsets probed for a secondary copy.
pub const METADATA_SIZES: [u64; 9] = [
    0x4000, 0x8000, 0x10000, 0x20000, 0x40000, 0x80000, 0x100000, 0x200000, 0x400000,
];
/// Largest metadata size (4 MiB).
pub const METADATA_SIZE_MAX: u64 = 0x400000;
/// Largest keyslots area cryptsetup accepts (128 MiB).
pub const KEYSLOTS_SIZE_MAX: u64 = 0x800_0000;

const OFF_VERSION: usize = 6;
const OFF_HDR_SIZE: usize = 8;
const OFF_SEQID: usize = 16;
const OFF_LABEL: usize = 24;
const OFF_CSUM_ALG: usize = 72;
const OFF_SALT: usize = 104;
const OFF_UUID: usize = 168;
const OFF_SUBSYSTEM: usize = 208;
const OFF_HDR_OFFSET: usize = 256;
const OFF_CSUM: usize = 448;
const LABEL_LEN: usize = 48;
const CSUM_ALG_LEN: usize = 32;
const SALT_LEN: usize = 64;
const UUID_LEN: usize = 40;
const CSUM_LEN: usize = 64;

/// True when `size` is one of the allowed metadata sizes.
pub fn is_valid_metadata_size(size: u64) -> bool {
    METADATA_SIZES.contains(&size)
}

/// The decoded fields of one binary header copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinaryHeader {
    /// True for the secondary copy (magic `SKUL\xba\xbe`).
    pub secondary: bool,
    /// Header format version (2).
    pub version: u16,
    /// Binary header plus JSON area, in bytes.
    pub hdr_size: u64,
    /// Sequence id, increased on every update.
    pub seqid: u64,
    /// Label (up to 47 bytes).
    pub label: String,
    /// Checksum hash name.
    pub checksum_alg: String,
    /// Per-copy salt.
    pub salt: [u8; SALT_LEN],
    /// Volume UUID text.
    pub uuid: String,
    /// Subsystem label (up to 47 bytes).
    pub subsystem: String,
    /// Offset of this copy on the device.
    pub hdr_offset: u64,
}

fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// Reads a NUL-terminated string from a fixed field; the last byte is always treated as a
/// terminator, as cryptsetup does.
fn cstr(field: &[u8]) -> String {
    let field = &field[..field.len() - 1];
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn put_cstr(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

impl BinaryHeader {
    /// Decodes and sanity-checks the binary header found at device offset `offset`, as the
    /// primary or secondary copy. Checks magic, version, that `hdr_offset` equals `offset`,
    /// the size range, and that a secondary copy sits right after a copy of its own size.
    pub fn decode(buf: &[u8], offset: u64, secondary: bool) -> Result<Self> {
        if buf.len() < BIN_HDR_LEN {
            return Err(FormatError::Corrupt(
                "LUKS2 binary header is truncated".into(),
            ));
        }
        let magic = if secondary {
            MAGIC_SECONDARY
        } else {
            MAGIC_PRIMARY
        };
        if &buf[..6] != magic {
            return Err(FormatError::NotLuks);
        }
        let version = u16::from_be_bytes([buf[OFF_VERSION], buf[OFF_VERSION + 1]]);
        if version != 2 {
            return Err(FormatError::UnsupportedVersion(version.into()));
        }
        let hdr_offset = be64(buf, OFF_HDR_OFFSET);
        if hdr_offset != offset {
            return Err(FormatError::Corrupt(format!(
                "LUKS2 header at offset {offset} claims offset {hdr_offset}"
            )));
        }
        let hdr_size = be64(buf, OFF_HDR_SIZE);
        if !(METADATA_SIZES[0]..=METADATA_SIZE_MAX).contains(&hdr_size) {
            return Err(FormatError::Corrupt(format!(
                "LUKS2 header has bogus size {hdr_size}"
            )));
        }
        if secondary && offset != hdr_size {
            return Err(FormatError::Corrupt(format!(
                "secondary LUKS2 header at offset {offset} does not match its size {hdr_size}"
            )));
        }
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&buf[OFF_SALT..OFF_SALT + SALT_LEN]);
        Ok(BinaryHeader {
            secondary,
            version,
            hdr_size,
            seqid: be64(buf, OFF_SEQID),
            label: cstr(&buf[OFF_LABEL..OFF_LABEL + LABEL_LEN]),
            checksum_alg: cstr(&buf[OFF_CSUM_ALG..OFF_CSUM_ALG + CSUM_ALG_LEN]),
            salt,
            uuid: cstr(&buf[OFF_UUID..OFF_UUID + UUID_LEN]),
            subsystem: cstr(&buf[OFF_SUBSYSTEM..OFF_SUBSYSTEM + LABEL_LEN]),
            hdr_offset,
        })
    }

    /// Encodes the binary header with a zero checksum field.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BIN_HDR_LEN];
        b[..6].copy_from_slice(if self.secondary {
            MAGIC_SECONDARY
        } else {
            MAGIC_PRIMARY
        });
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&self.version.to_be_bytes());
        b[OFF_HDR_SIZE..OFF_HDR_SIZE + 8].copy_from_slice(&self.hdr_size.to_be_bytes());
        b[OFF_SEQID..OFF_SEQID + 8].copy_from_slice(&self.seqid.to_be_bytes());
        put_cstr(&mut b[OFF_LABEL..OFF_LABEL + LABEL_LEN], &self.label);
        put_cstr(
            &mut b[OFF_CSUM_ALG..OFF_CSUM_ALG + CSUM_ALG_LEN],
            &self.checksum_alg,
        );
        b[OFF_SALT..OFF_SALT + SALT_LEN].copy_from_slice(&self.salt);
        put_cstr(&mut b[OFF_UUID..OFF_UUID + UUID_LEN], &self.uuid);
        put_cstr(
            &mut b[OFF_SUBSYSTEM..OFF_SUBSYSTEM + LABEL_LEN],
            &self.subsystem,
        );
        b[OFF_HDR_OFFSET..OFF_HDR_OFFSET + 8].copy_from_slice(&self.hdr_offset.to_be_bytes());
        b
    }
}

/// Computes the checksum of a whole header copy (`area` = binary header + JSON area) with the
/// checksum field treated as zero.
pub fn checksum(alg: &str, area: &[u8]) -> Result<Vec<u8>> {
    let hash = HashAlgorithm::from_name(alg)?;
    if hash.output_len() > CSUM_LEN || area.len() < BIN_HDR_LEN {
        return Err(FormatError::Corrupt(format!(
            "unusable header checksum algorithm '{alg}'"
        )));
    }
    let zeros = [0u8; CSUM_LEN];
    Ok(hash.digest(&[&area[..OFF_CSUM], &zeros, &area[OFF_CSUM + CSUM_LEN..]]))
}

/// Verifies the stored checksum of a whole header copy.
pub fn verify_checksum(alg: &str, area: &[u8]) -> Result<()> {
    let expected = checksum(alg, area)?;
    if area[OFF_CSUM..OFF_CSUM + expected.len()] != expected[..] {
        return Err(FormatError::Corrupt(
            "LUKS2 header checksum mismatch".into(),
        ));
    }
    Ok(())
}

/// Stores the checksum of `area` into its checksum field.
pub fn seal(alg: &str, area: &mut [u8]) -> Result<()> {
    let sum = checksum(alg, area)?;
    area[OFF_CSUM..OFF_CSUM + CSUM_LEN].fill(0);
    area[OFF_CSUM..OFF_CSUM + sum.len()].copy_from_slice(&sum);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BinaryHeader {
        BinaryHeader {
            secondary: false,
            version: 2,
            hdr_size: 0x4000,
            seqid: 7,
            label: "lbl".into(),
            checksum_alg: "sha256".into(),
            salt: [3u8; 64],
            uuid: "12a3a118-7039-4575-a649-3f559d8d87ee".into(),
            subsystem: "sub".into(),
            hdr_offset: 0,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let h = sample();
        let b = h.encode();
        assert_eq!(&b[..6], b"LUKS\xba\xbe");
        assert_eq!(BinaryHeader::decode(&b, 0, false).unwrap(), h);
        assert!(BinaryHeader::decode(&b, 4096, false).is_err());
        assert!(matches!(
            BinaryHeader::decode(&b, 0, true),
            Err(FormatError::NotLuks)
        ));
    }

    #[test]
    fn checksum_detects_any_change() {
        let mut area = sample().encode();
        area.resize(0x4000, 0);
        area[4096] = b'{';
        seal("sha256", &mut area).unwrap();
        verify_checksum("sha256", &area).unwrap();
        area[5000] = 1;
        assert!(verify_checksum("sha256", &area).is_err());
    }

    #[test]
    fn long_label_is_truncated_with_terminator() {
        let mut h = sample();
        h.label = "x".repeat(60);
        let d = BinaryHeader::decode(&h.encode(), 0, false).unwrap();
        assert_eq!(d.label.len(), 47);
    }
}
