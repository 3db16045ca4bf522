//! The one interface a daemon needs from every export, and the registry that starts them.
//!
//! Every export kind is a module with a config type (implementing [`StartExport`]), a running
//! export (implementing [`Export`]) and a description type (its `describe` answer), plus one
//! line in the `exports!` invocation in `lib.rs`, which generates
//! [`ExportConfig`](crate::ExportConfig), [`ExportDescription`](crate::ExportDescription) and
//! [`start`](crate::start) from those lines.

use std::sync::Arc;

use cryptblk_dm::device::BlockDevice;

use crate::error::ExportError;
use crate::ExportDescription;

/// A running export of one [`BlockDevice`], as the daemon drives it: describe it to
/// clients, tell it that the device changed size, stop it.
///
/// An export is ready when its constructor (or [`crate::start`]) returns. Dropping one
/// without [`Export::stop`] stops it too, ignoring errors.
pub trait Export: Send {
    /// Where clients find the export; serialises to the daemon's `export` JSON object
    /// (`{"kind":"nbd","uri":...}` and so on).
    fn describe(&self) -> ExportDescription;

    /// Tells the export that its device now has `new_size` bytes. Call it after the device
    /// already reports that size (exports read the size from the device; this notifies the
    /// clients that cache it). Fails with [`ExportError::Config`] if the device reports
    /// another size or one the export cannot serve.
    fn resized(&self, new_size: u64) -> Result<(), ExportError>;

    /// How many clients use the device through this export right now: open NBD
    /// connections, opens of the FUSE file (a loop device over it holds one), an attached
    /// vhost-user frontend, or, for ublk, 1 while `/dev/ublkbN` is claimed (mounted, held by
    /// another block device, or opened exclusively). The daemon refuses `close` while it is
    /// not 0, as the kernel refuses to remove a device someone holds open; a user that just
    /// left may still be counted for a few milliseconds while the export notices.
    fn users(&self) -> usize;

    /// Stops accepting new clients and requests, lets requests in flight finish, and
    /// flushes the device. On an error the export is torn down as on drop.
    fn stop(self: Box<Self>) -> Result<(), ExportError>;

    /// Stops serving so that a successor process can take the device over: the block device
    /// stays (ublk user recovery) or clients reconnect (NBD, vhost-user). Default: `stop`.
    fn hand_over(self: Box<Self>) -> Result<(), ExportError> {
        self.stop()
    }

    /// Announces a hand-over whose successor takes the device over only once this process
    /// has exited (ublk: the kernel lets a new server start user recovery only then), so the
    /// successor waits for this process instead of leaving a live device alone. The export
    /// keeps serving; [`Export::cancel_hand_over`] withdraws the announcement. Default: nothing
    /// to announce.
    fn prepare_hand_over(&self) -> Result<(), ExportError> {
        Ok(())
    }

    /// Withdraws [`Export::prepare_hand_over`] (the successor failed before taking over).
    fn cancel_hand_over(&self) {}

    /// True when a successor can take the device over only after this process has exited
    /// (ublk before Linux 6.15's `QUIESCE_DEV`): an upgrade then ends this process once the
    /// successor holds the stack, and cannot fall back to it afterwards.
    fn successor_needs_exit(&self) -> bool {
        false
    }

    /// The listening socket a successor process inherits when the daemon is upgraded, so
    /// a client connecting meanwhile waits in its backlog instead of being refused; `None`
    /// when the export has none to pass on (its successor binds anew).
    fn listener(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

/// The settings of one kind of export, which can start it on a device.
pub trait StartExport {
    /// Starts serving `device`; the export is ready when this returns.
    fn start(self, device: Arc<dyn BlockDevice>) -> Result<Box<dyn Export>, ExportError>;
}

/// No export: the device is reachable only through the daemon's control socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoExport;

impl Export for NoExport {
    fn describe(&self) -> ExportDescription {
        ExportDescription::None
    }

    fn resized(&self, _new_size: u64) -> Result<(), ExportError> {
        // Nobody caches the size: control-socket requests read it from the device.
        Ok(())
    }

    fn users(&self) -> usize {
        0
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        Ok(())
    }
}

/// Checks a resize notification against the device the export serves: it must already
/// report `new_size`, a whole number of its logical blocks.
pub(crate) fn check_resize(device: &dyn BlockDevice, new_size: u64) -> Result<(), ExportError> {
    let actual = device.size();
    if actual != new_size {
        return Err(ExportError::Config(format!(
            "resize notification for {new_size} bytes, but the device has {actual}"
        )));
    }
    let block = u64::from(device.logical_block_size().max(1));
    if !new_size.is_multiple_of(block) {
        return Err(ExportError::Config(format!(
            "device size {new_size} is not a multiple of its logical block size {block}"
        )));
    }
    Ok(())
}

/// Generates, from one line per export kind, the [`ExportConfig`](crate::ExportConfig) enum
/// (which export to start), the serde-tagged
/// [`ExportDescription`](crate::ExportDescription) enum (what `describe` answers) and
/// [`start`](crate::start) (the dispatch). Each line reads
/// `Variant(ConfigType) -> DescriptionType: "doc line"`, optionally behind a `#[cfg(...)]`;
/// the variant's lowercase name is the `kind` in the JSON.
macro_rules! exports {
    ($( $(#[cfg($cfg:meta)])? $variant:ident($config:ty) -> $description:ty : $doc:literal, )*) => {
        /// Which export to start, with its settings (one variant per export kind). It
        /// serialises (settings only: TLS certificates are named, loaded when the export
        /// starts), so a daemon can be handed it through a pipe.
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        pub enum ExportConfig {
            $(
                $(#[cfg($cfg)])?
                #[doc = $doc]
                $variant($config),
            )*
            /// No export: only the daemon's control socket reaches the device.
            None,
        }

        /// What [`Export::describe`] answers: where clients find the export. Serialises as
        /// an object whose `kind` is the variant's lowercase name, followed by its fields.
        #[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        pub enum ExportDescription {
            $(
                $(#[cfg($cfg)])?
                #[doc = $doc]
                $variant($description),
            )*
            /// No export.
            None,
        }

        impl ExportConfig {
            /// Makes the export read-only (or not): every kind's `read_only` setting.
            pub fn set_read_only(&mut self, read_only: bool) {
                match self {
                    $(
                        $(#[cfg($cfg)])?
                        ExportConfig::$variant(config) => config.read_only = read_only,
                    )*
                    ExportConfig::None => {}
                }
            }
        }

        /// Starts the export `config` names on `device`; it is ready when this returns.
        pub fn start(
            config: ExportConfig,
            device: std::sync::Arc<dyn cryptblk_dm::device::BlockDevice>,
        ) -> Result<Box<dyn $crate::Export>, $crate::ExportError> {
            match config {
                $(
                    $(#[cfg($cfg)])?
                    ExportConfig::$variant(config) => $crate::StartExport::start(config, device),
                )*
                ExportConfig::None => Ok(Box::new($crate::NoExport)),
            }
        }
    };
}
