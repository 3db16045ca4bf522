//! The block-device abstraction every layer implements.

use std::io;

/// The unit of addressing, as in the kernel: all offsets and lengths are multiples of it.
pub const SECTOR_SIZE: u64 = 512;

/// Flags that travel with a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteFlags {
    /// Force unit access: the data is durable when the call returns.
    pub fua: bool,
}

/// A block device: sector-aligned reads and writes that may be issued concurrently.
///
/// Invariants callers rely on and implementations keep:
/// - Offsets and lengths are in bytes and multiples of [`SECTOR_SIZE`] (and of
///   [`BlockDevice::logical_block_size`]); a misaligned request fails with `EINVAL` and does
///   nothing. A request reaching past [`BlockDevice::size`] fails with `EIO` (as the kernel
///   does past the end of a device) and does nothing.
/// - Methods take `&self` and may be called from many threads at once; a write is visible to
///   every read issued after it returned.
/// - Errors are `io::Error`s carrying the errno the kernel would report (`EIO`, `EILSEQ` for
///   failed integrity checks, `ENOSPC`, `EINVAL`), so exports can map them onto their protocol.
/// - A write acknowledged before a successful [`BlockDevice::flush`] (or written with
///   `fua`) survives a crash.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes (a multiple of [`SECTOR_SIZE`]).
    fn size(&self) -> u64;

    /// Smallest I/O unit in bytes (512 unless a target has larger sectors, e.g. crypt with
    /// `sector_size:4096`).
    fn logical_block_size(&self) -> u32 {
        SECTOR_SIZE as u32
    }

    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Writes `buf` at `offset`.
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()>;

    /// Like [`BlockDevice::write_at`], but the device may use `buf` as scratch space, leaving
    /// its contents undefined. Lets `crypt` encrypt in place instead of copying; callers that
    /// no longer need the data (exports) should prefer it.
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        self.write_at(offset, buf, flags)
    }

    /// Reads `buf.len()` bytes at `offset` and applies `t` to them (decryption, for
    /// `crypt`). Devices that hold their data in memory override this to produce the
    /// result in one pass over memory, where the default reads and then transforms.
    fn read_transformed(
        &self,
        offset: u64,
        buf: &mut [u8],
        t: &dyn CopyTransform,
    ) -> io::Result<()> {
        self.read_at(offset, buf)?;
        t.in_place(0, buf)
    }

    /// Writes `t(buf)` at `offset` (encryption, for `crypt`), leaving `buf` undefined, like
    /// [`BlockDevice::write_at_scratch`]; see [`BlockDevice::read_transformed`].
    fn write_transformed(
        &self,
        offset: u64,
        buf: &mut [u8],
        t: &dyn CopyTransform,
        flags: WriteFlags,
    ) -> io::Result<()> {
        t.in_place(0, buf)?;
        self.write_at_scratch(offset, buf, flags)
    }

    /// Makes every acknowledged write durable.
    fn flush(&self) -> io::Result<()>;

    /// Bytes of caller-supplied integrity metadata ("tags") the device stores with each
    /// logical block, as dm-integrity without an internal hash offers to dm-crypt above it
    /// (the kernel's integrity profile `tuple_size`); 0 = none. The tag travels with the
    /// block: one `tag_size` tuple per [`BlockDevice::logical_block_size`] bytes.
    fn tag_size(&self) -> u32 {
        0
    }

    /// Reads `buf.len()` bytes at `offset` and the blocks' tags into `tags` (exactly
    /// `tag_size` bytes per logical block). Devices without tags fail with `EOPNOTSUPP`.
    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        let _ = (offset, buf, tags);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// Writes `buf` at `offset` together with the blocks' tags (`tag_size` bytes per logical
    /// block), atomically per block where the device is crash safe (dm-integrity's journal).
    /// Devices without tags fail with `EOPNOTSUPP`.
    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        let _ = (offset, buf, tags, flags);
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }

    /// Requests a remote backing store (`rbd:`) failed since it was opened, each of which
    /// reached its caller as `EIO`; `None` for devices that keep no such count.
    fn backing_errors(&self) -> Option<u64> {
        None
    }

    /// True if [`BlockDevice::discard`] can succeed, as the kernel's non-zero
    /// `max_discard_sectors`: an export advertises discard only then, so clients never send
    /// discards that fail.
    fn supports_discard(&self) -> bool {
        true
    }

    /// Tells the device that a range's contents are no longer needed. Reads of a discarded
    /// range return unspecified data (zeros where the backing supports it).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Makes a range read as zeros.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.write_at(offset + done, &chunk[..n], WriteFlags::default())?;
            done += n as u64;
        }
        Ok(())
    }
}

/// A transformation of a request's data applied while it moves between a caller's buffer
/// and a device (see [`BlockDevice::read_transformed`]).
///
/// `pos` is the byte position of the piece within the request. Devices call it on pieces
/// that start and end at multiples of 4096 bytes within the request (or on the whole
/// request), so transforms over encryption sectors of up to 4 KiB always see whole sectors.
pub trait CopyTransform: Sync {
    /// Transforms `buf`, the request's bytes from `pos` on, in place.
    fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()>;
    /// Writes the transform of `src` (the request's bytes from `pos` on) to `dst`, which
    /// has the same length.
    fn copy(&self, pos: usize, src: &[u8], dst: &mut [u8]) -> io::Result<()> {
        dst.copy_from_slice(src);
        self.in_place(pos, dst)
    }
}

/// Checks a request against the alignment and size rules of [`BlockDevice`].
pub fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    if !offset.is_multiple_of(SECTOR_SIZE) || !len.is_multiple_of(SECTOR_SIZE) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::from_raw_os_error(libc::EIO)),
    }
}
