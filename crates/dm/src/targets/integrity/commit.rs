//! The journal commit (J mode): stamping the uncommitted sections with the commit id,
//! writing them (MACed / encrypted when configured) to the on-disk journal, then copying
//! data and tags to their home locations (`do_journal_write`); plus the commit / bitmap
//! flush timer's action and the clean close.
//!
//! Invariants: the journal is written and flushed before any home write; home data and
//! tags are flushed before the sections count as done; a failed commit fails the device
//! (every later I/O returns the error); the in-memory journal stays plain.

use std::io;
use std::sync::atomic::Ordering;

use super::journal::{next_seq, Journal};
use super::open::{Core, State};
use super::superblock::FLAG_DIRTY_BITMAP;
use super::tagcache::TagCache;
use super::IntegrityMode;
use crate::device::WriteFlags;
use crate::SECTOR_SIZE;

impl Core {
    /// Writes journal sections `start..start+count` (wrapping) and makes them durable;
    /// with a journal MAC or cipher, what goes to disk is a MACed / encrypted copy (the
    /// in-memory journal stays plain).
    pub(super) fn write_journal_sections(
        &self,
        st: &State,
        start: u32,
        count: u32,
    ) -> io::Result<()> {
        let base = self.layout.journal_offset();
        let sections = st.journal.sections;
        let first = count.min(sections - start);
        let mut pieces = vec![(start, first)];
        if count > first {
            pieces.push((0, count - first));
        }
        for (s, n) in pieces {
            let r = st.journal.section_range(s).start..st.journal.section_range(s + n - 1).end;
            if self.jcrypt.is_none() && self.jmac.is_none() {
                self.mdev().write_at(
                    base + r.start as u64,
                    &st.journal.buf[r],
                    WriteFlags::default(),
                )?;
                continue;
            }
            let mut out = st.journal.buf[r.clone()].to_vec();
            self.seal_sections(st, s, &mut out);
            self.mdev()
                .write_at(base + r.start as u64, &out, WriteFlags::default())?;
        }
        self.mdev().flush()
    }

    /// Stamps the journal MAC into (the kernel's `rw_section_mac`), then encrypts, the
    /// sections copied into `out`, the first being section `first`.
    pub(super) fn seal_sections(&self, st: &State, first: u32, out: &mut [u8]) {
        let section_bytes = st.journal.section_sectors() as usize * 512;
        if let Some(m) = &self.jmac {
            let salt = self.salt(&st.sb);
            for (k, sec) in out.chunks_exact_mut(section_bytes).enumerate() {
                let mac = m.section_mac(
                    salt.as_ref(),
                    first + k as u32,
                    &st.journal.entry_sectors(sec),
                );
                for (j, share) in mac.chunks_exact(8).enumerate() {
                    sec[Journal::mac_range(j as u32)].copy_from_slice(share);
                }
            }
        }
        if let Some(c) = &self.jcrypt {
            c.apply(first, out, true);
        }
    }

    /// Commits the journal's uncommitted sections and writes them home (J mode).
    pub(super) fn commit(&self, st: &mut State) -> io::Result<()> {
        if st.free_entry > 0 {
            st.free_entry = 0;
            st.free_section = (st.free_section + 1) % st.journal.sections;
            st.n_uncommitted += 1;
        }
        let count = st.n_uncommitted;
        if count == 0 {
            self.dev.flush()?;
            return self.mdev().flush();
        }
        let start = st.uncommitted_section;
        let mut i = start;
        for _ in 0..count {
            let seq = st.commit_seq;
            st.journal.stamp_section(i, seq);
            i += 1;
            if i >= st.journal.sections {
                st.commit_seq = next_seq(st.commit_seq);
                i = 0;
            }
        }
        // A journal that cannot be written (or written home) fails the device, as the
        // kernel's dm_integrity_io_error does: whichever path committed (a write, a flush,
        // the timer), every later I/O returns the error.
        let r = self
            .write_journal_sections(st, start, count)
            .and_then(|()| self.apply_sections(st, start, count, false));
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error on journal commit: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(e);
        }
        st.uncommitted_section = st.free_section;
        st.n_uncommitted = 0;
        st.pending.clear();
        Ok(())
    }

    /// Copies the used entries of sections `start..start+count` (wrapping) to their home
    /// locations with their tags, then flushes (`do_journal_write`).
    ///
    /// Entries are sorted by home sector (stably, so the newest copy of a sector is the
    /// last of its group and the only one written), then [`Core::write_home`]
    /// writes them without copying blocks out of the journal.
    pub(super) fn apply_sections(
        &self,
        st: &mut State,
        start: u32,
        count: u32,
        from_replay: bool,
    ) -> io::Result<()> {
        let salt = self.salt(&st.sb);
        let bs = self.cfg.block_size as usize;
        let spb = self.layout.sectors_per_block as u64;
        let ts = self.layout.tag_size as u64;
        // (logical sector, section, entry) in journal order.
        let mut list: Vec<(u64, u32, u32)> = Vec::new();
        let mut block = Vec::new();
        let mut tag = vec![0u8; ts as usize];
        for s in 0..count {
            let i = (start + s) % st.journal.sections;
            for e in 0..st.journal.section_entries {
                if st.journal.is_unused(i, e) {
                    continue;
                }
                let mut sector = st.journal.entry_sector(i, e);
                if from_replay {
                    if !sector.is_multiple_of(spb) {
                        self.fail(libc::EIO);
                        sector -= sector % spb;
                    }
                    if sector >= self.layout.provided_data_sectors {
                        st.journal.set_unused(i, e);
                        continue;
                    }
                    if let Some(hash) = &self.hash {
                        block.clear();
                        st.journal.append_block(i, e, bs, &mut block);
                        hash.tag(salt.as_ref(), sector, &block, &mut tag);
                        if tag[..] != *st.journal.entry_tag(i, e) {
                            eprintln!(
                                "device-mapper: integrity: {}: tag mismatch when replaying journal",
                                self.dev_spec
                            );
                            self.mismatches.fetch_add(1, Ordering::Relaxed);
                            self.fail(libc::EILSEQ);
                        }
                    }
                }
                list.push((sector, i, e));
                // Only the entry's sector field changes: its data, last bytes and tag
                // stay readable below.
                st.journal.set_unused(i, e);
            }
        }
        if self.cfg.read_only {
            // Replay into memory: reads find each block's newest copy (journal order, so
            // later entries replace earlier ones) through `pending`; the disk is untouched.
            for &(sector, i, e) in &list {
                st.pending.insert(sector, (i, e));
            }
            return Ok(());
        }
        // Stable: copies of one sector stay in journal order, the newest last.
        list.sort_by_key(|&(sector, _, _)| sector);

        let mut cache = self.lock_tags();
        let r = self.write_home(&mut st.journal, &list, &mut cache);
        if r.is_err() {
            cache.discard_dirty();
        }
        r?;
        drop(cache);
        self.dev.flush()?;
        if self.meta.is_some() {
            self.mdev().flush()?;
        }
        Ok(())
    }

    /// Writes the newest copy of each sector of `list` (sorted by sector, journal order
    /// within a sector) and its tag to their home locations. Blocks contiguous both at
    /// home and in the journal go out as one write straight from the journal buffer (their
    /// last bytes swapped in for the write and back after it); tags are patched into the
    /// cache in contiguous pieces and written once at the end.
    pub(super) fn write_home(
        &self,
        journal: &mut Journal,
        list: &[(u64, u32, u32)],
        cache: &mut TagCache,
    ) -> io::Result<()> {
        /// Largest data write.
        const MAX_RUN: usize = 1 << 20;
        let ts = self.layout.tag_size as u64;
        let mdev = self.mdev().as_ref();
        let mut run: Vec<(u32, u32)> = Vec::new();
        let mut run_phys = 0u64;
        let mut run_journal = 0..0;
        let mut tags: Vec<u8> = Vec::new();
        let mut tags_sector = 0u64;
        let mut tags_end = 0u64;
        let write_run = |journal: &mut Journal,
                         run: &mut Vec<(u32, u32)>,
                         phys: u64,
                         range: std::ops::Range<usize>|
         -> io::Result<()> {
            run.iter().for_each(|&(i, e)| journal.swap_last_bytes(i, e));
            let r = self.dev.write_at(
                phys * SECTOR_SIZE,
                &journal.buf[range],
                WriteFlags::default(),
            );
            run.iter().for_each(|&(i, e)| journal.swap_last_bytes(i, e));
            run.clear();
            r
        };
        for (idx, &(sector, i, e)) in list.iter().enumerate() {
            if list.get(idx + 1).is_some_and(|next| next.0 == sector) {
                continue; // a newer copy follows
            }
            let phys = self.layout.data_sector(sector);
            let range = journal.data_range(i, e);
            if !run.is_empty()
                && (run_phys + (run_journal.len() / 512) as u64 != phys
                    || run_journal.end != range.start
                    || run_journal.len() >= MAX_RUN)
            {
                write_run(journal, &mut run, run_phys, run_journal.clone())?;
            }
            if run.is_empty() {
                run_phys = phys;
                run_journal = range.start..range.start;
            }
            run.push((i, e));
            run_journal.end = range.end;

            let pos = self.layout.tag_position(sector);
            if !tags.is_empty() && tags_end != pos {
                let at = tags_end - tags.len() as u64;
                cache.write(mdev, self.tag_run(tags_sector), at, &tags)?;
                tags.clear();
            }
            if tags.is_empty() {
                tags_sector = sector;
            }
            tags.extend_from_slice(journal.entry_tag(i, e));
            tags_end = pos + ts;
        }
        if !run.is_empty() {
            write_run(journal, &mut run, run_phys, run_journal)?;
        }
        if !tags.is_empty() {
            let at = tags_end - tags.len() as u64;
            cache.write(mdev, self.tag_run(tags_sector), at, &tags)?;
        }
        cache.flush(mdev)
    }

    /// Arms the commit / bitmap flush timer (no-op without one or when already armed).
    pub(super) fn arm_timer(&self) {
        if let Some(t) = &self.timer {
            t.arm();
        }
    }

    /// The timer expired: commit the journal if it holds uncommitted writes (J), or flush
    /// and clean the bitmap (B), exactly as a flush would. A failure fails the device: the
    /// next I/O or flush returns it (there is no caller to return it to here).
    pub(super) fn timer_fire(&self) {
        if self.check_failed().is_err() {
            return;
        }
        let mut st = self.lock();
        let (what, r) = match self.cfg.mode {
            IntegrityMode::Journal if st.n_uncommitted > 0 || st.free_entry > 0 => {
                ("journal commit", self.commit(&mut st))
            }
            IntegrityMode::Bitmap => ("bitmap flush", self.clean_bitmap(&mut st)),
            _ => return,
        };
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error on timed {what}: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
        }
    }

    /// Commits everything and leaves an empty journal, as a clean kernel suspend does. A
    /// recalculation in progress stops after its current chunk (the next open resumes it).
    pub fn close(&self) -> io::Result<()> {
        if let Some(r) = &self.recalc {
            r.stop();
        }
        if self.cfg.read_only {
            return Ok(());
        }
        // A failed device writes nothing more (its journal stays as it is on disk).
        self.check_failed()?;
        let mut st = self.lock();
        if self.cfg.mode == IntegrityMode::Bitmap {
            // Clean: the area goes back to an empty journal and the bitmap is retired.
            self.clean_bitmap(&mut st)?;
            let n = st.journal.sections;
            st.journal.init_sections(0, n, 0);
            self.write_journal_sections(&st, 0, n)?;
            st.sb.flags &= !FLAG_DIRTY_BITMAP;
            return self.write_superblock(&mut st);
        }
        if self.cfg.mode != IntegrityMode::Journal {
            self.dev.flush()?;
            return self.mdev().flush();
        }
        self.commit(&mut st)?;
        let n = st.journal.sections;
        let (free, seq) = (st.free_section, st.commit_seq);
        st.journal.init_sections(free, n - free, seq);
        if free > 0 {
            st.journal.init_sections(0, free, next_seq(seq));
        }
        self.write_journal_sections(&st, 0, n)
    }

    /// Undoes what [`Core::close`] retired so writes can go on (a resume after a clean
    /// suspend): in bitmap mode the superblock says the bitmap is in use again and the
    /// journal area holds a clean bitmap, as at open. Journal and direct modes continue
    /// from the empty journal `close` left.
    pub fn reopen_after_close(&self) -> io::Result<()> {
        if self.cfg.read_only || self.cfg.mode != IntegrityMode::Bitmap {
            return Ok(());
        }
        self.check_failed()?;
        let mut st = self.lock();
        st.sb.flags |= FLAG_DIRTY_BITMAP;
        st.sb.log2_blocks_per_bitmap_bit =
            (self.bitmap_shift - self.layout.log2_sectors_per_block as u32) as u8;
        self.write_superblock(&mut st)?;
        st.bitmap.fill(0);
        self.write_bitmap(&st)
    }
}
