//! Tag passing between dm-crypt (`integrity:<n>:aead`) and dm-integrity without an internal
//! hash, inside cryptblk: the tagged-I/O contract of the integrity target in J/D/B modes,
//! pass-through by `linear` and mappings, the crypt target's checks of the device below,
//! and crash atomicity — a crash at any write (torn in half) of a workload through
//! crypt+integrity in journal mode must never leave a block whose data and tag disagree
//! (which would read as EILSEQ) nor lose a flushed write. (`D` mode fails this check, as it
//! should: it writes data and tags separately; `B` mode cannot recompute caller tags after
//! a crash, in the kernel neither.)
//! The kernel compatibility of the same paths is in aead_kernel.rs.

mod common;

use common::{CrashDisk, MemDisk};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::crypt::{CryptIntegrity, IntegrityKind};
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, CryptFlags, CryptParams, CryptTarget, Registry, WriteFlags};
use std::sync::Arc;

const TUPLE: u32 = 28;
const GCM_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn ext_config(mode: IntegrityMode, bs: u32) -> IntegrityConfig {
    IntegrityConfig {
        tag_size: Some(TUPLE),
        internal_hash: None,
        block_size: bs,
        journal_sectors: Some(64),
        ..IntegrityConfig::new(mode, "crc32c")
    }
}

fn new_disk() -> Arc<MemDisk> {
    MemDisk::new(2 << 20)
}

fn crypt_over(dev: Arc<dyn BlockDevice>, bs: u32) -> CryptTarget {
    let params = CryptParams {
        cipher_spec: "capi:gcm(aes)-random".into(),
        key: SecretBytes::from_vec(hex::decode(GCM_KEY).unwrap()),
        iv_offset: 0,
        dev_spec: "int".into(),
        offset_sectors: 0,
        flags: CryptFlags {
            sector_size: bs,
            integrity: Some(CryptIntegrity {
                tuple_size: TUPLE,
                kind: IntegrityKind::Aead,
            }),
            ..CryptFlags::inline()
        },
        implementation: None,
    };
    let len = dev.size() / u64::from(bs) * u64::from(bs);
    CryptTarget::new(dev, len, params).unwrap()
}

#[test]
fn integrity_stores_and_returns_caller_tags_in_every_mode() {
    for mode in [
        IntegrityMode::Journal,
        IntegrityMode::Direct,
        IntegrityMode::Bitmap,
    ] {
        for bs in [512u32, 4096] {
            let disk = new_disk();
            IntegrityTarget::format(disk.clone(), "d", None, ext_config(mode, bs), false).unwrap();
            let t =
                IntegrityTarget::open(disk.clone(), "d", None, ext_config(mode, bs), None).unwrap();
            assert_eq!(t.tag_size(), TUPLE);
            let n = 6usize;
            let mut rng = common::Rng::new(bs as u64 + mode as u64);
            let mut data = vec![0u8; n * bs as usize];
            let mut tags = vec![0u8; n * TUPLE as usize];
            rng.fill(&mut data);
            rng.fill(&mut tags);
            t.write_with_tags(u64::from(bs), &data, &tags, WriteFlags::default())
                .unwrap();
            let (mut d2, mut t2) = (vec![0u8; data.len()], vec![0u8; tags.len()]);
            t.read_with_tags(u64::from(bs), &mut d2, &mut t2).unwrap();
            assert!(d2 == data && t2 == tags, "{mode:?} {bs}: before close");
            // Wrong tag buffer length.
            let e = t
                .read_with_tags(0, &mut vec![0u8; bs as usize], &mut [0u8; 3])
                .unwrap_err();
            assert_eq!(common::errno(&e), libc::EINVAL);
            t.close().unwrap();
            drop(t);
            // After a clean close and reopen in journal mode: from the home locations.
            let t = IntegrityTarget::open(
                disk.clone(),
                "d",
                None,
                ext_config(IntegrityMode::Journal, bs),
                None,
            )
            .unwrap();
            let (mut d3, mut t3) = (vec![0u8; data.len()], vec![0u8; tags.len()]);
            t.read_with_tags(u64::from(bs), &mut d3, &mut t3).unwrap();
            assert!(d3 == data && t3 == tags, "{mode:?} {bs}: after reopen");
            // Untagged reads return the data unverified.
            t.read_at(u64::from(bs), &mut d3).unwrap();
            assert!(d3 == data);
        }
    }
}

#[test]
fn internal_hash_devices_offer_no_tags() {
    let disk = new_disk();
    let cfg = IntegrityConfig::new(IntegrityMode::Journal, "crc32c");
    IntegrityTarget::format(disk.clone(), "d", None, cfg.clone(), false).unwrap();
    let t = IntegrityTarget::open(disk, "d", None, cfg, None).unwrap();
    assert_eq!(t.tag_size(), 0);
    let e = t
        .read_with_tags(0, &mut [0u8; 512], &mut [0u8; 4])
        .unwrap_err();
    assert_eq!(common::errno(&e), libc::EOPNOTSUPP);
    // And crypt refuses to stack `integrity:` on it (the kernel's profile check).
    let params_dev: Arc<dyn BlockDevice> = Arc::new(t);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| crypt_over(params_dev, 512)));
    assert!(r.is_err());
}

#[test]
fn tables_pass_tags_through_linear_and_mappings() {
    let reg = Registry::new();
    let disk = std::env::temp_dir().join(format!("cryptblk-aead-tags-{}.img", std::process::id()));
    std::fs::write(&disk, vec![0u8; 4 << 20]).unwrap();
    let p = disk.display();
    // A short first table formats the device (as integritysetup does); its status tells
    // the provided size.
    let probe = reg
        .create("probe", &format!("0 8 integrity {p} 0 {TUPLE} J 0"))
        .unwrap();
    let provided: u64 = probe
        .status()
        .split_whitespace()
        .nth(4)
        .unwrap()
        .parse()
        .unwrap();
    drop(probe);
    reg.remove("probe").unwrap();
    reg.create("int", &format!("0 {provided} integrity {p} 0 {TUPLE} J 0"))
        .unwrap();
    let half = provided / 2 / 8 * 8;
    reg.create("lin", &format!("0 {half} linear int 8"))
        .unwrap();
    // Kernel syntax, stacked on the linear mapping: key, iv_offset, dev, offset, flags.
    let c = reg
        .create(
            "c",
            &format!(
                "0 {half} crypt capi:gcm(aes)-random {GCM_KEY} 0 lin 0 1 integrity:{TUPLE}:aead"
            ),
        )
        .unwrap();
    assert!(
        c.table(true).contains(" 1 integrity:28:aead"),
        "{}",
        c.table(true).as_str()
    );
    let mut data = vec![0u8; 64 << 10];
    common::Rng::new(7).fill(&mut data);
    c.write_at(4096, &data, WriteFlags::default()).unwrap();
    let mut got = vec![0u8; data.len()];
    c.read_at(4096, &mut got).unwrap();
    assert!(got == data);
    // The same sectors through the integrity mapping: the ciphertext, 28-byte tuples.
    let m = reg.get("int").unwrap();
    assert_eq!(m.tag_size(), TUPLE);
    let mut raw = vec![0u8; 512];
    let mut tags = vec![0u8; TUPLE as usize];
    m.read_with_tags((8 + 8) * 512, &mut raw, &mut tags)
        .unwrap();
    assert_ne!(raw[..], data[..512]);
    assert!(tags.iter().any(|&b| b != 0));
    // Flip one data bit below crypt: exactly that sector fails with EILSEQ.
    raw[9] ^= 1;
    m.write_with_tags((8 + 8) * 512, &raw, &tags, WriteFlags::default())
        .unwrap();
    let e = c.read_at(4096, &mut got).unwrap_err();
    assert_eq!(common::errno(&e), libc::EILSEQ);
    assert_eq!(c.stats()[0].counter("integrity_errors").unwrap(), 1);
    assert!(
        c.status().contains("integrity=28:aead integrity_errors=1"),
        "{}",
        c.status()
    );
    c.read_at(4096 + 512, &mut got[..512]).unwrap();
    assert_eq!(got[..512], data[512..1024]);
    // A crypt line whose tuple differs from the device's is refused.
    let e = reg
        .create(
            "bad",
            &format!("0 {half} crypt capi:gcm(aes)-random {GCM_KEY} 0 lin 0 1 integrity:24:aead"),
        )
        .err()
        .expect("a tuple size mismatch must be refused");
    assert!(e.to_string().contains("tag size mismatch"), "{e}");
    drop((c, m));
    for n in ["c", "lin", "int"] {
        reg.remove(n).unwrap();
    }
    let _ = std::fs::remove_file(&disk);
}

/// One step of the crash workload: write blocks `first..first+n` with generation `gen`,
/// then optionally flush.
struct Op {
    first: usize,
    n: usize,
    gen: u8,
    flush: bool,
    fua: bool,
}

fn workload() -> Vec<Op> {
    let mut rng = common::Rng::new(42);
    (1..=80)
        .map(|g| Op {
            first: rng.below(28) as usize,
            n: 1 + rng.below(4) as usize,
            gen: g as u8,
            flush: g % 5 == 0,
            fua: g % 7 == 0,
        })
        .collect()
}

const BLOCKS: usize = 32;

fn content(block: usize, gen: u8, bs: usize) -> Vec<u8> {
    let mut v = vec![gen; bs];
    v[..8].copy_from_slice(&(block as u64).to_le_bytes());
    v
}

fn crash_check(mode: IntegrityMode, bs: u32) {
    let bsz = bs as usize;
    // Baseline: every block written with generation 0 and closed cleanly.
    let base = new_disk();
    IntegrityTarget::format(base.clone(), "d", None, ext_config(mode, bs), false).unwrap();
    {
        let t = Arc::new(
            IntegrityTarget::open(base.clone(), "d", None, ext_config(mode, bs), None).unwrap(),
        );
        let c = crypt_over(t.clone(), bs);
        for b in 0..BLOCKS {
            c.write_at((b * bsz) as u64, &content(b, 0, bsz), WriteFlags::default())
                .unwrap();
        }
        c.flush().unwrap();
        drop(c);
        t.close().unwrap();
    }
    let image = base.image();
    let ops = workload();
    let mut budget = 0i64;
    loop {
        let disk = MemDisk::from_image(image.clone());
        let crash = CrashDisk::new(disk.clone(), budget, true);
        // Generations each block may hold after the crash: the last flushed one, or later.
        let mut allowed: Vec<Vec<u8>> = vec![vec![0]; BLOCKS];
        let mut completed = true;
        if let Ok(t) = IntegrityTarget::open(crash.clone(), "d", None, ext_config(mode, bs), None) {
            let t = Arc::new(t);
            let c = crypt_over(t.clone(), bs);
            for op in &ops {
                for a in &mut allowed[op.first..op.first + op.n] {
                    a.push(op.gen);
                }
                let mut buf: Vec<u8> = (op.first..op.first + op.n)
                    .flat_map(|b| content(b, op.gen, bsz))
                    .collect();
                let w = c.write_at_scratch(
                    (op.first * bsz) as u64,
                    &mut buf,
                    WriteFlags { fua: op.fua },
                );
                let f = if op.flush && w.is_ok() { c.flush() } else { w };
                match f {
                    Ok(()) if op.flush || op.fua => {
                        for a in &mut allowed[op.first..op.first + op.n] {
                            *a = vec![op.gen];
                        }
                        if op.flush {
                            for a in allowed.iter_mut() {
                                let last = *a.last().unwrap();
                                a.retain(|&g| g == last);
                            }
                        }
                    }
                    Ok(()) => {}
                    Err(_) => {
                        completed = false;
                        break;
                    }
                }
            }
        } else {
            completed = false;
        }
        // Reopen the surviving image (journal replay / bitmap recovery) and check.
        let t = Arc::new(
            IntegrityTarget::open(disk.clone(), "d", None, ext_config(mode, bs), None)
                .unwrap_or_else(|e| panic!("{mode:?} budget {budget}: reopen: {e}")),
        );
        let c = crypt_over(t, bs);
        for (b, allowed) in allowed.iter().enumerate() {
            let mut got = vec![0u8; bsz];
            c.read_at((b * bsz) as u64, &mut got).unwrap_or_else(|e| {
                panic!("{mode:?} {bs} budget {budget}: block {b} unreadable: {e}")
            });
            let gen = got[8];
            assert!(
                got == content(b, gen, bsz) && allowed.contains(&gen),
                "{mode:?} {bs} budget {budget}: block {b} holds generation {gen}, allowed {:?}",
                allowed
            );
        }
        if completed {
            break;
        }
        budget += 1;
    }
    // Every crash point above passed its checks, so nothing flushed was lost.
    println!(
        "crypt (gcm-random) over integrity {mode:?}, {bs}-byte sectors, torn cut: \
         {} crash points, 0 flushed blocks lost, 0 tag failures",
        budget + 1
    );
    assert!(budget > 10, "the workload made only {budget} writes");
}

#[test]
fn crash_at_any_write_keeps_data_and_tags_together_journal() {
    crash_check(IntegrityMode::Journal, 512);
    crash_check(IntegrityMode::Journal, 4096);
}
