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
use std::sync::Arc;

use crate::device::BlockDevice;
use crate::registry::DeviceResolver;
use crate::table::TableLine;
use crate::SECTOR_SIZE;

/// A target instance built from one table line.
pub trait Target: BlockDevice {
    /// The target type name as written in tables (`linear`, `crypt`, ...).
    fn target_type(&self) -> &'static str;
    /// The target's arguments as the kernel prints them in `dmsetup table`; keys are masked
    /// with zeros unless `show_keys` (like `dmsetup table --showkeys`).
    fn table_params(&self, show_keys: bool) -> String;
    /// The target's `dmsetup status` arguments.
    fn status_params(&self) -> String {
        String::new()
    }
    /// For downcasting to the concrete target (test hooks, crypt counters).
    fn as_any(&self) -> &dyn Any;
}

/// Everything a target constructor may need besides its arguments.
pub struct BuildContext<'a> {
    /// Opens the devices named in the arguments.
    pub resolver: &'a dyn DeviceResolver,
    /// The table line being built.
    pub line: &'a TableLine,
}

impl BuildContext<'_> {
    /// Target length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.line.len * SECTOR_SIZE
    }

    /// Opens `spec` and checks that `offset_sectors + len` fits inside it.
    pub fn open_device(
        &self,
        spec: &str,
        offset_sectors: u64,
    ) -> Result<Arc<dyn BlockDevice>, String> {
        let dev = self.resolver.open_device(spec).map_err(|e| e.to_string())?;
        let need = offset_sectors
            .checked_add(self.line.len)
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

/// Builds the target named by a table line.
pub fn build_target(ctx: &BuildContext<'_>) -> Result<Arc<dyn Target>, String> {
    let args = &ctx.line.args;
    Ok(match ctx.line.target_type.as_str() {
        "linear" => Arc::new(linear::LinearTarget::from_args(ctx, args)?),
        "zero" => Arc::new(zero::ZeroTarget::from_args(ctx, args)?),
        "error" => Arc::new(error::ErrorTarget::from_args(ctx, args)?),
        "delay" => Arc::new(delay::DelayTarget::from_args(ctx, args)?),
        "flakey" => Arc::new(flakey::FlakeyTarget::from_args(ctx, args)?),
        "crypt" => Arc::new(crate::targets::crypt::CryptTarget::from_args(ctx, args)?),
        "verity" => Arc::new(verity::VerityTarget::from_args(ctx, args)?),
        "integrity" => Arc::new(integrity::IntegrityTarget::from_args(ctx, args)?),
        other => {
            return Err(format!(
                "unknown target type '{other}' (known: linear crypt zero error delay flakey)"
            ))
        }
    })
}
