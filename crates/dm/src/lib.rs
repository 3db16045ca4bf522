//! Userspace device-mapper: block devices, dm tables and stackable targets.
//!
//! Everything that serves or stacks I/O speaks [`BlockDevice`]: backings (files, RAM disks),
//! targets (`linear`, `crypt`, ...), whole tables, and the live [`Mapping`] that exports
//! (NBD, FUSE, ublk) serve.
//!
//! ```no_run
//! use cryptblk_dm::{BlockDevice, Registry};
//! let reg = Registry::new();
//! let key = "00".repeat(64);
//! let m = reg.create("secret", &format!("0 2097152 crypt aes-xts-plain64 {key} 0 ram:1G 0 2 no_read_workqueue no_write_workqueue")).unwrap();
//! let mut buf = vec![0u8; 4096];
//! m.read_at(0, &mut buf).unwrap();
//! println!("{}", m.table(false));
//! ```

pub mod backing;
pub mod device;
pub mod error;
pub mod mapping;
pub mod registry;
pub mod resolver;
pub mod table;
pub mod targets;

pub use backing::{parse_size, FileBacking, FileOptions, RamDisk};
pub use device::{BlockDevice, WriteFlags, SECTOR_SIZE};
pub use error::DmError;
pub use mapping::{Mapping, MappingInfo};
pub use registry::Registry;
pub use resolver::{DeviceResolver, LoadOptions};
pub use table::{parse_table_lines, Table, TableEntry, TableLine};
pub use targets::crypt::{CryptFlags, CryptParams, CryptTarget, SplitPolicy};
pub use targets::flakey::{FlakeyControl, FlakeyTarget, WriteFailure};
pub use targets::{target_type_names, StatusType, Target, TargetStats};
