//! The volume library: what cryptsetup's `lib/setup.c` is to cryptsetup.
//!
//! It probes a device or image, unlocks it into a typed activation plan, builds the dm stack
//! from typed target configs, and performs operations on active volumes through the daemon
//! that serves them. Errors are [`VolumeError`]s carrying cryptsetup's exit class as data; the
//! `cryptblk` binary only maps them to exit codes and prints them.

pub mod error;

pub use error::{ErrorClass, Result, VolumeError};
