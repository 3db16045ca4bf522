//! The live flip: the reference's "reload + suspend/resume under load" experiment.
//!
//! 4 KiB readwrite runs on `aes-xts-plain64` with the default queued pipelines; halfway
//! through, the table is reloaded with `no_read_workqueue no_write_workqueue` and the mapping
//! suspended and resumed, exactly as `dmsetup reload` + `suspend` + `resume` would. Throughput
//! and latency are sampled every 250 ms, giving the reference's Grafana picture.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::INLINE_FLAGS;
use crate::engine::{self, EngineRun, LiveCounters};
use crate::fio::{self, FioJob, FioTarget, FioVerify};
use crate::metrics::{median, MB};
use crate::stack::ConfigStack;
use crate::workload::Workload;
use crate::BenchError;

/// Sampling interval.
pub const INTERVAL: Duration = Duration::from_millis(250);

/// One sampling interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LiveSample {
    /// End of the interval, seconds since the start.
    pub t_s: f64,
    /// Read MB/s in the interval.
    pub read_mb_s: f64,
    /// Write MB/s in the interval.
    pub write_mb_s: f64,
    /// Read latency p50, µs (fio transport: interval mean).
    pub read_p50_us: f64,
    /// Read latency p99, µs (fio transport: interval mean, fio logs no percentiles).
    pub read_p99_us: f64,
    /// Write latency p50, µs.
    pub write_p50_us: f64,
    /// Write latency p99, µs.
    pub write_p99_us: f64,
}

/// Averages of one side of the flip.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseSummary {
    /// Mean read + write MB/s.
    pub total_mb_s: f64,
    /// Median over intervals of the read p99, µs.
    pub read_p99_us: f64,
    /// Median over intervals of the write p99, µs.
    pub write_p99_us: f64,
    /// Intervals averaged.
    pub samples: usize,
}

/// The live experiment's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LiveReport {
    /// Configuration flipped.
    pub config: String,
    /// Workload run.
    pub workload: String,
    /// Transport used.
    pub transport: String,
    /// Length of the run, seconds.
    pub duration_s: f64,
    /// When the flip happened, seconds since the start.
    pub flip_at_s: f64,
    /// How long the mapping stayed suspended (draining in-flight I/O), milliseconds.
    pub suspend_ms: f64,
    /// Table before (key masked).
    pub table_before: String,
    /// Table after (key masked).
    pub table_after: String,
    /// Pipelines (read/write) before.
    pub pipelines_before: Option<String>,
    /// Pipelines (read/write) after.
    pub pipelines_after: Option<String>,
    /// The samples.
    pub samples: Vec<LiveSample>,
    /// Before the flip (first interval and the flip's interval left out).
    pub before: PhaseSummary,
    /// After the flip (the flip's interval left out).
    pub after: PhaseSummary,
}

impl LiveReport {
    /// One paragraph for the terminal and markdown.
    pub fn summary(&self) -> String {
        let ratio = if self.before.total_mb_s > 0.0 {
            self.after.total_mb_s / self.before.total_mb_s
        } else {
            0.0
        };
        format!(
            "live: {} {} over {}, queued -> inline at {:.2} s (suspended {:.2} ms; pipelines {} -> {}): \
             read+write {:.1} -> {:.1} MB/s (x{:.2}), p99 read {:.1} -> {:.1} µs, p99 write {:.1} -> {:.1} µs\n",
            self.config,
            self.workload,
            self.transport,
            self.flip_at_s,
            self.suspend_ms,
            self.pipelines_before.as_deref().unwrap_or("?"),
            self.pipelines_after.as_deref().unwrap_or("?"),
            self.before.total_mb_s,
            self.after.total_mb_s,
            ratio,
            self.before.read_p99_us,
            self.after.read_p99_us,
            self.before.write_p99_us,
            self.after.write_p99_us,
        )
    }

    fn summarize(&mut self) {
        let flip = self.flip_at_s;
        let phase = |keep: &dyn Fn(&LiveSample) -> bool| {
            let s: Vec<&LiveSample> = self.samples.iter().filter(|s| keep(s)).collect();
            let n = s.len().max(1) as f64;
            PhaseSummary {
                total_mb_s: s.iter().map(|x| x.read_mb_s + x.write_mb_s).sum::<f64>() / n,
                read_p99_us: median(&s.iter().map(|x| x.read_p99_us).collect::<Vec<_>>()),
                write_p99_us: median(&s.iter().map(|x| x.write_p99_us).collect::<Vec<_>>()),
                samples: s.len(),
            }
        };
        let step = INTERVAL.as_secs_f64();
        // Interval k covers (t - step, t]; leave out the first (warm-up) and the one
        // containing the flip.
        let before = phase(&|s| s.t_s > step * 1.5 && s.t_s <= flip);
        let after = phase(&|s| s.t_s - step > flip);
        self.before = before;
        self.after = after;
    }
}

/// The in-process live run on `stack` (an `aes-xts-plain64` configuration without inline
/// flags), over its in-process region.
pub fn run_inproc(
    stack: &ConfigStack,
    workload: &Workload,
    duration: Duration,
    region: u64,
) -> Result<LiveReport, BenchError> {
    let live = LiveCounters::default();
    let mut report = LiveReport {
        config: stack.config.name.clone(),
        workload: workload.name.clone(),
        transport: "inproc".into(),
        duration_s: duration.as_secs_f64(),
        table_before: stack.table(),
        pipelines_before: stack.pipelines(),
        ..Default::default()
    };
    let job = EngineRun {
        device: stack.device(),
        workload,
        region_offset: 0,
        region_len: region,
        runtime: duration,
        generations: &stack.generations,
        live: Some(&live),
        seed: fastrand::u64(..),
    };
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let (result, flip) = std::thread::scope(|s| {
        let runner = s.spawn(|| {
            let r = engine::run(&job);
            done.store(true, Ordering::Relaxed);
            r
        });
        let mut flip: Option<Result<(f64, Duration), BenchError>> = None;
        let mut tick = 1u32;
        while !done.load(Ordering::Relaxed) {
            let next = start + INTERVAL * tick;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            let t = start.elapsed().as_secs_f64();
            if done.load(Ordering::Relaxed) && t > duration.as_secs_f64() + 0.05 {
                break;
            }
            let smp = live.take();
            let secs = INTERVAL.as_secs_f64();
            report.samples.push(LiveSample {
                t_s: t,
                read_mb_s: smp.read_bytes as f64 / MB / secs,
                write_mb_s: smp.write_bytes as f64 / MB / secs,
                read_p50_us: smp.read_lat_us.0,
                read_p99_us: smp.read_lat_us.1,
                write_p50_us: smp.write_lat_us.0,
                write_p99_us: smp.write_lat_us.1,
            });
            if flip.is_none() && t >= duration.as_secs_f64() / 2.0 {
                let at = start.elapsed().as_secs_f64();
                flip = Some(stack.flip_flags(&INLINE_FLAGS).map(|d| (at, d)));
            }
            tick += 1;
        }
        (
            runner
                .join()
                .unwrap_or_else(|_| panic!("live engine panicked")),
            flip,
        )
    });
    result?;
    let (at, suspended) =
        flip.ok_or_else(|| BenchError::Options("the live run ended before the flip".into()))??;
    report.flip_at_s = at;
    report.suspend_ms = suspended.as_secs_f64() * 1e3;
    report.table_after = stack.table();
    report.pipelines_after = stack.pipelines();
    report.summarize();
    Ok(report)
}

/// Where and how fio reaches the device in a live run.
pub struct FioLive<'a> {
    /// The fio program.
    pub fio: &'a Path,
    /// NBD URI of the stack's export.
    pub uri: String,
    /// Start of fio's area, bytes.
    pub offset: u64,
    /// Length of fio's area, bytes.
    pub region: u64,
    /// Directory for fio's output and logs.
    pub work_dir: &'a Path,
}

/// The live run driven by fio's nbd engine against the stack's NBD export, using fio's
/// bandwidth and latency logs averaged over 250 ms.
pub fn run_fio_nbd(
    stack: &ConfigStack,
    workload: &Workload,
    duration: Duration,
    setup: &FioLive<'_>,
) -> Result<LiveReport, BenchError> {
    let FioLive {
        fio: fio_bin,
        uri,
        offset,
        region,
        work_dir,
    } = setup;
    let (offset, region, work_dir) = (*offset, *region, *work_dir);
    let mut report = LiveReport {
        config: stack.config.name.clone(),
        workload: workload.name.clone(),
        transport: "nbd".into(),
        duration_s: duration.as_secs_f64(),
        table_before: stack.table(),
        pipelines_before: stack.pipelines(),
        ..Default::default()
    };
    let prefix = work_dir.join("live");
    let job = FioJob {
        target: FioTarget::Nbd { uri: uri.clone() },
        workload,
        offset,
        region,
        runtime: duration,
        verify: FioVerify::Off,
        logs: Some((prefix.clone(), INTERVAL)),
    };
    let start = Instant::now();
    let (result, flip) = std::thread::scope(|s| {
        let runner = s.spawn(|| fio::run(fio_bin, &job, work_dir));
        // fio needs a moment to start; its clock starts at job start, ours at spawn, so the
        // flip time in fio's timeline is approximate by that startup delay (tens of ms).
        std::thread::sleep(duration / 2);
        let at = start.elapsed().as_secs_f64();
        let flip = stack.flip_flags(&INLINE_FLAGS).map(|d| (at, d));
        (
            runner
                .join()
                .unwrap_or_else(|_| panic!("fio thread panicked")),
            flip,
        )
    });
    result?;
    let (at, suspended) = flip?;
    report.flip_at_s = at;
    report.suspend_ms = suspended.as_secs_f64() * 1e3;
    report.table_after = stack.table();
    report.pipelines_after = stack.pipelines();
    let read_log = |suffix: &str| {
        std::fs::read_to_string(format!("{}_{suffix}.1.log", prefix.display()))
            .map(|t| fio::parse_log(&t))
            .map_err(|e| BenchError::Fio(format!("reading fio {suffix} log: {e}")))
    };
    let bw = read_log("bw")?;
    let lat = read_log("lat")?;
    report.samples = samples_from_logs(&bw, &lat);
    report.summarize();
    Ok(report)
}

/// Joins fio's bandwidth and latency logs into samples. The two logs (and the two
/// directions) stamp the same interval a millisecond or so apart, so entries are grouped by
/// the nearest interval boundary rather than matched by exact time.
pub fn samples_from_logs(bw: &[fio::LogSample], lat: &[fio::LogSample]) -> Vec<LiveSample> {
    let step = INTERVAL.as_millis() as u64;
    let bucket = |t: u64| (t + step / 2) / step;
    let mut by: BTreeMap<u64, [f64; 4]> = BTreeMap::new();
    for s in bw {
        if s.ddir < 2 {
            by.entry(bucket(s.time_ms)).or_default()[usize::from(s.ddir)] = s.value;
        }
    }
    for s in lat {
        if s.ddir < 2 {
            if let Some(v) = by.get_mut(&bucket(s.time_ms)) {
                v[2 + usize::from(s.ddir)] = s.value;
            }
        }
    }
    by.into_iter()
        .map(|(k, v)| LiveSample {
            t_s: (k * step) as f64 / 1e3,
            // bw logs are in KiB/s, latency logs in ns (interval means with log_avg_msec).
            read_mb_s: v[0] * 1024.0 / MB,
            write_mb_s: v[1] * 1024.0 / MB,
            read_p50_us: v[2] / 1e3,
            read_p99_us: v[2] / 1e3,
            write_p50_us: v[3] / 1e3,
            write_p99_us: v[3] / 1e3,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_splits_at_the_flip() {
        let mut r = LiveReport {
            flip_at_s: 1.0,
            ..Default::default()
        };
        for k in 1..=8 {
            let t = k as f64 * 0.25;
            let fast = t - 0.25 > 1.0;
            r.samples.push(LiveSample {
                t_s: t,
                read_mb_s: if fast { 300.0 } else { 150.0 },
                write_mb_s: if fast { 300.0 } else { 150.0 },
                read_p99_us: if fast { 20.0 } else { 40.0 },
                write_p99_us: if fast { 25.0 } else { 50.0 },
                ..Default::default()
            });
        }
        r.summarize();
        // Before: 0.5, 0.75, 1.0 (0.25 is warm-up); after: 1.5, 1.75, 2.0 (1.25 holds the flip).
        assert_eq!(r.before.samples, 3);
        assert_eq!(r.after.samples, 3);
        assert_eq!(r.before.total_mb_s, 300.0);
        assert_eq!(r.after.total_mb_s, 600.0);
        assert_eq!(r.after.read_p99_us, 20.0);
        assert!(r.summary().contains("x2.00"));
    }

    #[test]
    fn fio_logs_join_by_interval() {
        // Recorded from fio-3.33 --write_bw_log --write_lat_log --log_avg_msec=250.
        let bw = fio::parse_log("250, 36048, 0, 0, 0\n250, 37856, 1, 0, 0\n500, 18923, 0, 0, 0\n500, 18923, 1, 0, 0\n1251, 19216, 0, 0, 0\n1250, 18816, 1, 0, 0\n");
        let lat = fio::parse_log("250, 55986, 0, 0, 0\n250, 51218, 1, 0, 0\n500, 116072, 0, 0, 0\n501, 94161, 1, 0, 0\n1250, 107192, 0, 0, 0\n1249, 100961, 1, 0, 0\n");
        let s = samples_from_logs(&bw, &lat);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].t_s, 0.25);
        assert!((s[0].read_mb_s - 36048.0 * 1024.0 / 1e6).abs() < 1e-9);
        assert_eq!(s[1].write_p99_us, 94.161);
        assert_eq!(s[2].t_s, 1.25);
        assert_eq!(s[2].read_p99_us, 107.192);
        assert_eq!(s[2].write_mb_s, 18816.0 * 1024.0 / 1e6);
    }
}
