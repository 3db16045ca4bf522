//! What one run measured, medians over repeats, and the reference's throughput bound.
//!
//! Units: MB/s are decimal (10^6 bytes per second, like fio's `MB/s`), latencies are
//! microseconds of total latency (submission to completion: fio's `lat_ns`).

use serde::Serialize;

/// Bytes in the MB of "MB/s".
pub const MB: f64 = 1e6;

/// Measurements of one direction (reads or writes) of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DirMetrics {
    /// Bytes transferred.
    pub bytes: u64,
    /// I/O operations completed.
    pub ops: u64,
    /// Throughput in MB/s.
    pub mb_s: f64,
    /// Operations per second.
    pub iops: f64,
    /// Median total latency, microseconds.
    pub lat_p50_us: f64,
    /// 99th percentile total latency, microseconds.
    pub lat_p99_us: f64,
    /// 99.9th percentile total latency, microseconds.
    pub lat_p999_us: f64,
    /// Mean total latency, microseconds.
    pub lat_mean_us: f64,
}

/// Data verification done during a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyStats {
    /// Whether verification was on.
    pub enabled: bool,
    /// How: `pattern` (in-process, offset+generation pattern checked on every read),
    /// `fio-crc32c` (fio `--verify=crc32c` with a verify backlog).
    pub method: String,
    /// Reads whose contents were checked (in-process); for fio, its verify reads are part of
    /// the read counts and not separately reported, so this is 0.
    pub checked_reads: u64,
    /// Mismatches found (a run with mismatches fails, so reports show 0).
    pub errors: u64,
}

/// Everything measured in one run of one (configuration, workload, transport).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunMetrics {
    /// Measured wall-clock seconds of I/O.
    pub seconds: f64,
    /// Reads.
    pub read: DirMetrics,
    /// Writes.
    pub write: DirMetrics,
    /// CPU seconds (user + system) of this process during the run: the load generator and the
    /// device stack in-process; the serving side (NBD/FUSE server, dm, crypto) otherwise.
    pub server_cpu_s: f64,
    /// CPU seconds of the client (fio's usr+sys); 0 in-process (counted in `server_cpu_s`).
    pub client_cpu_s: f64,
    /// (server + client CPU seconds) per GB moved (reads + writes, 10^9 bytes).
    pub cpu_s_per_gb: f64,
    /// Server CPU microseconds per request (reads + writes completed): unlike MB/s, it
    /// barely moves when other processes take the CPUs, so it is what a noisy run can still
    /// publish.
    pub server_cpu_us_per_req: f64,
    /// Client (fio) CPU microseconds per request; 0 in-process.
    pub client_cpu_us_per_req: f64,
    /// Server CPU seconds per GB moved.
    pub server_cpu_s_per_gb: f64,
    /// Client CPU seconds per GB moved.
    pub client_cpu_s_per_gb: f64,
    /// Verification done.
    pub verify: VerifyStats,
}

impl RunMetrics {
    /// Reads + writes in MB/s.
    pub fn total_mb_s(&self) -> f64 {
        self.read.mb_s + self.write.mb_s
    }

    /// Reads + writes per second.
    pub fn total_iops(&self) -> f64 {
        self.read.iops + self.write.iops
    }

    /// Reads + writes completed.
    pub fn total_ops(&self) -> u64 {
        self.read.ops + self.write.ops
    }

    /// Fills the per-GB and per-request CPU figures (`cpu_s_per_gb`, `server_*`,
    /// `client_*`) from the CPU seconds, bytes and operations.
    pub fn compute_cpu_per_gb(&mut self) {
        let bytes = self.read.bytes + self.write.bytes;
        let ops = self.total_ops();
        self.cpu_s_per_gb = per_gb(self.server_cpu_s + self.client_cpu_s, bytes);
        self.server_cpu_s_per_gb = per_gb(self.server_cpu_s, bytes);
        self.client_cpu_s_per_gb = per_gb(self.client_cpu_s, bytes);
        self.server_cpu_us_per_req = per_request_us(self.server_cpu_s, ops);
        self.client_cpu_us_per_req = per_request_us(self.client_cpu_s, ops);
    }

    /// What the cipher alone costs per request of this run, in microseconds: each read's
    /// bytes decrypted and each write's encrypted at the in-memory speeds (MB/s, one CPU),
    /// averaged over the requests. Bytes over MB/s (bytes per microsecond) are microseconds.
    pub fn cipher_us_per_req(&self, encrypt_mb_s: f64, decrypt_mb_s: f64) -> f64 {
        let ops = self.total_ops();
        let cost = |bytes: u64, mb_s: f64| {
            if bytes == 0 {
                0.0
            } else if mb_s > 0.0 {
                bytes as f64 / mb_s
            } else {
                f64::INFINITY
            }
        };
        if ops == 0 {
            return 0.0;
        }
        (cost(self.read.bytes, decrypt_mb_s) + cost(self.write.bytes, encrypt_mb_s)) / ops as f64
    }
}

/// CPU seconds per GB (10^9 bytes); 0 when nothing moved.
pub fn per_gb(cpu_s: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        cpu_s / (bytes as f64 / 1e9)
    }
}

/// CPU microseconds per request; 0 when no request completed.
pub fn per_request_us(cpu_s: f64, ops: u64) -> f64 {
    if ops == 0 {
        0.0
    } else {
        cpu_s * 1e6 / ops as f64
    }
}

/// The median of `values` (mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_u64(values: impl Iterator<Item = u64>) -> u64 {
    let v: Vec<f64> = values.map(|x| x as f64).collect();
    median(&v).round() as u64
}

fn median_dir(runs: &[RunMetrics], pick: impl Fn(&RunMetrics) -> &DirMetrics) -> DirMetrics {
    let f = |g: &dyn Fn(&DirMetrics) -> f64| {
        median(&runs.iter().map(|r| g(pick(r))).collect::<Vec<_>>())
    };
    DirMetrics {
        bytes: median_u64(runs.iter().map(|r| pick(r).bytes)),
        ops: median_u64(runs.iter().map(|r| pick(r).ops)),
        mb_s: f(&|d| d.mb_s),
        iops: f(&|d| d.iops),
        lat_p50_us: f(&|d| d.lat_p50_us),
        lat_p99_us: f(&|d| d.lat_p99_us),
        lat_p999_us: f(&|d| d.lat_p999_us),
        lat_mean_us: f(&|d| d.lat_mean_us),
    }
}

/// Field-wise medians over repeated runs (each figure is the median of that figure, so the
/// result need not be one of the runs). Verification counts are summed: they say how much was
/// checked in all.
pub fn median_runs(runs: &[RunMetrics]) -> RunMetrics {
    let f = |g: &dyn Fn(&RunMetrics) -> f64| median(&runs.iter().map(g).collect::<Vec<_>>());
    RunMetrics {
        seconds: f(&|r| r.seconds),
        read: median_dir(runs, |r| &r.read),
        write: median_dir(runs, |r| &r.write),
        server_cpu_s: f(&|r| r.server_cpu_s),
        client_cpu_s: f(&|r| r.client_cpu_s),
        cpu_s_per_gb: f(&|r| r.cpu_s_per_gb),
        server_cpu_us_per_req: f(&|r| r.server_cpu_us_per_req),
        client_cpu_us_per_req: f(&|r| r.client_cpu_us_per_req),
        server_cpu_s_per_gb: f(&|r| r.server_cpu_s_per_gb),
        client_cpu_s_per_gb: f(&|r| r.client_cpu_s_per_gb),
        verify: VerifyStats {
            enabled: runs.iter().all(|r| r.verify.enabled) && !runs.is_empty(),
            method: runs
                .first()
                .map(|r| r.verify.method.clone())
                .unwrap_or_default(),
            checked_reads: runs.iter().map(|r| r.verify.checked_reads).sum(),
            errors: runs.iter().map(|r| r.verify.errors).sum(),
        },
    }
}

/// The reference's expected throughput when storage and cipher work one after the other:
/// `plain * cipher / (plain + cipher)` (1126 MB/s plain, 1823 MB/s AES-XTS gave 696 MB/s).
pub fn serial_bound(plain_mb_s: f64, cipher_mb_s: f64) -> f64 {
    if plain_mb_s <= 0.0 || cipher_mb_s <= 0.0 {
        return 0.0;
    }
    plain_mb_s * cipher_mb_s / (plain_mb_s + cipher_mb_s)
}

/// A crypt row's expected throughput and how much of it was achieved.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BoundFigures {
    /// In-memory cipher speed for reads (decryption), MB/s.
    pub cipher_decrypt_mb_s: f64,
    /// In-memory cipher speed for writes (encryption), MB/s.
    pub cipher_encrypt_mb_s: f64,
    /// The plain configuration's read MB/s on the same workload and transport.
    pub plain_read_mb_s: f64,
    /// The plain configuration's write MB/s on the same workload and transport.
    pub plain_write_mb_s: f64,
    /// Bound for reads: serial_bound(plain read, decrypt).
    pub bound_read_mb_s: f64,
    /// Bound for writes: serial_bound(plain write, encrypt).
    pub bound_write_mb_s: f64,
    /// (achieved read + write) / (bound read + bound write).
    pub fraction: f64,
}

impl BoundFigures {
    /// Computes the bounds of a crypt row from its plain counterpart and the cipher speeds.
    pub fn new(
        plain: &RunMetrics,
        achieved: &RunMetrics,
        encrypt_mb_s: f64,
        decrypt_mb_s: f64,
    ) -> Self {
        // A direction the workload does not use has no bound (and no achieved throughput).
        let dir = |p: &DirMetrics, c: f64| {
            if p.ops == 0 {
                0.0
            } else {
                serial_bound(p.mb_s, c)
            }
        };
        let bound_read = dir(&plain.read, decrypt_mb_s);
        let bound_write = dir(&plain.write, encrypt_mb_s);
        let total = bound_read + bound_write;
        BoundFigures {
            cipher_decrypt_mb_s: decrypt_mb_s,
            cipher_encrypt_mb_s: encrypt_mb_s,
            plain_read_mb_s: plain.read.mb_s,
            plain_write_mb_s: plain.write.mb_s,
            bound_read_mb_s: bound_read,
            bound_write_mb_s: bound_write,
            fraction: if total > 0.0 {
                achieved.total_mb_s() / total
            } else {
                0.0
            },
        }
    }
}

/// The issue-26 allowance for a crypt row's extra server CPU per request: this many times
/// the cipher's own cost ...
pub const EXCESS_CIPHER_FACTOR: f64 = 1.2;
/// ... plus this many microseconds (a request's fixed overhead: the table lookup, the
/// per-request cipher state, a bounce buffer).
pub const EXCESS_SLACK_US: f64 = 1.0;

/// What a crypt row's server spends per request beyond its plain (`linear`) row on the same
/// workload and transport, set against what the cipher alone costs for those requests.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CpuExcess {
    /// The plain row's server CPU per request, µs (median over its repeats).
    pub plain_server_us_per_req: f64,
    /// This row's server CPU per request, µs (median over its repeats).
    pub server_us_per_req: f64,
    /// `server_us_per_req - plain_server_us_per_req`.
    pub excess_us_per_req: f64,
    /// The cipher's cost per request of this workload at the in-memory speeds measured in the
    /// same run ([`RunMetrics::cipher_us_per_req`]).
    pub cipher_us_per_req: f64,
    /// `excess / cipher` (0 when the cipher costs nothing measurable).
    pub excess_over_cipher: f64,
    /// The allowance: `EXCESS_CIPHER_FACTOR * cipher + EXCESS_SLACK_US`.
    pub limit_us_per_req: f64,
    /// `excess_us_per_req <= limit_us_per_req`.
    pub within_limit: bool,
}

impl CpuExcess {
    /// The excess of `crypt` (median figures) over `plain` with the cipher at `encrypt_mb_s` /
    /// `decrypt_mb_s`. The cipher's cost is taken from the crypt row's own request mix.
    pub fn new(
        plain: &RunMetrics,
        crypt: &RunMetrics,
        encrypt_mb_s: f64,
        decrypt_mb_s: f64,
    ) -> Self {
        let excess = crypt.server_cpu_us_per_req - plain.server_cpu_us_per_req;
        let cipher = crypt.cipher_us_per_req(encrypt_mb_s, decrypt_mb_s);
        let limit = EXCESS_CIPHER_FACTOR * cipher + EXCESS_SLACK_US;
        CpuExcess {
            plain_server_us_per_req: plain.server_cpu_us_per_req,
            server_us_per_req: crypt.server_cpu_us_per_req,
            excess_us_per_req: excess,
            cipher_us_per_req: cipher,
            excess_over_cipher: if cipher > 0.0 && cipher.is_finite() {
                excess / cipher
            } else {
                0.0
            },
            limit_us_per_req: limit,
            within_limit: excess <= limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_bound() {
        // The blog's back-of-the-envelope figure: (1126 * 1823) / (1126 + 1823) =~ 696.
        assert_eq!(serial_bound(1126.0, 1823.0).round(), 696.0);
        assert_eq!(serial_bound(0.0, 1823.0), 0.0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        let run = |mb: f64| RunMetrics {
            read: DirMetrics {
                mb_s: mb,
                ops: 10,
                ..Default::default()
            },
            verify: VerifyStats {
                enabled: true,
                checked_reads: 5,
                ..Default::default()
            },
            ..Default::default()
        };
        let m = median_runs(&[run(100.0), run(300.0), run(200.0)]);
        assert_eq!(m.read.mb_s, 200.0);
        assert_eq!(m.read.ops, 10);
        assert_eq!(m.verify.checked_reads, 15);
        assert!(m.verify.enabled);
    }

    fn run_of(ops: u64, bytes_per_op: u64, server_cpu_s: f64, client_cpu_s: f64) -> RunMetrics {
        let dir = DirMetrics {
            ops: ops / 2,
            bytes: ops / 2 * bytes_per_op,
            ..Default::default()
        };
        let mut m = RunMetrics {
            read: dir.clone(),
            write: dir,
            server_cpu_s,
            client_cpu_s,
            ..Default::default()
        };
        m.compute_cpu_per_gb();
        m
    }

    #[test]
    fn cpu_per_request_and_per_gb() {
        // 100 000 requests of 4 KiB (409.6 MB) for 0.8 s of server and 1.2 s of client CPU.
        let m = run_of(100_000, 4096, 0.8, 1.2);
        assert!((m.server_cpu_us_per_req - 8.0).abs() < 1e-9);
        assert!((m.client_cpu_us_per_req - 12.0).abs() < 1e-9);
        assert!((m.server_cpu_s_per_gb - 0.8 / 0.4096).abs() < 1e-9);
        assert!((m.client_cpu_s_per_gb - 1.2 / 0.4096).abs() < 1e-9);
        assert!((m.cpu_s_per_gb - 2.0 / 0.4096).abs() < 1e-9);
        let none = run_of(0, 4096, 0.5, 0.5);
        assert_eq!((none.server_cpu_us_per_req, none.cpu_s_per_gb), (0.0, 0.0));
        // Medians are of each run's own per-request figure.
        let med = median_runs(&[
            run_of(100_000, 4096, 0.8, 0.0),
            run_of(50_000, 4096, 0.9, 0.0),
            run_of(100_000, 4096, 0.7, 0.0),
        ]);
        assert!((med.server_cpu_us_per_req - 8.0).abs() < 1e-9);
    }

    #[test]
    fn cipher_cost_per_request() {
        // 4096 bytes at 4096 MB/s is 1 µs; half reads at 2048 MB/s (2 µs): 1.5 µs a request.
        let m = run_of(1000, 4096, 0.0, 0.0);
        assert!((m.cipher_us_per_req(4096.0, 2048.0) - 1.5).abs() < 1e-9);
        // 1 MiB requests at 6400 MB/s: 163.84 µs each way.
        let big = run_of(10, 1 << 20, 0.0, 0.0);
        assert!((big.cipher_us_per_req(6400.0, 6400.0) - 163.84).abs() < 1e-9);
        // Write-only: the read speed does not enter.
        let mut w = run_of(1000, 4096, 0.0, 0.0);
        w.read = DirMetrics::default();
        assert!((w.cipher_us_per_req(4096.0, 0.0) - 1.0).abs() < 1e-9);
        assert_eq!(RunMetrics::default().cipher_us_per_req(1.0, 1.0), 0.0);
    }

    #[test]
    fn excess_against_the_cipher() {
        // Plain 7.5 µs, crypt 9.0 µs per 4 KiB request, cipher 1 µs: 1.5 <= 1.2 + 1.
        let plain = run_of(100_000, 4096, 0.75, 0.0);
        let crypt = run_of(100_000, 4096, 0.90, 0.0);
        let e = CpuExcess::new(&plain, &crypt, 4096.0, 4096.0);
        assert!((e.excess_us_per_req - 1.5).abs() < 1e-9);
        assert!((e.cipher_us_per_req - 1.0).abs() < 1e-9);
        assert!((e.limit_us_per_req - 2.2).abs() < 1e-9);
        assert!((e.excess_over_cipher - 1.5).abs() < 1e-9);
        assert!(e.within_limit);
        // 2.3 µs over: past 1.2 x 1 + 1.
        let slow = run_of(100_000, 4096, 0.98, 0.0);
        let e = CpuExcess::new(&plain, &slow, 4096.0, 4096.0);
        assert!((e.excess_us_per_req - 2.3).abs() < 1e-9);
        assert!(!e.within_limit);
        // Just under the limit passes; a crypt row cheaper than plain passes.
        let at = run_of(100_000, 4096, 0.969, 0.0);
        assert!(CpuExcess::new(&plain, &at, 4096.0, 4096.0).within_limit);
        let cheap = run_of(100_000, 4096, 0.70, 0.0);
        let e = CpuExcess::new(&plain, &cheap, 4096.0, 4096.0);
        assert!(e.excess_us_per_req < 0.0 && e.within_limit);
    }

    #[test]
    fn bound_fraction() {
        let plain = RunMetrics {
            read: DirMetrics {
                mb_s: 1126.0,
                ops: 1,
                ..Default::default()
            },
            write: DirMetrics {
                mb_s: 1126.0,
                ops: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let crypt = RunMetrics {
            read: DirMetrics {
                mb_s: 147.0,
                ops: 1,
                ..Default::default()
            },
            write: DirMetrics {
                mb_s: 147.0,
                ops: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let b = BoundFigures::new(&plain, &crypt, 1823.0, 1823.0);
        assert_eq!(b.bound_read_mb_s.round(), 696.0);
        assert!((b.fraction - 294.0 / (2.0 * 696.08)).abs() < 1e-3);
    }
}
