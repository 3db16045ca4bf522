//! Exports that serve a [`cryptblk_dm::device::BlockDevice`] to real clients:
//! an NBD server ([`NbdServer`]), a FUSE mount holding one file ([`FuseExport`]) and, with
//! the `ublk` feature (default), a kernel block device `/dev/ublkbN` (`UblkExport`), and a
//! vhost-user-blk socket a hypervisor attaches as a VM's disk ([`VhostUserExport`]).
//!
//! Every export implements [`Export`]: it is ready when it has started, [`Export::describe`]
//! says where clients find it, [`Export::resized`] passes on a change of the device's size,
//! and [`Export::stop`] stops it gracefully, letting requests in flight finish and flushing
//! the device. [`start`] starts any of them from an [`ExportConfig`]; each type's own
//! constructor (`NbdServer::start`, `FuseExport::mount`, `UblkExport::start`) gives the
//! concrete type with its extra methods.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cryptblk_dm::{BlockDevice, Registry};
//! use cryptblk_export::{ExportConfig, FuseConfig, FuseExport, NbdConfig, NbdServer};
//!
//! let reg = Registry::new();
//! let dev: Arc<dyn BlockDevice> = reg.create("disk", "0 2048 zero").unwrap();
//!
//! // Any export through the one interface: NBD on a Unix socket here.
//! let export = cryptblk_export::start(
//!     ExportConfig::Nbd(NbdConfig::unix("/run/cryptblk.sock")),
//!     dev.clone(),
//! )
//! .unwrap();
//! // {"kind":"nbd","uri":"nbd+unix:///?socket=/run/cryptblk.sock"}
//! println!("{}", serde_json::to_string(&export.describe()).unwrap());
//! export.stop().unwrap(); // connections closed, device flushed
//!
//! // The concrete type, for what only NBD has: stopping from another thread.
//! let server = NbdServer::start(dev.clone(), NbdConfig::unix("/run/cryptblk.sock")).unwrap();
//! let stopper = server.stopper(); // e.g. moved into a signal-handling thread
//! stopper.stop();
//! server.wait().unwrap(); // returns once stopped: connections closed, device flushed
//!
//! // FUSE: <mountpoint>/disk is a regular file of the device's size.
//! let mut export = FuseExport::mount(dev, FuseConfig::new("/mnt/cryptblk")).unwrap();
//! println!("losetup -f --show --direct-io=on {}", export.file_path().display());
//! export.unmount().unwrap(); // EBUSY while the file is open (e.g. loop-attached)
//! ```
//!
//! Adding an export kind is one module (its config implementing [`StartExport`], its running
//! export implementing [`Export`], and a serialisable description) plus one line in the
//! `exports!` list below.

#[macro_use]
mod export;

pub mod aligned;
pub mod block_users;
pub mod error;
pub mod fuse;
pub mod handover;
pub mod nbd;
#[cfg(feature = "ublk")]
pub mod ublk;
pub mod unix_socket;
pub mod vhost_user;

pub use aligned::AlignedIo;
pub use error::ExportError;
pub use export::{Export, NoExport, StartExport};
pub use fuse::{FuseConfig, FuseDescription, FuseExport};
pub use nbd::{NbdConfig, NbdDescription, NbdListen, NbdServer, NbdStopper};
#[cfg(feature = "ublk")]
pub use ublk::{UblkConfig, UblkDescription, UblkExport};
pub use vhost_user::{VhostUserConfig, VhostUserDescription, VhostUserExport};

// The registry: one line per export kind (variant, config, description, doc).
exports! {
    Nbd(NbdConfig) -> NbdDescription: "An NBD server on a Unix socket or TCP.",
    Fuse(FuseConfig) -> FuseDescription: "A FUSE mount holding the device as one file.",
    #[cfg(feature = "ublk")]
    Ublk(UblkConfig) -> UblkDescription: "The kernel block device `/dev/ublkbN`.",
    VhostUser(VhostUserConfig) -> VhostUserDescription: "A vhost-user-blk socket a hypervisor attaches as a virtio-blk disk.",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's `export` JSON, byte for byte as the CLI printed it before the trait
    /// existed; clients parse it back into the same description.
    #[test]
    fn descriptions_serialise_as_the_daemon_json() {
        let cases = [
            (
                ExportDescription::Nbd(NbdDescription {
                    uri: "nbd+unix:///?socket=/run/a.sock".into(),
                }),
                r#"{"kind":"nbd","uri":"nbd+unix:///?socket=/run/a.sock"}"#,
            ),
            (
                ExportDescription::Fuse(FuseDescription {
                    file: "/mnt/x/disk".into(),
                }),
                r#"{"kind":"fuse","file":"/mnt/x/disk"}"#,
            ),
            #[cfg(feature = "ublk")]
            (
                ExportDescription::Ublk(UblkDescription {
                    dev: "/dev/ublkb3".into(),
                    queues: 2,
                    depth: 64,
                }),
                r#"{"kind":"ublk","dev":"/dev/ublkb3","queues":2,"depth":64}"#,
            ),
            (
                ExportDescription::VhostUser(VhostUserDescription {
                    socket: "/run/vm.sock".into(),
                    queues: 2,
                }),
                r#"{"kind":"vhostuser","socket":"/run/vm.sock","queues":2}"#,
            ),
            (ExportDescription::None, r#"{"kind":"none"}"#),
        ];
        for (description, json) in cases {
            assert_eq!(serde_json::to_string(&description).unwrap(), json);
            // Through a Value too, as the daemon embeds it in its facts object.
            let value = serde_json::json!({ "export": description });
            assert_eq!(value.to_string(), format!(r#"{{"export":{json}}}"#));
            let back: ExportDescription = serde_json::from_str(json).unwrap();
            assert_eq!(back, description);
        }
    }
}
