//! The dm-integrity superblock (first 4096 bytes of the metadata device at `<start>`).
//!
//! Layout (kernel `Documentation/admin-guide/device-mapper/dm-integrity.rst`, all little
//! endian): magic `"integrt\0"`, version u8, log2_interleave_sectors u8,
//! integrity_tag_size u16, journal_sections u32, provided_data_sectors u64, flags u32,
//! log2_sectors_per_block u8, log2_blocks_per_bitmap_bit u8, pad[2], recalc_sector u64,
//! pad[8], salt[16]; the rest of the 8-sector area is zero.

use std::io;

/// Bytes reserved for the superblock (`SB_SECTORS` = 8).
pub const SUPERBLOCK_BYTES: usize = 4096;
/// Superblock magic.
pub const MAGIC: &[u8; 8] = b"integrt\0";
/// A journal MAC is in use.
pub const FLAG_HAVE_JOURNAL_MAC: u32 = 0x1;
/// Tags are being recalculated; `recalc_sector` says how far.
pub const FLAG_RECALCULATING: u32 = 0x2;
/// Bitmap mode left dirty bits.
pub const FLAG_DIRTY_BITMAP: u32 = 0x4;
/// Metadata runs padded to 4 KiB instead of the legacy 128 KiB.
pub const FLAG_FIXED_PADDING: u32 = 0x8;
/// HMACs cover the superblock salt and sector numbers (`fix_hmac`).
pub const FLAG_FIXED_HMAC: u32 = 0x10;

/// The decoded superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Superblock {
    /// Format version 1..=5 (derived from the features in use when written).
    pub version: u8,
    /// log2 of the data sectors between metadata runs (0 with a separate metadata device).
    pub log2_interleave_sectors: u8,
    /// Bytes of tag per block.
    pub integrity_tag_size: u16,
    /// Number of journal sections.
    pub journal_sections: u32,
    /// Sectors the device exposes.
    pub provided_data_sectors: u64,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// log2 of 512-byte sectors per block.
    pub log2_sectors_per_block: u8,
    /// log2 of blocks per bitmap bit (bitmap mode).
    pub log2_blocks_per_bitmap_bit: u8,
    /// Recalculation progress.
    pub recalc_sector: u64,
    /// Salt mixed into HMACs with `FLAG_FIXED_HMAC`.
    pub salt: [u8; 16],
}

impl Superblock {
    /// Decodes a superblock; `Ok(None)` when the magic is absent.
    pub fn parse(b: &[u8]) -> io::Result<Option<Self>> {
        if b.len() < 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "superblock too short",
            ));
        }
        if &b[0..8] != MAGIC {
            return Ok(None);
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Ok(Some(Superblock {
            version: b[8],
            log2_interleave_sectors: b[9],
            integrity_tag_size: u16::from_le_bytes([b[10], b[11]]),
            journal_sections: u32_at(12),
            provided_data_sectors: u64_at(16),
            flags: u32_at(24),
            log2_sectors_per_block: b[28],
            log2_blocks_per_bitmap_bit: b[29],
            recalc_sector: u64_at(32),
            salt: b[48..64].try_into().expect("16 bytes"),
        }))
    }

    /// Encodes the superblock into a zero-padded 4096-byte area.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8] = self.version;
        b[9] = self.log2_interleave_sectors;
        b[10..12].copy_from_slice(&self.integrity_tag_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.journal_sections.to_le_bytes());
        b[16..24].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        b[24..28].copy_from_slice(&self.flags.to_le_bytes());
        b[28] = self.log2_sectors_per_block;
        b[29] = self.log2_blocks_per_bitmap_bit;
        b[32..40].copy_from_slice(&self.recalc_sector.to_le_bytes());
        b[48..64].copy_from_slice(&self.salt);
        b
    }

    /// Sets `version` from the features in use, as the kernel does before each write.
    pub fn set_version(&mut self, bitmap_mode: bool, meta_dev: bool) {
        self.version = if self.flags & FLAG_FIXED_HMAC != 0 {
            5
        } else if self.flags & FLAG_FIXED_PADDING != 0 {
            4
        } else if bitmap_mode || self.flags & FLAG_DIRTY_BITMAP != 0 {
            3
        } else if meta_dev || self.flags & FLAG_RECALCULATING != 0 {
            2
        } else {
            1
        };
    }
}
