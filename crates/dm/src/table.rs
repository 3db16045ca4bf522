//! dm tables: parsing `<start> <len> <target> <args...>` lines, building the targets, and
//! the resulting multi-target [`Table`] device.

use std::io;
use std::sync::Arc;

use cryptblk_cipher::SecretText;
use zeroize::{Zeroize, Zeroizing};

use crate::device::{BlockDevice, WriteFlags};
use crate::error::{errno, DmError};
use crate::resolver::{DeviceResolver, LoadOptions};
use crate::spec::TableSpec;
pub use crate::table_text::{parse_table_lines, TableLine};
use crate::targets::{build_target, BuildContext, StatusType, Target};
use crate::SECTOR_SIZE;

/// A built target and its place in the table.
pub struct TableEntry {
    /// First sector.
    pub start: u64,
    /// Length in sectors.
    pub len: u64,
    /// The target.
    pub target: Arc<dyn Target>,
}

/// A loaded table: its targets laid end to end form one block device.
pub struct Table {
    entries: Vec<TableEntry>,
    size: u64,
    logical_block_size: u32,
}

impl Table {
    /// Parses `text` and builds every target, opening devices through `resolver`, with
    /// default [`LoadOptions`] (read-write, fastest cipher implementation).
    pub fn load(text: &str, resolver: &dyn DeviceResolver) -> Result<Table, DmError> {
        Self::load_with(text, resolver, &LoadOptions::default())
    }

    /// Like [`Table::load`], with the settings targets are built with.
    pub fn load_with(
        text: &str,
        resolver: &dyn DeviceResolver,
        options: &LoadOptions,
    ) -> Result<Table, DmError> {
        let mut lines = parse_table_lines(text)?;
        let mut entries = Vec::with_capacity(lines.len());
        let mut result = Ok(());
        for line in &lines {
            let ctx = BuildContext {
                resolver,
                options,
                target_type: &line.target_type,
                len: line.len,
                args: &line.args,
            };
            match build_target(&ctx) {
                Ok(target) => entries.push(TableEntry {
                    start: line.start,
                    len: line.len,
                    target,
                }),
                Err(msg) => {
                    result = Err(DmError::table(
                        line.line,
                        format!("{} target: {msg}", line.target_type),
                    ));
                    break;
                }
            }
        }
        // The parsed arguments may hold a hex key; wipe them now that targets keep their
        // own copies in SecretBytes.
        for line in &mut lines {
            line.args.iter_mut().for_each(Zeroize::zeroize);
        }
        result?;
        Self::from_entries(entries)
    }

    /// Builds every target of a typed table (see [`crate::spec`]), opening devices through
    /// `resolver`; errors name the line as for text.
    pub fn load_spec(spec: &TableSpec, resolver: &dyn DeviceResolver) -> Result<Table, DmError> {
        // One path for both forms: the printed text (keys shown, wiped after) is exactly
        // what the lines' configs parse back from.
        Self::load(&spec.to_text(true), resolver)
    }

    /// Assembles a table from already-built targets (must be contiguous from 0).
    pub fn from_entries(entries: Vec<TableEntry>) -> Result<Table, DmError> {
        let mut next = 0;
        let mut lbs = SECTOR_SIZE as u32;
        for (i, e) in entries.iter().enumerate() {
            if e.start != next || e.len == 0 || e.target.size() != e.len * SECTOR_SIZE {
                return Err(DmError::TableShape(format!(
                    "entry {} does not continue the table at sector {next}",
                    i + 1
                )));
            }
            lbs = lbs.max(e.target.logical_block_size());
            next += e.len;
        }
        if entries.is_empty() {
            return Err(DmError::TableShape("table has no targets".into()));
        }
        for (i, e) in entries.iter().enumerate() {
            // A boundary inside a logical block would split blocks across targets.
            if !(e.start * SECTOR_SIZE).is_multiple_of(u64::from(lbs)) {
                return Err(DmError::table(
                    i + 1,
                    format!(
                        "target start {} is not aligned to the table's {lbs}-byte logical block",
                        e.start
                    ),
                ));
            }
        }
        Ok(Table {
            entries,
            size: next * SECTOR_SIZE,
            logical_block_size: lbs,
        })
    }

    /// The targets in order.
    pub fn entries(&self) -> &[TableEntry] {
        &self.entries
    }

    /// The table as `dmsetup table` prints it (one line per target, `\n`-terminated); with
    /// `show_keys` it holds keys, so it is locked text, wiped on drop.
    pub fn format(&self, show_keys: bool) -> SecretText {
        self.status_lines(StatusType::Table { show_keys })
    }

    /// The table's status as `dmsetup status` prints it.
    pub fn status(&self) -> String {
        self.status_lines(StatusType::Info).as_str().to_owned()
    }

    /// One `<start> <len> <type> <params>` line per target, the params from
    /// [`Target::status`] of `kind` (the kernel's `retrieve_status`).
    /// The text may hold keys (`StatusType::Table { show_keys: true }`): it is built in
    /// locked memory and every piece that held a key is wiped.
    pub fn status_lines(&self, kind: StatusType) -> SecretText {
        let mut out = SecretText::new();
        for e in &self.entries {
            let params = Zeroizing::new(e.target.status(kind));
            out.push_str(&format!("{} {} {}", e.start, e.len, e.target.target_type()));
            if !params.is_empty() {
                out.push(' ');
                out.push_str(&params);
            }
            out.push('\n');
        }
        out
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::device::check_range(self.size, offset, len)?;
        let lbs = u64::from(self.logical_block_size);
        if !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    /// Splits `[offset, offset+len)` at target boundaries and calls `f(target, target_offset,
    /// range_in_request)` for each piece, stopping at the first error.
    fn for_each_piece(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&dyn Target, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.entries.len() == 1 {
            return f(self.entries[0].target.as_ref(), offset, 0..len as usize);
        }
        let first = self
            .entries
            .partition_point(|e| (e.start + e.len) * SECTOR_SIZE <= offset);
        let mut done = 0u64;
        for e in &self.entries[first..] {
            if done == len {
                break;
            }
            let pos = offset + done;
            let t_start = e.start * SECTOR_SIZE;
            let within = pos - t_start;
            let n = (e.len * SECTOR_SIZE - within).min(len - done);
            f(
                e.target.as_ref(),
                within,
                done as usize..(done + n) as usize,
            )?;
            done += n;
        }
        Ok(())
    }
}

impl BlockDevice for Table {
    fn size(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |t, off, r| {
            t.read_at(off, &mut buf[r])
        })
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |t, off, r| {
            t.write_at(off, &buf[r], flags)
        })
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |t, off, r| {
            t.write_at_scratch(off, &mut buf[r], flags)
        })
    }
    fn flush(&self) -> io::Result<()> {
        let mut result = Ok(());
        for e in &self.entries {
            if let Err(err) = e.target.flush() {
                result = Err(err);
            }
        }
        result
    }
    fn supports_discard(&self) -> bool {
        self.entries.iter().all(|e| e.target.supports_discard())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.for_each_piece(offset, len, |t, off, r| t.discard(off, r.len() as u64))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        self.for_each_piece(offset, len, |t, off, r| t.write_zeroes(off, r.len() as u64))
    }
}
