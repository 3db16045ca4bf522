//! The benchmark report: what ran, the medians, and renderings (aligned text, markdown, JSON).

use std::path::Path;

use serde::Serialize;

use crate::cipher_speed::CipherSpeed;
use crate::live::LiveReport;
use crate::metrics::{BoundFigures, RunMetrics};
use crate::workload::Workload;
use crate::BenchError;

/// Facts about the machine the numbers come from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostInfo {
    /// CPU model name.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Which of aes, avx2, vaes, vpclmulqdq, avx512f, avx512vl the CPU has: what the
    /// cipher's speed depends on.
    pub cpu_features: Vec<String>,
    /// On a VM with the `haltpoll` cpuidle driver: how long an idle vCPU polls before it
    /// halts. 0 makes every cross-CPU wakeup a VM exit ([`crate::placement`]).
    pub guest_halt_poll_ns: Option<u64>,
    /// Kernel release.
    pub kernel: String,
    /// `fio --version`, if fio runs.
    pub fio: Option<String>,
    /// /proc/loadavg's 1-minute figure when the run started: on a shared machine, how
    /// much else competed for the CPUs.
    pub load_avg_start: f64,
    /// The same when the run ended.
    pub load_avg_end: f64,
}

impl HostInfo {
    /// The AES-related CPU features, and the AVX-512 ones it lacks (AWS-LC's fastest
    /// AES-XTS needs them).
    pub fn features_text(&self) -> String {
        let has = |f: &str| self.cpu_features.iter().any(|x| x == f);
        let mut t = if self.cpu_features.is_empty() {
            "no AES-NI".to_string()
        } else {
            self.cpu_features.join(" ")
        };
        if has("aes") && !has("avx512f") {
            t.push_str(", no avx512f");
        }
        t
    }
}

/// The settings in force.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Settings {
    /// Smoke run.
    pub quick: bool,
    /// Seconds per run.
    pub runtime_s: f64,
    /// Runs per cell.
    pub repeats: u32,
    /// RAM disk bytes per configuration.
    pub device_size: u64,
    /// Bytes of device each transport's I/O covers.
    pub region: u64,
    /// fio `--verify=crc32c` on.
    pub fio_verify: bool,
    /// How runs are ordered.
    pub order: String,
    /// The CPUs every server thread, peer and fio ran on; empty: wherever the scheduler put
    /// them ([`crate::placement`]).
    pub cpus: Vec<usize>,
}

impl Settings {
    /// One line saying where the run's threads ran.
    pub fn placement(&self) -> String {
        if self.cpus.is_empty() {
            "placement: the scheduler placed servers and fio (--cpus all)".into()
        } else {
            format!(
                "placement: servers, engine threads, peers and fio pinned to CPU {} (--cpus)",
                crate::placement::list(&self.cpus)
            )
        }
    }
}

/// Whether a transport ran, and why not.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TransportStatus {
    /// `inproc`, `nbd`, `loop`.
    pub name: String,
    /// True if its runs were done.
    pub ran: bool,
    /// How it ran (engine, device) or why it was skipped.
    pub detail: String,
}

/// A configuration as it ran.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigInfo {
    /// Name.
    pub name: String,
    /// One-line description.
    pub description: String,
    /// The live table as `dmsetup table` prints it (key masked); for peers, the command.
    pub table: String,
    /// `read/write` pipelines the crypt target reported (`inline`, `queued`, ...).
    pub pipelines: Option<String>,
}

/// All runs of one (configuration, workload, transport) and their medians.
#[derive(Clone, Debug, Serialize)]
pub struct ResultRow {
    /// Configuration name.
    pub config: String,
    /// Workload name.
    pub workload: String,
    /// Transport name.
    pub transport: String,
    /// Each run, in the order run.
    pub runs: Vec<RunMetrics>,
    /// Field-wise medians of `runs` (absent if every run failed).
    pub median: Option<RunMetrics>,
    /// The bound and its achieved fraction (crypt rows with a plain counterpart).
    pub bound: Option<BoundFigures>,
    /// The first failure, if a run failed.
    pub error: Option<String>,
    /// Spread of the runs: (max - min) / median of read + write MB/s ([`spread_of`]);
    /// absent with fewer than two runs.
    pub spread: Option<f64>,
}

#[cfg(test)]
impl ResultRow {
    /// A row of one run `m` (the tests' fixture).
    pub(crate) fn single(config: &str, workload: &str, transport: &str, m: RunMetrics) -> Self {
        ResultRow {
            config: config.into(),
            workload: workload.into(),
            transport: transport.into(),
            runs: vec![m.clone()],
            median: Some(m),
            bound: None,
            error: None,
            spread: None,
        }
    }
}

/// A `plain` row whose repeats spread by more than this (max - min over median) marks the
/// whole run noisy. Plain rows measure the machine, not cryptblk: their repeats differ only
/// because something else took the CPUs or the memory bandwidth. 10% is several times what
/// repeats spread on an idle machine (2-4% here) and below the effects the bench is read for
/// (inline vs queued is 1.5-3x, crypt vs plain claims are 3-15% apart): past it, a ratio of
/// two medians can move by as much as the claim it is checked against.
pub const NOISY_SPREAD: f64 = 0.10;

/// (max - min) / median of the runs' read + write MB/s; `None` with fewer than two runs or
/// a zero median.
pub fn spread_of(runs: &[RunMetrics]) -> Option<f64> {
    if runs.len() < 2 {
        return None;
    }
    let mut v: Vec<f64> = runs.iter().map(|r| r.read.mb_s + r.write.mb_s).collect();
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (median > 0.0).then(|| (v[v.len() - 1] - v[0]) / median)
}

/// How much the machine disturbed the run: the load average (in [`HostInfo`]) and the
/// spread of the `plain` rows' repeats.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Noise {
    /// The largest spread of a `plain` row's repeats (absent with one repeat or no plain
    /// row).
    pub plain_spread: Option<f64>,
    /// Which plain row (`workload/transport`) spread the most.
    pub worst_plain_row: Option<String>,
    /// The spread above which the run is noisy ([`NOISY_SPREAD`]).
    pub threshold: f64,
    /// True when `plain_spread` exceeds `threshold`: the figures are not to be published.
    pub noisy: bool,
}

impl Noise {
    /// The noise of `results` (their `spread` filled in).
    pub fn of(results: &[ResultRow]) -> Noise {
        let worst = results
            .iter()
            .filter(|r| r.config == "plain")
            .filter_map(|r| {
                r.spread
                    .map(|s| (s, format!("{}/{}", r.workload, r.transport)))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        Noise {
            plain_spread: worst.as_ref().map(|w| w.0),
            noisy: worst.as_ref().is_some_and(|w| w.0 > NOISY_SPREAD),
            worst_plain_row: worst.map(|w| w.1),
            threshold: NOISY_SPREAD,
        }
    }

    /// One line for the table and the markdown report.
    pub fn summary(&self, host: &HostInfo) -> String {
        let load = format!(
            "load average {:.1} at the start, {:.1} at the end",
            host.load_avg_start, host.load_avg_end
        );
        match (&self.plain_spread, &self.worst_plain_row) {
            (Some(s), Some(row)) if self.noisy => format!(
                "NOISY RUN: plain {row} repeats spread {:.0}% (> {:.0}%); {load}. Do not publish these figures.",
                s * 100.0,
                self.threshold * 100.0
            ),
            (Some(s), Some(row)) => format!(
                "quiet run: largest plain spread {:.0}% ({row}, threshold {:.0}%); {load}.",
                s * 100.0,
                self.threshold * 100.0
            ),
            _ => format!("noise not measured (needs 2+ repeats of the plain rows); {load}."),
        }
    }
}

/// Everything a benchmark run produced.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchReport {
    /// "cryptblk bench".
    pub tool: String,
    /// Crate version.
    pub version: String,
    /// Start time, UTC, ISO 8601.
    pub started_utc: String,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
    /// The machine.
    pub host: HostInfo,
    /// The settings.
    pub settings: Settings,
    /// Which transports ran.
    pub transports: Vec<TransportStatus>,
    /// The configurations (and peers) run.
    pub configurations: Vec<ConfigInfo>,
    /// The workloads run.
    pub workloads: Vec<Workload>,
    /// In-memory cipher speeds used for the bounds.
    pub cipher_speeds: Vec<CipherSpeed>,
    /// One row per (configuration, workload, transport).
    pub results: Vec<ResultRow>,
    /// The live flip experiment, when run.
    pub live: Option<LiveReport>,
    /// How noisy the machine was.
    pub noise: Noise,
    /// `openssl speed -evp aes-256-xts` at 4 KiB in the same run, MB/s (encrypt, decrypt),
    /// when an XTS configuration ran and openssl is installed.
    pub openssl_xts_mb_s: Option<(f64, f64)>,
}

/// Formats a latency in microseconds with sensible precision.
fn us(v: f64) -> String {
    if v == 0.0 {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 1000.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn mbs(v: f64) -> String {
    format!("{v:.1}")
}

fn pair(r: f64, w: f64) -> String {
    format!("{}/{}", us(r), us(w))
}

const HEADER: [&str; 14] = [
    "config",
    "workload",
    "transport",
    "read MB/s",
    "write MB/s",
    "IOPS",
    "p50 µs r/w",
    "p99 µs r/w",
    "p99.9 µs r/w",
    "CPU s/GB",
    "cipher MB/s d/e",
    "bound MB/s",
    "of bound",
    "spread",
];

impl BenchReport {
    /// The result rows as table cells (header first).
    fn cells(&self) -> Vec<Vec<String>> {
        let mut rows = vec![HEADER.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
        for r in &self.results {
            let mut row = vec![r.config.clone(), r.workload.clone(), r.transport.clone()];
            match (&r.median, &r.error) {
                (Some(m), None) => {
                    row.push(mbs(m.read.mb_s));
                    row.push(mbs(m.write.mb_s));
                    row.push(format!("{:.0}", m.total_iops()));
                    row.push(pair(m.read.lat_p50_us, m.write.lat_p50_us));
                    row.push(pair(m.read.lat_p99_us, m.write.lat_p99_us));
                    row.push(pair(m.read.lat_p999_us, m.write.lat_p999_us));
                    row.push(format!("{:.2}", m.cpu_s_per_gb));
                    match &r.bound {
                        Some(b) => {
                            row.push(format!(
                                "{:.0}/{:.0}",
                                b.cipher_decrypt_mb_s, b.cipher_encrypt_mb_s
                            ));
                            row.push(mbs(b.bound_read_mb_s + b.bound_write_mb_s));
                            row.push(format!("{:.0}%", b.fraction * 100.0));
                        }
                        None => row.extend(["".into(), "".into(), "".into()]),
                    }
                    row.push(r.spread.map_or(String::new(), |s| {
                        let mark = if s > NOISY_SPREAD { "!" } else { "" };
                        format!("{:.0}%{mark}", s * 100.0)
                    }));
                }
                (_, err) => {
                    row.push(format!(
                        "FAILED: {}",
                        err.as_deref().unwrap_or("no successful run")
                    ));
                    row.resize(HEADER.len(), String::new());
                }
            }
            rows.push(row);
        }
        rows
    }

    /// The results as an aligned text table (what the terminal shows).
    pub fn render_table(&self) -> String {
        let cells = self.cells();
        let ncol = HEADER.len();
        let mut width = vec![0usize; ncol];
        for row in &cells {
            for (i, c) in row.iter().enumerate() {
                // A failure message spans the rest of the row; it does not widen a column.
                if !c.starts_with("FAILED") {
                    width[i] = width[i].max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        for (n, row) in cells.iter().enumerate() {
            if cells.len() == 1 {
                break; // No results (a live run): no empty table.
            }
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                let pad = width[i].saturating_sub(c.chars().count());
                if i > 0 {
                    line.push_str("  ");
                }
                if i < 3 || c.starts_with("FAILED") {
                    line.push_str(c);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(c);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if n == 0 {
                let total: usize = width.iter().sum::<usize>() + 2 * (ncol - 1);
                out.push_str(&"-".repeat(total));
                out.push('\n');
            }
        }
        for t in self.transports.iter().filter(|t| !t.ran) {
            out.push_str(&format!("transport {} skipped: {}\n", t.name, t.detail));
        }
        if cells.len() > 1 {
            for c in &self.cipher_speeds {
                out.push_str(&format!(
                    "cipher {} {}-bit, {}-byte sectors ({}): {:.0} MB/s decrypt, {:.0} MB/s encrypt\n",
                    c.cipher,
                    c.key_bytes * 8,
                    c.sector_size,
                    c.implementation,
                    c.decrypt_mb_s,
                    c.encrypt_mb_s
                ));
            }
            if let Some((enc, dec)) = self.openssl_xts_mb_s {
                out.push_str(&format!(
                    "openssl speed -evp aes-256-xts, 4 KiB: {dec:.0} MB/s decrypt, {enc:.0} MB/s encrypt\n"
                ));
            }
            out.push_str(&format!("CPU features: {}\n", self.host.features_text()));
            out.push_str(&self.placement_text());
            out.push('\n');
            out.push_str(&self.noise.summary(&self.host));
            out.push('\n');
        }
        if let Some(live) = &self.live {
            out.push_str(&live.summary());
        }
        out
    }

    /// Where the threads ran, and why it matters on this host.
    pub fn placement_text(&self) -> String {
        match self.host.guest_halt_poll_ns {
            Some(ns) => format!(
                "{} (idle vCPUs poll {ns} ns before they halt: haltpoll guest_halt_poll_ns)",
                self.settings.placement()
            ),
            None => self.settings.placement(),
        }
    }

    /// The results table in markdown.
    pub fn markdown_table(&self) -> String {
        let cells = self.cells();
        let mut out = String::new();
        for (n, row) in cells.iter().enumerate() {
            out.push_str("| ");
            out.push_str(&row.join(" | "));
            out.push_str(" |\n");
            if n == 0 {
                out.push('|');
                for i in 0..row.len() {
                    out.push_str(if i < 3 { " --- |" } else { " ---: |" });
                }
                out.push('\n');
            }
        }
        out
    }

    /// A markdown document: settings, machine, transports, cipher speeds and the table.
    pub fn render_markdown(&self, svg_name: Option<&str>) -> String {
        let s = &self.settings;
        let mut md = String::new();
        md.push_str("# cryptblk bench results\n\n");
        md.push_str(&format!(
            "Measured {} on {} ({} CPUs with {}; 1-minute load average {:.1} at the start, {:.1} at the end), kernel {}, {}. Each figure is the median of {} run(s) of {:.2} s; \
             runs alternate between configurations ({}). RAM disk of {} MiB per configuration, \
             I/O over {} MiB. MB/s are 10^6 bytes/s; latencies are total latency (submission to completion). \
             Whole run: {:.0} s.\n\n",
            self.started_utc,
            self.host.cpu,
            self.host.cpus,
            self.host.features_text(),
            self.host.load_avg_start,
            self.host.load_avg_end,
            self.host.kernel,
            self.host.fio.as_deref().unwrap_or("fio not found"),
            s.repeats,
            s.runtime_s,
            s.order,
            s.device_size >> 20,
            s.region >> 20,
            self.total_seconds,
        ));
        md.push_str(&format!("{}\n\n", self.placement_text()));
        md.push_str(&format!("**{}**\n\n", self.noise.summary(&self.host)));
        md.push_str("## Transports\n\n");
        for t in &self.transports {
            md.push_str(&format!(
                "- **{}**: {}{}\n",
                t.name,
                if t.ran { "" } else { "skipped: " },
                t.detail
            ));
        }
        md.push_str("\n## Configurations\n\n| name | table (`dmsetup table`, key masked) | pipelines r/w |\n| --- | --- | --- |\n");
        for c in &self.configurations {
            md.push_str(&format!(
                "| {} | `{}` | {} |\n",
                c.name,
                c.table,
                c.pipelines.as_deref().unwrap_or("")
            ));
        }
        if !self.cipher_speeds.is_empty() {
            md.push_str("\n## In-memory cipher speed (the bound's \"cipher\" term)\n\n| cipher | key bits | sector | block | encrypt MB/s | decrypt MB/s | implementation |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
            for c in &self.cipher_speeds {
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {:.0} | {:.0} | {} |\n",
                    c.cipher,
                    c.key_bytes * 8,
                    c.sector_size,
                    c.block_size,
                    c.encrypt_mb_s,
                    c.decrypt_mb_s,
                    c.implementation
                ));
            }
            if let Some((enc, dec)) = self.openssl_xts_mb_s {
                md.push_str(&format!(
                    "\n`openssl speed -evp aes-256-xts` at 4 KiB in the same run: {enc:.0} MB/s \
                     encrypt, {dec:.0} MB/s decrypt.\n"
                ));
            }
        }
        md.push_str("\n## Results\n\n");
        md.push_str(
            "`bound` is the reference's `(plain x cipher) / (plain + cipher)` per direction (plain = the `plain` row \
             of the same workload and transport, cipher = in-memory decrypt for reads, encrypt for writes), summed \
             over reads and writes; `of bound` = (read + write MB/s) / bound. CPU s/GB counts this process \
             (engine or server side) plus fio's usr+sys.\n\n",
        );
        md.push_str(&self.markdown_table());
        if let Some(svg) = svg_name {
            md.push_str(&format!(
                "\n![throughput and p99 per configuration]({svg})\n"
            ));
        }
        if let Some(live) = &self.live {
            md.push_str("\n## Live flip\n\n");
            md.push_str(&live.summary());
        }
        md
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report types serialize")
    }

    /// Rows that failed.
    pub fn failures(&self) -> Vec<&ResultRow> {
        self.results.iter().filter(|r| r.error.is_some()).collect()
    }
}

/// How the markdown report at `markdown` links the chart at `svg`: by file name when both sit
/// in one directory, else by the path given.
pub fn chart_link(svg: &Path, markdown: &Path) -> String {
    if svg.parent() == markdown.parent() {
        svg.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        svg.display().to_string()
    }
}

/// Writes `text` to `path`, naming the file in the error.
pub fn write_file(path: &Path, text: &str) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::Output {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
    }
    std::fs::write(path, text).map_err(|e| BenchError::Output {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DirMetrics;

    fn row(config: &str, mb: f64, bound: Option<BoundFigures>) -> ResultRow {
        let m = RunMetrics {
            read: DirMetrics {
                mb_s: mb,
                iops: 10.0,
                ops: 1,
                lat_p50_us: 5.5,
                lat_p99_us: 12.25,
                lat_p999_us: 1500.0,
                ..Default::default()
            },
            write: DirMetrics {
                mb_s: mb,
                iops: 10.0,
                ops: 1,
                lat_p50_us: 6.0,
                lat_p99_us: 13.0,
                lat_p999_us: 2000.0,
                ..Default::default()
            },
            cpu_s_per_gb: 1.5,
            ..Default::default()
        };
        ResultRow {
            config: config.into(),
            workload: "rw4k".into(),
            transport: "inproc".into(),
            runs: vec![m.clone()],
            median: Some(m),
            bound,
            error: None,
            spread: None,
        }
    }

    #[test]
    fn table_is_aligned_and_complete() {
        let mut rep = BenchReport::default();
        rep.results.push(row("plain", 1126.0, None));
        rep.results.push(row(
            "xts",
            147.0,
            Some(BoundFigures {
                bound_read_mb_s: 696.0,
                bound_write_mb_s: 696.0,
                fraction: 0.2112,
                cipher_decrypt_mb_s: 1900.0,
                cipher_encrypt_mb_s: 1823.0,
                ..Default::default()
            }),
        ));
        let mut failed = row("xts-inline", 0.0, None);
        failed.error = Some("fio: boom".into());
        failed.median = None;
        rep.results.push(failed);
        rep.transports.push(TransportStatus {
            name: "loop".into(),
            ran: false,
            detail: "needs root".into(),
        });
        let t = rep.render_table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("config"));
        assert!(lines[1].chars().all(|c| c == '-'));
        // Right-aligned numeric columns end at the same position on every data row.
        let end = |line: &str, v: &str| line.find(v).map(|i| i + v.len()).unwrap();
        assert_eq!(end(lines[2], "1126.0"), end(lines[3], "147.0"));
        assert_eq!(end(lines[0], "read MB/s"), end(lines[2], "1126.0"));
        assert!(
            lines[2].contains("1126.0")
                && lines[2].contains("5.50/6.00")
                && lines[2].contains("1500/2000")
        );
        assert!(
            lines[3].contains("1900/1823")
                && lines[3].contains("1392.0")
                && lines[3].contains("21%")
        );
        assert!(lines[4].contains("FAILED: fio: boom"));
        assert!(t.contains("transport loop skipped: needs root"));
        let md = rep.render_markdown(Some("bench.svg"));
        assert!(md.contains("| plain | rw4k | inproc | 1126.0 |"));
        assert!(md.contains("![throughput and p99 per configuration](bench.svg)"));
        let json: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        assert_eq!(json["results"][1]["bound"]["bound_read_mb_s"], 696.0);
        assert_eq!(rep.failures().len(), 1);
        assert!(t.contains("noise not measured"));
    }

    #[test]
    fn plain_spread_over_the_threshold_marks_the_run_noisy() {
        let run = |mb: f64| row("plain", mb, None).runs.remove(0);
        // Read + write per run: 200, 210, 190: spread 20/200.
        let runs = vec![run(100.0), run(105.0), run(95.0)];
        assert!((spread_of(&runs).unwrap() - 0.10).abs() < 1e-9);
        assert_eq!(spread_of(&runs[..1]), None);
        let mut quiet = row("plain", 100.0, None);
        quiet.spread = spread_of(&runs);
        let mut xts = row("xts", 50.0, None);
        xts.spread = Some(0.5); // crypt rows do not decide: only plain measures the machine.
        let noise = Noise::of(&[quiet.clone(), xts.clone()]);
        assert!(!noise.noisy, "exactly the threshold is not over it");
        assert_eq!(noise.worst_plain_row.as_deref(), Some("rw4k/inproc"));
        let mut loud = quiet.clone();
        loud.transport = "nbd".into();
        loud.spread = spread_of(&[run(100.0), run(130.0), run(100.0)]);
        let mut rep = BenchReport::default();
        rep.results = vec![quiet, xts, loud];
        rep.noise = Noise::of(&rep.results);
        assert!(rep.noise.noisy);
        assert_eq!(rep.noise.worst_plain_row.as_deref(), Some("rw4k/nbd"));
        let t = rep.render_table();
        assert!(
            t.contains("NOISY RUN: plain rw4k/nbd repeats spread 30%"),
            "{t}"
        );
        assert!(t.contains("30%!"));
        let json: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        assert_eq!(json["noise"]["noisy"], true);
        assert_eq!(json["noise"]["threshold"], NOISY_SPREAD);
        assert!(rep.render_markdown(None).contains("**NOISY RUN"));
    }
}
