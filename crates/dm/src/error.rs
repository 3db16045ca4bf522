//! Errors from building tables, resolving devices and managing mappings.
//!
//! I/O errors on a live device stay `io::Error`s carrying the kernel's errno (see
//! [`crate::BlockDevice`]); [`DmError`] is for the control plane (table load, registry).

use std::io;

/// A control-plane failure: bad table, missing device, busy mapping.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    /// A table line is malformed or its target rejected its arguments.
    #[error("table line {line}: {msg}")]
    Table {
        /// 1-based line number in the table text.
        line: usize,
        /// What is wrong, naming the offending field.
        msg: String,
    },
    /// The table as a whole is unusable (empty, not contiguous).
    #[error("table: {0}")]
    TableShape(String),
    /// A device named in a table could not be opened.
    #[error("device '{spec}': {source}")]
    Device {
        /// The device as written in the table.
        spec: String,
        /// Why opening it failed.
        #[source]
        source: io::Error,
    },
    /// A size string such as `4G` could not be parsed.
    #[error("invalid size '{0}' (expected <n>[K|M|G|T|s], a multiple of 512 bytes)")]
    Size(String),
    /// No mapping by that name.
    #[error("mapping '{0}' does not exist")]
    NoSuchMapping(String),
    /// A mapping by that name already exists.
    #[error("mapping '{0}' already exists")]
    MappingExists(String),
    /// The mapping is in use and cannot be removed.
    #[error("mapping '{0}' is busy ({1})")]
    Busy(String, String),
    /// `resume` was asked to swap tables but none was staged, or a state change is invalid.
    #[error("mapping '{name}': {msg}")]
    State {
        /// Mapping name.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// The cipher layer refused the specification or key.
    #[error("cipher: {0}")]
    Cipher(#[from] cryptblk_cipher::CipherError),
}

impl DmError {
    /// Shorthand for a [`DmError::Table`] error.
    pub fn table(line: usize, msg: impl Into<String>) -> Self {
        DmError::Table {
            line,
            msg: msg.into(),
        }
    }

    /// The errno the kernel's dm ioctl would report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            DmError::Device { source, .. } => source.raw_os_error().unwrap_or(libc::ENODEV),
            DmError::NoSuchMapping(_) => libc::ENXIO,
            DmError::MappingExists(_) | DmError::Busy(..) => libc::EBUSY,
            _ => libc::EINVAL,
        }
    }
}

/// Builds an `io::Error` from an errno.
pub(crate) fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}
