//! Userspace device-mapper: block devices, dm tables and stackable targets.
//!
//! Everything that serves or stacks I/O speaks [`BlockDevice`]: backings (files, RAM disks),
//! targets (`linear`, `crypt`, ...), whole tables, and the live [`BlockDevice`] that exports
//! (NBD, FUSE, ublk) serve.

pub mod device;

pub use device::{BlockDevice, WriteFlags, SECTOR_SIZE};
