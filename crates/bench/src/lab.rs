//! `cryptblk bench --transport ublk` and `--transport vhost-user`: the bench in the kernel
//! lab VM (`../shared/lab`), beside the guest kernel's own dm-crypt.
//!
//! The machines cryptblk is built on have no ublk, device-mapper or vhost-user guest, so
//! these transports are measured inside the lab: a Debian kernel booted under QEMU. One boot
//! per transport runs the same fio jobs as the rest of the bench (built by [`FioJob::args`]
//! for the same [`Workload`]s, `--direct=1` on a block device) on
//!
//! - `plain`: a brd RAM disk;
//! - `kernel-crypt` and `kernel-crypt-nowq`: the guest kernel's dm-crypt, aes-xts-plain64
//!   with 4096-byte sectors (a default LUKS2 volume's), queued and with
//!   `no_read_workqueue no_write_workqueue`, each over its own RAM disk;
//! - `cryptblk-inline` and `cryptblk-queued`: cryptblk's crypt target with the same table,
//!   cryptblk's default inline pipeline and the kernel's queued model, served over the
//!   transport: for ublk by `cryptblk dm create --ublk` in the guest over a RAM disk; for
//!   vhost-user by `cryptblk open --vhost-user` of a LUKS2 image on the host, the guest's
//!   virtio disk;
//! - the transport without encryption: `cryptblk-linear` (a linear table served the same
//!   way) and, for vhost-user, `qsd-raw`: qemu-storage-daemon's vhost-user-blk export of a
//!   raw file, QEMU's own server.
//!
//! The guest side is `tests/lab/bench-guest.sh` and the staging `tests/lab/run.sh` (both
//! built in, so an installed binary needs only the lab): the bench writes the devices and
//! jobs to the shared directory, boots the lab and reads fio's JSON back. Rows, medians and
//! the noise measure are the rest of the bench's ([`BenchReport`]); [`LabReport`] adds the
//! ratios the lab is for.
//!
//! Under TCG (the lab's emulated CPU wherever KVM cannot boot a stock kernel) every guest
//! instruction is emulated: absolute figures mean nothing, only ratios between rows of one
//! boot do, and the report says so.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::{select, XTS_CIPHER};
use crate::fio::{self, FioJob, FioTarget, FioVerify};
use crate::metrics::{self, RunMetrics};
use crate::report::{
    self, BenchReport, ConfigInfo, HostInfo, Noise, ResultRow, Settings, TransportStatus,
};
use crate::workload::Workload;
use crate::{BenchError, BenchOptions};

/// The lab's host-side runner (run.sh and the boot-retrying vm.sh it calls), guest helpers and
/// guest script, built into the binary: (file name, text, executable). Every file that one of
/// them runs or sources beside itself must be here (the test `embedded_scripts_are_complete`).
const LAB_SCRIPTS: &[(&str, &str, bool)] = &[
    ("run.sh", include_str!("../../../tests/lab/run.sh"), true),
    ("vm.sh", include_str!("../../../tests/lab/vm.sh"), true),
    ("lib.sh", include_str!("../../../tests/lab/lib.sh"), false),
    (
        "bench-guest.sh",
        include_str!("../../../tests/lab/bench-guest.sh"),
        true,
    ),
];

/// Writes the embedded lab scripts into `dir` (the bench's stand-in for `tests/lab/`).
fn write_lab_scripts(dir: &Path) -> Result<(), BenchError> {
    for (name, text, exec) in LAB_SCRIPTS {
        if *exec {
            write_exec(&dir.join(name), text)?;
        } else {
            write(&dir.join(name), text)?;
        }
    }
    Ok(())
}

/// Printed with every lab table: what the figures are worth.
pub const EMULATED_CAVEAT: &str = "EMULATED CPU (QEMU TCG): every guest instruction is emulated; absolute MB/s and latencies mean nothing, compare ratios within one run only.";

/// A transport measured in the lab VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LabTransport {
    /// cryptblk serves `/dev/ublkbN` inside the guest.
    Ublk,
    /// cryptblk serves the guest's virtio disk from the host (vhost-user-blk).
    VhostUser,
}

impl LabTransport {
    /// Both, in run order.
    pub const ALL: [LabTransport; 2] = [LabTransport::Ublk, LabTransport::VhostUser];

    /// The name used in `--transport` and reports.
    pub fn name(self) -> &'static str {
        match self {
            LabTransport::Ublk => "ublk",
            LabTransport::VhostUser => "vhost-user",
        }
    }

    /// The transport named `name`, if it is a lab transport.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The row that is this transport without encryption (the ratios' "transport plain").
    fn transport_plain(self) -> &'static str {
        match self {
            LabTransport::Ublk => "cryptblk-linear",
            LabTransport::VhostUser => "qsd-raw",
        }
    }
}

/// True if `name` is measured in the lab (`ublk`, `vhost-user`).
pub fn is_lab_transport(name: &str) -> bool {
    LabTransport::from_name(name).is_some()
}

/// Who serves a vhost-user disk on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostServer {
    /// qemu-storage-daemon, raw file.
    QsdRaw,
    /// `cryptblk open --vhost-user` of a LUKS2 image; `queued` adds `--perf-queued`.
    Open { queued: bool },
    /// `cryptblk dm create --vhost-user` of a linear table over a raw file.
    Linear,
}

/// How the guest makes a device (bench-guest.sh's KIND).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Brd,
    KernelCrypt,
    Ublk,
    Nbd,
    FuseLoop,
    Vhost(HostServer),
}

impl Kind {
    fn guest_kind(self) -> &'static str {
        match self {
            Kind::Brd => "brd",
            Kind::KernelCrypt => "kcrypt",
            Kind::Ublk => "ublk",
            Kind::Nbd => "nbd",
            Kind::FuseLoop => "fuse-loop",
            Kind::Vhost(_) => "vhost",
        }
    }
}

/// One device measured in the lab.
#[derive(Clone, Debug)]
struct LabConfig {
    name: &'static str,
    description: &'static str,
    kind: Kind,
    /// The dm table over the guest's RAM disk, `@SECTORS@ @KEY@ @DEV@` filled in there.
    table: Option<&'static str>,
    /// Run when no `--config` is given.
    default: bool,
}

const XTS_QUEUED: &str = "0 @SECTORS@ crypt aes-xts-plain64 @KEY@ 0 @DEV@ 0 1 sector_size:4096";
const XTS_INLINE: &str = "0 @SECTORS@ crypt aes-xts-plain64 @KEY@ 0 @DEV@ 0 3 no_read_workqueue no_write_workqueue sector_size:4096";
const LINEAR: &str = "0 @SECTORS@ linear @DEV@ 0";
const NULL_QUEUED: &str = "0 @SECTORS@ crypt capi:ecb(cipher_null) - 0 @DEV@ 0";

fn lab_configs(t: LabTransport) -> Vec<LabConfig> {
    let c = |name, description, kind, table, default| LabConfig {
        name,
        description,
        kind,
        table,
        default,
    };
    let mut v = vec![
        c("plain", "the guest's brd RAM disk", Kind::Brd, None, true),
        c(
            "kernel-crypt",
            "guest kernel dm-crypt, aes-xts-plain64, 4096-byte sectors, default queued pipeline",
            Kind::KernelCrypt,
            Some(XTS_QUEUED),
            true,
        ),
        c(
            "kernel-crypt-nowq",
            "guest kernel dm-crypt as kernel-crypt, with no_read_workqueue no_write_workqueue",
            Kind::KernelCrypt,
            Some(XTS_INLINE),
            true,
        ),
    ];
    match t {
        LabTransport::Ublk => v.extend([
            c(
                "cryptblk-inline",
                "cryptblk dm create --ublk in the guest: kernel-crypt-nowq's table (cryptblk's default inline pipeline)",
                Kind::Ublk,
                Some(XTS_INLINE),
                true,
            ),
            c(
                "cryptblk-queued",
                "cryptblk dm create --ublk in the guest: kernel-crypt's table (queued pipeline)",
                Kind::Ublk,
                Some(XTS_QUEUED),
                true,
            ),
            c(
                "cryptblk-linear",
                "cryptblk dm create --ublk in the guest, linear table: ublk without encryption",
                Kind::Ublk,
                Some(LINEAR),
                true,
            ),
            c(
                "kernel-null",
                "guest kernel dm-crypt, null cipher, queued",
                Kind::KernelCrypt,
                Some(NULL_QUEUED),
                false,
            ),
            c(
                "cryptblk-null",
                "cryptblk over ublk, null cipher, queued",
                Kind::Ublk,
                Some(NULL_QUEUED),
                false,
            ),
            c(
                "cryptblk-nbd",
                "cryptblk-inline's table served over NBD in the guest, kernel nbd-client",
                Kind::Nbd,
                Some(XTS_INLINE),
                false,
            ),
            c(
                "cryptblk-fuse-loop",
                "cryptblk-inline's table served over FUSE in the guest, losetup --direct-io",
                Kind::FuseLoop,
                Some(XTS_INLINE),
                false,
            ),
        ]),
        LabTransport::VhostUser => v.extend([
            c(
                "cryptblk-inline",
                "host: cryptblk open --vhost-user of a LUKS2 image (aes-xts-plain64, 4096-byte sectors; default inline pipeline)",
                Kind::Vhost(HostServer::Open { queued: false }),
                None,
                true,
            ),
            c(
                "cryptblk-queued",
                "host: cryptblk open --vhost-user --perf-queued of a LUKS2 image",
                Kind::Vhost(HostServer::Open { queued: true }),
                None,
                true,
            ),
            c(
                "cryptblk-linear",
                "host: cryptblk dm create --vhost-user, linear table over a raw file",
                Kind::Vhost(HostServer::Linear),
                None,
                true,
            ),
            c(
                "qsd-raw",
                "host: qemu-storage-daemon --export vhost-user-blk of a raw file (QEMU's own server)",
                Kind::Vhost(HostServer::QsdRaw),
                None,
                true,
            ),
        ]),
    }
    v
}

/// The rows the ratios divide by, besides the transport's own plain row.
const BASES: [&str; 3] = ["kernel-crypt", "kernel-crypt-nowq", "plain"];

/// The lab's workloads: the bench's QD1 workloads and, cheap enough under emulation, the
/// larger ones at 4 requests in flight (built-in ones of those names win).
pub fn lab_workloads(quick: bool) -> Vec<Workload> {
    let builtin = Workload::builtin();
    let named = |n: &str| builtin.iter().find(|w| w.name == n).cloned();
    let qd4 = |n: &str, base: &str| {
        named(n).or_else(|| {
            named(base).map(|w| Workload {
                name: n.into(),
                description: format!("{}, 4 requests in flight (libaio iodepth 4)", w.description)
                    .replace(", iodepth 1", ""),
                iodepth: 4,
                ..w
            })
        })
    };
    let mut v: Vec<Workload> = ["rw4k", "randrw64k", "randrw1m"]
        .iter()
        .filter_map(|n| named(n))
        .collect();
    if !quick {
        v.extend(qd4("randrw64k-qd4", "randrw64k"));
        v.extend(qd4("randrw1m-qd4", "randrw1m"));
    }
    v
}

/// Where the lab is, and which cryptblk binary to stage in it.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// The lab directory (holding `run-in-vm.sh`); `None`: `LAB_DIR`, else `../shared/lab`
    /// from the current directory or from the binary's workspace.
    pub lab_dir: Option<PathBuf>,
    /// The cryptblk binary served in the guest and on the host (the running one).
    pub cryptblk: PathBuf,
}

/// One cryptblk row against the rows it is read beside (read + write MB/s ratios).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RatioRow {
    /// Workload.
    pub workload: String,
    /// `ublk` or `vhost-user`.
    pub transport: String,
    /// The cryptblk row (`cryptblk-inline`, `cryptblk-queued`, ...).
    pub config: String,
    /// Its read + write MB/s.
    pub mb_s: f64,
    /// / the guest kernel's dm-crypt, default queued.
    pub vs_kernel_crypt: Option<f64>,
    /// / the guest kernel's dm-crypt with no_read_workqueue no_write_workqueue.
    pub vs_kernel_crypt_nowq: Option<f64>,
    /// / the brd RAM disk.
    pub vs_plain: Option<f64>,
    /// / the same transport without encryption ([`RatioRow::transport_plain`]).
    pub vs_transport_plain: Option<f64>,
    /// The row `vs_transport_plain` divides by (`cryptblk-linear`, `qsd-raw`).
    pub transport_plain: String,
}

/// One boot of the lab.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LabRun {
    /// `ublk` or `vhost-user`.
    pub transport: String,
    /// QEMU's accelerator (`tcg` or `kvm`), from the lab's own report.
    pub accel: String,
    /// The guest's kernel release.
    pub guest_kernel: String,
    /// The guest's vCPUs.
    pub guest_cpus: usize,
    /// The guest's CPU model name.
    pub guest_cpu: String,
    /// Seconds from staging to power-off.
    pub seconds: f64,
    /// The guest script's exit status (0: every device set up and every fio run done).
    pub exit_status: Option<i32>,
}

/// What a lab bench adds to the bench's report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LabInfo {
    /// True when a boot ran under TCG (then only ratios mean anything).
    pub emulated: bool,
    /// The caveat printed with the tables.
    pub caveat: String,
    /// The boots.
    pub runs: Vec<LabRun>,
    /// cryptblk's rows over the kernel's and the plain ones.
    pub ratios: Vec<RatioRow>,
}

/// A lab bench: the bench's report (same rows, same JSON) plus the ratios.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LabReport {
    /// The rows, settings, noise, ... as every bench report has them.
    #[serde(flatten)]
    pub report: BenchReport,
    /// The lab's boots and ratios.
    pub lab: LabInfo,
}

fn ratio(a: f64, b: Option<f64>) -> Option<f64> {
    b.filter(|b| *b > 0.0 && a > 0.0).map(|b| a / b)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.3}"))
}

impl LabReport {
    /// The ratio rows as cells, header first.
    fn ratio_cells(&self) -> Vec<Vec<String>> {
        let mut rows = vec![[
            "config",
            "workload",
            "transport",
            "MB/s r+w",
            "/ kernel-crypt",
            "/ kernel-crypt-nowq",
            "/ plain",
            "/ transport plain",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()];
        for r in &self.lab.ratios {
            rows.push(vec![
                r.config.clone(),
                r.workload.clone(),
                r.transport.clone(),
                format!("{:.1}", r.mb_s),
                fmt_ratio(r.vs_kernel_crypt),
                fmt_ratio(r.vs_kernel_crypt_nowq),
                fmt_ratio(r.vs_plain),
                format!(
                    "{} ({})",
                    fmt_ratio(r.vs_transport_plain),
                    r.transport_plain
                ),
            ]);
        }
        rows
    }

    fn caveat_line(&self) -> String {
        if self.lab.emulated {
            format!("{}\n", self.lab.caveat)
        } else {
            String::new()
        }
    }

    /// The bench's table, the ratios and the caveat, as the terminal shows them.
    pub fn render_table(&self) -> String {
        let mut out = self.caveat_line();
        out.push_str(&self.report.render_table());
        let cells = self.ratio_cells();
        if cells.len() > 1 {
            let mut width = vec![0usize; cells[0].len()];
            for row in &cells {
                for (i, c) in row.iter().enumerate() {
                    width[i] = width[i].max(c.chars().count());
                }
            }
            out.push_str("\nratios of read + write MB/s (same guest, same run):\n");
            for (n, row) in cells.iter().enumerate() {
                let line: Vec<String> = row
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        if i < 3 {
                            format!("{c:<w$}", w = width[i])
                        } else {
                            format!("{c:>w$}", w = width[i])
                        }
                    })
                    .collect();
                out.push_str(line.join("  ").trim_end());
                out.push('\n');
                if n == 0 {
                    out.push_str(&"-".repeat(width.iter().sum::<usize>() + 2 * (width.len() - 1)));
                    out.push('\n');
                }
            }
        }
        for run in &self.lab.runs {
            out.push_str(&format!(
                "lab {}: {} ({}), kernel {}, {} vCPUs, {:.0} s{}\n",
                run.transport,
                run.guest_cpu,
                run.accel,
                run.guest_kernel,
                run.guest_cpus,
                run.seconds,
                match run.exit_status {
                    Some(0) => String::new(),
                    Some(s) => format!(", guest script exited {s}"),
                    None => ", guest script did not finish".into(),
                }
            ));
        }
        out.push_str(&self.caveat_line());
        out
    }

    /// A markdown document: the bench's, with the caveat and the ratio table.
    pub fn render_markdown(&self, svg_name: Option<&str>) -> String {
        let mut md = self.report.render_markdown(svg_name);
        if let Some(rest) = md.strip_prefix("# cryptblk bench results\n\n") {
            md = format!(
                "# cryptblk bench results (kernel lab)\n\n{}{rest}",
                if self.lab.emulated {
                    format!("**{}**\n\n", self.lab.caveat)
                } else {
                    String::new()
                }
            );
        }
        md.push_str("\n## Ratios (read + write MB/s, same guest, same run)\n\n");
        for (n, row) in self.ratio_cells().iter().enumerate() {
            md.push_str(&format!("| {} |\n", row.join(" | ")));
            if n == 0 {
                md.push_str(&format!(
                    "|{}\n",
                    (0..row.len())
                        .map(|i| if i < 3 { " --- |" } else { " ---: |" })
                        .collect::<String>()
                ));
            }
        }
        md
    }

    /// The report as pretty JSON (the bench's fields, plus `lab`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("report types serialize")
    }

    /// Rows that failed.
    pub fn failures(&self) -> Vec<&ResultRow> {
        self.report.failures()
    }
}

/// The ratios of every row that is not a base of `t` over the bases, per workload.
fn ratios_of(results: &[ResultRow], t: LabTransport) -> Vec<RatioRow> {
    let total = |config: &str, wl: &str| {
        results
            .iter()
            .find(|r| r.transport == t.name() && r.workload == wl && r.config == config)
            .and_then(|r| r.median.as_ref())
            .map(RunMetrics::total_mb_s)
    };
    results
        .iter()
        .filter(|r| r.transport == t.name())
        .filter(|r| !BASES.contains(&r.config.as_str()) && r.config != t.transport_plain())
        .filter(|r| !r.config.starts_with("kernel-"))
        .filter_map(|r| {
            let mb_s = r.median.as_ref()?.total_mb_s();
            Some(RatioRow {
                workload: r.workload.clone(),
                transport: r.transport.clone(),
                config: r.config.clone(),
                mb_s,
                vs_kernel_crypt: ratio(mb_s, total("kernel-crypt", &r.workload)),
                vs_kernel_crypt_nowq: ratio(mb_s, total("kernel-crypt-nowq", &r.workload)),
                vs_plain: ratio(mb_s, total("plain", &r.workload)),
                vs_transport_plain: ratio(mb_s, total(t.transport_plain(), &r.workload)),
                transport_plain: t.transport_plain().into(),
            })
        })
        .collect()
}

fn find_lab_dir(given: Option<&Path>) -> Result<PathBuf, BenchError> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = given {
        candidates.push(d.to_path_buf());
    } else {
        if let Some(d) = std::env::var_os("LAB_DIR") {
            candidates.push(PathBuf::from(d));
        }
        candidates.push(PathBuf::from("../shared/lab"));
        // <workspace>/target/<profile>/cryptblk -> <workspace>/../shared/lab
        if let Ok(exe) = std::env::current_exe() {
            if let Some(ws) = exe.ancestors().nth(3) {
                candidates.push(ws.join("../shared/lab"));
            }
        }
    }
    for c in candidates {
        if c.join("run-in-vm.sh").is_file() {
            return c
                .canonicalize()
                .map_err(|e| BenchError::Io(format!("{}: {e}", c.display())));
        }
        tried.push(c.display().to_string());
    }
    Err(BenchError::Tool(format!(
        "the kernel lab (run-in-vm.sh) is not in {}: set LAB_DIR to the lab directory",
        tried.join(", ")
    )))
}

/// Settings of a lab run after defaults.
struct LabSettings {
    runtime: Duration,
    repeats: u32,
    region_mb: u64,
    disk_mb: u64,
}

impl LabSettings {
    fn of(opts: &BenchOptions) -> Result<Self, BenchError> {
        // Under emulation a fio job takes about a second to start: runs shorter than a few
        // seconds measure mostly that.
        let runtime = opts.runtime.unwrap_or(if opts.quick {
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        });
        if runtime < Duration::from_millis(500) {
            return Err(BenchError::Options(
                "lab runs need a runtime of at least 0.5 s".into(),
            ));
        }
        let region_mb = opts
            .region
            .map(|r| r >> 20)
            .unwrap_or(if opts.quick { 32 } else { 64 });
        let disk_mb = opts
            .device_size
            .map(|d| d >> 20)
            .unwrap_or(region_mb + 16)
            .max(region_mb);
        if region_mb == 0 {
            return Err(BenchError::Options(
                "the region must be at least 1 MiB".into(),
            ));
        }
        Ok(LabSettings {
            runtime,
            repeats: opts
                .repeats
                .unwrap_or(if opts.quick { 1 } else { 3 })
                .max(1),
            region_mb,
            disk_mb,
        })
    }
}

/// Servers on the host for a vhost-user boot; stopped on drop.
struct HostServers {
    cryptblk: PathBuf,
    runtime_dir: PathBuf,
    qsd: Option<Child>,
    opened: Vec<String>,
}

impl HostServers {
    fn cryptblk(&self) -> Command {
        let mut c = Command::new(&self.cryptblk);
        c.env("CRYPTBLK_RUNTIME_DIR", &self.runtime_dir)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for HostServers {
    fn drop(&mut self) {
        let opened = std::mem::take(&mut self.opened);
        for name in opened.iter().rev() {
            let _ = self
                .cryptblk()
                .args(["close", name])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if let Some(mut q) = self.qsd.take() {
            let _ = q.kill();
            let _ = q.wait();
        }
    }
}

fn run_checked(mut cmd: Command, what: &str) -> Result<String, BenchError> {
    let out = cmd
        .output()
        .map_err(|e| BenchError::Tool(format!("cannot run {what}: {e}")))?;
    if !out.status.success() {
        return Err(BenchError::Tool(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait_for_socket(p: &Path, child: &mut Child) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.exists() {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(BenchError::Tool(format!(
                "qemu-storage-daemon exited ({st})"
            )));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Tool(format!(
                "qemu-storage-daemon made no socket {} in 20 s",
                p.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The size `cryptblk status --json` reports for a served volume.
fn served_size(servers: &HostServers, name: &str) -> Result<(u64, String), BenchError> {
    let text = run_checked(
        {
            let mut c = servers.cryptblk();
            c.args(["status", name, "--json"]);
            c
        },
        "cryptblk status",
    )?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| BenchError::Tool(format!("cryptblk status --json: {e}")))?;
    let size = v["size"]
        .as_u64()
        .ok_or_else(|| BenchError::Tool(format!("no size in cryptblk status: {text}")))?;
    Ok((size, pipelines_of(&v).unwrap_or_default()))
}

/// `read/write` pipelines from `cryptblk status --json` (its `pipeline` entries).
fn pipelines_of(status: &serde_json::Value) -> Option<String> {
    let p = status.get("pipeline")?.as_array()?;
    let items: Vec<String> = p
        .iter()
        .filter_map(|e| {
            let r = e.get("read")?.as_str()?;
            let w = e.get("write")?.as_str()?;
            Some(format!("{r}/{w}"))
        })
        .collect();
    (!items.is_empty()).then(|| items.join(", "))
}

/// Per configuration: the served disk's size in bytes and its `read/write` pipelines.
type ServedDisks = BTreeMap<String, (u64, String)>;

/// Starts the host servers of a vhost-user boot; returns them, each config's disk size in
/// bytes (the guest finds its virtio disk by size) and its pipelines, and QEMU's arguments.
fn start_vhost_servers(
    configs: &[LabConfig],
    lab: &LabOptions,
    work: &Path,
    disk_mb: u64,
) -> Result<(HostServers, ServedDisks, String), BenchError> {
    let mut servers = HostServers {
        cryptblk: lab.cryptblk.clone(),
        runtime_dir: work.join("run"),
        qsd: None,
        opened: Vec::new(),
    };
    let key = work.join("key");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut k = [0u8; 32];
        fastrand::fill(&mut k);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .map_err(|e| BenchError::Io(format!("{}: {e}", key.display())))?;
        std::io::Write::write_all(&mut f, &k)
            .map_err(|e| BenchError::Io(format!("{}: {e}", key.display())))?;
    }
    let mut sizes = BTreeMap::new();
    let mut qemu_args = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        let Kind::Vhost(server) = c.kind else {
            continue;
        };
        // Distinct sizes, so that the guest can tell its virtio disks apart.
        let image_mb = disk_mb + 16 + 4 * i as u64;
        let img = work.join(format!("{}.img", c.name));
        let sock = work.join(format!("{}.sock", c.name));
        let file = std::fs::File::create(&img)
            .map_err(|e| BenchError::Io(format!("{}: {e}", img.display())))?;
        file.set_len(image_mb << 20)
            .map_err(|e| BenchError::Io(format!("{}: {e}", img.display())))?;
        drop(file);
        let vol = format!("labbench-{}-{}", std::process::id(), c.name);
        match server {
            HostServer::QsdRaw => {
                let mut cmd = Command::new("qemu-storage-daemon");
                cmd.arg("--blockdev")
                    .arg(format!(
                        "driver=file,filename={},node-name=d,cache.direct=off",
                        img.display()
                    ))
                    .arg("--export")
                    .arg(format!(
                        "type=vhost-user-blk,id=e,node-name=d,addr.type=unix,addr.path={},writable=on,num-queues=1",
                        sock.display()
                    ))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                let mut child = cmd.spawn().map_err(|e| {
                    BenchError::Tool(format!(
                        "cannot run qemu-storage-daemon (apt-get install qemu-system-common): {e}"
                    ))
                })?;
                let ready = wait_for_socket(&sock, &mut child);
                servers.qsd = Some(child);
                ready?;
                sizes.insert(c.name.to_string(), (image_mb << 20, String::new()));
            }
            HostServer::Open { queued } => {
                let mut fmt = servers.cryptblk();
                fmt.args([
                    "luksFormat",
                    "--batch-mode",
                    "--type",
                    "luks2",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    "--sector-size",
                    "4096",
                    "--key-file",
                ])
                .arg(&key)
                .arg(&img);
                run_checked(fmt, "cryptblk luksFormat")?;
                let mut open = servers.cryptblk();
                open.arg("open")
                    .arg("--key-file")
                    .arg(&key)
                    .arg(&img)
                    .arg(&vol)
                    .arg("--vhost-user")
                    .arg(&sock)
                    .args(["--queues", "1"]);
                if queued {
                    open.arg("--perf-queued");
                }
                run_checked(open, "cryptblk open --vhost-user")?;
                servers.opened.push(vol.clone());
                sizes.insert(c.name.to_string(), served_size(&servers, &vol)?);
            }
            HostServer::Linear => {
                let table = work.join(format!("{}.table", c.name));
                std::fs::write(
                    &table,
                    format!("0 {} linear {} 0\n", (image_mb << 20) / 512, img.display()),
                )
                .map_err(|e| BenchError::Io(format!("{}: {e}", table.display())))?;
                let mut create = servers.cryptblk();
                create
                    .args(["dm", "create", &vol, "--table-file"])
                    .arg(&table)
                    .arg("--vhost-user")
                    .arg(&sock);
                run_checked(create, "cryptblk dm create --vhost-user")?;
                servers.opened.push(vol.clone());
                sizes.insert(c.name.to_string(), served_size(&servers, &vol)?);
            }
        }
        let n = qemu_args.len() / 2;
        qemu_args.push(format!("-chardev socket,id=vu{n},path={}", sock.display()));
        qemu_args.push(format!(
            "-device vhost-user-blk-pci,chardev=vu{n},num-queues=1"
        ));
    }
    let mut seen: Vec<u64> = sizes.values().map(|s| s.0).collect();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != sizes.len() {
        return Err(BenchError::Tool(format!(
            "two vhost-user disks have the same size ({sizes:?}): the guest could not tell them apart"
        )));
    }
    Ok((servers, sizes, qemu_args.join(" ")))
}

fn write(p: &Path, text: &str) -> Result<(), BenchError> {
    report::write_file(p, text)
}

fn write_exec(p: &Path, text: &str) -> Result<(), BenchError> {
    use std::os::unix::fs::PermissionsExt;
    write(p, text)?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| BenchError::Io(format!("{}: {e}", p.display())))
}

/// Output of one lab boot: stdout lines (the guest's log), exit status, accelerator.
struct Boot {
    log: Vec<String>,
    status: Option<i32>,
    accel: String,
    seconds: f64,
}

/// The command that runs the embedded run.sh (staging `cryptblk` into `share`) with the guest
/// script in the lab VM of `lab_dir`.
fn run_sh_command(
    scripts: &Path,
    share: &Path,
    lab_dir: &Path,
    cryptblk: &Path,
    timeout: Duration,
) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(scripts.join("run.sh"))
        .arg("--no-build")
        .arg(scripts.join("bench-guest.sh"))
        .env("CRYPTBLK_BIN", cryptblk)
        .env("LAB_DIR", lab_dir)
        .env("LAB_SHARE", share)
        .env("LAB_TIMEOUT", timeout.as_secs().to_string());
    cmd
}

/// Runs run.sh (staging the binary) with the guest script; streams the guest's log to
/// stderr when `progress`.
fn boot(
    scripts: &Path,
    share: &Path,
    lab_dir: &Path,
    lab: &LabOptions,
    env: &[(&str, String)],
    timeout: Duration,
    progress: bool,
) -> Result<Boot, BenchError> {
    let started = Instant::now();
    let mut cmd = run_sh_command(scripts, share, lab_dir, &lab.cryptblk, timeout);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| BenchError::Tool(format!("cannot run the lab: {e}")))?;
    let mut stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut log = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if progress {
                eprintln!("lab: {line}");
            }
            log.push(line);
        }
    }
    let status = child
        .wait()
        .map_err(|e| BenchError::Tool(format!("waiting for the lab: {e}")))?;
    let err = err_thread.join().unwrap_or_default();
    // run-in-vm.sh: "lab: VM ran N ms (kernel K, tcg)"
    let accel = err
        .lines()
        .find(|l| l.starts_with("lab: VM ran"))
        .and_then(|l| l.rsplit(", ").next())
        .map(|s| s.trim_end_matches(')').to_string())
        .unwrap_or_default();
    if accel.is_empty() {
        return Err(BenchError::Tool(format!(
            "the lab did not boot ({status}): {}",
            err.lines()
                .rev()
                .take(12)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        )));
    }
    Ok(Boot {
        log,
        status: status.code(),
        accel,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Runs the bench over the lab transports `opts.transports` names (every one of which must
/// be a lab transport) and returns the report; writes `opts.json`, `opts.svg` and
/// `opts.markdown` when given.
pub fn run(opts: &BenchOptions, lab: &LabOptions) -> Result<LabReport, BenchError> {
    let started = Instant::now();
    let started_utc = crate::runner::iso_utc(std::time::SystemTime::now());
    let mut transports = Vec::new();
    for t in &opts.transports {
        match LabTransport::from_name(t) {
            Some(lt) if !transports.contains(&lt) => transports.push(lt),
            Some(_) => {}
            None => {
                return Err(BenchError::Options(format!(
                    "transport '{t}' runs on this host, ublk and vhost-user in the lab VM: run them separately"
                )))
            }
        }
    }
    if transports.is_empty() {
        return Err(BenchError::Options(
            "no lab transport (ublk, vhost-user) selected".into(),
        ));
    }
    if opts.peers || opts.live.is_some() {
        return Err(BenchError::Options(
            "--peers and --live run on this host, not with the lab transports".into(),
        ));
    }
    let settings = LabSettings::of(opts)?;
    let workloads = select(
        "workload",
        &lab_workloads(opts.quick && opts.workloads.is_empty()),
        |w| &w.name,
        &opts.workloads,
    )?;
    // Every configuration name must exist for some selected transport.
    for f in &opts.configs {
        let known: Vec<LabConfig> = transports.iter().flat_map(|t| lab_configs(*t)).collect();
        select("configuration", &known, |c| c.name, std::slice::from_ref(f))?;
    }
    let lab_dir = find_lab_dir(lab.lab_dir.as_deref())?;
    let progress = opts
        .progress
        .unwrap_or_else(|| std::io::stderr().is_terminal());
    let (_tmp, work) = match &opts.work_dir {
        Some(d) => crate::runner::work_dir_at(Some(d))?,
        None => {
            let t = tempfile::Builder::new()
                .prefix("cryptblk-lab-bench-")
                .tempdir_in("/var/tmp")
                .map_err(|e| BenchError::Io(format!("creating a work directory: {e}")))?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let scripts = work.join("scripts");
    write_lab_scripts(&scripts)?;

    let host_cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split(':').nth(1))
        })
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mut report = BenchReport {
        tool: "cryptblk bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_utc,
        host: HostInfo {
            load_avg_start: crate::runner::load_avg(),
            ..Default::default()
        },
        settings: Settings {
            quick: opts.quick,
            runtime_s: settings.runtime.as_secs_f64(),
            repeats: settings.repeats,
            device_size: settings.disk_mb << 20,
            region: settings.region_mb << 20,
            fio_verify: false,
            order: "in the lab VM, one boot per transport; per workload, repeat r runs every device once, in order (A B C .. A B C ..)".into(),
            // The guest's scheduler places its threads; --cpus applies to host runs.
            cpus: Vec::new(),
        },
        workloads: workloads.clone(),
        ..Default::default()
    };
    let mut info = LabInfo {
        caveat: EMULATED_CAVEAT.into(),
        ..Default::default()
    };

    for t in LabTransport::ALL {
        if !transports.contains(&t) {
            continue;
        }
        let all = lab_configs(t);
        let configs: Vec<LabConfig> = if opts.configs.is_empty() {
            all.iter().filter(|c| c.default).cloned().collect()
        } else {
            // Names that belong to the other transport only are not an error here.
            all.iter()
                .filter(|c| {
                    opts.configs.iter().any(|f| match f.strip_suffix('*') {
                        Some(p) => c.name.starts_with(p),
                        None => c.name == f,
                    })
                })
                .cloned()
                .collect()
        };
        if configs.is_empty() {
            report.transports.push(TransportStatus {
                name: t.name().into(),
                ran: false,
                detail: "no selected configuration exists for this transport".into(),
            });
            continue;
        }
        let share = work.join(format!("share-{}", t.name()));
        let bench_dir = share.join("bench");
        std::fs::create_dir_all(bench_dir.join("tables"))
            .map_err(|e| BenchError::Io(format!("{}: {e}", bench_dir.display())))?;

        let (servers, sizes, qemu_args) = if t == LabTransport::VhostUser {
            let (s, sizes, args) = start_vhost_servers(&configs, lab, &work, settings.disk_mb)?;
            (Some(s), sizes, args)
        } else {
            (None, BTreeMap::new(), String::new())
        };

        write(
            &bench_dir.join("params"),
            &format!(
                "REPS={}\nDISK_MB={}\nREGION_MB={}\n",
                settings.repeats, settings.disk_mb, settings.region_mb
            ),
        )?;
        let mut lines = String::new();
        for c in &configs {
            let arg = sizes
                .get(c.name)
                .map(|s| s.0.to_string())
                .unwrap_or_default();
            lines.push_str(&format!("{} {} {}\n", c.name, c.kind.guest_kind(), arg));
            if let Some(table) = c.table {
                write(
                    &bench_dir.join("tables").join(c.name),
                    &format!("{table}\n"),
                )?;
            }
        }
        write(&bench_dir.join("configs"), &lines)?;
        let mut jobs = String::new();
        for w in &workloads {
            let job = FioJob {
                target: FioTarget::Direct {
                    path: PathBuf::from("@DEV@"),
                },
                workload: w,
                offset: 0,
                region: settings.region_mb << 20,
                runtime: settings.runtime,
                verify: FioVerify::Off,
                logs: None,
            };
            jobs.push_str(&format!(
                "{} {}\n",
                w.name,
                job.args(Path::new("@OUT@")).join(" ")
            ));
        }
        write(&bench_dir.join("jobs"), &jobs)?;

        let runs = (workloads.len() * configs.len()) as u64 * u64::from(settings.repeats);
        // Boot and set-up take a minute or two under TCG; a fio job a few seconds on top of
        // its runtime. Three times that before the lab gives up on the VM.
        let timeout = Duration::from_secs(
            600 + 3 * runs * (settings.runtime.as_secs() + 10)
                + 3 * configs.len() as u64 * settings.region_mb,
        );
        let mut env: Vec<(&str, String)> = Vec::new();
        if t == LabTransport::VhostUser {
            env.push(("LAB_SHARED_MEM", "1".into()));
            env.push(("LAB_MEM", "1G".into()));
            env.push(("LAB_QEMU_ARGS", qemu_args));
        }
        if progress {
            eprintln!(
                "lab {}: booting the lab VM for {runs} fio runs of {:.1} s ({})",
                t.name(),
                settings.runtime.as_secs_f64(),
                lab_dir.display()
            );
        }
        let booted = boot(&scripts, &share, &lab_dir, lab, &env, timeout, progress);
        drop(servers);
        let booted = booted?;
        let out = bench_dir.join("out");
        let guest = key_values(&std::fs::read_to_string(out.join("guest")).unwrap_or_default());
        let tail: String = booted
            .log
            .iter()
            .rev()
            .take(6)
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join(" | ");
        let run = LabRun {
            transport: t.name().into(),
            accel: booted.accel.clone(),
            guest_kernel: guest.get("kernel").cloned().unwrap_or_default(),
            guest_cpus: guest.get("cpus").and_then(|c| c.parse().ok()).unwrap_or(0),
            guest_cpu: guest.get("cpu").cloned().unwrap_or_default(),
            seconds: booted.seconds,
            exit_status: booted.status,
        };
        if report.host.kernel.is_empty() {
            report.host = HostInfo {
                cpu: format!(
                    "{} in the lab VM (QEMU {}) on {host_cpu}",
                    run.guest_cpu, run.accel
                ),
                cpus: run.guest_cpus,
                kernel: run.guest_kernel.clone(),
                fio: guest.get("fio").cloned(),
                ..report.host.clone()
            };
        }
        info.emulated |= run.accel == "tcg";
        report.transports.push(TransportStatus {
            name: t.name().into(),
            ran: !guest.is_empty(),
            detail: if guest.is_empty() {
                format!("the guest script did not run: {tail}")
            } else {
                format!(
                    "lab VM ({}, kernel {}, {} vCPUs): fio --direct=1 in the guest{}",
                    run.accel,
                    run.guest_kernel,
                    run.guest_cpus,
                    match t {
                        LabTransport::Ublk =>
                            "; cryptblk serves /dev/ublkbN in the guest (its daemon's CPU is the guest's)",
                        LabTransport::VhostUser =>
                            "; cryptblk and qemu-storage-daemon serve virtio disks from the host (their CPU is the host's, not emulated)",
                    }
                )
            },
        });
        for c in &configs {
            let status: Option<serde_json::Value> =
                std::fs::read_to_string(out.join(format!("{}.status", c.name)))
                    .ok()
                    .and_then(|s| serde_json::from_str(&s).ok());
            let pipelines = status
                .as_ref()
                .and_then(pipelines_of)
                .or_else(|| sizes.get(c.name).map(|s| s.1.clone()))
                .filter(|p| !p.is_empty())
                .or_else(|| match c.kind {
                    Kind::KernelCrypt if c.table == Some(XTS_INLINE) => {
                        Some("inline/inline".into())
                    }
                    Kind::KernelCrypt => Some("queued/queued".into()),
                    _ => None,
                });
            report.configurations.push(ConfigInfo {
                name: c.name.into(),
                description: format!("[{}] {}", t.name(), c.description),
                table: c
                    .table
                    .map(|tb| {
                        tb.replace("@KEY@", "<key>")
                            .replace("@DEV@", "/dev/ramN")
                            .replace("@SECTORS@", "<sectors>")
                    })
                    .unwrap_or_else(|| match c.kind {
                        Kind::Vhost(HostServer::QsdRaw) => {
                            "qemu-storage-daemon --blockdev driver=file,...,cache.direct=off --export type=vhost-user-blk,...".into()
                        }
                        Kind::Vhost(HostServer::Open { queued }) => format!(
                            "cryptblk open --vhost-user SOCKET --queues 1{} (LUKS2, {XTS_CIPHER}, 4096-byte sectors)",
                            if queued { " --perf-queued" } else { "" }
                        ),
                        Kind::Vhost(HostServer::Linear) => {
                            "cryptblk dm create --vhost-user SOCKET: 0 <sectors> linear FILE 0".into()
                        }
                        _ => "/dev/ramN".into(),
                    }),
                pipelines,
            });
            let setup_error = std::fs::read_to_string(out.join(format!("{}.error", c.name))).ok();
            for w in &workloads {
                let mut runs = Vec::new();
                let mut error = setup_error.clone();
                for rep in 1..=settings.repeats {
                    // NAME.WORKLOAD.REP.json (not with_extension: REP looks like one).
                    let file = |ext: &str| out.join(format!("{}.{}.{rep}.{ext}", c.name, w.name));
                    match std::fs::read_to_string(file("json")) {
                        Ok(text) => match fio::parse_json(&text) {
                            Ok(m) => runs.push(m),
                            Err(e) => {
                                error.get_or_insert(e.to_string());
                            }
                        },
                        Err(_) if error.is_none() => {
                            let err = std::fs::read_to_string(file("err")).unwrap_or_default();
                            error = Some(if err.trim().is_empty() {
                                format!("no result from the guest (its log ends: {tail})")
                            } else {
                                format!("fio in the guest: {}", err.trim())
                            });
                        }
                        Err(_) => {}
                    }
                }
                let median = (!runs.is_empty()).then(|| metrics::median_runs(&runs));
                report.results.push(ResultRow {
                    config: c.name.into(),
                    workload: w.name.clone(),
                    transport: t.name().into(),
                    spread: report::spread_of(&runs),
                    cpu_spread: report::cpu_spread_of(&runs),
                    runs,
                    median,
                    bound: None,
                    excess: None,
                    error,
                });
            }
        }
        info.runs.push(run);
    }
    // Rows in the bench's order: workload, transport, configuration.
    let wl_pos = |n: &str| workloads.iter().position(|w| w.name == n);
    let results = std::mem::take(&mut report.results);
    let mut indexed: Vec<(usize, ResultRow)> = results.into_iter().enumerate().collect();
    indexed.sort_by_key(|(i, r)| {
        (
            wl_pos(&r.workload),
            LabTransport::from_name(&r.transport),
            *i,
        )
    });
    report.results = indexed.into_iter().map(|(_, r)| r).collect();
    for t in &transports {
        info.ratios.extend(ratios_of(&report.results, *t));
    }
    info.ratios
        .sort_by_key(|r| (wl_pos(&r.workload), LabTransport::from_name(&r.transport)));
    report.noise = Noise::of(&report.results);
    report.total_seconds = started.elapsed().as_secs_f64();
    report.host.load_avg_end = crate::runner::load_avg();
    let lab_report = LabReport { report, lab: info };
    write_outputs(opts, &lab_report)?;
    Ok(lab_report)
}

fn write_outputs(opts: &BenchOptions, r: &LabReport) -> Result<(), BenchError> {
    if let Some(p) = &opts.json {
        write(p, &r.to_json())?;
    }
    if let Some(p) = &opts.svg {
        write(p, &crate::chart::render_matrix_svg(&r.report)?)?;
    }
    if let Some(p) = &opts.markdown {
        let svg = opts.svg.as_ref().map(|s| crate::report::chart_link(s, p));
        write(p, &r.render_markdown(svg.as_deref()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench's embedded lab runner gets as far as the lab's run-in-vm.sh: everything that
    /// run.sh calls beside itself (vm.sh since the boot retries) is written with it. A stand-in
    /// run-in-vm.sh records its arguments and the staged share instead of booting.
    #[test]
    fn embedded_runner_reaches_the_vm() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let scripts = tmp.path().join("scripts");
        let lab_dir = tmp.path().join("lab");
        let share = tmp.path().join("share");
        std::fs::create_dir_all(&lab_dir).unwrap();
        std::fs::create_dir_all(&share).unwrap();
        write_lab_scripts(&scripts).unwrap();
        let ran = tmp.path().join("ran");
        let stub = lab_dir.join("run-in-vm.sh");
        std::fs::write(
            &stub,
            format!(
                "#!/bin/bash\necho \"$*\" > {}\nls \"$LAB_SHARE\" >> {}\necho guest-ran\n",
                ran.display(),
                ran.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Any executable stands in for the cryptblk binary: run.sh only copies it.
        let mut cmd = run_sh_command(
            &scripts,
            &share,
            &lab_dir,
            Path::new("/bin/true"),
            Duration::from_secs(60),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(cmd.stdin(Stdio::null()).output().unwrap()));
        let out = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("run.sh did not finish within 60 s");
        let ran = std::fs::read_to_string(&ran).unwrap_or_else(|e| {
            panic!(
                "run-in-vm.sh was not reached ({e}); run.sh said: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("guest-ran"));
        let mut lines = ran.lines();
        assert!(lines.next().unwrap().ends_with("bench-guest.sh"), "{ran}");
        let staged: Vec<&str> = lines.collect();
        for f in ["cryptblk", "lib.sh"] {
            assert!(staged.contains(&f), "{f} not staged: {staged:?}");
        }
    }
    use crate::metrics::DirMetrics;

    fn row(config: &str, wl: &str, t: &str, mb: f64) -> ResultRow {
        let m = RunMetrics {
            read: DirMetrics {
                mb_s: mb / 2.0,
                ops: 1,
                ..Default::default()
            },
            write: DirMetrics {
                mb_s: mb / 2.0,
                ops: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        ResultRow::single(config, wl, t, m)
    }

    #[test]
    fn ratios_divide_cryptblk_rows_by_the_kernel_and_plain_rows() {
        let rows = vec![
            row("plain", "rw4k", "ublk", 100.0),
            row("kernel-crypt", "rw4k", "ublk", 10.0),
            row("kernel-crypt-nowq", "rw4k", "ublk", 20.0),
            row("cryptblk-inline", "rw4k", "ublk", 5.0),
            row("cryptblk-linear", "rw4k", "ublk", 50.0),
            row("plain", "rw4k", "vhost-user", 80.0),
            row("qsd-raw", "rw4k", "vhost-user", 40.0),
            row("cryptblk-inline", "rw4k", "vhost-user", 8.0),
        ];
        let u = ratios_of(&rows, LabTransport::Ublk);
        assert_eq!(u.len(), 1, "only cryptblk-inline is a subject: {u:?}");
        assert_eq!(u[0].vs_kernel_crypt, Some(0.5));
        assert_eq!(u[0].vs_kernel_crypt_nowq, Some(0.25));
        assert_eq!(u[0].vs_plain, Some(0.05));
        assert_eq!(u[0].vs_transport_plain, Some(0.1));
        let v = ratios_of(&rows, LabTransport::VhostUser);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].vs_transport_plain, Some(0.2));
        assert_eq!(v[0].vs_plain, Some(0.1));
        assert_eq!(v[0].vs_kernel_crypt, None, "no kernel row in that boot");
        let rep = LabReport {
            report: BenchReport {
                results: rows,
                ..Default::default()
            },
            lab: LabInfo {
                emulated: true,
                caveat: EMULATED_CAVEAT.into(),
                ratios: u,
                ..Default::default()
            },
        };
        let t = rep.render_table();
        assert!(t.starts_with("EMULATED CPU"), "{t}");
        assert!(
            t.contains("0.500") && t.contains("0.100 (cryptblk-linear)"),
            "{t}"
        );
        let json: serde_json::Value = serde_json::from_str(&rep.to_json()).unwrap();
        assert_eq!(json["results"][0]["config"], "plain");
        assert_eq!(json["lab"]["ratios"][0]["vs_kernel_crypt"], 0.5);
        assert!(rep
            .render_markdown(None)
            .contains("| cryptblk-inline | rw4k | ublk | 5.0 | 0.500 | 0.250 | 0.050 |"));
    }

    #[test]
    fn lab_workloads_keep_the_bench_definitions() {
        let q = lab_workloads(true);
        let names: Vec<&str> = q.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["rw4k", "randrw64k", "randrw1m"]);
        let full = lab_workloads(false);
        let qd4 = full.iter().find(|w| w.name == "randrw1m-qd4").unwrap();
        assert_eq!((qd4.iodepth, qd4.block_size, qd4.jobs), (4, 1 << 20, 1));
        let job = FioJob {
            target: FioTarget::Direct {
                path: PathBuf::from("@DEV@"),
            },
            workload: qd4,
            offset: 0,
            region: 32 << 20,
            runtime: Duration::from_secs(2),
            verify: FioVerify::Off,
            logs: None,
        };
        let args = job.args(Path::new("@OUT@"));
        assert!(args.contains(&"--ioengine=libaio".to_string()));
        assert!(args.contains(&"--filename=@DEV@".to_string()));
        assert!(
            args.iter().all(|a| !a.contains(' ')),
            "the guest splits on spaces"
        );
    }

    #[test]
    fn every_transport_has_the_rows_the_ratios_need() {
        for t in LabTransport::ALL {
            let names: Vec<&str> = lab_configs(t)
                .iter()
                .filter(|c| c.default)
                .map(|c| c.name)
                .collect();
            for n in
                BASES
                    .iter()
                    .chain(&[t.transport_plain(), "cryptblk-inline", "cryptblk-queued"])
            {
                assert!(names.contains(n), "{} lacks {n}", t.name());
            }
        }
        assert!(is_lab_transport("vhost-user") && !is_lab_transport("nbd"));
    }
}
