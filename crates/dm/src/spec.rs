//! Typed dm tables: a [`TableSpec`] is a list of [`TableLineSpec`]s, each a sector range and
//! a [`TargetSpec`] (one of the targets' configs). A program builds and changes tables as
//! values and prints them with [`TableSpec::to_text`]; [`crate::Table::load_spec`] loads one.
//!
//! Invariants: `TableSpec::parse(&t.to_text(true))` gives back `t` for every valid table;
//! the text is printed as `dmsetup table` prints it (keys masked unless asked) and comes back
//! in a [`Zeroizing`] buffer; parsing wipes its copies of the argument text.

use zeroize::{Zeroize, Zeroizing};

use crate::error::DmError;
use crate::table::parse_table_lines;
use crate::targets::config::{
    DelayConfig, ErrorConfig, FlakeyConfig, LinearConfig, TargetConfig, ZeroConfig,
};
use crate::targets::crypt::{CryptConfig, CryptFlags, CryptKey};
use crate::targets::integrity::IntegrityTableConfig;
use crate::targets::verity::VerityTableConfig;

/// The target of one table line, with its arguments as a config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// `linear`.
    Linear(LinearConfig),
    /// `zero`.
    Zero(ZeroConfig),
    /// `error`.
    Error(ErrorConfig),
    /// `delay`.
    Delay(DelayConfig),
    /// `flakey`.
    Flakey(FlakeyConfig),
    /// `crypt`.
    Crypt(CryptConfig),
    /// `verity`.
    Verity(VerityTableConfig),
    /// `integrity`.
    Integrity(IntegrityTableConfig),
}

/// Calls `$body` with `$c` bound to the config inside any [`TargetSpec`] variant.
macro_rules! with_config {
    ($spec:expr, $c:ident => $body:expr) => {
        match $spec {
            TargetSpec::Linear($c) => $body,
            TargetSpec::Zero($c) => $body,
            TargetSpec::Error($c) => $body,
            TargetSpec::Delay($c) => $body,
            TargetSpec::Flakey($c) => $body,
            TargetSpec::Crypt($c) => $body,
            TargetSpec::Verity($c) => $body,
            TargetSpec::Integrity($c) => $body,
        }
    };
}

/// The target type names [`TargetSpec`] knows, in the order tried.
pub const TARGET_TYPES: [&str; 8] = [
    LinearConfig::TYPE,
    ZeroConfig::TYPE,
    ErrorConfig::TYPE,
    DelayConfig::TYPE,
    FlakeyConfig::TYPE,
    CryptConfig::TYPE,
    VerityTableConfig::TYPE,
    IntegrityTableConfig::TYPE,
];

impl TargetSpec {
    /// Parses the arguments of a `target_type` line.
    pub fn parse(target_type: &str, args: &[String]) -> Result<TargetSpec, String> {
        Ok(match target_type {
            LinearConfig::TYPE => TargetSpec::Linear(LinearConfig::parse(args)?),
            ZeroConfig::TYPE => TargetSpec::Zero(ZeroConfig::parse(args)?),
            ErrorConfig::TYPE => TargetSpec::Error(ErrorConfig::parse(args)?),
            DelayConfig::TYPE => TargetSpec::Delay(DelayConfig::parse(args)?),
            FlakeyConfig::TYPE => TargetSpec::Flakey(FlakeyConfig::parse(args)?),
            CryptConfig::TYPE => TargetSpec::Crypt(CryptConfig::parse(args)?),
            VerityTableConfig::TYPE => TargetSpec::Verity(VerityTableConfig::parse(args)?),
            IntegrityTableConfig::TYPE => TargetSpec::Integrity(IntegrityTableConfig::parse(args)?),
            other => {
                return Err(format!(
                    "unknown target type '{other}' (known: {})",
                    TARGET_TYPES.join(" ")
                ))
            }
        })
    }

    /// The target type name (`crypt`, ...).
    pub fn target_type(&self) -> &'static str {
        fn type_of<C: TargetConfig>(_: &C) -> &'static str {
            C::TYPE
        }
        with_config!(self, c => type_of(c))
    }

    /// The arguments as `dmsetup table` prints them (keys masked unless `show_keys`).
    pub fn args(&self, show_keys: bool) -> Zeroizing<Vec<String>> {
        with_config!(self, c => c.args(show_keys))
    }

    /// The devices the line names, as written (`/dev/sdb`, `x_dif`, `ram:1G`).
    pub fn devices(&self) -> Vec<&str> {
        with_config!(self, c => c.devices())
    }

    /// True if the line carries key material: a crypt hex key, or an integrity
    /// `internal_hash:`/`journal_crypt:`/`journal_mac:` with a key.
    pub fn has_inline_keys(&self) -> bool {
        with_config!(self, c => c.has_inline_keys())
    }

    /// The crypt config, if this is a crypt line.
    pub fn as_crypt(&self) -> Option<&CryptConfig> {
        match self {
            TargetSpec::Crypt(c) => Some(c),
            _ => None,
        }
    }

    /// The crypt config to change, if this is a crypt line.
    pub fn as_crypt_mut(&mut self) -> Option<&mut CryptConfig> {
        match self {
            TargetSpec::Crypt(c) => Some(c),
            _ => None,
        }
    }

    /// The integrity config, if this is an integrity line.
    pub fn as_integrity(&self) -> Option<&IntegrityTableConfig> {
        match self {
            TargetSpec::Integrity(c) => Some(c),
            _ => None,
        }
    }
}

macro_rules! from_config {
    ($($variant:ident($ty:ty)),*) => {$(
        impl From<$ty> for TargetSpec {
            fn from(c: $ty) -> Self {
                TargetSpec::$variant(c)
            }
        }
    )*};
}
from_config!(
    Linear(LinearConfig),
    Zero(ZeroConfig),
    Error(ErrorConfig),
    Delay(DelayConfig),
    Flakey(FlakeyConfig),
    Crypt(CryptConfig),
    Verity(VerityTableConfig),
    Integrity(IntegrityTableConfig)
);

/// One line of a table: `<start> <len> <target> <args...>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLineSpec {
    /// First sector covered.
    pub start: u64,
    /// Number of sectors covered.
    pub len: u64,
    /// The target and its arguments.
    pub target: TargetSpec,
}

/// The pipelines a crypt line's flags select, for reports (`cryptblk status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineInfo {
    /// First sector of the line.
    pub start: u64,
    /// `inline` (`no_read_workqueue`) or `queued`.
    pub read: &'static str,
    /// `inline` (`no_write_workqueue`) or `queued`.
    pub write: &'static str,
    /// The line's optional parameters as printed.
    pub flags: Vec<String>,
}

/// A whole table: lines contiguous from sector 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableSpec {
    /// The lines in order.
    pub lines: Vec<TableLineSpec>,
}

impl TableSpec {
    /// A table of one line covering `len_sectors` from sector 0.
    pub fn single(len_sectors: u64, target: impl Into<TargetSpec>) -> TableSpec {
        TableSpec {
            lines: vec![TableLineSpec {
                start: 0,
                len: len_sectors,
                target: target.into(),
            }],
        }
    }

    /// Appends a line of `len_sectors` right after the last one.
    pub fn push(&mut self, len_sectors: u64, target: impl Into<TargetSpec>) {
        let start = self.len_sectors();
        self.lines.push(TableLineSpec {
            start,
            len: len_sectors,
            target: target.into(),
        });
    }

    /// The table's size in sectors (the end of its last line).
    pub fn len_sectors(&self) -> u64 {
        self.lines.last().map_or(0, |l| l.start + l.len)
    }

    /// Parses table text (blank lines and `#` comments skipped; lines contiguous from 0).
    /// Errors name the line as [`crate::Table::load`] does.
    pub fn parse(text: &str) -> Result<TableSpec, DmError> {
        let mut raw = parse_table_lines(text)?;
        let mut result = Ok(());
        let mut lines = Vec::with_capacity(raw.len());
        for l in &raw {
            match TargetSpec::parse(&l.target_type, &l.args) {
                Ok(target) => lines.push(TableLineSpec {
                    start: l.start,
                    len: l.len,
                    target,
                }),
                Err(msg) => {
                    result = Err(DmError::table(
                        l.line,
                        format!("{} target: {msg}", l.target_type),
                    ));
                    break;
                }
            }
        }
        // The argument text may hold keys; the configs keep their own (wiped) copies.
        for l in &mut raw {
            l.args.iter_mut().for_each(Zeroize::zeroize);
        }
        result.map(|()| TableSpec { lines })
    }

    /// The table as `dmsetup table` prints it: one `\n`-terminated line per target, keys
    /// masked with zeros unless `show_keys`.
    pub fn to_text(&self, show_keys: bool) -> Zeroizing<String> {
        let mut out = Zeroizing::new(String::new());
        for l in &self.lines {
            out.push_str(&format!("{} {} {}", l.start, l.len, l.target.target_type()));
            for a in l.target.args(show_keys).iter() {
                out.push(' ');
                out.push_str(a);
            }
            out.push('\n');
        }
        out
    }

    /// The crypt lines' configs.
    pub fn crypt_lines(&self) -> impl Iterator<Item = &CryptConfig> {
        self.lines.iter().filter_map(|l| l.target.as_crypt())
    }

    /// The crypt lines' configs, to change.
    pub fn crypt_lines_mut(&mut self) -> impl Iterator<Item = &mut CryptConfig> {
        self.lines
            .iter_mut()
            .filter_map(|l| l.target.as_crypt_mut())
    }

    /// The integrity lines' configs.
    pub fn integrity_lines(&self) -> impl Iterator<Item = &IntegrityTableConfig> {
        self.lines.iter().filter_map(|l| l.target.as_integrity())
    }

    /// True if any line carries key material (see [`TargetSpec::has_inline_keys`]).
    pub fn has_inline_keys(&self) -> bool {
        self.lines.iter().any(|l| l.target.has_inline_keys())
    }

    /// True if a line uses mapping `name`, as `name` or `/dev/mapper/name`.
    pub fn names_device(&self, name: &str) -> bool {
        let path = format!("/dev/mapper/{name}");
        self.lines
            .iter()
            .flat_map(|l| l.target.devices())
            .any(|d| d == name || d == path)
    }

    /// Replaces the activation flags (`allow_discards` and the four pipeline flags) of every
    /// crypt line by those of `flags`, keeping each line's format options: what
    /// cryptsetup's refresh does with the flags of its command line.
    pub fn set_crypt_activation_flags(&mut self, flags: &CryptFlags) {
        for c in self.crypt_lines_mut() {
            c.flags = c.flags.with_activation_of(flags);
        }
    }

    /// The pipeline each crypt line's flags select, per direction.
    pub fn crypt_pipelines(&self) -> Vec<PipelineInfo> {
        self.lines
            .iter()
            .filter_map(|l| {
                let f = &l.target.as_crypt()?.flags;
                let mode = |inline: bool| if inline { "inline" } else { "queued" };
                Some(PipelineInfo {
                    start: l.start,
                    read: mode(f.no_read_workqueue),
                    write: mode(f.no_write_workqueue),
                    flags: f.format(),
                })
            })
            .collect()
    }
}

/// True if table text that may not parse carries a key: a crypt line whose key field is
/// neither `-` nor a keyring reference (`:<size>:<type>:<desc>`), or an integrity line
/// with a keyed `internal_hash:`/`journal_crypt:`/`journal_mac:`. For text checked before
/// it is validated (a table given on a command line): a malformed key field still counts.
pub fn text_has_inline_keys(text: &str) -> bool {
    text.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.get(2) {
            Some(&"crypt") => f.get(4).is_some_and(|k| match CryptKey::parse(k) {
                Ok(key) => key.is_inline(),
                // Not a valid key, but maybe a real one with a typo: treat it as one.
                Err(_) => !k.starts_with(':'),
            }),
            Some(&"integrity") => f.iter().any(|o| {
                ["internal_hash:", "journal_crypt:", "journal_mac:"]
                    .iter()
                    .any(|p| o.strip_prefix(p).is_some_and(|rest| rest.contains(':')))
            }),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::integrity::IntegrityMode;
    use cryptblk_cipher::SecretBytes;

    fn refreshed(table: &str, perf: &[&str]) -> String {
        let mut t = TableSpec::parse(table).unwrap();
        let perf: Vec<String> = perf.iter().map(|s| s.to_string()).collect();
        t.set_crypt_activation_flags(&CryptFlags::parse(&perf).unwrap());
        t.to_text(true).to_string()
    }

    // The cases of the CLI's refresh, whose table surgery this replaces.
    #[test]
    fn refresh_replaces_only_activation_flags() {
        let t = "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 allow_discards sector_size:4096 same_cpu_crypt\n";
        let out = refreshed(t, &["no_read_workqueue", "no_write_workqueue"]);
        assert_eq!(
            out,
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 3 no_read_workqueue no_write_workqueue sector_size:4096\n"
        );
        assert_eq!(
            refreshed(&out, &["allow_discards"]),
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 2 allow_discards sector_size:4096\n"
        );
    }

    #[test]
    fn refresh_keeps_authenticated_encryption_options() {
        let t = "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 3 \
                 integrity:32:aead integrity_key_size:40 sector_size:4096\n";
        assert_eq!(
            refreshed(t, &["no_read_workqueue"]),
            "0 8 crypt capi:authenc(hmac(sha256),xts(aes))-random 00 0 /dev/x 0 4 \
             no_read_workqueue integrity:32:aead integrity_key_size:40 sector_size:4096\n"
        );
    }

    #[test]
    fn refresh_leaves_other_targets_alone() {
        let t = "0 8 linear /dev/x 0\n8 8 zero\n";
        assert_eq!(refreshed(t, &["no_read_workqueue"]), t);
    }

    #[test]
    fn users_of_a_lower_mapping_are_found_by_name_or_mapper_path() {
        let names = |t: &str, n: &str| TableSpec::parse(t).unwrap().names_device(n);
        let t = "0 8 crypt capi:gcm(aes)-random 00 0 /dev/mapper/x_dif 0 1 integrity:28:aead\n";
        assert!(names(t, "x_dif"));
        assert!(!names(t, "x"));
        assert!(names("0 8 linear x_dif 0\n", "x_dif"));
        assert!(!names("0 8 linear /dev/mapper/x_dif2 0\n", "x_dif"));
        assert!(names("0 8 delay a 0 1 b 0 2 x_dif 0 3\n", "x_dif"));
        assert!(names(
            "0 8 integrity d 0 4 J 1 meta_device:x_dif\n",
            "x_dif"
        ));
        assert!(!names("0 8 zero\n", "x_dif"));
    }

    #[test]
    fn inline_keys_are_spotted_in_crypt_and_integrity_lines() {
        let cases = [
            ("0 8 crypt aes-xts-plain64 00ff 0 /dev/x 0\n", true),
            ("0 8 crypt cipher_null-ecb - 0 /dev/x 0\n", false),
            (
                "0 8 crypt aes-xts-plain64 :64:logon:cryptsetup:x 0 /dev/x 0\n",
                false,
            ),
            (
                "0 8 integrity /dev/x 0 32 J 1 internal_hash:hmac(sha256):0011\n",
                true,
            ),
            (
                "0 8 integrity /dev/x 0 32 J 2 internal_hash:crc32c journal_mac:hmac(sha1):aa\n",
                true,
            ),
            ("0 8 integrity /dev/x 0 4 J 1 internal_hash:crc32c\n", false),
            ("0 8 zero\n", false),
        ];
        for (text, keyed) in cases {
            assert_eq!(
                TableSpec::parse(text).unwrap().has_inline_keys(),
                keyed,
                "{text}"
            );
            assert_eq!(text_has_inline_keys(text), keyed, "{text}");
        }
        // Unparsable text: a malformed key field is still treated as a key.
        assert!(text_has_inline_keys(
            "0 8 crypt aes-xts-plain64 00f 0 /dev/x\n"
        ));
        assert!(!text_has_inline_keys("not a table"));
    }

    #[test]
    fn pipelines_follow_the_workqueue_flags() {
        let t = TableSpec::parse(
            "0 8 crypt aes-xts-plain64 00 0 /dev/x 0 1 no_read_workqueue\n\
             8 8 linear /dev/y 0\n\
             16 8 crypt aes-xts-plain64 00 0 /dev/z 0\n",
        )
        .unwrap();
        assert_eq!(
            t.crypt_pipelines(),
            vec![
                PipelineInfo {
                    start: 0,
                    read: "inline",
                    write: "queued",
                    flags: vec!["no_read_workqueue".into()],
                },
                PipelineInfo {
                    start: 16,
                    read: "queued",
                    write: "queued",
                    flags: vec![],
                },
            ]
        );
    }

    #[test]
    fn keys_are_masked_unless_shown() {
        let mut c = CryptConfig::new(
            "aes-xts-plain64",
            CryptKey::Hex(SecretBytes::from_slice(&[0xab; 4])),
            0,
            "/dev/x",
            8,
        );
        c.flags.sector_size = 4096;
        let t = TableSpec::single(64, c);
        assert_eq!(
            *t.to_text(false),
            "0 64 crypt aes-xts-plain64 00000000 0 /dev/x 8 1 sector_size:4096\n"
        );
        assert_eq!(
            *t.to_text(true),
            "0 64 crypt aes-xts-plain64 abababab 0 /dev/x 8 1 sector_size:4096\n"
        );
        assert_eq!(TableSpec::parse(&t.to_text(true)).unwrap(), t);
    }

    #[test]
    fn lines_are_appended_contiguously() {
        let mut t = TableSpec::single(8, ZeroConfig);
        t.push(
            16,
            LinearConfig {
                device: "/dev/x".into(),
                offset: 2,
            },
        );
        t.push(4, ErrorConfig);
        assert_eq!(
            *t.to_text(false),
            "0 8 zero\n8 16 linear /dev/x 2\n24 4 error\n"
        );
        assert_eq!(t.len_sectors(), 28);
    }

    #[test]
    fn errors_name_the_line_and_target() {
        let e = TableSpec::parse("0 8 zero\n8 8 crypt aes-xts-plain64 zz 0 /dev/x 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("table line 2: crypt target: invalid key"),
            "{e}"
        );
        assert!(!e.contains("zz"), "{e}");
        let e = TableSpec::parse("0 8 mirror a\n").unwrap_err().to_string();
        assert!(e.contains("unknown target type 'mirror'"), "{e}");
        assert!(TableSpec::parse("0 8 zero\n16 8 zero\n").is_err());
    }

    #[test]
    fn integrity_lines_are_typed() {
        let t = TableSpec::parse(
            "0 7424 integrity 7:0 0 4 B 6 block_size:4096 buffer_sectors:64 \
             sectors_per_bit:1024 bitmap_flush_interval:500 fix_padding internal_hash:crc32c\n",
        )
        .unwrap();
        let i = t.integrity_lines().next().unwrap();
        assert_eq!(i.mode, IntegrityMode::Bitmap);
        assert_eq!(i.block_size, Some(4096));
        assert_eq!(i.sectors_per_bit, Some(1024));
        assert_eq!(i.journal_sectors, None);
        assert_eq!(i.internal_hash.as_ref().unwrap().name, "crc32c");
        let c = i.to_config();
        assert_eq!((c.buffer_sectors, c.interleave_sectors), (64, 32768));
    }
}
