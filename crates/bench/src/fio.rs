//! Driving fio: building the command for a workload, running it with a deadline, and reading
//! its JSON output into [`RunMetrics`].

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::metrics::{DirMetrics, RunMetrics, VerifyStats, MB};
use crate::workload::Workload;
use crate::BenchError;

/// Where fio sends its I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FioTarget {
    /// fio's `nbd` engine (libnbd) connected to this NBD URI.
    Nbd {
        /// `nbd+unix:///?socket=...` or `nbd://host:port/`.
        uri: String,
    },
    /// A block device or file with `O_DIRECT`: psync at iodepth 1 (the reference's engine),
    /// libaio when the workload wants a deeper queue (psync cannot keep more in flight).
    Direct {
        /// The device, e.g. `/dev/loop3`.
        path: PathBuf,
    },
}

/// How a fio job checks data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FioVerify {
    /// No verification.
    Off,
    /// `--verify=crc32c` with a backlog, so mixed time-based jobs really read back and check
    /// what they wrote (without a backlog fio's verify phase never runs for them).
    Backlog,
    /// `--verify=crc32c`: writes carry fio's checksummed headers but are not read back
    /// (`--do_verify=0`); read-only jobs check the header of every block they read, so a
    /// later read job verifies what earlier write jobs wrote without verification reads
    /// inflating the write figures. Reads of a mixed job are not checked.
    Headers,
}

impl FioVerify {
    /// `Backlog` when `on`, else `Off`.
    pub fn backlog_if(on: bool) -> Self {
        if on {
            FioVerify::Backlog
        } else {
            FioVerify::Off
        }
    }
}

/// One fio invocation.
#[derive(Clone, Debug)]
pub struct FioJob<'a> {
    /// Where the I/O goes.
    pub target: FioTarget,
    /// What it does.
    pub workload: &'a Workload,
    /// Start of the area used, bytes.
    pub offset: u64,
    /// Length of the area used, bytes (split between jobs).
    pub region: u64,
    /// Time-based runtime.
    pub runtime: Duration,
    /// How fio checks the data (see [`FioVerify`]).
    pub verify: FioVerify,
    /// Write bandwidth/latency logs averaged over this interval, with this path prefix.
    pub logs: Option<(PathBuf, Duration)>,
}

impl FioJob<'_> {
    /// The engine fio uses.
    pub fn engine(&self) -> &'static str {
        match self.target {
            FioTarget::Nbd { .. } => "nbd",
            FioTarget::Direct { .. } if self.workload.iodepth > 1 => "libaio",
            FioTarget::Direct { .. } => "psync",
        }
    }

    /// fio's command-line arguments (without the program), writing JSON to `output`.
    pub fn args(&self, output: &Path) -> Vec<String> {
        let w = self.workload;
        let slice = w.slice_len(self.region, w.jobs);
        let mut a = vec![
            "--name=cryptblk".to_string(),
            format!("--ioengine={}", self.engine()),
            format!("--rw={}", w.fio_rw()),
            format!("--rwmixread={}", w.read_percent),
            format!("--bs={}", w.block_size),
            format!("--iodepth={}", w.iodepth),
            format!("--numjobs={}", w.jobs),
            format!("--offset={}", self.offset),
            format!("--size={slice}"),
            "--time_based=1".into(),
            format!("--runtime={}ms", self.runtime.as_millis().max(1)),
            "--group_reporting=1".into(),
            // Total latency percentiles (lat_ns), not only completion latency.
            "--lat_percentiles=1".into(),
            "--percentile_list=50:99:99.9".into(),
            "--output-format=json".into(),
            // No verify state files left in the working directory.
            "--verify_state_save=0".into(),
            format!("--output={}", output.display()),
        ];
        if w.jobs > 1 {
            // Each job on its own slice: overlapping writers would defeat verification.
            a.push(format!("--offset_increment={slice}"));
        }
        match &self.target {
            FioTarget::Nbd { uri } => a.push(format!("--uri={uri}")),
            FioTarget::Direct { path } => {
                a.push(format!("--filename={}", path.display()));
                a.push("--direct=1".into());
            }
        }
        match self.verify {
            FioVerify::Off => {}
            FioVerify::Backlog => {
                a.push("--verify=crc32c".into());
                a.push("--verify_fatal=1".into());
                // Check each block soon after it is written: with time_based mixed jobs the
                // backlog is what makes fio verify at all.
                a.push(format!(
                    "--verify_backlog={}",
                    (1 << 20) / w.block_size.max(1) + 1
                ));
            }
            FioVerify::Headers => {
                a.push("--verify=crc32c".into());
                a.push("--verify_fatal=1".into());
                // For jobs that write, no read-back; a read-only job keeps fio's default
                // do_verify=1, which is what makes it check each block's header.
                if w.read_percent < 100 {
                    a.push("--do_verify=0".into());
                }
            }
        }
        if let Some((prefix, every)) = &self.logs {
            a.push(format!("--write_bw_log={}", prefix.display()));
            a.push(format!("--write_lat_log={}", prefix.display()));
            a.push(format!("--log_avg_msec={}", every.as_millis().max(1)));
        }
        a
    }
}

/// Runs `job` with the fio binary `fio`, keeping its JSON in `work_dir`.
pub fn run(fio: &Path, job: &FioJob<'_>, work_dir: &Path) -> Result<RunMetrics, BenchError> {
    let output = work_dir.join("fio.json");
    let _ = std::fs::remove_file(&output);
    let args = job.args(&output);
    let mut child = Command::new(fio)
        .args(&args)
        .current_dir(work_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::Tool(format!("cannot run {}: {e}", fio.display())))?;
    // fio stops itself at the runtime; allow generous setup and teardown before giving up.
    let deadline = Instant::now() + job.runtime + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| BenchError::Tool(format!("waiting for fio: {e}")))?
        {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(BenchError::Fio(format!(
                "fio did not finish within {:?} of its runtime",
                Duration::from_secs(60)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let text = std::fs::read_to_string(&output).unwrap_or_default();
    if !status.success() {
        return Err(BenchError::Fio(format!(
            "fio {} failed ({status}): {}",
            job.engine(),
            tail(&stderr, 600)
        )));
    }
    let mut m = parse_json(&text).map_err(|e| match e {
        BenchError::Fio(msg) => {
            BenchError::Fio(format!("{msg}; fio stderr: {}", tail(&stderr, 300)))
        }
        other => other,
    })?;
    m.verify = VerifyStats {
        enabled: job.verify != FioVerify::Off,
        method: match job.verify {
            FioVerify::Off => String::new(),
            FioVerify::Backlog => "fio-crc32c".into(),
            FioVerify::Headers if job.workload.read_percent == 0 => "fio-crc32c-headers".into(),
            FioVerify::Headers => "fio-crc32c-read".into(),
        },
        checked_reads: 0,
        errors: 0,
    };
    Ok(m)
}

/// Writes `[offset, offset + len)` of the NBD export at `uri` once, sequentially, with fio's
/// crc32c verification headers every 4 KiB (1 MiB requests, not read back), so that later
/// 4 KiB read jobs with [`FioVerify::Headers`] check every block they read.
pub fn fill_with_headers(
    fio: &Path,
    uri: &str,
    offset: u64,
    len: u64,
    work_dir: &Path,
) -> Result<(), BenchError> {
    let w = Workload::sequential_fill("fill");
    let job = FioJob {
        target: FioTarget::Nbd { uri: uri.into() },
        workload: &w,
        offset,
        region: len,
        runtime: Duration::from_secs(1),
        verify: FioVerify::Headers,
        logs: None,
    };
    // One pass: without time_based a sequential job stops at the end of its size.
    let mut args = job.args(&work_dir.join("fill.json"));
    args.retain(|a| !a.starts_with("--time_based") && !a.starts_with("--runtime"));
    args.push("--verify_interval=4096".into());
    let out = Command::new(fio)
        .args(&args)
        .current_dir(work_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BenchError::Tool(format!("cannot run {}: {e}", fio.display())))?;
    if !out.status.success() {
        return Err(BenchError::Fio(format!(
            "filling {uri} with verification headers failed ({}): {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 600)
        )));
    }
    Ok(())
}

fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

/// The installed fio's version string (`fio-3.33`), if it runs.
pub fn version(fio: &Path) -> Option<String> {
    let out = Command::new(fio).arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether fio lists an I/O engine in `--enghelp`.
pub fn has_engine(fio: &Path, engine: &str) -> bool {
    Command::new(fio)
        .arg("--enghelp")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == engine)
        })
        .unwrap_or(false)
}

fn num(v: &Value, key: &str) -> f64 {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => s.parse().unwrap_or(0.0),
        _ => 0.0,
    }
}

/// Finds percentile `p` in a fio `percentile` object (keys like `"99.900000"`).
fn percentile(lat: &Value, p: f64) -> Option<f64> {
    lat.get("percentile")?
        .as_object()?
        .iter()
        .find(|(k, _)| {
            k.parse::<f64>()
                .map(|x| (x - p).abs() < 1e-6)
                .unwrap_or(false)
        })
        .and_then(|(_, v)| v.as_f64())
}

fn parse_dir(d: &Value, what: &str) -> Result<DirMetrics, BenchError> {
    let ops = num(d, "total_ios") as u64;
    let lat = d
        .get("lat_ns")
        .ok_or_else(|| BenchError::Fio(format!("fio JSON has no {what}.lat_ns")))?;
    let pct = |p: f64| -> Result<f64, BenchError> {
        if ops == 0 {
            return Ok(0.0);
        }
        percentile(lat, p).map(|ns| ns / 1e3).ok_or_else(|| {
            BenchError::Fio(format!(
                "fio JSON has no {what}.lat_ns percentile {p} (run with --lat_percentiles=1)"
            ))
        })
    };
    Ok(DirMetrics {
        bytes: num(d, "io_bytes") as u64,
        ops,
        mb_s: num(d, "bw_bytes") / MB,
        iops: num(d, "iops"),
        lat_p50_us: pct(50.0)?,
        lat_p99_us: pct(99.0)?,
        lat_p999_us: pct(99.9)?,
        lat_mean_us: num(lat, "mean") / 1e3,
    })
}

/// Parses fio's `--output-format=json` (one group-reported job) into run metrics.
///
/// Anything before the first `{` (fio prints warnings there when writing to stdout) is
/// skipped. Latencies are total latency (`lat_ns`); CPU seconds are fio's usr+sys shares of
/// its summed job runtime.
pub fn parse_json(text: &str) -> Result<RunMetrics, BenchError> {
    let start = text
        .find('{')
        .ok_or_else(|| BenchError::Fio("fio wrote no JSON".into()))?;
    let root: Value = serde_json::from_str(&text[start..])
        .map_err(|e| BenchError::Fio(format!("fio JSON does not parse: {e}")))?;
    let jobs = root
        .get("jobs")
        .and_then(Value::as_array)
        .ok_or_else(|| BenchError::Fio("fio JSON has no jobs".into()))?;
    if jobs.len() != 1 {
        return Err(BenchError::Fio(format!(
            "expected one group-reported job in fio JSON, found {}",
            jobs.len()
        )));
    }
    let job = &jobs[0];
    let error = num(job, "error");
    if error != 0.0 {
        return Err(BenchError::Fio(format!("fio job reported error {error}")));
    }
    let read = parse_dir(job.get("read").unwrap_or(&Value::Null), "read")?;
    let write = parse_dir(job.get("write").unwrap_or(&Value::Null), "write")?;
    let dir_runtime = |d: &str| job.get(d).map(|v| num(v, "runtime")).unwrap_or(0.0);
    let seconds = dir_runtime("read").max(dir_runtime("write")) / 1e3;
    let job_runtime_s = num(job, "job_runtime") / 1e3;
    let mut m = RunMetrics {
        seconds,
        read,
        write,
        server_cpu_s: 0.0,
        client_cpu_s: (num(job, "usr_cpu") + num(job, "sys_cpu")) / 100.0 * job_runtime_s,
        verify: VerifyStats::default(),
        ..Default::default()
    };
    m.compute_cpu_per_gb();
    Ok(m)
}

/// One averaged sample of a fio `--write_*_log` file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogSample {
    /// Milliseconds since the job started.
    pub time_ms: u64,
    /// The value (KiB/s for bandwidth logs, ns for latency logs).
    pub value: f64,
    /// 0 read, 1 write.
    pub ddir: u8,
}

/// Parses a fio log (`time, value, ddir, bs, offset[, prio]` per line).
pub fn parse_log(text: &str) -> Vec<LogSample> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(',').map(str::trim);
            let time_ms = f.next()?.parse().ok()?;
            let value = f.next()?.parse().ok()?;
            let ddir = f.next()?.parse().ok()?;
            Some(LogSample {
                time_ms,
                value,
                ddir,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    /// Trimmed from a real `fio --output-format=json --lat_percentiles=1
    /// --percentile_list=50:99:99.9 --group_reporting` run (fio-3.33, nbd engine, 4 jobs).
    const RECORDED: &str = include_str!("../tests/data/fio-nbd-randrw-4j.json");

    #[test]
    fn parses_recorded_fio_json() {
        let m = parse_json(RECORDED).unwrap();
        assert_eq!(m.read.bytes, 174845952);
        assert_eq!(m.write.bytes, 103006208);
        assert_eq!(m.read.ops, 42687);
        assert!((m.read.mb_s - 174.322_983).abs() < 1e-3, "{}", m.read.mb_s);
        assert_eq!(m.read.lat_p50_us, 189.44);
        assert_eq!(m.read.lat_p99_us, 12255.232);
        assert_eq!(m.read.lat_p999_us, 46923.776);
        // usr 7.217782% + sys 13.761239% of 4.004 s of summed job runtime.
        assert!((m.client_cpu_s - (7.217782 + 13.761239) / 100.0 * 4.004).abs() < 1e-6);
        assert!(m.cpu_s_per_gb > 0.0);
        assert!((m.seconds - 1.003).abs() < 1e-9);
    }

    #[test]
    fn warnings_before_json_are_skipped_and_errors_reported() {
        let noisy = format!("fio: some warning\n{RECORDED}");
        assert!(parse_json(&noisy).is_ok());
        assert!(parse_json("").is_err());
        assert!(parse_json("{\"jobs\": []}").is_err());
        let failed = RECORDED.replacen("\"error\" : 0", "\"error\" : 84", 1);
        assert!(parse_json(&failed).unwrap_err().to_string().contains("84"));
        let no_pct = RECORDED.replace("\"percentile\"", "\"pct\"");
        assert!(parse_json(&no_pct)
            .unwrap_err()
            .to_string()
            .contains("lat_percentiles"));
    }

    #[test]
    fn command_lines() {
        let all = Workload::builtin();
        let job = FioJob {
            target: FioTarget::Direct {
                path: "/dev/loop7".into(),
            },
            workload: &all[0],
            offset: 256 << 20,
            region: 256 << 20,
            runtime: Duration::from_millis(1500),
            verify: FioVerify::Backlog,
            logs: None,
        };
        let a = job.args(Path::new("/tmp/o.json"));
        for want in [
            "--ioengine=psync",
            "--rw=readwrite",
            "--bs=4096",
            "--direct=1",
            "--filename=/dev/loop7",
            "--runtime=1500ms",
            "--size=268435456",
            "--verify=crc32c",
            "--verify_backlog=257",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        let job = FioJob {
            target: FioTarget::Nbd {
                uri: "nbd+unix:///?socket=/s".into(),
            },
            workload: &all[4],
            verify: FioVerify::Off,
            ..job
        };
        let a = job.args(Path::new("/tmp/o.json"));
        assert!(a.iter().any(|x| x == "--ioengine=nbd"));
        assert!(a.iter().any(|x| x == "--uri=nbd+unix:///?socket=/s"));
        assert!(a.iter().any(|x| x == "--offset_increment=67108864"));
        assert!(!a
            .iter()
            .any(|x| x.starts_with("--verify=") || x.starts_with("--verify_backlog")));
        let headers = FioJob {
            verify: FioVerify::Headers,
            ..job.clone()
        };
        let a = headers.args(Path::new("/tmp/o.json"));
        for want in ["--verify=crc32c", "--verify_fatal=1", "--do_verify=0"] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
        assert!(
            !a.iter().any(|x| x.starts_with("--verify_backlog")),
            "{a:?}"
        );
        // A read-only job must keep do_verify on: with it off, fio reads without checking.
        let reads = Workload {
            read_percent: 100,
            ..all[0].clone()
        };
        let a = FioJob {
            workload: &reads,
            ..headers.clone()
        }
        .args(Path::new("/tmp/o.json"));
        assert!(a.iter().any(|x| x == "--verify=crc32c"), "{a:?}");
        assert!(!a.iter().any(|x| x.starts_with("--do_verify")), "{a:?}");
        let deep = FioJob {
            target: FioTarget::Direct {
                path: "/dev/loop0".into(),
            },
            ..job
        };
        assert_eq!(deep.engine(), "libaio");
    }

    #[test]
    fn logs() {
        let s = parse_log(
            "250, 81920, 0, 4096, 0\n250, 80000, 1, 4096, 0\nbad\n500, 1, 0, 4096, 0, 0\n",
        );
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[1],
            LogSample {
                time_ms: 250,
                value: 80000.0,
                ddir: 1
            }
        );
    }
}
