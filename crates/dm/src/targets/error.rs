//! `error`: every request fails with `EIO`.

use std::any::Any;
use std::io;

use super::config::{ErrorConfig, TargetConfig};
use super::{BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;

/// A device where every I/O fails (the kernel's `error` target).
pub struct ErrorTarget {
    len: u64,
}

impl ErrorTarget {
    /// An error target of `len` bytes.
    pub fn new(len: u64) -> Self {
        ErrorTarget { len }
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        ErrorConfig::parse(args)?;
        Ok(Self::new(ctx.len_bytes()))
    }

    fn fail(&self, offset: u64, len: u64) -> io::Result<()> {
        // Misaligned requests still report EINVAL first, as the block layer would.
        check_range(self.len, offset, len)?;
        Err(errno(libc::EIO))
    }
}

impl BlockDevice for ErrorTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.fail(offset, buf.len() as u64)
    }
    fn write_at(&self, offset: u64, buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        self.fail(offset, buf.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        Err(errno(libc::EIO))
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fail(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fail(offset, len)
    }
}

impl Target for ErrorTarget {
    fn target_type(&self) -> &'static str {
        ErrorConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        super::config::table_params_of(&ErrorConfig, show_keys)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
