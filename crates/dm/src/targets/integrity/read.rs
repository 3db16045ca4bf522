//! The read path: blocks still in the journal come from memory, the rest from their home
//! locations, with every block's stored tag checked against the internal hash.
//!
//! Invariants: wrong data is never returned — a tag mismatch fails the read with
//! `EILSEQ` and is counted; blocks at or past `recalc_sector`, regions a bitmap crash left
//! unverified (read-only opens) and recovery mode are read unchecked.

use std::io;
use std::sync::atomic::Ordering;

use super::open::{Core, State};
use super::IntegrityMode;
use crate::error::errno;
use crate::SECTOR_SIZE;

impl Core {
    /// Reads and verifies whole blocks at logical `sector` from their home locations.
    /// With `tags_out`, also returns the stored tags (`tag_size` bytes per block).
    pub(super) fn read_home(
        &self,
        st: &State,
        sector: u64,
        buf: &mut [u8],
        tags_out: Option<&mut [u8]>,
    ) -> io::Result<()> {
        // Scratch for the stored and the computed tags: on the stack for usual request
        // sizes, so a read allocates nothing.
        let most = buf.len() / self.cfg.block_size as usize * self.layout.tag_size as usize;
        super::with_scratch(most, |stored| {
            super::with_scratch(most, |computed| {
                self.read_home_with(st, sector, buf, tags_out, stored, computed)
            })
        })
    }

    fn read_home_with(
        &self,
        st: &State,
        sector: u64,
        buf: &mut [u8],
        mut tags_out: Option<&mut [u8]>,
        stored: &mut [u8],
        computed: &mut [u8],
    ) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let verify = self.cfg.mode != IntegrityMode::Recovery && self.hash.is_some();
        let checked_below = self.checked_below(st);
        let spb = self.layout.sectors_per_block as u64;
        let mut cache = None;
        let mut done = 0usize;
        while done < buf.len() {
            let s = sector + (done / 512) as u64;
            let n = ((self.layout.sectors_left_in_area(s) * 512) as usize).min(buf.len() - done);
            let chunk = &mut buf[done..done + n];
            self.dev
                .read_at(self.layout.data_sector(s) * SECTOR_SIZE, chunk)?;
            let verify = verify && !self.region_unverified(st, s, (n / 512) as u64);
            if verify || tags_out.is_some() {
                let nblocks = n / bs;
                let cache = cache.get_or_insert_with(|| self.lock_tags());
                let at = done / bs * ts;
                let tagbuf: &mut [u8] = match tags_out.as_deref_mut() {
                    Some(out) => &mut out[at..at + nblocks * ts],
                    None => &mut stored[..nblocks * ts],
                };
                cache.read(
                    self.mdev().as_ref(),
                    self.tag_run(s),
                    self.layout.tag_position(s),
                    tagbuf,
                )?;
                // Blocks at or past `recalc_sector` have no valid tags yet: not checked.
                let nchecked = (checked_below.saturating_sub(s) / spb).min(nblocks as u64) as usize;
                if let (Some(hash), true) = (&self.hash, verify && nchecked > 0) {
                    let computed = &mut computed[..nchecked * ts];
                    hash.tags(salt.as_ref(), s, bs, &chunk[..nchecked * bs], computed);
                    let tagbuf = &tagbuf[..nchecked * ts];
                    if computed[..] != tagbuf[..] {
                        let k = (0..nchecked)
                            .find(|&k| {
                                computed[k * ts..(k + 1) * ts] != tagbuf[k * ts..(k + 1) * ts]
                            })
                            .unwrap_or(0);
                        let bsec = s + (k * bs / 512) as u64;
                        self.mismatches.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "device-mapper: integrity: {}: Checksum failed at sector 0x{bsec:x}",
                            self.dev_spec
                        );
                        return Err(errno(libc::EILSEQ));
                    }
                }
            }
            done += n;
        }
        Ok(())
    }

    pub(super) fn read_inner(
        &self,
        offset: u64,
        buf: &mut [u8],
        mut tags: Option<&mut [u8]>,
    ) -> io::Result<()> {
        self.check_io(offset, buf.len() as u64)?;
        let st = self.lock();
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let sector = offset / SECTOR_SIZE;
        if st.pending.is_empty() {
            return self.read_home(&st, sector, buf, tags);
        }
        // Runs of blocks not in the journal are read from home; journaled ones from memory.
        let nblocks = buf.len() / bs;
        let mut k = 0;
        while k < nblocks {
            let s = sector + (k * bs / 512) as u64;
            if let Some(&(i, e)) = st.pending.get(&s) {
                st.journal.block(i, e, &mut buf[k * bs..(k + 1) * bs]);
                if let Some(t) = tags.as_deref_mut() {
                    t[k * ts..(k + 1) * ts].copy_from_slice(st.journal.entry_tag(i, e));
                }
                k += 1;
                continue;
            }
            let mut end = k + 1;
            while end < nblocks && !st.pending.contains_key(&(sector + (end * bs / 512) as u64)) {
                end += 1;
            }
            let run_tags = tags.as_deref_mut().map(|t| &mut t[k * ts..end * ts]);
            self.read_home(&st, s, &mut buf[k * bs..end * bs], run_tags)?;
            k = end;
        }
        Ok(())
    }
}
