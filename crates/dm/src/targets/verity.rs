//! `verity`: a read-only target that checks every data block against a hash tree whose root
//! hash is in the table, as the kernel's dm-verity does.
//!
//! Table (kernel `Documentation/admin-guide/device-mapper/verity.rst`):
//! `<version> <dev> <hash_dev> <data_block_size> <hash_block_size> <num_data_blocks>
//! <hash_start_block> <algorithm> <digest> <salt> [<#opt_params> <opt_params>...]`
//! with options `ignore_corruption`, `restart_on_corruption`, `panic_on_corruption`,
//! `restart_on_error`, `panic_on_error`, `ignore_zero_blocks`, `check_at_most_once`.
//!
//! Tree shape (same as the kernel's `verity_ctr`): `2^k` digests per hash block with
//! `k = floor(log2(hash_block_size / digest_size))`; level 0 holds the digests of the data
//! blocks and is last on the hash device, the single top-level block comes first at
//! `<hash_start_block>`. Version 1 hashes `salt || block` and pads each digest slot to
//! `hash_block_size >> k` bytes; version 0 hashes `block || salt` and packs digests.
//!
//! Hash blocks that passed verification are kept in fixed-size direct-mapped caches (one for
//! level 0, one for the few, hot upper levels), so a read looks up its level-0 block first and
//! climbs towards the root only on a miss, as the kernel does with its `hash_verified` buffer
//! flag; a multi-block read fetches each level-0 block once for all the data blocks it covers,
//! and nothing on the read path allocates. A mismatch is counted and, by default,
//! fails the read with `EIO`; `ignore_corruption` returns the data anyway;
//! `restart_on_corruption` / `panic_on_corruption` cannot reboot a userspace process, so
//! the target refuses every later request (`EIO`) instead, which is what a reader of a
//! restarted kernel device would see until the volume is reopened.

use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::verity::VerityGeometry;
use cryptblk_format::verity_fec::{FecLayout, ReedSolomon, FEC_RSM};
use zeroize::Zeroizing;

use super::config::{counted_tail, push_counted, table_params_of, TargetConfig};
use super::{arg_u32, arg_u64, BuildContext, Target};
use crate::device::{check_range, BlockDevice, CopyTransform, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;

/// Cache slots for level-0 hash blocks (with sha256 and 4 KiB blocks each covers 512 KiB of
/// data, so 8192 slots cover 4 GiB without evicting).
const LEVEL0_SLOTS: u64 = 8192;
/// Cache slots for the blocks of all upper levels together: 1/128 of level 0 or fewer, and
/// each is needed by many level-0 blocks, so they get their own slots that level-0 traffic
/// cannot evict.
const UPPER_SLOTS: u64 = 1024;
/// Largest digest of the supported algorithms (SHA-512, Whirlpool).
const MAX_DIGEST: usize = 64;
/// Stack space for the digests of one group of data blocks (those sharing a level-0 block).
const GROUP_DIGEST_BYTES: usize = 4096;
/// Marks an empty cache slot (no hash block has this index: the device would be 2^76 bytes).
const NO_BLOCK: u64 = u64::MAX;

/// What to do when a block fails verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CorruptionMode {
    /// Fail the read with `EIO` (the default).
    Eio,
    /// Log, count and return the data unverified (`ignore_corruption`).
    Ignore,
    /// `restart_on_corruption`: refuse all further I/O.
    Restart,
    /// `panic_on_corruption`: refuse all further I/O.
    Panic,
}

/// Parameters of a verity mapping, as in its table line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityConfig {
    /// Hash format version (0 or 1).
    pub version: u32,
    /// Data block size in bytes.
    pub data_block_size: u32,
    /// Hash block size in bytes.
    pub hash_block_size: u32,
    /// Data blocks covered by the tree.
    pub num_data_blocks: u64,
    /// First hash block of the tree on the hash device, in hash-block units.
    pub hash_start_block: u64,
    /// Digest algorithm.
    pub algorithm: HashAlgorithm,
    /// Root hash.
    pub root_digest: Vec<u8>,
    /// Salt (empty for `-`).
    pub salt: Vec<u8>,
    /// Reaction to corrupt blocks.
    pub mode: CorruptionMode,
    /// Reaction to I/O errors of the underlying devices: refuse further I/O when set.
    pub restart_on_error: bool,
    /// Blocks whose tree digest is that of an all-zero block read as zeros, unread.
    pub ignore_zero_blocks: bool,
    /// Verify each data block only the first time it is read.
    pub check_at_most_once: bool,
}

/// Where verification of a block failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Data(u64),
    Hash(u64),
}

/// The verity target.
pub struct VerityTarget {
    data: Arc<dyn BlockDevice>,
    hash: Arc<dyn BlockDevice>,
    data_spec: String,
    hash_spec: String,
    cfg: VerityConfig,
    len: u64,
    digest_size: usize,
    digest_stride: usize,
    bits: u32,
    /// First hash block of each level (absolute, hash-block units), level 0 first.
    level_start: Vec<u64>,
    /// Digest of an all-zero data block (first `digest_size` bytes).
    zero_digest: [u8; MAX_DIGEST],
    /// Verified level-0 hash blocks.
    level0_cache: BlockCache,
    /// Verified hash blocks of levels 1 and up.
    upper_cache: BlockCache,
    /// One bit per data block for `check_at_most_once`.
    verified: Vec<AtomicU64>,
    corrupted: AtomicU64,
    failed: AtomicBool,
    /// Reed-Solomon correction of blocks that fail their digest, as dm-verity-fec.
    fec: Option<Fec>,
}

/// The FEC state of a mapping.
struct Fec {
    device: Arc<dyn BlockDevice>,
    spec: VerityFecConfig,
    layout: FecLayout,
    rs: ReedSolomon,
    /// Blocks corrected so far (the kernel's status counter).
    corrected: AtomicU64,
}

/// The kernel's block-size limits, as the format code checks them.
fn check_block_size(what: &str, v: u32) -> Result<(), String> {
    cryptblk_format::verity::check_block_size(what, v).map_err(format_msg)
}

/// The message of a format-crate error, without its category prefix.
fn format_msg(e: cryptblk_format::FormatError) -> String {
    match e {
        cryptblk_format::FormatError::InvalidParameter(m) => m,
        other => other.to_string(),
    }
}

impl VerityConfig {
    /// Parses the table arguments; returns the configuration and the two device names.
    pub fn parse(args: &[String]) -> Result<(Self, String, String), String> {
        let t = VerityTableConfig::parse(args)?;
        Ok((t.config, t.data_device, t.hash_device))
    }
}

/// `verity <version> <dev> <hash_dev> <data_block_size> <hash_block_size> <num_data_blocks>
/// <hash_start_block> <algorithm> <digest> <salt> [<#opt_params> <opt_params>...]`: the
/// devices and the [`VerityConfig`]. `try_verify_in_tasklet` is accepted and not kept, and
/// `panic_on_error` is kept as `restart_on_error` (both only refuse further I/O here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityTableConfig {
    /// The data device as named in the table.
    pub data_device: String,
    /// The hash device as named in the table.
    pub hash_device: String,
    /// Tree geometry, digests and options.
    pub config: VerityConfig,
    /// Forward error correction (`use_fec_from_device` ...), if configured.
    pub fec: Option<VerityFecConfig>,
}

/// The FEC options of a verity table line: `use_fec_from_device <dev> fec_blocks <n>
/// fec_start <block> fec_roots <roots>` (kernel `verity.rst`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityFecConfig {
    /// The FEC device as named in the table.
    pub device: String,
    /// Blocks the parity covers: the data blocks, then the hash area from the tree start.
    pub blocks: u64,
    /// First parity block on the FEC device, in data blocks.
    pub start: u64,
    /// Parity bytes per 255-byte Reed-Solomon codeword.
    pub roots: u32,
}

impl VerityTableConfig {
    /// The line that maps `data_device` through the tree on `hash_device` that
    /// `cryptblk_format::verity::format` made with `params`, under `root_digest`, with no
    /// optional arguments (veritysetup's `open`).
    pub fn from_format(
        params: &cryptblk_format::verity::VerityParams,
        data_device: &str,
        hash_device: &str,
        root_digest: &[u8],
    ) -> Result<Self, String> {
        let g = params.geometry().map_err(|e| e.to_string())?;
        Ok(VerityTableConfig {
            data_device: data_device.to_string(),
            hash_device: hash_device.to_string(),
            config: VerityConfig {
                version: params.hash_type,
                data_block_size: params.data_block_size,
                hash_block_size: params.hash_block_size,
                num_data_blocks: params.data_blocks,
                hash_start_block: g.hash_start_block,
                algorithm: params.algorithm,
                root_digest: root_digest.to_vec(),
                salt: params.salt.clone(),
                mode: CorruptionMode::Eio,
                restart_on_error: false,
                ignore_zero_blocks: false,
                check_at_most_once: false,
            },
            fec: None,
        })
    }
}

impl TargetConfig for VerityTableConfig {
    const TYPE: &'static str = "verity";
    fn parse(args: &[String]) -> Result<Self, String> {
        const USAGE: &str = "verity <version> <dev> <hash_dev> <data_block_size> \
            <hash_block_size> <num_data_blocks> <hash_start_block> <algorithm> <digest> \
            <salt> [<#opt_params> <opt_params>...]";
        if args.len() < 10 {
            return Err(format!(
                "too few arguments ({}); usage: {USAGE}",
                args.len()
            ));
        }
        let version = arg_u32(args, 0, "version")?;
        if version > 1 {
            return Err(format!("invalid version {version}"));
        }
        let data_block_size = arg_u32(args, 3, "data_block_size")?;
        check_block_size("data", data_block_size)?;
        let hash_block_size = arg_u32(args, 4, "hash_block_size")?;
        check_block_size("hash", hash_block_size)?;
        let num_data_blocks = arg_u64(args, 5, "num_data_blocks")?;
        let hash_start_block = arg_u64(args, 6, "hash_start_block")?;
        let algorithm = HashAlgorithm::from_name(&args[7])
            .map_err(|_| format!("cannot initialize hash function '{}'", args[7]))?;
        let root_digest =
            hex::decode(&args[8]).map_err(|_| format!("invalid root digest '{}'", args[8]))?;
        if root_digest.len() != algorithm.output_len() {
            return Err(format!(
                "invalid root digest length {} for {}",
                root_digest.len(),
                algorithm.name()
            ));
        }
        let salt = if args[9] == "-" {
            Vec::new()
        } else {
            hex::decode(&args[9]).map_err(|_| format!("invalid salt '{}'", args[9]))?
        };
        let mut cfg = VerityConfig {
            version,
            data_block_size,
            hash_block_size,
            num_data_blocks,
            hash_start_block,
            algorithm,
            root_digest,
            salt,
            mode: CorruptionMode::Eio,
            restart_on_error: false,
            ignore_zero_blocks: false,
            check_at_most_once: false,
        };
        let mut fec_dev: Option<String> = None;
        let (mut fec_blocks, mut fec_start, mut fec_roots) = (None, None, None);
        {
            let mut opts = counted_tail(args, 10, "opt_params", "optional arguments")?.iter();
            while let Some(opt) = opts.next() {
                let mut value = |name: &str| {
                    opts.next()
                        .cloned()
                        .ok_or_else(|| format!("optional argument '{name}' needs a value"))
                };
                let number = |v: String, name: &str| {
                    v.parse::<u64>()
                        .map_err(|_| format!("invalid {name} '{v}'"))
                };
                match opt.as_str() {
                    "use_fec_from_device" => fec_dev = Some(value(opt.as_str())?),
                    "fec_blocks" => fec_blocks = Some(number(value(opt.as_str())?, opt)?),
                    "fec_start" => fec_start = Some(number(value(opt.as_str())?, opt)?),
                    "fec_roots" => fec_roots = Some(number(value(opt.as_str())?, opt)?),
                    "ignore_corruption" => cfg.mode = CorruptionMode::Ignore,
                    "restart_on_corruption" => cfg.mode = CorruptionMode::Restart,
                    "panic_on_corruption" => cfg.mode = CorruptionMode::Panic,
                    "restart_on_error" | "panic_on_error" => cfg.restart_on_error = true,
                    "ignore_zero_blocks" => cfg.ignore_zero_blocks = true,
                    "check_at_most_once" => cfg.check_at_most_once = true,
                    // Scheduling hint only; verification is synchronous here anyway.
                    "try_verify_in_tasklet" => {}
                    "root_hash_sig_key_desc" => {
                        return Err(format!("optional argument '{opt}' is not supported"))
                    }
                    other => return Err(format!("unrecognized verity feature request '{other}'")),
                }
            }
        }
        let fec = match (fec_dev, fec_blocks, fec_start, fec_roots) {
            (None, None, None, None) => None,
            (Some(device), Some(blocks), Some(start), Some(roots)) => {
                let roots = u32::try_from(roots).unwrap_or(u32::MAX);
                cryptblk_format::verity_fec::check_roots(roots).map_err(format_msg)?;
                if data_block_size != hash_block_size {
                    return Err("Block sizes must match to use FEC".into());
                }
                if blocks < num_data_blocks {
                    return Err(format!("invalid fec_blocks {blocks}"));
                }
                Some(VerityFecConfig {
                    device,
                    blocks,
                    start,
                    roots,
                })
            }
            _ => {
                return Err(
                    "FEC needs use_fec_from_device, fec_blocks, fec_start and fec_roots".into(),
                )
            }
        };
        Ok(VerityTableConfig {
            data_device: args[1].clone(),
            hash_device: args[2].clone(),
            config: cfg,
            fec,
        })
    }

    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        let c = &self.config;
        let mut out = vec![
            c.version.to_string(),
            self.data_device.clone(),
            self.hash_device.clone(),
            c.data_block_size.to_string(),
            c.hash_block_size.to_string(),
            c.num_data_blocks.to_string(),
            c.hash_start_block.to_string(),
            c.algorithm.name().to_string(),
            hex::encode(&c.root_digest),
            if c.salt.is_empty() {
                "-".to_string()
            } else {
                hex::encode(&c.salt)
            },
        ];
        let mut opts: Vec<String> = Vec::new();
        match c.mode {
            CorruptionMode::Eio => {}
            CorruptionMode::Ignore => opts.push("ignore_corruption".into()),
            CorruptionMode::Restart => opts.push("restart_on_corruption".into()),
            CorruptionMode::Panic => opts.push("panic_on_corruption".into()),
        }
        for (on, name) in [
            (c.restart_on_error, "restart_on_error"),
            (c.ignore_zero_blocks, "ignore_zero_blocks"),
            (c.check_at_most_once, "check_at_most_once"),
        ] {
            if on {
                opts.push(name.into());
            }
        }
        if let Some(f) = &self.fec {
            opts.extend([
                "use_fec_from_device".to_string(),
                f.device.clone(),
                "fec_blocks".into(),
                f.blocks.to_string(),
                "fec_start".into(),
                f.start.to_string(),
                "fec_roots".into(),
                f.roots.to_string(),
            ]);
        }
        push_counted(&mut out, opts);
        Zeroizing::new(out)
    }
    fn devices(&self) -> Vec<&str> {
        let mut d = vec![self.data_device.as_str(), self.hash_device.as_str()];
        if let Some(f) = &self.fec {
            d.push(f.device.as_str());
        }
        d
    }
}

impl VerityTarget {
    /// Builds a verity target of `len` bytes over already opened devices.
    pub fn new(
        data: Arc<dyn BlockDevice>,
        data_spec: &str,
        hash: Arc<dyn BlockDevice>,
        hash_spec: &str,
        cfg: VerityConfig,
        len: u64,
    ) -> Result<Self, String> {
        check_block_size("data", cfg.data_block_size)?;
        check_block_size("hash", cfg.hash_block_size)?;
        if cfg.num_data_blocks == 0 {
            return Err("no data blocks".into());
        }
        let data_bytes = cfg
            .num_data_blocks
            .checked_mul(cfg.data_block_size as u64)
            .ok_or("num_data_blocks overflows")?;
        if len > data_bytes || !len.is_multiple_of(cfg.data_block_size as u64) {
            return Err(format!(
                "target length {len} does not fit {} data blocks of {} bytes",
                cfg.num_data_blocks, cfg.data_block_size
            ));
        }
        if data.size() < len {
            return Err(format!("data device {data_spec} is too small"));
        }
        let digest_size = cfg.algorithm.output_len();
        let geometry = VerityGeometry::new(
            digest_size,
            cfg.version,
            cfg.hash_block_size,
            cfg.num_data_blocks,
            cfg.hash_start_block,
        )
        .map_err(format_msg)?;
        let (digest_stride, bits) = (geometry.digest_stride, geometry.hash_per_block_bits);
        let level_start = geometry.level_start;
        let position = cfg
            .hash_start_block
            .checked_add(geometry.level_blocks.iter().sum())
            .ok_or("hash area overflows")?;
        let hash_end = position
            .checked_mul(cfg.hash_block_size as u64)
            .ok_or("hash area overflows")?;
        if hash.size() < hash_end {
            return Err(format!(
                "hash device {hash_spec} is too small: the tree needs {hash_end} bytes"
            ));
        }
        let mut zero_digest = [0u8; MAX_DIGEST];
        digest_with_salt(
            &cfg,
            &vec![0u8; cfg.data_block_size as usize],
            &mut zero_digest,
        );
        // Level 0 is last on the device; the upper levels fill the space before it.
        let (level0_cache, upper_cache) = match level_start.first() {
            Some(&l0) => (
                BlockCache::new(l0, position - l0, LEVEL0_SLOTS),
                BlockCache::new(cfg.hash_start_block, l0 - cfg.hash_start_block, UPPER_SLOTS),
            ),
            None => (
                BlockCache::new(0, 0, LEVEL0_SLOTS),
                BlockCache::new(0, 0, UPPER_SLOTS),
            ),
        };
        let verified = if cfg.check_at_most_once {
            (0..cfg.num_data_blocks.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect()
        } else {
            Vec::new()
        };
        Ok(VerityTarget {
            data,
            hash,
            data_spec: data_spec.to_string(),
            hash_spec: hash_spec.to_string(),
            cfg,
            len,
            digest_size,
            digest_stride,
            bits,
            level_start,
            zero_digest,
            level0_cache,
            upper_cache,
            verified,
            corrupted: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            fec: None,
        })
    }

    /// Adds FEC: blocks that fail their digest are decoded from the parity on `device` and
    /// served when the corrected block matches (the kernel's `use_fec_from_device`).
    pub fn with_fec(
        mut self,
        device: Arc<dyn BlockDevice>,
        spec: &VerityFecConfig,
    ) -> Result<Self, String> {
        let bs = u64::from(self.cfg.data_block_size);
        if self.cfg.data_block_size != self.cfg.hash_block_size {
            return Err("Block sizes must match to use FEC".into());
        }
        let hash_blocks = VerityGeometry::new(
            self.digest_size,
            self.cfg.version,
            self.cfg.hash_block_size,
            self.cfg.num_data_blocks,
            self.cfg.hash_start_block,
        )
        .map_err(format_msg)?
        .hash_blocks();
        if spec.blocks < self.cfg.num_data_blocks + hash_blocks {
            return Err(format!("invalid fec_blocks {}", spec.blocks));
        }
        let layout = FecLayout {
            block_size: self.cfg.data_block_size,
            roots: spec.roots,
            data_blocks: self.cfg.num_data_blocks,
            hash_start: self.cfg.hash_start_block * bs,
            blocks: spec.blocks,
            fec_offset: spec.start * bs,
        };
        let end = layout.fec_offset + layout.parity_bytes();
        if device.size() < end {
            return Err(format!(
                "FEC device {} is too small: the parity needs {end} bytes",
                spec.device
            ));
        }
        self.fec = Some(Fec {
            device,
            spec: spec.clone(),
            layout,
            rs: ReedSolomon::new(spec.roots).map_err(format_msg)?,
            corrected: AtomicU64::new(0),
        });
        Ok(self)
    }

    /// Decodes covered block `k` (data blocks first, then the hash area) from the FEC
    /// parity into `out`; false when there is no FEC or a codeword cannot be corrected.
    fn fec_decode(&self, k: u64, out: &mut [u8]) -> bool {
        let Some(f) = &self.fec else {
            return false;
        };
        let bs = self.cfg.data_block_size as usize;
        let roots = f.spec.roots as usize;
        let rounds = f.layout.rounds();
        let (n, pos) = (k % rounds, (k / rounds) as usize);
        let rsn = f.rs.rsn();
        let mut buf = vec![0u8; rsn * bs];
        for (i, block) in buf.chunks_exact_mut(bs).enumerate() {
            let r = match f.layout.locate(i as u64 * rounds + n) {
                None => Ok(()),
                Some((true, off)) => self.data.read_at(off, block),
                Some((false, off)) => self.hash.read_at(off, block),
            };
            if r.is_err() {
                return false;
            }
        }
        let mut parity = vec![0u8; bs * roots];
        if f.device
            .read_at(f.layout.fec_offset + n * parity.len() as u64, &mut parity)
            .is_err()
        {
            return false;
        }
        let mut cw = [0u8; FEC_RSM as usize];
        for (b, o) in out.iter_mut().enumerate().take(bs) {
            for (i, c) in cw[..rsn].iter_mut().enumerate() {
                *c = buf[i * bs + b];
            }
            cw[rsn..].copy_from_slice(&parity[b * roots..(b + 1) * roots]);
            if f.rs.decode(&mut cw).is_none() {
                return false;
            }
            *o = cw[pos];
        }
        true
    }

    /// Corrects covered block `k` with FEC into `out` when the result has digest `want`.
    fn fec_correct(&self, k: u64, want: &[u8], out: &mut [u8]) -> bool {
        if !self.fec_decode(k, out) {
            return false;
        }
        let mut got = [0u8; MAX_DIGEST];
        digest_with_salt(&self.cfg, out, &mut got);
        if got[..self.digest_size] != want[..self.digest_size] {
            return false;
        }
        if let Some(f) = &self.fec {
            f.corrected.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Blocks FEC corrected so far (None without FEC).
    pub fn fec_corrected(&self) -> Option<u64> {
        self.fec
            .as_ref()
            .map(|f| f.corrected.load(Ordering::Relaxed))
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        Self::from_config(ctx, &VerityTableConfig::parse(args)?)
    }

    /// Builds the target of a table line from its configuration, opening its devices.
    pub(crate) fn from_config(
        ctx: &BuildContext<'_>,
        t: &VerityTableConfig,
    ) -> Result<Self, String> {
        let data = ctx.open_device(&t.data_device, 0)?;
        let hash = ctx
            .resolver
            .open_device(&t.hash_device)
            .map_err(|e| e.to_string())?;
        let target = Self::new(
            data,
            &t.data_device,
            hash,
            &t.hash_device,
            t.config.clone(),
            ctx.len_bytes(),
        )?;
        match &t.fec {
            None => Ok(target),
            Some(f) => {
                let dev = ctx
                    .resolver
                    .open_device(&f.device)
                    .map_err(|e| e.to_string())?;
                target.with_fec(dev, f)
            }
        }
    }

    /// The table arguments of this target.
    pub fn table_config(&self) -> VerityTableConfig {
        VerityTableConfig {
            data_device: self.data_spec.clone(),
            hash_device: self.hash_spec.clone(),
            config: self.cfg.clone(),
            fec: self.fec.as_ref().map(|f| f.spec.clone()),
        }
    }

    /// The mapping's configuration.
    pub fn config(&self) -> &VerityConfig {
        &self.cfg
    }

    /// Number of blocks (data or hash) that failed verification so far.
    pub fn corrupted_blocks(&self) -> u64 {
        self.corrupted.load(Ordering::Relaxed)
    }

    /// True once `restart_on_corruption`/`panic_on_corruption`/`restart_on_error` fired.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Number of hash-tree levels.
    pub fn levels(&self) -> usize {
        self.level_start.len()
    }

    /// Rebuilds the caches with at most `level0` and `upper` slots, so tests can force
    /// evictions and parents that share a slot with their children.
    #[cfg(test)]
    fn with_cache_slots(mut self, level0: u64, upper: u64) -> Self {
        if let Some(&l0) = self.level_start.first() {
            let l0_blocks = self.cfg.num_data_blocks.div_ceil(1 << self.bits);
            self.level0_cache = BlockCache::new(l0, l0_blocks, level0);
            let upper_blocks = l0 - self.cfg.hash_start_block;
            self.upper_cache = BlockCache::new(self.cfg.hash_start_block, upper_blocks, upper);
        }
        self
    }

    /// Copies digests `pos..pos + count` of hash block `n` of level `lvl` (stride apart, as
    /// they are in the block: `(count - 1) * digest_stride + digest_size` bytes) into `out`.
    /// The block is taken from the cache or read and checked against its parent's digest,
    /// which is found the same way, so a miss climbs only as far as the first cached level.
    fn hash_digests(
        &self,
        lvl: usize,
        n: u64,
        pos: usize,
        count: usize,
        out: &mut [u8],
    ) -> io::Result<Result<(), Failure>> {
        let block = self.level_start[lvl] + n;
        let cache = if lvl == 0 {
            &self.level0_cache
        } else {
            &self.upper_cache
        };
        let at = pos * self.digest_stride;
        let len = (count - 1) * self.digest_stride + self.digest_size;
        {
            let slot = cache.read(block);
            if slot.block == block {
                out[..len].copy_from_slice(&slot.data[at..at + len]);
                return Ok(Ok(()));
            }
        }
        // Miss: the digest this block must have. No lock is held while climbing, so a parent
        // that shares this block's slot cannot deadlock.
        let mut want = [0u8; MAX_DIGEST];
        if lvl + 1 == self.level_start.len() {
            want[..self.digest_size].copy_from_slice(&self.cfg.root_digest);
        } else {
            let mask = (1u64 << self.bits) - 1;
            let parent_pos = (n & mask) as usize;
            if let Err(f) = self.hash_digests(lvl + 1, n >> self.bits, parent_pos, 1, &mut want)? {
                return Ok(Err(f));
            }
        }
        let mut slot = cache.write(block);
        // Another reader may have filled it while this one climbed.
        if slot.block != block {
            slot.block = NO_BLOCK;
            let hbs = self.cfg.hash_block_size as usize;
            if slot.data.len() != hbs {
                // Once per slot; later misses reuse the buffer.
                slot.data = vec![0u8; hbs].into_boxed_slice();
            }
            self.io(self.hash.read_at(block * hbs as u64, &mut slot.data))?;
            let mut got = [0u8; MAX_DIGEST];
            digest_with_salt(&self.cfg, &slot.data, &mut got);
            if got[..self.digest_size] != want[..self.digest_size] {
                let k = self.cfg.num_data_blocks + block - self.cfg.hash_start_block;
                if !self.fec_correct(k, &want, &mut slot.data) {
                    return Ok(Err(Failure::Hash(block)));
                }
            }
            slot.block = block;
        }
        out[..len].copy_from_slice(&slot.data[at..at + len]);
        Ok(Ok(()))
    }

    fn is_verified(&self, idx: u64) -> bool {
        self.verified[(idx / 64) as usize].load(Ordering::Relaxed) & (1 << (idx % 64)) != 0
    }

    /// Verifies the data blocks `first..` of `blocks` (whole blocks) and leaves what a reader
    /// gets in their destination, one group of blocks sharing a level-0 hash block at a time.
    fn verify_range(&self, first: u64, mut blocks: Blocks<'_>) -> io::Result<()> {
        let bs = self.cfg.data_block_size as usize;
        let total = blocks.len() / bs;
        let per_hash_block = 1usize << self.bits;
        // A group's digests must fit the stack buffer.
        let max_group = (GROUP_DIGEST_BYTES / self.digest_stride).min(per_hash_block);
        let mut digests = [0u8; GROUP_DIGEST_BYTES];
        let mut i = 0;
        while i < total {
            let idx = first + i as u64;
            let pos = (idx & (per_hash_block as u64 - 1)) as usize;
            let count = (total - i).min(per_hash_block - pos).min(max_group);
            self.verify_group(idx, blocks.range(i * bs, count * bs), &mut digests)?;
            i += count;
        }
        Ok(())
    }

    /// [`Self::verify_range`] for blocks that share one level-0 hash block: that block is
    /// looked up once for all of them. `digests` is scratch space for their expected digests.
    fn verify_group(
        &self,
        first: u64,
        mut blocks: Blocks<'_>,
        digests: &mut [u8],
    ) -> io::Result<()> {
        let bs = self.cfg.data_block_size as usize;
        let count = blocks.len() / bs;
        let once = self.cfg.check_at_most_once;
        if once && (first..first + count as u64).all(|idx| self.is_verified(idx)) {
            blocks.deliver_all();
            return Ok(());
        }
        let fetched = if self.level_start.is_empty() {
            // A single data block hashes straight into the root.
            digests[..self.digest_size].copy_from_slice(&self.cfg.root_digest);
            Ok(())
        } else {
            let pos = (first & ((1u64 << self.bits) - 1)) as usize;
            self.hash_digests(0, first >> self.bits, pos, count, digests)?
        };
        let ds = self.digest_size;
        for k in 0..count {
            let idx = first + k as u64;
            let at = k * bs;
            let mut zero = false;
            if !(once && self.is_verified(idx)) {
                let src = &blocks.source()[at..at + bs];
                let result = fetched.and_then(|()| {
                    let want = &digests[k * self.digest_stride..][..ds];
                    if self.cfg.ignore_zero_blocks && want == &self.zero_digest[..ds] {
                        zero = true;
                        return Ok(());
                    }
                    let mut got = [0u8; MAX_DIGEST];
                    digest_with_salt(&self.cfg, src, &mut got);
                    if &got[..ds] == want {
                        Ok(())
                    } else {
                        Err(Failure::Data(idx))
                    }
                });
                match result {
                    Ok(()) => {
                        if once {
                            self.verified[(idx / 64) as usize]
                                .fetch_or(1 << (idx % 64), Ordering::Relaxed);
                        }
                    }
                    Err(Failure::Data(_)) if self.fec.is_some() && fetched.is_ok() => {
                        let mut fixed = vec![0u8; bs];
                        let want = &digests[k * self.digest_stride..][..ds];
                        if self.fec_correct(idx, want, &mut fixed) {
                            blocks.put(at, &fixed);
                            continue;
                        }
                        self.corruption(Failure::Data(idx))?
                    }
                    // Returns for EIO; ignore_corruption delivers the block unverified.
                    Err(f) => self.corruption(f)?,
                }
            }
            blocks.deliver(at, bs, zero);
        }
        Ok(())
    }

    fn corruption(&self, f: Failure) -> io::Result<()> {
        self.corrupted.fetch_add(1, Ordering::Relaxed);
        let (kind, block) = match f {
            Failure::Data(b) => ("data", b),
            Failure::Hash(b) => ("metadata", b),
        };
        eprintln!(
            "device-mapper: verity: {}: {kind} block {block} is corrupted",
            self.data_spec
        );
        match self.cfg.mode {
            CorruptionMode::Ignore => Ok(()),
            CorruptionMode::Eio => Err(errno(libc::EIO)),
            CorruptionMode::Restart | CorruptionMode::Panic => {
                self.failed.store(true, Ordering::SeqCst);
                Err(errno(libc::EIO))
            }
        }
    }

    /// Passes an I/O result through, latching the failed state for `restart_on_error`.
    fn io<T>(&self, r: io::Result<T>) -> io::Result<T> {
        if r.is_err() && self.cfg.restart_on_error {
            self.failed.store(true, Ordering::SeqCst);
        }
        r
    }
}

/// Granularity of the pieces [`BlockDevice::read_transformed`] hands to a transform.
const TRANSFORM_PIECE: u64 = 4096;

/// Data blocks being verified and where they go: checked in the caller's buffer, or checked
/// in the device's memory and copied to the caller's buffer.
enum Blocks<'a> {
    InPlace(&'a mut [u8]),
    Copy { src: &'a [u8], dst: &'a mut [u8] },
}

impl Blocks<'_> {
    fn len(&self) -> usize {
        match self {
            Blocks::InPlace(b) => b.len(),
            Blocks::Copy { src, .. } => src.len(),
        }
    }

    fn range(&mut self, at: usize, len: usize) -> Blocks<'_> {
        match self {
            Blocks::InPlace(b) => Blocks::InPlace(&mut b[at..at + len]),
            Blocks::Copy { src, dst } => Blocks::Copy {
                src: &src[at..at + len],
                dst: &mut dst[at..at + len],
            },
        }
    }

    /// The bytes to hash.
    fn source(&self) -> &[u8] {
        match self {
            Blocks::InPlace(b) => b,
            Blocks::Copy { src, .. } => src,
        }
    }

    /// Puts the block at `at` in its destination, as zeros if `zero`.
    fn deliver(&mut self, at: usize, len: usize, zero: bool) {
        match self {
            Blocks::InPlace(b) if zero => b[at..at + len].fill(0),
            Blocks::InPlace(_) => {}
            Blocks::Copy { dst, .. } if zero => dst[at..at + len].fill(0),
            Blocks::Copy { src, dst } => dst[at..at + len].copy_from_slice(&src[at..at + len]),
        }
    }

    /// Puts `block` (a corrected copy) at `at` in the destination.
    fn put(&mut self, at: usize, block: &[u8]) {
        match self {
            Blocks::InPlace(b) => b[at..at + block.len()].copy_from_slice(block),
            Blocks::Copy { dst, .. } => dst[at..at + block.len()].copy_from_slice(block),
        }
    }

    fn deliver_all(&mut self) {
        if let Blocks::Copy { src, dst } = self {
            dst.copy_from_slice(src);
        }
    }
}

/// Verifies a request's blocks inside [`BlockDevice::read_transformed`] of the data device.
struct VerifyTransform<'a> {
    target: &'a VerityTarget,
    /// Data block at the start of the request.
    first: u64,
    /// Set when an error comes from verification rather than from reading the data device.
    failed: AtomicBool,
}

impl VerifyTransform<'_> {
    fn run(&self, pos: usize, blocks: Blocks<'_>) -> io::Result<()> {
        let bs = self.target.cfg.data_block_size as usize;
        let r = if !pos.is_multiple_of(bs) || !blocks.len().is_multiple_of(bs) {
            // A device that broke read_transformed's promise of whole 4 KiB pieces.
            Err(io::Error::other(format!(
                "verity: data device handed over a piece at {pos}+{} not aligned to {bs}-byte blocks",
                blocks.len()
            )))
        } else {
            self.target
                .verify_range(self.first + (pos / bs) as u64, blocks)
        };
        if r.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl CopyTransform for VerifyTransform<'_> {
    fn in_place(&self, pos: usize, buf: &mut [u8]) -> io::Result<()> {
        self.run(pos, Blocks::InPlace(buf))
    }

    fn copy(&self, pos: usize, src: &[u8], dst: &mut [u8]) -> io::Result<()> {
        self.run(pos, Blocks::Copy { src, dst })
    }
}

/// Hashes `block` with the volume's salt rule into the front of `out`.
fn digest_with_salt(cfg: &VerityConfig, block: &[u8], out: &mut [u8; MAX_DIGEST]) {
    if cfg.version == 0 {
        cfg.algorithm.digest_into(&[block, &cfg.salt], out);
    } else {
        cfg.algorithm.digest_into(&[&cfg.salt, block], out);
    }
}

/// Verified hash blocks of the contiguous range `first..first + count` of the hash device,
/// direct-mapped: block `first + i` can only live in slot `i % slots`, so a lookup is an
/// index computation and one uncontended read lock, a miss evicts one block rather than
/// the whole cache, and a range no larger than the cache never evicts at all.
struct BlockCache {
    first: u64,
    mask: u64,
    slots: Box<[CacheSlot]>,
}

/// One cache slot, alone on its cache line so that readers of neighbouring slots on
/// different cores do not bounce each other's lock words.
#[repr(align(64))]
struct CacheSlot(RwLock<SlotData>);

struct SlotData {
    /// Absolute index of the verified hash block held, or [`NO_BLOCK`].
    block: u64,
    /// The block's bytes; empty until the slot is first filled.
    data: Box<[u8]>,
}

impl BlockCache {
    fn new(first: u64, count: u64, max_slots: u64) -> Self {
        let slots = count.clamp(1, max_slots).next_power_of_two();
        BlockCache {
            first,
            mask: slots - 1,
            slots: (0..slots)
                .map(|_| {
                    CacheSlot(RwLock::new(SlotData {
                        block: NO_BLOCK,
                        data: Box::default(),
                    }))
                })
                .collect(),
        }
    }

    fn slot(&self, block: u64) -> &RwLock<SlotData> {
        &self.slots[(block.wrapping_sub(self.first) & self.mask) as usize].0
    }

    // A poisoned lock only means a reader panicked; a slot is marked empty while it is being
    // refilled, so its contents are never half-verified.
    fn read(&self, block: u64) -> RwLockReadGuard<'_, SlotData> {
        self.slot(block).read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self, block: u64) -> RwLockWriteGuard<'_, SlotData> {
        self.slot(block).write().unwrap_or_else(|e| e.into_inner())
    }
}

impl BlockDevice for VerityTarget {
    fn size(&self) -> u64 {
        self.len
    }

    fn logical_block_size(&self) -> u32 {
        self.cfg.data_block_size.max(SECTOR_SIZE as u32)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(self.len, offset, buf.len() as u64)?;
        let bs = self.cfg.data_block_size as u64;
        if !offset.is_multiple_of(bs) || !(buf.len() as u64).is_multiple_of(bs) {
            return Err(errno(libc::EINVAL));
        }
        if self.is_failed() {
            return Err(errno(libc::EIO));
        }
        let first = offset / bs;
        let blocks = buf.len() as u64 / bs;
        if self.cfg.check_at_most_once && (first..first + blocks).all(|i| self.is_verified(i)) {
            // Nothing left to check: a plain read.
            return self.io(self.data.read_at(offset, buf));
        }
        if bs > TRANSFORM_PIECE {
            // Pieces of a transformed read could split a data block.
            self.io(self.data.read_at(offset, buf))?;
            return self.verify_range(first, Blocks::InPlace(buf));
        }
        // Verify as the device hands the data over: a RAM disk lets each block be hashed
        // straight from its memory and then copied while still in the CPU cache, so the
        // copy's memory latency hides behind the hashing.
        let verify = VerifyTransform {
            target: self,
            first,
            failed: AtomicBool::new(false),
        };
        match self.data.read_transformed(offset, buf, &verify) {
            Ok(()) => Ok(()),
            // Verification errors have had their corruption handling already.
            Err(e) if verify.failed.load(Ordering::Relaxed) => Err(e),
            Err(e) => self.io(Err(e)),
        }
    }

    fn write_at(&self, _offset: u64, _buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        Err(errno(libc::EROFS))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn supports_discard(&self) -> bool {
        false
    }

    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(errno(libc::EROFS))
    }

    fn write_zeroes(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Err(errno(libc::EROFS))
    }
}

impl Target for VerityTarget {
    fn target_type(&self) -> &'static str {
        VerityTableConfig::TYPE
    }

    fn table_params(&self, show_keys: bool) -> String {
        table_params_of(&self.table_config(), show_keys)
    }

    /// `V` (verified so far) or `C` (corruption detected), as the kernel reports.
    fn status_params(&self) -> String {
        let state = if self.corrupted_blocks() > 0 {
            "C"
        } else {
            "V"
        };
        match self.fec_corrected() {
            // With FEC the kernel adds the count of corrected blocks.
            Some(n) => format!("{state} {n}"),
            None => state.into(),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    //! The RAM-disk path (blocks hashed in the disk's memory, then copied) and caches small
    //! enough to evict and to put parents in their children's slots, against trees built by
    //! the real `veritysetup`. The file-backed path with default caches is covered by
    //! `tests/verity_target.rs`.

    use super::*;
    use crate::backing::{FileBacking, FileOptions, RamDisk};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn tool_available() -> bool {
        match Command::new("veritysetup").arg("--version").output() {
            Ok(o) if o.status.success() => true,
            _ if std::env::var("CRYPTBLK_SKIP_VERITYSETUP").as_deref() == Ok("1") => {
                eprintln!("veritysetup missing: skipped because CRYPTBLK_SKIP_VERITYSETUP=1");
                false
            }
            _ => panic!("veritysetup not found (set CRYPTBLK_SKIP_VERITYSETUP=1 to skip)"),
        }
    }

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir()
                .join(format!("cryptblk-verity-unit-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn pattern(len: usize, mut seed: u64) -> Vec<u8> {
        seed |= 1;
        let mut v: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|_| next(&mut seed).to_le_bytes())
            .collect();
        v.truncate(len);
        v
    }

    /// A tree made by veritysetup over `contents`: the data and hash files and the table's
    /// configuration.
    struct Volume {
        data: PathBuf,
        hash: PathBuf,
        contents: Vec<u8>,
        cfg: VerityConfig,
    }

    fn format(
        dir: &TempDir,
        name: &str,
        contents: Vec<u8>,
        v: (u32, u32, u32, &str, &str),
    ) -> Volume {
        let (version, data_bs, hash_bs, algorithm, salt) = v;
        let data = dir.0.join(format!("{name}.data"));
        let hash = dir.0.join(format!("{name}.hash"));
        std::fs::write(&data, &contents).unwrap();
        let out = Command::new("veritysetup")
            .arg("format")
            .arg(format!("--format={version}"))
            .arg(format!("--data-block-size={data_bs}"))
            .arg(format!("--hash-block-size={hash_bs}"))
            .arg(format!("--hash={algorithm}"))
            .arg(format!("--salt={salt}"))
            .arg(&data)
            .arg(&hash)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "veritysetup format: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = text
            .lines()
            .find_map(|l| l.strip_prefix("Root hash:"))
            .unwrap()
            .trim();
        let cfg = VerityConfig {
            version,
            data_block_size: data_bs,
            hash_block_size: hash_bs,
            num_data_blocks: (contents.len() / data_bs as usize) as u64,
            hash_start_block: 1, // veritysetup's superblock
            algorithm: HashAlgorithm::from_name(algorithm).unwrap(),
            root_digest: hex::decode(root).unwrap(),
            salt: if salt == "-" {
                vec![]
            } else {
                hex::decode(salt).unwrap()
            },
            mode: CorruptionMode::Eio,
            restart_on_error: false,
            ignore_zero_blocks: false,
            check_at_most_once: false,
        };
        Volume {
            data,
            hash,
            contents,
            cfg,
        }
    }

    fn ram(path: &Path) -> Arc<RamDisk> {
        let bytes = std::fs::read(path).unwrap();
        let disk = RamDisk::new((bytes.len() as u64).next_multiple_of(512)).unwrap();
        disk.write_at(0, &bytes, WriteFlags::default()).unwrap();
        Arc::new(disk)
    }

    fn file(path: &Path) -> Arc<dyn BlockDevice> {
        let options = FileOptions {
            direct: false,
            read_only: true,
        };
        Arc::new(FileBacking::open(path, options).unwrap())
    }

    fn on_ram(v: &Volume, cfg: VerityConfig) -> (VerityTarget, Arc<RamDisk>, Arc<RamDisk>) {
        let (data, hash) = (ram(&v.data), ram(&v.hash));
        let len = v.contents.len() as u64;
        let t = VerityTarget::new(data.clone(), "data", hash.clone(), "hash", cfg, len).unwrap();
        (t, data, hash)
    }

    fn flip(disk: &RamDisk, at: u64, mask: u8) {
        let sector = at / 512 * 512;
        let mut b = [0u8; 512];
        disk.read_at(sector, &mut b).unwrap();
        b[(at - sector) as usize] ^= mask;
        disk.write_at(sector, &b, WriteFlags::default()).unwrap();
    }

    fn errno(e: io::Error) -> i32 {
        e.raw_os_error().unwrap_or(-1)
    }

    #[test]
    fn reads_in_any_order_verify_through_evicting_caches() {
        if !tool_available() {
            return;
        }
        let dir = TempDir::new("evict");
        // (version, data block, hash block, algorithm, salt, data blocks): small hash blocks
        // make three or four levels out of few data blocks.
        let cases = [
            (1, 4096, 512, "sha256", "1234", 600),
            (0, 1024, 1024, "sha1", "-", 2000),
            (1, 512, 512, "sha512", "abcdef", 700),
        ];
        for (n, (version, dbs, hbs, alg, salt, blocks)) in cases.into_iter().enumerate() {
            let len = blocks * dbs as usize;
            let v = format(
                &dir,
                &format!("c{n}"),
                pattern(len, 5 + n as u64),
                (version, dbs, hbs, alg, salt),
            );
            let (ram_target, ..) = on_ram(&v, v.cfg.clone());
            let file_target = VerityTarget::new(
                file(&v.data),
                "data",
                file(&v.hash),
                "hash",
                v.cfg.clone(),
                len as u64,
            )
            .unwrap();
            for (slots, what) in [((2, 1), "tiny"), ((LEVEL0_SLOTS, UPPER_SLOTS), "default")] {
                let targets = [("ram", &ram_target), ("file", &file_target)];
                for (kind, t) in targets {
                    let t = VerityTarget::new(
                        t.data.clone(),
                        "data",
                        t.hash.clone(),
                        "hash",
                        v.cfg.clone(),
                        len as u64,
                    )
                    .unwrap()
                    .with_cache_slots(slots.0, slots.1);
                    assert!(t.levels() >= 3, "case {n}: {} levels", t.levels());
                    let mut seed = 99 + n as u64;
                    for _ in 0..300 {
                        let start = next(&mut seed) as usize % blocks;
                        let count = 1 + next(&mut seed) as usize % 40.min(blocks - start);
                        let mut buf = vec![0u8; count * dbs as usize];
                        let at = start * dbs as usize;
                        t.read_at(at as u64, &mut buf).unwrap();
                        assert!(
                            buf == v.contents[at..at + buf.len()],
                            "case {n} {kind} {what}: blocks {start}+{count}"
                        );
                    }
                    assert_eq!(t.corrupted_blocks(), 0);
                }
            }
        }
    }

    #[test]
    fn concurrent_readers_share_one_slot_caches() {
        if !tool_available() {
            return;
        }
        let dir = TempDir::new("threads");
        let blocks = 1500;
        let v = format(
            &dir,
            "t",
            pattern(blocks * 1024, 17),
            (1, 1024, 512, "sha256", "0f0f"),
        );
        let (t, ..) = on_ram(&v, v.cfg.clone());
        // Every level-0 and upper block competes for one slot: refills race with hits.
        let t = t.with_cache_slots(1, 1);
        assert!(t.levels() >= 3);
        std::thread::scope(|s| {
            for worker in 0..4u64 {
                let (t, v) = (&t, &v);
                s.spawn(move || {
                    let mut seed = 1000 + worker;
                    for _ in 0..400 {
                        let start = next(&mut seed) as usize % blocks;
                        let count = 1 + next(&mut seed) as usize % 24.min(blocks - start);
                        let mut buf = vec![0u8; count * 1024];
                        t.read_at(start as u64 * 1024, &mut buf).unwrap();
                        assert!(buf == v.contents[start * 1024..][..buf.len()]);
                    }
                });
            }
        });
        assert_eq!(t.corrupted_blocks(), 0);
    }

    #[test]
    fn ram_disk_reads_keep_the_corruption_semantics() {
        if !tool_available() {
            return;
        }
        let dir = TempDir::new("modes");
        let mut contents = pattern(256 * 4096, 77);
        contents[5 * 4096..6 * 4096].fill(0);
        let v = format(&dir, "m", contents, (1, 4096, 4096, "sha256", "5a5a"));
        let c = &v.contents;
        let mut b = vec![0u8; 8 * 4096];

        // EIO: a multi-block read over a bad block fails; its neighbours read fine.
        let (t, data, _) = on_ram(&v, v.cfg.clone());
        flip(&data, 2 * 4096 + 9, 0x10);
        assert_eq!(errno(t.read_at(0, &mut b).unwrap_err()), libc::EIO);
        assert_eq!(t.corrupted_blocks(), 1);
        t.read_at(3 * 4096, &mut b[..4096]).unwrap();
        assert_eq!(b[..4096], c[3 * 4096..4 * 4096]);
        assert!(!t.is_failed());

        // ignore_corruption: the changed data comes back, each bad read counted.
        let cfg = VerityConfig {
            mode: CorruptionMode::Ignore,
            ..v.cfg.clone()
        };
        let (t, data, _) = on_ram(&v, cfg);
        flip(&data, 2 * 4096 + 9, 0x10);
        t.read_at(0, &mut b).unwrap();
        assert_eq!(b[2 * 4096 + 9], c[2 * 4096 + 9] ^ 0x10);
        assert_eq!(b[..2 * 4096], c[..2 * 4096]);
        assert_eq!(b[3 * 4096..], c[3 * 4096..8 * 4096]);
        t.read_at(2 * 4096, &mut b[..4096]).unwrap();
        assert_eq!(t.corrupted_blocks(), 2);

        // restart_on_corruption: one failure refuses everything after it.
        let cfg = VerityConfig {
            mode: CorruptionMode::Restart,
            ..v.cfg.clone()
        };
        let (t, data, _) = on_ram(&v, cfg);
        t.read_at(0, &mut b).unwrap();
        flip(&data, 7 * 4096, 0x01);
        assert!(t.read_at(0, &mut b).is_err());
        assert!(t.is_failed());
        assert!(t.read_at(8 * 4096, &mut b[..4096]).is_err());

        // ignore_zero_blocks: the zero block reads as zeros though its data changed, in a
        // multi-block read copied from the RAM disk; without the option it fails.
        let cfg = VerityConfig {
            ignore_zero_blocks: true,
            ..v.cfg.clone()
        };
        let (t, data, _) = on_ram(&v, cfg);
        flip(&data, 5 * 4096 + 1, 0xff);
        b.fill(0xaa);
        t.read_at(0, &mut b).unwrap();
        assert!(b[5 * 4096..6 * 4096].iter().all(|&x| x == 0));
        assert_eq!(b[..5 * 4096], c[..5 * 4096]);
        assert_eq!(b[6 * 4096..], c[6 * 4096..8 * 4096]);
        let (t, data, _) = on_ram(&v, v.cfg.clone());
        flip(&data, 5 * 4096 + 1, 0xff);
        assert!(t.read_at(4 * 4096, &mut b[..2 * 4096]).is_err());

        // check_at_most_once: verified blocks are not checked again, others still are.
        let cfg = VerityConfig {
            check_at_most_once: true,
            ..v.cfg.clone()
        };
        let (t, data, _) = on_ram(&v, cfg);
        t.read_at(0, &mut b[..4 * 4096]).unwrap();
        flip(&data, 4096, 0x01);
        flip(&data, 6 * 4096, 0x01);
        t.read_at(0, &mut b[..4 * 4096]).unwrap();
        assert_eq!(b[4096], c[4096] ^ 0x01);
        assert_eq!(t.corrupted_blocks(), 0);
        assert!(t.read_at(0, &mut b).is_err());
        assert_eq!(t.corrupted_blocks(), 1);

        // A bad level-0 hash block (the first, after superblock and top block) fails the
        // data blocks it covers, once per block read, even after it was evicted; the rest
        // read, with caches of one slot.
        let (t, _, hash) = on_ram(&v, v.cfg.clone());
        let t = t.with_cache_slots(1, 1);
        assert_eq!(t.levels(), 2);
        t.read_at(200 * 4096, &mut b[..4096]).unwrap();
        flip(&hash, 2 * 4096 + 40, 0x04);
        t.read_at(130 * 4096, &mut b).unwrap();
        assert_eq!(b, c[130 * 4096..138 * 4096]);
        assert!(t.read_at(120 * 4096, &mut b).is_err());
        assert_eq!(t.corrupted_blocks(), 1);
        let cfg = VerityConfig {
            mode: CorruptionMode::Ignore,
            ..v.cfg.clone()
        };
        let (t, _, hash) = on_ram(&v, cfg);
        flip(&hash, 2 * 4096 + 40, 0x04);
        t.read_at(124 * 4096, &mut b).unwrap();
        assert_eq!(b, c[124 * 4096..132 * 4096]);
        assert_eq!(t.corrupted_blocks(), 4);
    }
}
