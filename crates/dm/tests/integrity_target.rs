//! The `integrity` target: sizes against cryptsetup's integrity-compat-test numbers,
//! superblocks read back by the real `integritysetup dump`, tags checked by an independent
//! Python reader of the on-disk layout, tamper detection (EILSEQ), and J/D round trips.
//! Set CRYPTBLK_SKIP_INTEGRITYSETUP=1 / CRYPTBLK_SKIP_PYTHON=1 to skip those parts
//! explicitly when the tools are missing.

mod common;

use common::MemDisk;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::integrity::layout::Layout;
use cryptblk_dm::targets::integrity::superblock::FLAG_FIXED_PADDING;
use cryptblk_dm::targets::integrity::{IntegrityConfig, IntegrityMode, IntegrityTarget};
use cryptblk_dm::{BlockDevice, FileBacking, FileOptions, Registry, Target, WriteFlags};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

const MIB32: u64 = 32 << 20;

fn cfg(mode: IntegrityMode, hash: &str, bs: u32) -> IntegrityConfig {
    IntegrityConfig {
        block_size: bs,
        ..IntegrityConfig::new(mode, hash)
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// vectors.md 2A: exposed sectors of a 32 MiB device formatted by integritysetup with
/// `--integrity-legacy-padding` (tag size, block size, sectors).
#[test]
fn provided_sectors_match_integrity_compat_test() {
    let rows: [(&str, Option<u32>, u32, u64); 12] = [
        ("blake2s-256", Some(32), 512, 60992),
        ("blake2b-256", Some(32), 512, 60992),
        ("crc32c", None, 512, 64664),
        ("crc32", Some(4), 512, 64664),
        ("xxhash64", Some(8), 512, 64152),
        ("sha1", None, 512, 62552),
        ("sha1", Some(16), 4096, 64688),
        ("sha256", None, 512, 60992),
        ("hmac(sha256)", None, 512, 60992),
        ("sha256", None, 4096, 64752),
        ("hmac(sha256)", None, 4096, 64752),
        ("crc32c", None, 4096, 65072), // recalc_test: default (fixed) padding
    ];
    for (i, (hash, tag, bs, want)) in rows.into_iter().enumerate() {
        let fixed = i == 11;
        let supported = !hash.starts_with("blake") && hash != "crc32" && hash != "xxhash64";
        if supported {
            let disk = MemDisk::new(MIB32);
            let mut c = cfg(IntegrityMode::Journal, hash, bs);
            c.tag_size = tag;
            c.fix_padding = fixed;
            if hash.starts_with("hmac") {
                c.internal_hash_key = Some(SecretBytes::from_slice(&[7u8; 32]));
            }
            let sb = IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), false).unwrap();
            assert_eq!(sb.provided_data_sectors, want, "{hash} bs {bs}");
            let t = IntegrityTarget::open(disk, "mem", None, c, None).unwrap();
            assert_eq!(t.size(), want * 512);
        } else {
            // Hashes cryptblk cannot compute still have a defined layout.
            let flags = if fixed { FLAG_FIXED_PADDING } else { 0 };
            let l = Layout::for_new_device(
                0,
                false,
                bs / 512,
                tag.unwrap(),
                flags,
                512,
                32768,
                65536,
                65536,
            )
            .unwrap();
            assert_eq!(l.provided_data_sectors, want, "{hash} bs {bs}");
        }
    }
    // Separate metadata device: the whole 32 MiB data device is exposed.
    let data = MemDisk::new(MIB32);
    let meta = MemDisk::new(MIB32);
    let sb = IntegrityTarget::format(
        data,
        "data",
        Some(meta),
        cfg(IntegrityMode::Journal, "crc32c", 512),
        false,
    )
    .unwrap();
    assert_eq!(sb.provided_data_sectors, 65536);
}

fn tool(name: &str, skip_var: &str) -> bool {
    if Command::new(name)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        return true;
    }
    if std::env::var(skip_var).as_deref() == Ok("1") {
        eprintln!("{name} missing: skipped because {skip_var}=1");
        return false;
    }
    panic!("{name} not found (set {skip_var}=1 to skip)");
}

struct TempFile(PathBuf);
impl TempFile {
    fn new(tag: &str, len: u64) -> Self {
        let p =
            std::env::temp_dir().join(format!("cryptblk-integrity-{tag}-{}", std::process::id()));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(len).unwrap();
        TempFile(p)
    }
    fn open(&self) -> Arc<dyn BlockDevice> {
        Arc::new(FileBacking::open(&self.0, FileOptions::default()).unwrap())
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn dump_field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(name).map(|r| r.trim().to_string()))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn integritysetup_dump_reads_our_superblocks() {
    if !tool("integritysetup", "CRYPTBLK_SKIP_INTEGRITYSETUP") {
        return;
    }
    let cases = [
        ("crc32c", 512u32, false, false, "1"),
        ("sha256", 4096, true, false, "4"),
        ("hmac(sha256)", 512, true, true, "5"),
    ];
    for (n, (hash, bs, fix_padding, fix_hmac, version)) in cases.into_iter().enumerate() {
        let f = TempFile::new(&format!("dump{n}"), MIB32);
        let mut c = cfg(IntegrityMode::Journal, hash, bs);
        c.fix_padding = fix_padding;
        c.fix_hmac = fix_hmac;
        if hash.starts_with("hmac") {
            c.internal_hash_key = Some(SecretBytes::from_slice(&[9u8; 32]));
        }
        let sb = IntegrityTarget::format(f.open(), "f", None, c, false).unwrap();
        let out = Command::new("integritysetup")
            .arg("dump")
            .arg(&f.0)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "integritysetup dump failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(dump_field(&text, "superblock_version"), version);
        assert_eq!(
            dump_field(&text, "integrity_tag_size"),
            sb.integrity_tag_size.to_string()
        );
        assert_eq!(
            dump_field(&text, "journal_sections"),
            sb.journal_sections.to_string()
        );
        assert_eq!(
            dump_field(&text, "provided_data_sectors"),
            sb.provided_data_sectors.to_string()
        );
        assert_eq!(dump_field(&text, "sector_size"), bs.to_string());
        assert_eq!(dump_field(&text, "log2_interleave_sectors"), "15");
        assert_eq!(
            dump_field(&text, "log2_blocks_per_bitmap"),
            sb.log2_blocks_per_bitmap_bit.to_string()
        );
        let flags = dump_field(&text, "flags");
        assert_eq!(flags.contains("fix_padding"), fix_padding, "{flags}");
        assert_eq!(flags.contains("fix_hmac"), fix_hmac, "{flags}");
    }
}

/// An independent Python reader of the dm-integrity layout (kernel formulas) checks
/// every sha256 tag of a device cryptblk wrote; returns (ok, bad) block counts.
fn python_check(path: &PathBuf) -> (u64, u64) {
    const SCRIPT: &str = r#"
import hashlib, struct, sys
img = open(sys.argv[1], 'rb').read()
magic, ver, l2il, tag, jsec, provided, flags, l2spb = struct.unpack_from('<8sBBHIQIB', img, 0)
assert magic == b'integrt\0'
spb = 1 << l2spb
entry = (8 + 8 * spb + tag + 7) // 8 * 8
per_sector = 504 // entry
sec_entries = per_sector * 8
sec_sectors = sec_entries * spb + 8
initial = 8 + jsec * sec_sectors
pad = 4096 if flags & 8 else 512 << 8
run_bytes = tag << (l2il - l2spb)
run = (run_bytes + pad - 1) // pad * pad // 512
il = 1 << l2il
salt = img[48:64] if flags & 0x10 else b''
ok = bad = 0
for s in range(0, provided, spb):
    area, off = s >> l2il, s & (il - 1)
    data_at = (area * il + (area + 1) * run + initial + off) * 512
    tag_at = (initial + area * il + area * run) * 512 + (off >> l2spb) * tag
    block = img[data_at:data_at + 512 * spb]
    want = hashlib.sha256(salt + struct.pack('<Q', s) + block).digest()[:tag]
    if img[tag_at:tag_at + tag] == want: ok += 1
    else: bad += 1
print(ok, bad)
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace().map(|w| w.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

#[test]
fn tags_on_disk_match_an_independent_reader() {
    if !tool("python3", "CRYPTBLK_SKIP_PYTHON") {
        return;
    }
    for (n, (bs, fix_padding, fix_hmac, mode)) in [
        (512u32, false, false, IntegrityMode::Journal),
        (4096, true, true, IntegrityMode::Journal),
        (1024, true, false, IntegrityMode::Direct),
    ]
    .into_iter()
    .enumerate()
    {
        // 24 MiB: two interleave areas, so area boundaries are crossed.
        let f = TempFile::new(&format!("py{n}"), 24 << 20);
        let mut c = cfg(mode, "sha256", bs);
        c.fix_padding = fix_padding;
        c.fix_hmac = fix_hmac;
        IntegrityTarget::format(f.open(), "f", None, c.clone(), true).unwrap();
        let t = IntegrityTarget::open(f.open(), "f", None, c, None).unwrap();
        let size = t.size();
        // Writes straddling the first area boundary (sector 32768) and scattered ones.
        let mut at = 32768 * 512 - 3 * bs as u64;
        for k in 0..20u64 {
            let len = bs as usize * (1 + (k as usize % 7));
            if at + len as u64 > size {
                at = bs as u64 * k;
            }
            t.write_at(at, &pattern(len, k + 1), WriteFlags::default())
                .unwrap();
            at += len as u64 + bs as u64 * 97;
        }
        t.flush().unwrap();
        drop(t);
        let (ok, bad) = python_check(&f.0);
        assert_eq!(bad, 0, "case {n}");
        assert_eq!(ok * bs as u64, size, "case {n}");
    }
}

/// A flipped bit in the journal's copy of a block (committed by a flush, not yet retired by
/// a clean close) is caught when the journal is replayed on open: as in the kernel ("tag
/// mismatch when replaying journal"), the device then fails its I/O rather than return the
/// damaged block, and no read returns wrong data.
#[test]
fn tampered_journal_entry_fails_reads_after_replay() {
    let disk = MemDisk::new(8 << 20);
    let c = cfg(IntegrityMode::Journal, "crc32c", 512);
    IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), true).unwrap();
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let data = pattern(64 * 512, 5);
    t.write_at(0, &data, WriteFlags::default()).unwrap();
    t.flush().unwrap();
    let l = t.layout().clone();
    // No close: as after a power cut, the committed journal sections are replayed on open.
    drop(t);
    let image = disk.image();
    let journal = l.journal_offset() as usize..l.journal_offset() as usize + l.journal_bytes();
    // Journal sectors keep the commit id in their last 8 bytes (the kernel's format), so
    // look for the block's first 504 bytes.
    let block = &data[10 * 512..10 * 512 + 504];
    let at = image[journal.clone()]
        .windows(504)
        .position(|w| w == block)
        .map(|p| journal.start + p)
        .expect("the flushed block is in the journal");
    disk.flip(at as u64 + 7, 0x10);
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c, None).unwrap();
    let mut b = vec![0u8; 512];
    assert!(
        t.read_at(10 * 512, &mut b).is_err(),
        "damaged block read back"
    );
    for i in 0..64 {
        if t.read_at(i * 512, &mut b).is_ok() {
            assert_eq!(
                b,
                data[i as usize * 512..(i as usize + 1) * 512],
                "sector {i}"
            );
        }
    }
}

#[test]
fn tampering_fails_reads_with_eilseq() {
    let disk = MemDisk::new(8 << 20);
    let c = cfg(IntegrityMode::Journal, "crc32c", 512);
    IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), true).unwrap();
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let data = pattern(64 * 512, 3);
    t.write_at(0, &data, WriteFlags::default()).unwrap();
    t.flush().unwrap();
    let l = t.layout().clone();
    // A clean shutdown empties the journal; otherwise reopening would replay the
    // committed sections and rewrite (heal) the blocks flipped below.
    t.close().unwrap();
    drop(t);

    // A flipped data bit in sector 10.
    disk.flip(l.data_sector(10) * 512 + 100, 0x04);
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let mut b = vec![0u8; 512];
    assert_eq!(
        errno(&t.read_at(10 * 512, &mut b).unwrap_err()),
        libc::EILSEQ
    );
    let mut big = vec![0u8; 32 * 512];
    assert_eq!(errno(&t.read_at(0, &mut big).unwrap_err()), libc::EILSEQ);
    t.read_at(11 * 512, &mut b).unwrap();
    assert_eq!(b, data[11 * 512..12 * 512]);
    assert_eq!(t.mismatches(), 2);
    assert!(t.status_params().starts_with("2 "));
    // Rewriting the block heals it.
    t.write_at(
        10 * 512,
        &data[10 * 512..11 * 512],
        WriteFlags { fua: true },
    )
    .unwrap();
    t.read_at(10 * 512, &mut b).unwrap();
    assert_eq!(b, data[10 * 512..11 * 512]);
    drop(t);

    // A flipped tag byte of sector 20.
    disk.flip(l.tag_position(20) + 1, 0x80);
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    assert_eq!(
        errno(&t.read_at(20 * 512, &mut b).unwrap_err()),
        libc::EILSEQ
    );
    t.read_at(19 * 512, &mut b).unwrap();
    assert_eq!(b, data[19 * 512..20 * 512]);

    // Recovery mode reads without checking and refuses writes.
    let r = IntegrityTarget::open(
        disk.clone(),
        "mem",
        None,
        IntegrityConfig {
            mode: IntegrityMode::Recovery,
            ..c.clone()
        },
        None,
    )
    .unwrap();
    r.read_at(20 * 512, &mut b).unwrap();
    assert_eq!(b, data[20 * 512..21 * 512]);
    assert_eq!(
        errno(&r.write_at(0, &b, WriteFlags::default()).unwrap_err()),
        libc::EROFS
    );

    // Without a wipe, never-written blocks fail their (all-zero) tags.
    let raw = MemDisk::new(4 << 20);
    IntegrityTarget::format(raw.clone(), "raw", None, c.clone(), false).unwrap();
    let t = IntegrityTarget::open(raw, "raw", None, c, None).unwrap();
    assert_eq!(errno(&t.read_at(0, &mut b).unwrap_err()), libc::EILSEQ);
    t.write_at(0, &b, WriteFlags::default()).unwrap();
    t.read_at(0, &mut b).unwrap(); // served from the journal before commit
    t.flush().unwrap();
    t.read_at(0, &mut b).unwrap();
}

#[test]
fn hmac_key_and_salt_matter() {
    let disk = MemDisk::new(4 << 20);
    let mut c = cfg(IntegrityMode::Direct, "hmac(sha256)", 4096);
    c.internal_hash_key = Some(SecretBytes::from_slice(b"0123456789abcdef0123456789abcdef"));
    c.fix_hmac = true;
    IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), true).unwrap();
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let data = pattern(8192, 5);
    t.write_at(4096, &data, WriteFlags { fua: true }).unwrap();
    drop(t);
    // The same key reads; another key sees every block as corrupt.
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let mut b = vec![0u8; 8192];
    t.read_at(4096, &mut b).unwrap();
    assert_eq!(b, data);
    let mut other = c.clone();
    other.internal_hash_key = Some(SecretBytes::from_slice(b"another key, same length........"));
    let t = IntegrityTarget::open(disk, "mem", None, other, None).unwrap();
    assert_eq!(errno(&t.read_at(4096, &mut b).unwrap_err()), libc::EILSEQ);
    // Missing key is refused at load time.
    let mut nokey = c;
    nokey.internal_hash_key = None;
    assert!(IntegrityTarget::open(MemDisk::new(4 << 20), "x", None, nokey, None).is_err());
}

#[test]
fn table_lines_through_the_registry() {
    let f = TempFile::new("table", 16 << 20);
    let reg = Registry::new();
    let path = f.0.display().to_string();
    // Loading over a zeroed superblock formats, as the kernel does.
    let m = reg
        .create("it", &format!("0 8 integrity {path} 0 - J 4 block_size:4096 fix_padding fix_hmac internal_hash:sha256"))
        .unwrap();
    let table = m.table(false).as_str().to_owned();
    assert!(
        table.contains("integrity")
            && table.contains("internal_hash:sha256")
            && table.contains("fix_hmac"),
        "{table}"
    );
    let mut b = vec![1u8; 4096];
    m.write_at(0, &b, WriteFlags::default()).unwrap();
    m.flush().unwrap();
    drop(m);
    reg.remove("it").unwrap();
    let m = reg
        .create("it", &format!("0 8 integrity {path} 0 32 J 4 block_size:4096 fix_padding fix_hmac internal_hash:sha256"))
        .unwrap();
    b.fill(0);
    m.read_at(0, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 1));
    drop(m);
    reg.remove("it").unwrap();
    // Mismatching parameters are refused like the kernel refuses them.
    assert!(reg
        .create(
            "bad",
            &format!("0 8 integrity {path} 0 - J 2 block_size:512 internal_hash:sha256")
        )
        .is_err());
    assert!(reg
        .create(
            "bad",
            &format!("0 8 integrity {path} 0 4 J 1 internal_hash:sha256")
        )
        .is_err());
    assert!(reg
        .create(
            "bad",
            &format!("0 8 integrity {path} 0 - X 1 internal_hash:sha256")
        )
        .is_err());
    // A device with foreign data in the superblock area is not formatted over.
    let g = TempFile::new("table2", 4 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&g.0)
        .unwrap()
        .write_all_at(b"junk", 100)
        .unwrap();
    assert!(reg
        .create(
            "junk",
            &format!(
                "0 8 integrity {} 0 - J 1 internal_hash:crc32c",
                g.0.display()
            )
        )
        .is_err());
}

#[test]
fn bitmap_mode_round_trip_and_mode_switch() {
    let disk = MemDisk::new(8 << 20);
    let b = cfg(IntegrityMode::Bitmap, "sha256", 512);
    IntegrityTarget::format(disk.clone(), "mem", None, b.clone(), true).unwrap();
    let t = IntegrityTarget::open(disk.clone(), "mem", None, b.clone(), None).unwrap();
    let sb = t.superblock();
    assert_eq!(sb.version, 3, "bitmap mode writes version 3");
    assert!(sb.flags & cryptblk_dm::targets::integrity::superblock::FLAG_DIRTY_BITMAP != 0);
    let data = pattern(96 * 512, 8);
    t.write_at(512 * 40, &data, WriteFlags::default()).unwrap();
    // No flush, no close: a crash with dirty bits. Simulate torn tags by corrupting the
    // tag of a written block; the dirty region's tags are recalculated on open.
    let l = t.layout().clone();
    drop(t);
    disk.flip(l.tag_position(41), 0xff);
    // Opened in journal mode, the dirty bitmap forces a full recalculation.
    let j = IntegrityTarget::open(
        disk.clone(),
        "mem",
        None,
        cfg(IntegrityMode::Journal, "sha256", 512),
        None,
    )
    .unwrap();
    let mut got = vec![0u8; data.len()];
    j.read_at(512 * 40, &mut got).unwrap();
    assert_eq!(got, data);
    assert_eq!(j.superblock().flags & 0x4, 0, "dirty_bitmap cleared");
    j.close().unwrap();
    drop(j);
    // Clean bitmap-mode close leaves nothing dirty: a tampered tag is now detected.
    let t = IntegrityTarget::open(disk.clone(), "mem", None, b.clone(), None).unwrap();
    t.close().unwrap();
    drop(t);
    disk.flip(l.tag_position(42), 0x01);
    let t = IntegrityTarget::open(disk, "mem", None, b, None).unwrap();
    let mut blk = vec![0u8; 512];
    assert_eq!(
        errno(&t.read_at(42 * 512, &mut blk).unwrap_err()),
        libc::EILSEQ
    );
}

/// `journal_watermark`: unflushed journaled writes are committed once they fill that share of
/// the journal, so after a crash without any flush they are there; with the watermark at 100%
/// the same writes are still only in memory and the crash loses them (the block reads as it
/// was before).
#[test]
fn journal_watermark_commits_unflushed_writes() {
    for (watermark, survives) in [(25u32, true), (100, false)] {
        let disk = MemDisk::new(8 << 20);
        let c = IntegrityConfig {
            journal_watermark: watermark,
            ..cfg(IntegrityMode::Journal, "crc32c", 512)
        };
        IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), true).unwrap();
        let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
        // 40% of the journal's entries, one block per write, no flush.
        let blocks = t.layout().journal_entries() as u64 * 2 / 5;
        let data = pattern(blocks as usize * 512, 9);
        for (k, block) in data.chunks(512).enumerate() {
            t.write_at(k as u64 * 512, block, WriteFlags::default())
                .unwrap();
        }
        drop(t); // a crash: no flush, no close
        let t = IntegrityTarget::open(disk.clone(), "mem", None, c, None).unwrap();
        let mut b = vec![0u8; 512];
        t.read_at(0, &mut b).unwrap();
        if survives {
            assert_eq!(
                b,
                data[..512],
                "watermark {watermark}%: committed write lost"
            );
        } else {
            assert!(
                b.iter().all(|&x| x == 0),
                "watermark {watermark}%: write survived"
            );
        }
    }
}

/// `write_zeroes` through the target stores zeros with valid tags (they read back after a
/// reopen), and a range past the end is refused before anything is written.
#[test]
fn write_zeroes_tags_zeros_and_refuses_out_of_range() {
    let disk = MemDisk::new(8 << 20);
    let c = cfg(IntegrityMode::Journal, "crc32c", 512);
    IntegrityTarget::format(disk.clone(), "mem", None, c.clone(), true).unwrap();
    let t = IntegrityTarget::open(disk.clone(), "mem", None, c.clone(), None).unwrap();
    let data = pattern(64 * 512, 9);
    t.write_at(0, &data, WriteFlags::default()).unwrap();
    t.write_zeroes(8 * 512, 16 * 512).unwrap();
    let size = t.size();
    let mut tail = vec![0u8; 512];
    t.read_at(size - 512, &mut tail).unwrap();
    assert!(t.write_zeroes(size - 512, 2 * 512).is_err());
    let mut after = vec![0u8; 512];
    t.read_at(size - 512, &mut after).unwrap();
    assert_eq!(
        after, tail,
        "a refused write_zeroes changed the last sector"
    );
    t.flush().unwrap();
    t.close().unwrap();
    drop(t);

    let t = IntegrityTarget::open(disk, "mem", None, c, None).unwrap();
    let mut back = vec![0u8; 64 * 512];
    t.read_at(0, &mut back).unwrap();
    let mut want = data.clone();
    want[8 * 512..24 * 512].fill(0);
    assert_eq!(back, want);
}
