//! Serving an open volume: the daemon that keeps a mapping alive and exports it, as a
//! library, so any program that embeds `cryptblk_volume` can serve a volume. The `cryptblk`
//! binary runs it in its own process (`cryptblk __serve`); starting that process, handing it
//! the spec through a pipe, and its stdio are the binary's.
//!
//! A program serves a volume by building an [`ActivationPlan`](crate::plan::ActivationPlan)
//! (e.g. [`plan::luks`](crate::plan::luks) after unlocking), turning it into a [`ServeSpec`]
//! with an [`ExportConfig`] (the export crate's, re-exported here), and calling [`serve_stack`], which returns when the volume is
//! closed (`cryptblk close NAME`, a control request, or SIGTERM/SIGINT/SIGHUP):
//!
//! ```no_run
//! use cryptblk_format::luks2::UnlockPurpose;
//! use cryptblk_volume::plan::{self, LuksLocation};
//! use cryptblk_export::nbd::NbdConfig;
//! use cryptblk_volume::serve::{serve_stack, ExportConfig, ServeSpec};
//! use cryptblk_volume::LuksType;
//! use std::path::Path;
//!
//! # fn main() -> Result<(), cryptblk_volume::VolumeError> {
//! let device = Path::new("/srv/disk.img");
//! let vol = cryptblk_volume::Volume::load(device, LuksType::Any, false)?;
//! let (_slot, key) = vol.unlock(b"passphrase", None, UnlockPurpose::Activate)?;
//! let at = LuksLocation { device, header: device };
//! let plan = plan::luks(&vol, &key, at, "data", &Default::default())?;
//! let export = ExportConfig::Nbd(NbdConfig::unix("/run/data.sock"));
//! let (spec, keyed_lower) = ServeSpec::from_plan(plan, export, false);
//! serve_stack(spec, keyed_lower, |ready| println!("serving {}", ready.describe()))?;
//! # Ok(())
//! # }
//! ```
//!
//! One daemon may serve a stack: lower mappings (a LUKS2 `--integrity` volume's
//! `<name>_dif`, or `dm create --lower` tables) live in the same registry under the exported
//! top one, and each answers on its own control socket, so `dm ls|table|status|remove` see
//! every mapping under its own name, as in the kernel.
//!
//! Modules, one job each (each states its invariants): [`spec`] says what is served,
//! [`export`] which export and how it starts, `stack` builds and tears down the mappings and
//! the export, `control` answers control requests and turns termination signals into
//! `close`, [`devlink`] names a ublk device `/dev/cryptblk/NAME`, [`facts`] is what a daemon
//! reports once it serves, [`upgrade`] hands a stack over to a successor process, and
//! `run` is the entry point, [`serve_stack`].
//!
//! No module here imports its parent: each takes what it needs from its siblings.

mod control;
pub mod devlink;
pub mod export;
pub mod facts;
mod run;
pub mod spec;
mod stack;
pub mod upgrade;

pub use cryptblk_export::ExportConfig;
pub use export::start_export;
pub use facts::ReadyFacts;
pub use run::{serve_stack, serve_stack_upgradable, serve_stack_with};
pub use spec::{check_stack, LowerTable, ServeSpec};
pub use upgrade::{HandedFd, Handover, Inherited, Succession, Successor, TakeOverHook};
