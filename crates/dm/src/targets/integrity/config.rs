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
use zeroize::Zeroizing;

use super::layout::SB_SECTORS;
use super::open::Core;
use super::superblock::{FLAG_FIXED_HMAC, FLAG_FIXED_PADDING, FLAG_RECALCULATING};

use crate::targets::config::{counted_tail, table_params_of, TargetConfig};
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
        let t = IntegrityTableConfig::parse(args)?;
        Ok((t.to_config(), t.device))
    }
}

/// An algorithm option of an integrity line (`internal_hash:`, `journal_crypt:`,
/// `journal_mac:`): `<name>[:<hex key>]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityAlgorithm {
    /// Kernel name (`crc32c`, `hmac(sha256)`, `ctr(aes)`).
    pub name: String,
    /// Key of a keyed algorithm.
    pub key: Option<SecretBytes>,
}

impl IntegrityAlgorithm {
    /// An unkeyed algorithm.
    pub fn new(name: &str) -> Self {
        IntegrityAlgorithm {
            name: name.to_string(),
            key: None,
        }
    }

    /// A keyed algorithm.
    pub fn keyed(name: &str, key: SecretBytes) -> Self {
        IntegrityAlgorithm {
            name: name.to_string(),
            key: Some(key),
        }
    }

    fn parse(option: &str, v: &str) -> Result<Self, String> {
        Ok(match v.split_once(':') {
            Some((name, k)) => {
                let key = hex::decode(k).map_err(|_| format!("Invalid {option} argument"))?;
                IntegrityAlgorithm::keyed(name, SecretBytes::from_vec(key))
            }
            None => IntegrityAlgorithm::new(v),
        })
    }

    fn to_option(&self, option: &str, show_keys: bool) -> String {
        let mut s = format!("{option}:{}", self.name);
        if let Some(k) = &self.key {
            s.push(':');
            if show_keys {
                s.push_str(&k.to_hex());
            } else {
                s.push_str(&"0".repeat(k.len() * 2));
            }
        }
        s
    }
}

/// `integrity <dev> <start> <tag_size|-> <J|D|B|R> <#opt_params> <opt_params>...`: the
/// line as written, every option kept only if given (an [`IntegrityConfig`] fills in the
/// kernel's defaults, see [`IntegrityTableConfig::to_config`]). Printed in the kernel's
/// order of options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityTableConfig {
    /// The data device as named in the table.
    pub device: String,
    /// Superblock offset on the (metadata) device, in sectors.
    pub start: u64,
    /// Tag size; `None` (`-`) = the internal hash's digest size.
    pub tag_size: Option<u32>,
    /// Mode.
    pub mode: IntegrityMode,
    /// `meta_device:`.
    pub meta_device: Option<String>,
    /// `block_size:` in bytes.
    pub block_size: Option<u32>,
    /// `recalculate`.
    pub recalculate: bool,
    /// `reset_recalculate`.
    pub reset_recalculate: bool,
    /// `allow_discards`.
    pub allow_discards: bool,
    /// `journal_sectors:`.
    pub journal_sectors: Option<u32>,
    /// `interleave_sectors:`.
    pub interleave_sectors: Option<u32>,
    /// `buffer_sectors:`.
    pub buffer_sectors: Option<u32>,
    /// `journal_watermark:` (percent, at most 100).
    pub journal_watermark: Option<u32>,
    /// `commit_time:` in ms.
    pub commit_time: Option<u32>,
    /// `sectors_per_bit:`.
    pub sectors_per_bit: Option<u64>,
    /// `bitmap_flush_interval:` in ms.
    pub bitmap_flush_interval: Option<u32>,
    /// `fix_padding`.
    pub fix_padding: bool,
    /// `fix_hmac`.
    pub fix_hmac: bool,
    /// `legacy_recalculate`.
    pub legacy_recalculate: bool,
    /// `internal_hash:`.
    pub internal_hash: Option<IntegrityAlgorithm>,
    /// `journal_crypt:`.
    pub journal_crypt: Option<IntegrityAlgorithm>,
    /// `journal_mac:`.
    pub journal_mac: Option<IntegrityAlgorithm>,
}

impl IntegrityTableConfig {
    /// A line for `device` in `mode` with no options.
    pub fn new(device: &str, mode: IntegrityMode) -> Self {
        IntegrityTableConfig {
            device: device.to_string(),
            start: 0,
            tag_size: None,
            mode,
            meta_device: None,
            block_size: None,
            recalculate: false,
            reset_recalculate: false,
            allow_discards: false,
            journal_sectors: None,
            interleave_sectors: None,
            buffer_sectors: None,
            journal_watermark: None,
            commit_time: None,
            sectors_per_bit: None,
            bitmap_flush_interval: None,
            fix_padding: false,
            fix_hmac: false,
            legacy_recalculate: false,
            internal_hash: None,
            journal_crypt: None,
            journal_mac: None,
        }
    }

    /// The line `integritysetup open` loads for `params` on `device`; refuses a sector size
    /// the target cannot use and a key given to an unkeyed hash (or missing for a keyed one).
    pub fn from_params(
        params: &cryptblk_format::integrity::IntegrityParams,
        device: &str,
    ) -> Result<Self, String> {
        use cryptblk_format::integrity::IntegrityOpenMode;
        let ss = params.sector_size;
        if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
            return Err(format!("invalid sector size {ss}"));
        }
        let keyed = params.integrity.starts_with("hmac-");
        if keyed != params.key.is_some() {
            return Err(if keyed {
                format!("{} needs --integrity-key-file", params.integrity)
            } else {
                format!("{} takes no key", params.integrity)
            });
        }
        let mode = match params.mode {
            IntegrityOpenMode::Journal => IntegrityMode::Journal,
            IntegrityOpenMode::Direct => IntegrityMode::Direct,
            IntegrityOpenMode::Recovery => IntegrityMode::Recovery,
        };
        let journal_sectors = params
            .journal_size
            .map(|j| u32::try_from(j / 512).map_err(|_| format!("journal size {j} too large")))
            .transpose()?;
        Ok(IntegrityTableConfig {
            start: params.start,
            tag_size: params.tag_size,
            block_size: (ss != 512).then_some(ss),
            journal_sectors,
            interleave_sectors: params.interleave_sectors,
            buffer_sectors: params.buffer_sectors,
            fix_padding: !params.legacy_padding,
            fix_hmac: !params.legacy_hmac,
            internal_hash: Some(IntegrityAlgorithm {
                name: params.kernel_hash_name(),
                key: params.key.clone(),
            }),
            ..IntegrityTableConfig::new(device, mode)
        })
    }

    /// The target's configuration: the given options over the kernel's defaults.
    pub fn to_config(&self) -> IntegrityConfig {
        let d = IntegrityConfig::new(self.mode, "crc32c");
        let (internal_hash, internal_hash_key) = split_algorithm(&self.internal_hash);
        let (journal_crypt, journal_crypt_key) = split_algorithm(&self.journal_crypt);
        let (journal_mac, journal_mac_key) = split_algorithm(&self.journal_mac);
        IntegrityConfig {
            start: self.start,
            tag_size: self.tag_size,
            mode: self.mode,
            journal_sectors: self.journal_sectors.map(|n| n.max(1)),
            interleave_sectors: self.interleave_sectors.unwrap_or(d.interleave_sectors),
            buffer_sectors: self.buffer_sectors.map_or(d.buffer_sectors, |n| n.max(1)),
            journal_watermark: self.journal_watermark.unwrap_or(d.journal_watermark),
            commit_time: self.commit_time.unwrap_or(d.commit_time),
            bitmap_flush_interval: self
                .bitmap_flush_interval
                .unwrap_or(d.bitmap_flush_interval),
            read_only: false,
            block_size: self.block_size.unwrap_or(d.block_size),
            internal_hash,
            internal_hash_key,
            journal_crypt,
            journal_crypt_key,
            journal_mac,
            journal_mac_key,
            fix_padding: self.fix_padding,
            fix_hmac: self.fix_hmac,
            allow_discards: self.allow_discards,
            legacy_recalculate: self.legacy_recalculate,
            meta_device: self.meta_device.clone(),
            recalculate: self.recalculate || self.reset_recalculate,
            reset_recalculate: self.reset_recalculate,
            sectors_per_bit: self.sectors_per_bit,
        }
    }

    fn apply_option(&mut self, opt: &str) -> Result<(), String> {
        let num = |v: &str| -> Result<u32, String> {
            v.parse::<u32>()
                .map_err(|_| format!("invalid argument '{opt}'"))
        };
        match opt.split_once(':') {
            Some(("journal_sectors", v)) => self.journal_sectors = Some(num(v)?),
            Some(("interleave_sectors", v)) => self.interleave_sectors = Some(num(v)?),
            Some(("buffer_sectors", v)) => self.buffer_sectors = Some(num(v)?),
            Some(("journal_watermark", v)) => {
                let w = num(v)?;
                if w > 100 {
                    return Err(format!("invalid argument '{opt}'"));
                }
                self.journal_watermark = Some(w);
            }
            Some(("commit_time", v)) => self.commit_time = Some(num(v)?),
            Some(("block_size", v)) => {
                let b = num(v)?;
                if !(512..=4096).contains(&b) || !b.is_power_of_two() {
                    return Err("Invalid block_size argument".into());
                }
                self.block_size = Some(b);
            }
            Some(("meta_device", v)) => self.meta_device = Some(v.to_string()),
            Some(("sectors_per_bit", v)) => {
                self.sectors_per_bit = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("invalid argument '{opt}'"))?,
                );
            }
            Some(("bitmap_flush_interval", v)) => {
                self.bitmap_flush_interval = Some(
                    v.parse::<u32>()
                        .map_err(|_| "Invalid bitmap_flush_interval argument".to_string())?,
                );
            }
            Some((name @ "internal_hash", v)) => {
                self.internal_hash = Some(IntegrityAlgorithm::parse(name, v)?)
            }
            Some((name @ "journal_crypt", v)) => {
                self.journal_crypt = Some(IntegrityAlgorithm::parse(name, v)?)
            }
            Some((name @ "journal_mac", v)) => {
                self.journal_mac = Some(IntegrityAlgorithm::parse(name, v)?)
            }
            None if opt == "fix_padding" => self.fix_padding = true,
            None if opt == "fix_hmac" => self.fix_hmac = true,
            None if opt == "allow_discards" => self.allow_discards = true,
            None if opt == "legacy_recalculate" => self.legacy_recalculate = true,
            None if opt == "recalculate" => self.recalculate = true,
            None if opt == "reset_recalculate" => self.reset_recalculate = true,
            _ => return Err(format!("Invalid argument '{opt}'")),
        }
        Ok(())
    }
}

/// An algorithm option as the name and key an [`IntegrityConfig`] keeps apart.
fn split_algorithm(a: &Option<IntegrityAlgorithm>) -> (Option<String>, Option<SecretBytes>) {
    match a {
        Some(a) => (Some(a.name.clone()), a.key.clone()),
        None => (None, None),
    }
}

impl TargetConfig for IntegrityTableConfig {
    const TYPE: &'static str = "integrity";

    fn parse(args: &[String]) -> Result<Self, String> {
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
        let mut t = IntegrityTableConfig {
            start,
            tag_size,
            ..IntegrityTableConfig::new(&args[0], mode)
        };
        for opt in counted_tail(args, 4, "opt_params", "optional arguments")? {
            t.apply_option(opt)?;
        }
        Ok(t)
    }

    fn args(&self, show_keys: bool) -> Zeroizing<Vec<String>> {
        let mut opts: Vec<String> = Vec::new();
        let mut value = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                opts.push(format!("{name}:{v}"));
            }
        };
        value("meta_device", self.meta_device.clone());
        value("block_size", self.block_size.map(|n| n.to_string()));
        let flag = |opts: &mut Vec<String>, on: bool, name: &str| {
            if on {
                opts.push(name.to_string());
            }
        };
        flag(&mut opts, self.recalculate, "recalculate");
        flag(&mut opts, self.reset_recalculate, "reset_recalculate");
        flag(&mut opts, self.allow_discards, "allow_discards");
        let numbers = [
            ("journal_sectors", self.journal_sectors.map(u64::from)),
            ("interleave_sectors", self.interleave_sectors.map(u64::from)),
            ("buffer_sectors", self.buffer_sectors.map(u64::from)),
            ("journal_watermark", self.journal_watermark.map(u64::from)),
            ("commit_time", self.commit_time.map(u64::from)),
            ("sectors_per_bit", self.sectors_per_bit),
            (
                "bitmap_flush_interval",
                self.bitmap_flush_interval.map(u64::from),
            ),
        ];
        for (name, v) in numbers {
            if let Some(v) = v {
                opts.push(format!("{name}:{v}"));
            }
        }
        flag(&mut opts, self.fix_padding, "fix_padding");
        flag(&mut opts, self.fix_hmac, "fix_hmac");
        flag(&mut opts, self.legacy_recalculate, "legacy_recalculate");
        // The kernel's order: internal_hash, journal_crypt, journal_mac.
        for (name, alg) in [
            ("internal_hash", &self.internal_hash),
            ("journal_crypt", &self.journal_crypt),
            ("journal_mac", &self.journal_mac),
        ] {
            if let Some(a) = alg {
                opts.push(a.to_option(name, show_keys));
            }
        }
        let mut out = Zeroizing::new(vec![
            self.device.clone(),
            self.start.to_string(),
            self.tag_size
                .map_or_else(|| "-".to_string(), |t| t.to_string()),
            self.mode.letter().to_string(),
            // The kernel always prints the count, 0 included.
            opts.len().to_string(),
        ]);
        out.extend(opts);
        out
    }
    /// The data device, then the metadata device if there is one.
    fn devices(&self) -> Vec<&str> {
        let mut v = vec![self.device.as_str()];
        v.extend(self.meta_device.as_deref());
        v
    }
    /// True if an algorithm option (`internal_hash:`, `journal_crypt:`, `journal_mac:`)
    /// carries a key.
    fn has_inline_keys(&self) -> bool {
        [&self.internal_hash, &self.journal_crypt, &self.journal_mac]
            .iter()
            .any(|a| a.as_ref().is_some_and(|a| a.key.is_some()))
    }
}

impl Core {
    /// The live table line: the configuration with the geometry the superblock records
    /// (not just what was asked for) and every option the kernel always prints.
    pub fn table_config(&self) -> IntegrityTableConfig {
        let c = &self.cfg;
        let sb = self.superblock();
        let journal = c.mode == IntegrityMode::Journal;
        let bitmap = c.mode == IntegrityMode::Bitmap;
        let alg = |name: &Option<String>, key: &Option<SecretBytes>| {
            name.as_ref().map(|n| IntegrityAlgorithm {
                name: n.clone(),
                key: key.clone(),
            })
        };
        IntegrityTableConfig {
            device: self.dev_spec.clone(),
            start: c.start,
            tag_size: Some(self.layout.tag_size),
            mode: c.mode,
            meta_device: c.meta_device.clone(),
            block_size: (c.block_size != 512).then_some(c.block_size),
            recalculate: sb.flags & FLAG_RECALCULATING != 0,
            reset_recalculate: c.reset_recalculate,
            allow_discards: c.allow_discards,
            journal_sectors: Some(
                u32::try_from(self.layout.initial_sectors - SB_SECTORS).unwrap_or(u32::MAX),
            ),
            interleave_sectors: Some(
                1u32.checked_shl(u32::from(sb.log2_interleave_sectors))
                    .unwrap_or(u32::MAX),
            ),
            buffer_sectors: Some(c.buffer_sectors),
            journal_watermark: journal.then_some(c.journal_watermark),
            commit_time: journal.then_some(c.commit_time),
            sectors_per_bit: bitmap.then_some(1u64 << self.bitmap_shift),
            bitmap_flush_interval: bitmap.then_some(c.bitmap_flush_interval),
            fix_padding: sb.flags & FLAG_FIXED_PADDING != 0,
            fix_hmac: sb.flags & FLAG_FIXED_HMAC != 0,
            legacy_recalculate: c.legacy_recalculate,
            internal_hash: alg(&c.internal_hash, &c.internal_hash_key),
            journal_crypt: alg(&c.journal_crypt, &c.journal_crypt_key),
            journal_mac: alg(&c.journal_mac, &c.journal_mac_key),
        }
    }
}

impl Target for Core {
    fn target_type(&self) -> &'static str {
        IntegrityTableConfig::TYPE
    }

    fn table_params(&self, show_keys: bool) -> String {
        table_params_of(&self.table_config(), show_keys)
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
