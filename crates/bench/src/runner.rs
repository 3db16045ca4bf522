//! The benchmark driver: builds the stacks, runs the matrix with alternation, computes
//! medians and bounds, writes the outputs.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cryptblk_dm::Registry;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cipher_speed::{self, CipherSpeed};
use crate::config::{self, select, Configuration, XTS_CIPHER, XTS_KEY_BYTES};
use crate::engine::{self, EngineRun};
use crate::fio::{self, FioJob, FioTarget, FioVerify};
use crate::live;
use crate::metrics::{self, BoundFigures, CpuExcess, RunMetrics};
use crate::peers::{self, PeerImage, PeerKind, PeerServer};
use crate::placement::{self, Pinned};
use crate::report::{
    self, BenchReport, ConfigInfo, HostInfo, ResultRow, Settings, TransportStatus,
};
use crate::stack::ConfigStack;
use crate::workload::Workload;
use crate::{cpu, BenchError, BenchOptions, Transport};

/// What a row is about: one of our configurations, or a peer.
enum Subject {
    Config(Box<ConfigStack>),
    Peer(PeerServer),
}

impl Subject {
    fn name(&self) -> String {
        match self {
            Subject::Config(s) => s.config.name.clone(),
            Subject::Peer(p) => p.kind.name().to_string(),
        }
    }

    fn runs_on(&self, t: Transport) -> bool {
        match self {
            Subject::Config(_) => true,
            Subject::Peer(_) => t == Transport::Nbd,
        }
    }

    /// (cipher, key bytes, sector size) whose in-memory speed bounds this subject, if it
    /// encrypts.
    fn cipher(&self) -> Option<(String, usize, u32)> {
        match self {
            Subject::Config(s) => match &s.config.kind {
                config::ConfigKind::Crypt {
                    cipher,
                    key_bytes,
                    sector_size,
                    ..
                } => Some((cipher.clone(), *key_bytes, *sector_size)),
                config::ConfigKind::Linear => None,
            },
            // The peers' image is LUKS1: 512-byte sectors.
            Subject::Peer(_) => Some((XTS_CIPHER.to_string(), XTS_KEY_BYTES, 512)),
        }
    }
}

fn host_info(fio_bin: &Path) -> HostInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    HostInfo {
        cpu: cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split(':').nth(1))
            })
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown CPU".into()),
        // Online CPUs, not this thread's: `--cpus` has pinned it by now.
        // SAFETY: sysconf reads a system value; no memory is touched.
        cpus: usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) })
            .unwrap_or(1)
            .max(1),
        cpu_features: cpu_features(&cpuinfo),
        guest_halt_poll_ns: std::fs::read_to_string(
            "/sys/module/haltpoll/parameters/guest_halt_poll_ns",
        )
        .ok()
        .and_then(|s| s.trim().parse().ok()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        fio: fio::version(fio_bin),
        load_avg_start: load_avg(),
        load_avg_end: 0.0,
    }
}

/// The CPU features AES-XTS speed depends on (AES-NI, the vector AES and carry-less multiply
/// of AVX2/AVX-512 code paths), as /proc/cpuinfo names them: a cipher figure is only
/// comparable between machines that have the same ones.
fn cpu_features(cpuinfo: &str) -> Vec<String> {
    const WANTED: [&str; 6] = ["aes", "avx2", "vaes", "vpclmulqdq", "avx512f", "avx512vl"];
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags").and_then(|r| r.split(':').nth(1)))
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    WANTED
        .iter()
        .filter(|w| flags.contains(w))
        .map(|w| (*w).to_string())
        .collect()
}

/// The 1-minute load average (0 if /proc/loadavg is unreadable).
pub(crate) fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// UTC date-time in ISO 8601 (days-to-civil conversion; no calendar crate needed for this).
pub(crate) fn iso_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no failure modes or memory effects.
    unsafe { libc::geteuid() == 0 }
}

fn program_runs(prog: &str, arg: &str) -> bool {
    std::process::Command::new(prog)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether each transport can run here, and why not.
fn probe(t: Transport, fio_bin: &Path, fio_version: &Option<String>) -> Result<String, String> {
    let need_fio = || {
        fio_version
            .clone()
            .ok_or_else(|| format!("fio ({}) does not run", fio_bin.display()))
    };
    match t {
        Transport::Inproc => Ok("in-process engine: threads = jobs x iodepth, synchronous BlockDevice calls, HDR histograms, pattern verification on every read".into()),
        Transport::Nbd => {
            let v = need_fio()?;
            if !fio::has_engine(fio_bin, "nbd") {
                return Err(format!("{v} has no nbd engine (fio --enghelp does not list it)"));
            }
            Ok(format!("{v} --ioengine=nbd (libnbd) against cryptblk's NBD server on a Unix socket"))
        }
        Transport::Loop => {
            let v = need_fio()?;
            if !is_root() {
                return Err("needs root (FUSE mount and losetup)".into());
            }
            if !Path::new("/dev/fuse").exists() {
                return Err("no /dev/fuse".into());
            }
            if !Path::new("/dev/loop-control").exists() {
                return Err("no loop driver (/dev/loop-control missing)".into());
            }
            if !program_runs("losetup", "--version") {
                return Err("losetup is not installed".into());
            }
            Ok(format!("{v} psync --direct=1 (libaio for iodepth > 1) on a loop device over the FUSE export"))
        }
    }
}

struct Cell {
    runs: Vec<RunMetrics>,
    error: Option<String>,
}

fn fio_job<'a>(target: FioTarget, w: &'a Workload, opts: &BenchOptions) -> FioJob<'a> {
    FioJob {
        target,
        workload: w,
        offset: opts.effective_region(),
        region: opts.effective_region(),
        runtime: opts.effective_runtime(),
        verify: FioVerify::backlog_if(opts.effective_fio_verify()),
        logs: None,
    }
}

/// fio against a server living in this process: this process's CPU is the server's.
fn fio_in_process_server(
    opts: &BenchOptions,
    job: &FioJob<'_>,
    work: &Path,
) -> Result<RunMetrics, BenchError> {
    let before = cpu::process_cpu();
    let mut m = fio::run(&opts.fio, job, work)?;
    m.server_cpu_s = cpu::process_cpu().saturating_sub(before).as_secs_f64();
    m.compute_cpu_per_gb();
    Ok(m)
}

fn run_cell(
    subject: &mut Subject,
    w: &Workload,
    t: Transport,
    opts: &BenchOptions,
    work: &Path,
    loop_status: &mut Option<Result<String, String>>,
) -> Result<RunMetrics, BenchError> {
    match subject {
        Subject::Config(stack) => match t {
            Transport::Inproc => engine::run(&EngineRun {
                device: stack.device(),
                workload: w,
                region_offset: 0,
                region_len: opts.effective_region(),
                runtime: opts.effective_runtime(),
                generations: &stack.generations,
                live: None,
                seed: fastrand::u64(..),
            }),
            Transport::Nbd => {
                let uri = stack.nbd_uri(work)?;
                fio_in_process_server(opts, &fio_job(FioTarget::Nbd { uri }, w, opts), work)
            }
            Transport::Loop => {
                let lp = stack.loop_device(work)?;
                if loop_status.is_none() {
                    *loop_status = Some(Ok(format!(
                        "loop direct I/O {}",
                        if lp.direct_io {
                            "on"
                        } else {
                            "OFF (losetup could not enable it: buffered)"
                        }
                    )));
                }
                let path = lp.loop_dev.clone();
                fio_in_process_server(opts, &fio_job(FioTarget::Direct { path }, w, opts), work)
            }
        },
        Subject::Peer(p) => {
            let before = cpu::pid_cpu(p.pid()).unwrap_or_default();
            let mut m = fio::run(
                &opts.fio,
                &fio_job(FioTarget::Nbd { uri: p.uri.clone() }, w, opts),
                work,
            )?;
            let after = cpu::pid_cpu(p.pid()).unwrap_or_default();
            m.server_cpu_s = after.saturating_sub(before).as_secs_f64();
            m.compute_cpu_per_gb();
            Ok(m)
        }
    }
}

/// Writes the peer's fio region once sequentially, so reads hit written, allocated blocks
/// (as the in-process prefill does for cryptblk's stacks).
fn prefill_peer(p: &PeerServer, opts: &BenchOptions, work: &Path) -> Result<(), BenchError> {
    let w = Workload::sequential_fill("prefill");
    let mut job = fio_job(FioTarget::Nbd { uri: p.uri.clone() }, &w, opts);
    job.verify = FioVerify::Off;
    // One sequential pass: without time_based, a sequential job stops at the end of its size.
    let out = work.join("prefill.json");
    let mut args = job.args(&out);
    args.retain(|a| {
        !a.starts_with("--time_based") && !a.starts_with("--runtime") && !a.starts_with("--rw=")
    });
    args.push("--rw=write".into());
    let status = std::process::Command::new(&opts.fio)
        .args(&args)
        .current_dir(work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| BenchError::Tool(format!("cannot run fio: {e}")))?;
    if !status.status.success() {
        return Err(BenchError::Fio(format!(
            "prefilling {}: {}",
            p.kind.name(),
            String::from_utf8_lossy(&status.stderr).trim()
        )));
    }
    Ok(())
}

fn progress_bar(opts: &BenchOptions, total: u64) -> ProgressBar {
    let show = opts
        .progress
        .unwrap_or_else(|| std::io::stderr().is_terminal());
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

fn work_dir(opts: &BenchOptions) -> Result<(Option<tempfile::TempDir>, PathBuf), BenchError> {
    work_dir_at(opts.work_dir.as_deref())
}

/// `dir` (created), or a temporary directory removed when the returned guard drops.
pub(crate) fn work_dir_at(
    dir: Option<&Path>,
) -> Result<(Option<tempfile::TempDir>, PathBuf), BenchError> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| BenchError::Io(format!("creating {}: {e}", d.display())))?;
            Ok((None, d.to_path_buf()))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("cryptblk-bench-")
                .tempdir()
                .map_err(|e| BenchError::Io(format!("creating a temporary directory: {e}")))?;
            let p = t.path().to_path_buf();
            Ok((Some(t), p))
        }
    }
}

/// Where peer images go: tmpfs when there is one (the peers' "RAM disk").
fn image_dir(work: &Path) -> Result<(Option<tempfile::TempDir>, PathBuf), BenchError> {
    if Path::new("/dev/shm").is_dir() {
        if let Ok(t) = tempfile::Builder::new()
            .prefix("cryptblk-bench-")
            .tempdir_in("/dev/shm")
        {
            let p = t.path().to_path_buf();
            return Ok((Some(t), p));
        }
    }
    Ok((None, work.to_path_buf()))
}

/// Pins every thread of the run to the CPUs `opts.cpus` names, if any.
fn pin_for(opts: &BenchOptions) -> Result<Option<Pinned>, BenchError> {
    let allowed = placement::allowed_cpus(0)
        .map_err(|e| BenchError::Options(format!("cannot read this process's CPUs: {e}")))?;
    match opts.cpus.resolve(&allowed).map_err(BenchError::Options)? {
        None => Ok(None),
        Some(cpus) => Pinned::all_threads(&cpus).map(Some).map_err(|e| {
            BenchError::Options(format!(
                "cannot pin to CPUs {}: {e}",
                placement::list(&cpus)
            ))
        }),
    }
}

fn check_options(opts: &BenchOptions) -> Result<(), BenchError> {
    let region = opts.effective_region();
    let size = opts.effective_device_size();
    if region == 0 || region % (1 << 20) != 0 {
        return Err(BenchError::Options(format!(
            "region {region} must be a positive multiple of 1 MiB"
        )));
    }
    if size < 2 * region {
        return Err(BenchError::Options(format!(
            "device size {size} must hold two regions of {region} bytes (in-process and fio)"
        )));
    }
    if size % 512 != 0 {
        return Err(BenchError::Options(format!(
            "device size {size} is not a multiple of 512"
        )));
    }
    if opts.effective_runtime() < Duration::from_millis(50) {
        return Err(BenchError::Options("runtime must be at least 50 ms".into()));
    }
    Ok(())
}

/// Runs the benchmark described by `opts` and returns the report; also writes the JSON,
/// SVG and markdown files `opts` names. Failed runs do not abort the benchmark: they are
/// recorded in their rows (see [`BenchReport::failures`]).
pub fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    check_options(opts)?;
    let started = Instant::now();
    // Before any stack, pool, peer or fio exists, so that all of them inherit it.
    let pin = pin_for(opts)?;
    let default_configs = if opts.configs.is_empty() {
        Configuration::default_set()
    } else {
        Configuration::builtin()
    };
    let configs = select(
        "configuration",
        &default_configs,
        |c| &c.name,
        &opts.configs,
    )?;
    let workload_filter = if opts.workloads.is_empty() {
        opts.default_workloads()
    } else {
        opts.workloads.clone()
    };
    let workloads = select(
        "workload",
        &Workload::builtin(),
        |w| &w.name,
        &workload_filter,
    )?;
    let transport_names: Vec<String> = Transport::ALL
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    let wanted: Vec<Transport> = select("transport", &transport_names, |s| s, &opts.transports)?
        .iter()
        .filter_map(|n| Transport::ALL.into_iter().find(|t| t.name() == n))
        .collect();
    let (_tmp, work) = work_dir(opts)?;
    let host = host_info(&opts.fio);
    let mut report = BenchReport {
        tool: "cryptblk bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        started_utc: iso_utc(SystemTime::now()),
        host: host.clone(),
        settings: Settings {
            quick: opts.quick,
            runtime_s: opts.effective_runtime().as_secs_f64(),
            repeats: opts.effective_repeats(),
            device_size: opts.effective_device_size(),
            region: opts.effective_region(),
            fio_verify: opts.effective_fio_verify(),
            order: "per workload and transport: repeat r runs every configuration once, in order (A B C .. A B C ..)".into(),
            cpus: pin.as_ref().map(|p| p.cpus().to_vec()).unwrap_or_default(),
        },
        workloads: workloads.clone(),
        ..Default::default()
    };
    let mut transports: Vec<Transport> = Vec::new();
    let mut statuses: BTreeMap<Transport, TransportStatus> = BTreeMap::new();
    for t in Transport::ALL {
        let status = if !wanted.contains(&t) {
            TransportStatus {
                name: t.name().into(),
                ran: false,
                detail: "not selected (--transport)".into(),
            }
        } else {
            match probe(t, &opts.fio, &host.fio) {
                Ok(detail) => {
                    transports.push(t);
                    TransportStatus {
                        name: t.name().into(),
                        ran: true,
                        detail,
                    }
                }
                Err(why) => TransportStatus {
                    name: t.name().into(),
                    ran: false,
                    detail: why,
                },
            }
        };
        statuses.insert(t, status);
    }
    let registry = Arc::new(Registry::new());

    if let Some(duration) = opts.live {
        let live_report = run_live(
            opts,
            &registry,
            &configs,
            &workloads,
            duration,
            &work,
            &transports,
        )?;
        report.configurations.push(ConfigInfo {
            name: live_report.config.clone(),
            description: "flipped from queued to inline under load".into(),
            table: format!(
                "{}  =>  {}",
                live_report.table_before, live_report.table_after
            ),
            pipelines: live_report.pipelines_after.clone(),
        });
        report.transports = statuses.into_values().collect();
        report.live = Some(live_report);
        report.total_seconds = started.elapsed().as_secs_f64();
        report.host.load_avg_end = load_avg();
        write_outputs(opts, &report)?;
        return Ok(report);
    }

    // Build every configuration's stack and fill both regions.
    let size = opts.effective_device_size();
    let region = opts.effective_region();
    let mut subjects: Vec<Subject> = Vec::new();
    for c in &configs {
        let stack = ConfigStack::create(&registry, c, size, region)?;
        let fill_to = if transports.iter().any(|t| *t != Transport::Inproc) {
            2 * region
        } else {
            region
        };
        engine::prefill(stack.device().as_ref(), 0, fill_to)?;
        subjects.push(Subject::Config(Box::new(stack)));
    }
    let (_img_tmp, img_dir) = image_dir(&work)?;
    let mut peer_notes = Vec::new();
    let mut _image: Option<PeerImage> = None;
    if opts.peers {
        if !transports.contains(&Transport::Nbd) {
            peer_notes.push("peers skipped: they need the nbd transport".to_string());
        } else {
            for kind in PeerKind::ALL {
                if let Err(why) = kind.available() {
                    peer_notes.push(format!("{} skipped: {why}", kind.name()));
                    continue;
                }
                if _image.is_none() {
                    _image = Some(peers::make_image(&img_dir, size)?);
                }
                let image = _image.as_ref().expect("just made");
                match PeerServer::start(kind, image, &work) {
                    Ok(p) => {
                        prefill_peer(&p, opts, &work)?;
                        report.configurations.push(ConfigInfo {
                            name: kind.name().into(),
                            description: kind.description().into(),
                            table: p.command.clone(),
                            pipelines: None,
                        });
                        subjects.push(Subject::Peer(p));
                    }
                    Err(e) => peer_notes.push(format!("{} skipped: {e}", kind.name())),
                }
            }
        }
    }

    // In-memory cipher speeds for the bounds.
    let mut speeds: Vec<CipherSpeed> = Vec::new();
    let budget = if opts.quick {
        Duration::from_millis(30)
    } else {
        Duration::from_millis(300)
    };
    for s in &subjects {
        if let Some((cipher, key_bytes, sector_size)) = s.cipher() {
            if !speeds.iter().any(|x| x.is(&cipher, key_bytes, sector_size)) {
                speeds.push(cipher_speed::measure(
                    &cipher,
                    key_bytes,
                    sector_size,
                    budget,
                )?);
            }
        }
    }

    // The matrix, alternating configurations within each repeat.
    let repeats = opts.effective_repeats();
    let total: u64 = workloads.len() as u64
        * transports
            .iter()
            .map(|t| subjects.iter().filter(|s| s.runs_on(*t)).count() as u64)
            .sum::<u64>()
        * u64::from(repeats);
    let pb = progress_bar(opts, total);
    let mut cells: BTreeMap<(usize, usize, Transport), Cell> = BTreeMap::new();
    let mut loop_status: Option<Result<String, String>> = None;
    for (wi, w) in workloads.iter().enumerate() {
        for &t in &transports {
            for rep in 0..repeats {
                for (si, s) in subjects.iter_mut().enumerate() {
                    if !s.runs_on(t) {
                        continue;
                    }
                    pb.set_message(format!(
                        "{} / {} / {} (repeat {}/{repeats})",
                        s.name(),
                        w.name,
                        t.name(),
                        rep + 1
                    ));
                    let cell = cells.entry((wi, si, t)).or_insert(Cell {
                        runs: Vec::new(),
                        error: None,
                    });
                    if t == Transport::Loop && matches!(loop_status, Some(Err(_))) {
                        pb.inc(1);
                        continue;
                    }
                    match run_cell(s, w, t, opts, &work, &mut loop_status) {
                        Ok(m) => cell.runs.push(m),
                        Err(e) => {
                            // A loop device that cannot be set up at all skips the transport.
                            if t == Transport::Loop && loop_status.is_none() {
                                loop_status =
                                    Some(Err(format!("setting up FUSE + loop failed: {e}")));
                            } else if cell.error.is_none() {
                                cell.error = Some(e.to_string());
                            }
                        }
                    }
                    pb.inc(1);
                }
            }
        }
    }
    pb.finish_and_clear();
    if let Some(st) = statuses.get_mut(&Transport::Loop) {
        match &loop_status {
            Some(Ok(note)) => st.detail = format!("{}; {note}", st.detail),
            Some(Err(why)) => {
                st.ran = false;
                st.detail = why.clone();
            }
            None => {}
        }
    }

    // Rows: medians, then bounds against the plain row of the same workload and transport.
    let names: Vec<String> = subjects.iter().map(Subject::name).collect();
    let ciphers: Vec<Option<(String, usize, u32)>> = subjects.iter().map(Subject::cipher).collect();
    for ((wi, si, t), cell) in &cells {
        if *t == Transport::Loop && matches!(loop_status, Some(Err(_))) {
            continue;
        }
        let median = (!cell.runs.is_empty()).then(|| metrics::median_runs(&cell.runs));
        report.results.push(ResultRow {
            config: names[*si].clone(),
            workload: workloads[*wi].name.clone(),
            transport: t.name().into(),
            runs: cell.runs.clone(),
            median,
            bound: None,
            excess: None,
            error: cell
                .error
                .clone()
                .or_else(|| cell.runs.is_empty().then(|| "no run completed".to_string())),
            spread: crate::report::spread_of(&cell.runs),
            cpu_spread: crate::report::cpu_spread_of(&cell.runs),
        });
    }
    report.results.sort_by_key(|r| {
        (
            workloads.iter().position(|w| w.name == r.workload),
            Transport::ALL.iter().position(|t| t.name() == r.transport),
            names.iter().position(|n| *n == r.config),
        )
    });
    let plain_of = |rows: &[ResultRow], w: &str, t: &str| -> Option<RunMetrics> {
        rows.iter()
            .find(|r| r.workload == w && r.transport == t && r.config == "plain")
            .and_then(|r| r.median.clone())
    };
    let snapshot = report.results.clone();
    for r in &mut report.results {
        let si = names.iter().position(|n| *n == r.config);
        let Some(Some((cipher, key_bytes, sector_size))) = si.map(|i| ciphers[i].clone()) else {
            continue;
        };
        let speed = speeds
            .iter()
            .find(|s| s.is(&cipher, key_bytes, sector_size));
        if let (Some(m), Some(p), Some(sp)) = (
            &r.median,
            plain_of(&snapshot, &r.workload, &r.transport),
            speed,
        ) {
            r.bound = Some(BoundFigures::new(&p, m, sp.encrypt_mb_s, sp.decrypt_mb_s));
            r.excess = Some(CpuExcess::new(&p, m, sp.encrypt_mb_s, sp.decrypt_mb_s));
        }
    }
    for s in &subjects {
        if let Subject::Config(stack) = s {
            report.configurations.insert(
                report
                    .configurations
                    .iter()
                    .filter(|c| !c.name.starts_with("peer-"))
                    .count(),
                ConfigInfo {
                    name: stack.config.name.clone(),
                    description: stack.config.description.clone(),
                    table: stack.table(),
                    pipelines: stack.pipelines(),
                },
            );
        }
    }
    for note in peer_notes {
        report.transports.push(TransportStatus {
            name: "peers".into(),
            ran: false,
            detail: note,
        });
    }
    let mut ts: Vec<TransportStatus> = statuses.into_values().collect();
    ts.append(&mut report.transports);
    report.transports = ts;
    report.noise = crate::report::Noise::of(&report.results);
    report.cpu_check = crate::report::CpuCheck::of(&report.results, &report.workloads);
    // openssl's own figure beside ours, in the same run (about 2 s; not in a smoke run).
    if !opts.quick && speeds.iter().any(|s| s.cipher == XTS_CIPHER) {
        report.openssl_xts_mb_s = cipher_speed::openssl_xts_speed();
    }
    report.cipher_speeds = speeds;
    // Stop servers before reporting the time: unmounts and socket removal belong to the run.
    drop(subjects);
    report.total_seconds = started.elapsed().as_secs_f64();
    report.host.load_avg_end = load_avg();
    write_outputs(opts, &report)?;
    Ok(report)
}

fn run_live(
    opts: &BenchOptions,
    registry: &Arc<Registry>,
    configs: &[Configuration],
    workloads: &[Workload],
    duration: Duration,
    work: &Path,
    transports: &[Transport],
) -> Result<live::LiveReport, BenchError> {
    if duration < live::INTERVAL * 4 {
        return Err(BenchError::Options(
            "--live needs at least one second".into(),
        ));
    }
    // The flipped configuration: the one named, else queued aes-xts-plain64.
    let config = match (opts.configs.len(), configs.first()) {
        (1, Some(c)) if c.cipher().is_some() => c.clone(),
        (0, _) => Configuration::default_set()
            .into_iter()
            .find(|c| c.name == "xts")
            .expect("built-in xts configuration"),
        _ => {
            return Err(BenchError::Options(
                "--live takes at most one crypt configuration".into(),
            ))
        }
    };
    let workload = if opts.workloads.len() == 1 {
        workloads[0].clone()
    } else {
        Workload::builtin()
            .into_iter()
            .next()
            .expect("built-in rw4k")
    };
    let transport = match opts.live_transport.as_deref().unwrap_or("inproc") {
        "inproc" => Transport::Inproc,
        "nbd" => Transport::Nbd,
        other => {
            return Err(BenchError::Options(format!(
                "--live runs over inproc or nbd, not '{other}'"
            )))
        }
    };
    if !transports.contains(&transport) {
        return Err(BenchError::Options(format!(
            "transport {} is not available for --live",
            transport.name()
        )));
    }
    let region = opts.effective_region();
    let mut stack = ConfigStack::create(registry, &config, opts.effective_device_size(), region)?;
    engine::prefill(stack.device().as_ref(), 0, 2 * region)?;
    match transport {
        Transport::Nbd => {
            let setup = live::FioLive {
                fio: &opts.fio,
                uri: stack.nbd_uri(work)?,
                offset: region,
                region,
                work_dir: work,
            };
            live::run_fio_nbd(&stack, &workload, duration, &setup)
        }
        _ => live::run_inproc(&stack, &workload, duration, region),
    }
}

fn write_outputs(opts: &BenchOptions, report: &BenchReport) -> Result<(), BenchError> {
    if let Some(p) = &opts.json {
        report::write_file(p, &report.to_json())?;
    }
    if let Some(p) = &opts.svg {
        let svg = match &report.live {
            Some(l) => crate::chart::render_live_svg(l)?,
            None => crate::chart::render_matrix_svg(report)?,
        };
        report::write_file(p, &svg)?;
    }
    if let Some(p) = &opts.markdown {
        let svg_name = opts.svg.as_ref().map(|s| report::chart_link(s, p));
        report::write_file(p, &report.render_markdown(svg_name.as_deref()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_features_come_from_the_flags_line() {
        let info = "processor\t: 0\nflags\t\t: fpu sse2 aes avx2 vaes vpclmulqdq\n";
        assert_eq!(cpu_features(info), ["aes", "avx2", "vaes", "vpclmulqdq"]);
        assert!(cpu_features("no flags here").is_empty());
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            iso_utc(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)),
            "2000-02-29T01:01:01Z"
        );
        assert_eq!(
            iso_utc(UNIX_EPOCH + Duration::from_secs(1_795_270_640)),
            "2026-11-21T14:17:20Z"
        );
    }

    #[test]
    fn bad_options_are_refused() {
        let o = BenchOptions {
            region: Some(512 << 20),
            device_size: Some(512 << 20),
            ..Default::default()
        };
        assert!(matches!(run(&o), Err(BenchError::Options(_))));
        let o = BenchOptions {
            quick: true,
            configs: vec!["nope".into()],
            ..Default::default()
        };
        assert!(matches!(run(&o), Err(BenchError::UnknownName { .. })));
        let o = BenchOptions {
            quick: true,
            transports: vec!["carrier-pigeon".into()],
            ..Default::default()
        };
        assert!(matches!(run(&o), Err(BenchError::UnknownName { .. })));
    }
}
