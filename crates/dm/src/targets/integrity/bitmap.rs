//! Bitmap mode's dirty bitmap and tag recalculation: marking regions dirty before
//! writes, cleaning the bitmap on flush, recomputing tags from the data (after a crash,
//! and in the background for `recalculate`), and which regions' tags are not checked yet.
//!
//! Invariants: a region's bit is durable before data is written to it, and cleared only
//! after data and tags are flushed; background recalculation flushes a chunk's tags
//! before recording its end in `recalc_sector`, so a crash never resumes past unwritten
//! tags; without an internal hash, tags are left as written.

use std::io;

use super::open::{Core, State};
use super::recalc;
use super::superblock::FLAG_RECALCULATING;
use crate::device::WriteFlags;
use crate::SECTOR_SIZE;

/// Sectors recalculated per step (the kernel's `RECALC_SECTORS` on 64-bit machines).
const RECALC_SECTORS: u64 = 32768;

impl Core {
    /// Writes the in-memory bitmap to the start of the journal area and makes it durable.
    pub(super) fn write_bitmap(&self, st: &State) -> io::Result<()> {
        self.mdev().write_at(
            self.layout.journal_offset(),
            &st.bitmap,
            WriteFlags { fua: true },
        )?;
        self.mdev().flush()
    }

    /// Marks the regions of a write dirty on disk before the write proceeds.
    pub(super) fn mark_dirty(&self, st: &mut State, sector: u64, sectors: u64) -> io::Result<()> {
        let first = sector >> self.bitmap_shift;
        let last = (sector + sectors - 1) >> self.bitmap_shift;
        let mut changed = false;
        for bit in first..=last {
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            if st.bitmap[byte] & mask == 0 {
                st.bitmap[byte] |= mask;
                changed = true;
            }
        }
        if changed {
            self.write_bitmap(st)?;
            self.arm_timer();
        }
        Ok(())
    }

    /// Flushes data and tags, then cleans the bitmap (bitmap mode's flush).
    pub(super) fn clean_bitmap(&self, st: &mut State) -> io::Result<()> {
        self.dev.flush()?;
        self.mdev().flush()?;
        if st.bitmap.iter().any(|&b| b != 0) {
            st.bitmap.fill(0);
            self.write_bitmap(st)?;
        }
        Ok(())
    }

    /// Whether `sectors` sectors from logical `sector` touch a region whose tags are not
    /// checked (see [`State::unverified`]).
    pub(super) fn region_unverified(&self, st: &State, sector: u64, sectors: u64) -> bool {
        if st.unverified.is_empty() {
            return false;
        }
        let first = sector >> self.bitmap_shift;
        let last = (sector + sectors.max(1) - 1) >> self.bitmap_shift;
        (first..=last).any(|bit| {
            st.unverified
                .get((bit / 8) as usize)
                .is_none_or(|b| b & (1 << (bit % 8)) != 0)
        })
    }

    /// Where tags stop being checked: `recalc_sector` while a recalculation is pending,
    /// else past the end.
    pub(super) fn checked_below(&self, st: &State) -> u64 {
        if st.sb.flags & FLAG_RECALCULATING != 0 {
            st.sb.recalc_sector
        } else {
            u64::MAX
        }
    }

    /// One step of the background recalculation: rewrites the tags of the next chunk from
    /// `recalc_sector`, makes them durable, then records the chunk's end in the superblock
    /// (so a crash resumes at or before it, never past unwritten tags). `Ok(true)` while
    /// more remains. A failure fails the device, as the kernel's `dm_integrity_io_error`.
    pub(super) fn recalc_step(&self, ctl: &recalc::RecalcCtl) -> io::Result<bool> {
        self.check_failed()?;
        let mut st = self.lock();
        if ctl.stopped() || st.sb.flags & FLAG_RECALCULATING == 0 {
            return Ok(false);
        }
        let provided = self.layout.provided_data_sectors;
        let pos = st.sb.recalc_sector;
        if pos >= provided {
            return Ok(false);
        }
        let n = RECALC_SECTORS
            .min(provided - pos)
            .min(self.layout.sectors_left_in_area(pos));
        let r = self.recalculate(&st, pos, n).and_then(|()| {
            st.sb.recalc_sector = pos + n;
            self.write_superblock(&mut st)
        });
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error recalculating tags: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(e);
        }
        Ok(pos + n < provided)
    }

    /// Rewrites the tags of `count` sectors from `sector` (clipped to the device) from the
    /// data as it is.
    pub(super) fn recalculate(&self, st: &State, sector: u64, count: u64) -> io::Result<()> {
        let Some(hash) = &self.hash else {
            // External tags cannot be recomputed from the data (the kernel has no
            // recalculation without an internal hash either): they stay as written.
            return Ok(());
        };
        let end = (sector + count).min(self.layout.provided_data_sectors);
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let mut data = Vec::new();
        let mut tags = Vec::new();
        let mut cache = self.lock_tags();
        let mut s = sector;
        while s < end {
            let n = self.layout.sectors_left_in_area(s).min(end - s).min(2048);
            data.resize((n * 512) as usize, 0);
            self.dev
                .read_at(self.layout.data_sector(s) * SECTOR_SIZE, &mut data)?;
            tags.resize(data.len() / bs * ts, 0);
            hash.tags(salt.as_ref(), s, bs, &data, &mut tags);
            self.store_tags(&mut cache, s, &tags)?;
            s += n;
        }
        drop(cache);
        self.dev.flush()?;
        self.mdev().flush()
    }
}
