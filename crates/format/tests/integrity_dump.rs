//! `integrity dump` against the real `integritysetup dump`: superblocks built byte by byte
//! by Python's `struct` (an independent encoder) are decoded by cryptblk and printed
//! exactly as integritysetup prints them. Set CRYPTBLK_SKIP_INTEGRITYSETUP=1 to skip
//! explicitly when the tool is missing.

use cryptblk_format::integrity::IntegritySuperblock;
use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

fn tools() -> bool {
    let ok = |t: &str| {
        Command::new(t)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if ok("integritysetup") && ok("python3") {
        return true;
    }
    if std::env::var("CRYPTBLK_SKIP_INTEGRITYSETUP").as_deref() == Ok("1") {
        eprintln!("integritysetup/python3 missing: skipped because CRYPTBLK_SKIP_INTEGRITYSETUP=1");
        return false;
    }
    panic!("integritysetup or python3 not found (set CRYPTBLK_SKIP_INTEGRITYSETUP=1 to skip)");
}

/// (version, log2_interleave, tag, journal_sections, provided, flags, log2_spb,
/// log2_bpbb, recalc_sector)
type Case = (u8, u8, u16, u32, u64, u32, u8, u8, u64);

const CASES: [Case; 5] = [
    (1, 15, 32, 5, 60992, 0, 0, 15, 0),
    (4, 15, 4, 2, 64664, 0x8, 0, 15, 0),
    (5, 15, 32, 1, 64752, 0x18, 3, 12, 0),
    (5, 14, 16, 3, 1234568, 0x1f, 1, 14, 777),
    (2, 0, 8, 7, 65536, 0x2, 2, 13, 4096),
];

#[test]
fn dump_matches_integritysetup() {
    if !tools() {
        return;
    }
    let dir = std::env::temp_dir();
    for (n, c) in CASES.iter().enumerate() {
        let path: PathBuf = dir.join(format!("cryptblk-intdump-{}-{n}", std::process::id()));
        let script = format!(
            "import struct,sys\nsb=b'integrt\\0'+struct.pack('<BBHIQIBB2xQ8x16s',{},{},{},{},{},{},{},{},{},bytes(range(16)))\nd=bytearray(1<<20)\nd[:len(sb)]=sb\nopen(sys.argv[1],'wb').write(d)\n",
            c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, c.8
        );
        let out = Command::new("python3")
            .arg("-c")
            .arg(&script)
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let f = File::open(&path).unwrap();
        let sb = IntegritySuperblock::read(&f, 0).unwrap();
        assert_eq!(
            (
                sb.version,
                sb.log2_interleave_sectors,
                sb.integrity_tag_size,
                sb.journal_sections,
                sb.provided_data_sectors
            ),
            (c.0, c.1, c.2, c.3, c.4)
        );
        assert_eq!(
            (
                sb.flags,
                sb.log2_sectors_per_block,
                sb.log2_blocks_per_bitmap_bit,
                sb.recalc_sector
            ),
            (c.5, c.6, c.7, c.8)
        );
        assert_eq!(sb.salt, core::array::from_fn(|i| i as u8));

        let out = Command::new("integritysetup")
            .arg("dump")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "case {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs = String::from_utf8_lossy(&out.stdout);
        assert_eq!(sb.dump(path.to_str().unwrap()), theirs, "case {n}");
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn non_integrity_devices_are_rejected_by_both() {
    if !tools() {
        return;
    }
    let path = std::env::temp_dir().join(format!("cryptblk-intdump-none-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let f = File::open(&path).unwrap();
    assert!(IntegritySuperblock::read(&f, 0).is_err());
    let ok = Command::new("integritysetup")
        .arg("dump")
        .arg(&path)
        .output()
        .unwrap()
        .status
        .success();
    assert!(!ok);
    let _ = std::fs::remove_file(&path);
}
