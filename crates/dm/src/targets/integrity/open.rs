//! The integrity device's core: [`Core`] (everything one mapping is) and its locked
//! [`State`], with construction — [`Core::open`] validates or creates the superblock,
//! derives the layout and bitmap granularity, formats a blank device, then resumes
//! (see `resume.rs`) — [`Core::format`], and the small accessors every path shares
//! (superblock writes, the failure latch, lock helpers).
//!
//! Invariants: lock order is `state`, then `tags`; a latched failure (`failed` != 0) is
//! never cleared, and every later I/O returns it; the superblock is written with FUA and
//! flushed, and the `recalculating` flag is durable before any block is read unchecked
//! because of it; read-only and recovery opens never write.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cryptblk_cipher::SecretBytes;

use super::hash::InternalHash;
use super::journal::Journal;
use super::layout::{Layout, MAX_TAG_SIZE};
use super::superblock::{
    self, Superblock, FLAG_FIXED_HMAC, FLAG_FIXED_PADDING, FLAG_HAVE_JOURNAL_MAC,
    FLAG_RECALCULATING, SUPERBLOCK_BYTES,
};
use super::tagcache::{TagCache, TagRun};
use super::{journal_crypt, recalc, timer, IntegrityConfig, IntegrityMode, U64Map};
use crate::device::{BlockDevice, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;

/// Mutable state behind one lock: the in-memory journal and where writing continues.
pub(super) struct State {
    pub(super) sb: Superblock,
    pub(super) journal: Journal,
    pub(super) commit_seq: u8,
    pub(super) free_section: u32,
    pub(super) free_entry: u32,
    pub(super) uncommitted_section: u32,
    pub(super) n_uncommitted: u32,
    /// Logical block sector -> (section, entry) of its newest journal copy not yet written
    /// to its home location.
    pub(super) pending: U64Map<(u32, u32)>,
    /// Bitmap mode: one bit per `1 << bitmap_shift` sectors with writes not yet flushed
    /// (bit `n` = byte `n / 8`, bit `n % 8`, as the kernel's little-endian bitmaps).
    pub(super) bitmap: Vec<u8>,
    /// Read-only opens of a device with a dirty bitmap: regions (same bit layout) whose tags
    /// a read-write open would recalculate from the data, so reads there skip tag checks.
    pub(super) unverified: Vec<u8>,
}

/// Everything the target is; shared (through a `Weak`) with the background timer thread.
pub(super) struct Core {
    pub(super) dev: Arc<dyn BlockDevice>,
    // `hash` is None when tags are supplied by the caller (external tags).
    pub(super) meta: Option<Arc<dyn BlockDevice>>,
    pub(super) dev_spec: String,
    pub(super) cfg: IntegrityConfig,
    pub(super) layout: Layout,
    pub(super) hash: Option<InternalHash>,
    /// The journal cipher (`journal_crypt:`), if any.
    pub(super) jcrypt: Option<journal_crypt::JournalCrypt>,
    /// The journal MAC (`journal_mac:`), if any.
    pub(super) jmac: Option<journal_crypt::JournalMac>,
    pub(super) len: u64,
    pub(super) state: Mutex<State>,
    pub(super) mismatches: AtomicU64,
    /// errno latched by a fatal metadata error (journal corruption); 0 = healthy.
    pub(super) failed: AtomicI32,
    /// log2 of the sectors covered by one bitmap bit.
    pub(super) bitmap_shift: u32,
    /// Cached tag buffers; locked only while `state` is held (lock order: state, then
    /// tags), so the cache is coherent with every tag write.
    pub(super) tags: Mutex<TagCache>,
    /// The commit (J) / bitmap flush (B) timer, when one runs.
    pub(super) timer: Option<Arc<timer::TimerCtl>>,
    /// The background tag recalculation, when one is due (see [`recalc`]).
    pub(super) recalc: Option<Arc<recalc::RecalcCtl>>,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn mdev(&self) -> &Arc<dyn BlockDevice> {
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

    pub(super) fn salt(&self, sb: &Superblock) -> Option<[u8; 16]> {
        (sb.flags & FLAG_FIXED_HMAC != 0).then_some(sb.salt)
    }

    pub(super) fn check_failed(&self) -> io::Result<()> {
        match self.failed.load(Ordering::SeqCst) {
            0 => Ok(()),
            e => Err(errno(e)),
        }
    }

    pub(super) fn fail(&self, e: i32) {
        let _ = self
            .failed
            .compare_exchange(0, e, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub(super) fn write_superblock(&self, st: &mut State) -> io::Result<()> {
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

    pub(super) fn lock_tags(&self) -> std::sync::MutexGuard<'_, TagCache> {
        self.tags.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The metadata run of logical `sector` (see [`TagCache`]).
    pub(super) fn tag_run(&self, sector: u64) -> TagRun {
        self.layout.tag_run(sector)
    }
}
