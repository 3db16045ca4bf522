//! `rbd:pool[/namespace]/image[@snap]`: a Ceph RBD image through librbd (`cryptblk-rbd`).
//!
//! Every request is one librbd asynchronous call waited on by the calling thread, so each
//! caller (an export's worker, a crypt pipeline) keeps its own request in flight and librbd
//! sends a large request to all the objects it covers at once. A snapshot, or a registry
//! opened read-only, opens the image read-only. Failures of the cluster reach the caller as
//! `EIO` (librbd's own errno goes to the log line of the caller, not to the client) and are
//! counted ([`RbdBacking::errors`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use cryptblk_rbd::{Completion, Image, ImageSpec};

use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::SECTOR_SIZE;

/// An RBD image as a block device.
pub struct RbdBacking {
    image: Image,
    spec: ImageSpec,
    size: u64,
    errors: AtomicU64,
}

impl RbdBacking {
    /// Opens the image `text` names (what follows `rbd:`), read-only when `read_only` or a
    /// snapshot is named.
    pub fn open(text: &str, read_only: bool) -> io::Result<RbdBacking> {
        let spec =
            ImageSpec::parse(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let image = Image::open(&spec, read_only)?;
        // A device is whole sectors; librbd images are in practice whole MiB.
        let size = image.size() / SECTOR_SIZE * SECTOR_SIZE;
        Ok(RbdBacking {
            image,
            spec,
            size,
            errors: AtomicU64::new(0),
        })
    }

    /// The image, as `pool[/namespace]/image[@snap]`.
    pub fn image_name(&self) -> String {
        self.spec.to_string()
    }

    /// Requests the cluster failed since the image was opened.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// True if the image was opened read-only.
    pub fn read_only(&self) -> bool {
        self.image.read_only()
    }

    /// Waits for a submitted request; any failure of librbd becomes a counted `EIO`.
    fn finish(&self, submitted: io::Result<Completion<'_>>) -> io::Result<()> {
        match submitted.and_then(Completion::wait) {
            Ok(()) => Ok(()),
            Err(_) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    fn writable(&self) -> io::Result<()> {
        if self.image.read_only() {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        Ok(())
    }
}

impl BlockDevice for RbdBacking {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.finish(self.image.aio_read(offset, buf))
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.writable()?;
        check_range(self.size, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        self.finish(self.image.aio_write(offset, buf))?;
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if self.image.read_only() {
            return Ok(());
        }
        self.finish(self.image.aio_flush())
    }

    fn backing_errors(&self) -> Option<u64> {
        Some(self.errors())
    }

    fn supports_discard(&self) -> bool {
        !self.image.read_only()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(self.size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.finish(self.image.aio_discard(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        check_range(self.size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.finish(self.image.aio_write_zeroes(offset, len))
    }
}
