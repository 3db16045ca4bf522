//! `integrity`: the kernel's dm-integrity target — every block carries a tag (an internal
//! hash of its sector number and contents) in metadata areas interleaved with the data, and
//! a journal makes data and tag updates atomic.
//!
//! Table (kernel `Documentation/admin-guide/device-mapper/dm-integrity.rst`):
//! `<dev> <start> <tag_size|-> <mode> <#opt_params> <opt_params>...` with modes `J`
//! (journal), `D` (direct, not crash safe), `B` (bitmap: direct writes, dirty regions
//! recorded in a bitmap and their tags recalculated after a crash), `R` (recovery:
//! read-only, tags unchecked) and
//! options `journal_sectors:`, `interleave_sectors:`, `buffer_sectors:`,
//! `journal_watermark:`, `commit_time:`, `meta_device:`, `block_size:`,
//! `internal_hash:<alg>[:<hexkey>]`, `fix_padding`, `fix_hmac`, `allow_discards`
//! (accepted, discards are ignored), `sectors_per_bit:` (bitmap granularity, rounded down
//! to a power of two and raised until the bitmap fits the journal area, as the kernel
//! does), `bitmap_flush_interval:`, `recalculate`, `reset_recalculate`,
//! `legacy_recalculate`.
//!
//! With `meta_device:`, superblock, journal and tags live on the metadata device (tags
//! packed after the journal) and the data device holds only data, from its sector 0 (the
//! kernel's layout; `integritysetup --data-device`).
//!
//! `recalculate` (internal hash only) sets the superblock's `recalculating` flag with
//! `recalc_sector` 0 unless it is already set (`reset_recalculate` always restarts from 0);
//! a background thread then rewrites the tags from the data in chunks of 32768 sectors
//! (the kernel's `RECALC_SECTORS`, clipped to an interleave area), flushing the tags before
//! recording each chunk's end in `recalc_sector`, so an interrupted recalculation resumes
//! where the superblock says. Until then, reads of blocks at or after `recalc_sector` are
//! not checked; writes always store valid tags. The device is usable at once, as in the
//! kernel, and the flag stays set (with `recalc_sector` = the device size) when done.
//!
//! `journal_crypt:<alg>[:<hexkey>]` (`ctr(aes)`, `chacha20`, `cbc(aes)`) encrypts the
//! journal on disk and `journal_mac:<alg>[:<hexkey>]` (`hmac(sha256)`, ...) MACs its
//! sections (and, with `fix_hmac`, the superblock), checked at replay: a mismatch fails the
//! device with `EILSEQ` like the kernel (see [`journal_crypt`]).
//!
//! Like the kernel, loading a table over an all-zero superblock area formats the device
//! (superblock and empty journal); `integritysetup format` relies on exactly that. A read
//! whose tag does not match fails with `EILSEQ` and is counted — wrong data is never
//! returned. In `J` mode writes go to an in-memory copy of the journal; a flush (or FUA
//! write, or the journal filling to `journal_watermark`) commits the used sections to the
//! on-disk journal, then copies
//! data and tags to their home locations and flushes again. On open, committed sections
//! are replayed with the kernel's commit-id rules, so a crash at any point leaves each
//! block either old or new.
//!
//! Timers, as the kernel's: in `J` mode the first write after a commit arms a timer that
//! commits the journal `commit_time` ms later (the same commit a flush does), so an idle
//! device does not keep acknowledged writes only in memory; in `B` mode marking a region
//! dirty arms a timer that flushes the device and cleans the bitmap `bitmap_flush_interval`
//! ms later. A background thread runs them; it holds only a weak reference and is stopped
//! and joined when the target is dropped. If a timed commit fails, the error is latched
//! like any fatal metadata error: every later I/O and flush fails with it (the kernel fails
//! the device the same way), nothing panics.
//!
//! Read-only ([`IntegrityConfig::read_only`], set from a read-only table): the target
//! never writes. A device that would need formatting is refused; a journal with committed
//! sections is replayed into memory only (reads see the replayed blocks, the disk keeps the
//! journal for the next read-write open); regions a bitmap-mode crash left dirty, whose tags
//! a read-write open would recalculate from the data, are read without tag checks; writes
//! fail with `EROFS`. This is deliberately stricter than the kernel: its dm-integrity has no
//! read-only case (devices are opened with the table's mode, resume replays regardless), so
//! a read-only table over a writable device replays the journal to the disk, and over a
//! read-only device the replay's writes fail and the mapping returns `EIO` (kernel 6.12,
//! checked in the lab by `tests/integrity_timer_readonly_lab.sh`).
//!
//! Without `internal_hash` (a tag size but no hash: what LUKS2 `--integrity` loads under
//! dm-crypt), tags are the caller's: [`BlockDevice::read_with_tags`] /
//! [`BlockDevice::write_with_tags`] store and return them (journaled together with the data
//! in `J` mode), nothing is verified here, and untagged writes store zero tags. Bitmap-mode
//! recovery cannot recompute such tags and leaves them as written.

mod bitmap;
mod blockdev;
mod commit;
mod config;
pub mod hash;
pub mod journal;
pub mod journal_crypt;
pub mod layout;
mod open;
mod read;
mod recalc;
mod resume;
pub mod superblock;
mod tagcache;
mod timer;
mod write;

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use super::config::TargetConfig;
use super::{BuildContext, Target};
use crate::device::{BlockDevice, WriteFlags};
use layout::Layout;
use open::Core;
use superblock::{Superblock, FLAG_RECALCULATING};

pub use config::{IntegrityAlgorithm, IntegrityConfig, IntegrityMode, IntegrityTableConfig};

/// A hash map keyed by sector numbers or device offsets: the per-block maps of the write
/// path hash one `u64` per 512-byte block, where SipHash's DoS resistance buys nothing.
pub(crate) type U64Map<V> = HashMap<u64, V, BuildHasherDefault<U64Hasher>>;

/// Multiplicative hash of one `u64` (Fibonacci hashing, high half folded into the low
/// bits the table indexes with).
#[derive(Default, Clone, Copy)]
pub(crate) struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// Runs `f` on a zeroed scratch buffer of `len` bytes: on the stack when it is small (the
/// tags of one request: 32 bytes for a 4 KiB request of 4096-byte blocks, 256 for 512-byte
/// ones), so the per-request paths allocate nothing; on the heap for larger requests.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    /// Largest buffer kept on the stack.
    const STACK: usize = 1024;
    if len <= STACK {
        let mut b = [0u8; STACK];
        f(&mut b[..len])
    } else {
        f(&mut vec![0u8; len])
    }
}

/// The integrity target: the device ([`Core`], shared with the timer thread) plus the
/// thread that runs its commit / bitmap flush timer.
pub struct IntegrityTarget {
    // Declared first so they drop first: the threads are stopped and joined while the core
    // is still alive (they hold only a `Weak` to it).
    _timer: Option<timer::TimerThread>,
    _recalc: Option<recalc::RecalcThread>,
    core: Arc<Core>,
    /// Set by a clean `postsuspend`; the next `preresume` reopens what it closed.
    clean_suspended: AtomicBool,
}

impl IntegrityTarget {
    /// Opens (formatting an all-zero superblock area, like the kernel) an integrity device.
    /// `len` is the mapping size in bytes; `None` maps all provided sectors. In `J` and `B`
    /// modes (unless read-only) this starts the timer thread.
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        dev_spec: &str,
        meta: Option<Arc<dyn BlockDevice>>,
        cfg: IntegrityConfig,
        len: Option<u64>,
    ) -> Result<Self, String> {
        let core = Arc::new(Core::open(dev, dev_spec, meta, cfg, len)?);
        let timer = match core.timer.clone() {
            Some(ctl) => {
                let weak: Weak<Core> = Arc::downgrade(&core);
                Some(
                    timer::TimerThread::spawn("integrity-commit", ctl, weak, Core::timer_fire)
                        .map_err(|e| format!("cannot start the commit timer thread: {e}"))?,
                )
            }
            None => None,
        };
        let recalc = match core.recalc.clone() {
            Some(ctl) => Some(
                recalc::RecalcThread::spawn(ctl, Arc::downgrade(&core), Core::recalc_step)
                    .map_err(|e| format!("cannot start the recalculation thread: {e}"))?,
            ),
            None => None,
        };
        Ok(IntegrityTarget {
            _timer: timer,
            _recalc: recalc,
            core,
            clean_suspended: AtomicBool::new(false),
        })
    }

    /// Formats `dev` the way `integritysetup format` does: clears the superblock area, then
    /// loads the target so that it writes a fresh superblock and empty journal. With
    /// `wipe`, every block is then written with zeros and valid tags (without it, unwritten
    /// blocks fail their tag check until written). Returns the new superblock.
    pub fn format(
        dev: Arc<dyn BlockDevice>,
        dev_spec: &str,
        meta: Option<Arc<dyn BlockDevice>>,
        cfg: IntegrityConfig,
        wipe: bool,
    ) -> Result<Superblock, String> {
        Core::format(dev, dev_spec, meta, cfg, wipe)
    }

    /// Builds the target from a table line; a read-only table (the resolver's mode) makes a
    /// read-only target, like the kernel's `dm_table_get_mode`.
    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &IntegrityTableConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its devices.
    pub(crate) fn from_config(
        ctx: &BuildContext<'_>,
        t: &IntegrityTableConfig,
    ) -> Result<Self, String> {
        let mut cfg = t.to_config();
        cfg.read_only = cfg.read_only || ctx.options.read_only;
        let dev = ctx
            .resolver
            .open_device(&t.device)
            .map_err(|e| e.to_string())?;
        let meta = match &cfg.meta_device {
            Some(m) => Some(ctx.resolver.open_device(m).map_err(|e| e.to_string())?),
            None => None,
        };
        Self::open(dev, &t.device, meta, cfg, Some(ctx.len_bytes()))
    }

    /// The live table line (see [`IntegrityTableConfig`]): what `dmsetup table` prints.
    pub fn table_config(&self) -> IntegrityTableConfig {
        self.core.table_config()
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> Superblock {
        self.core.superblock()
    }

    /// The device geometry.
    pub fn layout(&self) -> &Layout {
        self.core.layout()
    }

    /// Blocks whose tag did not match on read (the kernel's `number_of_mismatches`).
    pub fn mismatches(&self) -> u64 {
        self.core.mismatches()
    }

    /// Writes zeros with valid tags over the whole provided area, then flushes (what
    /// `integritysetup format` does through the mapping unless `--no-wipe`).
    pub fn wipe(&self) -> io::Result<()> {
        self.core.wipe()
    }

    /// Commits everything and leaves an empty journal, as a clean kernel suspend does
    /// (nothing when read-only). The same as [`Target::postsuspend`], for callers that own
    /// the target outside a mapping.
    pub fn close(&self) -> io::Result<()> {
        self.core.close()
    }

    /// Whether the target never writes (opened from a read-only table).
    pub fn is_read_only(&self) -> bool {
        self.core.cfg.read_only
    }

    /// `recalc_sector` while the superblock says `recalculating` (tags from there on are
    /// not checked yet; equal to the device size once done), else `None`.
    pub fn recalc_sector(&self) -> Option<u64> {
        let sb = self.core.superblock();
        (sb.flags & FLAG_RECALCULATING != 0).then_some(sb.recalc_sector)
    }

    /// Waits for the background recalculation to end (done, stopped by [`Self::close`], or
    /// failed: `Err`); returns at once when none runs.
    pub fn wait_recalculation(&self) -> io::Result<()> {
        match &self.core.recalc {
            Some(r) => r.wait(),
            None => Ok(()),
        }
    }
}

impl BlockDevice for IntegrityTarget {
    fn size(&self) -> u64 {
        self.core.size()
    }

    fn logical_block_size(&self) -> u32 {
        self.core.logical_block_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.core.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.core.write_at(offset, buf, flags)
    }

    fn tag_size(&self) -> u32 {
        self.core.tag_size()
    }

    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        self.core.read_with_tags(offset, buf, tags)
    }

    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.core.write_with_tags(offset, buf, tags, flags)
    }

    fn flush(&self) -> io::Result<()> {
        self.core.flush()
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.core.write_zeroes(offset, len)
    }
}

impl Target for IntegrityTarget {
    fn target_type(&self) -> &'static str {
        self.core.target_type()
    }

    fn table_params(&self, show_keys: bool) -> String {
        self.core.table_params(show_keys)
    }

    fn status_params(&self) -> String {
        self.core.status_params()
    }

    /// The kernel's `dm_integrity_postsuspend`: stops the recalculation, commits the
    /// journal and leaves it empty; in bitmap mode the bitmap is written clean and the
    /// superblock's dirty-bitmap flag cleared. A crash while suspended needs no replay.
    fn postsuspend(&self) -> io::Result<()> {
        self.core.close()?;
        self.clean_suspended.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// After a clean suspend, puts bitmap mode back in force (dirty-bitmap flag set, the
    /// bitmap in use) before writes resume. The recalculation stopped by `postsuspend` is
    /// not restarted here; it continues from the superblock's `recalc_sector` at the next
    /// table load.
    fn preresume(&self) -> io::Result<()> {
        if self.clean_suspended.swap(false, Ordering::SeqCst) {
            self.core.reopen_after_close()?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
