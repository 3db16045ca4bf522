//! The dm-integrity / dm-verity overhead experiment: the shape of the Raspberry Pi 4
//! measurement in the reference documents (fio 4 KiB sequential and random writes and
//! reads on a plain device, dm-integrity, dm-verity and dm-crypt over dm-integrity with
//! hmac-sha256, each figure with its overhead against plain), run in process on RAM disks.
//!
//! Configurations ([`IntegrityBenchConfig::builtin`]):
//! - `plain`: `linear` over the RAM disk;
//! - `int-crc32c-j`, `int-crc32c-b`, `int-crc32c-d`: the `integrity` target with the
//!   integritysetup default hash in journal, bitmap and direct mode;
//! - `int-hmac-sha256-j`: keyed tags (`internal_hash:hmac(sha256):<key>`), journal mode;
//! - `crypt-int-hmac-sha256`: what `cryptsetup luksFormat --cipher aes-xts-plain64
//!   --integrity hmac-sha256` activates: an `integrity` target with 32-byte external tags
//!   and above it `crypt capi:authenc(hmac(sha256),xts(aes))-plain64 ... integrity:32:aead`
//!   (skipped, with the loader's message, while crates/dm cannot load that table);
//! - `verity`: a `verity` target over a data RAM disk whose sha256 tree cryptblk built
//!   (read workloads only, as the reference's dm-verity column).
//!
//! Transports ([`select_transports`]): `inproc` (default) drives the mapping in process over
//! `[0, region)`, every read checked against the engine's pattern; `nbd` serves the mapping
//! with cryptblk's NBD server on a Unix socket and drives `[region, 2 * region)` with fio's
//! `nbd` engine, as a block-device client would see it: that region is first written once
//! with fio's crc32c headers, write jobs write headers too (not read back, so the write
//! figures hold writes only) and read jobs check the header of every block they read. Either
//! way a configuration that returned wrong data fails instead of reporting a speed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, Mapping, Registry};
use cryptblk_export::NbdServer;
use cryptblk_format::hdrio::HeaderIo;
use serde::Serialize;

use crate::engine::{self, EngineRun};
use crate::fio::{self, FioJob, FioTarget, FioVerify};
use crate::pattern::GenerationMap;
use crate::stack::serve_nbd;
use crate::workload::{AccessPattern, Workload};
use crate::{BenchError, Transport};

/// The transports the integrity report runs over.
pub const TRANSPORTS: [Transport; 2] = [Transport::Inproc, Transport::Nbd];

/// The transports named by `--transport` filters, in [`TRANSPORTS`] order; none named:
/// `inproc` only. `loop` (FUSE + loop device) is refused: the report runs in process or
/// over NBD.
pub fn select_transports(names: &[String]) -> Result<Vec<Transport>, BenchError> {
    if names.is_empty() {
        return Ok(vec![Transport::Inproc]);
    }
    let mut out = Vec::new();
    for n in names {
        match TRANSPORTS.iter().find(|t| t.name() == n.as_str()) {
            Some(t) => {
                if !out.contains(t) {
                    out.push(*t);
                }
            }
            None => {
                return Err(BenchError::UnknownName {
                    what: "integrity report transport".into(),
                    name: n.clone(),
                    known: TRANSPORTS.map(Transport::name).join(", "),
                })
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What the NBD transport needs while a stack is built: fio (to write the verification
/// headers of the NBD region) and a directory for sockets and fio output.
pub struct NbdSetup<'a> {
    /// The fio program.
    pub fio: &'a Path,
    /// Directory for the Unix sockets and fio's JSON.
    pub dir: &'a Path,
}

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
            Self::new(
                "crypt-int-hmac-sha256",
                "crypt+integrity",
                "crypt capi:authenc(hmac(sha256),xts(aes))-plain64 (integrity:32:aead) over integrity with external tags (J)",
                IntegrityKind::CryptIntegrity {
                    cipher: "capi:authenc(hmac(sha256),xts(aes))-plain64".into(),
                    key_bytes: 64 + 32,
                    tag_size: 32,
                },
            ),
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

/// [`HeaderIo`] over a block device, for building a verity tree on a RAM disk.
struct DeviceIo(Arc<dyn BlockDevice>);

impl HeaderIo for DeviceIo {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.0.size())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0
            .write_at(offset, buf, cryptblk_dm::WriteFlags::default())
    }
    fn sync(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// A configuration loaded over its own RAM disk(s), its region prefilled.
pub struct IntegrityStack {
    /// The configuration.
    pub config: IntegrityBenchConfig,
    /// The top mapping (what the workloads drive).
    pub mapping: Arc<Mapping>,
    /// Pattern generations of the region.
    pub generations: GenerationMap,
    /// The tables as loaded, keys masked.
    pub tables: Vec<String>,
    names: Vec<String>,
    registry: Arc<Registry>,
    nbd: Option<NbdServer>,
    _held: Vec<Arc<dyn BlockDevice>>,
}

impl Drop for IntegrityStack {
    fn drop(&mut self) {
        if let Some(s) = self.nbd.take() {
            let _ = s.stop();
        }
        for n in self.names.iter().rev() {
            let _ = self.registry.remove(n);
        }
    }
}

/// The sectors an integrity table line over `ram` provides (its status line's second
/// field), found by loading it over a fresh device, which formats it as the kernel would.
fn provided_sectors(registry: &Registry, probe: &str, line_tail: &str) -> Result<u64, String> {
    let m = registry
        .create(probe, &format!("0 8 integrity {line_tail}"))
        .map_err(|e| e.to_string())?;
    let status = m.status();
    let _ = registry.remove(probe);
    status
        .split_whitespace()
        .nth(4)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("unexpected integrity status '{}'", status.trim()))
}

fn mask_keys(table: &str, key: Option<&SecretBytes>) -> String {
    match key {
        Some(k) => table.replace(&k.to_hex(), &"0".repeat(k.len() * 2)),
        None => table.to_string(),
    }
}

impl IntegrityStack {
    /// Builds `config` over RAM disks of `size` bytes and prefills `[0, region)` with the
    /// engine's generation-0 pattern. With `nbd`, also serves the mapping over NBD and
    /// writes `[region, 2 * region)` once with fio's verification headers (for verity: on
    /// the data disk, before the tree is built). `Ok(Err(reason))`: the configuration cannot
    /// be loaded by this build (the crypt+integrity AEAD table before crates/dm supports it).
    pub fn create(
        registry: &Arc<Registry>,
        config: &IntegrityBenchConfig,
        size: u64,
        region: u64,
        nbd: Option<&NbdSetup<'_>>,
    ) -> Result<Result<Self, String>, BenchError> {
        let tag = format!("{}-{}", config.name, std::process::id());
        let ram = format!("ram:{size}#ibench-{tag}");
        let name = format!("cryptblk-ibench-{}", config.name);
        let mut names = Vec::new();
        let mut tables = Vec::new();
        let mut held: Vec<Arc<dyn BlockDevice>> = Vec::new();
        let dm = |e: cryptblk_dm::DmError| BenchError::Dm(format!("{}: {e}", config.name));
        for n in [&name, &format!("{name}-dif")] {
            let _ = registry.remove(n);
        }
        let mapping = match &config.kind {
            IntegrityKind::Plain => {
                let t = format!("0 {} linear {ram} 0", size / 512);
                tables.push(t.clone());
                registry.create(&name, &t).map_err(dm)?
            }
            IntegrityKind::Integrity {
                hash,
                key_bytes,
                mode,
            } => {
                let key = (*key_bytes > 0).then(|| SecretBytes::random(*key_bytes));
                let hash_opt = match &key {
                    Some(k) => format!("internal_hash:{hash}:{}", k.to_hex()),
                    None => format!("internal_hash:{hash}"),
                };
                let tail = format!("{ram} 0 - {mode} 2 fix_padding {hash_opt}");
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors = provided_sectors(registry, &format!("{name}-probe"), &tail)
                    .map_err(|e| BenchError::Dm(format!("{}: {e}", config.name)))?;
                let t = format!("0 {sectors} integrity {tail}");
                tables.push(mask_keys(&t, key.as_ref()));
                registry.create(&name, &t).map_err(dm)?
            }
            IntegrityKind::CryptIntegrity {
                cipher,
                key_bytes,
                tag_size,
            } => {
                let lower = format!("{name}-dif");
                let tail = format!("{ram} 0 {tag_size} J 1 fix_padding");
                held.push(registry.open_device(&ram).map_err(dm)?);
                let sectors = match provided_sectors(registry, &format!("{name}-probe"), &tail) {
                    Ok(s) => s,
                    Err(e) => return Ok(Err(format!("integrity table failed to load: {e}"))),
                };
                let t = format!("0 {sectors} integrity {tail}");
                if let Err(e) = registry.create(&lower, &t) {
                    return Ok(Err(format!("integrity table failed to load: {e}")));
                }
                names.push(lower.clone());
                tables.push(t);
                let key = SecretBytes::random(*key_bytes);
                let ct = format!(
                    "0 {sectors} crypt {cipher} {} 0 {lower} 0 1 integrity:{tag_size}:aead",
                    key.to_hex()
                );
                match registry.create(&name, &ct) {
                    Ok(m) => {
                        tables.push(mask_keys(&ct, Some(&key)));
                        m
                    }
                    Err(e) => {
                        let _ = registry.remove(&lower);
                        return Ok(Err(format!("crypt table failed to load: {e}")));
                    }
                }
            }
            IntegrityKind::Verity { once } => {
                let data_len = if nbd.is_some() { 2 * region } else { region };
                let data_spec = format!("ram:{data_len}#ibench-data-{tag}");
                let hash_spec = format!("ram:{}#ibench-hash-{tag}", data_len / 64 + (4 << 20));
                let data = registry.open_device(&data_spec).map_err(dm)?;
                let hash = registry.open_device(&hash_spec).map_err(dm)?;
                engine::prefill(data.as_ref(), 0, region)?;
                if let Some(n) = nbd {
                    // fio's headers go on the data disk before the tree hashes it.
                    let server = serve_nbd(data.clone(), n.dir, &format!("{}-data", config.name))?;
                    let filled =
                        fio::fill_with_headers(n.fio, &server.uri(), region, region, n.dir);
                    let _ = server.stop();
                    filled?;
                }
                let mut p = cryptblk_format::verity::VerityParams::defaults(data_len / 4096);
                p.uuid = Some([7; 16]);
                let done = cryptblk_format::verity::format(
                    &DeviceIo(data.clone()),
                    &DeviceIo(hash.clone()),
                    &p,
                )
                .map_err(|e| BenchError::Dm(format!("verity format: {e}")))?;
                let params = p
                    .table_params(&data_spec, &hash_spec, &done.root_hash)
                    .map_err(|e| BenchError::Dm(format!("verity table: {e}")))?;
                let opts = if *once { " 1 check_at_most_once" } else { "" };
                let t = format!("0 {} verity {params}{opts}", data_len / 512);
                held.push(data);
                held.push(hash);
                tables.push(t.clone());
                registry.create(&name, &t).map_err(dm)?
            }
        };
        names.push(name);
        let mut stack = IntegrityStack {
            config: config.clone(),
            mapping,
            generations: GenerationMap::new(region),
            tables,
            names,
            registry: registry.clone(),
            nbd: None,
            _held: held,
        };
        if config.writable() {
            engine::prefill(stack.device().as_ref(), 0, region)?;
        }
        if let Some(n) = nbd {
            if stack.mapping.size() < 2 * region {
                return Err(BenchError::Options(format!(
                    "{}: the mapping provides {} bytes, the NBD region needs {}",
                    config.name,
                    stack.mapping.size(),
                    2 * region
                )));
            }
            let server = serve_nbd(stack.device(), n.dir, &config.name)?;
            if config.writable() {
                fio::fill_with_headers(n.fio, &server.uri(), region, region, n.dir)?;
            }
            stack.nbd = Some(server);
        }
        Ok(Ok(stack))
    }

    /// The device to drive.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.mapping.clone()
    }

    /// The NBD URI serving the mapping, when it was built for the NBD transport.
    pub fn nbd_uri(&self) -> Option<String> {
        self.nbd.as_ref().map(NbdServer::uri)
    }
}

/// Options of the integrity experiment.
#[derive(Clone, Debug)]
pub struct IntegrityBenchOptions {
    /// Seconds per run.
    pub runtime: Duration,
    /// Repeats per cell (alternating configurations); medians are reported.
    pub repeats: u32,
    /// RAM disk size per configuration.
    pub device_size: u64,
    /// Bytes the workloads cover (a multiple of 4 KiB, at most the smallest device).
    pub region: u64,
    /// Configuration filters (`--config`; empty: all).
    pub configs: Vec<String>,
    /// Workload filters (`--workload`; empty: all four).
    pub workloads: Vec<String>,
    /// Transports, from [`select_transports`] (empty: inproc).
    pub transports: Vec<Transport>,
    /// The fio program of the NBD transport.
    pub fio: PathBuf,
    /// Directory for sockets and fio output (default: a temporary directory).
    pub work_dir: Option<PathBuf>,
}

impl Default for IntegrityBenchOptions {
    fn default() -> Self {
        IntegrityBenchOptions {
            runtime: Duration::from_secs(2),
            repeats: 3,
            device_size: 1 << 30,
            region: 256 << 20,
            configs: Vec::new(),
            workloads: Vec::new(),
            transports: vec![Transport::Inproc],
            fio: PathBuf::from("fio"),
            work_dir: None,
        }
    }
}

/// One cell: the median MB/s of a configuration under a workload.
#[derive(Clone, Debug, Serialize)]
pub struct IntegrityCell {
    /// Transport name (`inproc`, `nbd`).
    pub transport: String,
    /// Configuration name.
    pub config: String,
    /// Workload name.
    pub workload: String,
    /// Median MB/s (MB = 10^6 bytes).
    pub mb_s: f64,
    /// Every repeat's MB/s.
    pub samples: Vec<f64>,
}

/// The experiment's result.
#[derive(Clone, Debug, Serialize)]
pub struct IntegrityReport {
    /// Configurations that ran, in table order.
    pub configs: Vec<IntegrityBenchConfig>,
    /// Their tables (keys masked), per configuration.
    pub tables: Vec<(String, Vec<String>)>,
    /// Configurations that could not be loaded, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Workloads, in row order.
    pub workloads: Vec<Workload>,
    /// Median figures.
    pub cells: Vec<IntegrityCell>,
    /// Seconds per run.
    pub runtime_s: f64,
    /// Repeats per cell.
    pub repeats: u32,
    /// Region covered by the workloads, bytes.
    pub region: u64,
    /// Transports, in table order, with what each one is.
    pub transports: Vec<(String, String)>,
    /// 1-minute load average at the start and at the end.
    pub load_avg: (f64, f64),
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// What a transport is, for the report (fails when it cannot run here: a transport that
/// was asked for never quietly disappears from the table).
fn describe_transport(t: Transport, fio_bin: &Path) -> Result<String, BenchError> {
    match t {
        Transport::Inproc => Ok("in process: one thread calls the mapping directly, every read checked against the written pattern".into()),
        _ => {
            let v = fio::version(fio_bin).ok_or_else(|| {
                BenchError::Tool(format!("the nbd transport needs fio ({} does not run)", fio_bin.display()))
            })?;
            if !fio::has_engine(fio_bin, "nbd") {
                return Err(BenchError::Tool(format!("{v} has no nbd engine (fio --enghelp does not list it)")));
            }
            Ok(format!("{v} --ioengine=nbd (libnbd) against cryptblk's NbdServer on a Unix socket; fio crc32c headers written by the write jobs, checked on every read"))
        }
    }
}

/// Runs the experiment: per workload and transport, `repeats` rounds over every
/// configuration in order.
pub fn run(opts: &IntegrityBenchOptions) -> Result<IntegrityReport, BenchError> {
    if opts.region % 4096 != 0 || opts.region == 0 || opts.region > opts.device_size / 2 {
        return Err(BenchError::Options(format!(
            "region {} must be a non-zero multiple of 4096 and at most half the device size {}",
            opts.region, opts.device_size
        )));
    }
    let load_start = crate::runner::load_avg();
    let mut transports = opts.transports.clone();
    if transports.is_empty() {
        transports.push(Transport::Inproc);
    }
    let mut described = Vec::new();
    for t in &transports {
        described.push((t.name().to_string(), describe_transport(*t, &opts.fio)?));
    }
    let all = IntegrityBenchConfig::builtin();
    let mut chosen = crate::config::select("configuration", &all, |c| &c.name, &opts.configs)?;
    if !chosen.iter().any(|c| c.name == "plain") {
        chosen.insert(0, all[0].clone());
    }
    let workloads = crate::config::select("workload", &workloads(), |w| &w.name, &opts.workloads)?;
    let (_tmp, work) = crate::runner::work_dir_at(opts.work_dir.as_deref())?;
    let setup = NbdSetup {
        fio: &opts.fio,
        dir: &work,
    };
    let nbd = transports.contains(&Transport::Nbd).then_some(&setup);
    let registry = Arc::new(Registry::new());
    let mut stacks = Vec::new();
    let mut skipped = Vec::new();
    for c in &chosen {
        match IntegrityStack::create(&registry, c, opts.device_size, opts.region, nbd)? {
            Ok(s) => stacks.push(s),
            Err(why) => {
                eprintln!("{}: skipped: {why}", c.name);
                skipped.push((c.name.clone(), why));
            }
        }
    }
    let mut cells = Vec::new();
    for w in &workloads {
        for &t in &transports {
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); stacks.len()];
            for r in 0..opts.repeats.max(1) {
                for (i, s) in stacks.iter().enumerate() {
                    if w.read_percent < 100 && !s.config.writable() {
                        continue;
                    }
                    let what = |e: BenchError| {
                        BenchError::Io(format!("{} {} {}: {e}", s.config.name, w.name, t.name()))
                    };
                    let m = match t {
                        Transport::Inproc => engine::run(&EngineRun {
                            device: s.device(),
                            workload: w,
                            region_offset: 0,
                            region_len: opts.region,
                            runtime: opts.runtime,
                            generations: &s.generations,
                            live: None,
                            seed: 0x1a7e ^ (u64::from(r) << 16) ^ i as u64,
                        })
                        .map_err(what)?,
                        _ => {
                            let uri = s.nbd_uri().ok_or_else(|| {
                                BenchError::Export(format!(
                                    "{} is not served over NBD",
                                    s.config.name
                                ))
                            })?;
                            let job = FioJob {
                                target: FioTarget::Nbd { uri },
                                workload: w,
                                offset: opts.region,
                                region: opts.region,
                                runtime: opts.runtime,
                                verify: FioVerify::Headers,
                                logs: None,
                            };
                            fio::run(&opts.fio, &job, &work).map_err(what)?
                        }
                    };
                    let mb = if w.read_percent == 100 {
                        m.read.mb_s
                    } else {
                        m.write.mb_s
                    };
                    samples[i].push(mb);
                }
            }
            for (s, v) in stacks.iter().zip(samples) {
                if v.is_empty() {
                    continue;
                }
                cells.push(IntegrityCell {
                    transport: t.name().into(),
                    config: s.config.name.clone(),
                    workload: w.name.clone(),
                    mb_s: median(&v),
                    samples: v,
                });
            }
        }
    }
    Ok(IntegrityReport {
        configs: stacks.iter().map(|s| s.config.clone()).collect(),
        tables: stacks
            .iter()
            .map(|s| (s.config.name.clone(), s.tables.clone()))
            .collect(),
        skipped,
        workloads,
        cells,
        runtime_s: opts.runtime.as_secs_f64(),
        repeats: opts.repeats.max(1),
        region: opts.region,
        transports: described,
        load_avg: (load_start, crate::runner::load_avg()),
    })
}

/// The aims: (configuration, workloads, minimum ratio to plain).
pub const AIMS: [(&str, &[&str], f64); 4] = [
    ("int-crc32c-j", &["write", "randwrite"], 0.6),
    ("int-crc32c-b", &["write", "randwrite"], 0.85),
    ("verity", &["read", "randread"], 0.9),
    ("verity-once", &["read", "randread"], 0.9),
];

impl IntegrityReport {
    /// Median MB/s of `config` under `workload` over `transport`.
    pub fn mb_s(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.transport == transport && c.config == config && c.workload == workload)
            .map(|c| c.mb_s)
    }

    /// `config`'s figure over plain's for `workload` on the same transport.
    pub fn ratio(&self, transport: &str, config: &str, workload: &str) -> Option<f64> {
        let p = self.mb_s(transport, "plain", workload)?;
        let c = self.mb_s(transport, config, workload)?;
        (p > 0.0).then_some(c / p)
    }

    /// The reference's table for one transport: one row per workload, per configuration
    /// its MB/s and (except plain) its overhead against plain in percent.
    pub fn render_table(&self, transport: &str) -> String {
        let mut head = String::from("| |");
        let mut rule = String::from("|---|");
        for c in &self.configs {
            head.push_str(&format!(" {} |", c.heading));
            rule.push_str("---:|");
            if c.name != "plain" {
                head.push_str(" overhead |");
                rule.push_str("---:|");
            }
        }
        let mut out = format!("{head}\n{rule}\n");
        for w in &self.workloads {
            out.push_str(&format!("| {} MB/s |", w.name));
            for c in &self.configs {
                match self.mb_s(transport, &c.name, &w.name) {
                    Some(v) => out.push_str(&format!(" {v:.1} |")),
                    None => out.push_str(" - |"),
                }
                if c.name != "plain" {
                    match self.ratio(transport, &c.name, &w.name) {
                        Some(r) => out.push_str(&format!(" {:+.1}% |", (r - 1.0) * 100.0)),
                        None => out.push_str(" N/A |"),
                    }
                }
            }
            out.push('\n');
        }
        out
    }

    /// One table per transport; with more than one, each under a heading naming it.
    pub fn render_markdown(&self) -> String {
        if let [(only, _)] = self.transports.as_slice() {
            return self.render_table(only);
        }
        let mut out = String::new();
        for (i, (t, what)) in self.transports.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str(&format!("#### Transport `{t}` ({what})\n\n"));
            out.push_str(&self.render_table(t));
        }
        out
    }

    /// The aims next to the measured ratios, one ratio and verdict column per transport.
    pub fn render_aims(&self) -> String {
        let mut out = String::from("| aim | workload |");
        let mut rule = String::from("|---|---|");
        for (t, _) in &self.transports {
            out.push_str(&format!(" ratio to plain ({t}) | met ({t}) |"));
            rule.push_str("---:|---|");
        }
        out.push('\n');
        out.push_str(&rule);
        out.push('\n');
        for (config, works, min) in AIMS {
            for w in works {
                out.push_str(&format!("| {config} >= {min}x plain | {w} |"));
                for (t, _) in &self.transports {
                    let (measured, met) = match self.ratio(t, config, w) {
                        Some(r) => (format!("{r:.2}x"), if r >= min { "yes" } else { "**no**" }),
                        None => ("not run".to_string(), "-"),
                    };
                    out.push_str(&format!(" {measured} | {met} |"));
                }
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configuration_loads_and_reads_back_its_pattern() {
        let registry = Arc::new(Registry::new());
        for c in IntegrityBenchConfig::builtin() {
            let s = match IntegrityStack::create(&registry, &c, 8 << 20, 1 << 20, None).unwrap() {
                Ok(s) => s,
                Err(why) => {
                    // Only the AEAD stack may be missing, and only with a loader message.
                    assert_eq!(c.name, "crypt-int-hmac-sha256", "{why}");
                    assert!(why.contains("failed to load"), "{why}");
                    continue;
                }
            };
            assert!(s.nbd_uri().is_none());
            for w in workloads() {
                if w.read_percent < 100 && !c.writable() {
                    continue;
                }
                // A loaded machine may let a short run end before its first request: run
                // longer until requests were made (each one verified by the engine).
                let mut runtime = Duration::from_millis(30);
                loop {
                    let m = engine::run(&EngineRun {
                        device: s.device(),
                        workload: &w,
                        region_offset: 0,
                        region_len: 1 << 20,
                        runtime,
                        generations: &s.generations,
                        live: None,
                        seed: 1,
                    })
                    .unwrap_or_else(|e| panic!("{} {}: {e}", c.name, w.name));
                    if m.read.ops + m.write.ops > 0 {
                        break;
                    }
                    runtime *= 4;
                    assert!(runtime < Duration::from_secs(10), "{} {}", c.name, w.name);
                }
            }
        }
    }

    #[test]
    fn transports_are_selected_in_table_order() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(select_transports(&[]).unwrap(), vec![Transport::Inproc]);
        assert_eq!(
            select_transports(&names(&["nbd"])).unwrap(),
            vec![Transport::Nbd]
        );
        assert_eq!(
            select_transports(&names(&["nbd", "inproc", "nbd"])).unwrap(),
            vec![Transport::Inproc, Transport::Nbd]
        );
        for bad in ["loop", "fuse", ""] {
            match select_transports(&names(&[bad])) {
                Err(BenchError::UnknownName { name, known, .. }) => {
                    assert_eq!(name, bad);
                    assert_eq!(known, "inproc, nbd");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    fn cell(t: &str, c: &str, w: &str, v: f64) -> IntegrityCell {
        IntegrityCell {
            transport: t.into(),
            config: c.into(),
            workload: w.into(),
            mb_s: v,
            samples: vec![v],
        }
    }

    fn report(transports: &[&str], cells: Vec<IntegrityCell>) -> IntegrityReport {
        let cfgs = IntegrityBenchConfig::builtin();
        IntegrityReport {
            configs: vec![cfgs[0].clone(), cfgs[1].clone(), cfgs[6].clone()],
            tables: vec![],
            skipped: vec![],
            workloads: workloads(),
            cells,
            runtime_s: 1.0,
            repeats: 1,
            region: 1 << 20,
            transports: transports
                .iter()
                .map(|t| (t.to_string(), format!("{t} engine")))
                .collect(),
            load_avg: (0.0, 0.0),
        }
    }

    #[test]
    fn markdown_has_the_reference_shape() {
        let r = report(
            &["inproc"],
            vec![
                cell("inproc", "plain", "write", 100.0),
                cell("inproc", "int-crc32c-j", "write", 56.7),
                cell("inproc", "plain", "read", 200.0),
                cell("inproc", "verity", "read", 190.0),
            ],
        );
        let md = r.render_markdown();
        assert!(md.starts_with("| | plain | integrity crc32c J | overhead | verity | overhead |"));
        assert!(!md.contains("Transport"), "{md}");
        assert!(
            md.contains("| write MB/s | 100.0 | 56.7 | -43.3% | - | N/A |"),
            "{md}"
        );
        assert!(
            md.contains("| read MB/s | 200.0 | - | N/A | 190.0 | -5.0% |"),
            "{md}"
        );
        let aims = r.render_aims();
        assert!(aims.starts_with(
            "| aim | workload | ratio to plain (inproc) | met (inproc) |\n|---|---|---:|---|\n"
        ));
        assert!(
            aims.contains("| int-crc32c-j >= 0.6x plain | write | 0.57x | **no** |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| verity >= 0.9x plain | read | 0.95x | yes |\n"),
            "{aims}"
        );
        assert!(
            aims.contains("| int-crc32c-b >= 0.85x plain | write | not run | - |\n"),
            "{aims}"
        );
    }

    #[test]
    fn two_transports_give_two_tables_and_labelled_ratios() {
        let r = report(
            &["inproc", "nbd"],
            vec![
                cell("inproc", "plain", "write", 1000.0),
                cell("inproc", "int-crc32c-j", "write", 100.0),
                cell("nbd", "plain", "write", 50.0),
                cell("nbd", "int-crc32c-j", "write", 40.0),
                cell("nbd", "plain", "read", 60.0),
                cell("nbd", "verity", "read", 57.0),
            ],
        );
        let md = r.render_markdown();
        let inproc = md
            .find("#### Transport `inproc` (inproc engine)")
            .expect(&md);
        let nbd = md.find("#### Transport `nbd` (nbd engine)").expect(&md);
        assert!(inproc < nbd, "{md}");
        let (first, second) = md.split_at(nbd);
        // Each table holds its own transport's figures only, ratios against its own plain.
        assert!(
            first.contains("| write MB/s | 1000.0 | 100.0 | -90.0% | - | N/A |"),
            "{md}"
        );
        assert!(
            first.contains("| read MB/s | - | - | N/A | - | N/A |"),
            "{md}"
        );
        assert!(
            second.contains("| write MB/s | 50.0 | 40.0 | -20.0% | - | N/A |"),
            "{md}"
        );
        assert!(
            second.contains("| read MB/s | 60.0 | - | N/A | 57.0 | -5.0% |"),
            "{md}"
        );
        let aims = r.render_aims();
        assert!(aims.starts_with("| aim | workload | ratio to plain (inproc) | met (inproc) | ratio to plain (nbd) | met (nbd) |\n|---|---|---:|---|---:|---|\n"), "{aims}");
        assert!(
            aims.contains(
                "| int-crc32c-j >= 0.6x plain | write | 0.10x | **no** | 0.80x | yes |\n"
            ),
            "{aims}"
        );
        assert!(
            aims.contains("| verity >= 0.9x plain | read | not run | - | 0.95x | yes |\n"),
            "{aims}"
        );
    }
}
