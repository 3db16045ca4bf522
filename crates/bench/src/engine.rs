//! The in-process load generator: fio's job model on a [`BlockDevice`] directly.
//!
//! `jobs x iodepth` threads, each owning a disjoint, block-aligned slice of the region, issue
//! synchronous I/O until the runtime is up (a synchronous call per thread is how an
//! in-process client keeps `iodepth` requests in flight). Every read is checked against the
//! (unit, generation) pattern ([`crate::pattern`]); total latency per I/O goes into an HDR
//! histogram.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cryptblk_dm::device::{BlockDevice, WriteFlags};
use hdrhistogram::Histogram;

use crate::cpu;
use crate::metrics::{DirMetrics, RunMetrics, VerifyStats, MB};
use crate::pattern::{self, GenerationMap, UNIT};
use crate::workload::{AccessPattern, Workload};
use crate::BenchError;

/// Highest latency the histograms hold (longer ones are clamped): one hour, in ns.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// A fresh latency histogram (ns, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid static histogram bounds")
}

fn dir_metrics(h: &Histogram<u64>, bytes: u64, seconds: f64) -> DirMetrics {
    let ops = h.len();
    let q = |p: f64| {
        if ops == 0 {
            0.0
        } else {
            h.value_at_quantile(p) as f64 / 1e3
        }
    };
    DirMetrics {
        bytes,
        ops,
        mb_s: if seconds > 0.0 {
            bytes as f64 / MB / seconds
        } else {
            0.0
        },
        iops: if seconds > 0.0 {
            ops as f64 / seconds
        } else {
            0.0
        },
        lat_p50_us: q(0.50),
        lat_p99_us: q(0.99),
        lat_p999_us: q(0.999),
        lat_mean_us: if ops == 0 { 0.0 } else { h.mean() / 1e3 },
    }
}

/// Counters a live sampler reads while a run goes on.
pub struct LiveCounters {
    bytes: [AtomicU64; 2],
    interval: Mutex<[Histogram<u64>; 2]>,
}

/// One sampling interval's figures, taken by [`LiveCounters::take`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IntervalSample {
    /// Bytes read since the previous sample.
    pub read_bytes: u64,
    /// Bytes written since the previous sample.
    pub write_bytes: u64,
    /// Read latency percentiles (p50, p99) in the interval, microseconds.
    pub read_lat_us: (f64, f64),
    /// Write latency percentiles (p50, p99) in the interval, microseconds.
    pub write_lat_us: (f64, f64),
}

impl Default for LiveCounters {
    fn default() -> Self {
        LiveCounters {
            bytes: [AtomicU64::new(0), AtomicU64::new(0)],
            interval: Mutex::new([new_histogram(), new_histogram()]),
        }
    }
}

impl LiveCounters {
    fn record(&self, dir: usize, bytes: u64, lat_ns: u64) {
        self.bytes[dir].fetch_add(bytes, Ordering::Relaxed);
        let mut h = self.interval.lock().unwrap_or_else(|e| e.into_inner());
        h[dir].saturating_record(lat_ns);
    }

    /// The figures since the previous call, resetting the interval.
    pub fn take(&self) -> IntervalSample {
        let r = self.bytes[0].swap(0, Ordering::Relaxed);
        let w = self.bytes[1].swap(0, Ordering::Relaxed);
        let mut h = self.interval.lock().unwrap_or_else(|e| e.into_inner());
        let pct = |h: &Histogram<u64>| {
            if h.is_empty() {
                (0.0, 0.0)
            } else {
                (
                    h.value_at_quantile(0.5) as f64 / 1e3,
                    h.value_at_quantile(0.99) as f64 / 1e3,
                )
            }
        };
        let s = IntervalSample {
            read_bytes: r,
            write_bytes: w,
            read_lat_us: pct(&h[0]),
            write_lat_us: pct(&h[1]),
        };
        h[0].reset();
        h[1].reset();
        s
    }
}

/// One in-process run.
pub struct EngineRun<'a> {
    /// The device under test.
    pub device: Arc<dyn BlockDevice>,
    /// What to do.
    pub workload: &'a Workload,
    /// Start of the region, bytes (a multiple of 4 KiB).
    pub region_offset: u64,
    /// Length of the region, bytes.
    pub region_len: u64,
    /// How long to run.
    pub runtime: Duration,
    /// What each unit of the region holds (kept across runs).
    pub generations: &'a GenerationMap,
    /// Counters for live sampling, if any.
    pub live: Option<&'a LiveCounters>,
    /// Seed of the offset and direction choices.
    pub seed: u64,
}

struct WorkerResult {
    hist: [Histogram<u64>; 2],
    bytes: [u64; 2],
    checked_reads: u64,
}

struct Shared {
    stop: AtomicBool,
    failure: Mutex<Option<BenchError>>,
}

impl Shared {
    fn fail(&self, e: BenchError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(e);
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes generation 0 of the pattern over `[offset, offset + len)` (what
/// [`GenerationMap::new`] assumes), with two threads in 1 MiB requests. This also commits the
/// RAM disk's memory, so runs never read never-written (zero-filled) chunks.
pub fn prefill(device: &dyn BlockDevice, offset: u64, len: u64) -> Result<(), BenchError> {
    const CHUNK: u64 = 1 << 20;
    let chunks = len.div_ceil(CHUNK);
    let next = AtomicU64::new(0);
    let result: Mutex<Result<(), BenchError>> = Mutex::new(Ok(()));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut buf = vec![0u8; CHUNK as usize];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= chunks {
                        break;
                    }
                    let start = i * CHUNK;
                    let n = (len - start).min(CHUNK);
                    let b = &mut buf[..n as usize];
                    for (k, unit) in b.chunks_exact_mut(UNIT as usize).enumerate() {
                        pattern::fill(unit, (offset + start) / UNIT + k as u64, 0);
                    }
                    if let Err(e) =
                        device.write_at_scratch(offset + start, b, WriteFlags::default())
                    {
                        *result.lock().unwrap_or_else(|p| p.into_inner()) = Err(BenchError::Io(
                            format!("prefill write at {}: {e}", offset + start),
                        ));
                        break;
                    }
                }
            });
        }
    });
    result.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Runs the workload; fails on an I/O error or a verification mismatch.
pub fn run(job: &EngineRun<'_>) -> Result<RunMetrics, BenchError> {
    let w = job.workload;
    if w.block_size % UNIT != 0 || job.region_offset % UNIT != 0 {
        return Err(BenchError::Options(format!(
            "block size {} and region offset {} must be multiples of {UNIT}",
            w.block_size, job.region_offset
        )));
    }
    let threads = w.concurrency();
    let slice = w.slice_len(job.region_len, threads);
    if slice < w.block_size {
        return Err(BenchError::Options(format!(
            "region of {} bytes is too small for {threads} threads of {}-byte blocks",
            job.region_len, w.block_size
        )));
    }
    if job.generations.units() * UNIT < job.region_len {
        return Err(BenchError::Options(
            "generation map smaller than the region".into(),
        ));
    }
    let shared = Shared {
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
    };
    let cpu_before = cpu::process_cpu();
    let started = Instant::now();
    let deadline = started + job.runtime;
    let results: Vec<WorkerResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let shared = &shared;
                s.spawn(move || worker(job, t, slice, deadline, shared))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("benchmark worker panicked"))
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_used = cpu::process_cpu().saturating_sub(cpu_before).as_secs_f64();
    if let Some(e) = shared
        .failure
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(e);
    }
    let mut hist = [new_histogram(), new_histogram()];
    let mut bytes = [0u64; 2];
    let mut checked = 0;
    for r in &results {
        for d in 0..2 {
            hist[d]
                .add(&r.hist[d])
                .expect("histograms with identical bounds merge");
            bytes[d] += r.bytes[d];
        }
        checked += r.checked_reads;
    }
    let mut m = RunMetrics {
        seconds: elapsed,
        read: dir_metrics(&hist[0], bytes[0], elapsed),
        write: dir_metrics(&hist[1], bytes[1], elapsed),
        server_cpu_s: cpu_used,
        client_cpu_s: 0.0,
        verify: VerifyStats {
            enabled: true,
            method: "pattern".into(),
            checked_reads: checked,
            errors: 0,
        },
        ..Default::default()
    };
    m.compute_cpu_per_gb();
    Ok(m)
}

fn worker(
    job: &EngineRun<'_>,
    index: u32,
    slice: u64,
    deadline: Instant,
    shared: &Shared,
) -> WorkerResult {
    let w = job.workload;
    let bs = w.block_size;
    let base = job.region_offset + u64::from(index) * slice;
    let blocks = slice / bs;
    let mut rng = fastrand::Rng::with_seed(job.seed ^ (u64::from(index) << 32) ^ 0x5eed);
    let mut buf = vec![0u8; bs as usize];
    let mut cursor = [0u64; 2];
    let mut out = WorkerResult {
        hist: [new_histogram(), new_histogram()],
        bytes: [0; 2],
        checked_reads: 0,
    };
    let units_per_block = bs / UNIT;
    let mut ops: u64 = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        // Checking the clock every I/O costs as much as a 4 KiB memcpy; every 8 is plenty.
        if ops % 8 == 0 && Instant::now() >= deadline {
            break;
        }
        ops += 1;
        let dir = usize::from(rng.u8(0..100) >= w.read_percent);
        let block = match w.pattern {
            AccessPattern::Sequential => {
                let b = cursor[dir];
                cursor[dir] = (b + 1) % blocks;
                b
            }
            AccessPattern::Random => rng.u64(0..blocks),
        };
        let offset = base + block * bs;
        let first_unit = (offset - job.region_offset) / UNIT;
        let abs_unit = offset / UNIT;
        if dir == 0 {
            let t0 = Instant::now();
            let r = job.device.read_at(offset, &mut buf);
            let lat = t0.elapsed().as_nanos() as u64;
            if let Err(e) = r {
                shared.fail(BenchError::Io(format!(
                    "read of {bs} bytes at {offset}: {e}"
                )));
                break;
            }
            out.hist[0].saturating_record(lat);
            out.bytes[0] += bs;
            if let Some(l) = job.live {
                l.record(0, bs, lat);
            }
            for u in 0..units_per_block {
                let gen = job.generations.get(first_unit + u);
                let chunk = &buf[(u * UNIT) as usize..((u + 1) * UNIT) as usize];
                if !pattern::check(chunk, abs_unit + u, gen) {
                    shared.fail(BenchError::Verify(format!(
                        "read at byte {} returned data that is not generation {gen} of that block",
                        offset + u * UNIT
                    )));
                    return out;
                }
            }
            out.checked_reads += 1;
        } else {
            for u in 0..units_per_block {
                let gen = job.generations.get(first_unit + u).wrapping_add(1);
                pattern::fill(
                    &mut buf[(u * UNIT) as usize..((u + 1) * UNIT) as usize],
                    abs_unit + u,
                    gen,
                );
            }
            let t0 = Instant::now();
            let r = job
                .device
                .write_at_scratch(offset, &mut buf, WriteFlags::default());
            let lat = t0.elapsed().as_nanos() as u64;
            if let Err(e) = r {
                shared.fail(BenchError::Io(format!(
                    "write of {bs} bytes at {offset}: {e}"
                )));
                break;
            }
            for u in 0..units_per_block {
                let g = job.generations.get(first_unit + u).wrapping_add(1);
                job.generations.set(first_unit + u, g);
            }
            out.hist[1].saturating_record(lat);
            out.bytes[1] += bs;
            if let Some(l) = job.live {
                l.record(1, bs, lat);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    /// A plain in-memory device, independent of cryptblk-dm's RAM disk.
    struct VecDevice(Mutex<Vec<u8>>);

    impl BlockDevice for VecDevice {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let d = self.0.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&self, offset: u64, buf: &[u8], _: WriteFlags) -> io::Result<()> {
            let mut d = self.0.lock().unwrap();
            d[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Drops every `n`th write on the floor: a device that loses data.
    struct LossyDevice {
        inner: VecDevice,
        n: u64,
        count: AtomicU64,
    }

    impl BlockDevice for LossyDevice {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.inner.read_at(offset, buf)
        }
        fn write_at(&self, offset: u64, buf: &[u8], f: WriteFlags) -> io::Result<()> {
            if self.count.fetch_add(1, Ordering::Relaxed) % self.n == self.n - 1 {
                return Ok(());
            }
            self.inner.write_at(offset, buf, f)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    fn job<'a>(
        dev: Arc<dyn BlockDevice>,
        w: &'a Workload,
        gens: &'a GenerationMap,
        len: u64,
    ) -> EngineRun<'a> {
        EngineRun {
            device: dev,
            workload: w,
            region_offset: 0,
            region_len: len,
            runtime: Duration::from_millis(150),
            generations: gens,
            live: None,
            seed: 1,
        }
    }

    #[test]
    fn every_workload_moves_verified_data() {
        let len = 8 << 20;
        let dev: Arc<dyn BlockDevice> = Arc::new(VecDevice(Mutex::new(vec![0; len as usize])));
        prefill(dev.as_ref(), 0, len).unwrap();
        let gens = GenerationMap::new(len);
        for w in Workload::builtin() {
            let m = run(&job(dev.clone(), &w, &gens, len)).unwrap();
            assert!(m.read.ops > 0 && m.write.ops > 0, "{}: {m:?}", w.name);
            assert_eq!(m.verify.checked_reads, m.read.ops);
            assert!(m.read.lat_p50_us > 0.0 && m.read.lat_p99_us >= m.read.lat_p50_us);
            assert!(m.cpu_s_per_gb > 0.0);
        }
    }

    #[test]
    fn lost_writes_are_detected() {
        let len = 1 << 20;
        let lossy = Arc::new(LossyDevice {
            inner: VecDevice(Mutex::new(vec![0; len as usize])),
            n: 5,
            count: AtomicU64::new(0),
        });
        // Prefill through the inner device, which loses nothing.
        prefill(&lossy.inner, 0, len).unwrap();
        let gens = GenerationMap::new(len);
        let dev: Arc<dyn BlockDevice> = lossy;
        let w = &Workload::builtin()[1];
        let err = run(&job(dev, w, &gens, len)).unwrap_err();
        assert!(matches!(err, BenchError::Verify(_)), "{err}");
    }

    #[test]
    fn live_counters_sample_and_reset() {
        let len = 4 << 20;
        let dev: Arc<dyn BlockDevice> = Arc::new(VecDevice(Mutex::new(vec![0; len as usize])));
        prefill(dev.as_ref(), 0, len).unwrap();
        let gens = GenerationMap::new(len);
        let live = LiveCounters::default();
        let w = &Workload::builtin()[0];
        let mut j = job(dev, w, &gens, len);
        j.live = Some(&live);
        let m = run(&j).unwrap();
        let s = live.take();
        assert_eq!(s.read_bytes, m.read.bytes);
        assert_eq!(s.write_bytes, m.write.bytes);
        assert!(s.read_lat_us.1 >= s.read_lat_us.0);
        assert_eq!(live.take(), IntervalSample::default());
    }
}
