//! Errors as the user sees them: one line naming the problem, and cryptsetup's exit codes
//! (cryptsetup(8) RETURN CODES) so scripts written for cryptsetup keep working. The library's
//! [`cryptblk_volume::VolumeError`] carries the class; the binary only prints and exits.

pub use cryptblk_volume::{ErrorClass as ExitCode, VolumeError as Failure};

/// Result of an action.
pub type ActionResult = Result<(), Failure>;
