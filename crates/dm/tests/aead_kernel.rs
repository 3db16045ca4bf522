//! Authenticated dm-crypt over dm-integrity (LUKS2 `--integrity`) against the real kernel,
//! via images the kernel made in the lab (see aead_fixtures/README.md and
//! make-fixtures.sh).
//!
//! - `kernel_tables_read_kernel_images`: the exact two table lines `dmsetup table
//!   --showkeys` printed in the kernel (only the loop device and the integrity device
//!   renamed) load through cryptblk's table parser and read back the pattern the kernel
//!   wrote, for GCM, ChaCha20-Poly1305 (random and plain64 IVs), HMAC-SHA256 + XTS (random
//!   and plain64), HMAC-SHA512 + CBC-ESSIV, with 512- and 4096-byte sectors; unwritten
//!   sectors of unwiped images fail with EILSEQ, wiped ones read zeros.
//! - `flipped_data_tag_or_iv_bits_fail_with_eilseq`: one flipped bit in a sector's data, tag
//!   or stored IV on the image makes exactly that sector fail with EILSEQ (counted), while
//!   its neighbours still read.
//! - `direct_and_bitmap_modes_share_the_format`: the integrity line with `D` and `B`
//!   instead of `J` reads and writes the same images.
//! - `dmsetup_tables_read_kernel_stacks`, `kernel_journal_with_aead_tags_is_replayed`: the
//!   d-* stacks the kernel built from plain dmsetup tables (iv_offset, truncated tags,
//!   `none`, iv_large_sectors, integrity_key_size, CCM, AEGIS-128) and a copy taken while
//!   the kernel still had committed entries only in its journal.
//! - `lab_kernel_reads_what_cryptblk_wrote` (boots the kernel lab once, under a minute;
//!   skipped only with CRYPTBLK_SKIP_LAB=1): cryptblk writes pattern2 through the kernel's
//!   tables into a representative subset of the fixtures; the real kernel opens each
//!   (`cryptsetup open`, or the recorded dmsetup tables) and compares.
//!   `write_images_for_kernel` (ignored) writes all of them for aead_fixtures/roundtrip.sh,
//!   which records the kernel's verdicts in aead_fixtures/results.txt.

mod common;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_dm::targets::integrity::IntegrityTarget;
use cryptblk_dm::{BlockDevice, CryptTarget, Registry, WriteFlags};
use std::path::{Path, PathBuf};
use std::process::Command;

/// (fixture, pattern bytes the kernel wrote at offset 0, whether the image was wiped)
const FIXTURES: [(&str, usize, bool); 9] = [
    ("xts-plain64-hmac-sha256", 256 << 10, false),
    ("xts-random-hmac-sha256", 256 << 10, false),
    ("xts-random-hmac-sha256-4k", 256 << 10, false),
    ("gcm-random", 256 << 10, false),
    ("gcm-random-4k", 256 << 10, false),
    ("gcm-random-wiped", 256 << 10, true),
    ("chacha20-random-poly1305", 256 << 10, false),
    ("chacha20-plain64-poly1305", 256 << 10, false),
    ("cbc-essiv-hmac-sha512", 1 << 20, false),
];

/// Stacks made with plain dmsetup tables in the lab (lab-guest-dmsetup.sh) for options
/// cryptsetup does not emit: (fixture, authenticated). Each holds pattern (256 KiB) at 0.
const DMSETUP_FIXTURES: [(&str, bool); 9] = [
    ("d-chacha-plain64-ivoffset", true),
    ("d-gcm-random-tag12", true),
    ("d-xts-random-none", false),
    ("d-chacha-plain64-4k-large", true),
    ("d-hmac-sha1-xts-plain64-ivoffset", true),
    ("d-hmac-sha256-xts-plain64-keysize33", true),
    ("d-ccm-random", true),
    ("d-aegis128-random", true),
    ("d-gcm-rfc4106-random", true),
];

/// The fixture set (`tests/aead_fixtures`) the lab scripts made.
const FIXTURE_SET: &str = "aead_fixtures";

/// SHA-256(`cryptblk-aead-<tag>-<i>`) for i = 0.. (what lab-guest.sh wrote).
fn pattern(tag: &str, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut i = 0;
    while v.len() < len {
        v.extend(HashAlgorithm::Sha256.digest(&[format!("cryptblk-aead-{tag}-{i}").as_bytes()]));
        i += 1;
    }
    v
}

/// The volume key from NAME.vk (`MK dump:` hex lines).
fn volume_key(name: &str) -> String {
    let text = common::fixture_text(FIXTURE_SET, &format!("{name}.vk"));
    let mut hex = String::new();
    for line in text.lines() {
        let l = line.trim_start_matches("MK dump:");
        if l.split_whitespace()
            .all(|w| w.len() == 2 && w.chars().all(|c| c.is_ascii_hexdigit()))
        {
            for w in l.split_whitespace() {
                hex.push_str(w);
            }
        }
    }
    hex
}

/// The two table lines the kernel showed: (integrity line, crypt line), without the
/// `name: ` prefix. A keyring key reference is replaced by the volume key in hex (the
/// kernel shows `:<len>:logon:...` when cryptsetup used the keyring).
fn kernel_tables(name: &str) -> (String, String) {
    let text = common::fixture_text(FIXTURE_SET, &format!("{name}.tables"));
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("# dmsetup table --showkeys"))
        .skip(1);
    // LUKS2 stacks were named kaead_dif/kaead, the dmsetup-made ones (d-*) dint/dcrypt.
    let (lower, upper) = if name.starts_with("d-") {
        ("dint: ", "dcrypt: ")
    } else {
        ("kaead_dif: ", "kaead: ")
    };
    let int = lines
        .next()
        .unwrap()
        .strip_prefix(lower)
        .unwrap()
        .to_string();
    let crypt = lines
        .next()
        .unwrap()
        .strip_prefix(upper)
        .unwrap()
        .to_string();
    let crypt = crypt
        .split(' ')
        .map(|w| {
            if w.starts_with(':') && w.contains(":logon:") {
                volume_key(name)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    (int, crypt)
}

/// Loads the kernel's lines verbatim, with `7:0` -> the image and `254:0` -> the
/// integrity mapping (`int_mode` replaces the integrity mode letter if given).
fn open(reg: &Registry, name: &str, img: &Path, int_mode: Option<&str>) {
    let (int, crypt) = kernel_tables(name);
    let mut int = int.replacen(" 7:0 ", &format!(" {} ", img.display()), 1);
    if let Some(m) = int_mode {
        int = int.replacen(" J ", &format!(" {m} "), 1);
    }
    let crypt = crypt.replacen(" 254:0 ", " kaead_dif ", 1);
    reg.create("kaead_dif", &int)
        .unwrap_or_else(|e| panic!("{name}: integrity line '{int}': {e}"));
    reg.create("kaead", &crypt)
        .unwrap_or_else(|e| panic!("{name}: crypt line: {e}"));
}

/// Commits the integrity journal (like the kernel's suspend on close) and removes both.
fn close(reg: &Registry) {
    let m = reg.get("kaead").unwrap();
    m.flush().unwrap();
    drop(m);
    reg.remove("kaead").unwrap();
    let m = reg.get("kaead_dif").unwrap();
    m.with_table(|t| {
        t.entries()[0]
            .target
            .as_any()
            .downcast_ref::<IntegrityTarget>()
            .unwrap()
            .close()
            .unwrap()
    });
    drop(m);
    reg.remove("kaead_dif").unwrap();
}

fn integrity_errors(reg: &Registry) -> u64 {
    reg.get("kaead").unwrap().stats()[0]
        .counter("integrity_errors")
        .unwrap()
}

/// What the last logical block of a kernel stack, which the kernel never wrote, reads.
#[derive(Clone, Copy)]
enum LastBlock {
    /// EILSEQ, counted once in the crypt target's integrity errors: its tag was never
    /// written.
    Fails,
    /// Zeros, no integrity error: the image was wiped, so its tags are valid.
    Zeros,
    /// Whatever it decrypts to (`integrity:N:none`: nothing is authenticated).
    Noise,
}

/// Opens the kernel's stack `name` (its table lines verbatim) over a fresh copy of its image
/// in `dir` and checks it against what the kernel did: the first `plen` bytes read the
/// kernel's pattern, both table lines print as the kernel printed them (devices aside) and
/// the never-written last block reads as `last` says. Closes the stack.
fn check_kernel_stack(dir: &Path, name: &str, plen: usize, last: LastBlock) {
    let img = common::unpack_fixture(FIXTURE_SET, name, dir);
    let reg = Registry::new();
    open(&reg, name, &img, None);
    let m = reg.get("kaead").unwrap();
    let mut got = vec![0u8; plen];
    m.read_at(0, &mut got)
        .unwrap_or_else(|e| panic!("{name}: reading the kernel's pattern: {e}"));
    assert!(got == pattern("pattern", plen), "{name}: pattern differs");
    let (int, crypt) = kernel_tables(name);
    let ours = reg.get("kaead_dif").unwrap().table(true);
    assert_eq!(
        ours.trim().split(' ').skip(4).collect::<Vec<_>>(),
        int.split(' ').skip(4).collect::<Vec<_>>(),
        "{name}: integrity table"
    );
    assert_eq!(
        m.table(true).trim().split(' ').skip(3).collect::<Vec<_>>(),
        crypt
            .replacen(" 254:0 ", " kaead_dif ", 1)
            .split(' ')
            .skip(3)
            .collect::<Vec<_>>(),
        "{name}: crypt table"
    );
    let bs = m.logical_block_size() as u64;
    let mut block = vec![0u8; bs as usize];
    let r = m.read_at(m.size() - bs, &mut block);
    match last {
        LastBlock::Fails => {
            let e = r.expect_err("an unwritten sector of an unwiped image must fail");
            assert_eq!(common::errno(&e), libc::EILSEQ, "{name}");
            assert_eq!(integrity_errors(&reg), 1, "{name}");
        }
        LastBlock::Zeros => {
            r.unwrap_or_else(|e| panic!("{name}: wiped block: {e}"));
            assert!(
                block.iter().all(|&b| b == 0),
                "{name}: wiped block not zero"
            );
            assert_eq!(integrity_errors(&reg), 0, "{name}");
        }
        LastBlock::Noise => r.unwrap_or_else(|e| panic!("{name}: {e}")),
    }
    drop(m);
    close(&reg);
}

#[test]
fn kernel_tables_read_kernel_images() {
    let dir = common::temp_dir("aead-kernel");
    for (name, plen, wiped) in FIXTURES {
        let last = if wiped {
            LastBlock::Zeros
        } else {
            LastBlock::Fails
        };
        check_kernel_stack(&dir, name, plen, last);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dmsetup_tables_read_kernel_stacks() {
    // iv_offset (in the IV, not in the associated data), a truncated 12-byte GCM tag,
    // integrity:16:none (stored random IVs, nothing authenticated), iv_large_sectors with
    // 4096-byte sectors, HMAC-SHA1 (20-byte tag) over XTS, a 33-byte HMAC key
    // (integrity_key_size:33), AES-CCM (rfc4309) and AEGIS-128 as cryptsetup names them,
    // and AES-GCM in its RFC 4106 form.
    let dir = common::temp_dir("aead-dmsetup");
    for (name, authenticated) in DMSETUP_FIXTURES {
        let last = if authenticated {
            LastBlock::Fails
        } else {
            LastBlock::Noise
        };
        check_kernel_stack(&dir, name, 256 << 10, last);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernel_journal_with_aead_tags_is_replayed() {
    // A copy of a kernel stack taken while mapped, right after a flushed 8 KiB overwrite
    // that the kernel had committed to its journal only: cryptblk must replay the journal
    // (data with dm-crypt's tags and IVs in the entries) to read the overwrite.
    let name = "d-gcm-random-journal-live";
    let dir = common::temp_dir("aead-live");
    let img = common::unpack_fixture(FIXTURE_SET, name, &dir);
    let mut want = pattern("pattern", 256 << 10);
    let tail = want[want.len() - 8192..].to_vec();
    want[..8192].copy_from_slice(&tail);
    // In recovery mode (no replay) the home location still has the old data, so the journal
    // really holds the overwrite.
    let reg = Registry::new();
    open(&reg, name, &img, Some("R"));
    let mut home = vec![0u8; 8192];
    let m = reg.get("kaead").unwrap();
    m.read_at(0, &mut home).unwrap();
    assert!(
        home[..] == pattern("pattern", 8192)[..],
        "the fixture's overwrite is already home; it no longer tests replay"
    );
    drop(m);
    reg.remove("kaead").unwrap();
    reg.remove("kaead_dif").unwrap();
    let reg = Registry::new();
    open(&reg, name, &img, None);
    let m = reg.get("kaead").unwrap();
    let mut got = vec![0u8; want.len()];
    m.read_at(0, &mut got).unwrap();
    let old = pattern("pattern", 256 << 10);
    let same_old = (0..got.len() / 512)
        .filter(|&k| got[k * 512..(k + 1) * 512] == old[k * 512..(k + 1) * 512])
        .count();
    let same_new = (0..got.len() / 512)
        .filter(|&k| got[k * 512..(k + 1) * 512] == want[k * 512..(k + 1) * 512])
        .count();
    assert!(
        got == want,
        "replayed content differs: {same_old} sectors old, {same_new} new of {}",
        got.len() / 512
    );
    drop(m);
    close(&reg);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flipped_data_tag_or_iv_bits_fail_with_eilseq() {
    let dir = common::temp_dir("aead-flip");
    let authenticated = FIXTURES
        .iter()
        .map(|f| f.0)
        .chain(DMSETUP_FIXTURES.iter().filter(|f| f.1).map(|f| f.0));
    for name in authenticated {
        let img = common::unpack_fixture(FIXTURE_SET, name, &dir);
        // Where logical sector 8 (a whole block in both sector sizes) keeps data and tag.
        let reg = Registry::new();
        open(&reg, name, &img, None);
        let (data_pos, tag_pos, tuple) = reg.get("kaead_dif").unwrap().with_table(|t| {
            let it = t.entries()[0]
                .target
                .as_any()
                .downcast_ref::<IntegrityTarget>()
                .unwrap();
            let l = it.layout();
            (l.data_sector(8) * 512, l.tag_position(8), l.tag_size as u64)
        });
        let (block, stored_iv) = reg.get("kaead").unwrap().with_table(|t| {
            let c = t.entries()[0]
                .target
                .as_any()
                .downcast_ref::<CryptTarget>()
                .unwrap();
            // Random IVs are the stored ones (last bytes of the tuple).
            (c.flags().sector_size as usize, name.contains("random"))
        });
        close(&reg);
        let pristine = std::fs::read(&img).unwrap();
        let mut cases = vec![("data", data_pos + 100), ("tag", tag_pos + 3)];
        if stored_iv {
            cases.push(("IV", tag_pos + tuple - 1));
        }
        for (what, pos) in cases {
            let mut bytes = pristine.clone();
            bytes[pos as usize] ^= 0x10;
            std::fs::write(&img, &bytes).unwrap();
            let reg = Registry::new();
            open(&reg, name, &img, None);
            let m = reg.get("kaead").unwrap();
            let mut buf = vec![0u8; block];
            let e = m
                .read_at(8 * 512, &mut buf)
                .expect_err(&format!("{name}: flipped {what} bit must fail"));
            assert_eq!(common::errno(&e), libc::EILSEQ, "{name} {what}");
            assert_eq!(integrity_errors(&reg), 1, "{name} {what}");
            // The neighbours are intact.
            m.read_at(8 * 512 + block as u64, &mut buf)
                .unwrap_or_else(|e| panic!("{name} {what}: next block: {e}"));
            m.read_at(0, &mut buf[..block])
                .unwrap_or_else(|e| panic!("{name} {what}: block 0: {e}"));
            drop(m);
            drop(reg);
        }
        std::fs::write(&img, &pristine).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn direct_and_bitmap_modes_share_the_format() {
    let dir = common::temp_dir("aead-modes");
    let name = "gcm-random";
    let want = pattern("pattern", 256 << 10);
    let p2 = pattern("pattern2", 64 << 10);
    for mode in ["D", "B"] {
        let img = common::unpack_fixture(FIXTURE_SET, name, &dir);
        let reg = Registry::new();
        open(&reg, name, &img, Some(mode));
        let m = reg.get("kaead").unwrap();
        let mut got = vec![0u8; want.len()];
        m.read_at(0, &mut got).unwrap();
        assert!(got == want, "{mode}: kernel pattern");
        m.write_at(128 << 10, &p2, WriteFlags::default()).unwrap();
        drop(m);
        close(&reg);
        // Back in journal mode, what D/B wrote (data and tags in place) verifies.
        let reg = Registry::new();
        open(&reg, name, &img, None);
        let m = reg.get("kaead").unwrap();
        let mut got = vec![0u8; p2.len()];
        m.read_at(128 << 10, &mut got).unwrap();
        assert!(got == p2, "{mode}: our write");
        m.read_at(0, &mut got).unwrap();
        assert!(got[..] == want[..p2.len()], "{mode}: kernel data kept");
        drop(m);
        close(&reg);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every fixture the round trip can use.
fn all_fixtures() -> Vec<&'static str> {
    FIXTURES
        .iter()
        .map(|f| f.0)
        .chain(DMSETUP_FIXTURES.iter().map(|f| f.0))
        .collect()
}

/// One of each cipher family, sector size and table option, so that the lab test stays
/// under a minute under TCG (roundtrip.sh runs them all).
const LAB_SUBSET: [&str; 10] = [
    "xts-random-hmac-sha256",
    "xts-plain64-hmac-sha256",
    "gcm-random-4k",
    "chacha20-random-poly1305",
    "cbc-essiv-hmac-sha512",
    "d-ccm-random",
    "d-aegis128-random",
    "d-hmac-sha256-xts-plain64-keysize33",
    "d-xts-random-none",
    "d-chacha-plain64-4k-large",
];

/// Writes pattern2 (128 KiB) at offset 0 of the named kernel images through the kernel's
/// tables and leaves `ours-NAME.img` in `out` for the kernel to read back.
fn write_ours(out: &Path, names: &[&str]) {
    std::fs::create_dir_all(out).unwrap();
    let p2 = pattern("pattern2", 128 << 10);
    for &name in names {
        let img = common::unpack_fixture(FIXTURE_SET, name, out);
        let ours = out.join(format!("ours-{name}.img"));
        std::fs::rename(&img, &ours).unwrap();
        let reg = Registry::new();
        open(&reg, name, &ours, None);
        let m = reg.get("kaead").unwrap();
        // In two requests, the second FUA, like a file system's journal commit.
        m.write_at(0, &p2[..64 << 10], WriteFlags::default())
            .unwrap();
        m.write_at(64 << 10, &p2[64 << 10..], WriteFlags { fua: true })
            .unwrap();
        let mut got = vec![0u8; p2.len()];
        m.read_at(0, &mut got).unwrap();
        assert!(got == p2, "{name}");
        drop(m);
        close(&reg);
    }
    std::fs::write(out.join("pattern.bin"), pattern("pattern", 256 << 10)).unwrap();
    std::fs::write(out.join("pattern2.bin"), &p2).unwrap();
    std::fs::write(out.join("pass.key"), "cryptblk-aead-fixture").unwrap();
    std::fs::copy(
        common::fixture_dir(FIXTURE_SET).join("lab-guest-dmsetup.sh"),
        out.join("lab-guest-dmsetup.sh"),
    )
    .unwrap();
    // The guest rebuilds the dmsetup stacks from their recorded tables.
    for (name, _) in DMSETUP_FIXTURES {
        let t = format!("{name}.tables");
        std::fs::copy(common::fixture_dir(FIXTURE_SET).join(&t), out.join(&t)).unwrap();
    }
}

/// For roundtrip.sh: `write_ours` into `$CRYPTBLK_FIXTURE_OUT`.
#[test]
#[ignore]
fn write_images_for_kernel() {
    let out = PathBuf::from(
        std::env::var("CRYPTBLK_FIXTURE_OUT").expect("set CRYPTBLK_FIXTURE_OUT to a directory"),
    );
    write_ours(&out, &all_fixtures());
}

/// cryptblk -> kernel in the lab VM (under a minute under TCG): cryptblk writes pattern2
/// through the kernel's table lines into copies of [`LAB_SUBSET`], then the real kernel
/// opens each with `cryptsetup open` (lab-guest.sh) and must read pattern2 and, after it,
/// the kernel's own pattern unchanged. Skipped only with CRYPTBLK_SKIP_LAB=1; a lab that is
/// missing or cannot boot fails the test.
#[test]
fn lab_kernel_reads_what_cryptblk_wrote() {
    if std::env::var("CRYPTBLK_SKIP_LAB").as_deref() == Ok("1") {
        eprintln!("SKIPPED: kernel lab round trip (CRYPTBLK_SKIP_LAB=1)");
        return;
    }
    // tests/lab/vm.sh: the lab's run-in-vm.sh (LAB_DIR or ../shared/lab) that boots again
    // when the guest kernel dies before the script runs; it fails when the lab is missing.
    let runner = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/lab/vm.sh"
    ));
    let share = common::temp_dir("aead-lab");
    write_ours(&share, &LAB_SUBSET);
    let out = Command::new(&runner)
        .arg(common::fixture_dir(FIXTURE_SET).join("lab-guest.sh"))
        .env("LAB_SHARE", &share)
        .env("LAB_TIMEOUT", "600")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", runner.display()));
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "lab failed ({}):\n{log}", out.status);
    let results = std::fs::read_to_string(share.join("results.txt"))
        .unwrap_or_else(|e| panic!("no results.txt from the guest ({e}):\n{log}"));
    eprintln!("{results}");
    let checks = std::fs::read_to_string(share.join("results-dmsetup-check.txt"))
        .unwrap_or_else(|e| panic!("no dmsetup-stack verdicts ({e}):\n{log}"));
    eprintln!("{checks}");
    for name in LAB_SUBSET {
        let (verdicts, want) = if name.starts_with("d-") {
            (
                &checks,
                format!("ours-{name} pattern2=OK kernel_pattern_after_it=OK"),
            )
        } else {
            (
                &results,
                format!("ours-{name}.img pattern2=OK kernel_pattern_after_it=OK"),
            )
        };
        assert!(
            verdicts.lines().any(|l| *l == want),
            "kernel verdict for {name} missing or bad:\n{results}\n{checks}"
        );
    }
    let _ = std::fs::remove_dir_all(&share);
}
