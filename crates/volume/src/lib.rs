//! The volume library: what cryptsetup's `lib/setup.c` is to cryptsetup.
//!
//! It probes a device or image ([`probe`]), loads and unlocks a LUKS header ([`Volume`]),
//! turns the unlocked volume into the dm tables that map it ([`Segment`],
//! [`luks2_integrity`]), formats new headers ([`format`]), and changes headers in place
//! (keyslots, UUID, label, backup, restore, convert, repair). Errors are [`VolumeError`]s
//! carrying cryptsetup's exit class as data; the `cryptblk` binary only maps them to exit
//! codes and prints them. Long operations report to a [`Progress`]; the library never
//! touches a terminal.
//!
//! ```no_run
//! use cryptblk_volume::{format, LuksType, Volume};
//! use cryptblk_format::luks2::{FormatParams, UnlockPurpose};
//! use cryptblk_dm::{BlockDevice, Registry};
//! # fn main() -> cryptblk_volume::Result<()> {
//! // Create: a LUKS2 header with one keyslot on an image file.
//! let img = std::path::Path::new("vol.img");
//! std::fs::File::create(img)?.set_len(64 << 20)?;
//! let dev = std::fs::OpenOptions::new().read(true).write(true).open(img)?;
//! let req = format::FormatRequest::Luks2(Box::new(FormatParams::default()));
//! format::format_header(&dev, &req, b"passphrase")?;
//!
//! // Open: unlock a keyslot, build the crypt table, map it in process.
//! let vol = Volume::load(img, LuksType::Any, false)?;
//! let (_slot, key) = vol.unlock(b"passphrase", None, UnlockPurpose::Activate)?;
//! let table = vol.segment()?.crypt_table(&key, img, &[])?;
//! let registry = Registry::new();
//! let mapping = registry.create("vol", &table).map_err(|e| cryptblk_volume::VolumeError::device(e.to_string()))?;
//!
//! // Read a sector, then close.
//! let mut sector = vec![0u8; 4096];
//! mapping.read_at(0, &mut sector)?;
//! drop(mapping);
//! registry.remove("vol").map_err(|e| cryptblk_volume::VolumeError::device(e.to_string()))?;
//! # Ok(()) }
//! ```

pub mod activation;
pub mod bitlk;
pub mod blkid;
pub mod control;
pub mod device;
pub mod error;
pub mod facts;
pub mod format;
pub mod fvault2;
pub mod integrity;
pub mod keyslots;
pub mod lock;
pub mod loopaes;
pub mod luks;
pub mod luks2_integrity;
pub mod metrics;
pub mod offline;
pub mod plan;
pub mod probe;
pub mod progress;
pub mod reencrypt;
pub mod resize;
pub mod segment;
pub mod serve;
pub mod suspend;
pub mod tcrypt;
pub mod token;
pub mod verity;

pub use error::{ErrorClass, Result, VolumeError};
pub use luks::{LuksType, Volume};
pub use probe::{probe, VolumeKind};
pub use progress::{NoProgress, Progress};
pub use segment::Segment;
