//! `cryptblk bench`: reproduces Cloudflare's "Speeding up Linux disk encryption" experiments
//! on cryptblk's userspace device-mapper.
//!
//! The reference measured fio on a RAM disk, plain and through dm-crypt, turned dm-crypt's
//! performance flags on one by one, compared the result with the bound
//! `(plain x cipher) / (plain + cipher)` and finally bypassed the crypt queues (`inline`),
//! flipping the flag under load. This crate runs the same matrix:
//!
//! - **configurations** ([`config`]): `linear`, `crypt` with the null cipher, and
//!   `aes-xts-plain64` queued, with `same_cpu_crypt`, `submit_from_crypt_cpus`, inline reads,
//!   inline writes and both inline; each a dm table over its own `ram:` disk with a fresh
//!   random key;
//! - **workloads** ([`workload`]): the reference's 4 KiB `readwrite` at iodepth 1, random
//!   4 KiB / 64 KiB / 1 MiB, and 4 jobs x iodepth 16;
//! - **transports** ([`Transport`]): the in-process engine ([`engine`]), fio's `nbd` engine
//!   against cryptblk's NBD server, and fio `psync --direct=1` on a loop device over the FUSE
//!   export (the reference's exact command; needs root, FUSE and loop);
//! - optionally **peers** ([`peers`]): nbdkit's luks filter and qemu-nbd with a LUKS1 image.
//! - in the kernel lab VM ([`lab`]): ublk and vhost-user, beside the guest kernel's dm-crypt
//!   (default and `no_*_workqueue`), as ratios.
//!
//! Runs alternate between configurations (A B C .. A B C ..) and each figure is the median of
//! the repeats. Results come back as a [`BenchReport`], which renders as an aligned table,
//! JSON, markdown and SVG charts; `--live` flips a crypt table between queued and inline
//! halfway through a run and charts throughput and latency over time.
//!
//! ```no_run
//! let opts = cryptblk_bench::BenchOptions { quick: true, ..Default::default() };
//! let report = cryptblk_bench::run(&opts).unwrap();
//! print!("{}", report.render_table());
//! ```

pub mod chart;
pub mod cipher_speed;
pub mod config;
pub mod cpu;
pub mod engine;
pub mod fio;
pub mod integrity;
pub mod lab;
pub mod live;
pub mod metrics;
pub mod pattern;
pub mod peers;
pub mod placement;
pub mod reencrypt;
pub mod report;
mod runner;
pub mod stack;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

pub use config::Configuration;
pub use metrics::{BoundFigures, DirMetrics, RunMetrics};
pub use report::{BenchReport, ResultRow, TransportStatus};
pub use runner::run;
pub use workload::Workload;

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Invalid options.
    #[error("invalid benchmark options: {0}")]
    Options(String),
    /// A filter named nothing known.
    #[error("unknown {what} '{name}' (known: {known})")]
    UnknownName {
        /// "configuration", "workload" or "transport".
        what: String,
        /// The name given.
        name: String,
        /// The names that exist.
        known: String,
    },
    /// Building or changing a device-mapper table failed.
    #[error("device-mapper: {0}")]
    Dm(String),
    /// Starting an export (NBD, FUSE) failed.
    #[error("export: {0}")]
    Export(String),
    /// An external tool could not be run or failed.
    #[error("{0}")]
    Tool(String),
    /// fio failed or wrote something unreadable.
    #[error("fio: {0}")]
    Fio(String),
    /// An I/O error on the device under test.
    #[error("I/O error: {0}")]
    Io(String),
    /// Data read back differs from what was written.
    #[error("data verification failed: {0}")]
    Verify(String),
    /// Writing a report file failed.
    #[error("writing {path}: {msg}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
}

/// How the in-process engine, fio over NBD, and fio over a loop device reach the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// The in-process load generator calling the device directly.
    Inproc,
    /// fio's `nbd` engine (libnbd) against cryptblk's NBD server on a Unix socket.
    Nbd,
    /// fio psync/libaio `--direct=1` on a loop device over the FUSE export's file.
    Loop,
}

impl Transport {
    /// All transports, in run order.
    pub const ALL: [Transport; 3] = [Transport::Inproc, Transport::Nbd, Transport::Loop];

    /// The name used in filters and reports.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Inproc => "inproc",
            Transport::Nbd => "nbd",
            Transport::Loop => "loop",
        }
    }
}

/// Options of a benchmark run: a plain struct (no clap) that the CLI fills from its flags.
///
/// `Default` is the full default bench; [`BenchOptions::quick`] is the ~30 s smoke run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Smoke run: small region, short runs, one repeat, three workloads, fio verification on.
    pub quick: bool,
    /// Runtime of each run (default 0.7 s; quick 0.2 s).
    pub runtime: Option<Duration>,
    /// Repeats of each cell, alternating configurations (default 5; quick 1). Five short
    /// runs rather than three long ones: the median ignores two disturbed runs instead of
    /// one, and the spread of the plain rows' repeats measures the machine's noise.
    pub repeats: Option<u32>,
    /// Configuration names to run (exact, or a prefix ending in `*`); empty: the default set.
    pub configs: Vec<String>,
    /// Workload names to run; empty: all (quick: rw4k and randrw4k-4j-qd16).
    pub workloads: Vec<String>,
    /// Transport names to run (`inproc`, `nbd`, `loop`); empty: every available one.
    pub transports: Vec<String>,
    /// RAM disk size per configuration (default 1 GiB; quick 128 MiB).
    pub device_size: Option<u64>,
    /// Bytes each transport's I/O covers (default 256 MiB; quick 32 MiB). In-process runs
    /// use `[0, region)`, fio runs `[region, 2 * region)`, so fio's writes never disturb
    /// the in-process engine's verification state.
    pub region: Option<u64>,
    /// fio `--verify=crc32c` (default: on for quick, off otherwise, as verification reads
    /// count as reads). The in-process engine always verifies.
    pub fio_verify: Option<bool>,
    /// Also benchmark nbdkit's luks filter and qemu-nbd's LUKS driver over fio's nbd engine.
    pub peers: bool,
    /// Instead of the matrix: run 4 KiB readwrite for this long on `aes-xts-plain64`, flip
    /// the table from queued to inline halfway, sample every 250 ms.
    pub live: Option<Duration>,
    /// Transport of the live run (`inproc` default, or `nbd` to drive it with fio).
    pub live_transport: Option<String>,
    /// Write the JSON report here.
    pub json: Option<PathBuf>,
    /// Write the throughput/p99 chart (or, with `live`, the time-series chart) here as SVG.
    pub svg: Option<PathBuf>,
    /// Write a markdown report (table + notes) here.
    pub markdown: Option<PathBuf>,
    /// Progress line on stderr: `None` shows it only when stderr is a terminal.
    pub progress: Option<bool>,
    /// The fio program (default `fio` from PATH).
    pub fio: PathBuf,
    /// Directory for sockets, mount points and peer images (default: a temporary directory).
    pub work_dir: Option<PathBuf>,
    /// CPUs the run's threads, peers and fio are pinned to (default: the scheduler's choice;
    /// the command line defaults to one CPU: see [`placement`]).
    pub cpus: placement::CpuPlacement,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            quick: false,
            runtime: None,
            repeats: None,
            configs: Vec::new(),
            workloads: Vec::new(),
            transports: Vec::new(),
            device_size: None,
            region: None,
            fio_verify: None,
            peers: false,
            live: None,
            live_transport: None,
            json: None,
            svg: None,
            markdown: None,
            progress: None,
            fio: PathBuf::from("fio"),
            work_dir: None,
            cpus: placement::CpuPlacement::Scheduler,
        }
    }
}

impl BenchOptions {
    /// The smoke-run preset.
    pub fn quick() -> Self {
        BenchOptions {
            quick: true,
            ..Default::default()
        }
    }

    /// Runtime of each run after defaults.
    pub fn effective_runtime(&self) -> Duration {
        self.runtime.unwrap_or(if self.quick {
            Duration::from_millis(200)
        } else {
            Duration::from_millis(700)
        })
    }

    /// Repeats after defaults.
    pub fn effective_repeats(&self) -> u32 {
        self.repeats
            .unwrap_or(if self.quick { 1 } else { 5 })
            .max(1)
    }

    /// RAM disk size after defaults.
    pub fn effective_device_size(&self) -> u64 {
        self.device_size
            .unwrap_or(if self.quick { 128 << 20 } else { 1 << 30 })
    }

    /// Region after defaults.
    pub fn effective_region(&self) -> u64 {
        self.region
            .unwrap_or(if self.quick { 32 << 20 } else { 256 << 20 })
    }

    /// fio verification after defaults.
    pub fn effective_fio_verify(&self) -> bool {
        self.fio_verify.unwrap_or(self.quick)
    }

    /// The workload names run when none are given.
    pub fn default_workloads(&self) -> Vec<String> {
        if self.quick {
            vec!["rw4k".into(), "randrw4k-4j-qd16".into()]
        } else {
            Vec::new()
        }
    }
}
