//! Inline and queued crypt pipelines: same bytes, and live switching between them.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{Rng, KEY64};
use cryptblk_dm::{BlockDevice, CryptTarget, Mapping, Registry, WriteFlags};

const THREADS: u64 = 4;
/// Each thread owns one region (so the final state is independent of interleaving).
const REGION: u64 = 2 << 20;

fn crypt_table(dev: &str, flags: &[&str]) -> String {
    let sectors = THREADS * REGION / 512;
    let opts = if flags.is_empty() {
        String::new()
    } else {
        format!(" {} {}", flags.len(), flags.join(" "))
    };
    format!("0 {sectors} crypt aes-xts-plain64 {KEY64} 5 {dev} 8{opts}")
}

/// Random mixed reads/writes (4 KiB..256 KiB, some with scratch buffers, some flushes) in
/// thread `t`'s region; returns the region's expected plaintext.
fn workload(dev: &dyn BlockDevice, t: u64, ops: usize, verify: bool) -> (Vec<u8>, u64) {
    let mut rng = Rng::new(t + 1);
    let base = t * REGION;
    let mut model = vec![0u8; REGION as usize];
    let mut mismatches = 0;
    for _ in 0..ops {
        let blocks = 1 + rng.below(64);
        let len = (blocks * 4096) as usize;
        let off = rng.below(REGION / 4096 - blocks + 1) * 4096;
        match rng.below(10) {
            0..=4 => {
                let mut data = vec![0u8; len];
                rng.fill(&mut data);
                model[off as usize..off as usize + len].copy_from_slice(&data);
                if rng.below(2) == 0 {
                    dev.write_at(base + off, &data, WriteFlags::default())
                        .unwrap();
                } else {
                    dev.write_at_scratch(base + off, &mut data, WriteFlags { fua: true })
                        .unwrap();
                }
            }
            5 => dev.flush().unwrap(),
            _ => {
                let mut buf = vec![0u8; len];
                dev.read_at(base + off, &mut buf).unwrap();
                if verify && buf[..] != model[off as usize..off as usize + len] {
                    mismatches += 1;
                }
            }
        }
    }
    (model, mismatches)
}

fn run_threads(dev: Arc<dyn BlockDevice>, ops: usize) -> u64 {
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || workload(dev.as_ref(), t, ops, true).1)
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn raw_bytes(reg: &Registry, name: &str) -> Vec<u8> {
    let raw = reg.lookup(name).unwrap();
    let mut out = vec![0u8; raw.size() as usize];
    raw.read_at(0, &mut out).unwrap();
    out
}

#[test]
fn inline_and_queued_write_identical_ciphertext() {
    let reg = Registry::new();
    let size = THREADS * REGION + 8 * 512;
    let sectors = size / 512;
    reg.create("raw-inline", &format!("0 {sectors} linear ram:{size}#i 0"))
        .unwrap();
    reg.create("raw-queued", &format!("0 {sectors} linear ram:{size}#q 0"))
        .unwrap();
    reg.create("raw-sorted", &format!("0 {sectors} linear ram:{size}#s 0"))
        .unwrap();
    let configs: [(&str, &str, &[&str]); 3] = [
        (
            "inline",
            "raw-inline",
            &["no_read_workqueue", "no_write_workqueue"],
        ),
        (
            "queued",
            "raw-queued",
            &["same_cpu_crypt", "submit_from_crypt_cpus"],
        ),
        ("sorted", "raw-sorted", &[]),
    ];
    for (name, raw, flags) in configs {
        let m = reg.create(name, &crypt_table(raw, flags)).unwrap();
        // Unwritten sectors decrypt to noise; start from known plaintext (encrypted zeros).
        m.write_zeroes(0, m.size()).unwrap();
        assert_eq!(run_threads(m, 150), 0, "{name}: read-back mismatch");
    }
    // The pipelines really differ: check the status says so.
    let status = reg.get("sorted").unwrap().status();
    assert!(
        status.contains("read_pipeline=queued write_pipeline=queued-sorted"),
        "{status}"
    );
    let status = reg.get("inline").unwrap().status();
    assert!(
        status.contains("read_pipeline=inline write_pipeline=inline"),
        "{status}"
    );
    assert!(
        status.contains("reads=") && !status.contains("reads=0 "),
        "{status}"
    );

    let a = raw_bytes(&reg, "raw-inline");
    let b = raw_bytes(&reg, "raw-queued");
    let c = raw_bytes(&reg, "raw-sorted");
    assert!(
        a == b,
        "inline and queued(submit_from_crypt_cpus) ciphertext differ"
    );
    assert!(a == c, "inline and queued(sorted writer) ciphertext differ");
    // And the plaintext is what every thread's model says.
    let m = reg.get("sorted").unwrap();
    for t in 0..THREADS {
        let (model, _) = workload(&NullDev, t, 150, false);
        let mut buf = vec![0u8; REGION as usize];
        m.read_at(t * REGION, &mut buf).unwrap();
        assert!(buf == model, "thread {t} region differs from its model");
    }
}

/// Replays a workload's model without doing I/O.
struct NullDev;
impl BlockDevice for NullDev {
    fn size(&self) -> u64 {
        THREADS * REGION
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn write_at(&self, _: u64, _: &[u8], _: WriteFlags) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn reload_flips_pipelines_under_load_without_errors() {
    let reg = Registry::new();
    let size = THREADS * REGION + 8 * 512;
    let inline = crypt_table(
        &format!("ram:{size}"),
        &["no_read_workqueue", "no_write_workqueue"],
    );
    let queued = crypt_table(&format!("ram:{size}"), &[]);
    let same_cpu = crypt_table(
        &format!("ram:{size}"),
        &["same_cpu_crypt", "no_write_workqueue"],
    );
    let m: Arc<Mapping> = reg.create("live", &queued).unwrap();
    m.write_zeroes(0, m.size()).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mismatches = Arc::new(AtomicU64::new(0));
    let ops_done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (m, stop, errors, mismatches, ops_done) = (
                m.clone(),
                stop.clone(),
                errors.clone(),
                mismatches.clone(),
                ops_done.clone(),
            );
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                let base = t * REGION;
                let mut model = vec![0u8; REGION as usize];
                while !stop.load(Ordering::Relaxed) {
                    let blocks = 1 + rng.below(16);
                    let len = (blocks * 4096) as usize;
                    let off = (rng.below(REGION / 4096 - blocks + 1) * 4096) as usize;
                    if rng.below(2) == 0 {
                        let mut data = vec![0u8; len];
                        rng.fill(&mut data);
                        model[off..off + len].copy_from_slice(&data);
                        if m.write_at(base + off as u64, &data, WriteFlags::default())
                            .is_err()
                        {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        let mut buf = vec![0u8; len];
                        match m.read_at(base + off as u64, &mut buf) {
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(()) if buf[..] != model[off..off + len] => {
                                mismatches.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(()) => {}
                        }
                    }
                    ops_done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();

    let mut swaps = 0;
    let tables = [&inline, &queued, &same_cpu];
    for round in 0..30 {
        // Every swap happens under load: the workers have done I/O since the last one.
        let before = ops_done.load(Ordering::Relaxed);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while ops_done.load(Ordering::Relaxed) < before + 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "no I/O between swaps {round} and {}",
                round + 1
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let next = tables[round % tables.len()];
        // The dmsetup sequence: reload (staged, I/O continues), suspend (drain), resume.
        reg.reload("live", next).unwrap();
        assert!(m.info().inactive_table);
        m.suspend().unwrap();
        assert_eq!(m.info().inflight, 0, "suspend returned with I/O in flight");
        assert!(m.resume().unwrap());
        swaps += 1;
        let shown = m.table(true);
        assert_eq!(shown.trim(), next.trim());
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(swaps, 30);
    assert!(
        ops_done.load(Ordering::Relaxed) > 100,
        "workload did not run"
    );
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "I/O failed during table swaps"
    );
    assert_eq!(
        mismatches.load(Ordering::Relaxed),
        0,
        "data mismatch across table swaps"
    );
}

#[test]
fn suspend_blocks_new_io_until_resume() {
    let reg = Registry::new();
    let m = reg.create("s", "0 64 linear ram:64K 0").unwrap();
    m.suspend().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let h = {
        let (m, done) = (m.clone(), done.clone());
        std::thread::spawn(move || {
            m.write_at(0, &[3u8; 512], WriteFlags::default()).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    // The write is held by the suspend (counted as held), not run and not lost.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while m.info().held == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the write was never held"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!done.load(Ordering::SeqCst), "I/O ran while suspended");
    assert!(m.info().suspended);
    assert!(
        !m.resume().unwrap(),
        "no staged table, nothing should change"
    );
    h.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn crypt_counters_and_refresh_keep_data() {
    let reg = Registry::new();
    let t1 = format!("0 2048 crypt aes-xts-plain64 {KEY64} 0 ram:1M 0");
    let m = reg.create("c", &t1).unwrap();
    m.write_at(0, &[5u8; 8192], WriteFlags::default()).unwrap();
    let mut b = vec![0u8; 4096];
    m.read_at(4096, &mut b).unwrap();
    m.with_table(|t| {
        let c = t.entries()[0]
            .target
            .as_any()
            .downcast_ref::<CryptTarget>()
            .unwrap();
        let s = c.stats();
        assert_eq!(
            (s.reads, s.writes, s.read_bytes, s.write_bytes),
            (1, 1, 4096, 8192)
        );
        assert_eq!(c.read_pipeline(), "queued");
    });
    // refresh = reload with the same key and new flags.
    let t2 = format!("{t1} 2 no_read_workqueue no_write_workqueue");
    reg.replace_table("c", &t2).unwrap();
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, vec![5u8; 4096]);
    assert!(m.status().contains("read_pipeline=inline"));
}

#[test]
fn split_across_cores_gives_identical_bytes() {
    use cryptblk_dm::SplitPolicy;
    let reg = Registry::new();
    let size: u64 = 8 << 20;
    let sectors = size / 512;
    reg.create("raw-plain", &format!("0 {sectors} linear ram:{size}#p 0"))
        .unwrap();
    reg.create("raw-split", &format!("0 {sectors} linear ram:{size}#s 0"))
        .unwrap();
    let inline = "2 no_read_workqueue no_write_workqueue";
    let plain = reg
        .create(
            "plain",
            &format!("0 {sectors} crypt aes-xts-plain64 {KEY64} 3 raw-plain 0 {inline}"),
        )
        .unwrap();
    let split = reg
        .create(
            "split",
            &format!("0 {sectors} crypt aes-xts-plain64 {KEY64} 3 raw-split 0 {inline}"),
        )
        .unwrap();
    split.with_table(|t| {
        let c = t.entries()[0]
            .target
            .as_any()
            .downcast_ref::<CryptTarget>()
            .unwrap();
        c.set_split_policy(SplitPolicy::Above(8192));
    });
    assert!(
        split.status().contains("cpu_split=>=8192"),
        "{}",
        split.status()
    );
    // Three threads at once, so some requests find the helper pool busy and run unsplit.
    let handles: Vec<_> = (0..3u64)
        .map(|t| {
            let (plain, split) = (plain.clone(), split.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(40 + t);
                let region = size / 3 / 4096 * 4096;
                for _ in 0..40 {
                    // Odd sector counts too: the last piece is not a whole 4 KiB block.
                    let len = (1 + rng.below(600)) as usize * 512;
                    let off = t * region + rng.below((region - len as u64) / 512) * 512;
                    let mut data = vec![0u8; len];
                    rng.fill(&mut data);
                    plain.write_at(off, &data, WriteFlags::default()).unwrap();
                    let mut scratch = data.clone();
                    split
                        .write_at_scratch(off, &mut scratch, WriteFlags::default())
                        .unwrap();
                    let mut back = vec![0u8; len];
                    split.read_at(off, &mut back).unwrap();
                    assert!(back == data, "split read-back differs");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(
        raw_bytes(&reg, "raw-plain") == raw_bytes(&reg, "raw-split"),
        "ciphertext differs"
    );
}
