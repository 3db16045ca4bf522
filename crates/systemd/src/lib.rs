//! cryptblk under systemd.
//!
//! - [`generator`]: `cryptblk-generator`, a systemd generator that turns the crypttab lines
//!   carrying `x-cryptblk.export=` into `cryptblk@NAME.service` units ([`crypttab`] reads
//!   the file, [`plan`] maps its options to `cryptblk open`, [`unit`] writes the unit,
//!   [`escape`] is systemd's unit-name escaping);
//! - [`notify`]: sd_notify for `cryptblk open --foreground` (READY=1 once the export accepts
//!   I/O, STATUS=, STOPPING=1, WATCHDOG=1).

pub mod crypttab;
pub mod escape;
pub mod generator;
pub mod notify;
pub mod plan;
pub mod tang;
pub mod timespan;
pub mod unit;
