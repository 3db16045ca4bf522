//! `delay <dev> <offset> <delay_ms> [<write_dev> <offset> <delay_ms> [<flush_dev> <offset>
//! <delay_ms>]]`: delays each class of I/O, optionally sending it to a different device.
//!
//! With three arguments the one delay applies to reads, writes and flushes; with six,
//! flushes follow the write class (as the kernel does). Discards count as writes.

use std::any::Any;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::{arg_u32, arg_u64, BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::SECTOR_SIZE;

/// One I/O class: where it goes and how long it waits.
struct DelayClass {
    dev: Arc<dyn BlockDevice>,
    dev_spec: String,
    offset_sectors: u64,
    delay_ms: u32,
}

impl DelayClass {
    fn parse(ctx: &BuildContext<'_>, args: &[String], at: usize) -> Result<Self, String> {
        let offset_sectors = arg_u64(args, at + 1, "offset")?;
        let delay_ms = arg_u32(args, at + 2, "delay")?;
        let dev = ctx.open_device(&args[at], offset_sectors)?;
        Ok(DelayClass {
            dev,
            dev_spec: args[at].clone(),
            offset_sectors,
            delay_ms,
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

    fn params(&self) -> String {
        format!(
            "{} {} {}",
            self.dev_spec, self.offset_sectors, self.delay_ms
        )
    }

    fn clone_class(&self) -> Self {
        DelayClass {
            dev: self.dev.clone(),
            dev_spec: self.dev_spec.clone(),
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
    argc: usize,
    len: u64,
}

impl DelayTarget {
    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        if ![3, 6, 9].contains(&args.len()) {
            return Err(format!(
                "wrong number of arguments ({}); usage: delay <dev> <offset> <delay_ms> \
                 [<write_dev> <offset> <delay_ms> [<flush_dev> <offset> <delay_ms>]]",
                args.len()
            ));
        }
        let read = DelayClass::parse(ctx, args, 0)?;
        let write = if args.len() >= 6 {
            DelayClass::parse(ctx, args, 3)?
        } else {
            read.clone_class()
        };
        let flush = if args.len() == 9 {
            DelayClass::parse(ctx, args, 6)?
        } else {
            write.clone_class()
        };
        Ok(DelayTarget {
            read,
            write,
            flush,
            argc: args.len(),
            len: ctx.len_bytes(),
        })
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
        "delay"
    }
    fn table_params(&self, _show_keys: bool) -> String {
        let mut s = self.read.params();
        if self.argc >= 6 {
            s.push(' ');
            s.push_str(&self.write.params());
        }
        if self.argc == 9 {
            s.push(' ');
            s.push_str(&self.flush.params());
        }
        s
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
