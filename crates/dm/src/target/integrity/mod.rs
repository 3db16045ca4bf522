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

pub mod hash;
pub mod journal;
pub mod journal_crypt;
pub mod layout;
mod recalc;
pub mod superblock;
mod tagcache;
mod timer;

use std::any::Any;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cryptblk_cipher::SecretBytes;

use super::{BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;
use hash::InternalHash;
use journal::{next_seq, prev_seq, Journal, N_COMMIT_IDS};
use layout::{Layout, MAX_TAG_SIZE, SB_SECTORS};
use superblock::{
    Superblock, FLAG_DIRTY_BITMAP, FLAG_FIXED_HMAC, FLAG_FIXED_PADDING, FLAG_HAVE_JOURNAL_MAC,
    FLAG_RECALCULATING, SUPERBLOCK_BYTES,
};
use tagcache::{TagCache, TagRun};

/// dm-integrity operating mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntegrityMode {
    /// `J`: data and tags are written through the journal (crash safe).
    Journal,
    /// `D`: data and tags are written in place (a crash may leave mismatching tags).
    Direct,
    /// `B`: written in place, but regions with writes in flight are marked in an on-disk
    /// bitmap first; after a crash their tags are recalculated from the data.
    Bitmap,
    /// `R`: recovery — no replay, no tag checks, read-only.
    Recovery,
}

impl IntegrityMode {
    fn letter(self) -> char {
        match self {
            IntegrityMode::Journal => 'J',
            IntegrityMode::Direct => 'D',
            IntegrityMode::Bitmap => 'B',
            IntegrityMode::Recovery => 'R',
        }
    }
}

/// Parameters of an integrity mapping, as in its table line.
#[derive(Clone, Debug)]
pub struct IntegrityConfig {
    /// Superblock offset on the (metadata) device, in sectors.
    pub start: u64,
    /// Tag size; `None` (`-`) = the internal hash's digest size.
    pub tag_size: Option<u32>,
    /// Mode.
    pub mode: IntegrityMode,
    /// Requested journal size in sectors for a new format (`None` = kernel default).
    pub journal_sectors: Option<u32>,
    /// Data sectors per area for a new format.
    pub interleave_sectors: u32,
    /// Metadata buffer size (sectors).
    pub buffer_sectors: u32,
    /// Journal watermark percentage: uncommitted sections are committed once they fill this
    /// share of the journal.
    pub journal_watermark: u32,
    /// J mode: commit interval in ms. The first write after a commit arms a timer that
    /// commits the journal this long after it (besides flushes, FUA writes and the
    /// watermark).
    pub commit_time: u32,
    /// B mode: ms after a region is marked dirty until the device is flushed and the bitmap
    /// cleaned (`bitmap_flush_interval`).
    pub bitmap_flush_interval: u32,
    /// Never write to the devices (a read-only table): no format, no replay to disk, no
    /// bitmap, writes fail with `EROFS`. Not a table option: the table's mode.
    pub read_only: bool,
    /// Block size in bytes (512..=4096).
    pub block_size: u32,
    /// Kernel name of the internal hash (`crc32c`, `sha256`, `hmac(sha256)`).
    pub internal_hash: Option<String>,
    /// Key of a keyed internal hash.
    pub internal_hash_key: Option<SecretBytes>,
    /// `journal_crypt:` cipher (kernel name: `ctr(aes)`, `chacha20`, `cbc(aes)`): the
    /// journal is encrypted on disk (see [`journal_crypt`]).
    pub journal_crypt: Option<String>,
    /// Key of the journal cipher.
    pub journal_crypt_key: Option<SecretBytes>,
    /// `journal_mac:` algorithm (`hmac(sha256)`, ...): journal sections (and, with
    /// `fix_hmac`, the superblock) carry a MAC checked at replay.
    pub journal_mac: Option<String>,
    /// Key of a keyed journal MAC.
    pub journal_mac_key: Option<SecretBytes>,
    /// Use 4 KiB metadata padding for a new format (`fix_padding`).
    pub fix_padding: bool,
    /// Mix the superblock salt into tags of a new format (`fix_hmac`).
    pub fix_hmac: bool,
    /// `allow_discards` (accepted; discards are not passed down).
    pub allow_discards: bool,
    /// `legacy_recalculate` (accepted).
    pub legacy_recalculate: bool,
    /// `meta_device:` device name, when tags and journal live elsewhere.
    pub meta_device: Option<String>,
    /// `recalculate`: recompute tags from the data in the background, from the
    /// superblock's `recalc_sector` (0 when the flag was not set yet).
    pub recalculate: bool,
    /// `reset_recalculate`: like `recalculate`, but always from sector 0.
    pub reset_recalculate: bool,
    /// `sectors_per_bit:` as given (bitmap granularity; `None` = the kernel default 32768).
    pub sectors_per_bit: Option<u64>,
}

impl IntegrityConfig {
    /// A configuration with the kernel's defaults for `mode` and `internal_hash`.
    pub fn new(mode: IntegrityMode, internal_hash: &str) -> Self {
        IntegrityConfig {
            start: 0,
            tag_size: None,
            mode,
            journal_sectors: None,
            interleave_sectors: 32768,
            buffer_sectors: 128,
            journal_watermark: 50,
            commit_time: 10000,
            bitmap_flush_interval: 10000,
            read_only: false,
            block_size: 512,
            internal_hash: Some(internal_hash.to_string()),
            internal_hash_key: None,
            journal_crypt: None,
            journal_crypt_key: None,
            journal_mac: None,
            journal_mac_key: None,
            fix_padding: false,
            fix_hmac: false,
            allow_discards: false,
            legacy_recalculate: false,
            meta_device: None,
            recalculate: false,
            reset_recalculate: false,
            sectors_per_bit: None,
        }
    }

    /// Parses table arguments; returns the configuration and the data device name.
    pub fn parse(args: &[String]) -> Result<(Self, String), String> {
        const USAGE: &str =
            "integrity <dev> <start> <tag_size|-> <J|D|R> <#opt_params> [<opt_params>...]";
        if args.len() < 4 {
            return Err(format!(
                "too few arguments ({}); usage: {USAGE}",
                args.len()
            ));
        }
        let start = super::arg_u64(args, 1, "start")?;
        let tag_size = if args[2] == "-" {
            None
        } else {
            let t = super::arg_u32(args, 2, "tag_size")?;
            if t == 0 {
                return Err("invalid tag size 0".into());
            }
            Some(t)
        };
        let mode = match args[3].as_str() {
            "J" => IntegrityMode::Journal,
            "D" => IntegrityMode::Direct,
            "R" => IntegrityMode::Recovery,
            "B" => IntegrityMode::Bitmap,
            other => return Err(format!("invalid mode '{other}' (expecting J, B, D, R)")),
        };
        let mut cfg = IntegrityConfig {
            tag_size,
            start,
            internal_hash: None,
            ..IntegrityConfig::new(mode, "crc32c")
        };
        if args.len() > 4 {
            let count = super::arg_u64(args, 4, "#opt_params")? as usize;
            let opts = &args[5..];
            if opts.len() != count {
                return Err(format!(
                    "<#opt_params> is {count} but {} optional arguments follow",
                    opts.len()
                ));
            }
            for opt in opts {
                cfg.apply_option(opt)?;
            }
        }
        Ok((cfg, args[0].clone()))
    }

    fn apply_option(&mut self, opt: &str) -> Result<(), String> {
        let num = |v: &str| -> Result<u32, String> {
            v.parse::<u32>()
                .map_err(|_| format!("invalid argument '{opt}'"))
        };
        match opt.split_once(':') {
            Some(("journal_sectors", v)) => self.journal_sectors = Some(num(v)?.max(1)),
            Some(("interleave_sectors", v)) => self.interleave_sectors = num(v)?,
            Some(("buffer_sectors", v)) => self.buffer_sectors = num(v)?.max(1),
            Some(("journal_watermark", v)) => {
                let w = num(v)?;
                if w > 100 {
                    return Err(format!("invalid argument '{opt}'"));
                }
                self.journal_watermark = w;
            }
            Some(("commit_time", v)) => self.commit_time = num(v)?,
            Some(("block_size", v)) => {
                let b = num(v)?;
                if !(512..=4096).contains(&b) || !b.is_power_of_two() {
                    return Err("Invalid block_size argument".into());
                }
                self.block_size = b;
            }
            Some(("meta_device", v)) => self.meta_device = Some(v.to_string()),
            Some(("sectors_per_bit", v)) => {
                self.sectors_per_bit = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("invalid argument '{opt}'"))?,
                );
            }
            Some(("bitmap_flush_interval", v)) => {
                self.bitmap_flush_interval = v
                    .parse::<u32>()
                    .map_err(|_| "Invalid bitmap_flush_interval argument".to_string())?;
            }
            Some(("internal_hash", v)) => {
                let (alg, key) = match v.split_once(':') {
                    Some((a, k)) => {
                        let key = hex::decode(k)
                            .map_err(|_| "Invalid internal_hash argument".to_string())?;
                        (a, Some(SecretBytes::from_vec(key)))
                    }
                    None => (v, None),
                };
                self.internal_hash = Some(alg.to_string());
                self.internal_hash_key = key;
            }
            Some((name @ ("journal_crypt" | "journal_mac"), v)) => {
                let (alg, key) = match v.split_once(':') {
                    Some((a, k)) => {
                        let key = hex::decode(k).map_err(|_| format!("Invalid {name} argument"))?;
                        (a, Some(SecretBytes::from_vec(key)))
                    }
                    None => (v, None),
                };
                if name == "journal_crypt" {
                    self.journal_crypt = Some(alg.to_string());
                    self.journal_crypt_key = key;
                } else {
                    self.journal_mac = Some(alg.to_string());
                    self.journal_mac_key = key;
                }
            }
            None if opt == "fix_padding" => self.fix_padding = true,
            None if opt == "fix_hmac" => self.fix_hmac = true,
            None if opt == "allow_discards" => self.allow_discards = true,
            None if opt == "legacy_recalculate" => self.legacy_recalculate = true,
            None if opt == "recalculate" => self.recalculate = true,
            None if opt == "reset_recalculate" => {
                self.recalculate = true;
                self.reset_recalculate = true;
            }
            _ => return Err(format!("Invalid argument '{opt}'")),
        }
        Ok(())
    }
}

/// Mutable state behind one lock: the in-memory journal and where writing continues.
struct State {
    sb: Superblock,
    journal: Journal,
    commit_seq: u8,
    free_section: u32,
    free_entry: u32,
    uncommitted_section: u32,
    n_uncommitted: u32,
    /// Logical block sector -> (section, entry) of its newest journal copy not yet written
    /// to its home location.
    pending: U64Map<(u32, u32)>,
    /// Bitmap mode: one bit per `1 << bitmap_shift` sectors with writes not yet flushed
    /// (bit `n` = byte `n / 8`, bit `n % 8`, as the kernel's little-endian bitmaps).
    bitmap: Vec<u8>,
    /// Read-only opens of a device with a dirty bitmap: regions (same bit layout) whose tags
    /// a read-write open would recalculate from the data, so reads there skip tag checks.
    unverified: Vec<u8>,
}

/// Everything the target is; shared (through a `Weak`) with the background timer thread.
struct Core {
    dev: Arc<dyn BlockDevice>,
    // `hash` is None when tags are supplied by the caller (external tags).
    meta: Option<Arc<dyn BlockDevice>>,
    dev_spec: String,
    cfg: IntegrityConfig,
    layout: Layout,
    hash: Option<InternalHash>,
    /// The journal cipher (`journal_crypt:`), if any.
    jcrypt: Option<journal_crypt::JournalCrypt>,
    /// The journal MAC (`journal_mac:`), if any.
    jmac: Option<journal_crypt::JournalMac>,
    len: u64,
    state: Mutex<State>,
    mismatches: AtomicU64,
    /// errno latched by a fatal metadata error (journal corruption); 0 = healthy.
    failed: AtomicI32,
    /// log2 of the sectors covered by one bitmap bit.
    bitmap_shift: u32,
    /// Cached tag buffers; locked only while `state` is held (lock order: state, then
    /// tags), so the cache is coherent with every tag write.
    tags: Mutex<TagCache>,
    /// The commit (J) / bitmap flush (B) timer, when one runs.
    timer: Option<Arc<timer::TimerCtl>>,
    /// The background tag recalculation, when one is due (see [`recalc`]).
    recalc: Option<Arc<recalc::RecalcCtl>>,
}

/// Sectors recalculated per step (the kernel's `RECALC_SECTORS` on 64-bit machines).
const RECALC_SECTORS: u64 = 32768;

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

/// Most metadata the tag cache keeps (the kernel's dm-bufio keeps a share of RAM).
const TAG_CACHE_BYTES: u64 = 16 << 20;

fn invalid(msg: impl Into<String>) -> String {
    msg.into()
}

impl Core {
    /// Opens (formatting an all-zero superblock area, like the kernel) an integrity device.
    /// `len` is the mapping size in bytes; `None` maps all provided sectors.
    pub fn open(
        dev: Arc<dyn BlockDevice>,
        dev_spec: &str,
        meta: Option<Arc<dyn BlockDevice>>,
        cfg: IntegrityConfig,
        len: Option<u64>,
    ) -> Result<Self, String> {
        // Without an internal hash the tags come from the layer above (dm-crypt's AEAD
        // tags and IVs), like the kernel's integrity profile for stacked targets.
        let hash = match cfg.internal_hash.clone() {
            Some(alg) => Some(InternalHash::new(&alg, cfg.internal_hash_key.clone())?),
            None => None,
        };
        let tag_size = match (cfg.tag_size, &hash) {
            (Some(t), _) => t,
            (None, Some(h)) => h.digest_size() as u32,
            (None, None) => {
                return Err("a tag size is required when there is no internal_hash".into())
            }
        };
        if tag_size > MAX_TAG_SIZE {
            return Err(invalid("Too big tag size"));
        }
        let jmac = match &cfg.journal_mac {
            Some(alg) => Some(journal_crypt::JournalMac::new(
                alg,
                cfg.journal_mac_key.clone(),
            )?),
            None => None,
        };
        let sectors_per_block = cfg.block_size / 512;
        let meta_dev = meta.is_some();
        let mdev: &Arc<dyn BlockDevice> = meta.as_ref().unwrap_or(&dev);
        let data_sectors = dev.size() / SECTOR_SIZE;
        let meta_sectors = mdev.size() / SECTOR_SIZE;
        let io_err = |what: &str, e: io::Error| format!("{what}: {e}");

        let mut sb_area = vec![0u8; SUPERBLOCK_BYTES];
        mdev.read_at(cfg.start * SECTOR_SIZE, &mut sb_area)
            .map_err(|e| io_err("Error reading superblock", e))?;
        if let Some(m) = &jmac {
            // `fix_hmac` superblocks of devices with a journal MAC carry a MAC of their own
            // (checked unless in recovery mode, as the kernel's sync_rw_sb does).
            if cfg.mode != IntegrityMode::Recovery
                && superblock::parse(&sb_area)
                    .ok()
                    .flatten()
                    .is_some_and(|sb| sb.flags & FLAG_FIXED_HMAC != 0)
            {
                m.superblock_mac(&mut sb_area, false)
                    .map_err(|e| format!("Error reading superblock: {e}"))?;
            }
        }
        let mut should_write_sb = false;
        let mut sb = match superblock::parse(&sb_area).map_err(|e| e.to_string())? {
            Some(sb) => sb,
            None => {
                if cfg.mode != IntegrityMode::Recovery && sb_area.iter().any(|&b| b != 0) {
                    return Err(invalid("The device is not initialized"));
                }
                if cfg.read_only && cfg.mode != IntegrityMode::Recovery {
                    // Loading over a blank superblock formats, which writes.
                    return Err(invalid(
                        "The device is not initialized (a read-only table cannot format it)",
                    ));
                }
                let mut flags = 0;
                if jmac.is_some() {
                    flags |= FLAG_HAVE_JOURNAL_MAC;
                }
                if cfg.fix_padding && !meta_dev {
                    flags |= FLAG_FIXED_PADDING;
                }
                let mut salt = [0u8; 16];
                // As the kernel: fix_hmac sets the flag (and a salt) only where something
                // is hashed with it, an internal hash or a journal MAC.
                if cfg.fix_hmac && (cfg.internal_hash.is_some() || jmac.is_some()) {
                    flags |= FLAG_FIXED_HMAC;
                    salt.copy_from_slice(SecretBytes::random(16).as_bytes());
                }
                let journal_sectors = cfg
                    .journal_sectors
                    .unwrap_or_else(|| (data_sectors >> 7).min(131072) as u32);
                let l = Layout::for_new_device(
                    cfg.start,
                    meta_dev,
                    sectors_per_block,
                    tag_size,
                    flags,
                    journal_sectors,
                    cfg.interleave_sectors,
                    meta_sectors,
                    data_sectors,
                )
                .ok_or("Could not initialize superblock: the device is too small")?;
                should_write_sb = cfg.mode != IntegrityMode::Recovery;
                let mut sb = Superblock {
                    log2_interleave_sectors: l.log2_interleave_sectors,
                    integrity_tag_size: tag_size as u16,
                    journal_sections: l.journal_sections,
                    provided_data_sectors: l.provided_data_sectors,
                    flags,
                    log2_sectors_per_block: l.log2_sectors_per_block,
                    salt,
                    ..Default::default()
                };
                sb.set_version(cfg.mode == IntegrityMode::Bitmap, meta_dev);
                sb
            }
        };
        if sb.version == 0 || sb.version > 5 {
            return Err(invalid("Unknown version"));
        }
        if sb.integrity_tag_size as u32 != tag_size {
            return Err(invalid(
                "Tag size doesn't match the information in superblock",
            ));
        }
        if sb.log2_sectors_per_block as u32 != sectors_per_block.trailing_zeros() {
            return Err(invalid(
                "Block size doesn't match the information in superblock",
            ));
        }
        if sb.journal_sections == 0 {
            return Err(invalid("Corrupted superblock, journal_sections is 0"));
        }
        if (!meta_dev && !(3..=31).contains(&sb.log2_interleave_sectors))
            || (meta_dev && sb.log2_interleave_sectors != 0)
        {
            return Err(invalid("Invalid interleave_sectors in the superblock"));
        }
        if (sb.flags & FLAG_HAVE_JOURNAL_MAC != 0) != jmac.is_some() {
            return Err(invalid("Journal mac mismatch"));
        }
        let layout = Layout::from_superblock(&sb, cfg.start, meta_dev, meta_sectors, data_sectors)
            .ok_or("The device is too small")?;

        // Bitmap granularity (`sectors_per_bit:` rounded down to a power of two, default
        // 32768), recorded in new superblocks as the kernel does.
        let mut log2_spbb: u32 = match cfg.sectors_per_bit {
            None => 15,
            Some(0) => 0,
            Some(n) => 63 - n.leading_zeros(),
        };
        log2_spbb = log2_spbb.max(layout.log2_sectors_per_block as u32);
        let bits_in_journal =
            ((layout.journal_section_sectors as u64 * layout.journal_sections as u64) << 12)
                .min(u32::MAX as u64);
        while bits_in_journal
            < (layout.provided_data_sectors + (1u64 << log2_spbb) - 1) >> log2_spbb
        {
            log2_spbb += 1;
        }
        if should_write_sb {
            sb.log2_blocks_per_bitmap_bit =
                (log2_spbb - layout.log2_sectors_per_block as u32) as u8;
        }

        let len = len.unwrap_or(layout.provided_data_sectors * SECTOR_SIZE);
        if len > layout.provided_data_sectors * SECTOR_SIZE {
            return Err(invalid(
                "Not enough provided sectors for requested mapping size",
            ));
        }
        if !len.is_multiple_of(cfg.block_size as u64) {
            return Err(format!(
                "mapping length is not a multiple of the {}-byte block",
                cfg.block_size
            ));
        }

        let mut journal = Journal::new(&layout);
        let jcrypt = match &cfg.journal_crypt {
            Some(alg) => Some(journal_crypt::JournalCrypt::new(
                alg,
                cfg.journal_crypt_key.as_ref(),
                layout.journal_sections,
                layout.journal_section_sectors,
            )?),
            None => None,
        };
        if let Some(c) = &jcrypt {
            journal.set_commit_ids(c.commit_ids);
        }
        let tag_cache = TagCache::new(layout.log2_buffer_sectors, TAG_CACHE_BYTES);
        let timer = match (cfg.mode, cfg.read_only) {
            (_, true) => None,
            (IntegrityMode::Journal, _) => Some(cfg.commit_time),
            (IntegrityMode::Bitmap, _) => Some(cfg.bitmap_flush_interval),
            _ => None,
        }
        .map(|ms| Arc::new(timer::TimerCtl::new(ms)));
        let mut recalc_due = false;
        let mut target = Core {
            dev: dev.clone(),
            meta: meta.clone(),
            dev_spec: dev_spec.to_string(),
            cfg,
            layout,
            hash,
            jcrypt,
            jmac,
            len,
            state: Mutex::new(State {
                sb,
                journal,
                commit_seq: 0,
                free_section: 0,
                free_entry: 0,
                uncommitted_section: 0,
                n_uncommitted: 0,
                pending: HashMap::default(),
                bitmap: Vec::new(),
                unverified: Vec::new(),
            }),
            mismatches: AtomicU64::new(0),
            failed: AtomicI32::new(0),
            bitmap_shift: log2_spbb,
            tags: Mutex::new(tag_cache),
            timer,
            recalc: None,
        };
        {
            let mut st = target.lock();
            if should_write_sb {
                let n = st.journal.sections;
                st.journal.init_sections(0, n, 0);
                target
                    .write_journal_sections(&st, 0, n)
                    .map_err(|e| io_err("Error initializing journal", e))?;
                target
                    .write_superblock(&mut st)
                    .map_err(|e| io_err("Error initializing superblock", e))?;
            } else if st.sb.provided_data_sectors != target.layout.provided_data_sectors
                && target.cfg.mode != IntegrityMode::Recovery
                && !target.cfg.read_only
            {
                // The device grew or shrank: record the new size (as resume does).
                st.sb.provided_data_sectors = target.layout.provided_data_sectors;
                target
                    .write_superblock(&mut st)
                    .map_err(|e| io_err("writing superblock", e))?;
            }
            let writable = target.cfg.mode != IntegrityMode::Recovery && !target.cfg.read_only;
            if writable
                && ((target.cfg.recalculate && st.sb.flags & FLAG_RECALCULATING == 0)
                    || target.cfg.reset_recalculate)
            {
                st.sb.flags |= FLAG_RECALCULATING;
                st.sb.recalc_sector = 0;
            }
            if st.sb.flags & FLAG_RECALCULATING != 0 {
                if target.hash.is_none() {
                    return Err(invalid(
                        "Recalculate can only be specified with internal_hash",
                    ));
                }
                if writable
                    && target.cfg.internal_hash_key.is_some()
                    && st.sb.flags & FLAG_FIXED_HMAC == 0
                    && !target.cfg.legacy_recalculate
                {
                    // Without the salt, recomputed keyed tags would let an attacker who
                    // can write the data get it accepted (the kernel refuses it too).
                    return Err(invalid(
                        "Recalculating with a keyed hash needs fix_hmac (or legacy_recalculate)",
                    ));
                }
            }
            if target.cfg.mode != IntegrityMode::Recovery {
                target
                    .resume(&mut st, should_write_sb)
                    .map_err(|e| io_err("resuming", e))?;
            }
            if writable && st.sb.flags & FLAG_RECALCULATING != 0 {
                let provided = target.layout.provided_data_sectors;
                st.sb.recalc_sector = st.sb.recalc_sector.min(provided);
                // The flag is durable before any block is read unchecked because of it.
                target
                    .write_superblock(&mut st)
                    .map_err(|e| io_err("writing superblock", e))?;
                if st.sb.recalc_sector < provided {
                    recalc_due = true;
                }
            }
        }
        if recalc_due {
            target.recalc = Some(Arc::new(recalc::RecalcCtl::new()));
        }
        Ok(target)
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
        let mdev = meta.clone().unwrap_or_else(|| dev.clone());
        mdev.write_at(
            cfg.start * SECTOR_SIZE,
            &vec![0u8; SUPERBLOCK_BYTES],
            WriteFlags { fua: true },
        )
        .map_err(|e| format!("clearing superblock: {e}"))?;
        let mut cfg = cfg;
        if cfg.mode == IntegrityMode::Recovery {
            cfg.mode = IntegrityMode::Journal;
        }
        let t = Core::open(dev, dev_spec, meta, cfg, None)?;
        if wipe {
            t.wipe().map_err(|e| format!("wiping device: {e}"))?;
        }
        Ok(t.superblock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mdev(&self) -> &Arc<dyn BlockDevice> {
        self.meta.as_ref().unwrap_or(&self.dev)
    }

    /// The superblock as last written.
    pub fn superblock(&self) -> Superblock {
        self.lock().sb.clone()
    }

    /// The device geometry.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Blocks whose tag did not match on read (the kernel's `number_of_mismatches`).
    pub fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    fn salt(&self, sb: &Superblock) -> Option<[u8; 16]> {
        (sb.flags & FLAG_FIXED_HMAC != 0).then_some(sb.salt)
    }

    fn check_failed(&self) -> io::Result<()> {
        match self.failed.load(Ordering::SeqCst) {
            0 => Ok(()),
            e => Err(errno(e)),
        }
    }

    fn fail(&self, e: i32) {
        let _ = self
            .failed
            .compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn write_superblock(&self, st: &mut State) -> io::Result<()> {
        st.sb
            .set_version(self.cfg.mode == IntegrityMode::Bitmap, self.meta.is_some());
        let mut area = superblock::encode(&st.sb);
        if let (Some(m), true) = (&self.jmac, st.sb.flags & FLAG_FIXED_HMAC != 0) {
            m.superblock_mac(&mut area, true)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        }
        self.mdev().write_at(
            self.cfg.start * SECTOR_SIZE,
            &area,
            WriteFlags { fua: true },
        )?;
        self.mdev().flush()
    }

    /// Writes journal sections `start..start+count` (wrapping) and makes them durable;
    /// with a journal MAC or cipher, what goes to disk is a MACed / encrypted copy (the
    /// in-memory journal stays plain).
    fn write_journal_sections(&self, st: &State, start: u32, count: u32) -> io::Result<()> {
        let base = self.layout.journal_offset();
        let sections = st.journal.sections;
        let first = count.min(sections - start);
        let mut pieces = vec![(start, first)];
        if count > first {
            pieces.push((0, count - first));
        }
        for (s, n) in pieces {
            let r = st.journal.section_range(s).start..st.journal.section_range(s + n - 1).end;
            if self.jcrypt.is_none() && self.jmac.is_none() {
                self.mdev().write_at(
                    base + r.start as u64,
                    &st.journal.buf[r],
                    WriteFlags::default(),
                )?;
                continue;
            }
            let mut out = st.journal.buf[r.clone()].to_vec();
            self.seal_sections(st, s, &mut out);
            self.mdev()
                .write_at(base + r.start as u64, &out, WriteFlags::default())?;
        }
        self.mdev().flush()
    }

    /// Stamps the journal MAC into (the kernel's `rw_section_mac`), then encrypts, the
    /// sections copied into `out`, the first being section `first`.
    fn seal_sections(&self, st: &State, first: u32, out: &mut [u8]) {
        let section_bytes = st.journal.section_sectors() as usize * 512;
        if let Some(m) = &self.jmac {
            let salt = self.salt(&st.sb);
            for (k, sec) in out.chunks_exact_mut(section_bytes).enumerate() {
                let mac = m.section_mac(
                    salt.as_ref(),
                    first + k as u32,
                    &st.journal.entry_sectors(sec),
                );
                for (j, share) in mac.chunks_exact(8).enumerate() {
                    sec[Journal::mac_range(j as u32)].copy_from_slice(share);
                }
            }
        }
        if let Some(c) = &self.jcrypt {
            c.apply(first, out, true);
        }
    }

    /// Whether the journal MACs of sections `start..start+count` (wrapping) match; a
    /// mismatch is logged, counted and fails the device with `EILSEQ` (the kernel's
    /// `rw_section_mac` at replay).
    fn check_section_macs(&self, st: &State, start: u32, count: u32) -> bool {
        let Some(m) = &self.jmac else { return true };
        let salt = self.salt(&st.sb);
        for k in 0..count {
            let i = (start + k) % st.journal.sections;
            let sec = &st.journal.buf[st.journal.section_range(i)];
            let mac = m.section_mac(salt.as_ref(), i, &st.journal.entry_sectors(sec));
            let ok = (0..8u32).all(|j| {
                cryptblk_cipher::secret::ct_eq(
                    &sec[Journal::mac_range(j)],
                    &mac[j as usize * 8..j as usize * 8 + 8],
                )
            });
            if !ok {
                eprintln!(
                    "device-mapper: integrity: {}: Error on journal mac: section {i}",
                    self.dev_spec
                );
                self.mismatches.fetch_add(1, Ordering::Relaxed);
                self.fail(libc::EILSEQ);
                return false;
            }
        }
        true
    }

    /// The kernel's `dm_integrity_resume`: after a bitmap-mode crash, recalculates the tags
    /// of dirty regions (all of them when the bitmap granularity changed or the device is
    /// opened in another mode); otherwise replays the journal. In bitmap mode the journal
    /// area then holds the (clean) bitmap and the superblock says it is in use.
    fn resume(&self, st: &mut State, just_formatted: bool) -> io::Result<()> {
        let bits = self
            .layout
            .provided_data_sectors
            .div_ceil(1u64 << self.bitmap_shift);
        let bitmap_bytes = (bits.div_ceil(4096 * 8) * 4096) as usize;
        if self.cfg.read_only {
            return self.resume_read_only(st, bitmap_bytes);
        }
        if st.sb.flags & FLAG_DIRTY_BITMAP != 0 {
            let mut bitmap = vec![0u8; bitmap_bytes];
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut bitmap)?;
            let same_granularity = st.sb.log2_blocks_per_bitmap_bit as u32
                + self.layout.log2_sectors_per_block as u32
                == self.bitmap_shift;
            if self.cfg.mode == IntegrityMode::Bitmap && same_granularity {
                for bit in 0..bits {
                    if bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0 {
                        self.recalculate(st, bit << self.bitmap_shift, 1u64 << self.bitmap_shift)?;
                    }
                }
            } else {
                self.recalculate(st, 0, self.layout.provided_data_sectors)?;
            }
            if self.cfg.mode != IntegrityMode::Bitmap {
                let n = st.journal.sections;
                st.journal.init_sections(0, n, 0);
                self.write_journal_sections(st, 0, n)?;
                st.sb.flags &= !FLAG_DIRTY_BITMAP;
                self.write_superblock(st)?;
                return self.replay(st, true);
            }
        } else {
            self.replay(st, just_formatted)?;
        }
        if self.cfg.mode == IntegrityMode::Bitmap {
            st.sb.flags |= FLAG_DIRTY_BITMAP;
            st.sb.log2_blocks_per_bitmap_bit =
                (self.bitmap_shift - self.layout.log2_sectors_per_block as u32) as u8;
            self.write_superblock(st)?;
            st.bitmap = vec![0u8; bitmap_bytes];
            self.write_bitmap(st)?;
        }
        Ok(())
    }

    /// [`Core::resume`] without writing: after a bitmap-mode crash, the regions whose tags
    /// would be recalculated are read unchecked instead (the journal area holds the bitmap,
    /// there is no journal to replay); otherwise the journal is replayed into memory.
    fn resume_read_only(&self, st: &mut State, bitmap_bytes: usize) -> io::Result<()> {
        if st.sb.flags & FLAG_DIRTY_BITMAP == 0 {
            return self.replay(st, false);
        }
        let same_granularity = st.sb.log2_blocks_per_bitmap_bit as u32
            + self.layout.log2_sectors_per_block as u32
            == self.bitmap_shift;
        st.unverified = vec![0xff; bitmap_bytes];
        if self.cfg.mode == IntegrityMode::Bitmap && same_granularity {
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut st.unverified)?;
        }
        Ok(())
    }

    /// Whether `sectors` sectors from logical `sector` touch a region whose tags are not
    /// checked (see [`State::unverified`]).
    fn region_unverified(&self, st: &State, sector: u64, sectors: u64) -> bool {
        if st.unverified.is_empty() {
            return false;
        }
        let first = sector >> self.bitmap_shift;
        let last = (sector + sectors.max(1) - 1) >> self.bitmap_shift;
        (first..=last).any(|bit| {
            st.unverified
                .get((bit / 8) as usize)
                .is_none_or(|b| b & (1 << (bit % 8)) != 0)
        })
    }

    /// One step of the background recalculation: rewrites the tags of the next chunk from
    /// `recalc_sector`, makes them durable, then records the chunk's end in the superblock
    /// (so a crash resumes at or before it, never past unwritten tags). `Ok(true)` while
    /// more remains. A failure fails the device, as the kernel's `dm_integrity_io_error`.
    fn recalc_step(&self, ctl: &recalc::RecalcCtl) -> io::Result<bool> {
        self.check_failed()?;
        let mut st = self.lock();
        if ctl.stopped() || st.sb.flags & FLAG_RECALCULATING == 0 {
            return Ok(false);
        }
        let provided = self.layout.provided_data_sectors;
        let pos = st.sb.recalc_sector;
        if pos >= provided {
            return Ok(false);
        }
        let n = RECALC_SECTORS
            .min(provided - pos)
            .min(self.layout.sectors_left_in_area(pos));
        let r = self.recalculate(&st, pos, n).and_then(|()| {
            st.sb.recalc_sector = pos + n;
            self.write_superblock(&mut st)
        });
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error recalculating tags: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(e);
        }
        Ok(pos + n < provided)
    }

    /// Where tags stop being checked: `recalc_sector` while a recalculation is pending,
    /// else past the end.
    fn checked_below(&self, st: &State) -> u64 {
        if st.sb.flags & FLAG_RECALCULATING != 0 {
            st.sb.recalc_sector
        } else {
            u64::MAX
        }
    }

    /// Rewrites the tags of `count` sectors from `sector` (clipped to the device) from the
    /// data as it is.
    fn recalculate(&self, st: &State, sector: u64, count: u64) -> io::Result<()> {
        let Some(hash) = &self.hash else {
            // External tags cannot be recomputed from the data (the kernel has no
            // recalculation without an internal hash either): they stay as written.
            return Ok(());
        };
        let end = (sector + count).min(self.layout.provided_data_sectors);
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let mut data = Vec::new();
        let mut tags = Vec::new();
        let mut cache = self.lock_tags();
        let mut s = sector;
        while s < end {
            let n = self.layout.sectors_left_in_area(s).min(end - s).min(2048);
            data.resize((n * 512) as usize, 0);
            self.dev
                .read_at(self.layout.data_sector(s) * SECTOR_SIZE, &mut data)?;
            tags.resize(data.len() / bs * ts, 0);
            hash.tags(salt.as_ref(), s, bs, &data, &mut tags);
            self.store_tags(&mut cache, s, &tags)?;
            s += n;
        }
        drop(cache);
        self.dev.flush()?;
        self.mdev().flush()
    }

    fn lock_tags(&self) -> std::sync::MutexGuard<'_, TagCache> {
        self.tags.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The metadata run of logical `sector` (see [`TagCache`]).
    fn tag_run(&self, sector: u64) -> TagRun {
        self.layout.tag_run(sector)
    }

    /// Writes the tags of consecutive blocks from logical `sector` (all in one area)
    /// through the cache and out to the metadata device.
    fn store_tags(&self, cache: &mut TagCache, sector: u64, tags: &[u8]) -> io::Result<()> {
        let mdev = self.mdev().as_ref();
        let r = cache
            .write(
                mdev,
                self.tag_run(sector),
                self.layout.tag_position(sector),
                tags,
            )
            .and_then(|()| cache.flush(mdev));
        if r.is_err() {
            cache.discard_dirty();
        }
        r
    }

    /// The tags of the whole blocks in `data` (the first at logical `sector`) into `out`:
    /// the caller's (`given`, one per block), else the internal hash's, else zeros (an
    /// untagged write to an external-tag device).
    fn compute_tags(
        &self,
        salt: Option<&[u8; 16]>,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        out.clear();
        match (given, &self.hash) {
            (Some(t), _) => out.extend_from_slice(t),
            (None, Some(h)) => {
                out.resize(data.len() / bs * ts, 0);
                h.tags(salt, sector, bs, data, out);
            }
            (None, None) => out.resize(data.len() / bs * ts, 0),
        }
    }

    /// Writes the in-memory bitmap to the start of the journal area and makes it durable.
    fn write_bitmap(&self, st: &State) -> io::Result<()> {
        self.mdev().write_at(
            self.layout.journal_offset(),
            &st.bitmap,
            WriteFlags { fua: true },
        )?;
        self.mdev().flush()
    }

    /// Marks the regions of a write dirty on disk before the write proceeds.
    fn mark_dirty(&self, st: &mut State, sector: u64, sectors: u64) -> io::Result<()> {
        let first = sector >> self.bitmap_shift;
        let last = (sector + sectors - 1) >> self.bitmap_shift;
        let mut changed = false;
        for bit in first..=last {
            let (byte, mask) = ((bit / 8) as usize, 1u8 << (bit % 8));
            if st.bitmap[byte] & mask == 0 {
                st.bitmap[byte] |= mask;
                changed = true;
            }
        }
        if changed {
            self.write_bitmap(st)?;
            self.arm_timer();
        }
        Ok(())
    }

    /// Flushes data and tags, then cleans the bitmap (bitmap mode's flush).
    fn clean_bitmap(&self, st: &mut State) -> io::Result<()> {
        self.dev.flush()?;
        self.mdev().flush()?;
        if st.bitmap.iter().any(|&b| b != 0) {
            st.bitmap.fill(0);
            self.write_bitmap(st)?;
        }
        Ok(())
    }

    /// The kernel's `replay_journal`: finds the newest completely written run of
    /// sections, applies its entries, and decides where writing continues.
    fn replay(&self, st: &mut State, just_formatted: bool) -> io::Result<()> {
        let n = st.journal.sections;
        if !just_formatted {
            let mut buf = std::mem::take(&mut st.journal.buf);
            self.mdev()
                .read_at(self.layout.journal_offset(), &mut buf)?;
            if let Some(c) = &self.jcrypt {
                c.apply(0, &mut buf, false);
            }
            st.journal.buf = buf;
        }
        let mut used = [false; N_COMMIT_IDS as usize];
        let mut max_sec = [0u32; N_COMMIT_IDS as usize];
        let mut journal_empty = true;
        let mut corrupt = false;
        'scan: for i in 0..n {
            for j in 0..st.journal.section_sectors() {
                match st.journal.find_seq(i, j) {
                    Some(k) => {
                        used[k as usize] = true;
                        max_sec[k as usize] = i;
                    }
                    None => {
                        corrupt = true;
                        break 'scan;
                    }
                }
            }
            if journal_empty && (0..st.journal.section_entries).any(|e| !st.journal.is_unused(i, e))
            {
                journal_empty = false;
            }
        }
        let mut last_used = 0u8;
        let mut write_start = 0u32;
        let mut write_sections = 0u32;
        let mut want = 0u8;
        if corrupt {
            eprintln!(
                "device-mapper: integrity: {}: journal commit id mismatch",
                self.dev_spec
            );
            self.fail(libc::EIO);
        } else {
            let unused: u8 = if !used[N_COMMIT_IDS as usize - 1] {
                let mut u = N_COMMIT_IDS - 1;
                while u > 0 && !used[u as usize - 1] {
                    u -= 1;
                }
                u
            } else {
                match (0..N_COMMIT_IDS).find(|&u| !used[u as usize]) {
                    Some(u) => u,
                    None => {
                        self.fail(libc::EIO);
                        N_COMMIT_IDS
                    }
                }
            };
            if unused < N_COMMIT_IDS {
                last_used = prev_seq(unused);
                want = prev_seq(last_used);
                if !used[want as usize] && used[prev_seq(want) as usize] {
                    journal_empty = true;
                }
                write_start = max_sec[last_used as usize] + 1;
                if write_start >= n {
                    want = next_seq(want);
                    write_start -= n;
                }
                let mut i = write_start;
                'count: while write_sections < n {
                    for j in 0..st.journal.section_sectors() {
                        if st.journal.stored_commit_id(i, j) != st.journal.commit_id(i, j, want) {
                            break 'count;
                        }
                    }
                    i += 1;
                    if i >= n {
                        want = next_seq(want);
                        i = 0;
                    }
                    write_sections += 1;
                }
                if !journal_empty {
                    if !self.check_section_macs(st, write_start, write_sections) {
                        // The device is failed: every I/O returns the error. Nothing is
                        // written, so the journal stays on disk as it was found.
                        return Ok(());
                    }
                    self.apply_sections(st, write_start, write_sections, true)?;
                }
            }
        }
        let continue_section;
        if self.failed.load(Ordering::SeqCst) == 0
            && write_sections == n
            && (self.cfg.mode == IntegrityMode::Journal || journal_empty)
        {
            continue_section = write_start;
            st.commit_seq = want;
        } else {
            // Clear the journal with a sequence number older than anything on disk.
            let erase_seq = prev_seq(prev_seq(last_used));
            if !self.cfg.read_only {
                // (Read-only: the replayed blocks stay in the in-memory journal.)
                st.journal.init_sections(0, n, erase_seq);
                self.write_journal_sections(st, 0, n)?;
            }
            continue_section = 0;
            st.commit_seq = next_seq(erase_seq);
        }
        st.free_section = continue_section;
        st.free_entry = 0;
        st.uncommitted_section = continue_section;
        st.n_uncommitted = 0;
        if !self.cfg.read_only {
            st.pending.clear();
        }
        Ok(())
    }

    /// Copies the used entries of sections `start..start+count` (wrapping) to their home
    /// locations with their tags, then flushes (`do_journal_write`).
    ///
    /// Entries are sorted by home sector (stably, so the newest copy of a sector is the
    /// last of its group and the only one written), then [`Core::write_home`]
    /// writes them without copying blocks out of the journal.
    fn apply_sections(
        &self,
        st: &mut State,
        start: u32,
        count: u32,
        from_replay: bool,
    ) -> io::Result<()> {
        let salt = self.salt(&st.sb);
        let bs = self.cfg.block_size as usize;
        let spb = self.layout.sectors_per_block as u64;
        let ts = self.layout.tag_size as u64;
        // (logical sector, section, entry) in journal order.
        let mut list: Vec<(u64, u32, u32)> = Vec::new();
        let mut block = Vec::new();
        let mut tag = vec![0u8; ts as usize];
        for s in 0..count {
            let i = (start + s) % st.journal.sections;
            for e in 0..st.journal.section_entries {
                if st.journal.is_unused(i, e) {
                    continue;
                }
                let mut sector = st.journal.entry_sector(i, e);
                if from_replay {
                    if !sector.is_multiple_of(spb) {
                        self.fail(libc::EIO);
                        sector -= sector % spb;
                    }
                    if sector >= self.layout.provided_data_sectors {
                        st.journal.set_unused(i, e);
                        continue;
                    }
                    if let Some(hash) = &self.hash {
                        block.clear();
                        st.journal.append_block(i, e, bs, &mut block);
                        hash.tag(salt.as_ref(), sector, &block, &mut tag);
                        if tag[..] != *st.journal.entry_tag(i, e) {
                            eprintln!(
                                "device-mapper: integrity: {}: tag mismatch when replaying journal",
                                self.dev_spec
                            );
                            self.mismatches.fetch_add(1, Ordering::Relaxed);
                            self.fail(libc::EILSEQ);
                        }
                    }
                }
                list.push((sector, i, e));
                // Only the entry's sector field changes: its data, last bytes and tag
                // stay readable below.
                st.journal.set_unused(i, e);
            }
        }
        if self.cfg.read_only {
            // Replay into memory: reads find each block's newest copy (journal order, so
            // later entries replace earlier ones) through `pending`; the disk is untouched.
            for &(sector, i, e) in &list {
                st.pending.insert(sector, (i, e));
            }
            return Ok(());
        }
        // Stable: copies of one sector stay in journal order, the newest last.
        list.sort_by_key(|&(sector, _, _)| sector);

        let mut cache = self.lock_tags();
        let r = self.write_home(&mut st.journal, &list, &mut cache);
        if r.is_err() {
            cache.discard_dirty();
        }
        r?;
        drop(cache);
        self.dev.flush()?;
        if self.meta.is_some() {
            self.mdev().flush()?;
        }
        Ok(())
    }

    /// Writes the newest copy of each sector of `list` (sorted by sector, journal order
    /// within a sector) and its tag to their home locations. Blocks contiguous both at
    /// home and in the journal go out as one write straight from the journal buffer (their
    /// last bytes swapped in for the write and back after it); tags are patched into the
    /// cache in contiguous pieces and written once at the end.
    fn write_home(
        &self,
        journal: &mut Journal,
        list: &[(u64, u32, u32)],
        cache: &mut TagCache,
    ) -> io::Result<()> {
        /// Largest data write.
        const MAX_RUN: usize = 1 << 20;
        let ts = self.layout.tag_size as u64;
        let mdev = self.mdev().as_ref();
        let mut run: Vec<(u32, u32)> = Vec::new();
        let mut run_phys = 0u64;
        let mut run_journal = 0..0;
        let mut tags: Vec<u8> = Vec::new();
        let mut tags_sector = 0u64;
        let mut tags_end = 0u64;
        let write_run = |journal: &mut Journal,
                         run: &mut Vec<(u32, u32)>,
                         phys: u64,
                         range: std::ops::Range<usize>|
         -> io::Result<()> {
            run.iter().for_each(|&(i, e)| journal.swap_last_bytes(i, e));
            let r = self.dev.write_at(
                phys * SECTOR_SIZE,
                &journal.buf[range],
                WriteFlags::default(),
            );
            run.iter().for_each(|&(i, e)| journal.swap_last_bytes(i, e));
            run.clear();
            r
        };
        for (idx, &(sector, i, e)) in list.iter().enumerate() {
            if list.get(idx + 1).is_some_and(|next| next.0 == sector) {
                continue; // a newer copy follows
            }
            let phys = self.layout.data_sector(sector);
            let range = journal.data_range(i, e);
            if !run.is_empty()
                && (run_phys + (run_journal.len() / 512) as u64 != phys
                    || run_journal.end != range.start
                    || run_journal.len() >= MAX_RUN)
            {
                write_run(journal, &mut run, run_phys, run_journal.clone())?;
            }
            if run.is_empty() {
                run_phys = phys;
                run_journal = range.start..range.start;
            }
            run.push((i, e));
            run_journal.end = range.end;

            let pos = self.layout.tag_position(sector);
            if !tags.is_empty() && tags_end != pos {
                let at = tags_end - tags.len() as u64;
                cache.write(mdev, self.tag_run(tags_sector), at, &tags)?;
                tags.clear();
            }
            if tags.is_empty() {
                tags_sector = sector;
            }
            tags.extend_from_slice(journal.entry_tag(i, e));
            tags_end = pos + ts;
        }
        if !run.is_empty() {
            write_run(journal, &mut run, run_phys, run_journal)?;
        }
        if !tags.is_empty() {
            let at = tags_end - tags.len() as u64;
            cache.write(mdev, self.tag_run(tags_sector), at, &tags)?;
        }
        cache.flush(mdev)
    }

    /// Arms the commit / bitmap flush timer (no-op without one or when already armed).
    fn arm_timer(&self) {
        if let Some(t) = &self.timer {
            t.arm();
        }
    }

    /// The timer expired: commit the journal if it holds uncommitted writes (J), or flush
    /// and clean the bitmap (B), exactly as a flush would. A failure fails the device: the
    /// next I/O or flush returns it (there is no caller to return it to here).
    fn timer_fire(&self) {
        if self.check_failed().is_err() {
            return;
        }
        let mut st = self.lock();
        let (what, r) = match self.cfg.mode {
            IntegrityMode::Journal if st.n_uncommitted > 0 || st.free_entry > 0 => {
                ("journal commit", self.commit(&mut st))
            }
            IntegrityMode::Bitmap => ("bitmap flush", self.clean_bitmap(&mut st)),
            _ => return,
        };
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error on timed {what}: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
        }
    }

    /// Commits the journal's uncommitted sections and writes them home (J mode).
    fn commit(&self, st: &mut State) -> io::Result<()> {
        if st.free_entry > 0 {
            st.free_entry = 0;
            st.free_section = (st.free_section + 1) % st.journal.sections;
            st.n_uncommitted += 1;
        }
        let count = st.n_uncommitted;
        if count == 0 {
            self.dev.flush()?;
            return self.mdev().flush();
        }
        let start = st.uncommitted_section;
        let mut i = start;
        for _ in 0..count {
            let seq = st.commit_seq;
            st.journal.stamp_section(i, seq);
            i += 1;
            if i >= st.journal.sections {
                st.commit_seq = next_seq(st.commit_seq);
                i = 0;
            }
        }
        // A journal that cannot be written (or written home) fails the device, as the
        // kernel's dm_integrity_io_error does: whichever path committed (a write, a flush,
        // the timer), every later I/O returns the error.
        let r = self
            .write_journal_sections(st, start, count)
            .and_then(|()| self.apply_sections(st, start, count, false));
        if let Err(e) = r {
            eprintln!(
                "device-mapper: integrity: {}: Error on journal commit: {e}",
                self.dev_spec
            );
            self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            return Err(e);
        }
        st.uncommitted_section = st.free_section;
        st.n_uncommitted = 0;
        st.pending.clear();
        Ok(())
    }

    /// Journals whole blocks at logical `sector` (J mode).
    fn journal_write(
        &self,
        st: &mut State,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let mut tags = Vec::new();
        self.compute_tags(salt.as_ref(), sector, data, given, &mut tags);
        for (k, block) in data.chunks_exact(bs).enumerate() {
            if st.free_entry == 0 && st.n_uncommitted == st.journal.sections {
                self.commit(st)?;
            }
            let s = sector + (k * bs / 512) as u64;
            let (i, e) = (st.free_section, st.free_entry);
            st.journal.put(i, e, s, block, &tags[k * ts..(k + 1) * ts]);
            st.pending.insert(s, (i, e));
            st.free_entry += 1;
            if st.free_entry == st.journal.section_entries {
                st.free_entry = 0;
                st.free_section = (st.free_section + 1) % st.journal.sections;
                st.n_uncommitted += 1;
            }
        }
        // `journal_watermark`: once this share of the journal holds uncommitted sections,
        // commit, so unflushed writes reach the disk without waiting for a full journal.
        // (The kernel starts that commit in the background; here the write that crosses the
        // watermark does it.)
        // Counted in entries, as the kernel's free-sectors threshold is.
        let per_section = u64::from(st.journal.section_entries);
        let used = u64::from(st.n_uncommitted) * per_section + u64::from(st.free_entry);
        let total = u64::from(st.journal.sections) * per_section;
        if used > 0 && used * 100 >= total * u64::from(self.cfg.journal_watermark) {
            self.commit(st)?;
        }
        Ok(())
    }

    /// Writes whole blocks and their tags in place (D and B modes, and wiping).
    fn direct_write(
        &self,
        st: &State,
        sector: u64,
        data: &[u8],
        given: Option<&[u8]>,
    ) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let mut done = 0usize;
        let mut tags = Vec::new();
        let mut cache = self.lock_tags();
        while done < data.len() {
            let s = sector + (done / 512) as u64;
            let n = ((self.layout.sectors_left_in_area(s) * 512) as usize).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.dev.write_at(
                self.layout.data_sector(s) * SECTOR_SIZE,
                chunk,
                WriteFlags::default(),
            )?;
            let g = given.map(|t| &t[done / bs * ts..(done + n) / bs * ts]);
            self.compute_tags(salt.as_ref(), s, chunk, g, &mut tags);
            self.store_tags(&mut cache, s, &tags)?;
            done += n;
        }
        Ok(())
    }

    /// Reads and verifies whole blocks at logical `sector` from their home locations.
    /// With `tags_out`, also returns the stored tags (`tag_size` bytes per block).
    fn read_home(
        &self,
        st: &State,
        sector: u64,
        buf: &mut [u8],
        mut tags_out: Option<&mut [u8]>,
    ) -> io::Result<()> {
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let salt = self.salt(&st.sb);
        let verify = self.cfg.mode != IntegrityMode::Recovery && self.hash.is_some();
        let checked_below = self.checked_below(st);
        let spb = self.layout.sectors_per_block as u64;
        let mut stored = Vec::new();
        let mut computed = Vec::new();
        let mut cache = None;
        let mut done = 0usize;
        while done < buf.len() {
            let s = sector + (done / 512) as u64;
            let n = ((self.layout.sectors_left_in_area(s) * 512) as usize).min(buf.len() - done);
            let chunk = &mut buf[done..done + n];
            self.dev
                .read_at(self.layout.data_sector(s) * SECTOR_SIZE, chunk)?;
            let verify = verify && !self.region_unverified(st, s, (n / 512) as u64);
            if verify || tags_out.is_some() {
                let nblocks = n / bs;
                let cache = cache.get_or_insert_with(|| self.lock_tags());
                let at = done / bs * ts;
                let tagbuf: &mut [u8] = match tags_out.as_deref_mut() {
                    Some(out) => &mut out[at..at + nblocks * ts],
                    None => {
                        stored.resize(nblocks * ts, 0);
                        &mut stored[..]
                    }
                };
                cache.read(
                    self.mdev().as_ref(),
                    self.tag_run(s),
                    self.layout.tag_position(s),
                    tagbuf,
                )?;
                // Blocks at or past `recalc_sector` have no valid tags yet: not checked.
                let nchecked = (checked_below.saturating_sub(s) / spb).min(nblocks as u64) as usize;
                if let (Some(hash), true) = (&self.hash, verify && nchecked > 0) {
                    computed.resize(nchecked * ts, 0);
                    hash.tags(salt.as_ref(), s, bs, &chunk[..nchecked * bs], &mut computed);
                    let tagbuf = &tagbuf[..nchecked * ts];
                    if computed[..] != tagbuf[..] {
                        let k = (0..nchecked)
                            .find(|&k| {
                                computed[k * ts..(k + 1) * ts] != tagbuf[k * ts..(k + 1) * ts]
                            })
                            .unwrap_or(0);
                        let bsec = s + (k * bs / 512) as u64;
                        self.mismatches.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "device-mapper: integrity: {}: Checksum failed at sector 0x{bsec:x}",
                            self.dev_spec
                        );
                        return Err(errno(libc::EILSEQ));
                    }
                }
            }
            done += n;
        }
        Ok(())
    }

    /// Writes zeros with valid tags over the whole provided area, then flushes (what
    /// `integritysetup format` does through the mapping unless `--no-wipe`).
    pub fn wipe(&self) -> io::Result<()> {
        if self.cfg.read_only {
            return Err(errno(libc::EROFS));
        }
        let st = self.lock();
        let chunk = vec![0u8; 1 << 20];
        let total = self.layout.provided_data_sectors * SECTOR_SIZE;
        let mut off = 0u64;
        while off < total {
            let n = (total - off).min(chunk.len() as u64) as usize;
            self.direct_write(&st, off / SECTOR_SIZE, &chunk[..n], None)?;
            off += n as u64;
        }
        self.dev.flush()?;
        self.mdev().flush()
    }

    /// Commits everything and leaves an empty journal, as a clean kernel suspend does. A
    /// recalculation in progress stops after its current chunk (the next open resumes it).
    pub fn close(&self) -> io::Result<()> {
        if let Some(r) = &self.recalc {
            r.stop();
        }
        if self.cfg.read_only {
            return Ok(());
        }
        // A failed device writes nothing more (its journal stays as it is on disk).
        self.check_failed()?;
        let mut st = self.lock();
        if self.cfg.mode == IntegrityMode::Bitmap {
            // Clean: the area goes back to an empty journal and the bitmap is retired.
            self.clean_bitmap(&mut st)?;
            let n = st.journal.sections;
            st.journal.init_sections(0, n, 0);
            self.write_journal_sections(&st, 0, n)?;
            st.sb.flags &= !FLAG_DIRTY_BITMAP;
            return self.write_superblock(&mut st);
        }
        if self.cfg.mode != IntegrityMode::Journal {
            self.dev.flush()?;
            return self.mdev().flush();
        }
        self.commit(&mut st)?;
        let n = st.journal.sections;
        let (free, seq) = (st.free_section, st.commit_seq);
        st.journal.init_sections(free, n - free, seq);
        if free > 0 {
            st.journal.init_sections(0, free, next_seq(seq));
        }
        self.write_journal_sections(&st, 0, n)
    }

    /// Tagged I/O needs external tags and exactly one tag per block.
    fn check_tags(&self, len: usize, tags_len: usize) -> io::Result<()> {
        if self.hash.is_some() {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let blocks = len / self.cfg.block_size as usize;
        if tags_len != blocks * self.layout.tag_size as usize {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    fn read_inner(
        &self,
        offset: u64,
        buf: &mut [u8],
        mut tags: Option<&mut [u8]>,
    ) -> io::Result<()> {
        self.check_io(offset, buf.len() as u64)?;
        let st = self.lock();
        let bs = self.cfg.block_size as usize;
        let ts = self.layout.tag_size as usize;
        let sector = offset / SECTOR_SIZE;
        if st.pending.is_empty() {
            return self.read_home(&st, sector, buf, tags);
        }
        // Runs of blocks not in the journal are read from home; journaled ones from memory.
        let nblocks = buf.len() / bs;
        let mut k = 0;
        while k < nblocks {
            let s = sector + (k * bs / 512) as u64;
            if let Some(&(i, e)) = st.pending.get(&s) {
                st.journal.block(i, e, &mut buf[k * bs..(k + 1) * bs]);
                if let Some(t) = tags.as_deref_mut() {
                    t[k * ts..(k + 1) * ts].copy_from_slice(st.journal.entry_tag(i, e));
                }
                k += 1;
                continue;
            }
            let mut end = k + 1;
            while end < nblocks && !st.pending.contains_key(&(sector + (end * bs / 512) as u64)) {
                end += 1;
            }
            let run_tags = tags.as_deref_mut().map(|t| &mut t[k * ts..end * ts]);
            self.read_home(&st, s, &mut buf[k * bs..end * bs], run_tags)?;
            k = end;
        }
        Ok(())
    }

    fn write_inner(
        &self,
        offset: u64,
        buf: &[u8],
        tags: Option<&[u8]>,
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.check_io(offset, buf.len() as u64)?;
        if self.cfg.read_only {
            return Err(errno(libc::EROFS));
        }
        let mut st = self.lock();
        let sector = offset / SECTOR_SIZE;
        match self.cfg.mode {
            IntegrityMode::Recovery => Err(errno(libc::EROFS)),
            IntegrityMode::Journal => {
                // Data and tag go into the same journal entry, so a commit makes both
                // durable together.
                self.journal_write(&mut st, sector, buf, tags)?;
                if flags.fua {
                    self.commit(&mut st)?;
                }
                if st.n_uncommitted > 0 || st.free_entry > 0 {
                    self.arm_timer();
                }
                Ok(())
            }
            IntegrityMode::Direct => {
                self.direct_write(&st, sector, buf, tags)?;
                if flags.fua {
                    self.dev.flush()?;
                    self.mdev().flush()?;
                }
                Ok(())
            }
            IntegrityMode::Bitmap => {
                self.mark_dirty(&mut st, sector, buf.len() as u64 / SECTOR_SIZE)?;
                self.direct_write(&st, sector, buf, tags)?;
                if flags.fua {
                    self.dev.flush()?;
                    self.mdev().flush()?;
                }
                Ok(())
            }
        }
    }

    fn check_io(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        let bs = self.cfg.block_size as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(errno(libc::EINVAL));
        }
        self.check_failed()
    }
}

impl BlockDevice for Core {
    fn size(&self) -> u64 {
        self.len
    }

    fn logical_block_size(&self) -> u32 {
        self.cfg.block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_inner(offset, buf, None)
    }

    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.write_inner(offset, buf, None, flags)
    }

    fn tag_size(&self) -> u32 {
        if self.hash.is_none() {
            self.layout.tag_size
        } else {
            0
        }
    }

    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        self.check_tags(buf.len(), tags.len())?;
        self.read_inner(offset, buf, Some(tags))
    }

    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        self.check_tags(buf.len(), tags.len())?;
        self.write_inner(offset, buf, Some(tags), flags)
    }

    fn flush(&self) -> io::Result<()> {
        self.check_failed()?;
        if self.cfg.read_only {
            return Ok(());
        }
        let mut st = self.lock();
        match self.cfg.mode {
            IntegrityMode::Journal => self.commit(&mut st),
            IntegrityMode::Direct => {
                self.dev.flush()?;
                self.mdev().flush()
            }
            IntegrityMode::Bitmap => self.clean_bitmap(&mut st),
            IntegrityMode::Recovery => Ok(()),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
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

impl Target for Core {
    fn target_type(&self) -> &'static str {
        "integrity"
    }

    fn table_params(&self, show_keys: bool) -> String {
        let c = &self.cfg;
        let sb = self.superblock();
        let mut opts: Vec<String> = Vec::new();
        if let Some(m) = &c.meta_device {
            opts.push(format!("meta_device:{m}"));
        }
        if c.block_size != 512 {
            opts.push(format!("block_size:{}", c.block_size));
        }
        if sb.flags & FLAG_RECALCULATING != 0 {
            opts.push("recalculate".into());
        }
        if c.reset_recalculate {
            opts.push("reset_recalculate".into());
        }
        if c.allow_discards {
            opts.push("allow_discards".into());
        }
        opts.push(format!(
            "journal_sectors:{}",
            self.layout.initial_sectors - SB_SECTORS
        ));
        opts.push(format!(
            "interleave_sectors:{}",
            1u64 << sb.log2_interleave_sectors
        ));
        opts.push(format!("buffer_sectors:{}", c.buffer_sectors));
        if c.mode == IntegrityMode::Journal {
            opts.push(format!("journal_watermark:{}", c.journal_watermark));
            opts.push(format!("commit_time:{}", c.commit_time));
        }
        if c.mode == IntegrityMode::Bitmap {
            opts.push(format!("sectors_per_bit:{}", 1u64 << self.bitmap_shift));
            opts.push(format!("bitmap_flush_interval:{}", c.bitmap_flush_interval));
        }
        if sb.flags & FLAG_FIXED_PADDING != 0 {
            opts.push("fix_padding".into());
        }
        if sb.flags & FLAG_FIXED_HMAC != 0 {
            opts.push("fix_hmac".into());
        }
        if c.legacy_recalculate {
            opts.push("legacy_recalculate".into());
        }
        // The kernel's order: internal_hash, journal_crypt, journal_mac.
        let algs = [
            ("internal_hash", &c.internal_hash, &c.internal_hash_key),
            ("journal_crypt", &c.journal_crypt, &c.journal_crypt_key),
            ("journal_mac", &c.journal_mac, &c.journal_mac_key),
        ];
        for (name, alg, key) in algs {
            let Some(alg) = alg else { continue };
            let mut s = format!("{name}:{alg}");
            if let Some(k) = key {
                s.push(':');
                if show_keys {
                    s.push_str(&k.to_hex());
                } else {
                    s.push_str(&"0".repeat(k.len() * 2));
                }
            }
            opts.push(s);
        }
        format!(
            "{} {} {} {} {} {}",
            self.dev_spec,
            c.start,
            self.layout.tag_size,
            c.mode.letter(),
            opts.len(),
            opts.join(" ")
        )
    }

    /// `<mismatches> <provided_data_sectors> <recalc_sector|->`, as the kernel reports.
    fn status_params(&self) -> String {
        let sb = self.superblock();
        let recalc = if sb.flags & FLAG_RECALCULATING != 0 {
            sb.recalc_sector.to_string()
        } else {
            "-".to_string()
        };
        format!(
            "{} {} {recalc}",
            self.mismatches(),
            self.layout.provided_data_sectors
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
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
        let (mut cfg, dev_spec) = IntegrityConfig::parse(args)?;
        cfg.read_only = cfg.read_only || ctx.resolver.read_only();
        let dev = ctx
            .resolver
            .open_device(&dev_spec)
            .map_err(|e| e.to_string())?;
        let meta = match &cfg.meta_device {
            Some(m) => Some(ctx.resolver.open_device(m).map_err(|e| e.to_string())?),
            None => None,
        };
        Self::open(dev, &dev_spec, meta, cfg, Some(ctx.len_bytes()))
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
    /// (nothing when read-only).
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

    fn as_any(&self) -> &dyn Any {
        self
    }
}
