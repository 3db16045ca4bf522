//! [`Core`] as a [`BlockDevice`]: range, alignment and failure checks, tagged I/O rules,
//! and dispatch of reads, writes and flushes to the paths of the device's mode.
//!
//! Invariants: every I/O is checked against the mapping size, the block size and the
//! failure latch before it starts; tagged I/O needs external tags, one per block; a flush
//! commits the journal (J), flushes both devices (D) or cleans the bitmap (B).

use std::io;

use super::open::Core;
use super::IntegrityMode;
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;

impl Core {
    /// Tagged I/O needs external tags and exactly one tag per block.
    pub(super) fn check_tags(&self, len: usize, tags_len: usize) -> io::Result<()> {
        if self.hash.is_some() {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let blocks = len / self.cfg.block_size as usize;
        if tags_len != blocks * self.layout.tag_size as usize {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    pub(super) fn check_io(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        let bs = self.cfg.block_size as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(errno(libc::EINVAL));
        }
        self.check_failed()
    }
}

impl BlockDevice for Core {
    fn size(&self) -> u64 {
        self.len
    }

    fn logical_block_size(&self) -> u32 {
        self.cfg.block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_inner(offset, buf, None)
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.write_inner(offset, buf, None, flags)
    }

    fn tag_size(&self) -> u32 {
        if self.hash.is_none() {
            self.layout.tag_size
        } else {
            0
        }
    }

    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        self.check_tags(buf.len(), tags.len())?;
        self.read_inner(offset, buf, Some(tags))
    }

    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.check_tags(buf.len(), tags.len())?;
        self.write_inner(offset, buf, Some(tags), flags)
    }

    fn flush(&self) -> io::Result<()> {
        self.check_failed()?;
        if self.cfg.read_only {
            return Ok(());
        }
        let mut st = self.lock();
        match self.cfg.mode {
            IntegrityMode::Journal => self.commit(&mut st),
            IntegrityMode::Direct => {
                self.dev.flush()?;
                self.mdev().flush()
            }
            IntegrityMode::Bitmap => self.clean_bitmap(&mut st),
            IntegrityMode::Recovery => Ok(()),
        }
    }
}
