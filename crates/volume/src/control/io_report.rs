//! The typed statistics of a [`super::Status`]: request counts, bytes, errors and latency
//! quantiles per direction (monotonic for the mapping's life, across `refresh`), and each
//! target's own counters. `status --json` prints them as numbers, and
//! [`crate::metrics`] renders them for Prometheus.

use cryptblk_dm::{Direction, DirectionSnapshot, IoStatsSnapshot, LatencySummary, TargetStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Latency quantiles of one direction, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyReport {
    /// Requests measured.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Slowest request.
    pub max: u64,
    /// Sum of all latencies.
    pub sum: u64,
}

impl From<LatencySummary> for LatencyReport {
    fn from(l: LatencySummary) -> Self {
        LatencyReport {
            count: l.count,
            p50: l.p50_us,
            p99: l.p99_us,
            p999: l.p999_us,
            max: l.max_us,
            sum: l.sum_us,
        }
    }
}

/// The figures of one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectionReport {
    /// Requests finished, successful or not.
    pub requests: u64,
    /// Bytes moved by successful requests.
    pub bytes: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Latency in microseconds; absent until a request finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<LatencyReport>,
}

impl From<&DirectionSnapshot> for DirectionReport {
    fn from(d: &DirectionSnapshot) -> Self {
        DirectionReport {
            requests: d.requests,
            bytes: d.bytes,
            errors: d.errors,
            latency_us: d.latency.map(LatencyReport::from),
        }
    }
}

/// A mapping's request statistics since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoReport {
    /// Reads.
    pub read: DirectionReport,
    /// Writes.
    pub write: DirectionReport,
    /// Discards and write-zeroes.
    pub discard: DirectionReport,
    /// Flushes.
    pub flush: DirectionReport,
}

impl IoReport {
    /// The directions with their names, in report order.
    pub fn directions(&self) -> [(&'static str, &DirectionReport); 4] {
        [
            ("read", &self.read),
            ("write", &self.write),
            ("discard", &self.discard),
            ("flush", &self.flush),
        ]
    }
}

impl From<&IoStatsSnapshot> for IoReport {
    fn from(s: &IoStatsSnapshot) -> Self {
        IoReport {
            read: s.direction(Direction::Read).into(),
            write: s.direction(Direction::Write).into(),
            discard: s.direction(Direction::Discard).into(),
            flush: s.direction(Direction::Flush).into(),
        }
    }
}

/// One target's own counters (those of the live table, which start again with a new
/// table) and descriptive facts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetReport {
    /// The target type (`crypt`, `integrity`, ...).
    #[serde(rename = "type")]
    pub target_type: String,
    /// Counters by name.
    pub counters: BTreeMap<String, u64>,
    /// Facts by name (`cipher_impl`, `read_pipeline`, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
}

impl From<&TargetStats> for TargetReport {
    fn from(t: &TargetStats) -> Self {
        TargetReport {
            target_type: t.target_type.to_string(),
            counters: t
                .counters
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            facts: t
                .facts
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }
}
