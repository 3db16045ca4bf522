//! `recalculate`, `reset_recalculate`, `meta_device:` and `sectors_per_bit:` of the
//! integrity target, against images the kernel made in the lab
//! (`tests/integrity_recalc_fixtures/`, made by `make-recalc-fixtures.sh`):
//!
//! - `kdd`: `integritysetup format --data-device` + kernel writes of the lab pattern: opens
//!   in cryptblk, the pattern reads back, every block's tag checks, and cryptblk's
//!   superblock dump agrees with the kernel's;
//! - `kr`: `integritysetup format --no-wipe --data-device`, the pattern written raw to the
//!   data device (no tags), then opened by the kernel with `--integrity-recalculate` until
//!   `recalc_sector` reached the end. cryptblk recalculates the same "before" image and must
//!   produce byte-identical tags and superblock; after that every block reads, and a
//!   flipped data bit is detected; the kernel's recalculated image reads in cryptblk;
//! - `kb`: a kernel bitmap-mode open with `--bitmap-sectors-per-bit 1024`: cryptblk records
//!   the same granularity in the superblock and shows it in the table as the kernel did;
//! - an interrupted recalculation (a disk that dies mid-way) resumes from the stored
//!   `recalc_sector`, not from 0: a bit flipped below it stays detected.
//!
//! The reverse direction (the kernel reads cryptblk's data-device and recalculated images)
//! is recorded by the same lab run in `results.txt`, checked at the end.

mod common;

use common::{fixture_text, unpack_fixture, xorshift_pattern, CrashDisk, MemDisk};
use cryptblk_dm::targets::integrity::superblock::Superblock;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, Target, WriteFlags};
use std::sync::Arc;

const SET: &str = "integrity_recalc_fixtures";
/// The lab pattern: xorshift64 from 0x5eed, 256 KiB.
const PATTERN_LEN: usize = 256 << 10;

fn pattern() -> Vec<u8> {
    xorshift_pattern(0x5eed, PATTERN_LEN)
}

fn load(name: &str) -> Arc<MemDisk> {
    let dir = common::temp_dir(&format!("recalc-{name}"));
    let p = unpack_fixture(SET, name, &dir);
    let img = std::fs::read(&p).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    MemDisk::from_image(img)
}

/// `integritysetup open --data-device`'s table for crc32c: data device first,
/// `meta_device:` option.
fn data_device_cfg(mode: IntegrityMode) -> IntegrityConfig {
    IntegrityConfig {
        meta_device: Some("meta".into()),
        fix_padding: true,
        fix_hmac: true,
        ..IntegrityConfig::new(mode, "crc32c")
    }
}

fn open(
    data: &Arc<dyn BlockDevice>,
    meta: Option<&Arc<dyn BlockDevice>>,
    cfg: IntegrityConfig,
) -> IntegrityTarget {
    let cfg = IntegrityConfig {
        meta_device: meta.map(|_| "meta".to_string()),
        ..cfg
    };
    IntegrityTarget::open(data.clone(), "data", meta.cloned(), cfg, None)
        .unwrap_or_else(|e| panic!("open: {e}"))
}

/// Reads the whole device in 64 KiB requests; the first failing offset and its errno.
fn read_all(t: &IntegrityTarget) -> Result<Vec<u8>, (u64, i32)> {
    let mut out = vec![0u8; t.size() as usize];
    for (k, chunk) in out.chunks_mut(64 << 10).enumerate() {
        let off = (k as u64) << 16;
        t.read_at(off, chunk)
            .map_err(|e| (off, e.raw_os_error().unwrap_or(-1)))?;
    }
    Ok(out)
}

fn sb_of(disk: &MemDisk) -> Superblock {
    Superblock::parse(&disk.image()[..4096]).unwrap()
}

/// `integritysetup dump` lines after the device name.
fn dump_body(text: &str) -> String {
    text.lines().skip(1).collect::<Vec<_>>().join("\n")
}

#[test]
fn kernel_data_device_image_reads_back() {
    let meta = load("kdd-meta");
    let data = load("kdd-data");
    let (m, d): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (meta.clone(), data.clone());
    let t = open(&d, Some(&m), data_device_cfg(IntegrityMode::Journal));
    // Data starts at sector 0 of the data device: the kernel wrote the pattern there.
    assert_eq!(&data.image()[..PATTERN_LEN], &pattern()[..]);
    let all = read_all(&t).expect("every block of the kernel's image checks");
    assert_eq!(&all[..PATTERN_LEN], &pattern()[..]);
    assert!(all[PATTERN_LEN..].iter().all(|&b| b == 0), "wiped rest");
    assert_eq!(t.mismatches(), 0);
    let sb = t.superblock();
    assert_eq!(
        dump_body(&sb.dump("x")),
        dump_body(&fixture_text(SET, "kdd.dump")),
        "superblock as integritysetup dump shows the kernel's"
    );
    assert_eq!(sb.provided_data_sectors, data.size() / 512);

    // A flipped data bit is detected.
    data.flip(4096 + 7, 0x10);
    let mut b = vec![0u8; 4096];
    let e = t.read_at(4096, &mut b).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EILSEQ));

    // cryptblk's writes land at the kernel's places: data at its sector, tag after the
    // journal; reopened, they read back.
    data.flip(4096 + 7, 0x10);
    let new = xorshift_pattern(77, 8192);
    t.write_at(1 << 20, &new, WriteFlags { fua: true }).unwrap();
    t.close().unwrap();
    drop(t);
    assert_eq!(&data.image()[1 << 20..(1 << 20) + 8192], &new[..]);
    let t = open(&d, Some(&m), data_device_cfg(IntegrityMode::Journal));
    let all = read_all(&t).expect("reopened");
    assert_eq!(&all[1 << 20..(1 << 20) + 8192], &new[..]);
}

/// Tag area of a data-device layout: after superblock and journal, one tag per block.
fn tag_area(meta: &[u8], t: &IntegrityTarget) -> Vec<u8> {
    let l = t.layout();
    let start = (l.initial_sectors * 512) as usize;
    let len = (l.provided_data_sectors / l.sectors_per_block as u64 * l.tag_size as u64) as usize;
    meta[start..start + len].to_vec()
}

#[test]
fn recalculated_tags_match_the_kernels() {
    let before = load("kr-before-meta");
    let after = load("kr-after-meta");
    let data = load("kr-data");
    assert_eq!(
        sb_of(&before).flags & 0x2,
        0,
        "the before image is not recalculating yet"
    );
    let (m, d): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (before.clone(), data.clone());
    // Before recalculation the unwritten tags do not match (without recalculate: EILSEQ).
    {
        let t = open(&d, Some(&m), data_device_cfg(IntegrityMode::Journal));
        let e = read_all(&t).unwrap_err();
        assert_eq!(e.1, libc::EILSEQ, "untagged data fails its check");
    }
    let t = open(
        &d,
        Some(&m),
        IntegrityConfig {
            recalculate: true,
            ..data_device_cfg(IntegrityMode::Journal)
        },
    );
    // Usable at once: reads of blocks not recalculated yet are not checked.
    let all = read_all(&t).expect("reads during recalculation");
    assert_eq!(&all[..PATTERN_LEN], &pattern()[..]);
    t.wait_recalculation().unwrap();
    let provided = t.layout().provided_data_sectors;
    assert_eq!(t.recalc_sector(), Some(provided));
    assert!(t.table_params(false).contains(" recalculate "));
    assert!(t.status_params().ends_with(&format!(" {provided}")));
    t.close().unwrap();

    let ours = before.image();
    let theirs = after.image();
    assert_eq!(
        tag_area(&ours, &t),
        tag_area(&theirs, &t),
        "cryptblk's recalculated tags are the kernel's"
    );
    assert_eq!(
        ours[..64],
        theirs[..64],
        "superblock (recalculating, recalc_sector = size) as the kernel left it"
    );
    assert_eq!(
        dump_body(&sb_of(&before).dump("x")),
        dump_body(&fixture_text(SET, "kr-after.dump"))
    );
    drop(t);

    // Reopened without the option: every block is checked now, and passes.
    let t = open(&d, Some(&m), data_device_cfg(IntegrityMode::Journal));
    let all = read_all(&t).expect("all tags valid after recalculation");
    assert_eq!(&all[..PATTERN_LEN], &pattern()[..]);
    data.flip(100 * 512 + 3, 0x01);
    let mut b = vec![0u8; 512];
    let e = t.read_at(100 * 512, &mut b).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EILSEQ), "flipped bit detected");
    assert_eq!(t.mismatches(), 1);
    drop(t);

    // reset_recalculate recomputes everything from 0 (the flipped block is re-tagged).
    let t = open(
        &d,
        Some(&m),
        IntegrityConfig {
            reset_recalculate: true,
            recalculate: true,
            ..data_device_cfg(IntegrityMode::Journal)
        },
    );
    assert!(t.table_params(false).contains(" reset_recalculate "));
    t.wait_recalculation().unwrap();
    t.read_at(100 * 512, &mut b).expect("re-tagged by reset");
    assert_eq!(t.recalc_sector(), Some(provided));
}

#[test]
fn kernel_recalculated_image_reads_in_cryptblk() {
    let meta = load("kr-after-meta");
    let data = load("kr-data");
    let (m, d): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (meta, data);
    let t = open(&d, Some(&m), data_device_cfg(IntegrityMode::Journal));
    assert_eq!(t.recalc_sector(), Some(t.layout().provided_data_sectors));
    let all = read_all(&t).expect("the kernel's recalculated tags check");
    assert_eq!(&all[..PATTERN_LEN], &pattern()[..]);
    assert_eq!(t.mismatches(), 0);
}

#[test]
fn sectors_per_bit_as_the_kernel_records_it() {
    let disk = load("kb");
    let d: Arc<dyn BlockDevice> = disk.clone();
    let kernel = sb_of(&disk);
    let t = open(
        &d,
        None,
        IntegrityConfig {
            sectors_per_bit: Some(1024),
            fix_padding: true,
            fix_hmac: true,
            ..IntegrityConfig::new(IntegrityMode::Bitmap, "crc32c")
        },
    );
    let ours = t.superblock();
    assert_eq!(
        ours.log2_blocks_per_bitmap_bit, kernel.log2_blocks_per_bitmap_bit,
        "bitmap granularity recorded as the kernel did"
    );
    assert_eq!(ours.log2_blocks_per_bitmap_bit, 10);
    // The table shows the option as the kernel's `dmsetup table` line recorded by the lab.
    let results = fixture_text(SET, "results.txt");
    let kernel_line = results
        .lines()
        .find(|l| l.starts_with("kb table:"))
        .expect("kb table line in results.txt");
    assert!(
        kernel_line.contains(" sectors_per_bit:1024 "),
        "{kernel_line}"
    );
    assert!(t.table_params(false).contains(" sectors_per_bit:1024 "));
    // Granularity shows in the bitmap: one write marks one 1024-sector region dirty.
    t.write_at(5000 * 512, &[1u8; 512], WriteFlags::default())
        .unwrap();
    let img = disk.image();
    let bitmap = &img[8 * 512..8 * 512 + 16];
    assert_eq!(bitmap[0], 1 << (5000 / 1024), "bit 4 of the first byte");
    assert!(bitmap[1..].iter().all(|&b| b == 0));
}

/// Formats without wiping and puts the pattern, raw and untagged, in the first data
/// blocks (physical places from the layout).
fn untagged_device(meta_dev: bool) -> (Arc<MemDisk>, Option<Arc<MemDisk>>, u64) {
    let data = MemDisk::new(if meta_dev { 40 << 20 } else { 48 << 20 });
    let meta = meta_dev.then(|| MemDisk::new(2 << 20));
    let d: Arc<dyn BlockDevice> = data.clone();
    let m: Option<Arc<dyn BlockDevice>> = meta.clone().map(|m| m as Arc<dyn BlockDevice>);
    let cfg = IntegrityConfig {
        meta_device: m.as_ref().map(|_| "meta".into()),
        ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
    };
    IntegrityTarget::format(d.clone(), "data", m.clone(), cfg.clone(), false).unwrap();
    let t = IntegrityTarget::open(d, "data", m, cfg, None).unwrap();
    let provided = t.layout().provided_data_sectors;
    let p = pattern();
    for (k, block) in p.chunks(512).enumerate() {
        let phys = t.layout().data_sector(k as u64) * 512;
        data.write_at(phys, block, WriteFlags::default()).unwrap();
    }
    t.close().unwrap();
    (data, meta, provided)
}

#[test]
fn interrupted_recalculation_resumes_from_recalc_sector() {
    for meta_dev in [true, false] {
        let (data0, meta0, provided) = untagged_device(meta_dev);
        assert!(provided > 2 * 32768, "several recalculation chunks");
        // The disk holding the tags dies after `budget` writes, for growing budgets, until
        // the superblock records a point strictly inside the device.
        let mut found = None;
        for budget in 1..400 {
            let data = MemDisk::from_image(data0.image());
            let meta = meta0.as_ref().map(|m| MemDisk::from_image(m.image()));
            let sbdisk = meta.clone().unwrap_or_else(|| data.clone());
            let crash = CrashDisk::new(sbdisk.clone(), budget, false);
            let (d, m): (Arc<dyn BlockDevice>, Option<Arc<dyn BlockDevice>>) = if meta_dev {
                (data.clone(), Some(crash as Arc<dyn BlockDevice>))
            } else {
                (crash, None)
            };
            let cfg = IntegrityConfig {
                recalculate: true,
                meta_device: m.as_ref().map(|_| "meta".into()),
                ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
            };
            let Ok(t) = IntegrityTarget::open(d, "data", m, cfg, None) else {
                continue;
            };
            let r = t.wait_recalculation();
            drop(t);
            let stored = sb_of(&sbdisk).recalc_sector;
            if r.is_ok() {
                panic!("meta_dev {meta_dev}: recalculation finished before any cut point inside");
            }
            if stored > 0 && stored < provided {
                found = Some((data, meta, stored));
                break;
            }
        }
        let (data, meta, stored) = found.expect("a cut inside the device");
        assert_eq!(stored % 32768, 0, "chunk boundaries");
        // A bit flipped below recalc_sector: a restart from 0 would re-tag it; resuming
        // from recalc_sector keeps it detected.
        let t0 = {
            let d: Arc<dyn BlockDevice> = data.clone();
            let m: Option<Arc<dyn BlockDevice>> = meta.clone().map(|m| m as Arc<dyn BlockDevice>);
            let cfg = IntegrityConfig {
                meta_device: m.as_ref().map(|_| "meta".into()),
                ..IntegrityConfig::new(IntegrityMode::Recovery, "crc32c")
            };
            IntegrityTarget::open(d, "data", m, cfg, None).unwrap()
        };
        let phys0 = t0.layout().data_sector(0) * 512;
        drop(t0);
        data.flip(phys0 + 1, 0x80);
        // Reopened without the option: the flag on disk resumes it (as the kernel does).
        let d: Arc<dyn BlockDevice> = data.clone();
        let m: Option<Arc<dyn BlockDevice>> = meta.clone().map(|m| m as Arc<dyn BlockDevice>);
        let t = open(
            &d,
            m.as_ref(),
            IntegrityConfig::new(IntegrityMode::Journal, "crc32c"),
        );
        t.wait_recalculation().unwrap();
        assert_eq!(t.recalc_sector(), Some(provided));
        let mut b = vec![0u8; 512];
        let e = t.read_at(0, &mut b).unwrap_err();
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EILSEQ),
            "meta_dev {meta_dev}: block 0 was not recalculated again"
        );
        let mut rest = vec![0u8; (provided * 512 - 4096) as usize];
        t.read_at(4096, &mut rest)
            .expect("every other block checks after the resumed recalculation");
        assert_eq!(&rest[..PATTERN_LEN - 4096], &pattern()[4096..]);
    }
}

#[test]
fn recalculate_needs_an_internal_hash() {
    let disk: Arc<dyn BlockDevice> = MemDisk::new(8 << 20);
    let cfg = IntegrityConfig {
        tag_size: Some(16),
        internal_hash: None,
        recalculate: true,
        ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
    };
    let e = IntegrityTarget::open(disk, "d", None, cfg, None)
        .err()
        .expect("refused");
    assert!(e.contains("internal_hash"), "{e}");
    let (cfg, _) = IntegrityConfig::parse(
        &"/d 0 - J 3 recalculate sectors_per_bit:4096 internal_hash:crc32c"
            .split(' ')
            .map(String::from)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    assert!(cfg.recalculate && !cfg.reset_recalculate);
    assert_eq!(cfg.sectors_per_bit, Some(4096));
}

/// The lab's verdicts on cryptblk's images (written by `write_images_for_kernel`): the
/// kernel opened them and read everything without a tag failure.
#[test]
fn kernel_reads_cryptblks_images() {
    let results = fixture_text(SET, "results.txt");
    for name in ["ours-dd", "ours-rc", "ours-rc1"] {
        let line = results
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing from results.txt"));
        assert!(
            line.contains("pattern=OK")
                && line.contains("full_read=ok")
                && line.contains("mismatches=0"),
            "{line}"
        );
    }
}

/// Writes the images the lab opens with the kernel (`make-recalc-fixtures.sh`).
#[test]
#[ignore]
fn write_images_for_kernel() {
    let out = std::path::PathBuf::from(
        std::env::var("CRYPTBLK_FIXTURE_OUT").expect("CRYPTBLK_FIXTURE_OUT"),
    );
    let p = pattern();
    std::fs::write(out.join("pattern.bin"), &p).unwrap();
    // Data device, written through cryptblk.
    {
        let data = MemDisk::new(4 << 20);
        let meta = MemDisk::new(2 << 20);
        let (d, m): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (data.clone(), meta.clone());
        let cfg = data_device_cfg(IntegrityMode::Journal);
        IntegrityTarget::format(d.clone(), "data", Some(m.clone()), cfg.clone(), true).unwrap();
        let t = open(&d, Some(&m), cfg);
        t.write_at(0, &p, WriteFlags::default()).unwrap();
        t.close().unwrap();
        std::fs::write(out.join("ours-dd-data.img"), data.image()).unwrap();
        std::fs::write(out.join("ours-dd-meta.img"), meta.image()).unwrap();
    }
    // Data device recalculated by cryptblk over untagged data.
    {
        let data = MemDisk::new(4 << 20);
        let meta = MemDisk::new(2 << 20);
        let (d, m): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (data.clone(), meta.clone());
        let cfg = data_device_cfg(IntegrityMode::Journal);
        IntegrityTarget::format(d.clone(), "data", Some(m.clone()), cfg.clone(), false).unwrap();
        data.write_at(0, &p, WriteFlags::default()).unwrap();
        let t = open(
            &d,
            Some(&m),
            IntegrityConfig {
                recalculate: true,
                ..cfg
            },
        );
        t.wait_recalculation().unwrap();
        t.close().unwrap();
        std::fs::write(out.join("ours-rc-data.img"), data.image()).unwrap();
        std::fs::write(out.join("ours-rc-meta.img"), meta.image()).unwrap();
    }
    // One interleaved device recalculated by cryptblk.
    {
        let disk = MemDisk::new(16 << 20);
        let d: Arc<dyn BlockDevice> = disk.clone();
        let cfg = IntegrityConfig {
            fix_padding: true,
            fix_hmac: true,
            ..IntegrityConfig::new(IntegrityMode::Journal, "crc32c")
        };
        IntegrityTarget::format(d.clone(), "data", None, cfg.clone(), false).unwrap();
        let t = open(&d, None, cfg.clone());
        for (k, block) in p.chunks(512).enumerate() {
            let phys = t.layout().data_sector(k as u64) * 512;
            disk.write_at(phys, block, WriteFlags::default()).unwrap();
        }
        t.close().unwrap();
        drop(t);
        let t = open(
            &d,
            None,
            IntegrityConfig {
                recalculate: true,
                ..cfg
            },
        );
        t.wait_recalculation().unwrap();
        t.close().unwrap();
        std::fs::write(out.join("ours-rc1.img"), disk.image()).unwrap();
    }
}
