//! How a table being loaded reaches its devices, and the settings it is loaded with.
//!
//! Tables, targets and the registry all depend on this module and it depends on none of
//! them, which keeps the crate's module graph free of cycles (mapping -> table -> resolver,
//! registry -> mapping/table/resolver).

use std::sync::Arc;

use crate::device::BlockDevice;
use crate::error::DmError;

/// Opens the devices a table names: nothing else (load settings travel in [`LoadOptions`]).
pub trait DeviceResolver: Send + Sync {
    /// Opens (or reuses) the device `spec`.
    fn open_device(&self, spec: &str) -> Result<Arc<dyn BlockDevice>, DmError>;
}

/// Settings a table is loaded with, handed to every target constructor through
/// [`crate::targets::BuildContext`]. Targets read the fields that concern them and ignore
/// the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Whether the table is loaded read-only (the kernel's `dm_table_get_mode` without
    /// write): targets that would otherwise write while loading (dm-integrity's format,
    /// journal replay, bitmap) must not.
    pub read_only: bool,
    /// Cipher implementation crypt targets use (a name from `cryptblk ciphers`; `None` =
    /// the fastest available).
    pub cipher_implementation: Option<String>,
}
