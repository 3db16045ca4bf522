//! Typed table arguments: one configuration type per target that parses from the target's
//! `dmsetup table` arguments and prints back to them, so tables are built from values and
//! never by formatting strings outside dm.
//!
//! Invariants: parsing validates the arguments but opens nothing; printing writes the
//! arguments in the kernel's order and form, so `parse(print(c)) == c`; key material is
//! printed only when `show_keys` is set (zeros of the key's length otherwise, as `dmsetup
//! table` without `--showkeys`) and comes back in a [`Zeroizing`] buffer. The configs of
//! `crypt`, `verity` and `integrity` live beside their targets
//! ([`crate::targets::crypt::CryptConfig`], [`crate::targets::verity::VerityTableConfig`],
//! [`crate::targets::integrity::IntegrityTableConfig`]).

use zeroize::Zeroizing;

use super::{arg_u32, arg_u64, expect_args};

/// A target's table arguments as a value.
pub trait TargetConfig: Sized {
    /// The target type name as written in tables (`linear`, `crypt`, ...).
    const TYPE: &'static str;
    /// Parses the arguments after the target type; the error names the offending field.
    fn parse(args: &[String]) -> Result<Self, String>;
    /// The arguments as the kernel prints them in `dmsetup table`; keys are masked with
    /// zeros unless `show_keys`.
    fn args(&self, show_keys: bool) -> Zeroizing<Vec<String>>;
    /// The devices the arguments name, as written (`/dev/sdb`, `x_dif`, `ram:1G`): what the
    /// check for users of a lower mapping reads. No default, so a new target that opens a
    /// device cannot be left out of that check by accident.
    fn devices(&self) -> Vec<&str>;
    /// True if the arguments carry key material, which makes the table text secret.
    fn has_inline_keys(&self) -> bool {
        false
    }
    /// [`TargetConfig::args`] joined by spaces (a target's `table_params`).
    fn args_text(&self, show_keys: bool) -> Zeroizing<String> {
        Zeroizing::new(self.args(show_keys).join(" "))
    }
}

/// The optional arguments after `<#count>` at `at` (empty when the count is absent), checked
/// against the count. `what` names them in the error (`opt_params`, `feature_args`).
pub(crate) fn counted_tail<'a>(
    args: &'a [String],
    at: usize,
    what: &str,
    noun: &str,
) -> Result<&'a [String], String> {
    if args.len() <= at {
        return Ok(&[]);
    }
    let count = arg_u64(args, at, &format!("#{what}"))? as usize;
    let tail = &args[at + 1..];
    if tail.len() != count {
        return Err(format!(
            "<#{what}> is {count} but {} {noun} follow",
            tail.len()
        ));
    }
    Ok(tail)
}

/// Appends `<#count> <opts>...` unless `opts` is empty (the kernel's form for optional
/// parameters that may be left out entirely).
pub(crate) fn push_counted(out: &mut Vec<String>, opts: Vec<String>) {
    if !opts.is_empty() {
        out.push(opts.len().to_string());
        out.extend(opts);
    }
}

/// `linear <dev> <offset>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearConfig {
    /// The device as named in the table.
    pub device: String,
    /// Start on the device, in 512-byte sectors.
    pub offset: u64,
}

impl TargetConfig for LinearConfig {
    const TYPE: &'static str = "linear";
    fn parse(args: &[String]) -> Result<Self, String> {
        expect_args(args, 2, 2, "linear <dev> <offset>")?;
        Ok(LinearConfig {
            device: args[0].clone(),
            offset: arg_u64(args, 1, "offset")?,
        })
    }
    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        Zeroizing::new(vec![self.device.clone(), self.offset.to_string()])
    }
    fn devices(&self) -> Vec<&str> {
        vec![self.device.as_str()]
    }
}

/// `zero` (no arguments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroConfig;

impl TargetConfig for ZeroConfig {
    const TYPE: &'static str = "zero";
    fn parse(args: &[String]) -> Result<Self, String> {
        expect_args(args, 0, 0, "zero (no arguments)")?;
        Ok(ZeroConfig)
    }
    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        Zeroizing::new(Vec::new())
    }
    fn devices(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// `error` (no arguments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorConfig;

impl TargetConfig for ErrorConfig {
    const TYPE: &'static str = "error";
    fn parse(args: &[String]) -> Result<Self, String> {
        expect_args(args, 0, 0, "error (no arguments)")?;
        Ok(ErrorConfig)
    }
    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        Zeroizing::new(Vec::new())
    }
    fn devices(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// One I/O class of a delay target: `<dev> <offset> <delay_ms>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayClassConfig {
    /// The device as named in the table.
    pub device: String,
    /// Start on the device, in 512-byte sectors.
    pub offset: u64,
    /// Added latency in milliseconds.
    pub delay_ms: u32,
}

impl DelayClassConfig {
    fn parse(args: &[String], at: usize) -> Result<Self, String> {
        Ok(DelayClassConfig {
            device: args[at].clone(),
            offset: arg_u64(args, at + 1, "offset")?,
            delay_ms: arg_u32(args, at + 2, "delay")?,
        })
    }

    fn push(&self, out: &mut Vec<String>) {
        out.push(self.device.clone());
        out.push(self.offset.to_string());
        out.push(self.delay_ms.to_string());
    }
}

/// `delay <dev> <offset> <delay_ms> [<write_dev> <offset> <delay_ms> [<flush_dev> <offset>
/// <delay_ms>]]`: without `write` everything uses `read`; without `flush`, flushes use the
/// write class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelayConfig {
    /// Reads (and writes and flushes when no other class is given).
    pub read: DelayClassConfig,
    /// Writes and discards (and flushes when `flush` is absent).
    pub write: Option<DelayClassConfig>,
    /// Flushes; printed only after a write class (the table form has no other place for
    /// it), so a flush class without a write class prints the read class as the write one.
    pub flush: Option<DelayClassConfig>,
}

impl TargetConfig for DelayConfig {
    const TYPE: &'static str = "delay";
    fn parse(args: &[String]) -> Result<Self, String> {
        if ![3, 6, 9].contains(&args.len()) {
            return Err(format!(
                "wrong number of arguments ({}); usage: delay <dev> <offset> <delay_ms> \
                 [<write_dev> <offset> <delay_ms> [<flush_dev> <offset> <delay_ms>]]",
                args.len()
            ));
        }
        let read = DelayClassConfig::parse(args, 0)?;
        let write = (args.len() >= 6)
            .then(|| DelayClassConfig::parse(args, 3))
            .transpose()?;
        let flush = (args.len() == 9)
            .then(|| DelayClassConfig::parse(args, 6))
            .transpose()?;
        Ok(DelayConfig { read, write, flush })
    }
    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        let mut out = Vec::with_capacity(9);
        self.read.push(&mut out);
        match (&self.write, &self.flush) {
            (Some(w), _) => w.push(&mut out),
            (None, Some(_)) => self.read.push(&mut out),
            (None, None) => {}
        }
        if let Some(f) = &self.flush {
            f.push(&mut out);
        }
        Zeroizing::new(out)
    }
    fn devices(&self) -> Vec<&str> {
        [Some(&self.read), self.write.as_ref(), self.flush.as_ref()]
            .into_iter()
            .flatten()
            .map(|d| d.device.as_str())
            .collect()
    }
}

/// The `corrupt_bio_byte <n> <r|w> <value> <flags>` feature of flakey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorruptBioByte {
    /// 1-based byte of each matching request to replace.
    pub byte: u32,
    /// Corrupt writes (`w`) rather than reads (`r`).
    pub write: bool,
    /// The value written into that byte.
    pub value: u8,
    /// Bio flags a request must carry to be corrupted (0 = all).
    pub flags: u32,
}

/// `flakey <dev> <offset> <up_interval> <down_interval> [<#feature_args> <features>...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlakeyConfig {
    /// The device as named in the table.
    pub device: String,
    /// Start on the device, in 512-byte sectors.
    pub offset: u64,
    /// Seconds the device is reliable.
    pub up_interval: u32,
    /// Seconds the device is unreliable.
    pub down_interval: u32,
    /// `drop_writes`: writes are acknowledged and dropped while down.
    pub drop_writes: bool,
    /// `error_writes`: writes fail while down.
    pub error_writes: bool,
    /// `error_reads`: reads fail while down.
    pub error_reads: bool,
    /// `corrupt_bio_byte`.
    pub corrupt: Option<CorruptBioByte>,
}

impl FlakeyConfig {
    /// A flakey configuration with no features.
    pub fn new(device: &str, offset: u64, up_interval: u32, down_interval: u32) -> Self {
        FlakeyConfig {
            device: device.to_string(),
            offset,
            up_interval,
            down_interval,
            drop_writes: false,
            error_writes: false,
            error_reads: false,
            corrupt: None,
        }
    }

    fn parse_features(&mut self, features: &[String]) -> Result<(), String> {
        let mut i = 0;
        while i < features.len() {
            match features[i].as_str() {
                "drop_writes" if !self.drop_writes => self.drop_writes = true,
                "error_writes" if !self.error_writes => self.error_writes = true,
                "error_reads" if !self.error_reads => self.error_reads = true,
                "drop_writes" | "error_writes" | "error_reads" => {
                    return Err(format!("feature {} duplicated", features[i]))
                }
                "corrupt_bio_byte" => {
                    if features.len() < i + 5 {
                        return Err("corrupt_bio_byte needs <n> <r|w> <value> <flags>".into());
                    }
                    let byte = arg_u32(features, i + 1, "corrupt_bio_byte n")?;
                    if byte == 0 {
                        return Err("corrupt_bio_byte <n> must be at least 1".into());
                    }
                    let write = match features[i + 2].as_str() {
                        "w" => true,
                        "r" => false,
                        other => {
                            return Err(format!(
                                "corrupt_bio_byte direction '{other}' (expected r or w)"
                            ))
                        }
                    };
                    let value = arg_u32(features, i + 3, "corrupt_bio_byte value")?;
                    let value = u8::try_from(value)
                        .map_err(|_| format!("corrupt_bio_byte value {value} exceeds 255"))?;
                    let flags = arg_u32(features, i + 4, "corrupt_bio_byte flags")?;
                    self.corrupt = Some(CorruptBioByte {
                        byte,
                        write,
                        value,
                        flags,
                    });
                    i += 4;
                }
                other => return Err(format!("unrecognised flakey feature '{other}'")),
            }
            i += 1;
        }
        if self.drop_writes && self.error_writes {
            return Err("drop_writes and error_writes are mutually exclusive".into());
        }
        Ok(())
    }
}

impl TargetConfig for FlakeyConfig {
    const TYPE: &'static str = "flakey";
    fn parse(args: &[String]) -> Result<Self, String> {
        const USAGE: &str = "flakey <dev> <offset> <up_interval> <down_interval> \
                             [<#feature_args> [drop_writes] [error_writes] [error_reads] \
                             [corrupt_bio_byte <n> <r|w> <value> <flags>]]";
        if args.len() < 4 {
            return Err(format!(
                "too few arguments ({}); usage: {USAGE}",
                args.len()
            ));
        }
        let mut cfg = FlakeyConfig::new(
            &args[0],
            arg_u64(args, 1, "offset")?,
            arg_u32(args, 2, "up_interval")?,
            arg_u32(args, 3, "down_interval")?,
        );
        if u64::from(cfg.up_interval) + u64::from(cfg.down_interval) == 0 {
            return Err("total (up + down) interval is zero".into());
        }
        cfg.parse_features(counted_tail(args, 4, "feature_args", "feature arguments")?)?;
        Ok(cfg)
    }
    fn args(&self, _show_keys: bool) -> Zeroizing<Vec<String>> {
        let mut features = Vec::new();
        for (on, name) in [
            (self.drop_writes, "drop_writes"),
            (self.error_writes, "error_writes"),
            (self.error_reads, "error_reads"),
        ] {
            if on {
                features.push(name.to_string());
            }
        }
        if let Some(c) = self.corrupt {
            features.extend([
                "corrupt_bio_byte".to_string(),
                c.byte.to_string(),
                if c.write { "w" } else { "r" }.to_string(),
                c.value.to_string(),
                c.flags.to_string(),
            ]);
        }
        // The kernel always prints the feature count, 0 included.
        let mut out = vec![
            self.device.clone(),
            self.offset.to_string(),
            self.up_interval.to_string(),
            self.down_interval.to_string(),
            features.len().to_string(),
        ];
        out.extend(features);
        Zeroizing::new(out)
    }
    fn devices(&self) -> Vec<&str> {
        vec![self.device.as_str()]
    }
}

/// A target's `table_params` from its configuration: the printed text moved out of its
/// zeroizing buffer without a copy (the trait hands the caller a plain `String`).
pub(crate) fn table_params_of<C: TargetConfig>(cfg: &C, show_keys: bool) -> String {
    let mut text = cfg.args_text(show_keys);
    std::mem::take(&mut *text)
}
