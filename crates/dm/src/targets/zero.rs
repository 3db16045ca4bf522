//! `zero`: reads return zeros, writes are accepted and discarded.

use std::any::Any;
use std::io;

use super::config::{TargetConfig, ZeroConfig};
use super::{BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};

/// A bottomless device of zeros (the kernel's `zero` target).
pub struct ZeroTarget {
    len: u64,
}

impl ZeroTarget {
    /// A zero target of `len` bytes.
    pub fn new(len: u64) -> Self {
        ZeroTarget { len }
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        ZeroConfig::parse(args)?;
        Ok(Self::new(ctx.len_bytes()))
    }
}

impl BlockDevice for ZeroTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)
    }
}

impl Target for ZeroTarget {
    fn target_type(&self) -> &'static str {
        ZeroConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        super::config::table_params_of(&ZeroConfig, show_keys)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
