//! Crash consistency of the `integrity` target in journal (J) and bitmap (B) modes: a
//! deterministic mixed
//! workload (multi-block writes, FUA writes, flushes) runs over a disk that stops
//! accepting writes after the Nth one — optionally tearing that write halfway — for every
//! N up to the workload's total. After each cut the device is reopened (replaying the
//! journal) and every block must read without a tag failure and hold either its last
//! flushed content or content written after that flush. No acknowledged, flushed write may
//! be lost.

mod common;

use common::{CrashDisk, MemDisk};
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, WriteFlags};
use std::sync::atomic::Ordering;

const DISK: usize = 2 << 20;
const BLOCKS: usize = 192;

#[derive(Clone, Copy)]
enum Op {
    Write {
        block: usize,
        count: usize,
        seed: u64,
        fua: bool,
    },
    Flush,
}

fn workload(bs: usize) -> Vec<Op> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let max = if bs == 512 { 40 } else { 6 };
    (0..70)
        .map(|i| {
            let r = next();
            if r % 6 == 0 {
                Op::Flush
            } else {
                let count = 1 + (next() % max) as usize;
                let block = (next() as usize) % (BLOCKS - count);
                Op::Write {
                    block,
                    count,
                    seed: i as u64 * 1000 + 1,
                    fua: r % 11 == 0,
                }
            }
        })
        .collect()
}

fn block_content(seed: u64, k: usize, bs: usize) -> Vec<u8> {
    let mut v = vec![0u8; bs];
    for (i, c) in v.chunks_mut(8).enumerate() {
        c.copy_from_slice(
            &(seed.wrapping_mul(0x1000_0001) ^ ((k as u64) << 20) ^ i as u64).to_le_bytes(),
        );
    }
    v
}

/// Allowed contents of each block: the last durable one plus everything written since.
struct Model {
    durable: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
}

struct Outcome {
    crash_points: u64,
    lost: u64,
    tag_failures: u64,
}

fn run(bs: usize, torn: bool, mode: IntegrityMode) -> Outcome {
    let c = IntegrityConfig {
        block_size: bs as u32,
        journal_sectors: Some(if bs == 512 { 800 } else { 1600 }),
        ..IntegrityConfig::new(mode, "crc32c")
    };
    // Formatted, wiped, filled with a baseline and cleanly closed: the snapshot every
    // crash run starts from.
    let base = MemDisk::new(DISK as u64);
    IntegrityTarget::format(base.clone(), "base", None, c.clone(), true).unwrap();
    let t = IntegrityTarget::open(base.clone(), "base", None, c.clone(), None).unwrap();
    let baseline: Vec<Vec<u8>> = (0..BLOCKS).map(|k| block_content(7, k, bs)).collect();
    t.write_at(0, &baseline.concat(), WriteFlags::default())
        .unwrap();
    t.close().unwrap();
    drop(t);
    let snapshot = base.image();
    let ops = workload(bs);

    let mut total_writes = None;
    let mut outcome = Outcome {
        crash_points: 0,
        lost: 0,
        tag_failures: 0,
    };
    let mut n = 0i64;
    loop {
        let inner = MemDisk::from_image(snapshot.clone());
        let budget = if total_writes.is_none() { i64::MAX } else { n };
        let disk = CrashDisk::new(inner.clone(), budget, torn);
        let mut model = Model {
            durable: baseline.clone(),
            since: vec![Vec::new(); BLOCKS],
        };
        // Opening writes too (superblock, bitmap): a cut there is a crash before any I/O.
        let opened = IntegrityTarget::open(disk.clone(), "crash", None, c.clone(), None);
        let t = match opened {
            Ok(t) => t,
            Err(e) => {
                assert!(total_writes.is_some(), "open failed without a cut: {e}");
                IntegrityTarget::open(inner.clone(), "after-cut", None, c.clone(), None).unwrap()
            }
        };
        let ops_to_run: &[Op] = if disk.budget.load(Ordering::SeqCst) < 0 {
            &[]
        } else {
            &ops
        };
        for op in ops_to_run {
            let r = match *op {
                Op::Write {
                    block,
                    count,
                    seed,
                    fua,
                } => {
                    let data: Vec<Vec<u8>> = (0..count)
                        .map(|k| block_content(seed, block + k, bs))
                        .collect();
                    for (k, d) in data.iter().enumerate() {
                        model.since[block + k].push(d.clone());
                    }
                    let r = t.write_at((block * bs) as u64, &data.concat(), WriteFlags { fua });
                    if r.is_ok() && fua {
                        for (k, d) in data.into_iter().enumerate() {
                            model.durable[block + k] = d;
                            model.since[block + k].clear();
                        }
                    }
                    r
                }
                Op::Flush => {
                    let r = t.flush();
                    if r.is_ok() {
                        for b in 0..BLOCKS {
                            if let Some(last) = model.since[b].pop() {
                                model.durable[b] = last;
                                model.since[b].clear();
                            }
                        }
                    }
                    r
                }
            };
            if r.is_err() {
                break;
            }
        }
        if total_writes.is_none() {
            // A clean run first: everything must be there, and it tells how many writes
            // the workload issues.
            t.flush().unwrap();
            total_writes = Some(disk.writes.load(Ordering::SeqCst) as i64);
        }
        drop(t);

        // "Reboot": reopen on what reached the disk; replay runs here.
        let t = IntegrityTarget::open(inner.clone(), "reboot", None, c.clone(), None).unwrap();
        let mut buf = vec![0u8; bs];
        for b in 0..BLOCKS {
            match t.read_at((b * bs) as u64, &mut buf) {
                Err(_) => outcome.tag_failures += 1,
                Ok(()) => {
                    if buf != model.durable[b] && !model.since[b].contains(&buf) {
                        outcome.lost += 1;
                    }
                }
            }
        }
        if budget != i64::MAX {
            outcome.crash_points += 1;
        }
        n += 1;
        if n > total_writes.unwrap() {
            break;
        }
    }
    outcome
}

fn check(bs: usize, torn: bool, mode: IntegrityMode) {
    let o = run(bs, torn, mode);
    println!(
        "integrity {mode:?} mode, {bs}-byte blocks, {} cut: {} crash points, {} blocks lost, {} tag failures",
        if torn { "torn" } else { "clean" },
        o.crash_points,
        o.lost,
        o.tag_failures
    );
    assert!(
        o.crash_points > 50,
        "workload too small: {} crash points",
        o.crash_points
    );
    assert_eq!(o.lost, 0, "flushed data lost or garbage returned");
    assert_eq!(o.tag_failures, 0, "blocks failed their tags after replay");
}

#[test]
fn crash_at_every_write_512() {
    check(512, false, IntegrityMode::Journal);
}

#[test]
fn torn_write_at_every_point_512() {
    check(512, true, IntegrityMode::Journal);
}

#[test]
fn torn_write_at_every_point_4096() {
    check(4096, true, IntegrityMode::Journal);
}

/// Bitmap mode: writes go in place, so a torn 512-byte-block write may leave a block old or
/// new; after the crash the dirty regions' tags are recalculated, so nothing fails its tag.
#[test]
fn bitmap_mode_torn_write_at_every_point_512() {
    check(512, true, IntegrityMode::Bitmap);
}
