//! Errors as a caller sees them: one line naming the problem, and the class cryptsetup's exit
//! code reports for it (cryptsetup(8) RETURN CODES), so the CLI exits as cryptsetup does.

use std::fmt;

/// cryptsetup's error classes, numbered as its exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Wrong parameters, or an operation that is not possible.
    WrongParameters = 1,
    /// No permission, or a passphrase that opens no keyslot.
    NoPermission = 2,
    /// Out of memory.
    OutOfMemory = 3,
    /// Wrong device specified (missing, not LUKS, too small, corrupt header).
    WrongDevice = 4,
    /// The device already exists or is busy.
    Busy = 5,
}

impl ErrorClass {
    /// The class of cryptsetup exit code `code`; unknown codes are [`ErrorClass::WrongDevice`].
    pub fn from_code(code: i64) -> Self {
        match code {
            1 => ErrorClass::WrongParameters,
            2 => ErrorClass::NoPermission,
            3 => ErrorClass::OutOfMemory,
            5 => ErrorClass::Busy,
            _ => ErrorClass::WrongDevice,
        }
    }
}

/// A failed library call: its class and a one-line message that never holds a secret.
#[derive(Debug)]
pub struct VolumeError {
    /// The error class (cryptsetup's exit code).
    pub code: ErrorClass,
    /// The message, one line, no secrets; empty when there is nothing to print.
    pub message: String,
}

/// Result of a library call.
pub type Result<T, E = VolumeError> = std::result::Result<T, E>;

impl VolumeError {
    /// An error with the given class and message.
    pub fn new(code: ErrorClass, message: impl Into<String>) -> Self {
        VolumeError {
            code,
            message: message.into(),
        }
    }

    /// Wrong parameters (exit 1).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::WrongParameters, message)
    }

    /// Wrong or unusable device (exit 4).
    pub fn device(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::WrongDevice, message)
    }

    /// Busy or already existing (exit 5).
    pub fn busy(message: impl Into<String>) -> Self {
        Self::new(ErrorClass::Busy, message)
    }
}

impl fmt::Display for VolumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for VolumeError {}

impl From<std::io::Error> for VolumeError {
    fn from(e: std::io::Error) -> Self {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorClass::WrongDevice,
            std::io::ErrorKind::PermissionDenied => ErrorClass::NoPermission,
            std::io::ErrorKind::OutOfMemory => ErrorClass::OutOfMemory,
            std::io::ErrorKind::AlreadyExists => ErrorClass::Busy,
            _ => ErrorClass::WrongDevice,
        };
        VolumeError::new(code, e.to_string())
    }
}

impl From<cryptblk_cipher::CipherError> for VolumeError {
    fn from(e: cryptblk_cipher::CipherError) -> Self {
        VolumeError::usage(e.to_string())
    }
}

impl From<cryptblk_format::FormatError> for VolumeError {
    fn from(e: cryptblk_format::FormatError) -> Self {
        use cryptblk_format::FormatError;
        let code = match &e {
            FormatError::WrongPassphrase | FormatError::VolumeKeyMismatch => {
                ErrorClass::NoPermission
            }
            FormatError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ErrorClass::WrongDevice
            }
            FormatError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                ErrorClass::NoPermission
            }
            FormatError::TooSmall(_) => ErrorClass::WrongDevice,
            _ => ErrorClass::WrongParameters,
        };
        VolumeError::new(code, e.to_string())
    }
}
