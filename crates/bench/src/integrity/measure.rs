//! The measuring rounds: every workload over every transport, `repeats` rounds, each round
//! running every configuration once in table order (so a drift of the machine's speed hits
//! all of them alike), then one cell per configuration with the median of its samples.
//!
//! Transports: `inproc` calls [`engine::run`] on the mapping over `[0, region)`, which checks
//! every read against the pattern it wrote; `nbd` runs fio's `nbd` engine against the
//! stack's NBD server over `[region, 2 * region)` with [`FioVerify::Headers`].
//!
//! Invariants: read-only configurations get no write workloads (and so no cell for them); a
//! read workload's figure is read MB/s, any other's write MB/s; a run that returned wrong
//! data, or any other failure, fails the whole experiment with the configuration, workload
//! and transport named, instead of giving a figure. The engine's seed depends only on the
//! round and the configuration's position, so runs are reproducible.

use std::path::Path;

use super::render::IntegrityCell;
use super::stack::IntegrityStack;
use super::IntegrityBenchOptions;
use crate::engine::{self, EngineRun};
use crate::fio::{self, FioJob, FioTarget, FioVerify};
use crate::workload::Workload;
use crate::{BenchError, Transport};

/// Every (workload, transport) cell of `stacks`, in row order then transport order; `work`
/// receives fio's output.
pub(super) fn cells(
    stacks: &[IntegrityStack],
    workloads: &[Workload],
    transports: &[Transport],
    opts: &IntegrityBenchOptions,
    work: &Path,
) -> Result<Vec<IntegrityCell>, BenchError> {
    let mut cells = Vec::new();
    for w in workloads {
        for &t in transports {
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); stacks.len()];
            let mut cpu_samples: Vec<Vec<f64>> = vec![Vec::new(); stacks.len()];
            for r in 0..opts.repeats.max(1) {
                for (i, s) in stacks.iter().enumerate() {
                    if w.read_percent < 100 && !s.config.writable() {
                        continue;
                    }
                    let seed = 0x1a7e ^ (u64::from(r) << 16) ^ i as u64;
                    let (wall, cpu) = one_run(s, w, t, opts, work, seed)?;
                    samples[i].push(wall);
                    if let Some(c) = cpu {
                        cpu_samples[i].push(c);
                    }
                }
            }
            for ((s, v), c) in stacks.iter().zip(samples).zip(cpu_samples) {
                if v.is_empty() {
                    continue;
                }
                cells.push(IntegrityCell {
                    transport: t.name().into(),
                    config: s.config.name.clone(),
                    workload: w.name.clone(),
                    mb_s: median(&v),
                    samples: v,
                    cpu_mb_s: (!c.is_empty()).then(|| median(&c)),
                    cpu_samples: c,
                });
            }
        }
    }
    Ok(cells)
}

/// One run of `w` on `s` over `t`: MB/s read (read workloads) or written (the others), and
/// (in process) the same bytes per second of the process's CPU time, which a loaded
/// machine barely moves.
fn one_run(
    s: &IntegrityStack,
    w: &Workload,
    t: Transport,
    opts: &IntegrityBenchOptions,
    work: &Path,
    seed: u64,
) -> Result<(f64, Option<f64>), BenchError> {
    let what =
        |e: BenchError| BenchError::Io(format!("{} {} {}: {e}", s.config.name, w.name, t.name()));
    let m = match t {
        Transport::Inproc => engine::run(&EngineRun {
            device: s.device(),
            workload: w,
            region_offset: 0,
            region_len: opts.region,
            runtime: opts.runtime,
            generations: &s.generations,
            live: None,
            seed,
        })
        .map_err(what)?,
        _ => {
            let uri = s.nbd_uri().ok_or_else(|| {
                BenchError::Export(format!("{} is not served over NBD", s.config.name))
            })?;
            let job = FioJob {
                target: FioTarget::Nbd { uri },
                workload: w,
                offset: opts.region,
                region: opts.region,
                runtime: opts.runtime,
                verify: FioVerify::Headers,
                logs: None,
            };
            fio::run(&opts.fio, &job, work).map_err(what)?
        }
    };
    let d = if w.read_percent == 100 {
        &m.read
    } else {
        &m.write
    };
    let cpu = (t == Transport::Inproc && m.server_cpu_s > 0.0)
        .then(|| d.bytes as f64 / m.server_cpu_s / crate::metrics::MB);
    Ok((d.mb_s, cpu))
}

/// What a transport is, for the report (fails when it cannot run here: a transport that
/// was asked for never quietly disappears from the table).
pub(super) fn describe_transport(t: Transport, fio_bin: &Path) -> Result<String, BenchError> {
    match t {
        Transport::Inproc => Ok("in process: one thread calls the mapping directly, every read checked against the written pattern".into()),
        _ => {
            let v = fio::version(fio_bin).ok_or_else(|| {
                BenchError::Tool(format!("the nbd transport needs fio ({} does not run)", fio_bin.display()))
            })?;
            if !fio::has_engine(fio_bin, "nbd") {
                return Err(BenchError::Tool(format!("{v} has no nbd engine (fio --enghelp does not list it)")));
            }
            Ok(format!("{v} --ioengine=nbd (libnbd) against cryptblk's NbdServer on a Unix socket; fio crc32c headers written by the write jobs, checked on every read"))
        }
    }
}

/// The middle sample (the mean of the middle two for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}
