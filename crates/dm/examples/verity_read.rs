//! Thread-CPU time per read of the `verity` target over a RAM disk, next to the same reads
//! from the plain RAM disk and a bare SHA-256 loop (the floor a verified read cannot go
//! below: `sha256` hashes one buffer over and over, `plain+sha256` reads and then hashes
//! what it read). CPU time, not wall time, and medians over rounds, so a busy machine perturbs it
//! less. `cargo run --release -p cryptblk-dm --example verity_read [rounds]`.
//!
//! The tree is built by `cryptblk_format::verity::format` with veritysetup's defaults
//! (format 1, sha256, 4 KiB blocks, 32-byte salt); the first verified pass over the whole
//! disk proves it matches what the target expects.

#[path = "common/mod.rs"]
mod common;

use std::io;
use std::sync::Arc;

use common::cpu_ns;
use cryptblk_dm::backing::RamDisk;
use cryptblk_dm::device::{BlockDevice, WriteFlags};
use cryptblk_dm::targets::verity::{CorruptionMode, VerityConfig, VerityTarget};
use cryptblk_format::hdrio::HeaderIo;
use cryptblk_format::verity::{format, VerityParams};
use sha2::Digest;

const DISK: u64 = 256 << 20;
const BLOCK: usize = 4096;
/// Reads per round; a round's mean is one sample.
const READS: usize = 4096;

/// [`HeaderIo`] over a block device, so `format` can write the tree onto a RAM disk.
struct DeviceIo(Arc<dyn BlockDevice>);

impl HeaderIo for DeviceIo {
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.size())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_at(offset, buf, WriteFlags::default())
    }
    fn sync(&self) -> io::Result<()> {
        self.0.flush()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// SHA-256(salt || block) of every block in `buf`, folded to one byte so the work cannot
/// be optimised away.
fn hash_blocks(salt: &[u8], buf: &[u8]) -> u8 {
    let mut acc = 0u8;
    for block in buf.chunks_exact(BLOCK) {
        let mut h = sha2::Sha256::new();
        h.update(salt);
        h.update(block);
        acc ^= h.finalize()[0];
    }
    acc
}

/// xorshift64: offsets and fill data without a dependency.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Request offsets of one round.
fn offsets(random: bool, size: usize, round: usize, seed: &mut u64) -> Vec<u64> {
    let slots = DISK / size as u64;
    (0..READS)
        .map(|i| {
            let slot = if random {
                next(seed) % slots
            } else {
                // Walk on through the disk from round to round, so data comes from memory
                // rather than the CPU cache, as it would on a real RAM disk.
                (round * READS + i) as u64 % slots
            };
            slot * size as u64
        })
        .collect()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("rounds must be a number"))
        .unwrap_or(15);
    let data: Arc<dyn BlockDevice> = Arc::new(RamDisk::new(DISK).unwrap());
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut fill = vec![0u8; 1 << 20];
    for off in (0..DISK).step_by(fill.len()) {
        for w in fill.chunks_exact_mut(8) {
            w.copy_from_slice(&next(&mut seed).to_le_bytes());
        }
        data.write_at(off, &fill, WriteFlags::default()).unwrap();
    }
    let blocks = DISK / BLOCK as u64;
    let mut p = VerityParams::defaults(blocks);
    p.uuid = Some([7; 16]);
    let g = p.geometry().unwrap();
    let hash: Arc<dyn BlockDevice> =
        Arc::new(RamDisk::new(g.hash_device_end().next_multiple_of(512)).unwrap());
    let done = format(&DeviceIo(data.clone()), &DeviceIo(hash.clone()), &p).unwrap();
    let cfg = |once: bool| VerityConfig {
        version: 1,
        data_block_size: BLOCK as u32,
        hash_block_size: BLOCK as u32,
        num_data_blocks: blocks,
        hash_start_block: g.hash_start_block,
        algorithm: p.algorithm,
        root_digest: done.root_hash.clone(),
        salt: p.salt.clone(),
        mode: CorruptionMode::Eio,
        restart_on_error: false,
        ignore_zero_blocks: false,
        check_at_most_once: once,
    };
    let verity =
        VerityTarget::new(data.clone(), "data", hash.clone(), "hash", cfg(false), DISK).unwrap();
    let once =
        VerityTarget::new(data.clone(), "data", hash.clone(), "hash", cfg(true), DISK).unwrap();
    // One verified pass over everything: the tree is right, and the `once` bitmap and both
    // hash-block caches start warm, as in a long-running export.
    let mut big = vec![0u8; 1 << 20];
    for off in (0..DISK).step_by(big.len()) {
        verity.read_at(off, &mut big).unwrap();
        once.read_at(off, &mut big).unwrap();
    }
    assert_eq!(verity.corrupted_blocks(), 0);

    let devices: [(&str, &dyn BlockDevice); 3] = [
        ("plain", data.as_ref()),
        ("verity", &verity),
        ("verity once", &once),
    ];
    println!(
        "{} MiB ram: disk, verity sha256 4 KiB blocks, {} levels; {rounds} rounds of {READS} \
         reads; thread CPU µs per read, median of rounds",
        DISK >> 20,
        verity.levels()
    );
    println!(
        "{:<10} {:>8} {:>8} {:>8} {:>8} {:>12}",
        "request", "plain", "verity", "once", "sha256", "plain+sha256"
    );
    let salt = p.salt.clone();
    for (name, size, random) in [
        ("4k seq", BLOCK, false),
        ("4k rand", BLOCK, true),
        ("64k seq", 16 * BLOCK, false),
    ] {
        let mut buf = vec![0u8; size];
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); devices.len() + 2];
        for round in 0..rounds {
            let offs = offsets(random, size, round, &mut seed);
            for (d, (_, dev)) in devices.iter().enumerate() {
                let t0 = cpu_ns();
                for &off in &offs {
                    dev.read_at(off, &mut buf).unwrap();
                }
                samples[d].push((cpu_ns() - t0) as f64 / READS as f64 / 1e3);
            }
            // The floor: hashing salt || block for every block of the request, nothing else.
            let t0 = cpu_ns();
            let mut acc = 0u8;
            for _ in &offs {
                acc ^= hash_blocks(&salt, &buf);
            }
            std::hint::black_box(acc);
            samples[devices.len()].push((cpu_ns() - t0) as f64 / READS as f64 / 1e3);
            // What a verified read cannot beat: the plain read, then hashing what it read.
            let t0 = cpu_ns();
            for &off in &offs {
                data.read_at(off, &mut buf).unwrap();
                acc ^= hash_blocks(&salt, &buf);
            }
            std::hint::black_box(acc);
            samples[devices.len() + 1].push((cpu_ns() - t0) as f64 / READS as f64 / 1e3);
        }
        let m: Vec<f64> = samples.into_iter().map(median).collect();
        println!(
            "{name:<10} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>12.2}",
            m[0], m[1], m[2], m[3], m[4]
        );
    }
}
