//! `delay <dev> <offset> <delay_ms> [<write_dev> <offset> <delay_ms> [<flush_dev> <offset>
//! <delay_ms>]]`: delays each class of I/O, optionally sending it to a different device.
//!
//! With three arguments the one delay applies to reads, writes and flushes; with six,
//! flushes follow the write class (as the kernel does). Discards count as writes.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::config::{table_params_of, DelayClassConfig, DelayConfig, TargetConfig};
use super::{BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::SECTOR_SIZE;

/// One I/O class: where it goes and how long it waits.
struct DelayClass {
    dev: Arc<dyn BlockDevice>,
    offset_sectors: u64,
    delay_ms: u32,
}

impl DelayClass {
    fn open(ctx: &BuildContext<'_>, cfg: &DelayClassConfig) -> Result<Self, String> {
        Ok(DelayClass {
            dev: ctx.open_device(&cfg.device, cfg.offset)?,
            offset_sectors: cfg.offset,
            delay_ms: cfg.delay_ms,
        })
    }

    fn wait(&self) {
        if self.delay_ms > 0 {
            // The kernel parks the bio on a timer; a blocked caller is the same latency.
            std::thread::sleep(Duration::from_millis(u64::from(self.delay_ms)));
        }
    }

    fn base(&self) -> u64 {
        self.offset_sectors * SECTOR_SIZE
    }

    fn clone_class(&self) -> Self {
        DelayClass {
            dev: self.dev.clone(),
            offset_sectors: self.offset_sectors,
            delay_ms: self.delay_ms,
        }
    }
}

/// Delays reads, writes and flushes by configurable amounts.
pub struct DelayTarget {
    read: DelayClass,
    write: DelayClass,
    flush: DelayClass,
    /// The classes as the table gave them (a class left out is printed left out).
    config: DelayConfig,
    len: u64,
}

impl DelayTarget {
    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &DelayConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its devices.
    pub(crate) fn from_config(ctx: &BuildContext<'_>, cfg: &DelayConfig) -> Result<Self, String> {
        let read = DelayClass::open(ctx, &cfg.read)?;
        let write = match &cfg.write {
            Some(w) => DelayClass::open(ctx, w)?,
            None => read.clone_class(),
        };
        let flush = match &cfg.flush {
            Some(f) => DelayClass::open(ctx, f)?,
            None => write.clone_class(),
        };
        Ok(DelayTarget {
            read,
            write,
            flush,
            config: cfg.clone(),
            len: ctx.len_bytes(),
        })
    }

    /// The table arguments of this target.
    pub fn config(&self) -> &DelayConfig {
        &self.config
    }
}

impl BlockDevice for DelayTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn logical_block_size(&self) -> u32 {
        self.read
            .dev
            .logical_block_size()
            .max(self.write.dev.logical_block_size())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.read.wait();
        self.read.dev.read_at(self.read.base() + offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.write.wait();
        self.write
            .dev
            .write_at(self.write.base() + offset, buf, flags)
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        self.write.wait();
        self.write
            .dev
            .write_at_scratch(self.write.base() + offset, buf, flags)
    }
    fn flush(&self) -> io::Result<()> {
        self.flush.wait();
        self.flush.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        self.write.wait();
        self.write.dev.discard(self.write.base() + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        self.write.wait();
        self.write.dev.write_zeroes(self.write.base() + offset, len)
    }
}

impl Target for DelayTarget {
    fn target_type(&self) -> &'static str {
        DelayConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        table_params_of(&self.config, show_keys)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
