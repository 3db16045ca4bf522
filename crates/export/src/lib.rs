//! Exports that serve a [`cryptblk_dm::device::BlockDevice`] to real clients:
//! an NBD server ([`NbdServer`]) and a FUSE mount holding one file ([`FuseExport`]).

pub mod aligned;
pub mod error;
pub mod fuse;
pub mod nbd;

pub use aligned::AlignedIo;
pub use error::ExportError;
pub use fuse::{FuseConfig, FuseExport};
pub use nbd::{NbdConfig, NbdListen, NbdServer, NbdStopper};
