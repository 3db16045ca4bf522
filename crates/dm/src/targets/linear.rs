//! `linear <dev> <offset>`: maps the range onto another device at a sector offset.

use std::any::Any;
use std::io;
use std::sync::Arc;

use super::config::{LinearConfig, TargetConfig};
use super::{BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::SECTOR_SIZE;

/// Remaps I/O onto `<dev>` starting at `<offset>` sectors.
pub struct LinearTarget {
    dev: Arc<dyn BlockDevice>,
    dev_spec: String,
    offset_sectors: u64,
    len: u64,
}

impl LinearTarget {
    /// A linear target of `len` bytes over `dev` at `offset_sectors`.
    pub fn new(dev: Arc<dyn BlockDevice>, dev_spec: &str, offset_sectors: u64, len: u64) -> Self {
        LinearTarget {
            dev,
            dev_spec: dev_spec.to_string(),
            offset_sectors,
            len,
        }
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &LinearConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its device.
    pub(crate) fn from_config(ctx: &BuildContext<'_>, cfg: &LinearConfig) -> Result<Self, String> {
        let dev = ctx.open_device(&cfg.device, cfg.offset)?;
        Ok(Self::new(dev, &cfg.device, cfg.offset, ctx.len_bytes()))
    }

    /// The table arguments of this target.
    pub fn config(&self) -> LinearConfig {
        LinearConfig {
            device: self.dev_spec.clone(),
            offset: self.offset_sectors,
        }
    }

    fn base(&self) -> u64 {
        self.offset_sectors * SECTOR_SIZE
    }
}

impl BlockDevice for LinearTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn logical_block_size(&self) -> u32 {
        self.dev.logical_block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.dev.read_at(self.base() + offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.dev.write_at(self.base() + offset, buf, flags)
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.dev.write_at_scratch(self.base() + offset, buf, flags)
    }
    fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }
    fn tag_size(&self) -> u32 {
        self.dev.tag_size()
    }
    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.dev.read_with_tags(self.base() + offset, buf, tags)
    }
    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.dev
            .write_with_tags(self.base() + offset, buf, tags, flags)
    }
    fn supports_discard(&self) -> bool {
        self.dev.supports_discard()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        self.dev.discard(self.base() + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        self.dev.write_zeroes(self.base() + offset, len)
    }
}

impl Target for LinearTarget {
    fn target_type(&self) -> &'static str {
        LinearConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        super::config::table_params_of(&self.config(), show_keys)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
