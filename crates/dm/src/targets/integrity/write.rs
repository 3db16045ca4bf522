//! The write paths: journaled writes (J mode, committed on FUA, at `journal_watermark`,
//! by a flush or the timer), direct in-place writes of data and tags (D and B modes, and
//! wiping), the tags a write stores, and the mode dispatch of a write.
//!
//! Invariants: data and tag of a block always travel together (one journal entry, or a
//! data write followed by its tag write through the tag cache); writes always store valid
//! tags (internal hash) or the caller's; read-only and recovery devices refuse writes
//! with `EROFS`; in B mode the region is marked dirty on disk before the write.

use std::io;

use super::open::{Core, State};
use super::tagcache::TagCache;
use super::IntegrityMode;
use crate::device::WriteFlags;
use crate::error::errno;
use crate::SECTOR_SIZE;

impl Core {
    /// Journals whole blocks at logical `sector` (J mode).
    pub(super) fn journal_write(
        &self,
        st: &mut State,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> io::Result<()> {
        let salt = self.salt(&st.sb);
        self.with_tags(salt.as_ref(), sector, data, given, |tags| {
            self.journal_put(st, sector, data, tags)
        })?;
        // `journal_watermark`: once this share of the journal holds uncommitted sections,
        // commit, so unflushed writes reach the disk without waiting for a full journal.
        // (The kernel starts that commit in the background; here the write that crosses the
        // watermark does it.)
        // Counted in entries, as the kernel's free-sectors threshold is.
        let per_section = u64::from(st.journal.section_entries);
        let used = u64::from(st.n_uncommitted) * per_section + u64::from(st.free_entry);
        let total = u64::from(st.journal.sections) * per_section;
        if used > 0 && used * 100 >= total * u64::from(self.cfg.journal_watermark) {
            self.commit(st)?;
        }
        Ok(())
    }

    /// Puts whole blocks and their `tags` into the next free journal entries, committing
    /// first whenever the journal is full.
    fn journal_put(&self, st: &mut State, sector: u64, data: &[u8], tags: &[u8]) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        for (k, block) in data.chunks_exact(bs).enumerate() {
            if st.free_entry == 0 && st.n_uncommitted == st.journal.sections {
                self.commit(st)?;
            }
            let s = sector + (k * bs / 512) as u64;
            let (i, e) = (st.free_section, st.free_entry);
            st.journal.put(i, e, s, block, &tags[k * ts..(k + 1) * ts]);
            st.pending.insert(s, (i, e));
            st.free_entry += 1;
            if st.free_entry == st.journal.section_entries {
                st.free_entry = 0;
                st.free_section = (st.free_section + 1) % st.journal.sections;
                st.n_uncommitted += 1;
            }
        }
        Ok(())
    }

    /// Writes whole blocks and their tags in place (D and B modes, and wiping).
    pub(super) fn direct_write(
        &self,
        st: &State,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let mut done = 0usize;
        let mut cache = self.lock_tags();
        while done < data.len() {
            let s = sector + (done / 512) as u64;
            let n = ((self.layout.sectors_left_in_area(s) * 512) as usize).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.dev.write_at(
                self.layout.data_sector(s) * SECTOR_SIZE,
                chunk,
                WriteFlags::default(),
            )?;
            let g = given.map(|t| &t[done / bs * ts..(done + n) / bs * ts]);
            self.with_tags(salt.as_ref(), s, chunk, g, |tags| {
                self.store_tags(&mut cache, s, tags)
            })?;
            done += n;
        }
        Ok(())
    }

    /// Calls `f` with the tags of the whole blocks in `data` (the first at logical
    /// `sector`): the caller's (`given`, one per block, used as they are), else the
    /// internal hash's, else zeros (an untagged write to an external-tag device); computed
    /// tags live in a scratch buffer on the stack for requests of usual sizes.
    pub(super) fn with_tags<R>(
        &self,
        salt: Option<&[u8; 16]>,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        if let Some(t) = given {
            return f(t);
        }
        super::with_scratch(data.len() / bs * ts, |out| {
            if let Some(h) = &self.hash {
                h.tags(salt, sector, bs, data, out);
            }
            f(out)
        })
    }

    /// Writes the tags of consecutive blocks from logical `sector` (all in one area)
    /// through the cache and out to the metadata device.
    pub(super) fn store_tags(
        &self,
        cache: &mut TagCache,
        sector: u64,
        tags: &[u8],
    ) -> io::Result<()> {
        let mdev = self.mdev().as_ref();
        let r = cache
            .write(
                mdev,
                self.tag_run(sector),
                self.layout.tag_position(sector),
                tags,
            )
            .and_then(|()| cache.flush(mdev));
        if r.is_err() {
            cache.discard_dirty();
        }
        r
    }

    pub(super) fn write_inner(
        &self,
        offset: u64,
        buf: &[u8],
        tags: Option<&[u8]>,
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.check_io(offset, buf.len() as u64)?;
        if self.cfg.read_only {
            return Err(errno(libc::EROFS));
        }
        let mut st = self.lock();
        let sector = offset / SECTOR_SIZE;
        match self.cfg.mode {
            IntegrityMode::Recovery => Err(errno(libc::EROFS)),
            IntegrityMode::Journal => {
                // Data and tag go into the same journal entry, so a commit makes both
                // durable together.
                self.journal_write(&mut st, sector, buf, tags)?;
                if flags.fua {
                    self.commit(&mut st)?;
                }
                if st.n_uncommitted > 0 || st.free_entry > 0 {
                    self.arm_timer();
                }
                Ok(())
            }
            IntegrityMode::Direct => {
                self.direct_write(&st, sector, buf, tags)?;
                if flags.fua {
                    self.dev.flush()?;
                    self.mdev().flush()?;
                }
                Ok(())
            }
            IntegrityMode::Bitmap => {
                self.mark_dirty(&mut st, sector, buf.len() as u64 / SECTOR_SIZE)?;
                self.direct_write(&st, sector, buf, tags)?;
                if flags.fua {
                    self.dev.flush()?;
                    self.mdev().flush()?;
                }
                Ok(())
            }
        }
    }

    /// Writes zeros with valid tags over the whole provided area, then flushes (what
    /// `integritysetup format` does through the mapping unless `--no-wipe`).
    pub fn wipe(&self) -> io::Result<()> {
        if self.cfg.read_only {
            return Err(errno(libc::EROFS));
        }
        let st = self.lock();
        let chunk = vec![0u8; 1 << 20];
        let total = self.layout.provided_data_sectors * SECTOR_SIZE;
        let mut off = 0u64;
        while off < total {
            let n = (total - off).min(chunk.len() as u64) as usize;
            self.direct_write(&st, off / SECTOR_SIZE, &chunk[..n], None)?;
            off += n as u64;
        }
        self.dev.flush()?;
        self.mdev().flush()
    }
}
