//! The benchmark report: what ran, the medians, and renderings (aligned text, markdown, JSON).

use std::path::Path;

use serde::Serialize;

use crate::cipher_speed::CipherSpeed;
use crate::live::LiveReport;
use crate::metrics::{BoundFigures, CpuExcess, RunMetrics};
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
    /// Server CPU per request beyond the plain row's, against the cipher's own cost (crypt
    /// rows with a plain counterpart).
    pub excess: Option<CpuExcess>,
    /// The first failure, if a run failed.
    pub error: Option<String>,
    /// Spread of the runs: (max - min) / median of read + write MB/s ([`spread_of`]);
    /// absent with fewer than two runs.
    pub spread: Option<f64>,
    /// The same spread of the runs' server CPU per request ([`cpu_spread_of`]): how much the
    /// figure a noisy run still publishes moved.
    pub cpu_spread: Option<f64>,
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
            excess: None,
            error: None,
            spread: None,
            cpu_spread: None,
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
    spread_by(runs, |r| r.read.mb_s + r.write.mb_s)
}

/// (max - min) / median of the runs' server CPU microseconds per request; `None` with fewer
/// than two runs or a zero median.
pub fn cpu_spread_of(runs: &[RunMetrics]) -> Option<f64> {
    spread_by(runs, |r| r.server_cpu_us_per_req)
}

fn spread_by(runs: &[RunMetrics], figure: impl Fn(&RunMetrics) -> f64) -> Option<f64> {
    if runs.len() < 2 {
        return None;
    }
    let mut v: Vec<f64> = runs.iter().map(figure).collect();
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
                "NOISY RUN: plain {row} repeats spread {:.0}% (> {:.0}%); {load}. Do not publish its wall-clock figures (MB/s, IOPS, latency, bound); CPU time per request and per GB stands.",
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
    /// The issue-26 CPU-time check, one line per `xts-inline` row at 4 KiB, 64 KiB and 1 MiB.
    pub cpu_check: Vec<CpuCheck>,
}

/// The configuration the CPU-time check reads: AES-XTS with both inline flags (cryptblk's
/// default pipeline).
pub const CPU_CHECK_CONFIG: &str = "xts-inline";

/// Fewer repeats than this make the CPU-time verdicts indicative only (see
/// [`BenchReport::cpu_check_caveat`]).
pub const CPU_CHECK_MIN_REPEATS: u32 = 3;

/// The request sizes the CPU-time check covers.
pub const CPU_CHECK_SIZES: [u64; 3] = [4096, 64 << 10, 1 << 20];

/// One line of the CPU-time check (issue 26): at this request size and transport,
/// `xts-inline` minus `plain` server CPU per request is within
/// [`crate::metrics::EXCESS_CIPHER_FACTOR`] x the cipher's cost +
/// [`crate::metrics::EXCESS_SLACK_US`]. A report line, never a test assertion: speed is not
/// asserted in timed tests.
#[derive(Clone, Debug, Serialize)]
pub struct CpuCheck {
    /// Workload name.
    pub workload: String,
    /// Bytes per request.
    pub block_size: u64,
    /// Transport name.
    pub transport: String,
    /// The figures.
    pub excess: CpuExcess,
}

impl CpuCheck {
    /// The checks of `results`: every `xts-inline` row with an excess whose workload's
    /// requests are of one of [`CPU_CHECK_SIZES`].
    pub fn of(results: &[ResultRow], workloads: &[Workload]) -> Vec<CpuCheck> {
        results
            .iter()
            .filter(|r| r.config == CPU_CHECK_CONFIG && r.error.is_none())
            .filter_map(|r| {
                let w = workloads.iter().find(|w| w.name == r.workload)?;
                let excess = r.excess.clone()?;
                CPU_CHECK_SIZES.contains(&w.block_size).then(|| CpuCheck {
                    workload: r.workload.clone(),
                    block_size: w.block_size,
                    transport: r.transport.clone(),
                    excess,
                })
            })
            .collect()
    }

    /// `PASS` or `FAIL`.
    pub fn verdict(&self) -> &'static str {
        if self.excess.within_limit {
            "PASS"
        } else {
            "FAIL"
        }
    }

    /// One line: the figures and the verdict.
    pub fn line(&self) -> String {
        let e = &self.excess;
        format!(
            "{} {} ({}) {}: {} - plain server CPU = {:.2} - {:.2} = {:.2} µs/request; cipher {:.2} µs ({:.2}x); limit {:.1} x cipher + {:.0} = {:.2} µs",
            self.verdict(),
            self.workload,
            size_text(self.block_size),
            self.transport,
            CPU_CHECK_CONFIG,
            e.server_us_per_req,
            e.plain_server_us_per_req,
            e.excess_us_per_req,
            e.cipher_us_per_req,
            e.excess_over_cipher,
            crate::metrics::EXCESS_CIPHER_FACTOR,
            crate::metrics::EXCESS_SLACK_US,
            e.limit_us_per_req,
        )
    }
}

/// `4 KiB`, `64 KiB`, `1 MiB`.
fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The heading of the CPU-time check in the text and markdown reports.
const CPU_CHECK_TITLE: &str = "CPU-time check (issue 26): xts-inline minus plain server CPU per request within 1.2 x the cipher's cost + 1 µs";

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

fn cpu_pair(server: f64, client: f64) -> String {
    let f = |v: f64| {
        if v == 0.0 {
            "-".to_string()
        } else {
            format!("{v:.2}")
        }
    };
    format!("{}/{}", f(server), f(client))
}

fn spread_text(s: Option<f64>, mark_over: Option<f64>) -> String {
    s.map_or(String::new(), |s| {
        let mark = if mark_over.is_some_and(|t| s > t) {
            "!"
        } else {
            ""
        };
        format!("{:.0}%{mark}", s * 100.0)
    })
}

const HEADER: [&str; 18] = [
    "config",
    "workload",
    "transport",
    "read MB/s",
    "write MB/s",
    "IOPS",
    "p50 µs r/w",
    "p99 µs r/w",
    "p99.9 µs r/w",
    "CPU µs/req srv/cli",
    "CPU s/GB srv/cli",
    "excess µs/req",
    "cipher µs/req",
    "cipher MB/s d/e",
    "bound MB/s",
    "of bound",
    "spread",
    "CPU spread",
];

/// Which of [`HEADER`]'s columns are wall-clock figures: a run marked noisy does not publish
/// them (the markdown report leaves them out).
const WALL_CLOCK: [bool; 18] = [
    false, false, false, true, true, true, true, true, true, false, false, false, false, false,
    true, true, false, false,
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
                    row.push(cpu_pair(m.server_cpu_us_per_req, m.client_cpu_us_per_req));
                    row.push(cpu_pair(m.server_cpu_s_per_gb, m.client_cpu_s_per_gb));
                    match &r.excess {
                        Some(e) => {
                            row.push(format!("{:.2}", e.excess_us_per_req));
                            row.push(format!("{:.2}", e.cipher_us_per_req));
                        }
                        None => row.extend([String::new(), String::new()]),
                    }
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
                    row.push(spread_text(r.spread, Some(NOISY_SPREAD)));
                    row.push(spread_text(r.cpu_spread, None));
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
            out.push_str(&self.cpu_check_text());
        }
        if let Some(live) = &self.live {
            out.push_str(&live.summary());
        }
        out
    }

    /// The CPU-time check's heading and lines (empty when no row qualifies).
    pub fn cpu_check_text(&self) -> String {
        if self.cpu_check.is_empty() {
            return String::new();
        }
        let mut out = format!("{CPU_CHECK_TITLE}:\n");
        for c in &self.cpu_check {
            out.push_str("  ");
            out.push_str(&c.line());
            out.push('\n');
        }
        if let Some(note) = self.cpu_check_caveat() {
            out.push_str(&format!("  {note}\n"));
        }
        out
    }

    /// Why the CPU-time verdicts of a run with fewer than [`CPU_CHECK_MIN_REPEATS`] repeats
    /// decide nothing: a `--quick` run (one 0.2 s repeat) once read 8.9 µs of excess for FUSE
    /// + loop at 4 KiB where five 0.7 s repeats read 0.26-0.85 µs.
    pub fn cpu_check_caveat(&self) -> Option<String> {
        (self.settings.repeats < CPU_CHECK_MIN_REPEATS).then(|| {
            format!(
                "({} repeat(s) of {} s: these verdicts are indicative only; judge with --repeats 5)",
                self.settings.repeats, self.settings.runtime_s
            )
        })
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

    /// The results table in markdown; a run marked noisy leaves the wall-clock columns out.
    pub fn markdown_table(&self) -> String {
        let keep = |i: usize| !(self.noise.noisy && WALL_CLOCK[i]);
        let cells: Vec<Vec<String>> = self
            .cells()
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .enumerate()
                    .filter(|(i, _)| keep(*i))
                    .map(|(_, c)| c)
                    .collect()
            })
            .collect();
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
            "CPU time is the figure that survives a shared machine: `CPU µs/req srv/cli` is CPU time \
             (user + system) per request (reads + writes completed), of this process (the in-process engine and the \
             device stack, or the NBD/FUSE server) and of fio (its usr+sys; `-` in process), and `CPU s/GB srv/cli` \
             the same per 10^9 bytes moved; each is the median of the repeats' own figures, and `CPU spread` is \
             (max - min) / median of the server's. `excess µs/req` is a crypt row's server CPU per request minus \
             its `plain` row's (same workload and transport); `cipher µs/req` is what the cipher alone costs for \
             those requests at the in-memory speeds below (one CPU, measured in this run).",
        );
        if self.noise.noisy {
            md.push_str(
                " This run was marked NOISY, so its wall-clock columns (MB/s, IOPS, latency, bound) are left \
                 out here; the JSON report keeps them.\n\n",
            );
        } else {
            md.push_str(
                " `bound` is the reference's `(plain x cipher) / (plain + cipher)` per direction (plain = the \
                 `plain` row of the same workload and transport, cipher = in-memory decrypt for reads, encrypt for \
                 writes), summed over reads and writes; `of bound` = (read + write MB/s) / bound.\n\n",
            );
        }
        md.push_str(&self.markdown_table());
        if !self.cpu_check.is_empty() {
            md.push_str(&format!("\n## {CPU_CHECK_TITLE}\n\n"));
            md.push_str("| verdict | workload | size | transport | xts-inline µs/req | plain µs/req | excess µs/req | cipher µs/req | excess / cipher | limit µs/req |\n| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
            for c in &self.cpu_check {
                let e = &c.excess;
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.2} |\n",
                    c.verdict(),
                    c.workload,
                    size_text(c.block_size),
                    c.transport,
                    e.server_us_per_req,
                    e.plain_server_us_per_req,
                    e.excess_us_per_req,
                    e.cipher_us_per_req,
                    e.excess_over_cipher,
                    e.limit_us_per_req
                ));
            }
            if let Some(note) = self.cpu_check_caveat() {
                md.push_str(&format!("\n{note}\n"));
            }
        }
        // The chart plots MB/s and p99: wall-clock figures a noisy run does not publish.
        if let Some(svg) = svg_name.filter(|_| !self.noise.noisy) {
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
            excess: None,
            error: None,
            spread: None,
            cpu_spread: None,
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

    /// A row with `server_us` server CPU µs per 4 KiB request (1000 requests) and `client_us`.
    fn cpu_row(config: &str, workload: &str, server_us: f64, client_us: f64) -> ResultRow {
        let dir = DirMetrics {
            ops: 500,
            bytes: 500 * 4096,
            mb_s: 100.0,
            ..Default::default()
        };
        let mut m = RunMetrics {
            read: dir.clone(),
            write: dir,
            server_cpu_s: server_us * 1000.0 / 1e6,
            client_cpu_s: client_us * 1000.0 / 1e6,
            ..Default::default()
        };
        m.compute_cpu_per_gb();
        let mut r = ResultRow::single(config, workload, "nbd", m);
        r.runs = vec![r.runs[0].clone(); 3];
        r.cpu_spread = cpu_spread_of(&r.runs);
        r
    }

    #[test]
    fn cpu_columns_excess_and_the_check() {
        let wl = |name: &str, bs: u64| Workload {
            name: name.into(),
            description: String::new(),
            pattern: crate::workload::AccessPattern::Random,
            read_percent: 50,
            block_size: bs,
            jobs: 1,
            iodepth: 1,
        };
        let plain = cpu_row("plain", "rw4k", 8.0, 12.0);
        let mut inline = cpu_row("xts-inline", "rw4k", 9.5, 12.0);
        // Cipher at 4096 MB/s: 1 µs a 4 KiB request; 1.5 µs over plain <= 2.2: PASS.
        inline.excess = Some(CpuExcess::new(
            plain.median.as_ref().unwrap(),
            inline.median.as_ref().unwrap(),
            4096.0,
            4096.0,
        ));
        let mut slow = cpu_row("xts-inline", "odd", 11.0, 12.0);
        // 3 µs over plain against 2.2 allowed: FAIL.
        slow.excess = Some(CpuExcess::new(
            plain.median.as_ref().unwrap(),
            slow.median.as_ref().unwrap(),
            4096.0,
            4096.0,
        ));
        let mut queued = cpu_row("xts", "rw4k", 30.0, 12.0);
        queued.excess = Some(CpuExcess::new(
            plain.median.as_ref().unwrap(),
            queued.median.as_ref().unwrap(),
            4096.0,
            4096.0,
        ));
        let mut rep = BenchReport {
            workloads: vec![wl("rw4k", 4096), wl("odd", 64 << 10), wl("other", 8192)],
            ..Default::default()
        };
        let mut elsewhere = slow.clone();
        elsewhere.workload = "other".into(); // 8 KiB: not a checked size.
        rep.results = vec![plain, inline, slow, queued, elsewhere];
        rep.cpu_check = CpuCheck::of(&rep.results, &rep.workloads);
        // Only xts-inline rows at 4 KiB / 64 KiB / 1 MiB are checked.
        assert_eq!(rep.cpu_check.len(), 2, "{:?}", rep.cpu_check);
        assert_eq!(rep.cpu_check[0].verdict(), "PASS");
        assert_eq!(rep.cpu_check[1].verdict(), "FAIL");
        assert_eq!(rep.cpu_check[1].block_size, 64 << 10);

        let t = rep.render_table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("CPU µs/req srv/cli") && lines[0].contains("excess µs/req"));
        // Server/client per request and per GB (8 µs over 4096 bytes: 1.95 s/GB).
        assert!(
            lines[2].contains("8.00/12.00") && lines[2].contains("1.95/2.93"),
            "{t}"
        );
        assert!(
            lines[3].contains("1.50") && lines[3].contains("1.00"),
            "{t}"
        );
        assert!(lines[2].contains("0%"), "CPU spread of identical runs: {t}");
        assert!(t.contains(CPU_CHECK_TITLE));
        assert!(t.contains("PASS rw4k (4 KiB) nbd: xts-inline - plain server CPU = 9.50 - 8.00 = 1.50 µs/request; cipher 1.00 µs (1.50x); limit 1.2 x cipher + 1 = 2.20 µs"), "{t}");
        assert!(t.contains("FAIL odd (64 KiB) nbd"), "{t}");
        // One repeat (a --quick run) decides nothing; five do.
        rep.settings.repeats = 1;
        assert!(rep.cpu_check_text().contains("indicative only"));
        rep.settings.repeats = 5;
        assert!(!rep.cpu_check_text().contains("indicative"));
        assert!(rep.cpu_check_caveat().is_none());

        // A quiet run's markdown keeps MB/s; a noisy one drops every wall-clock column but
        // keeps CPU time.
        let md = rep.render_markdown(None);
        assert!(md.contains("| read MB/s |") && md.contains("| PASS | rw4k | 4 KiB | nbd |"));
        rep.noise.noisy = true;
        let md = rep.render_markdown(None);
        let header = md.lines().find(|l| l.starts_with("| config")).unwrap();
        assert!(
            !header.contains("MB/s |") || header.contains("cipher MB/s"),
            "{header}"
        );
        assert!(
            !header.contains("read MB/s") && !header.contains("p99") && !header.contains("bound")
        );
        assert!(header.contains("CPU µs/req srv/cli") && header.contains("excess µs/req"));
        assert!(
            md.contains("| plain | rw4k | nbd | 8.00/12.00 | 1.95/2.93 |"),
            "{md}"
        );
        assert!(md.contains("wall-clock columns"));
        assert!(!rep
            .render_markdown(Some("bench.svg"))
            .contains("(bench.svg)"));
        let json: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        assert_eq!(json["cpu_check"][0]["excess"]["within_limit"], true);
        let fig = |k: &str| json["results"][0]["median"][k].as_f64().unwrap();
        assert!((fig("server_cpu_us_per_req") - 8.0).abs() < 1e-9);
        assert!((fig("client_cpu_us_per_req") - 12.0).abs() < 1e-9);
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
