//! Targets: the per-line mappings of a dm table (`linear`, `crypt`, `zero`, ...).
//!
//! A target is a [`BlockDevice`] whose offset 0 is its table line's `<start>`: the table
//! passes target-relative offsets, like the kernel's `bi_sector - ti->begin`.

pub mod config;
pub mod crypt;
pub mod delay;
pub mod error;
pub mod flakey;
pub mod integrity;
pub mod linear;
pub mod verity;
pub mod zero;

use std::any::Any;
use std::io;
use std::sync::Arc;

use zeroize::Zeroizing;

use crate::device::BlockDevice;
use crate::resolver::{DeviceResolver, LoadOptions};
use crate::SECTOR_SIZE;
use config::TargetConfig;

/// Which of a target's two status texts is asked for (the kernel's `status_type_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusType {
    /// `dmsetup status`: the target's state and counters (`STATUSTYPE_INFO`).
    Info,
    /// `dmsetup table`: the arguments that rebuild the target (`STATUSTYPE_TABLE`); keys are
    /// masked with zeros unless `show_keys` (`dmsetup table --showkeys`).
    Table {
        /// Print key material instead of zeros.
        show_keys: bool,
    },
}

/// Counters and facts a target reports for monitoring: the typed side of
/// [`StatusType::Info`], so callers need not parse status text or know the target's type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetStats {
    /// The target type that reported them.
    pub target_type: &'static str,
    /// Counters by name, in the target's order (`reads`, `write_bytes`, ...).
    pub counters: Vec<(&'static str, u64)>,
    /// Descriptive facts by name (`read_pipeline`, `cipher_impl`, ...).
    pub facts: Vec<(&'static str, String)>,
}

impl TargetStats {
    /// The counter called `name`, if the target reports it.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find_map(|(n, v)| (*n == name).then_some(*v))
    }

    /// The fact called `name`, if the target reports it.
    pub fn fact(&self, name: &str) -> Option<&str> {
        self.facts
            .iter()
            .find_map(|(n, v)| (*n == name).then_some(v.as_str()))
    }

    /// True if the target reports nothing.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty() && self.facts.is_empty()
    }
}

/// A target instance built from one table line: the kernel's `target_type` operations.
///
/// Only [`Target::target_type`], [`Target::table_params`] and [`Target::as_any`] are
/// required; every other hook has a default that does what the kernel does for a target
/// leaving the operation unset.
///
/// A [`crate::Mapping`] calls the life-cycle hooks in the kernel's order: on suspend,
/// `presuspend` on every target while I/O still flows, then it waits for in-flight I/O to
/// drain, then `postsuspend`; on resume, `preresume` on every target of the table that
/// becomes live (any error aborts the resume and the device stays suspended), then
/// `resume`, then I/O is let through.
pub trait Target: BlockDevice {
    /// The target type name as written in tables (`linear`, `crypt`, ...).
    fn target_type(&self) -> &'static str;
    /// The target's arguments as the kernel prints them in `dmsetup table`; keys are masked
    /// with zeros unless `show_keys` (like `dmsetup table --showkeys`). The
    /// [`StatusType::Table`] hook of [`Target::status`].
    fn table_params(&self, show_keys: bool) -> String;
    /// The target's `dmsetup status` arguments: the [`StatusType::Info`] hook of
    /// [`Target::status`].
    fn status_params(&self) -> String {
        String::new()
    }
    /// The status text of `kind` (the kernel's `status` operation), dispatched to
    /// [`Target::status_params`] or [`Target::table_params`].
    fn status(&self, kind: StatusType) -> String {
        match kind {
            StatusType::Info => self.status_params(),
            StatusType::Table { show_keys } => self.table_params(show_keys),
        }
    }
    /// Handles `dmsetup message <dev> <sector> <argv...>` (the kernel's `message`
    /// operation); `Ok(Some(text))` is a reply to print. Targets without messages refuse
    /// every one, as the kernel does with `EINVAL`.
    fn message(&self, argv: &[&str]) -> Result<Option<String>, String> {
        let _ = argv;
        Err(format!(
            "target {} does not accept messages",
            self.target_type()
        ))
    }
    /// Called when a suspend starts, before in-flight I/O has drained.
    fn presuspend(&self) -> io::Result<()> {
        Ok(())
    }
    /// Called once the device is suspended and no I/O is in flight: the place to make the
    /// device clean (commit journals, write superblocks).
    fn postsuspend(&self) -> io::Result<()> {
        Ok(())
    }
    /// Called on the table about to go live before I/O resumes; an error keeps the device
    /// suspended (the kernel's `preresume`, e.g. dm-crypt refusing without a key).
    fn preresume(&self) -> io::Result<()> {
        Ok(())
    }
    /// Called on the live table after every `preresume` succeeded, before I/O resumes.
    fn resume(&self) {}
    /// Counters and facts for monitoring (empty by default).
    fn stats(&self) -> TargetStats {
        TargetStats::default()
    }
    /// For downcasting to the concrete target. Only tests and benches that built a target
    /// on purpose should use it; generic code goes through the hooks above.
    fn as_any(&self) -> &dyn Any;
}

/// Everything a target constructor may need besides its arguments.
pub struct BuildContext<'a> {
    /// Opens the devices named in the arguments.
    pub resolver: &'a dyn DeviceResolver,
    /// Settings the table is loaded with (read-only, cipher implementation).
    pub options: &'a LoadOptions,
    /// The target type named by the line.
    pub target_type: &'a str,
    /// Length of the line in sectors.
    pub len: u64,
    /// The line's arguments, whitespace-split.
    pub args: &'a [String],
}

impl BuildContext<'_> {
    /// Target length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len * SECTOR_SIZE
    }

    /// Opens `spec` and checks that `offset_sectors + len` fits inside it.
    pub fn open_device(
        &self,
        spec: &str,
        offset_sectors: u64,
    ) -> Result<Arc<dyn BlockDevice>, String> {
        let dev = self.resolver.open_device(spec).map_err(|e| e.to_string())?;
        let need = offset_sectors
            .checked_add(self.len)
            .and_then(|s| s.checked_mul(SECTOR_SIZE))
            .ok_or_else(|| "offset + length overflows".to_string())?;
        if need > dev.size() {
            return Err(format!(
                "device {spec} too small for target: needs {} sectors, has {}",
                need / SECTOR_SIZE,
                dev.size() / SECTOR_SIZE
            ));
        }
        Ok(dev)
    }
}

/// Parses argument `index` as an unsigned integer, naming it in the error.
pub(crate) fn arg_u64(args: &[String], index: usize, name: &str) -> Result<u64, String> {
    let text = args
        .get(index)
        .ok_or_else(|| format!("missing argument <{name}>"))?;
    text.parse::<u64>()
        .map_err(|_| format!("invalid <{name}> '{text}' (expected an unsigned integer)"))
}

/// Parses argument `index` as a u32, naming it in the error.
pub(crate) fn arg_u32(args: &[String], index: usize, name: &str) -> Result<u32, String> {
    let v = arg_u64(args, index, name)?;
    u32::try_from(v).map_err(|_| format!("<{name}> {v} is too large"))
}

/// Checks the argument count is within `min..=max`.
pub(crate) fn expect_args(
    args: &[String],
    min: usize,
    max: usize,
    usage: &str,
) -> Result<(), String> {
    if args.len() < min || args.len() > max {
        return Err(format!(
            "wrong number of arguments ({}); usage: {usage}",
            args.len()
        ));
    }
    Ok(())
}

/// A target type: its table name and constructor (the kernel's `dm_register_target`).
pub struct TargetType {
    /// The name tables use (`linear`, `crypt`, ...).
    pub name: &'static str,
    /// Builds a target from the line in the context.
    pub build: fn(&BuildContext<'_>) -> Result<Arc<dyn Target>, String>,
}

/// The registry of target types: one line per target, `Variant(TargetType, ConfigType):
/// "doc line",` (the target's table name is the config's [`TargetConfig::TYPE`]). It
/// generates [`TARGET_TYPES`] (the constructors), the [`TargetSpec`] enum with one variant
/// per config, its `parse`/`target_type`/`args`/`devices`/`has_inline_keys` dispatch, the
/// `From<Config>` impls and [`SpecConfig`]; every per-target behaviour comes from the config's
/// [`TargetConfig`] methods or the target's `from_args`, so the macro holds no target's code.
macro_rules! targets {
    ($( $variant:ident($target:ty, $config:ty) : $doc:literal, )*) => {
        /// Every target type, in registry order: its table name and constructor.
        pub const TARGET_TYPES: &[TargetType] = &[
            $(
                TargetType {
                    name: <$config as TargetConfig>::TYPE,
                    build: |c| Ok(Arc::new(<$target>::from_args(c, c.args)?)),
                },
            )*
        ];

        /// The target of one table line, with its arguments as a config (one variant per
        /// registered target type).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum TargetSpec {
            $(
                #[doc = $doc]
                $variant($config),
            )*
        }

        impl TargetSpec {
            /// Parses the arguments of a `target_type` line; an unknown type's error lists
            /// the known ones.
            pub fn parse(target_type: &str, args: &[String]) -> Result<TargetSpec, String> {
                $(
                    if target_type == <$config as TargetConfig>::TYPE {
                        return Ok(TargetSpec::$variant(<$config as TargetConfig>::parse(args)?));
                    }
                )*
                Err(unknown_target_type(target_type))
            }

            /// The target type name (`crypt`, ...).
            pub fn target_type(&self) -> &'static str {
                match self {
                    $(TargetSpec::$variant(_) => <$config as TargetConfig>::TYPE,)*
                }
            }

            /// The arguments as `dmsetup table` prints them (keys masked unless
            /// `show_keys`).
            pub fn args(&self, show_keys: bool) -> Zeroizing<Vec<String>> {
                match self {
                    $(TargetSpec::$variant(c) => c.args(show_keys),)*
                }
            }

            /// The devices the line names, as written (`/dev/sdb`, `x_dif`, `ram:1G`).
            pub fn devices(&self) -> Vec<&str> {
                match self {
                    $(TargetSpec::$variant(c) => c.devices(),)*
                }
            }

            /// True if the line carries key material: a crypt hex key, or an integrity
            /// `internal_hash:`/`journal_crypt:`/`journal_mac:` with a key.
            pub fn has_inline_keys(&self) -> bool {
                match self {
                    $(TargetSpec::$variant(c) => c.has_inline_keys(),)*
                }
            }
        }

        $(
            impl From<$config> for TargetSpec {
                fn from(c: $config) -> Self {
                    TargetSpec::$variant(c)
                }
            }

            impl SpecConfig for $config {
                fn of(spec: &TargetSpec) -> Option<&Self> {
                    if let TargetSpec::$variant(c) = spec {
                        Some(c)
                    } else {
                        None
                    }
                }
                fn of_mut(spec: &mut TargetSpec) -> Option<&mut Self> {
                    if let TargetSpec::$variant(c) = spec {
                        Some(c)
                    } else {
                        None
                    }
                }
            }
        )*
    };
}

// The registry: adding a target is its module plus one line here.
targets! {
    Linear(linear::LinearTarget, config::LinearConfig): "`linear`.",
    Zero(zero::ZeroTarget, config::ZeroConfig): "`zero`.",
    Error(error::ErrorTarget, config::ErrorConfig): "`error`.",
    Delay(delay::DelayTarget, config::DelayConfig): "`delay`.",
    Flakey(flakey::FlakeyTarget, config::FlakeyConfig): "`flakey`.",
    Crypt(crypt::CryptTarget, crypt::CryptConfig): "`crypt`.",
    Verity(verity::VerityTarget, verity::VerityTableConfig): "`verity`.",
    Integrity(integrity::IntegrityTarget, integrity::IntegrityTableConfig): "`integrity`.",
}

/// A config type that is one of [`TargetSpec`]'s variants, so generic code can pick out the
/// lines of one target type ([`TargetSpec::config`]). Implemented by the `targets!`
/// registry for every registered config.
pub trait SpecConfig: TargetConfig + Into<TargetSpec> {
    /// The config inside `spec`, if `spec` is this type's variant.
    fn of(spec: &TargetSpec) -> Option<&Self>;
    /// The config inside `spec` to change, if `spec` is this type's variant.
    fn of_mut(spec: &mut TargetSpec) -> Option<&mut Self>;
}

/// The error for a table line naming no registered target type.
fn unknown_target_type(name: &str) -> String {
    format!(
        "unknown target type '{name}' (known: {})",
        target_type_names().join(" ")
    )
}

/// The names of every target type, in registry order (for help and error text).
pub fn target_type_names() -> Vec<&'static str> {
    TARGET_TYPES.iter().map(|t| t.name).collect()
}

/// Builds the target named by a table line through [`TARGET_TYPES`].
pub fn build_target(ctx: &BuildContext<'_>) -> Result<Arc<dyn Target>, String> {
    let name = ctx.target_type;
    match TARGET_TYPES.iter().find(|t| t.name == name) {
        Some(t) => (t.build)(ctx),
        None => Err(unknown_target_type(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The constructor registry and the typed lines come from the same `targets!` line, so
    // every buildable type must also parse as a spec of that type, and both unknown-type
    // errors list the same names.
    #[test]
    fn every_constructor_has_a_spec_of_its_type() {
        for t in TARGET_TYPES {
            match TargetSpec::parse(t.name, &[]) {
                Ok(spec) => assert_eq!(spec.target_type(), t.name),
                Err(e) => assert!(!e.contains("unknown target type"), "{}: {e}", t.name),
            }
        }
        assert_eq!(
            TargetSpec::parse("mirror", &[]).unwrap_err(),
            "unknown target type 'mirror' \
             (known: linear zero error delay flakey crypt verity integrity)"
        );
    }
}
