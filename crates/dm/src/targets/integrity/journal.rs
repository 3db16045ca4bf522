//! The dm-integrity journal as the kernel lays it out, held in memory.
//!
//! The journal is `journal_sections` sections of `journal_section_sectors` sectors each,
//! right after the superblock. A section starts with 8 sectors of entries (entry `n` lives
//! in sector `n % 8` at byte `(n / 8) * entry_size`), followed by one block of data per
//! entry. Every journal sector ends with an 8-byte commit id; the data bytes it displaces
//! are kept in the entry (`last_bytes`). An entry is `sector: u64` (upper half `0xffffffff`
//! = unused), `last_bytes[sectors_per_block]: u64`, then the tag.
//!
//! Commit ids are `commit_ids[seq] ^ ((section << 32) ^ sector)`; the sequence number `seq`
//! (0..4) advances each time writing wraps around the journal, which is how replay finds
//! the newest, completely written run of sections. The bases are [`COMMIT_ID_BASES`] unless
//! a stream cipher encrypts the journal (see [`super::journal_crypt`]).
//!
//! With a journal MAC the last 8 bytes before each entry sector's commit id hold a share of
//! its section's MAC ([`Journal::entry_sectors`] is what the MAC covers).

use super::layout::{Layout, JOURNAL_BLOCK_SECTORS};

/// The four commit id bases (no journal encryption: the kernel's constants).
pub const COMMIT_ID_BASES: [u64; 4] = [
    0x1111_1111_1111_1111,
    0x2222_2222_2222_2222,
    0x3333_3333_3333_3333,
    0x4444_4444_4444_4444,
];
/// Number of commit sequence numbers.
pub const N_COMMIT_IDS: u8 = 4;

/// Next commit sequence number.
pub fn next_seq(s: u8) -> u8 {
    (s + 1) % N_COMMIT_IDS
}

/// Previous commit sequence number.
pub fn prev_seq(s: u8) -> u8 {
    (s + N_COMMIT_IDS - 1) % N_COMMIT_IDS
}

/// The journal bytes plus the geometry needed to address them.
pub struct Journal {
    /// Raw journal, exactly as on disk.
    pub buf: Vec<u8>,
    /// Number of sections.
    pub sections: u32,
    section_sectors: u32,
    /// Entries per section.
    pub section_entries: u32,
    entry_size: u32,
    sectors_per_block: u32,
    tag_size: u32,
    commit_ids: [u64; 4],
}

impl Journal {
    /// A zero-filled journal for `layout`.
    pub fn new(layout: &Layout) -> Journal {
        Journal {
            buf: vec![0u8; layout.journal_bytes()],
            sections: layout.journal_sections,
            section_sectors: layout.journal_section_sectors,
            section_entries: layout.journal_section_entries,
            entry_size: layout.journal_entry_size,
            sectors_per_block: layout.sectors_per_block,
            tag_size: layout.tag_size,
            commit_ids: COMMIT_ID_BASES,
        }
    }

    /// Uses `ids` as commit id bases (an encrypted journal's).
    pub fn set_commit_ids(&mut self, ids: [u64; 4]) {
        self.commit_ids = ids;
    }

    /// The sector fields (8 bytes each, entry order) of every entry of the section held in
    /// `section` (a section-sized slice): what the section's journal MAC covers.
    pub fn entry_sectors(&self, section: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.section_entries as usize * 8);
        for n in 0..self.section_entries {
            let o = (n % JOURNAL_BLOCK_SECTORS) as usize * 512
                + (n / JOURNAL_BLOCK_SECTORS) as usize * self.entry_size as usize;
            out.extend_from_slice(&section[o..o + 8]);
        }
        out
    }

    /// Byte range of the MAC share of entry sector `j` (0..8) within a section.
    pub fn mac_range(j: u32) -> std::ops::Range<usize> {
        let o = j as usize * 512 + 504 - super::layout::JOURNAL_MAC_PER_SECTOR as usize;
        o..o + super::layout::JOURNAL_MAC_PER_SECTOR as usize
    }

    /// Sectors per section.
    pub fn section_sectors(&self) -> u32 {
        self.section_sectors
    }

    /// Byte range of section `i` in the journal.
    pub fn section_range(&self, i: u32) -> std::ops::Range<usize> {
        let len = self.section_sectors as usize * 512;
        i as usize * len..(i as usize + 1) * len
    }

    fn sector_off(&self, i: u32, j: u32) -> usize {
        (i as usize * self.section_sectors as usize + j as usize) * 512
    }

    /// The expected commit id of sector `j` of section `i` under sequence `seq`.
    pub fn commit_id(&self, i: u32, j: u32, seq: u8) -> u64 {
        self.commit_ids[seq as usize] ^ (((i as u64) << 32) ^ j as u64)
    }

    /// The commit id stored in sector `j` of section `i`.
    pub fn stored_commit_id(&self, i: u32, j: u32) -> u64 {
        let o = self.sector_off(i, j) + 504;
        u64::from_le_bytes(self.buf[o..o + 8].try_into().expect("8 bytes"))
    }

    /// Stamps every sector of section `i` with the commit id for `seq`.
    pub fn stamp_section(&mut self, i: u32, seq: u8) {
        for j in 0..self.section_sectors {
            let o = self.sector_off(i, j) + 504;
            let id = self.commit_id(i, j, seq);
            self.buf[o..o + 8].copy_from_slice(&id.to_le_bytes());
        }
    }

    /// The commit sequence whose id sector `j` of section `i` carries, if any.
    pub fn find_seq(&self, i: u32, j: u32) -> Option<u8> {
        let id = self.stored_commit_id(i, j);
        (0..N_COMMIT_IDS).find(|&k| self.commit_id(i, j, k) == id)
    }

    /// Clears sections `start..start+count` (wrapping) to empty entries stamped with `seq`
    /// (`init_journal`).
    pub fn init_sections(&mut self, start: u32, count: u32, seq: u8) {
        for n in 0..count {
            let i = (start + n) % self.sections;
            for j in 0..self.section_sectors {
                let o = self.sector_off(i, j);
                self.buf[o..o + 504].fill(0);
            }
            self.stamp_section(i, seq);
            for e in 0..self.section_entries {
                self.set_unused(i, e);
            }
        }
    }

    fn entry_off(&self, i: u32, n: u32) -> usize {
        self.sector_off(i, n % JOURNAL_BLOCK_SECTORS)
            + (n / JOURNAL_BLOCK_SECTORS) as usize * self.entry_size as usize
    }

    /// Whether entry `n` of section `i` is unused.
    pub fn is_unused(&self, i: u32, n: u32) -> bool {
        let o = self.entry_off(i, n) + 4;
        self.buf[o..o + 4] == [0xff; 4]
    }

    /// Marks entry `n` of section `i` unused.
    pub fn set_unused(&mut self, i: u32, n: u32) {
        let o = self.entry_off(i, n) + 4;
        self.buf[o..o + 4].fill(0xff);
    }

    /// The logical sector entry `n` of section `i` describes.
    pub fn entry_sector(&self, i: u32, n: u32) -> u64 {
        let o = self.entry_off(i, n);
        u64::from_le_bytes(self.buf[o..o + 8].try_into().expect("8 bytes"))
    }

    /// The tag stored in entry `n` of section `i`.
    pub fn entry_tag(&self, i: u32, n: u32) -> &[u8] {
        let o = self.entry_off(i, n) + 8 + 8 * self.sectors_per_block as usize;
        &self.buf[o..o + self.tag_size as usize]
    }

    fn data_off(&self, i: u32, n: u32) -> usize {
        self.sector_off(i, JOURNAL_BLOCK_SECTORS + n * self.sectors_per_block)
    }

    /// Stores a block: entry `n` of section `i` gets `sector`, the block's displaced last
    /// bytes and `tag`; the data sectors get the block (their commit-id slots are stamped
    /// at commit).
    pub fn put(&mut self, i: u32, n: u32, sector: u64, block: &[u8], tag: &[u8]) {
        let d = self.data_off(i, n);
        self.buf[d..d + block.len()].copy_from_slice(block);
        let e = self.entry_off(i, n);
        self.buf[e..e + 8].copy_from_slice(&sector.to_le_bytes());
        for s in 0..self.sectors_per_block as usize {
            let last = &block[s * 512 + 504..s * 512 + 512];
            let o = e + 8 + 8 * s;
            self.buf[o..o + 8].copy_from_slice(last);
        }
        let t = e + 8 + 8 * self.sectors_per_block as usize;
        self.buf[t..t + tag.len()].copy_from_slice(tag);
    }

    /// Byte range of the data of entry `n` of section `i` in [`Journal::buf`]: data of
    /// consecutive entries of one section is contiguous.
    pub fn data_range(&self, i: u32, n: u32) -> std::ops::Range<usize> {
        let d = self.data_off(i, n);
        d..d + self.sectors_per_block as usize * 512
    }

    /// Swaps the commit ids at the end of the data sectors of entry `n` of section `i`
    /// with the displaced last bytes kept in the entry: after one call the data range
    /// holds the block as written (and the entry the commit ids), a second call undoes
    /// it. Lets a commit write blocks home straight from the journal buffer.
    pub fn swap_last_bytes(&mut self, i: u32, n: u32) {
        let d = self.data_off(i, n);
        let e = self.entry_off(i, n);
        for s in 0..self.sectors_per_block as usize {
            let (a, b) = (d + s * 512 + 504, e + 8 + 8 * s);
            // Entry sectors come before data sectors in a section: b < a.
            let (lo, hi) = self.buf.split_at_mut(a);
            lo[b..b + 8].swap_with_slice(&mut hi[..8]);
        }
    }

    /// Appends the block held by entry `n` of section `i` to `out`, with its last bytes
    /// restored (one copy out of the journal, no zero-fill).
    pub fn append_block(&self, i: u32, n: u32, block_size: usize, out: &mut Vec<u8>) {
        let d = self.data_off(i, n);
        let at = out.len();
        out.extend_from_slice(&self.buf[d..d + block_size]);
        let e = self.entry_off(i, n);
        for s in 0..self.sectors_per_block as usize {
            let o = e + 8 + 8 * s;
            out[at + s * 512 + 504..at + s * 512 + 512].copy_from_slice(&self.buf[o..o + 8]);
        }
    }

    /// The block held by entry `n` of section `i`, with its last bytes restored.
    pub fn block(&self, i: u32, n: u32, out: &mut [u8]) {
        let d = self.data_off(i, n);
        out.copy_from_slice(&self.buf[d..d + out.len()]);
        let e = self.entry_off(i, n);
        for s in 0..self.sectors_per_block as usize {
            let o = e + 8 + 8 * s;
            out[s * 512 + 504..s * 512 + 512].copy_from_slice(&self.buf[o..o + 8]);
        }
    }
}
