//! Errors as the user sees them: one line naming the problem, and cryptsetup's exit codes
//! (cryptsetup(8) RETURN CODES) so scripts written for cryptsetup keep working.

use std::fmt;

/// cryptsetup's return codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCode {
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

/// A failed action: what to print and how to exit.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: ExitCode,
    /// The message, one line, no secrets.
    pub message: String,
}

impl Failure {
    /// A failure with the given code and message.
    pub fn new(code: ExitCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// Wrong parameters (exit 1).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ExitCode::WrongParameters, message)
    }

    /// Wrong or unusable device (exit 4).
    pub fn device(message: impl Into<String>) -> Self {
        Self::new(ExitCode::WrongDevice, message)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => ExitCode::WrongDevice,
            std::io::ErrorKind::PermissionDenied => ExitCode::NoPermission,
            std::io::ErrorKind::OutOfMemory => ExitCode::OutOfMemory,
            std::io::ErrorKind::AlreadyExists => ExitCode::Busy,
            _ => ExitCode::WrongDevice,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<cryptblk_cipher::CipherError> for Failure {
    fn from(e: cryptblk_cipher::CipherError) -> Self {
        Failure::usage(e.to_string())
    }
}

/// Result of an action.
pub type ActionResult = Result<(), Failure>;
