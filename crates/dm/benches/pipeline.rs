//! 4 KiB / 64 KiB / 1 MiB reads and writes on a RAM disk through `linear`, `crypt` inline
//! (`no_read_workqueue no_write_workqueue`) and `crypt` queued (kernel default), the
//! userspace version of the Cloudflare dm-crypt comparison. Reports numbers only.
//!
//! `cargo bench -p cryptblk-dm --bench pipeline`. `crypt-inline-split` is inline with requests
//! of at least `CRYPTBLK_BENCH_SPLIT` bytes (default 256 KiB) split across cores.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use cryptblk_dm::{BlockDevice, CryptTarget, Registry, SplitPolicy, WriteFlags};

const DISK: u64 = 256 << 20;
const KEY: &str = "2b7e151628aed2a6abf7158809cf4f3c2b7e151628aed2a6abf7158809cf4f3c\
                   000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// Writes real data over `len` bytes so every RAM chunk is allocated (write_zeroes would
/// free them and turn reads into memsets).
fn prefill(dev: &dyn BlockDevice, len: u64) {
    let chunk = vec![0xa5u8; 1 << 20];
    for off in (0..len).step_by(chunk.len()) {
        dev.write_at(off, &chunk, WriteFlags::default())
            .expect("prefill");
    }
}

fn bench(c: &mut Criterion) {
    let reg = Registry::new();
    let sectors = DISK / 512;
    let ram = format!("ram:{DISK}");
    let inline_table = format!(
        "0 {sectors} crypt aes-xts-plain64 {KEY} 0 {ram} 0 2 no_read_workqueue no_write_workqueue"
    );
    let setups = [
        ("linear", format!("0 {sectors} linear {ram} 0")),
        ("crypt-inline", inline_table.clone()),
        ("crypt-inline-split", inline_table),
        (
            "crypt-queued",
            format!("0 {sectors} crypt aes-xts-plain64 {KEY} 0 {ram} 0"),
        ),
    ];
    let split = std::env::var("CRYPTBLK_BENCH_SPLIT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(256 << 10);
    let mut devs = Vec::new();
    for (name, table) in &setups {
        let t = reg.load_table(table).expect("bench table");
        if *name == "crypt-inline-split" {
            if let Some(c) = t.entries()[0].target.as_any().downcast_ref::<CryptTarget>() {
                c.set_split_policy(SplitPolicy::Above(split));
            }
        }
        prefill(&t, DISK);
        devs.push((*name, t));
    }

    for size in [4096usize, 64 << 10, 1 << 20] {
        for op in ["read", "write"] {
            let mut group = c.benchmark_group(format!("{op}-{}k", size / 1024));
            group.throughput(Throughput::Bytes(size as u64));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(300));
            group.measurement_time(Duration::from_secs(2));
            for (name, dev) in &devs {
                let mut buf = vec![0x5au8; size];
                let slots = DISK / size as u64;
                let mut i = 0u64;
                group.bench_function(BenchmarkId::from_parameter(name), |b| {
                    b.iter(|| {
                        // Stride through the disk so no request hits a hot cache line set.
                        i = (i + 7919) % slots;
                        let off = i * size as u64;
                        if op == "read" {
                            dev.read_at(off, &mut buf).expect("read");
                        } else {
                            dev.write_at(off, &buf, WriteFlags::default())
                                .expect("write");
                        }
                        black_box(&buf);
                    })
                });
            }
            group.finish();
        }
    }
}

/// 4 KiB random reads/writes from 4 threads at once: where the queued model's hand-offs
/// and the inline model's lack of them matter most (the Cloudflare fio setup).
fn bench_concurrent(c: &mut Criterion) {
    const THREADS: u64 = 4;
    const SIZE: usize = 4096;
    let reg = Registry::new();
    let sectors = DISK / 512;
    let ram = format!("ram:{DISK}");
    let setups = [
        ("linear", format!("0 {sectors} linear {ram} 0")),
        (
            "crypt-inline",
            format!("0 {sectors} crypt aes-xts-plain64 {KEY} 0 {ram} 0 2 no_read_workqueue no_write_workqueue"),
        ),
        ("crypt-queued", format!("0 {sectors} crypt aes-xts-plain64 {KEY} 0 {ram} 0")),
    ];
    for op in ["read", "write"] {
        let mut group = c.benchmark_group(format!("{op}-4k-{THREADS}threads"));
        group.throughput(Throughput::Bytes(SIZE as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(2));
        for (name, table) in &setups {
            let dev: Arc<dyn BlockDevice> = Arc::new(reg.load_table(table).expect("bench table"));
            prefill(dev.as_ref(), 64 << 20);
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    let per_thread = iters.div_ceil(THREADS);
                    let start = Instant::now();
                    let handles: Vec<_> = (0..THREADS)
                        .map(|t| {
                            let dev = dev.clone();
                            std::thread::spawn(move || {
                                let mut buf = vec![0x5au8; SIZE];
                                let slots = (64 << 20) / SIZE as u64;
                                let mut i = t * 1009;
                                for _ in 0..per_thread {
                                    i = (i + 7919) % slots;
                                    let off = i * SIZE as u64;
                                    if op == "read" {
                                        dev.read_at(off, &mut buf).expect("read");
                                    } else {
                                        dev.write_at(off, &buf, WriteFlags::default())
                                            .expect("write");
                                    }
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.join().expect("bench thread");
                    }
                    // Criterion divides by `iters`; report the wall time of exactly that
                    // many requests so its throughput is the aggregate of all threads.
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_thread * THREADS) as f64)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench, bench_concurrent);
criterion_main!(benches);
