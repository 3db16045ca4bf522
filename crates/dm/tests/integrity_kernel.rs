//! Compatibility with the Linux kernel's dm-integrity, via images made in the kernel lab
//! (`shared/lab`, a QEMU guest with dm-integrity; see integrity_fixtures/make-fixtures.sh).
//!
//! `kernel_images_open_in_cryptblk` (always run): images that `integritysetup format` plus
//! the kernel's dm-integrity wrote (a pattern written through the mapping and flushed) open
//! in cryptblk, read back the pattern and pass every tag check — including copies taken
//! while the kernel mapping was live, whose last flushed write is still only in the
//! kernel's journal, so cryptblk must replay it.
//! `write_images_for_kernel` (ignored; run by make-fixtures.sh) writes the images the
//! kernel is then asked to open; its verdicts are recorded in integrity_fixtures/results.txt.

mod common;

use common::{open_file, CutDisk};
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, WriteFlags};
use std::path::PathBuf;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

const PATTERN_LEN: usize = 256 << 10;

/// The fixture set (`tests/integrity_fixtures`) the lab scripts made.
const FIXTURE_SET: &str = "integrity_fixtures";

/// The pattern written through every mapping (xorshift64, seed 0x5eed).
fn pattern() -> Vec<u8> {
    common::xorshift_pattern(0x5eed, PATTERN_LEN)
}

/// (fixture, internal hash, block size) as made by lab-guest.sh.
const KERNEL_IMAGES: [(&str, &str, u32); 3] = [
    ("k-sha256", "sha256", 512),
    ("k-crc32c-4k", "crc32c", 4096),
    ("k-legacy", "sha1", 512),
];

#[test]
fn kernel_images_open_in_cryptblk() {
    let dir = std::env::temp_dir().join(format!("cryptblk-kint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // lab-guest.sh writes the pattern, then the pattern's last 8 KiB over its first.
    let mut want = pattern();
    let tail = want[PATTERN_LEN - 8192..].to_vec();
    want[..8192].copy_from_slice(&tail);
    let mut replayed = 0;
    for (name, hash, bs) in KERNEL_IMAGES {
        for variant in [name.to_string(), format!("{name}-live")] {
            let img = common::unpack_fixture(FIXTURE_SET, &variant, &dir);
            let c = IntegrityConfig {
                block_size: bs,
                ..IntegrityConfig::new(IntegrityMode::Journal, hash)
            };
            // Without replay (recovery mode) the home locations show whether the kernel
            // left committed journal entries behind in this image.
            let raw = IntegrityTarget::open(
                open_file(&img),
                &variant,
                None,
                IntegrityConfig {
                    mode: IntegrityMode::Recovery,
                    ..c.clone()
                },
                None,
            )
            .unwrap();
            let mut home = vec![0u8; PATTERN_LEN];
            raw.read_at(0, &mut home).unwrap();
            drop(raw);
            if home != want {
                replayed += 1;
            }
            let t = IntegrityTarget::open(open_file(&img), &variant, None, c, None)
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            // The superblock agrees with the kernel's own dump of it.
            let dump = common::fixture_text(FIXTURE_SET, &format!("{name}.dump"));
            let sb = t.superblock();
            assert!(
                dump.contains(&format!(
                    "provided_data_sectors {}\n",
                    sb.provided_data_sectors
                )),
                "{variant}"
            );
            assert!(
                dump.contains(&format!("journal_sections {}\n", sb.journal_sections)),
                "{variant}"
            );
            let mut got = vec![0u8; PATTERN_LEN];
            t.read_at(0, &mut got)
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert!(got == want, "{variant}: pattern differs");
            // Every other block was wiped by integritysetup: all tags must verify.
            let mut rest = vec![0u8; 1 << 20];
            let mut off = PATTERN_LEN as u64;
            while off < t.size() {
                let n = (t.size() - off).min(rest.len() as u64) as usize;
                t.read_at(off, &mut rest[..n])
                    .unwrap_or_else(|e| panic!("{variant} at {off}: {e}"));
                assert!(
                    rest[..n].iter().all(|&b| b == 0),
                    "{variant}: wiped area not zero"
                );
                off += n as u64;
            }
            assert_eq!(t.mismatches(), 0);
            let _ = std::fs::remove_file(&img);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{replayed} kernel images needed a journal replay to show the pattern");
    assert!(
        replayed > 0,
        "no fixture exercised the replay of a kernel-written journal"
    );
}

#[test]
#[ignore = "fixture generator for make-fixtures.sh (writes into CRYPTBLK_FIXTURE_OUT)"]
fn write_images_for_kernel() {
    let out = PathBuf::from(std::env::var("CRYPTBLK_FIXTURE_OUT").expect("CRYPTBLK_FIXTURE_OUT"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("pattern.bin"), pattern()).unwrap();
    let key = SecretBytes::from_slice(&[0x42; 32]);
    std::fs::write(out.join("hmac.key"), key.as_bytes()).unwrap();
    // (name, hash, block size, integritysetup open options, cut after the journal write)
    let cases: [(&str, &str, u32, &str, bool); 4] = [
        ("ours-sha256", "sha256", 512, "--integrity sha256", false),
        (
            "ours-crc32c-4k",
            "crc32c",
            4096,
            "--integrity crc32c",
            false,
        ),
        (
            "ours-hmac",
            "hmac(sha256)",
            512,
            "--integrity hmac-sha256 --integrity-key-file hmac.key --integrity-key-size 32",
            false,
        ),
        ("ours-replay", "sha256", 512, "--integrity sha256", true),
    ];
    for (name, hash, bs, opts, cut) in cases {
        let img = out.join(format!("{name}.img"));
        std::fs::File::create(&img)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let mut c = IntegrityConfig {
            block_size: bs,
            fix_padding: true,
            fix_hmac: true,
            ..IntegrityConfig::new(IntegrityMode::Journal, hash)
        };
        if hash.starts_with("hmac") {
            c.internal_hash_key = Some(key.clone());
        }
        if cut {
            // A journal big enough for the whole pattern: one commit, one journal write.
            c.journal_sectors = Some(2048);
        }
        IntegrityTarget::format(open_file(&img), name, None, c.clone(), true).unwrap();
        let dev: Arc<dyn BlockDevice> = if cut {
            Arc::new(CutDisk {
                inner: open_file(&img),
                budget: AtomicI64::new(1),
            })
        } else {
            open_file(&img)
        };
        let t = IntegrityTarget::open(dev, name, None, c, None).unwrap();
        t.write_at(0, &pattern(), WriteFlags::default()).unwrap();
        let r = t.flush();
        if cut {
            assert!(r.is_err(), "the cut must stop the write-back");
        } else {
            r.unwrap();
            t.close().unwrap();
        }
        std::fs::write(out.join(format!("{name}.opts")), opts).unwrap();
    }
}
