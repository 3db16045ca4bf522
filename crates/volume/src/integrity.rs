//! Standalone dm-integrity devices as integritysetup handles them: the algorithm and its
//! keys, formatting a superblock and journal (then wiping so every sector has a valid tag),
//! and the activation plan of the kernel table integritysetup would load.
//!
//! `format` does what integritysetup does with the kernel: clear the superblock area, load
//! the target so that it writes a superblock and an empty journal, then write zeros with
//! valid tags over the whole device through a temporary target opened without the journal.
//! With a data device, the positional device holds superblock, journal and tags and the data
//! device only data (the kernel's `meta_device:` layout).

use crate::device::{open_file, table_path};
use crate::error::{Result, VolumeError};
use crate::plan::ActivationPlan;
use crate::progress::{zero_fill, Progress};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::integrity::hash::{kernel_name, InternalHash};
use cryptblk_dm::targets::integrity::{
    IntegrityAlgorithm, IntegrityConfig, IntegrityMode, IntegrityTableConfig, IntegrityTarget,
};
use cryptblk_dm::TableSpec;
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions, Target};
use cryptblk_format::integrity::IntegritySuperblock;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

/// integritysetup's default algorithm.
pub const DEFAULT_INTEGRITY: &str = "crc32c";
/// Longest key integritysetup reads from a key file.
pub const MAX_KEY_SIZE: u32 = 4096;
/// Superblock flag `fix_padding`.
const FLAG_FIXED_PADDING: u32 = 0x8;
/// Superblock flag `fix_hmac`.
const FLAG_FIXED_HMAC: u32 = 0x10;

/// The integrity algorithm as given (integritysetup spelling) and its kernel name, checked
/// with its key: an unknown name or a key that does not fit is refused before anything is
/// written.
pub struct Algorithm {
    /// As given (`hmac-sha256`).
    pub user: String,
    /// Kernel crypto API name (`hmac(sha256)`).
    pub kernel: String,
    /// The key of a keyed algorithm.
    pub key: Option<SecretBytes>,
    /// Digest size in bytes.
    pub digest_size: usize,
}

impl Algorithm {
    /// `name` (default crc32c) with `key`, checked.
    pub fn new(name: Option<&str>, key: Option<SecretBytes>) -> Result<Algorithm> {
        let user = name.unwrap_or(DEFAULT_INTEGRITY).to_string();
        let kernel = kernel_name(&user);
        let hash = InternalHash::new(&kernel, key.clone()).map_err(|e| {
            let what = if e.contains("needs a key") {
                format!(
                    "Integrity algorithm {user} needs a key: use --integrity-key-file and --integrity-key-size."
                )
            } else if e.contains("takes no key") {
                format!("Integrity algorithm {user} takes no key (drop --integrity-key-file).")
            } else {
                format!("Integrity algorithm {user} is not supported ({e}).")
            };
            VolumeError::usage(what)
        })?;
        Ok(Algorithm {
            user,
            kernel,
            key,
            digest_size: hash.digest_size(),
        })
    }
}

/// The internal hash key from `file` and `size` with integritysetup's rules: both or
/// neither, at most 4096 bytes, and the file must hold that many.
pub fn read_key(file: Option<&Path>, size: Option<u32>) -> Result<Option<SecretBytes>> {
    let (file, size) = match (file, size) {
        (None, None) => return Ok(None),
        (Some(f), Some(s)) => (f, s),
        _ => {
            return Err(VolumeError::usage(
                "Both key file and key size options must be specified.",
            ))
        }
    };
    if size == 0 || size > MAX_KEY_SIZE {
        return Err(VolumeError::usage(format!(
            "Invalid --integrity-key-size size {size}. Maximum is {MAX_KEY_SIZE} bytes."
        )));
    }
    let cannot = |e: std::io::Error| {
        VolumeError::usage(format!("Cannot read keyfile {} ({e}).", file.display()))
    };
    let mut f = std::fs::File::open(file).map_err(cannot)?;
    let mut key = SecretBytes::zeroed(size as usize);
    let mut got = 0;
    while got < key.len() {
        match f.read(&mut key.as_mut_bytes()[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(cannot(e)),
        }
    }
    if got != key.len() {
        return Err(VolumeError::usage(format!(
            "Cannot read {size} bytes from keyfile {}.",
            file.display()
        )));
    }
    Ok(Some(key))
}

/// A journal protection: encryption (`journal_crypt`) or MAC (`journal_mac`) and its key.
pub struct JournalKey {
    /// The table option (`journal_crypt` or `journal_mac`).
    pub option: &'static str,
    /// Kernel algorithm name (`ctr(aes)`, `hmac(sha256)`).
    pub algorithm: String,
    /// The key.
    pub key: SecretBytes,
}

/// What a journal protection is asked with: `alg` as integritysetup spells it (`ctr-aes`),
/// its key file and key size.
pub struct JournalRequest<'a> {
    /// The table option (`journal_crypt` or `journal_mac`).
    pub option: &'static str,
    /// How messages name it ("journal encryption", "journal integrity").
    pub what: &'static str,
    /// The algorithm, if asked for.
    pub algorithm: Option<&'a str>,
    /// Its key file.
    pub key_file: Option<&'a Path>,
    /// Its key size in bytes.
    pub key_size: Option<u32>,
}

/// The journal protections asked for, keys read and checked as integritysetup does.
pub fn journal_keys(requests: &[JournalRequest<'_>]) -> Result<Vec<JournalKey>> {
    let mut out = Vec::new();
    for r in requests {
        let what = r.what;
        let Some(alg) = r.algorithm else {
            if r.key_file.is_some() || r.key_size.is_some() {
                return Err(VolumeError::usage(format!(
                    "A {what} key file or size needs the {what} algorithm."
                )));
            }
            continue;
        };
        // integritysetup's crypt_parse_hash_integrity_mode: "mode-alg" is "mode(alg)".
        if alg.contains(['(', ')']) {
            return Err(VolumeError::usage(format!(
                "Invalid {what} algorithm {alg}."
            )));
        }
        let kernel = match alg.split_once('-') {
            Some((m, a)) if !a.starts_with(|c: char| c.is_ascii_digit()) => format!("{m}({a})"),
            _ => alg.to_string(),
        };
        let (Some(file), Some(size)) = (r.key_file, r.key_size) else {
            return Err(VolumeError::usage(format!(
                "Both {what} key file and key size options must be specified."
            )));
        };
        if size == 0 || size > MAX_KEY_SIZE {
            return Err(VolumeError::usage(format!(
                "Invalid {what} key size {size}. Maximum is {MAX_KEY_SIZE} bytes."
            )));
        }
        let bytes = SecretBytes::from_vec(std::fs::read(file).map_err(|e| {
            VolumeError::usage(format!("Cannot read keyfile {} ({e}).", file.display()))
        })?);
        if bytes.len() < size as usize {
            return Err(VolumeError::usage(format!(
                "Cannot read {size} bytes from keyfile {}.",
                file.display()
            )));
        }
        out.push(JournalKey {
            option: r.option,
            algorithm: kernel,
            key: SecretBytes::from_slice(&bytes.as_bytes()[..size as usize]),
        });
    }
    Ok(out)
}

/// Puts the journal protections into a target config.
pub fn apply_journal_keys(cfg: &mut IntegrityConfig, keys: &[JournalKey]) {
    for k in keys {
        if k.option == "journal_crypt" {
            (cfg.journal_crypt, cfg.journal_crypt_key) =
                (Some(k.algorithm.clone()), Some(k.key.clone()));
        } else {
            (cfg.journal_mac, cfg.journal_mac_key) =
                (Some(k.algorithm.clone()), Some(k.key.clone()));
        }
    }
}

/// Opens `device` as a backing of the integrity target.
fn open_backing(device: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>> {
    // Fail like the rest of the library for a missing device, with cryptsetup's exit code.
    drop(open_file(device, !read_only)?);
    let b = FileBacking::open(
        device,
        FileOptions {
            read_only,
            ..Default::default()
        },
    )
    .map_err(|e| {
        VolumeError::device(format!(
            "Device {} does not exist or access denied ({e}).",
            device.display()
        ))
    })?;
    Ok(Arc::new(b))
}

/// The devices of an integrity volume, opened for formatting.
pub struct Devices {
    dev: Arc<dyn BlockDevice>,
    meta: Option<Arc<dyn BlockDevice>>,
    spec: String,
}

impl Devices {
    /// Opens `device` and, with `data_device`, the data device (then `device` holds only
    /// the metadata).
    pub fn open(device: &Path, data_device: Option<&Path>) -> Result<Devices> {
        let dev = open_backing(device, false)?;
        Ok(match data_device {
            Some(d) => Devices {
                dev: open_backing(d, false)?,
                meta: Some(dev),
                spec: d.display().to_string(),
            },
            None => Devices {
                dev,
                meta: None,
                spec: device.display().to_string(),
            },
        })
    }

    /// The data device as the table names it.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// Writes the superblock and an empty journal for `cfg`; `device` names the positional
    /// device in the error.
    pub fn format(&self, cfg: &IntegrityConfig, device: &Path) -> Result<IntegritySuperblock> {
        IntegrityTarget::format(
            self.dev.clone(),
            &self.spec,
            self.meta.clone(),
            cfg.clone(),
            false,
        )
        .map_err(|e| {
            VolumeError::usage(format!(
                "Cannot format integrity for device {}: {e}",
                device.display()
            ))
        })
    }

    /// Writes zeros with valid tags over the whole device through the target opened without
    /// the journal, as integritysetup does, and leaves it clean; returns the bytes written.
    pub fn wipe(self, cfg: &IntegrityConfig, progress: &mut dyn Progress) -> Result<u64> {
        let mut cfg = cfg.clone();
        cfg.mode = IntegrityMode::Direct;
        let t = IntegrityTarget::open(self.dev, &self.spec, self.meta, cfg, None).map_err(|e| {
            VolumeError::device(format!("Cannot open {} to wipe it: {e}", self.spec))
        })?;
        let total = zero_fill(&t, "Wiping", progress)?;
        // What a clean suspend of the mapping does: commit, leave the journal empty.
        t.postsuspend()
            .map_err(|e| VolumeError::device(format!("Flushing after the wipe failed: {e}")))?;
        Ok(total)
    }
}

/// How the device runs once open (the table's mode letter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// J: writes go through the journal.
    Journal,
    /// D: no journal (`--integrity-no-journal`).
    Direct,
    /// B: a dirty bitmap instead of the journal.
    Bitmap,
    /// R: tags not checked, read-only (`--integrity-recovery-mode`).
    Recovery,
}

impl OpenMode {
    fn kernel(self) -> IntegrityMode {
        match self {
            OpenMode::Journal => IntegrityMode::Journal,
            OpenMode::Direct => IntegrityMode::Direct,
            OpenMode::Bitmap => IntegrityMode::Bitmap,
            OpenMode::Recovery => IntegrityMode::Recovery,
        }
    }

    fn name(self) -> &'static str {
        match self {
            OpenMode::Journal => "journal",
            OpenMode::Direct => "direct",
            OpenMode::Bitmap => "bitmap",
            OpenMode::Recovery => "recovery",
        }
    }
}

/// Recalculation of tags while the device serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recalculate {
    /// From the superblock's `recalc_sector` (`recalculate`).
    Resume,
    /// From sector 0 (`reset_recalculate`).
    Reset,
}

/// The activation options of `integrity open`, with integritysetup's defaults when `None`.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The mode.
    pub mode: OpenMode,
    /// Tag recalculation, if asked for.
    pub recalculate: Option<Recalculate>,
    /// `buffer_sectors` (128).
    pub buffer_sectors: Option<u32>,
    /// `journal_watermark` in percent (50), journal mode.
    pub journal_watermark: Option<u32>,
    /// `commit_time` in ms (10000), journal mode.
    pub commit_time: Option<u32>,
    /// `sectors_per_bit`, bitmap mode.
    pub sectors_per_bit: Option<u64>,
    /// `bitmap_flush_interval` in ms, bitmap mode.
    pub bitmap_flush_interval: Option<u32>,
    /// Serve read-only (recovery mode is read-only anyway).
    pub readonly: bool,
}

/// The plan that serves the integrity device on `device` (with `data_device`, the metadata
/// device) as `name`: the table integritysetup would load, and the facts `status` shows.
pub fn plan(
    device: &Path,
    data_device: Option<&Path>,
    name: &str,
    alg: &Algorithm,
    journals: &[JournalKey],
    o: &OpenOptions,
) -> Result<ActivationPlan> {
    let f = open_file(device, false)?;
    let sb = IntegritySuperblock::read(&f, 0).map_err(|_| {
        VolumeError::usage(format!(
            "Device {} is not a valid INTEGRITY device.",
            device.display()
        ))
    })?;
    let mpath = table_path(device)?;
    // The table's device is the data device; the positional one is then `meta_device:`.
    let (dpath, meta_path) = match data_device {
        Some(d) => (table_path(d)?, Some(mpath)),
        None => (mpath, None),
    };
    let mut line = IntegrityTableConfig::new(&dpath.display().to_string(), o.mode.kernel());
    line.tag_size = Some(u32::from(sb.integrity_tag_size));
    line.meta_device = meta_path.as_ref().map(|m| m.display().to_string());
    if sb.sector_size() != 512 {
        line.block_size = Some(sb.sector_size());
    }
    line.reset_recalculate = o.recalculate == Some(Recalculate::Reset);
    line.recalculate = o.recalculate == Some(Recalculate::Resume);
    line.buffer_sectors = Some(o.buffer_sectors.unwrap_or(128).max(1));
    if o.mode == OpenMode::Journal {
        line.journal_watermark = Some(o.journal_watermark.unwrap_or(50));
        line.commit_time = Some(o.commit_time.unwrap_or(10000));
    }
    if o.mode == OpenMode::Bitmap {
        if let Some(n) = o.sectors_per_bit {
            if n == 0 || !n.is_power_of_two() {
                return Err(VolumeError::usage(format!(
                    "Invalid --bitmap-sectors-per-bit {n} (a power of two)."
                )));
            }
            line.sectors_per_bit = Some(n);
        }
        line.bitmap_flush_interval = o.bitmap_flush_interval;
    }
    line.fix_padding = sb.flags & FLAG_FIXED_PADDING != 0;
    line.fix_hmac = sb.flags & FLAG_FIXED_HMAC != 0;
    line.internal_hash = Some(match &alg.key {
        Some(k) => IntegrityAlgorithm::keyed(&alg.kernel, k.clone()),
        None => IntegrityAlgorithm::new(&alg.kernel),
    });
    for j in journals {
        let a = Some(IntegrityAlgorithm::keyed(&j.algorithm, j.key.clone()));
        if j.option == "journal_crypt" {
            line.journal_crypt = a;
        } else {
            line.journal_mac = a;
        }
    }
    let table = TableSpec::single(sb.provided_data_sectors, line).to_text(true);
    Ok(ActivationPlan {
        name: name.to_string(),
        table,
        lower: Vec::new(),
        keyed_lower: Vec::new(),
        info: crate::facts::VolumeFacts {
            kind: "INTEGRITY".into(),
            device: Some(dpath.display().to_string()),
            metadata_device: meta_path.as_ref().map(|m| m.display().to_string()),
            integrity: Some(alg.kernel.to_string()),
            tag_size: Some(u64::from(sb.integrity_tag_size)),
            sector_size: Some(u64::from(sb.sector_size())),
            mode: Some(o.mode.name().to_string()),
            ..Default::default()
        },
    })
}
