//! `crypt <cipher> <key> <iv_offset> <dev> <offset> [<#opt_params> <opt_params>...]`: the
//! dm-crypt target, with the kernel's two processing models.
//!
//! - **Inline** (`no_read_workqueue` / `no_write_workqueue`): the submitting thread reads and
//!   decrypts, or encrypts and writes; no hand-off.
//! - **Queued** (the kernel default): reads go through a `kcryptd_io` thread and are
//!   decrypted on the `kcryptd` worker pool; writes are encrypted on the pool and handed to
//!   a single `dmcrypt_write` thread that sorts them by sector, unless
//!   `submit_from_crypt_cpus`. See [`queued`].
//!
//! The direction's pipeline is chosen per request from the flags, so a table reload that
//! flips flags (what `cryptsetup refresh --perf-no_*_workqueue` does) switches models.
//!
//! With `integrity:<bytes>:aead|none` (LUKS2 `--integrity`) the target runs authenticated
//! encryption over a device that stores per-sector metadata (see the `aead` submodule);
//! those requests always run inline.
//!
//! Messages (`dmsetup message <dev> 0 key wipe|set <hex key>`) work as in the kernel: only
//! while the device is suspended. `key wipe` zeroes the key and drops the cipher and its
//! worker threads; resuming then fails (`ENOKEY`, the kernel's "key is not set") so the
//! device stays suspended and I/O through the mapping waits, until `key set` with a key of
//! the same size brings the cipher back. A caller driving a wiped target directly, not
//! through a [`crate::Mapping`], gets `ENOKEY` errors.

mod aead;
mod config;
pub mod queued;
mod split;
mod stats;
mod transform;

use std::any::Any;
use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;

use cryptblk_cipher::{CipherError, SecretBytes, SectorCipher, SectorOptions};

use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::{errno, DmError};
use crate::targets::config::{table_params_of, TargetConfig};
use crate::targets::{BuildContext, Target, TargetStats};
use crate::SECTOR_SIZE;

pub use aead::{CryptIntegrity, IntegrityKind};
pub use config::{CryptConfig, CryptKey};
pub use queued::QueuedEngine;
pub use split::SplitPolicy;
pub use stats::{CryptStats, CryptStatsSnapshot};
use transform::{SectorTransform, Way};

/// The optional parameters of a crypt table line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CryptFlags {
    /// Pass discards down (`allow_discards`).
    pub allow_discards: bool,
    /// Keep crypto work on the submitting CPU's worker (`same_cpu_crypt`).
    pub same_cpu_crypt: bool,
    /// Write from the crypt worker instead of the sorting writer (`submit_from_crypt_cpus`).
    pub submit_from_crypt_cpus: bool,
    /// Decrypt reads inline (`no_read_workqueue`).
    pub no_read_workqueue: bool,
    /// Encrypt and submit writes inline (`no_write_workqueue`).
    pub no_write_workqueue: bool,
    /// The worker threads at nice -20 (`high_priority`, dm-crypt 1.25 / Linux 6.10).
    pub high_priority: bool,
    /// Encryption sector size (`sector_size:<n>`), 512 by default.
    pub sector_size: u32,
    /// IVs count in `sector_size` units instead of 512-byte units (`iv_large_sectors`).
    pub iv_large_sectors: bool,
    /// Per-sector metadata from the device below (`integrity:<bytes>:<type>`): authenticated
    /// encryption over dm-integrity.
    pub integrity: Option<CryptIntegrity>,
    /// HMAC key bytes of an `authenc` cipher when they differ from the digest size
    /// (`integrity_key_size:<bytes>`, cryptsetup's `--integrity-key-size`).
    pub integrity_key_size: Option<u32>,
}

impl Default for CryptFlags {
    fn default() -> Self {
        CryptFlags {
            allow_discards: false,
            same_cpu_crypt: false,
            submit_from_crypt_cpus: false,
            no_read_workqueue: false,
            no_write_workqueue: false,
            high_priority: false,
            sector_size: SECTOR_SIZE as u32,
            iv_large_sectors: false,
            integrity: None,
            integrity_key_size: None,
        }
    }
}

impl CryptFlags {
    /// Both directions inline (the Cloudflare configuration).
    pub fn inline() -> Self {
        CryptFlags {
            no_read_workqueue: true,
            no_write_workqueue: true,
            ..Default::default()
        }
    }

    /// Parses the optional parameters (after `<#opt_params>`).
    pub fn parse(opts: &[String]) -> Result<Self, String> {
        let mut f = CryptFlags::default();
        for opt in opts {
            match opt.as_str() {
                "allow_discards" => f.allow_discards = true,
                "same_cpu_crypt" => f.same_cpu_crypt = true,
                "submit_from_crypt_cpus" => f.submit_from_crypt_cpus = true,
                "no_read_workqueue" => f.no_read_workqueue = true,
                "no_write_workqueue" => f.no_write_workqueue = true,
                "high_priority" => f.high_priority = true,
                "iv_large_sectors" => f.iv_large_sectors = true,
                s if s.starts_with("sector_size:") => {
                    let v = &s["sector_size:".len()..];
                    let n: u32 = v
                        .parse()
                        .map_err(|_| format!("invalid sector_size '{v}'"))?;
                    if !n.is_power_of_two() || !(512..=4096).contains(&n) {
                        return Err(format!(
                            "invalid sector_size {n} (must be a power of two from 512 to 4096)"
                        ));
                    }
                    f.sector_size = n;
                }
                s if s.starts_with("integrity_key_size:") => {
                    let v = &s["integrity_key_size:".len()..];
                    let n: u32 = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("invalid integrity_key_size '{v}'"))?;
                    f.integrity_key_size = Some(n);
                }
                s if s.starts_with("integrity:") => f.integrity = Some(CryptIntegrity::parse(s)?),
                other => return Err(format!("invalid feature argument '{other}'")),
            }
        }
        if f.iv_large_sectors && f.sector_size == SECTOR_SIZE as u32 {
            // The kernel accepts it; it is simply a no-op with 512-byte sectors.
        }
        Ok(f)
    }

    /// The options as the kernel prints them, in the kernel's order (empty if none).
    pub fn format(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.allow_discards {
            v.push("allow_discards".to_string());
        }
        if self.same_cpu_crypt {
            v.push("same_cpu_crypt".to_string());
        }
        // The kernel prints high_priority right after same_cpu_crypt.
        if self.high_priority {
            v.push("high_priority".to_string());
        }
        if self.submit_from_crypt_cpus {
            v.push("submit_from_crypt_cpus".to_string());
        }
        if self.no_read_workqueue {
            v.push("no_read_workqueue".to_string());
        }
        if self.no_write_workqueue {
            v.push("no_write_workqueue".to_string());
        }
        if let Some(i) = &self.integrity {
            v.push(i.to_string());
        }
        // Seen right after integrity:<n>:aead in the kernel's table (6.12); its place
        // relative to sector_size is not verified.
        if let Some(n) = self.integrity_key_size {
            v.push(format!("integrity_key_size:{n}"));
        }
        if self.sector_size != SECTOR_SIZE as u32 {
            v.push(format!("sector_size:{}", self.sector_size));
        }
        if self.iv_large_sectors {
            v.push("iv_large_sectors".to_string());
        }
        v
    }
}

/// Opens a sector cipher for `spec` and `key` with dm-crypt semantics, using the cipher
/// crate's best implementation (or `implementation`, a name from `cryptblk ciphers`).
pub fn open_sector_cipher(
    spec: &str,
    key: &[u8],
    flags: &CryptFlags,
    iv_offset: u64,
    implementation: Option<&str>,
) -> Result<Box<dyn SectorCipher>, CipherError> {
    let opts = SectorOptions {
        sector_size: flags.sector_size as usize,
        iv_offset,
        iv_large_sectors: flags.iv_large_sectors,
        implementation: implementation.map(str::to_string),
    };
    cryptblk_cipher::open_cipher(spec, key, &opts)
}

/// Everything needed to build a crypt target programmatically (e.g. from a LUKS header).
pub struct CryptParams {
    /// Cipher specification as in the table (`aes-xts-plain64`, `capi:xts(aes)-plain64`).
    pub cipher_spec: String,
    /// The volume key (empty for the null cipher, printed as `-`).
    pub key: SecretBytes,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// The device as named in the table.
    pub dev_spec: String,
    /// Start of the encrypted data on the device, in 512-byte sectors.
    pub offset_sectors: u64,
    /// Optional parameters.
    pub flags: CryptFlags,
    /// Cipher implementation to use (`None` = the fastest available).
    pub implementation: Option<String>,
}

/// What exists only while the target holds a valid key: the ciphers and the workers that
/// use them. `key wipe` drops it all; `key set` builds it again.
struct Keyed {
    cipher: Arc<dyn SectorCipher>,
    /// The authenticated cipher when the table has `integrity:<n>:<type>`; I/O then goes
    /// through the `aead` submodule (inline only) and `cipher` merely describes it.
    aead: Option<Arc<dyn cryptblk_cipher::aead::AeadSectorCipher>>,
    engine: Option<QueuedEngine>,
}

/// The crypt target.
pub struct CryptTarget {
    /// The table parameters; `params.key` is emptied at build, the key lives in `state`.
    params: CryptParams,
    /// The volume key (empty for the null cipher); all zeros after a wipe, keeping its
    /// length as the kernel does for `dmsetup table`. Not used by requests.
    key: Mutex<SecretBytes>,
    /// What requests use; `None` after `key wipe`. Loaded without a lock by every request
    /// (a thread-local reference, no shared counter written); replaced only by key
    /// messages, which wait for requests still holding the old one (see `retire`).
    keyed: ArcSwapOption<Keyed>,
    /// Implementation name of the cipher, kept for status after a wipe.
    cipher_impl: String,
    dev: Arc<dyn BlockDevice>,
    len: u64,
    stats: Arc<CryptStats>,
    /// Between `postsuspend` and `resume`: the only time key messages are accepted.
    suspended: AtomicBool,
    /// Split threshold in bytes; 0 = off (see [`SplitPolicy`]).
    split: AtomicUsize,
}

thread_local! {
    /// Per-thread ciphertext buffer for inline writes that may not clobber the caller's data.
    static WRITE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl CryptTarget {
    /// Builds a crypt target of `len` bytes over `dev` with a cipher opened from `params`.
    pub fn new(dev: Arc<dyn BlockDevice>, len: u64, params: CryptParams) -> Result<Self, DmError> {
        if params.flags.integrity.is_some() {
            return aead::new_target(dev, len, params);
        }
        let cipher = open_sector_cipher(
            &params.cipher_spec,
            params.key.as_bytes(),
            &params.flags,
            params.iv_offset,
            params.implementation.as_deref(),
        )?;
        Self::with_cipher(dev, len, params, Arc::from(cipher))
    }

    /// Builds a crypt target around an already opened cipher.
    pub fn with_cipher(
        dev: Arc<dyn BlockDevice>,
        len: u64,
        params: CryptParams,
        cipher: Arc<dyn SectorCipher>,
    ) -> Result<Self, DmError> {
        if params.flags.integrity.is_some() {
            return Err(DmError::TableShape(
                "crypt target: integrity:<n>:<type> needs an authenticated cipher; build it with CryptTarget::new".into(),
            ));
        }
        Self::build(dev, len, params, cipher, None)
    }

    fn build(
        dev: Arc<dyn BlockDevice>,
        len: u64,
        mut params: CryptParams,
        cipher: Arc<dyn SectorCipher>,
        aead: Option<Arc<dyn cryptblk_cipher::aead::AeadSectorCipher>>,
    ) -> Result<Self, DmError> {
        let ss = u64::from(params.flags.sector_size);
        let shape = |msg: String| DmError::TableShape(format!("crypt target: {msg}"));
        if cipher.sector_size() as u64 != ss {
            return Err(shape(format!(
                "cipher sector size {} does not match sector_size:{ss}",
                cipher.sector_size()
            )));
        }
        if len == 0 || !len.is_multiple_of(ss) {
            return Err(shape(format!(
                "device size {len} is not a multiple of sector_size {ss}"
            )));
        }
        if !(params.iv_offset * SECTOR_SIZE).is_multiple_of(ss) {
            return Err(shape(format!(
                "iv_offset {} is not aligned to sector_size {ss}",
                params.iv_offset
            )));
        }
        let end = params
            .offset_sectors
            .checked_mul(SECTOR_SIZE)
            .and_then(|b| b.checked_add(len));
        if end.is_none_or(|e| e > dev.size()) {
            return Err(shape(format!(
                "device {} too small: needs {} bytes from sector {}, has {}",
                params.dev_spec,
                len,
                params.offset_sectors,
                dev.size()
            )));
        }
        let stats = Arc::new(CryptStats::default());
        let engine = Self::start_engine(&params, &cipher, aead.is_some(), &dev, &stats)?;
        let key = std::mem::replace(&mut params.key, SecretBytes::zeroed(0));
        Ok(CryptTarget {
            cipher_impl: cipher.implementation().to_string(),
            params,
            key: Mutex::new(key),
            keyed: ArcSwapOption::from_pointee(Keyed {
                cipher,
                aead,
                engine,
            }),
            dev,
            len,
            stats,
            suspended: AtomicBool::new(false),
            split: AtomicUsize::new(0),
        })
    }

    /// Starts the queued workers unless both directions run inline.
    fn start_engine(
        params: &CryptParams,
        cipher: &Arc<dyn SectorCipher>,
        authenticated: bool,
        dev: &Arc<dyn BlockDevice>,
        stats: &Arc<CryptStats>,
    ) -> Result<Option<QueuedEngine>, DmError> {
        // Authenticated I/O is inline only: the queued engine has no tag path.
        if authenticated || (params.flags.no_read_workqueue && params.flags.no_write_workqueue) {
            return Ok(None);
        }
        QueuedEngine::start(
            cipher.clone(),
            dev.clone(),
            params.offset_sectors * SECTOR_SIZE,
            params.flags,
            stats.clone(),
        )
        .map(Some)
        .map_err(|source| DmError::Device {
            spec: params.dev_spec.clone(),
            source: io::Error::new(
                source.kind(),
                format!("cannot start crypt worker threads: {source}"),
            ),
        })
    }

    /// The ciphers and workers for `key`, as [`CryptTarget::new`] makes them.
    fn key_up(&self, key: &SecretBytes) -> Result<Keyed, DmError> {
        let p = &self.params;
        let (cipher, aead) = if p.flags.integrity.is_some() {
            let aead = aead::open_aead(p, key.as_bytes())?;
            (aead::stand_in(aead.as_ref()), Some(aead))
        } else {
            let c = open_sector_cipher(
                &p.cipher_spec,
                key.as_bytes(),
                &p.flags,
                p.iv_offset,
                p.implementation.as_deref(),
            )?;
            (Arc::from(c), None)
        };
        let engine = Self::start_engine(p, &cipher, aead.is_some(), &self.dev, &self.stats)?;
        Ok(Keyed {
            cipher,
            aead,
            engine,
        })
    }

    fn key_bytes(&self) -> std::sync::MutexGuard<'_, SecretBytes> {
        // Key messages replace the key in one assignment; a panic cannot leave it torn.
        self.key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the ciphers out of service and drops them (stopping their workers) once no
    /// request holds them any more, so a wiped key is gone when the message returns.
    fn retire(&self) {
        let Some(mut old) = self.keyed.swap(None) else {
            return;
        };
        // After the swap no new request can load it; requests that loaded it before hold
        // counted references (arc-swap converts their thread-local claims on swap).
        loop {
            match Arc::try_unwrap(old) {
                Ok(keyed) => return drop(keyed),
                Err(still_used) => {
                    old = still_used;
                    std::thread::yield_now();
                }
            }
        }
    }

    /// `key wipe` / `key set <hex>`: the kernel's dm-crypt key messages.
    fn key_message(&self, argv: &[&str]) -> Result<(), String> {
        if !self.suspended.load(Ordering::SeqCst) {
            return Err("not suspended during key manipulation".into());
        }
        let mut key_bytes = self.key_bytes();
        match argv {
            ["wipe"] => {
                // Drop the ciphers (and stop their workers) before zeroing our copy.
                self.retire();
                key_bytes.as_mut_bytes().fill(0);
                Ok(())
            }
            ["set", hex] => {
                let CryptKey::Hex(key) = CryptKey::parse(hex)? else {
                    return Err("key set needs the key in hex".into());
                };
                if key.len() != key_bytes.len() {
                    return Err(format!(
                        "key size mismatch: the table's key has {} bytes, {} given",
                        key_bytes.len(),
                        key.len()
                    ));
                }
                // Stop the old workers before starting new ones.
                self.retire();
                let keyed = self.key_up(&key).map_err(|e| {
                    // As in the kernel, a failed set leaves no valid key behind.
                    key_bytes.as_mut_bytes().fill(0);
                    match e {
                        DmError::TableShape(m) => {
                            m.trim_start_matches("crypt target: ").to_string()
                        }
                        other => other.to_string(),
                    }
                })?;
                self.keyed.store(Some(Arc::new(keyed)));
                *key_bytes = key;
                Ok(())
            }
            _ => Err(format!(
                "unrecognised key message '{}' (expected key wipe or key set <hex key>)",
                argv.join(" ")
            )),
        }
    }

    /// Whether the target holds a key (false after `key wipe` until `key set`).
    pub fn key_valid(&self) -> bool {
        self.keyed.load().is_some()
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &CryptConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its device.
    pub(crate) fn from_config(ctx: &BuildContext<'_>, cfg: &CryptConfig) -> Result<Self, String> {
        let params = cfg.to_params(ctx.options.cipher_implementation.clone())?;
        let dev = ctx.open_device(&cfg.device, cfg.offset)?;
        Self::new(dev, ctx.len_bytes(), params).map_err(|e| match e {
            DmError::TableShape(m) => m.trim_start_matches("crypt target: ").to_string(),
            other => other.to_string(),
        })
    }

    /// The table arguments of this target (its key included: drop it soon).
    pub fn config(&self) -> CryptConfig {
        let mut cfg = CryptConfig::from(&self.params);
        // The key lives in the key state (`key wipe`/`key set` replace it), not in params.
        let key = self.key_bytes();
        cfg.key = if key.is_empty() {
            CryptKey::None
        } else {
            CryptKey::Hex(key.clone())
        };
        cfg
    }

    /// The target's flags.
    pub fn flags(&self) -> CryptFlags {
        self.params.flags
    }

    /// Request counters.
    pub fn stats(&self) -> CryptStatsSnapshot {
        self.stats.snapshot()
    }

    /// The cipher in use (`None` after `key wipe`).
    pub fn cipher(&self) -> Option<Arc<dyn SectorCipher>> {
        self.keyed.load().as_ref().map(|k| k.cipher.clone())
    }

    /// Sets when large inline requests are split across cores (takes effect immediately).
    pub fn set_split_policy(&self, policy: SplitPolicy) {
        let v = match policy {
            SplitPolicy::Off => 0,
            SplitPolicy::Above(n) => n.max(1),
        };
        self.split.store(v, Ordering::Relaxed);
    }

    /// When large inline requests are split across cores.
    pub fn split_policy(&self) -> SplitPolicy {
        match self.split.load(Ordering::Relaxed) {
            0 => SplitPolicy::Off,
            n => SplitPolicy::Above(n),
        }
    }

    /// Name of the read pipeline in use.
    pub fn read_pipeline(&self) -> &'static str {
        if self.params.flags.no_read_workqueue || self.params.flags.integrity.is_some() {
            "inline"
        } else {
            "queued"
        }
    }

    /// Name of the write pipeline in use.
    pub fn write_pipeline(&self) -> &'static str {
        let f = &self.params.flags;
        if f.no_write_workqueue || f.integrity.is_some() {
            "inline"
        } else if f.submit_from_crypt_cpus {
            "queued-submit-from-crypt"
        } else {
            "queued-sorted"
        }
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.len, offset, len)?;
        let ss = u64::from(self.params.flags.sector_size);
        if !offset.is_multiple_of(ss) || !len.is_multiple_of(ss) {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    /// `cipher` applied to a request starting at 512-byte `sector`.
    fn transform<'a>(cipher: &'a dyn SectorCipher, sector: u64, way: Way) -> SectorTransform<'a> {
        SectorTransform {
            cipher,
            sector,
            way,
        }
    }

    fn base(&self) -> u64 {
        self.params.offset_sectors * SECTOR_SIZE
    }

    fn read_inner(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let keyed = self.keyed.load();
        let k = keyed.as_deref().ok_or_else(|| errno(libc::ENOKEY))?;
        if let Some(a) = &k.aead {
            return self.read_aead(a.as_ref(), offset, buf);
        }
        match &k.engine {
            Some(engine) if !self.params.flags.no_read_workqueue => engine.read(offset, buf),
            _ => self
                .split_policy()
                .run(buf, offset / SECTOR_SIZE, |s, piece| {
                    let t = Self::transform(&*k.cipher, s, Way::Decrypt);
                    self.dev
                        .read_transformed(self.base() + s * SECTOR_SIZE, piece, &t)
                }),
        }
    }

    fn write_inner(&self, offset: u64, data: WriteData<'_>, flags: WriteFlags) -> io::Result<()> {
        let keyed = self.keyed.load();
        let k = keyed.as_deref().ok_or_else(|| errno(libc::ENOKEY))?;
        if let Some(a) = &k.aead {
            return self.write_aead(a.as_ref(), offset, data, flags);
        }
        if let Some(engine) = &k.engine {
            if !self.params.flags.no_write_workqueue {
                return match data {
                    WriteData::Borrowed(b) => engine.write(offset, b, flags),
                    WriteData::Scratch(b) => engine.write_scratch(offset, b, flags),
                };
            }
        }
        let sector = offset / SECTOR_SIZE;
        // Encrypts straight into the device where it can (see `transform`), piece by piece
        // across cores where the split policy says so.
        let encrypt_into_device = |s: u64, piece: &mut [u8]| {
            let t = Self::transform(&*k.cipher, s, Way::Encrypt);
            self.dev
                .write_transformed(self.base() + s * SECTOR_SIZE, piece, &t, flags)
        };
        match data {
            WriteData::Scratch(buf) => self.split_policy().run(buf, sector, encrypt_into_device),
            WriteData::Borrowed(buf) => WRITE_BUF.with(|cell| match cell.try_borrow_mut() {
                Ok(mut tl) => {
                    if tl.len() < buf.len() {
                        tl.resize(buf.len(), 0);
                    }
                    let out = &mut tl[..buf.len()];
                    out.copy_from_slice(buf);
                    self.split_policy().run(out, sector, encrypt_into_device)
                }
                Err(_) => {
                    // Re-entered through a stacked crypt target on this thread.
                    let mut out = buf.to_vec();
                    self.split_policy()
                        .run(&mut out, sector, encrypt_into_device)
                }
            }),
        }
    }

    fn account<T>(&self, result: io::Result<T>) -> io::Result<T> {
        if result.is_err() {
            self.stats.error();
        }
        result
    }
}

pub(crate) enum WriteData<'a> {
    Borrowed(&'a [u8]),
    Scratch(&'a mut [u8]),
}

/// Converts cipher failures to the errno a kernel bio would see.
pub(crate) fn cipher_io(e: CipherError) -> io::Error {
    match e {
        CipherError::Misaligned { .. } => errno(libc::EINVAL),
        _ => errno(libc::EIO),
    }
}

impl BlockDevice for CryptTarget {
    fn size(&self) -> u64 {
        self.len
    }
    fn logical_block_size(&self) -> u32 {
        self.params
            .flags
            .sector_size
            .max(self.dev.logical_block_size())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let r = self.read_inner(offset, buf);
        if r.is_ok() {
            self.stats.read(buf.len() as u64);
        }
        self.account(r)
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let r = self.write_inner(offset, WriteData::Borrowed(buf), flags);
        if r.is_ok() {
            self.stats.write(buf.len() as u64);
        }
        self.account(r)
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let n = buf.len() as u64;
        let r = self.write_inner(offset, WriteData::Scratch(buf), flags);
        if r.is_ok() {
            self.stats.write(n);
        }
        self.account(r)
    }
    fn flush(&self) -> io::Result<()> {
        // Writes are acknowledged only once submitted below, so nothing is buffered here.
        self.stats.flush();
        let r = self.dev.flush();
        self.account(r)
    }
    fn supports_discard(&self) -> bool {
        self.params.flags.allow_discards && self.dev.supports_discard()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        if !self.params.flags.allow_discards {
            return Err(errno(libc::EOPNOTSUPP));
        }
        self.stats.discard(len);
        let r = self.dev.discard(self.base() + offset, len);
        self.account(r)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        // Zeros must be stored encrypted, so this is a write of zero plaintext, never a
        // pass-through (which would leave recognisable zeros on the device).
        self.check(offset, len)?;
        let mut chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            chunk[..n].fill(0);
            self.write_at_scratch(offset + done, &mut chunk[..n], WriteFlags::default())?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Target for CryptTarget {
    fn target_type(&self) -> &'static str {
        CryptConfig::TYPE
    }
    fn table_params(&self, show_keys: bool) -> String {
        table_params_of(&self.config(), show_keys)
    }
    fn status_params(&self) -> String {
        let st = self.stats.snapshot();
        let integrity = match &self.params.flags.integrity {
            // Queued flags fall back to inline with integrity; say so.
            Some(i) => format!(
                " integrity={}:{} integrity_errors={}{}",
                i.tuple_size,
                i.kind.name(),
                st.integrity_errors,
                if self.params.flags.no_read_workqueue && self.params.flags.no_write_workqueue {
                    ""
                } else {
                    " queued_falls_back_to_inline"
                }
            ),
            None => String::new(),
        };
        format!(
            "reads={} writes={} read_bytes={} write_bytes={} discards={} flushes={} errors={} \
             read_pipeline={} write_pipeline={} cpu_split={} cipher_impl={}{integrity}",
            st.reads,
            st.writes,
            st.read_bytes,
            st.write_bytes,
            st.discards,
            st.flushes,
            st.errors,
            self.read_pipeline(),
            self.write_pipeline(),
            self.split_policy().describe(),
            self.cipher_impl
        )
    }
    fn message(&self, argv: &[&str]) -> Result<Option<String>, String> {
        match argv {
            ["key", rest @ ..] => self.key_message(rest).map(|()| None),
            _ => Err(format!(
                "unrecognised message '{}' (crypt accepts key wipe and key set <hex key>)",
                argv.first().copied().unwrap_or_default()
            )),
        }
    }
    fn postsuspend(&self) -> io::Result<()> {
        self.suspended.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn preresume(&self) -> io::Result<()> {
        if self.key_valid() {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::ENOKEY))
        }
    }
    fn resume(&self) {
        self.suspended.store(false, Ordering::SeqCst);
    }
    fn stats(&self) -> TargetStats {
        let st = self.stats.snapshot();
        TargetStats {
            target_type: "crypt",
            counters: vec![
                ("reads", st.reads),
                ("writes", st.writes),
                ("read_bytes", st.read_bytes),
                ("write_bytes", st.write_bytes),
                ("discards", st.discards),
                ("flushes", st.flushes),
                ("errors", st.errors),
                ("integrity_errors", st.integrity_errors),
            ],
            facts: vec![
                ("read_pipeline", self.read_pipeline().to_string()),
                ("write_pipeline", self.write_pipeline().to_string()),
                ("cpu_split", self.split_policy().describe()),
                ("cipher_impl", self.cipher_impl.clone()),
            ],
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
