//! The configurations of the integrity experiment (one per table column) and its four
//! workloads (one per row): pure data, nothing here touches a device.
//!
//! Invariants: names are stable identifiers (the `--config` filter, the JSON report and
//! [`AIMS`](super::AIMS) refer to them); `plain` comes first in
//! [`IntegrityBenchConfig::builtin`] because every other figure is a ratio to it (and
//! [`run`](super::run) puts it back when a filter left it out); only the `verity`
//! configurations are read only ([`IntegrityBenchConfig::writable`]), so they get no write
//! workloads.

use serde::Serialize;

use crate::workload::{AccessPattern, Workload};

/// What a configuration maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "target", rename_all = "snake_case")]
pub enum IntegrityKind {
    /// `linear` over the RAM disk.
    Plain,
    /// `integrity` with an internal hash.
    Integrity {
        /// Kernel hash name (`crc32c`, `hmac(sha256)`).
        hash: String,
        /// Key bytes of a keyed hash (0: none).
        key_bytes: usize,
        /// Mode letter: `J`, `B` or `D`.
        mode: char,
    },
    /// `crypt` with an AEAD cipher over `integrity` with external tags.
    CryptIntegrity {
        /// dm-crypt cipher specification.
        cipher: String,
        /// Key bytes (encryption key followed by the MAC key).
        key_bytes: usize,
        /// Tag bytes per sector.
        tag_size: u32,
        /// Encryption sector size, which is also the integrity block size (`sector_size:`
        /// of the crypt line, `block_size:` of the integrity line).
        sector_size: u32,
    },
    /// `verity` over a prefilled data disk and its hash tree (read only); with
    /// `check_at_most_once` each data block is hashed on its first read only.
    Verity {
        /// Add the `check_at_most_once` option.
        once: bool,
    },
}

/// One named configuration of the integrity experiment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IntegrityBenchConfig {
    /// Short name used in filters and tables.
    pub name: String,
    /// Column heading in the markdown table.
    pub heading: String,
    /// What it is.
    pub description: String,
    /// The tables' target.
    #[serde(flatten)]
    pub kind: IntegrityKind,
}

impl IntegrityBenchConfig {
    fn new(name: &str, heading: &str, description: &str, kind: IntegrityKind) -> Self {
        IntegrityBenchConfig {
            name: name.into(),
            heading: heading.into(),
            description: description.into(),
            kind,
        }
    }

    fn integrity(name: &str, heading: &str, hash: &str, key_bytes: usize, mode: char) -> Self {
        let what = match mode {
            'J' => "journal",
            'B' => "bitmap",
            _ => "direct",
        };
        Self::new(
            name,
            heading,
            &format!("integrity, internal_hash:{hash}, {what} mode ({mode})"),
            IntegrityKind::Integrity {
                hash: hash.into(),
                key_bytes,
                mode,
            },
        )
    }

    fn crypt_integrity(name: &str, heading: &str, sector_size: u32) -> Self {
        Self::new(
            name,
            heading,
            &format!(
                "crypt capi:authenc(hmac(sha256),xts(aes))-plain64 (integrity:32:aead, sector_size {sector_size}) over integrity with external tags (J, {sector_size}-byte blocks)"
            ),
            IntegrityKind::CryptIntegrity {
                cipher: "capi:authenc(hmac(sha256),xts(aes))-plain64".into(),
                key_bytes: 64 + 32,
                tag_size: 32,
                sector_size,
            },
        )
    }

    /// Every configuration, in table order (`plain` first: the others are compared to it).
    pub fn builtin() -> Vec<Self> {
        vec![
            Self::new(
                "plain",
                "plain",
                "linear over the RAM disk",
                IntegrityKind::Plain,
            ),
            Self::integrity("int-crc32c-j", "integrity crc32c J", "crc32c", 0, 'J'),
            Self::integrity("int-crc32c-b", "integrity crc32c B", "crc32c", 0, 'B'),
            Self::integrity("int-crc32c-d", "integrity crc32c D", "crc32c", 0, 'D'),
            Self::integrity(
                "int-hmac-sha256-j",
                "integrity hmac-sha256 J",
                "hmac(sha256)",
                32,
                'J',
            ),
            // cryptsetup 2.4+ (and cryptblk) format LUKS2 with 4096-byte sectors on image
            // files and 4K devices, `--integrity` or not, which is what a RAM disk stands
            // for here; the 512-byte row is the same stack on a 512-byte device (8 MACs per
            // 4 KiB request instead of one).
            Self::crypt_integrity("crypt-int-hmac-sha256", "crypt+integrity", 4096),
            Self::crypt_integrity("crypt-int-hmac-sha256-512", "crypt+integrity 512", 512),
            Self::new(
                "verity",
                "verity",
                "verity sha256, 4 KiB blocks, over a prefilled data disk",
                IntegrityKind::Verity { once: false },
            ),
            Self::new(
                "verity-once",
                "verity check_at_most_once",
                "verity sha256 with check_at_most_once (veritysetup --check-at-most-once)",
                IntegrityKind::Verity { once: true },
            ),
        ]
    }

    /// Whether the configuration takes writes.
    pub fn writable(&self) -> bool {
        !matches!(self.kind, IntegrityKind::Verity { .. })
    }
}

/// The reference's four fio jobs, 4 KiB at iodepth 1: `write`, `randwrite`, `read`,
/// `randread`.
pub fn workloads() -> Vec<Workload> {
    let w = |name: &str, desc: &str, pattern, read_percent| Workload {
        name: name.into(),
        description: desc.into(),
        pattern,
        read_percent,
        block_size: 4096,
        jobs: 1,
        iodepth: 1,
    };
    vec![
        w(
            "write",
            "sequential write, 4 KiB, iodepth 1",
            AccessPattern::Sequential,
            0,
        ),
        w(
            "randwrite",
            "random write, 4 KiB, iodepth 1",
            AccessPattern::Random,
            0,
        ),
        w(
            "read",
            "sequential read, 4 KiB, iodepth 1",
            AccessPattern::Sequential,
            100,
        ),
        w(
            "randread",
            "random read, 4 KiB, iodepth 1",
            AccessPattern::Random,
            100,
        ),
    ]
}
