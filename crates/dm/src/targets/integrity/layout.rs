//! Where everything lives on a dm-integrity device: journal geometry, metadata (tag) runs
//! interleaved with data areas, and the number of sectors the device provides.
//!
//! The formulas follow the kernel's `calculate_journal_section_size`,
//! `calculate_device_limits`, `get_provided_data_sectors`, `get_data_sector` and
//! `get_metadata_sector_and_offset`, so a device laid out here is the one the kernel
//! expects for the same superblock and device size.

use super::superblock::{Superblock, FLAG_FIXED_PADDING, FLAG_HAVE_JOURNAL_MAC};

/// Sectors before the journal (the superblock area).
pub const SB_SECTORS: u64 = 8;
/// Sectors of journal entries at the start of each journal section.
pub const JOURNAL_BLOCK_SECTORS: u32 = 8;
/// Usable bytes per journal sector (the last 8 hold the commit id).
pub const JOURNAL_SECTOR_DATA: u32 = 512 - 8;
/// Bytes of journal MAC per journal sector.
pub const JOURNAL_MAC_PER_SECTOR: u32 = 8;
/// Journal entries are padded to this many bytes.
const JOURNAL_ENTRY_ROUNDUP: u32 = 8;
/// Padding (sectors) kept after the journal with a separate metadata device.
const METADATA_PADDING_SECTORS: u64 = 8;
/// Largest block: 8 sectors.
pub const MAX_SECTORS_PER_BLOCK: u32 = 8;
/// Largest tag that fits a journal entry.
pub const MAX_TAG_SIZE: u32 =
    JOURNAL_SECTOR_DATA - JOURNAL_MAC_PER_SECTOR - 8 - 8 * MAX_SECTORS_PER_BLOCK;

/// The computed geometry of one dm-integrity device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the superblock on the metadata device (the table's `<start>`), sectors.
    pub start: u64,
    /// Whether tags and journal live on a separate metadata device.
    pub meta_dev: bool,
    /// Sectors per block (1..=8).
    pub sectors_per_block: u32,
    /// log2 of `sectors_per_block`.
    pub log2_sectors_per_block: u8,
    /// Tag bytes per block.
    pub tag_size: u32,
    /// log2 of the data sectors per area (0 with a metadata device).
    pub log2_interleave_sectors: u8,
    /// Journal sections.
    pub journal_sections: u32,
    /// Bytes per journal entry.
    pub journal_entry_size: u32,
    /// Entries per journal sector.
    pub journal_entries_per_sector: u32,
    /// Entries per section.
    pub journal_section_entries: u32,
    /// Sectors per section (entry sectors plus data sectors).
    pub journal_section_sectors: u32,
    /// Superblock plus journal, in sectors.
    pub initial_sectors: u64,
    /// Sectors of tags per area.
    pub metadata_run: u64,
    /// Sectors the device exposes.
    pub provided_data_sectors: u64,
    /// Superblock flags the geometry depends on.
    pub flags: u32,
    /// log2 of the metadata buffer size in sectors (tag areas on a separate metadata
    /// device are rounded up to whole buffers).
    pub log2_buffer_sectors: u8,
}

impl Layout {
    /// Journal entry and section sizes for a block size, tag size and MAC setting.
    fn set_journal_sizes(&mut self) {
        let mut sector_space = JOURNAL_SECTOR_DATA;
        self.journal_entry_size = (8 + 8 * self.sectors_per_block + self.tag_size)
            .div_ceil(JOURNAL_ENTRY_ROUNDUP)
            * JOURNAL_ENTRY_ROUNDUP;
        if self.flags & FLAG_HAVE_JOURNAL_MAC != 0 {
            sector_space -= JOURNAL_MAC_PER_SECTOR;
        }
        self.journal_entries_per_sector = sector_space / self.journal_entry_size;
        self.journal_section_entries = self.journal_entries_per_sector * JOURNAL_BLOCK_SECTORS;
        self.journal_section_sectors =
            (self.journal_section_entries << self.log2_sectors_per_block) + JOURNAL_BLOCK_SECTORS;
    }

    /// A layout for an existing superblock on a device whose metadata device has
    /// `meta_device_sectors` (the data device when there is no separate one) and whose data
    /// device has `data_device_sectors`. `None` when the device is too small.
    pub fn from_superblock(
        sb: &Superblock,
        start: u64,
        meta_dev: bool,
        meta_device_sectors: u64,
        data_device_sectors: u64,
    ) -> Option<Layout> {
        let mut l = Layout::empty(
            start,
            meta_dev,
            sb.log2_sectors_per_block,
            sb.integrity_tag_size as u32,
            sb.flags,
        );
        l.log2_interleave_sectors = sb.log2_interleave_sectors;
        l.journal_sections = sb.journal_sections;
        l.set_journal_sizes();
        l.compute_provided(meta_device_sectors, data_device_sectors);
        if l.provided_data_sectors == 0 {
            return None;
        }
        while !l.device_limits(meta_device_sectors) {
            if !meta_dev || l.log2_buffer_sectors <= 3 {
                return None;
            }
            l.log2_buffer_sectors -= 1;
        }
        Some(l)
    }

    fn empty(start: u64, meta_dev: bool, log2_spb: u8, tag_size: u32, flags: u32) -> Layout {
        Layout {
            start,
            meta_dev,
            sectors_per_block: 1 << log2_spb,
            log2_sectors_per_block: log2_spb,
            tag_size,
            log2_interleave_sectors: 0,
            journal_sections: 0,
            journal_entry_size: 0,
            journal_entries_per_sector: 0,
            journal_section_entries: 0,
            journal_section_sectors: 0,
            initial_sectors: 0,
            metadata_run: 0,
            provided_data_sectors: 0,
            flags,
            log2_buffer_sectors: 7,
        }
    }

    /// The kernel's `initialize_superblock` sizing: returns the layout a fresh format gets.
    #[allow(clippy::too_many_arguments)]
    pub fn for_new_device(
        start: u64,
        meta_dev: bool,
        sectors_per_block: u32,
        tag_size: u32,
        flags: u32,
        journal_sectors: u32,
        interleave_sectors: u32,
        meta_device_sectors: u64,
        data_device_sectors: u64,
    ) -> Option<Layout> {
        let log2_spb = sectors_per_block.trailing_zeros() as u8;
        let mut l = Layout::empty(start, meta_dev, log2_spb, tag_size, flags);
        l.set_journal_sizes();
        let journal_sections = (journal_sectors / l.journal_section_sectors).max(1);
        if !meta_dev {
            l.journal_sections = journal_sections;
            let interleave = if interleave_sectors == 0 {
                32768
            } else {
                interleave_sectors
            };
            let log2 = 31 - interleave.leading_zeros();
            l.log2_interleave_sectors = log2.clamp(3, 31) as u8;
            l.compute_provided(meta_device_sectors, data_device_sectors);
            if l.provided_data_sectors == 0 {
                return None;
            }
        } else {
            l.log2_interleave_sectors = 0;
            l.compute_provided(meta_device_sectors, data_device_sectors);
            if l.provided_data_sectors == 0 {
                return None;
            }
            // Largest journal (bit by bit) not above the request that still fits, with
            // smaller metadata buffers when nothing fits.
            loop {
                l.journal_sections = 0;
                for bit in (0..32 - journal_sections.leading_zeros()).rev() {
                    let prev = l.journal_sections;
                    let test = prev | (1 << bit);
                    if test > journal_sections {
                        continue;
                    }
                    l.journal_sections = test;
                    if !l.device_limits(meta_device_sectors) {
                        l.journal_sections = prev;
                    }
                }
                if l.journal_sections != 0 {
                    break;
                }
                if l.log2_buffer_sectors <= 3 {
                    return None;
                }
                l.log2_buffer_sectors -= 1;
            }
        }
        l.device_limits(meta_device_sectors).then_some(l)
    }

    /// `calculate_device_limits`: sets `initial_sectors`/`metadata_run` and checks that
    /// `provided_data_sectors` fits.
    fn device_limits(&mut self, meta_device_sectors: u64) -> bool {
        let initial =
            SB_SECTORS + self.journal_section_sectors as u64 * self.journal_sections as u64;
        if initial + METADATA_PADDING_SECTORS >= meta_device_sectors || initial > u32::MAX as u64 {
            return false;
        }
        self.initial_sectors = initial;
        if !self.meta_dev {
            let padding: u64 = if self.flags & FLAG_FIXED_PADDING != 0 {
                8 << 9
            } else {
                512 << 8
            };
            let bytes = (self.tag_size as u64)
                << (self.log2_interleave_sectors - self.log2_sectors_per_block);
            self.metadata_run = (bytes.div_ceil(padding) * padding) >> 9;
            let last = self.data_sector(self.provided_data_sectors - 1);
            if last < self.start || last >= meta_device_sectors {
                return false;
            }
        } else {
            // Tags packed after the journal, rounded up to whole metadata buffers.
            let meta_bytes =
                (self.provided_data_sectors >> self.log2_sectors_per_block) * self.tag_size as u64;
            let meta_sectors =
                meta_bytes.div_ceil(512 << self.log2_buffer_sectors) << self.log2_buffer_sectors;
            if self.initial_sectors + meta_sectors > meta_device_sectors {
                return false;
            }
            self.metadata_run = 1;
        }
        true
    }

    /// `get_provided_data_sectors`.
    fn compute_provided(&mut self, meta_device_sectors: u64, data_device_sectors: u64) {
        if !self.meta_dev {
            self.provided_data_sectors = 0;
            if meta_device_sectors == 0 {
                return;
            }
            let top = 63 - meta_device_sectors.leading_zeros();
            for bit in (3..=top).rev() {
                let prev = self.provided_data_sectors;
                self.provided_data_sectors |= 1u64 << bit;
                if !self.device_limits(meta_device_sectors) {
                    self.provided_data_sectors = prev;
                }
            }
        } else {
            self.provided_data_sectors = data_device_sectors & !(self.sectors_per_block as u64 - 1);
        }
    }

    /// Area number and offset within it of a logical sector.
    fn area_offset(&self, sector: u64) -> (u64, u64) {
        if self.meta_dev {
            (0, sector)
        } else {
            (
                sector >> self.log2_interleave_sectors,
                sector & ((1u64 << self.log2_interleave_sectors) - 1),
            )
        }
    }

    /// Physical sector on the data device holding logical `sector`.
    pub fn data_sector(&self, sector: u64) -> u64 {
        if self.meta_dev {
            return sector;
        }
        let (area, offset) = self.area_offset(sector);
        (area << self.log2_interleave_sectors)
            + (area + 1) * self.metadata_run
            + self.initial_sectors
            + offset
            + self.start
    }

    /// Byte position on the metadata device of the tag of the block at logical `sector`.
    pub fn tag_position(&self, sector: u64) -> u64 {
        let (area, offset) = self.area_offset(sector);
        let run_start = if self.meta_dev {
            0
        } else {
            (area << self.log2_interleave_sectors) + area * self.metadata_run
        };
        (self.start + self.initial_sectors + run_start) * 512
            + (offset >> self.log2_sectors_per_block) * self.tag_size as u64
    }

    /// The metadata run holding the tag of logical `sector`: its first byte on the
    /// metadata device and its length in bytes (tags of one area are contiguous in it).
    pub fn tag_run(&self, sector: u64) -> (u64, u64) {
        if self.meta_dev {
            let meta_bytes =
                (self.provided_data_sectors >> self.log2_sectors_per_block) * self.tag_size as u64;
            let sectors =
                meta_bytes.div_ceil(512 << self.log2_buffer_sectors) << self.log2_buffer_sectors;
            return ((self.start + self.initial_sectors) * 512, sectors * 512);
        }
        let (area, _) = self.area_offset(sector);
        let first = self.tag_position(area << self.log2_interleave_sectors);
        (first, self.metadata_run * 512)
    }

    /// Logical sectors from `sector` to the end of its area (requests are split there
    /// because data and tags are contiguous only within an area). With a metadata device
    /// the whole device is one area; callers multiply this by 512, so it stays the real
    /// (non-overflowing) count.
    pub fn sectors_left_in_area(&self, sector: u64) -> u64 {
        if self.meta_dev {
            return self.provided_data_sectors.saturating_sub(sector).max(1);
        }
        let (_, offset) = self.area_offset(sector);
        (1u64 << self.log2_interleave_sectors) - offset
    }

    /// Byte offset of the journal on the metadata device.
    pub fn journal_offset(&self) -> u64 {
        (self.start + SB_SECTORS) * 512
    }

    /// Journal size in bytes.
    pub fn journal_bytes(&self) -> usize {
        self.journal_sections as usize * self.journal_section_sectors as usize * 512
    }

    /// Total journal entries.
    pub fn journal_entries(&self) -> u32 {
        self.journal_sections * self.journal_section_entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// provided_data_sectors for a 32 MiB device, integritysetup defaults (journal =
    /// size/128 sectors, interleave 32768, legacy padding): cryptsetup's
    /// integrity-compat-test numbers (vectors.md 2A).
    #[test]
    fn provided_sectors_match_integritysetup() {
        let dev = 65536u64;
        let journal = (dev >> 7) as u32;
        for (tag, bs, fixed, want) in [
            (4u32, 512u32, false, 64664u64),
            (8, 512, false, 64152),
            (20, 512, false, 62552),
            (32, 512, false, 60992),
            (16, 4096, false, 64688),
            (32, 4096, false, 64752),
            (4, 4096, true, 65072),
        ] {
            let flags = if fixed { FLAG_FIXED_PADDING } else { 0 };
            let l =
                Layout::for_new_device(0, false, bs / 512, tag, flags, journal, 32768, dev, dev)
                    .unwrap();
            assert_eq!(l.provided_data_sectors, want, "tag {tag} bs {bs}");
        }
        let l = Layout::for_new_device(0, true, 1, 4, FLAG_FIXED_PADDING, journal, 0, dev, dev)
            .unwrap();
        assert_eq!(l.provided_data_sectors, 65536);
    }
}
