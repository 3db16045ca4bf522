//! Byte-granular I/O on top of a block device that only takes whole logical blocks.
//!
//! Exports receive requests at any byte offset (FUSE always, NBD from clients that did not
//! agree to block-size constraints). Partial blocks are served by read-modify-write. An RMW
//! takes an exclusive lock while aligned writes share it, so a concurrent write can never be
//! undone by an RMW that read the block before it and wrote it back after it.

use std::io;
use std::sync::{Arc, RwLock};

use cryptblk_dm::device::{BlockDevice, WriteFlags};

/// A [`BlockDevice`] wrapper that accepts byte-granular requests.
pub struct AlignedIo {
    device: Arc<dyn BlockDevice>,
    block: u64,
    rmw_lock: RwLock<()>,
}

/// Largest buffer used when zeroing partial blocks or bouncing unaligned reads, per step.
const BOUNCE_CHUNK: u64 = 4 << 20;

impl AlignedIo {
    /// Wraps `device`; partial blocks are relative to its logical block size.
    pub fn new(device: Arc<dyn BlockDevice>) -> Self {
        let block = u64::from(device.logical_block_size().max(1));
        AlignedIo {
            device,
            block,
            rmw_lock: RwLock::new(()),
        }
    }

    /// The wrapped device.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Logical block size of the device in bytes.
    pub fn block_size(&self) -> u64 {
        self.block
    }

    /// Size of the device in bytes.
    pub fn size(&self) -> u64 {
        self.device.size()
    }

    /// Whether `offset` and `len` are both multiples of the logical block size.
    pub fn is_aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.block) && len.is_multiple_of(self.block)
    }

    fn check_end(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    fn shared(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.rmw_lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.rmw_lock.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads `buf.len()` bytes at `offset`, at any alignment.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len() as u64;
        self.check_end(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.is_aligned(offset, len) {
            return self.device.read_at(offset, buf);
        }
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let start = pos - pos % self.block;
            let step = (len - done).min(BOUNCE_CHUNK);
            let end = round_up(pos + step, self.block);
            let mut bounce = vec![0u8; (end - start) as usize];
            self.device.read_at(start, &mut bounce)?;
            let skip = (pos - start) as usize;
            buf[done as usize..(done + step) as usize]
                .copy_from_slice(&bounce[skip..skip + step as usize]);
            done += step;
        }
        Ok(())
    }

    /// Writes `data` at `offset`, at any alignment; may clobber `data` (scratch semantics).
    pub fn write_at_scratch(
        &self,
        offset: u64,
        data: &mut [u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        let len = data.len() as u64;
        self.check_end(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.is_aligned(offset, len) {
            let _guard = self.shared();
            return self.device.write_at_scratch(offset, data, flags);
        }
        self.write_unaligned(offset, data, flags)
    }

    /// Writes `data` at `offset`, at any alignment, leaving `data` untouched.
    pub fn write_at(&self, offset: u64, data: &[u8], flags: WriteFlags) -> io::Result<()> {
        let len = data.len() as u64;
        self.check_end(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.is_aligned(offset, len) {
            let _guard = self.shared();
            return self.device.write_at(offset, data, flags);
        }
        self.write_unaligned(offset, data, flags)
    }

    /// Read-modify-write of the blocks covering `[offset, offset + data.len())`.
    fn write_unaligned(&self, offset: u64, data: &[u8], flags: WriteFlags) -> io::Result<()> {
        let len = data.len() as u64;
        let start = offset - offset % self.block;
        let end = round_up(offset + len, self.block);
        let _guard = self.exclusive();
        let mut bounce = vec![0u8; (end - start) as usize];
        // Only the first and last block hold bytes we must keep; the rest is overwritten.
        let first = start..start + self.block;
        self.device
            .read_at(first.start, &mut bounce[..self.block as usize])?;
        if end - self.block > start {
            let tail = (end - self.block - start) as usize;
            self.device.read_at(end - self.block, &mut bounce[tail..])?;
        }
        let skip = (offset - start) as usize;
        bounce[skip..skip + data.len()].copy_from_slice(data);
        self.device.write_at_scratch(start, &mut bounce, flags)
    }

    /// Makes `[offset, offset + len)` read as zeros, at any alignment.
    pub fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> io::Result<()> {
        self.check_end(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let head_end = round_up(offset, self.block).min(offset + len);
        let tail_start = (offset + len) - (offset + len) % self.block;
        if head_end > offset {
            let zeros = vec![0u8; (head_end - offset) as usize];
            self.write_at(offset, &zeros, WriteFlags::default())?;
        }
        if tail_start > head_end {
            let _guard = self.shared();
            self.device.write_zeroes(head_end, tail_start - head_end)?;
        }
        if offset + len > tail_start.max(head_end) {
            let from = tail_start.max(head_end);
            let zeros = vec![0u8; (offset + len - from) as usize];
            self.write_at(from, &zeros, WriteFlags::default())?;
        }
        if flags.fua {
            self.device.flush()?;
        }
        Ok(())
    }

    /// Discards the whole blocks inside `[offset, offset + len)`; partial blocks are left
    /// alone, which discard's "contents unspecified" semantics allow.
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_end(offset, len)?;
        let start = round_up(offset, self.block);
        let end = (offset + len) - (offset + len) % self.block;
        if end > start {
            let _guard = self.shared();
            self.device.discard(start, end - start)?;
        }
        Ok(())
    }

    /// Makes every acknowledged write durable.
    pub fn flush(&self) -> io::Result<()> {
        self.device.flush()
    }
}

fn round_up(value: u64, to: u64) -> u64 {
    value.div_ceil(to) * to
}
