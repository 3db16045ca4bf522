//! `flakey <dev> <offset> <up_interval> <down_interval> [<#feature_args> <features>...]`:
//! a device that is reliable for `up_interval` seconds, then unreliable for
//! `down_interval` seconds, repeating from table load.
//!
//! Unreliable means, per feature: `drop_writes` (writes acknowledged, not written),
//! `error_writes` / `error_reads` (that direction fails with `EIO`), `corrupt_bio_byte <n>
//! <r|w> <value> <flags>` (byte `n`, 1-based, of each matching request replaced); with no
//! features every request fails. [`FlakeyControl`] adds deterministic hooks for tests: force
//! the device up or down, or fail/drop every write after the Nth. They are reached through
//! messages (cryptblk's own; the kernel's flakey takes none): `force up|down|interval`,
//! `fail_after_writes <n> drop|error` and `disarm`; [`Target::stats`] reports the write
//! counters.

use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::config::{table_params_of, CorruptBioByte as Corruption, FlakeyConfig, TargetConfig};
use super::{BuildContext, Target, TargetStats};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;

/// What happens to writes once a [`FlakeyControl::fail_after_writes`] budget is used up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFailure {
    /// Writes (and flushes) are acknowledged but never reach the device, like a power cut.
    Drop,
    /// Writes and flushes fail with `EIO`.
    Error,
}

const FORCE_NONE: u8 = 0;
const FORCE_UP: u8 = 1;
const FORCE_DOWN: u8 = 2;

/// Deterministic test controls for a flakey target, shareable across threads.
#[derive(Default)]
pub struct FlakeyControl {
    force: AtomicU8,
    /// Writes still allowed before the failure mode starts; negative = disarmed.
    write_budget: AtomicI64,
    failure: AtomicU8,
    writes_passed: AtomicU64,
    writes_dropped: AtomicU64,
    writes_failed: AtomicU64,
}

impl FlakeyControl {
    fn new() -> Self {
        let c = FlakeyControl::default();
        c.write_budget.store(-1, Ordering::Relaxed);
        c
    }

    /// Forces the device permanently up (`Some(false)`), down (`Some(true)`), or back to its
    /// interval timing (`None`).
    pub fn force_down(&self, down: Option<bool>) {
        let v = match down {
            None => FORCE_NONE,
            Some(false) => FORCE_UP,
            Some(true) => FORCE_DOWN,
        };
        self.force.store(v, Ordering::SeqCst);
    }

    /// Lets the next `n` writes through, then applies `failure` to every later write and
    /// flush (a crash point after exactly `n` writes).
    pub fn fail_after_writes(&self, n: u64, failure: WriteFailure) {
        self.failure.store(
            match failure {
                WriteFailure::Drop => 0,
                WriteFailure::Error => 1,
            },
            Ordering::SeqCst,
        );
        self.write_budget
            .store(i64::try_from(n).unwrap_or(i64::MAX), Ordering::SeqCst);
    }

    /// Removes a [`FlakeyControl::fail_after_writes`] trigger.
    pub fn disarm(&self) {
        self.write_budget.store(-1, Ordering::SeqCst);
    }

    /// Writes that reached the device.
    pub fn writes_passed(&self) -> u64 {
        self.writes_passed.load(Ordering::Relaxed)
    }

    /// Writes acknowledged without being written.
    pub fn writes_dropped(&self) -> u64 {
        self.writes_dropped.load(Ordering::Relaxed)
    }

    /// Writes that failed with `EIO`.
    pub fn writes_failed(&self) -> u64 {
        self.writes_failed.load(Ordering::Relaxed)
    }

    /// Consumes one unit of write budget; returns the failure to apply, if any.
    fn take_write(&self) -> Option<WriteFailure> {
        let mut cur = self.write_budget.load(Ordering::SeqCst);
        loop {
            if cur < 0 {
                return None;
            }
            if cur == 0 {
                return Some(self.failure_mode());
            }
            match self.write_budget.compare_exchange(
                cur,
                cur - 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return None,
                Err(v) => cur = v,
            }
        }
    }

    /// The failure in force for flushes, if the budget is used up.
    fn flush_failure(&self) -> Option<WriteFailure> {
        (self.write_budget.load(Ordering::SeqCst) == 0).then(|| self.failure_mode())
    }

    fn failure_mode(&self) -> WriteFailure {
        if self.failure.load(Ordering::SeqCst) == 1 {
            WriteFailure::Error
        } else {
            WriteFailure::Drop
        }
    }
}

/// The flakey target.
pub struct FlakeyTarget {
    dev: Arc<dyn BlockDevice>,
    dev_spec: String,
    offset_sectors: u64,
    up_interval: u32,
    down_interval: u32,
    drop_writes: bool,
    error_writes: bool,
    error_reads: bool,
    corrupt: Option<Corruption>,
    started: Instant,
    len: u64,
    control: Arc<FlakeyControl>,
}

impl FlakeyTarget {
    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &FlakeyConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its device.
    pub(crate) fn from_config(ctx: &BuildContext<'_>, cfg: &FlakeyConfig) -> Result<Self, String> {
        Ok(FlakeyTarget {
            dev: ctx.open_device(&cfg.device, cfg.offset)?,
            dev_spec: cfg.device.clone(),
            offset_sectors: cfg.offset,
            up_interval: cfg.up_interval,
            down_interval: cfg.down_interval,
            drop_writes: cfg.drop_writes,
            error_writes: cfg.error_writes,
            error_reads: cfg.error_reads,
            corrupt: cfg.corrupt,
            started: Instant::now(),
            len: ctx.len_bytes(),
            control: Arc::new(FlakeyControl::new()),
        })
    }

    /// The table arguments of this target.
    pub fn config(&self) -> FlakeyConfig {
        FlakeyConfig {
            device: self.dev_spec.clone(),
            offset: self.offset_sectors,
            up_interval: self.up_interval,
            down_interval: self.down_interval,
            drop_writes: self.drop_writes,
            error_writes: self.error_writes,
            error_reads: self.error_reads,
            corrupt: self.corrupt,
        }
    }

    /// The deterministic test controls of this target.
    pub fn control(&self) -> Arc<FlakeyControl> {
        self.control.clone()
    }

    fn is_down(&self) -> bool {
        match self.control.force.load(Ordering::SeqCst) {
            FORCE_UP => return false,
            FORCE_DOWN => return true,
            _ => {}
        }
        if self.down_interval == 0 {
            return false;
        }
        let elapsed = self.started.elapsed().as_secs();
        elapsed % (u64::from(self.up_interval) + u64::from(self.down_interval))
            >= u64::from(self.up_interval)
    }

    fn has_features(&self) -> bool {
        self.drop_writes || self.error_writes || self.error_reads || self.corrupt.is_some()
    }

    fn base(&self) -> u64 {
        self.offset_sectors * SECTOR_SIZE
    }

    fn corrupt_byte(c: &Corruption, buf: &mut [u8]) {
        // Only the bio-flags value 0 (match all) exists for userspace requests.
        if c.flags == 0 {
            if let Some(b) = buf.get_mut(c.byte as usize - 1) {
                *b = c.value;
            }
        }
    }

    /// Decides a write's fate: `Ok(true)` = perform it, `Ok(false)` = drop it.
    fn write_gate(&self) -> io::Result<bool> {
        match self.control.take_write() {
            Some(WriteFailure::Drop) => {
                self.control.writes_dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            Some(WriteFailure::Error) => {
                self.control.writes_failed.fetch_add(1, Ordering::Relaxed);
                return Err(errno(libc::EIO));
            }
            None => {}
        }
        if self.is_down() {
            if self.drop_writes {
                self.control.writes_dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
            if self.error_writes || !self.has_features() {
                self.control.writes_failed.fetch_add(1, Ordering::Relaxed);
                return Err(errno(libc::EIO));
            }
        }
        Ok(true)
    }

    fn write_corruption(&self) -> Option<Corruption> {
        self.corrupt.filter(|c| c.write && self.is_down())
    }
}

impl BlockDevice for FlakeyTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn logical_block_size(&self) -> u32 {
        self.dev.logical_block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        let down = self.is_down();
        if down && (self.error_reads || !self.has_features()) {
            return Err(errno(libc::EIO));
        }
        self.dev.read_at(self.base() + offset, buf)?;
        if down {
            if let Some(c) = self.corrupt.filter(|c| !c.write) {
                Self::corrupt_byte(&c, buf);
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        if !self.write_gate()? {
            return Ok(());
        }
        if let Some(c) = self.write_corruption() {
            let mut copy = buf.to_vec();
            Self::corrupt_byte(&c, &mut copy);
            self.dev.write_at(self.base() + offset, &copy, flags)?;
        } else {
            self.dev.write_at(self.base() + offset, buf, flags)?;
        }
        self.control.writes_passed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        if !self.write_gate()? {
            return Ok(());
        }
        if let Some(c) = self.write_corruption() {
            Self::corrupt_byte(&c, buf);
        }
        self.dev
            .write_at_scratch(self.base() + offset, buf, flags)?;
        self.control.writes_passed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        match self.control.flush_failure() {
            Some(WriteFailure::Drop) => return Ok(()),
            Some(WriteFailure::Error) => return Err(errno(libc::EIO)),
            None => {}
        }
        if self.is_down() && !self.has_features() {
            return Err(errno(libc::EIO));
        }
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        if !self.write_gate()? {
            return Ok(());
        }
        self.dev.discard(self.base() + offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        if !self.write_gate()? {
            return Ok(());
        }
        self.dev.write_zeroes(self.base() + offset, len)
    }
}

impl Target for FlakeyTarget {
    fn target_type(&self) -> &'static str {
        FlakeyConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        table_params_of(&self.config(), show_keys)
    }
    fn message(&self, argv: &[&str]) -> Result<Option<String>, String> {
        let c = &self.control;
        match argv {
            ["force", "up"] => c.force_down(Some(false)),
            ["force", "down"] => c.force_down(Some(true)),
            ["force", "interval"] => c.force_down(None),
            ["fail_after_writes", n, mode] => {
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("invalid write count '{n}'"))?;
                let failure = match *mode {
                    "drop" => WriteFailure::Drop,
                    "error" => WriteFailure::Error,
                    other => {
                        return Err(format!(
                            "invalid failure '{other}' (expected drop or error)"
                        ))
                    }
                };
                c.fail_after_writes(n, failure);
            }
            ["disarm"] => c.disarm(),
            _ => {
                return Err(format!(
                    "unrecognised message '{}' (expected force up|down|interval, \
                     fail_after_writes <n> drop|error, or disarm)",
                    argv.join(" ")
                ))
            }
        }
        Ok(None)
    }
    fn stats(&self) -> TargetStats {
        let c = &self.control;
        TargetStats {
            target_type: "flakey",
            counters: vec![
                ("writes_passed", c.writes_passed()),
                ("writes_dropped", c.writes_dropped()),
                ("writes_failed", c.writes_failed()),
            ],
            facts: Vec::new(),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
