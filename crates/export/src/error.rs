//! Errors of the export layer.

use std::io;

/// Why an export could not be started or stopped cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An operating-system call failed while doing `context`.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The configuration cannot be served (bad block sizes, path in use, ...).
    #[error("{0}")]
    Config(String),
}

impl ExportError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        ExportError::Io {
            context: context.into(),
            source,
        }
    }
}
