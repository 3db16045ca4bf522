//! Bringing a device back at open (the kernel's `dm_integrity_resume`): after a
//! bitmap-mode crash, the tags of dirty regions are recalculated from the data; otherwise
//! the journal is replayed — the newest completely written run of sections is found by
//! the kernel's commit-id rules, its MACs checked, and its entries applied home.
//!
//! Invariants: a crash at any point leaves each block either old or new (only fully
//! committed sections are applied); a journal MAC mismatch fails the device with `EILSEQ`
//! and writes nothing; read-only opens replay into memory only and never write.

use std::io;
use std::sync::atomic::Ordering;

use super::journal::{next_seq, prev_seq, Journal, N_COMMIT_IDS};
use super::open::{Core, State};
use super::superblock::FLAG_DIRTY_BITMAP;
use super::IntegrityMode;

impl Core {
    /// The kernel's `dm_integrity_resume`: after a bitmap-mode crash, recalculates the tags
    /// of dirty regions (all of them when the bitmap granularity changed or the device is
    /// opened in another mode); otherwise replays the journal. In bitmap mode the journal
    /// area then holds the (clean) bitmap and the superblock says it is in use.
    pub(super) fn resume(&self, st: &mut State, just_formatted: bool) -> io::Result<()> {
        let bits = self
            .layout
            .provided_data_sectors
            .div_ceil(1u64 << self.bitmap_shift);
        let bitmap_bytes = (bits.div_ceil(4096 * 8) * 4096) as usize;
        if self.cfg.read_only {
            return self.resume_read_only(st, bitmap_bytes);
        }
        if st.sb.flags & FLAG_DIRTY_BITMAP != 0 {
            let mut bitmap = vec![0u8; bitmap_bytes];
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut bitmap)?;
            let same_granularity = st.sb.log2_blocks_per_bitmap_bit as u32
                + self.layout.log2_sectors_per_block as u32
                == self.bitmap_shift;
            if self.cfg.mode == IntegrityMode::Bitmap && same_granularity {
                for bit in 0..bits {
                    if bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0 {
                        self.recalculate(st, bit << self.bitmap_shift, 1u64 << self.bitmap_shift)?;
                    }
                }
            } else {
                self.recalculate(st, 0, self.layout.provided_data_sectors)?;
            }
            if self.cfg.mode != IntegrityMode::Bitmap {
                let n = st.journal.sections;
                st.journal.init_sections(0, n, 0);
                self.write_journal_sections(st, 0, n)?;
                st.sb.flags &= !FLAG_DIRTY_BITMAP;
                self.write_superblock(st)?;
                return self.replay(st, true);
            }
        } else {
            self.replay(st, just_formatted)?;
        }
        if self.cfg.mode == IntegrityMode::Bitmap {
            st.sb.flags |= FLAG_DIRTY_BITMAP;
            st.sb.log2_blocks_per_bitmap_bit =
                (self.bitmap_shift - self.layout.log2_sectors_per_block as u32) as u8;
            self.write_superblock(st)?;
            st.bitmap = vec![0u8; bitmap_bytes];
            self.write_bitmap(st)?;
        }
        Ok(())
    }

    /// [`Core::resume`] without writing: after a bitmap-mode crash, the regions whose tags
    /// would be recalculated are read unchecked instead (the journal area holds the bitmap,
    /// there is no journal to replay); otherwise the journal is replayed into memory.
    pub(super) fn resume_read_only(&self, st: &mut State, bitmap_bytes: usize) -> io::Result<()> {
        if st.sb.flags & FLAG_DIRTY_BITMAP == 0 {
            return self.replay(st, false);
        }
        let same_granularity = st.sb.log2_blocks_per_bitmap_bit as u32
            + self.layout.log2_sectors_per_block as u32
            == self.bitmap_shift;
        st.unverified = vec![0xff; bitmap_bytes];
        if self.cfg.mode == IntegrityMode::Bitmap && same_granularity {
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut st.unverified)?;
        }
        Ok(())
    }

    /// The kernel's `replay_journal`: finds the newest completely written run of
    /// sections, applies its entries, and decides where writing continues.
    pub(super) fn replay(&self, st: &mut State, just_formatted: bool) -> io::Result<()> {
        let n = st.journal.sections;
        if !just_formatted {
            let mut buf = std::mem::take(&mut st.journal.buf);
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut buf)?;
            if let Some(c) = &self.jcrypt {
                c.apply(0, &mut buf, false);
            }
            st.journal.buf = buf;
        }
        let mut used = [false; N_COMMIT_IDS as usize];
        let mut max_sec = [0u32; N_COMMIT_IDS as usize];
        let mut journal_empty = true;
        let mut corrupt = false;
        'scan: for i in 0..n {
            for j in 0..st.journal.section_sectors() {
                match st.journal.find_seq(i, j) {
                    Some(k) => {
                        used[k as usize] = true;
                        max_sec[k as usize] = i;
                    }
                    None => {
                        corrupt = true;
                        break 'scan;
                    }
                }
            }
            if journal_empty && (0..st.journal.section_entries).any(|e| !st.journal.is_unused(i, e))
            {
                journal_empty = false;
            }
        }
        let mut last_used = 0u8;
        let mut write_start = 0u32;
        let mut write_sections = 0u32;
        let mut want = 0u8;
        if corrupt {
            eprintln!(
                "device-mapper: integrity: {}: journal commit id mismatch",
                self.dev_spec
            );
            self.fail(libc::EIO);
        } else {
            let unused: u8 = if !used[N_COMMIT_IDS as usize - 1] {
                let mut u = N_COMMIT_IDS - 1;
                while u > 0 && !used[u as usize - 1] {
                    u -= 1;
                }
                u
            } else {
                match (0..N_COMMIT_IDS).find(|&u| !used[u as usize]) {
                    Some(u) => u,
                    None => {
                        self.fail(libc::EIO);
                        N_COMMIT_IDS
                    }
                }
            };
            if unused < N_COMMIT_IDS {
                last_used = prev_seq(unused);
                want = prev_seq(last_used);
                if !used[want as usize] && used[prev_seq(want) as usize] {
                    journal_empty = true;
                }
                write_start = max_sec[last_used as usize] + 1;
                if write_start >= n {
                    want = next_seq(want);
                    write_start -= n;
                }
                let mut i = write_start;
                'count: while write_sections < n {
                    for j in 0..st.journal.section_sectors() {
                        if st.journal.stored_commit_id(i, j) != st.journal.commit_id(i, j, want) {
                            break 'count;
                        }
                    }
                    i += 1;
                    if i >= n {
                        want = next_seq(want);
                        i = 0;
                    }
                    write_sections += 1;
                }
                if !journal_empty {
                    if !self.check_section_macs(st, write_start, write_sections) {
                        // The device is failed: every I/O returns the error. Nothing is
                        // written, so the journal stays on disk as it was found.
                        return Ok(());
                    }
                    self.apply_sections(st, write_start, write_sections, true)?;
                }
            }
        }
        let continue_section;
        if self.failed.load(Ordering::SeqCst) == 0
            && write_sections == n
            && (self.cfg.mode == IntegrityMode::Journal || journal_empty)
        {
            continue_section = write_start;
            st.commit_seq = want;
        } else {
            // Clear the journal with a sequence number older than anything on disk.
            let erase_seq = prev_seq(prev_seq(last_used));
            if !self.cfg.read_only {
                // (Read-only: the replayed blocks stay in the in-memory journal.)
                st.journal.init_sections(0, n, erase_seq);
                self.write_journal_sections(st, 0, n)?;
            }
            continue_section = 0;
            st.commit_seq = next_seq(erase_seq);
        }
        st.free_section = continue_section;
        st.free_entry = 0;
        st.uncommitted_section = continue_section;
        st.n_uncommitted = 0;
        if !self.cfg.read_only {
            st.pending.clear();
        }
        Ok(())
    }

    /// Whether the journal MACs of sections `start..start+count` (wrapping) match; a
    /// mismatch is logged, counted and fails the device with `EILSEQ` (the kernel's
    /// `rw_section_mac` at replay).
    pub(super) fn check_section_macs(&self, st: &State, start: u32, count: u32) -> bool {
        let Some(m) = &self.jmac else { return true };
        let salt = self.salt(&st.sb);
        for k in 0..count {
            let i = (start + k) % st.journal.sections;
            let sec = &st.journal.buf[st.journal.section_range(i)];
            let mac = m.section_mac(salt.as_ref(), i, &st.journal.entry_sectors(sec));
            let ok = (0..8u32).all(|j| {
                cryptblk_cipher::secret::ct_eq(
                    &sec[Journal::mac_range(j)],
                    &mac[j as usize * 8..j as usize * 8 + 8],
                )
            });
            if !ok {
                eprintln!(
                    "device-mapper: integrity: {}: Error on journal mac: section {i}",
                    self.dev_spec
                );
                self.mismatches.fetch_add(1, Ordering::Relaxed);
                self.fail(libc::EILSEQ);
                return false;
            }
        }
        true
    }
}
