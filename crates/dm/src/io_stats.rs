//! Request statistics of a live mapping: counts, bytes, errors and latency per direction.
//!
//! A [`crate::Mapping`] keeps one [`IoStats`] for its whole life, beside its tables, so the
//! figures are monotonic across `reload`/`resume` (a `refresh` swaps the table, never the
//! mapping), unlike a target's own counters, which start again with each new table.
//!
//! The statistics are updated under the mapping's state lock, which every request already
//! takes twice (to enter and to leave, for suspend's in-flight count): recording adds a few
//! additions and one histogram increment to that critical section and no lock of its own.
//! Latency histograms come from `hdrhistogram` (microsecond resolution, two significant
//! digits, up to an hour) and are allocated on a direction's first request, so an idle
//! volume pays nothing for them.

use hdrhistogram::Histogram;
use std::io;
use std::time::{Duration, Instant};

/// The kind of a request, as the statistics group them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Reads (plain and with integrity tags).
    Read,
    /// Writes (plain and with integrity tags).
    Write,
    /// Discards and write-zeroes.
    Discard,
    /// Flushes.
    Flush,
}

impl Direction {
    /// Every direction, in report order.
    pub const ALL: [Direction; 4] = [
        Direction::Read,
        Direction::Write,
        Direction::Discard,
        Direction::Flush,
    ];

    /// The name reports use: `read`, `write`, `discard`, `flush`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Read => "read",
            Direction::Write => "write",
            Direction::Discard => "discard",
            Direction::Flush => "flush",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The largest latency a histogram records exactly: an hour, in microseconds. Slower
/// requests are recorded as this (saturating), so nothing is lost from the counts.
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// Live counters of one direction.
#[derive(Default)]
struct DirectionCounters {
    requests: u64,
    bytes: u64,
    errors: u64,
    latency_us: Option<Histogram<u64>>,
}

/// Live statistics of a mapping (kept under the mapping's state lock).
#[derive(Default)]
pub(crate) struct IoStats {
    directions: [DirectionCounters; 4],
    /// Errors logged in the current second and when that second began: I/O errors are
    /// logged with their sector, but a failing disk under load would flood the log, so
    /// at most [`ERROR_LOG_PER_SECOND`] a second are written and the rest counted.
    log_window: Option<Instant>,
    logged_in_window: u32,
    suppressed: u64,
}

/// I/O errors logged per mapping and second; the rest are counted and summed up later.
const ERROR_LOG_PER_SECOND: u32 = 10;

/// What the caller should log about a failed request.
pub(crate) enum ErrorLog {
    /// Log this error; `suppressed` earlier ones were not logged.
    Log { suppressed: u64 },
    /// Over the rate limit: counted, not logged.
    Quiet,
}

impl IoStats {
    /// Records one finished request.
    pub(crate) fn record(&mut self, dir: Direction, bytes: u64, elapsed: Duration, ok: bool) {
        let d = &mut self.directions[dir.index()];
        d.requests += 1;
        if ok {
            d.bytes += bytes;
        } else {
            d.errors += 1;
        }
        let h = d.latency_us.get_or_insert_with(|| {
            Histogram::new_with_bounds(1, MAX_LATENCY_US, 2).expect("valid histogram bounds")
        });
        let us = (elapsed.as_micros() as u64).clamp(1, MAX_LATENCY_US);
        h.saturating_record(us);
    }

    /// Decides whether a failed request is logged (rate limit, see [`IoStats::log_window`]).
    pub(crate) fn error_log(&mut self, now: Instant) -> ErrorLog {
        let fresh = match self.log_window {
            Some(start) => now.duration_since(start) >= Duration::from_secs(1),
            None => true,
        };
        if fresh {
            self.log_window = Some(now);
            self.logged_in_window = 0;
        }
        if self.logged_in_window < ERROR_LOG_PER_SECOND {
            self.logged_in_window += 1;
            let suppressed = std::mem::take(&mut self.suppressed);
            ErrorLog::Log { suppressed }
        } else {
            self.suppressed += 1;
            ErrorLog::Quiet
        }
    }

    /// A copy of every figure now.
    pub(crate) fn snapshot(&self) -> IoStatsSnapshot {
        IoStatsSnapshot {
            directions: Direction::ALL
                .iter()
                .map(|&dir| {
                    let d = &self.directions[dir.index()];
                    DirectionSnapshot {
                        direction: dir,
                        requests: d.requests,
                        bytes: d.bytes,
                        errors: d.errors,
                        latency: d.latency_us.as_ref().map(LatencySummary::of),
                    }
                })
                .collect(),
        }
    }
}

/// Latency quantiles of one direction, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencySummary {
    /// Requests measured.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest request.
    pub max_us: u64,
    /// Sum of all latencies (for a mean, and Prometheus' `_sum`).
    pub sum_us: u64,
}

impl LatencySummary {
    fn of(h: &Histogram<u64>) -> Self {
        LatencySummary {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            // The histogram's mean times its count: exact to the histogram's precision,
            // which is what the quantiles have too.
            sum_us: (h.mean() * h.len() as f64).round() as u64,
        }
    }
}

/// The figures of one direction at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectionSnapshot {
    /// Which requests.
    pub direction: Direction,
    /// Requests finished (successful or not).
    pub requests: u64,
    /// Bytes moved by successful requests.
    pub bytes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Latency quantiles, once a request has finished.
    pub latency: Option<LatencySummary>,
}

/// A mapping's request statistics at one moment (see [`crate::Mapping::io_stats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoStatsSnapshot {
    /// One entry per [`Direction`], in [`Direction::ALL`] order.
    pub directions: Vec<DirectionSnapshot>,
}

impl IoStatsSnapshot {
    /// The figures of `dir`.
    pub fn direction(&self, dir: Direction) -> &DirectionSnapshot {
        &self.directions[dir.index()]
    }
}

/// The errno of a failed request, as logs print it (`EIO`, or the raw number).
pub(crate) fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let name = match n {
                libc::EIO => "EIO",
                libc::ENOSPC => "ENOSPC",
                libc::EILSEQ => "EILSEQ",
                libc::ENXIO => "ENXIO",
                libc::EINVAL => "EINVAL",
                libc::EOPNOTSUPP => "EOPNOTSUPP",
                libc::EROFS => "EROFS",
                libc::ETIMEDOUT => "ETIMEDOUT",
                libc::ENOTCONN => "ENOTCONN",
                libc::ECONNRESET => "ECONNRESET",
                libc::EPIPE => "EPIPE",
                libc::EAGAIN => "EAGAIN",
                libc::ENOMEM => "ENOMEM",
                _ => "",
            };
            if name.is_empty() {
                format!("errno {n}")
            } else {
                format!("{name}, errno {n}")
            }
        }
        None => format!("{:?}", e.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_counts_bytes_errors_and_quantiles() {
        let mut s = IoStats::default();
        for us in 1..=1000u64 {
            s.record(Direction::Read, 4096, Duration::from_micros(us), true);
        }
        s.record(Direction::Read, 4096, Duration::from_micros(5), false);
        let snap = s.snapshot();
        let r = snap.direction(Direction::Read);
        assert_eq!(r.requests, 1001);
        assert_eq!(r.bytes, 1000 * 4096);
        assert_eq!(r.errors, 1);
        let l = r.latency.expect("latency recorded");
        assert_eq!(l.count, 1001);
        // Two significant digits: within 1% of the true quantiles.
        assert!((495..=505).contains(&l.p50_us), "p50 {}", l.p50_us);
        assert!((985..=1000).contains(&l.p99_us), "p99 {}", l.p99_us);
        assert!(l.max_us >= 990, "max {}", l.max_us);
        assert!(snap.direction(Direction::Write).latency.is_none());
        assert_eq!(snap.direction(Direction::Write).requests, 0);
    }

    #[test]
    fn an_hour_long_request_is_counted_not_lost() {
        let mut s = IoStats::default();
        s.record(Direction::Flush, 0, Duration::from_secs(7200), true);
        let f = *s.snapshot().direction(Direction::Flush);
        assert_eq!(f.requests, 1);
        assert_eq!(f.latency.unwrap().count, 1);
    }

    #[test]
    fn error_logging_is_rate_limited_and_counts_what_it_drops() {
        let mut s = IoStats::default();
        let t0 = Instant::now();
        let logged = (0..25)
            .filter(|_| matches!(s.error_log(t0), ErrorLog::Log { .. }))
            .count();
        assert_eq!(logged, ERROR_LOG_PER_SECOND as usize);
        match s.error_log(t0 + Duration::from_millis(1500)) {
            ErrorLog::Log { suppressed } => assert_eq!(suppressed, 15),
            ErrorLog::Quiet => panic!("a new second logs again"),
        }
    }
}
