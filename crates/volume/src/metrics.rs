//! Prometheus text exposition (format 0.0.4) of running volumes' [`Status`] reports, for
//! node_exporter's textfile collector (`cryptblk status --format prometheus > x.prom`).
//!
//! Written here rather than with the `prometheus-client` crate: that crate models live
//! metrics registered in one process, while this renders snapshots that other processes
//! (the daemons) sent over their control sockets, and it has no summary type for the
//! quantiles our hdrhistogram latencies give. The format is a few lines of text per metric;
//! the test suite checks the output with Prometheus' own Python parser.
//!
//! Invariants: every family has one `# HELP` and one `# TYPE` line, followed by all its
//! samples (the parser refuses a family split in two); label values are escaped (`\\`,
//! `\"`, `\n`); counters end in `_total`; latencies are in seconds, as Prometheus names
//! them.

use crate::control::Status;
use std::fmt::Write;

/// One metric family: its name, type, help and samples (labels, value).
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(String, f64)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }

    /// A sample of this family (`suffix` for a summary's `_sum`/`_count`).
    fn push(&mut self, suffix: &str, labels: &[(&str, &str)], value: f64) {
        let mut line = format!("{}{suffix}", self.name);
        if !labels.is_empty() {
            line.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                let _ = write!(line, "{k}=\"{}\"", escape(v));
            }
            line.push('}');
        }
        self.samples.push((line, value));
    }

    fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (line, v) in &self.samples {
            let _ = writeln!(out, "{line} {v}");
        }
    }
}

/// A label value as the exposition format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition of every volume in `volumes`.
pub fn prometheus(volumes: &[Status]) -> String {
    let mut info = Family::new(
        "cryptblk_volume_info",
        "gauge",
        "A served volume: its type, export and read/write pipeline (value 1).",
    );
    let mut size = Family::new("cryptblk_volume_size_bytes", "gauge", "Size of the volume.");
    let mut suspended = Family::new(
        "cryptblk_volume_suspended",
        "gauge",
        "1 while the volume is suspended.",
    );
    let mut users = Family::new(
        "cryptblk_volume_users",
        "gauge",
        "Users of the export (NBD connections, FUSE opens, vhost-user frontend, ublk holders).",
    );
    let mut inflight = Family::new(
        "cryptblk_volume_inflight_requests",
        "gauge",
        "Requests in flight.",
    );
    let mut held = Family::new(
        "cryptblk_volume_held_requests",
        "gauge",
        "Requests held by a suspend.",
    );
    let mut requests = Family::new(
        "cryptblk_requests_total",
        "counter",
        "Requests finished, by direction.",
    );
    let mut bytes = Family::new(
        "cryptblk_bytes_total",
        "counter",
        "Bytes moved by successful requests, by direction.",
    );
    let mut errors = Family::new(
        "cryptblk_errors_total",
        "counter",
        "Requests that failed, by direction.",
    );
    let mut latency = Family::new(
        "cryptblk_request_duration_seconds",
        "summary",
        "Request latency through the mapping, by direction.",
    );
    let mut backing_errors = Family::new(
        "cryptblk_backing_errors_total",
        "counter",
        "Requests a remote backing store failed.",
    );
    for v in volumes {
        let name = v.name.as_str();
        let kind = v.info.kind.as_str();
        let export = v.export_kind();
        let read = v.pipeline.first().map_or("", |p| p.read.as_str());
        let write = v.pipeline.first().map_or("", |p| p.write.as_str());
        info.push(
            "",
            &[
                ("volume", name),
                ("type", kind),
                ("export", export.as_str()),
                ("read_pipeline", read),
                ("write_pipeline", write),
            ],
            1.0,
        );
        let vol = [("volume", name)];
        size.push("", &vol, v.size as f64);
        suspended.push("", &vol, if v.suspended { 1.0 } else { 0.0 });
        users.push("", &vol, v.users as f64);
        inflight.push("", &vol, v.inflight as f64);
        held.push("", &vol, v.held as f64);
        for (dir, d) in v.io.directions() {
            let labels = [("volume", name), ("direction", dir)];
            requests.push("", &labels, d.requests as f64);
            bytes.push("", &labels, d.bytes as f64);
            errors.push("", &labels, d.errors as f64);
            if let Some(l) = d.latency_us {
                for (q, us) in [("0.5", l.p50), ("0.99", l.p99), ("0.999", l.p999)] {
                    latency.push(
                        "",
                        &[("volume", name), ("direction", dir), ("quantile", q)],
                        us as f64 / 1e6,
                    );
                }
                latency.push("_sum", &labels, l.sum as f64 / 1e6);
                latency.push("_count", &labels, l.count as f64);
            }
        }
        for b in &v.backings {
            backing_errors.push(
                "",
                &[("volume", name), ("device", b.device.as_str())],
                b.errors as f64,
            );
        }
    }
    let mut out = String::new();
    for f in [
        &info,
        &size,
        &suspended,
        &users,
        &inflight,
        &held,
        &requests,
        &bytes,
        &errors,
        &latency,
        &backing_errors,
    ] {
        f.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn no_volumes_give_an_empty_exposition() {
        assert_eq!(prometheus(&[]), "");
    }
}
