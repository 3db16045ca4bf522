//! Userspace device-mapper: block devices, dm tables and stackable targets.
//!
//! Everything that serves or stacks I/O speaks [`BlockDevice`]: backings (files, RAM disks),
//! targets (`linear`, `crypt`, ...), whole tables, and the live [`Mapping`] that exports
//! (NBD, FUSE, ublk) serve.
//!
//! ```no_run
//! use cryptblk_dm::{BlockDevice, CryptConfig, CryptFlags, CryptKey, Registry, TableSpec};
//! let reg = Registry::new();
//! let key = CryptKey::Hex(cryptblk_cipher::SecretBytes::zeroed(64));
//! let mut crypt = CryptConfig::new("aes-xts-plain64", key, 0, "ram:1G", 0);
//! crypt.flags = CryptFlags::inline();
//! // Tables are values (the `spec` module); their text is what `dmsetup table` prints.
//! let table = TableSpec::single(2097152, crypt);
//! let m = reg.create("secret", &table.to_text(true)).unwrap();
//! let mut buf = vec![0u8; 4096];
//! m.read_at(0, &mut buf).unwrap();
//! println!("{}", m.table(false).as_str());
//! ```

pub mod backing;
pub mod device;
pub mod error;
pub mod io_stats;
pub mod mapping;
pub mod registry;
pub mod resolver;
pub mod spec;
pub mod table;
pub mod table_text;
pub mod targets;

pub use backing::{parse_size, FileBacking, FileOptions, RamDisk};
pub use device::{BlockDevice, WriteFlags, SECTOR_SIZE};
pub use error::DmError;
pub use io_stats::{Direction, DirectionSnapshot, IoStatsSnapshot, LatencySummary};
pub use mapping::{Mapping, MappingInfo};
pub use registry::Registry;
pub use resolver::{DeviceResolver, LoadOptions};
pub use spec::{
    text_has_inline_keys, PipelineInfo, SpecConfig, TableLineSpec, TableSpec, TargetSpec,
};
pub use table::{parse_table_lines, Table, TableEntry, TableLine};
pub use targets::config::{
    DelayConfig, ErrorConfig, FlakeyConfig, LinearConfig, TargetConfig, ZeroConfig,
};
pub use targets::crypt::{
    CryptConfig, CryptFlags, CryptKey, CryptParams, CryptTarget, SplitPolicy,
};
pub use targets::flakey::{FlakeyControl, FlakeyTarget, WriteFailure};
pub use targets::integrity::IntegrityTableConfig;
pub use targets::verity::{VerityFecConfig, VerityTableConfig};
pub use targets::{target_type_names, StatusType, Target, TargetStats};
