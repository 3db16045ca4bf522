//! Exports that serve a [`cryptblk_dm::device::BlockDevice`] to real clients:
//! an NBD server ([`NbdServer`]), a FUSE mount holding one file ([`FuseExport`]) and, with
//! the `ublk` feature (default), a kernel block device `/dev/ublkbN` (`UblkExport`).
//!
//! Both are ready when their constructor returns (the NBD socket is listening, the FUSE
//! handshake with the kernel is done) and both stop gracefully, flushing the device.
//!
//! ```no_run
//! use std::sync::Arc;
//! use cryptblk_dm::{BlockDevice, Registry};
//! use cryptblk_export::{FuseConfig, FuseExport, NbdConfig, NbdServer};
//!
//! let reg = Registry::new();
//! let dev: Arc<dyn BlockDevice> = reg.create("disk", "0 2048 zero").unwrap();
//!
//! // NBD on a Unix socket; clients use `server.uri()` (nbd+unix:///?socket=...).
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

pub mod aligned;
pub mod error;
pub mod fuse;
pub mod nbd;
#[cfg(feature = "ublk")]
pub mod ublk;

pub use aligned::AlignedIo;
pub use error::ExportError;
pub use fuse::{FuseConfig, FuseExport};
pub use nbd::{NbdConfig, NbdListen, NbdServer, NbdStopper};
#[cfg(feature = "ublk")]
pub use ublk::{UblkConfig, UblkExport};
