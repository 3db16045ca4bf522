//! The table line of an `integrity` mapping: [`IntegrityMode`], [`IntegrityConfig`] with
//! its defaults and the parser of `<dev> <start> <tag_size|-> <mode> <#opts> <opts>...`,
//! and the way back — the table line and status a loaded target reports.
//!
//! Invariants: parsing only fills a configuration (nothing is opened or written here);
//! the printed table lists options in the kernel's order, with the geometry the
//! superblock records (not just what was asked for), and keys replaced by zeros unless
//! asked to show them.

use std::any::Any;

use cryptblk_cipher::SecretBytes;

use super::layout::SB_SECTORS;
use super::open::Core;
use super::superblock::{FLAG_FIXED_HMAC, FLAG_FIXED_PADDING, FLAG_RECALCULATING};
use crate::targets::Target;

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
    /// journal is encrypted on disk (see [`super::journal_crypt`]).
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
        let start = crate::targets::arg_u64(args, 1, "start")?;
        let tag_size = if args[2] == "-" {
            None
        } else {
            let t = crate::targets::arg_u32(args, 2, "tag_size")?;
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
            let count = crate::targets::arg_u64(args, 4, "#opt_params")? as usize;
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
