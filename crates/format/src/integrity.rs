//! Standalone dm-integrity volumes as `integritysetup` sees them: the superblock (for
//! `dump`), the format defaults, and the kernel table line that opens or formats them.
//!
//! As with the kernel, formatting is done by the `integrity` target itself when its table
//! is loaded over an all-zero superblock area (see `cryptblk_dm::targets::integrity`);
//! `integritysetup format` clears that area and lets the kernel write the superblock and
//! journal. This module therefore only reads superblocks and builds table lines.
//!
//! Superblock layout (kernel `Documentation/admin-guide/device-mapper/dm-integrity.rst`,
//! little endian): magic `"integrt\0"`, version u8, log2_interleave_sectors u8,
//! integrity_tag_size u16, journal_sections u32, provided_data_sectors u64, flags u32,
//! log2_sectors_per_block u8, log2_blocks_per_bitmap_bit u8, pad[2], recalc_sector u64,
//! pad[8], salt[16].

use crate::error::{FormatError, Result};
use crate::hdrio::HeaderIo;
use cryptblk_cipher::SecretBytes;
use std::fmt::Write as _;

/// Superblock magic.
pub const INTEGRITY_MAGIC: &[u8; 8] = b"integrt\0";
/// Bytes reserved for the superblock at the start of the (metadata) device.
pub const INTEGRITY_SUPERBLOCK_AREA: usize = 4096;

/// Superblock flag names in bit order, as `integritysetup dump` prints them.
const FLAG_NAMES: [(u32, &str); 5] = [
    (0x1, "have_journal_mac"),
    (0x2, "recalculating"),
    (0x4, "dirty_bitmap"),
    (0x8, "fix_padding"),
    (0x10, "fix_hmac"),
];
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

/// A decoded dm-integrity superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntegritySuperblock {
    /// Format version (1..=5).
    pub version: u8,
    /// log2 of the data sectors between tag areas.
    pub log2_interleave_sectors: u8,
    /// Tag bytes per block.
    pub integrity_tag_size: u16,
    /// Journal sections.
    pub journal_sections: u32,
    /// Sectors the device exposes.
    pub provided_data_sectors: u64,
    /// Flag bits (`have_journal_mac` 1, `recalculating` 2, `dirty_bitmap` 4,
    /// `fix_padding` 8, `fix_hmac` 16).
    pub flags: u32,
    /// log2 of 512-byte sectors per block.
    pub log2_sectors_per_block: u8,
    /// log2 of blocks per bitmap bit.
    pub log2_blocks_per_bitmap_bit: u8,
    /// Recalculation position.
    pub recalc_sector: u64,
    /// HMAC salt (`fix_hmac`).
    pub salt: [u8; 16],
}

impl IntegritySuperblock {
    /// Decodes a superblock; fails with [`FormatError::Corrupt`] without the magic.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < 64 {
            return Err(FormatError::TooSmall(
                "integrity superblock needs 64 bytes".into(),
            ));
        }
        if &b[0..8] != INTEGRITY_MAGIC {
            return Err(FormatError::Corrupt(
                "not a valid INTEGRITY device (bad magic)".into(),
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let sb = IntegritySuperblock {
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
        };
        if sb.version == 0 || sb.version > 5 {
            return Err(FormatError::Unsupported(format!(
                "integrity superblock version {}",
                sb.version
            )));
        }
        if sb.log2_sectors_per_block > 3 {
            return Err(FormatError::Corrupt(format!(
                "invalid log2_sectors_per_block {}",
                sb.log2_sectors_per_block
            )));
        }
        Ok(sb)
    }

    /// Encodes the superblock (64 bytes; the rest of the area is zero).
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(INTEGRITY_MAGIC);
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

    /// Whether `b` starts with the superblock magic (a device the kernel would format
    /// rather than open).
    pub fn has_magic(b: &[u8]) -> bool {
        b.starts_with(INTEGRITY_MAGIC)
    }

    /// Sets `version` from the features in use, as the kernel does before each write:
    /// the lowest version that can describe them.
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

    /// Reads the superblock at sector `start` of `io`.
    pub fn read(io: &dyn HeaderIo, start_sector: u64) -> Result<Self> {
        let mut b = [0u8; 64];
        io.read_at(start_sector * 512, &mut b)
            .map_err(|e| FormatError::io("reading integrity superblock", e))?;
        Self::parse(&b)
    }

    /// Block (sector) size in bytes.
    pub fn sector_size(&self) -> u32 {
        512 << self.log2_sectors_per_block
    }

    /// `integritysetup dump` text for a device called `device`.
    pub fn dump(&self, device: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Info for integrity device {device}.");
        let _ = writeln!(s, "superblock_version {}", self.version);
        let _ = writeln!(
            s,
            "log2_interleave_sectors {}",
            self.log2_interleave_sectors
        );
        let _ = writeln!(s, "integrity_tag_size {}", self.integrity_tag_size);
        let _ = writeln!(s, "journal_sections {}", self.journal_sections);
        let _ = writeln!(s, "provided_data_sectors {}", self.provided_data_sectors);
        let _ = writeln!(s, "sector_size {}", self.sector_size());
        if self.flags & FLAG_RECALCULATING != 0 {
            let _ = writeln!(s, "recalc_sector {}", self.recalc_sector);
        }
        let _ = writeln!(
            s,
            "log2_blocks_per_bitmap {}",
            self.log2_blocks_per_bitmap_bit
        );
        s.push_str("flags ");
        for (bit, name) in FLAG_NAMES {
            if self.flags & bit != 0 {
                s.push_str(name);
                s.push(' ');
            }
        }
        s.push('\n');
        s
    }
}

/// Journaling mode for `integrity open` (`--integrity-no-journal` = direct,
/// `--integrity-recovery-mode` = recovery).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntegrityOpenMode {
    /// `J`.
    Journal,
    /// `D`.
    Direct,
    /// `R`.
    Recovery,
}

/// What `integritysetup format/open` options translate to.
#[derive(Clone, Debug)]
pub struct IntegrityParams {
    /// `--integrity` in cryptsetup spelling (`crc32c`, `sha256`, `hmac-sha256`).
    pub integrity: String,
    /// `--integrity-key-file` contents, for keyed hashes.
    pub key: Option<SecretBytes>,
    /// `--tag-size` (`None` = the hash's digest size).
    pub tag_size: Option<u32>,
    /// `--sector-size`.
    pub sector_size: u32,
    /// `--journal-size` in bytes (`None` = kernel default, 1/128 of the device, at most
    /// 64 MiB).
    pub journal_size: Option<u64>,
    /// `--interleave-sectors`.
    pub interleave_sectors: Option<u32>,
    /// `--buffer-sectors`.
    pub buffer_sectors: Option<u32>,
    /// `--integrity-legacy-padding` (default off: 4 KiB padding, `fix_padding`).
    pub legacy_padding: bool,
    /// `--integrity-legacy-hmac` (default off: `fix_hmac`).
    pub legacy_hmac: bool,
    /// Open mode.
    pub mode: IntegrityOpenMode,
    /// Superblock offset in sectors (the table's `<start>`).
    pub start: u64,
}

impl IntegrityParams {
    /// integritysetup 2.6 defaults: crc32c, 512-byte sectors, journal mode, fixed padding
    /// and HMAC.
    pub fn new(integrity: &str) -> Self {
        IntegrityParams {
            integrity: integrity.to_string(),
            key: None,
            tag_size: None,
            sector_size: 512,
            journal_size: None,
            interleave_sectors: None,
            buffer_sectors: None,
            legacy_padding: false,
            legacy_hmac: false,
            mode: IntegrityOpenMode::Journal,
            start: 0,
        }
    }

    /// The kernel crypto API name for a cryptsetup integrity name (`hmac-sha256` ->
    /// `hmac(sha256)`).
    pub fn kernel_hash_name(&self) -> String {
        match self.integrity.strip_prefix("hmac-") {
            Some(h) => format!("hmac({h})"),
            None => self.integrity.clone(),
        }
    }
}

/// Clears the superblock area at sector `start` so that the next table load formats the
/// device (what `integritysetup format` does before handing over to the kernel).
pub fn clear_superblock(io: &dyn HeaderIo, start_sector: u64) -> Result<()> {
    io.write_at(start_sector * 512, &[0u8; INTEGRITY_SUPERBLOCK_AREA])
        .map_err(|e| FormatError::io("clearing integrity superblock", e))?;
    io.sync()
        .map_err(|e| FormatError::io("syncing integrity superblock", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trip() {
        let sb = IntegritySuperblock {
            version: 5,
            log2_interleave_sectors: 15,
            integrity_tag_size: 4,
            journal_sections: 2,
            provided_data_sectors: 64664,
            flags: 0x18,
            log2_sectors_per_block: 0,
            log2_blocks_per_bitmap_bit: 15,
            recalc_sector: 0,
            salt: [3; 16],
        };
        assert_eq!(IntegritySuperblock::parse(&sb.to_bytes()).unwrap(), sb);
    }
}
