//! The dm-integrity / dm-verity overhead experiment: the shape of the Raspberry Pi 4
//! measurement in the reference documents (fio 4 KiB sequential and random writes and
//! reads on a plain device, dm-integrity, dm-verity and dm-crypt over dm-integrity with
//! hmac-sha256, each figure with its overhead against plain), run in process on RAM disks.
//!
//! Configurations ([`IntegrityBenchConfig::builtin`]):
//! - `plain`: `linear` over the RAM disk;
//! - `int-crc32c-j`, `int-crc32c-b`, `int-crc32c-d`: the `integrity` target with the
//!   integritysetup default hash in journal, bitmap and direct mode;
//! - `int-hmac-sha256-j`: keyed tags (`internal_hash:hmac(sha256):<key>`), journal mode;
//! - `crypt-int-hmac-sha256`: what `cryptsetup luksFormat --cipher aes-xts-plain64
//!   --integrity hmac-sha256` activates on an image file or a 4K device: an `integrity`
//!   target with 32-byte external tags and 4096-byte blocks, and above it `crypt
//!   capi:authenc(hmac(sha256),xts(aes))-plain64 ... integrity:32:aead sector_size:4096`
//!   (cryptsetup 2.4+ picks 4096-byte sectors there, `--integrity` or not);
//!   `crypt-int-hmac-sha256-512` the same on a 512-byte device (one MAC per 512 bytes,
//!   eight per 4 KiB request). Either is skipped, with the loader's message, while
//!   crates/dm cannot load its tables;
//! - `verity`: a `verity` target over a data RAM disk whose sha256 tree cryptblk built
//!   (read workloads only, as the reference's dm-verity column); `verity-once` the same
//!   with `check_at_most_once`.
//!
//! Transports ([`select_transports`]): `inproc` (default) drives the mapping in process over
//! `[0, region)`, every read checked against the engine's pattern; `nbd` serves the mapping
//! with cryptblk's NBD server on a Unix socket and drives `[region, 2 * region)` with fio's
//! `nbd` engine, as a block-device client would see it: that region is first written once
//! with fio's crc32c headers, write jobs write headers too (not read back, so the write
//! figures hold writes only) and read jobs check the header of every block they read. Either
//! way a configuration that returned wrong data fails instead of reporting a speed.
//!
//! The parts, in the order [`run`] uses them:
//! - `configs`: the named configurations and the four workloads (what is measured);
//! - `stack`: one configuration's dm tables loaded over its own RAM disks, prefilled, and
//!   for the `nbd` transport served over NBD (what the workloads drive);
//! - `measure`: the measuring rounds over both transports (in-process engine, fio over NBD)
//!   and the medians;
//! - `render`: the report, its JSON shape, its markdown tables and the aims.
//!
//! This file holds the public entry: the options, the transport selection and [`run`].

mod bound;
mod configs;
mod measure;
mod render;
mod stack;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cryptblk_dm::Registry;

use crate::{BenchError, Transport};

pub use bound::AeadBound;
pub use configs::{workloads, IntegrityBenchConfig, IntegrityKind};
pub use render::{IntegrityCell, IntegrityReport, AIMS, BOUND_AIM};
pub use stack::{IntegrityStack, NbdSetup};

/// The transports the integrity report runs over.
pub const TRANSPORTS: [Transport; 2] = [Transport::Inproc, Transport::Nbd];

/// The transports named by `--transport` filters, in [`TRANSPORTS`] order; none named:
/// `inproc` only. `loop` (FUSE + loop device) is refused: the report runs in process or
/// over NBD.
pub fn select_transports(names: &[String]) -> Result<Vec<Transport>, BenchError> {
    if names.is_empty() {
        return Ok(vec![Transport::Inproc]);
    }
    let mut out = Vec::new();
    for n in names {
        match TRANSPORTS.iter().find(|t| t.name() == n.as_str()) {
            Some(t) => {
                if !out.contains(t) {
                    out.push(*t);
                }
            }
            None => {
                return Err(BenchError::UnknownName {
                    what: "integrity report transport".into(),
                    name: n.clone(),
                    known: TRANSPORTS.map(Transport::name).join(", "),
                })
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Options of the integrity experiment.
#[derive(Clone, Debug)]
pub struct IntegrityBenchOptions {
    /// Seconds per run.
    pub runtime: Duration,
    /// Repeats per cell (alternating configurations); medians are reported.
    pub repeats: u32,
    /// RAM disk size per configuration.
    pub device_size: u64,
    /// Bytes the workloads cover (a non-zero multiple of 4 KiB, at most half the device
    /// size: the `nbd` transport drives `[region, 2 * region)`).
    pub region: u64,
    /// Configuration filters (`--config`; empty: all).
    pub configs: Vec<String>,
    /// Workload filters (`--workload`; empty: all four).
    pub workloads: Vec<String>,
    /// Transports, from [`select_transports`] (empty: inproc).
    pub transports: Vec<Transport>,
    /// The fio program of the NBD transport.
    pub fio: PathBuf,
    /// Directory for sockets and fio output (default: a temporary directory).
    pub work_dir: Option<PathBuf>,
}

impl Default for IntegrityBenchOptions {
    fn default() -> Self {
        IntegrityBenchOptions {
            runtime: Duration::from_secs(2),
            repeats: 3,
            device_size: 1 << 30,
            region: 256 << 20,
            configs: Vec::new(),
            workloads: Vec::new(),
            transports: vec![Transport::Inproc],
            fio: PathBuf::from("fio"),
            work_dir: None,
        }
    }
}

/// Runs the experiment: per workload and transport, `repeats` rounds over every
/// configuration in order.
pub fn run(opts: &IntegrityBenchOptions) -> Result<IntegrityReport, BenchError> {
    if opts.region % 4096 != 0 || opts.region == 0 || opts.region > opts.device_size / 2 {
        return Err(BenchError::Options(format!(
            "region {} must be a non-zero multiple of 4096 and at most half the device size {}",
            opts.region, opts.device_size
        )));
    }
    let load_start = crate::runner::load_avg();
    let mut transports = opts.transports.clone();
    if transports.is_empty() {
        transports.push(Transport::Inproc);
    }
    let mut described = Vec::new();
    for t in &transports {
        described.push((
            t.name().to_string(),
            measure::describe_transport(*t, &opts.fio)?,
        ));
    }
    let all = IntegrityBenchConfig::builtin();
    let mut chosen = crate::config::select("configuration", &all, |c| &c.name, &opts.configs)?;
    if !chosen.iter().any(|c| c.name == "plain") {
        chosen.insert(0, all[0].clone());
    }
    let workloads = crate::config::select("workload", &workloads(), |w| &w.name, &opts.workloads)?;
    let (_tmp, work) = crate::runner::work_dir_at(opts.work_dir.as_deref())?;
    let setup = NbdSetup {
        fio: &opts.fio,
        dir: &work,
    };
    let nbd = transports.contains(&Transport::Nbd).then_some(&setup);
    let registry = Arc::new(Registry::new());
    let mut stacks = Vec::new();
    let mut skipped = Vec::new();
    for c in &chosen {
        match IntegrityStack::create(&registry, c, opts.device_size, opts.region, nbd)? {
            Ok(s) => stacks.push(s),
            Err(why) => {
                eprintln!("{}: skipped: {why}", c.name);
                skipped.push((c.name.clone(), why));
            }
        }
    }
    let cells = measure::cells(&stacks, &workloads, &transports, opts, &work)?;
    // Measured right after the table, in the same run, when the configuration it bounds ran.
    let bound = if stacks.iter().any(|s| s.config.name == BOUND_AIM.0) {
        Some(bound::measure(
            opts.runtime.min(Duration::from_secs(1)) / 5,
        )?)
    } else {
        None
    };
    Ok(IntegrityReport {
        configs: stacks.iter().map(|s| s.config.clone()).collect(),
        tables: stacks
            .iter()
            .map(|s| (s.config.name.clone(), s.tables.clone()))
            .collect(),
        skipped,
        workloads,
        cells,
        runtime_s: opts.runtime.as_secs_f64(),
        repeats: opts.repeats.max(1),
        region: opts.region,
        transports: described,
        load_avg: (load_start, crate::runner::load_avg()),
        bound,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_are_selected_in_table_order() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(select_transports(&[]).unwrap(), vec![Transport::Inproc]);
        assert_eq!(
            select_transports(&names(&["nbd"])).unwrap(),
            vec![Transport::Nbd]
        );
        assert_eq!(
            select_transports(&names(&["nbd", "inproc", "nbd"])).unwrap(),
            vec![Transport::Inproc, Transport::Nbd]
        );
        for bad in ["loop", "fuse", ""] {
            match select_transports(&names(&[bad])) {
                Err(BenchError::UnknownName { name, known, .. }) => {
                    assert_eq!(name, bad);
                    assert_eq!(known, "inproc, nbd");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
