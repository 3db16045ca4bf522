//! The error type shared by every on-disk format (LUKS1, LUKS2, plain) and its helpers.

use cryptblk_cipher::CipherError;
use std::io;

/// Everything that can go wrong while reading, unlocking or changing a volume.
///
/// Messages name the problem (which keyslot, which field, which limit) but never contain a
/// passphrase or key byte.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Reading or writing the device (or a header/key file) failed.
    #[error("I/O error while {context}: {source}")]
    Io {
        /// What was being done ("reading LUKS header", ...).
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A cipher or hash could not be set up.
    #[error(transparent)]
    Cipher(#[from] CipherError),
    /// The device carries no header of the expected kind (bad magic).
    #[error("device is not a valid LUKS device")]
    NotLuks,
    /// A LUKS header with a version this code does not handle.
    #[error("unsupported LUKS version {0}")]
    UnsupportedVersion(u32),
    /// The header is structurally damaged or was crafted to overwrite data (names the rule).
    #[error("header corrupted: {0}")]
    Corrupt(String),
    /// The device (or header file) is smaller than the header claims to need.
    #[error("device is too small: {0}")]
    TooSmall(String),
    /// No keyslot accepted the passphrase although at least one was tried
    /// (cryptsetup: EPERM, exit code 2).
    #[error("No key available with this passphrase.")]
    WrongPassphrase,
    /// No active keyslot could be tried at all (cryptsetup: ENOENT, exit code 1). Without a
    /// detail (no keyslot named) the text is cryptsetup's.
    #[error("{}", no_keyslot_text(.0))]
    NoKeyslot(String),
    /// The requested keyslot number is out of range or its metadata is invalid.
    #[error("keyslot {slot} is invalid: {reason}")]
    InvalidKeyslot {
        /// Keyslot number.
        slot: usize,
        /// Why.
        reason: String,
    },
    /// The keyslot to be written is already in use.
    #[error("keyslot {0} is already active, remove it first")]
    KeyslotActive(usize),
    /// Every keyslot is in use.
    #[error("all keyslots are full")]
    KeyslotsFull,
    /// A supplied volume key does not match the header's digest (cryptsetup: EPERM, exit
    /// code 2, with this message).
    #[error("Volume key does not match the volume.")]
    VolumeKeyMismatch,
    /// A caller-supplied parameter is unusable (message says which).
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// A key file or passphrase could not be read as requested.
    #[error("key file: {0}")]
    KeyFile(String),
    /// A passphrase or key was asked from a pipe, file or key file that held nothing
    /// (cryptsetup's message; a caller that may go on without the key tells it apart).
    #[error("Nothing to read on input.")]
    NothingToRead,
    /// PBKDF parameters cryptsetup refuses (its lines, printed as they are).
    #[error("{0}")]
    PbkdfRefused(String),
    /// A volume key file (`--volume-key-file`) cannot be opened (cryptsetup's message).
    #[error("Cannot read keyfile {0}.")]
    UnreadableKeyFile(String),
    /// A volume key file (`--volume-key-file`) holds fewer bytes than the volume key needs
    /// (cryptsetup's message).
    #[error("Cannot read {bytes} bytes from keyfile {path}.")]
    ShortVolumeKeyFile {
        /// Bytes the key needs.
        bytes: usize,
        /// The file as the user named it.
        path: String,
    },
    /// The key derivation function failed or was given unusable parameters.
    #[error("key derivation failed: {0}")]
    Kdf(String),
    /// An operation that the format does not (yet) support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The header carries a requirement (a LUKS2 reencryption in progress) that forbids
    /// this operation; the message is cryptsetup's, printed as is.
    #[error("{0}")]
    Incompatible(String),
}

impl FormatError {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        FormatError::Io {
            context: context.into(),
            source,
        }
    }

    /// The process exit code cryptsetup uses for the same condition
    /// (cryptsetup(8) RETURN CODES: 1 wrong parameters, 2 no permission / bad passphrase,
    /// 3 out of memory, 4 wrong device specified, 5 device already exists or busy).
    pub fn exit_code(&self) -> i32 {
        match self {
            FormatError::WrongPassphrase | FormatError::VolumeKeyMismatch => 2,
            FormatError::Io { source, .. } => match source.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => 4,
                io::ErrorKind::OutOfMemory => 3,
                _ => 1,
            },
            _ => 1,
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// [`FormatError::NoKeyslot`]'s text: cryptsetup's "No usable keyslot is available." when no
/// keyslot was named, else which one was not usable.
fn no_keyslot_text(detail: &str) -> String {
    if detail.is_empty() {
        "No usable keyslot is available.".to_string()
    } else {
        format!("no active keyslot available{detail}")
    }
}
