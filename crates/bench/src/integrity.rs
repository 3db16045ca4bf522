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
//! Every read is checked against the engine's pattern, so a configuration that returned
//! wrong data fails instead of reporting a speed.

use std::sync::Arc;
use std::time::Duration;

use cryptblk_cipher::SecretBytes;
use cryptblk_dm::{BlockDevice, Mapping, Registry};
use cryptblk_format::hdrio::HeaderIo;
use serde::Serialize;

use crate::engine::{self, EngineRun};
use crate::pattern::GenerationMap;
use crate::workload::{AccessPattern, Workload};
use crate::BenchError;

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
    _held: Vec<Arc<dyn BlockDevice>>,
}

impl Drop for IntegrityStack {
    fn drop(&mut self) {
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
    /// engine's generation-0 pattern. `Ok(None)` with a reason: the configuration cannot be
    /// loaded by this build (the crypt+integrity AEAD table before crates/dm supports it).
    pub fn create(
        registry: &Arc<Registry>,
        config: &IntegrityBenchConfig,
        size: u64,
        region: u64,
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
                let data_spec = format!("ram:{region}#ibench-data-{tag}");
                let hash_spec = format!("ram:{}#ibench-hash-{tag}", region / 64 + (4 << 20));
                let data = registry.open_device(&data_spec).map_err(dm)?;
                let hash = registry.open_device(&hash_spec).map_err(dm)?;
                engine::prefill(data.as_ref(), 0, region)?;
                let mut p = cryptblk_format::verity::VerityParams::defaults(region / 4096);
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
                let t = format!("0 {} verity {params}{opts}", region / 512);
                held.push(data);
                held.push(hash);
                tables.push(t.clone());
                registry.create(&name, &t).map_err(dm)?
            }
        };
        names.push(name);
        let stack = IntegrityStack {
            config: config.clone(),
            mapping,
            generations: GenerationMap::new(region),
            tables,
            names,
            registry: registry.clone(),
            _held: held,
        };
        if config.writable() {
            engine::prefill(stack.device().as_ref(), 0, region)?;
        }
        Ok(Ok(stack))
    }

    /// The device to drive.
    pub fn device(&self) -> Arc<dyn BlockDevice> {
        self.mapping.clone()
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
        }
    }
}

/// One cell: the median MB/s of a configuration under a workload.
#[derive(Clone, Debug, Serialize)]
pub struct IntegrityCell {
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

/// Runs the experiment: per workload, `repeats` rounds over every configuration in order.
pub fn run(opts: &IntegrityBenchOptions) -> Result<IntegrityReport, BenchError> {
    if opts.region % 4096 != 0 || opts.region == 0 || opts.region > opts.device_size / 2 {
        return Err(BenchError::Options(format!(
            "region {} must be a non-zero multiple of 4096 and at most half the device size {}",
            opts.region, opts.device_size
        )));
    }
    let all = IntegrityBenchConfig::builtin();
    let mut chosen = crate::config::select("configuration", &all, |c| &c.name, &opts.configs)?;
    if !chosen.iter().any(|c| c.name == "plain") {
        chosen.insert(0, all[0].clone());
    }
    let registry = Arc::new(Registry::new());
    let mut stacks = Vec::new();
    let mut skipped = Vec::new();
    for c in &chosen {
        match IntegrityStack::create(&registry, c, opts.device_size, opts.region)? {
            Ok(s) => stacks.push(s),
            Err(why) => {
                eprintln!("{}: skipped: {why}", c.name);
                skipped.push((c.name.clone(), why));
            }
        }
    }
    let workloads = crate::config::select("workload", &workloads(), |w| &w.name, &opts.workloads)?;
    let mut cells = Vec::new();
    for w in &workloads {
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); stacks.len()];
        for r in 0..opts.repeats.max(1) {
            for (i, s) in stacks.iter().enumerate() {
                if w.read_percent < 100 && !s.config.writable() {
                    continue;
                }
                let m = engine::run(&EngineRun {
                    device: s.device(),
                    workload: w,
                    region_offset: 0,
                    region_len: opts.region,
                    runtime: opts.runtime,
                    generations: &s.generations,
                    live: None,
                    seed: 0x1a7e ^ (u64::from(r) << 16) ^ i as u64,
                })
                .map_err(|e| BenchError::Io(format!("{} {}: {e}", s.config.name, w.name)))?;
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
                config: s.config.name.clone(),
                workload: w.name.clone(),
                mb_s: median(&v),
                samples: v,
            });
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
    /// Median MB/s of `config` under `workload`.
    pub fn mb_s(&self, config: &str, workload: &str) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.config == config && c.workload == workload)
            .map(|c| c.mb_s)
    }

    /// `config`'s figure over plain's for `workload`.
    pub fn ratio(&self, config: &str, workload: &str) -> Option<f64> {
        let p = self.mb_s("plain", workload)?;
        let c = self.mb_s(config, workload)?;
        (p > 0.0).then_some(c / p)
    }

    /// The reference's table: one row per workload, per configuration its MB/s and (except
    /// plain) its overhead against plain in percent.
    pub fn render_markdown(&self) -> String {
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
                match self.mb_s(&c.name, &w.name) {
                    Some(v) => out.push_str(&format!(" {v:.1} |")),
                    None => out.push_str(" - |"),
                }
                if c.name != "plain" {
                    match self.ratio(&c.name, &w.name) {
                        Some(r) => out.push_str(&format!(" {:+.1}% |", (r - 1.0) * 100.0)),
                        None => out.push_str(" N/A |"),
                    }
                }
            }
            out.push('\n');
        }
        out
    }

    /// The aims next to the measured ratios.
    pub fn render_aims(&self) -> String {
        let mut out = String::from(
            "| aim | workload | measured ratio to plain | met |\n|---|---|---:|---|\n",
        );
        for (config, works, min) in AIMS {
            for w in works {
                let (measured, met) = match self.ratio(config, w) {
                    Some(r) => (format!("{r:.2}x"), if r >= min { "yes" } else { "**no**" }),
                    None => ("not run".to_string(), "-"),
                };
                out.push_str(&format!(
                    "| {config} >= {min}x plain | {w} | {measured} | {met} |\n"
                ));
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
            let s = match IntegrityStack::create(&registry, &c, 8 << 20, 1 << 20).unwrap() {
                Ok(s) => s,
                Err(why) => {
                    // Only the AEAD stack may be missing, and only with a loader message.
                    assert_eq!(c.name, "crypt-int-hmac-sha256", "{why}");
                    assert!(why.contains("failed to load"), "{why}");
                    continue;
                }
            };
            for w in workloads() {
                if w.read_percent < 100 && !c.writable() {
                    continue;
                }
                let m = engine::run(&EngineRun {
                    device: s.device(),
                    workload: &w,
                    region_offset: 0,
                    region_len: 1 << 20,
                    runtime: Duration::from_millis(30),
                    generations: &s.generations,
                    live: None,
                    seed: 1,
                })
                .unwrap_or_else(|e| panic!("{} {}: {e}", c.name, w.name));
                assert!(m.read.ops + m.write.ops > 0, "{} {}", c.name, w.name);
            }
        }
    }

    #[test]
    fn markdown_has_the_reference_shape() {
        let w = workloads();
        let cfgs = IntegrityBenchConfig::builtin();
        let cell = |c: &str, w: &str, v: f64| IntegrityCell {
            config: c.into(),
            workload: w.into(),
            mb_s: v,
            samples: vec![v],
        };
        let r = IntegrityReport {
            configs: vec![cfgs[0].clone(), cfgs[1].clone(), cfgs[6].clone()],
            tables: vec![],
            skipped: vec![],
            workloads: w,
            cells: vec![
                cell("plain", "write", 100.0),
                cell("int-crc32c-j", "write", 56.7),
                cell("plain", "read", 200.0),
                cell("verity", "read", 190.0),
            ],
            runtime_s: 1.0,
            repeats: 1,
            region: 1 << 20,
        };
        let md = r.render_markdown();
        assert!(md.starts_with("| | plain | integrity crc32c J | overhead | verity | overhead |"));
        assert!(
            md.contains("| write MB/s | 100.0 | 56.7 | -43.3% | - | N/A |"),
            "{md}"
        );
        assert!(
            md.contains("| read MB/s | 200.0 | - | N/A | 190.0 | -5.0% |"),
            "{md}"
        );
        let aims = r.render_aims();
        assert!(
            aims.contains("| int-crc32c-j >= 0.6x plain | write | 0.57x | **no** |"),
            "{aims}"
        );
        assert!(
            aims.contains("| verity >= 0.9x plain | read | 0.95x | yes |"),
            "{aims}"
        );
    }
}
