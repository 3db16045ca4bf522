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
//! Verification walks from the root down; hash blocks that passed once are kept in a bounded
//! cache so later reads only hash the data block. A mismatch is counted and, by default,
//! fails the read with `EIO`; `ignore_corruption` returns the data anyway;
//! `restart_on_corruption` / `panic_on_corruption` cannot reboot a userspace process, so
//! the target refuses every later request (`EIO`) instead, which is what a reader of a
//! restarted kernel device would see until the volume is reopened.

use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use cryptblk_cipher::hash::HashAlgorithm;

use super::{arg_u32, arg_u64, BuildContext, Target};
use crate::device::{check_range, BlockDevice, WriteFlags};
use crate::error::errno;
use crate::SECTOR_SIZE;

/// Verified hash blocks kept in memory before the cache is emptied and refilled.
const HASH_CACHE_BLOCKS: usize = 8192;

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
    zero_digest: Vec<u8>,
    cache: RwLock<HashMap<u64, Arc<[u8]>>>,
    /// One bit per data block for `check_at_most_once`.
    verified: Vec<AtomicU64>,
    corrupted: AtomicU64,
    failed: AtomicBool,
}

fn check_block_size(what: &str, v: u32) -> Result<(), String> {
    if !v.is_power_of_two() || !(512..=65536).contains(&v) {
        return Err(format!("invalid {what} block size {v}"));
    }
    Ok(())
}

impl VerityConfig {
    /// Parses the table arguments; returns the configuration and the two device names.
    pub fn parse(args: &[String]) -> Result<(Self, String, String), String> {
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
        if args.len() > 10 {
            let count = arg_u64(args, 10, "#opt_params")? as usize;
            let opts = &args[11..];
            if opts.len() != count {
                return Err(format!(
                    "<#opt_params> is {count} but {} optional arguments follow",
                    opts.len()
                ));
            }
            for opt in opts {
                match opt.as_str() {
                    "ignore_corruption" => cfg.mode = CorruptionMode::Ignore,
                    "restart_on_corruption" => cfg.mode = CorruptionMode::Restart,
                    "panic_on_corruption" => cfg.mode = CorruptionMode::Panic,
                    "restart_on_error" | "panic_on_error" => cfg.restart_on_error = true,
                    "ignore_zero_blocks" => cfg.ignore_zero_blocks = true,
                    "check_at_most_once" => cfg.check_at_most_once = true,
                    // Scheduling hint only; verification is synchronous here anyway.
                    "try_verify_in_tasklet" => {}
                    "use_fec_from_device"
                    | "fec_roots"
                    | "fec_blocks"
                    | "fec_start"
                    | "root_hash_sig_key_desc" => {
                        return Err(format!("optional argument '{opt}' is not supported"))
                    }
                    other => return Err(format!("unrecognized verity feature request '{other}'")),
                }
            }
        }
        Ok((cfg, args[1].clone(), args[2].clone()))
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
        let per_block = cfg.hash_block_size as usize / digest_size;
        if per_block < 2 {
            return Err("hash block too small for two digests".into());
        }
        let bits = usize::BITS - 1 - per_block.leading_zeros();
        let digest_stride = if cfg.version == 0 {
            digest_size
        } else {
            cfg.hash_block_size as usize >> bits
        };
        let mut levels = 0u32;
        while bits * levels < 64 && (cfg.num_data_blocks - 1) >> (bits * levels) != 0 {
            levels += 1;
        }
        if levels > 63 {
            return Err("too many tree levels".into());
        }
        let mut level_start = vec![0u64; levels as usize];
        let mut position = cfg.hash_start_block;
        for i in (0..levels as usize).rev() {
            let shift = (i as u32 + 1) * bits;
            let blocks = if shift >= 64 {
                1
            } else {
                (cfg.num_data_blocks >> shift)
                    + u64::from(cfg.num_data_blocks & ((1u64 << shift) - 1) != 0)
            };
            level_start[i] = position;
            position = position.checked_add(blocks).ok_or("hash area overflows")?;
        }
        let hash_end = position
            .checked_mul(cfg.hash_block_size as u64)
            .ok_or("hash area overflows")?;
        if hash.size() < hash_end {
            return Err(format!(
                "hash device {hash_spec} is too small: the tree needs {hash_end} bytes"
            ));
        }
        let zero_digest = digest_with_salt(&cfg, &vec![0u8; cfg.data_block_size as usize]);
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
            cache: RwLock::new(HashMap::new()),
            verified,
            corrupted: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        })
    }

    pub(crate) fn from_args(ctx: &BuildContext<'_>, args: &[String]) -> Result<Self, String> {
        let (cfg, data_spec, hash_spec) = VerityConfig::parse(args)?;
        let data = ctx.open_device(&data_spec, 0)?;
        let hash = ctx
            .resolver
            .open_device(&hash_spec)
            .map_err(|e| e.to_string())?;
        Self::new(data, &data_spec, hash, &hash_spec, cfg, ctx.len_bytes())
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

    /// Returns hash block `index` after checking it against `expected` (cached if it
    /// passed before).
    fn hash_block(&self, index: u64, expected: &[u8]) -> io::Result<Result<Arc<[u8]>, Failure>> {
        if let Some(b) = self.cache.read().expect("cache lock").get(&index) {
            return Ok(Ok(b.clone()));
        }
        let mut buf = vec![0u8; self.cfg.hash_block_size as usize];
        self.io(self
            .hash
            .read_at(index * self.cfg.hash_block_size as u64, &mut buf))?;
        if digest_with_salt(&self.cfg, &buf) != expected {
            return Ok(Err(Failure::Hash(index)));
        }
        let block: Arc<[u8]> = buf.into();
        let mut cache = self.cache.write().expect("cache lock");
        if cache.len() >= HASH_CACHE_BLOCKS {
            cache.clear();
        }
        cache.insert(index, block.clone());
        Ok(Ok(block))
    }

    /// The digest the tree holds for data block `idx`, authenticated up to the root.
    fn expected_digest(&self, idx: u64) -> io::Result<Result<Vec<u8>, Failure>> {
        let mut expected = self.cfg.root_digest.clone();
        let mask = (1u64 << self.bits) - 1;
        for lvl in (0..self.level_start.len()).rev() {
            let shift = (lvl as u32 + 1) * self.bits;
            let block_index = self.level_start[lvl] + if shift >= 64 { 0 } else { idx >> shift };
            let block = match self.hash_block(block_index, &expected)? {
                Ok(b) => b,
                Err(f) => return Ok(Err(f)),
            };
            let pos = ((idx >> (lvl as u32 * self.bits)) & mask) as usize;
            let at = pos * self.digest_stride;
            expected = block[at..at + self.digest_size].to_vec();
        }
        Ok(Ok(expected))
    }

    /// Verifies data block `idx` held in `block` (may zero it for `ignore_zero_blocks`).
    fn verify_block(&self, idx: u64, block: &mut [u8]) -> io::Result<()> {
        if self.cfg.check_at_most_once {
            let word = self.verified[(idx / 64) as usize].load(Ordering::Relaxed);
            if word & (1 << (idx % 64)) != 0 {
                return Ok(());
            }
        }
        let result = match self.expected_digest(idx)? {
            Ok(want) => {
                if self.cfg.ignore_zero_blocks && want == self.zero_digest {
                    block.fill(0);
                    Ok(())
                } else if digest_with_salt(&self.cfg, block) == want {
                    Ok(())
                } else {
                    Err(Failure::Data(idx))
                }
            }
            Err(f) => Err(f),
        };
        match result {
            Ok(()) => {
                if self.cfg.check_at_most_once {
                    self.verified[(idx / 64) as usize].fetch_or(1 << (idx % 64), Ordering::Relaxed);
                }
                Ok(())
            }
            Err(f) => self.corruption(f),
        }
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

fn digest_with_salt(cfg: &VerityConfig, block: &[u8]) -> Vec<u8> {
    if cfg.version == 0 {
        cfg.algorithm.digest(&[block, &cfg.salt])
    } else {
        cfg.algorithm.digest(&[&cfg.salt, block])
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
        self.io(self.data.read_at(offset, buf))?;
        for (i, block) in buf.chunks_exact_mut(bs as usize).enumerate() {
            self.verify_block(offset / bs + i as u64, block)?;
        }
        Ok(())
    }

    fn write_at(&self, _offset: u64, _buf: &[u8], _flags: WriteFlags) -> io::Result<()> {
        Err(errno(libc::EROFS))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
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
        "verity"
    }

    fn table_params(&self, _show_keys: bool) -> String {
        let c = &self.cfg;
        let mut s = format!(
            "{} {} {} {} {} {} {} {} {} {}",
            c.version,
            self.data_spec,
            self.hash_spec,
            c.data_block_size,
            c.hash_block_size,
            c.num_data_blocks,
            c.hash_start_block,
            c.algorithm.name(),
            hex::encode(&c.root_digest),
            if c.salt.is_empty() {
                "-".to_string()
            } else {
                hex::encode(&c.salt)
            }
        );
        let mut opts: Vec<&str> = Vec::new();
        match c.mode {
            CorruptionMode::Eio => {}
            CorruptionMode::Ignore => opts.push("ignore_corruption"),
            CorruptionMode::Restart => opts.push("restart_on_corruption"),
            CorruptionMode::Panic => opts.push("panic_on_corruption"),
        }
        if c.restart_on_error {
            opts.push("restart_on_error");
        }
        if c.ignore_zero_blocks {
            opts.push("ignore_zero_blocks");
        }
        if c.check_at_most_once {
            opts.push("check_at_most_once");
        }
        if !opts.is_empty() {
            s.push_str(&format!(" {} {}", opts.len(), opts.join(" ")));
        }
        s
    }

    /// `V` (verified so far) or `C` (corruption detected), as the kernel reports.
    fn status_params(&self) -> String {
        if self.corrupted_blocks() > 0 {
            "C".into()
        } else {
            "V".into()
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
