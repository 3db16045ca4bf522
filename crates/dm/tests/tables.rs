//! Table parsing, formatting and the simple targets' semantics.

mod common;

use common::{errno, KEY64};
use cryptblk_dm::{BlockDevice, DmError, Registry, WriteFlags};

fn table_err(reg: &Registry, text: &str) -> (usize, String) {
    match reg.load_table(text) {
        Err(DmError::Table { line, msg }) => (line, msg),
        Err(other) => panic!("expected a line error for {text:?}, got {other}"),
        Ok(_) => panic!("table {text:?} was accepted"),
    }
}

#[test]
fn parse_errors_name_line_and_problem() {
    let reg = Registry::new();
    let cases: &[(&str, usize, &str)] = &[
        ("0 100 linear", 1, "wrong number of arguments"),
        ("0 x linear ram:1M 0", 1, "invalid <length> 'x'"),
        ("0 0 zero", 1, "zero-length"),
        ("0 8 zero\n9 8 zero", 2, "previous one ends at 8"),
        ("# comment\n\n0 8 bogus", 3, "unknown target type 'bogus'"),
        (
            "0 8 linear ram:1M notanumber",
            1,
            "invalid <offset> 'notanumber'",
        ),
        ("0 4096 linear ram:1M 0", 1, "too small"),
        ("0 8 zero extra", 1, "wrong number of arguments"),
        ("0 8 linear nosuchmapping 0", 1, "no mapping by that name"),
        ("0 8 crypt aes-xts-plain64 abc 0 ram:1M 0", 1, "invalid key"),
        (
            "0 8 crypt aes-xts-plain64 :64:logon:cryptsetup:x 0 ram:1M 0",
            1,
            "keyring",
        ),
        (
            &format!("0 8 crypt aes-xts-plain64 {KEY64} 0 ram:1M 0 2 allow_discards"),
            1,
            "<#opt_params> is 2",
        ),
        (
            &format!("0 8 crypt aes-xts-plain64 {KEY64} 0 ram:1M 0 1 bogus_flag"),
            1,
            "invalid feature argument 'bogus_flag'",
        ),
        (
            &format!("0 8 crypt aes-xts-plain64 {KEY64} 0 ram:1M 0 1 sector_size:1000"),
            1,
            "invalid sector_size 1000",
        ),
        (
            &format!("0 12 crypt aes-xts-plain64 {KEY64} 0 ram:1M 0 1 sector_size:4096"),
            1,
            "not a multiple of sector_size",
        ),
        (
            &format!("0 8 crypt aes-xts-plain64 {KEY64} 1 ram:1M 0 1 sector_size:4096"),
            1,
            "iv_offset 1 is not aligned",
        ),
        ("0 8 crypt aes-xts-plain64 0011 0 ram:1M 0", 1, "key size"),
        ("0 8 flakey ram:1M 0 0 0", 1, "interval is zero"),
        (
            "0 8 flakey ram:1M 0 1 1 2 drop_writes",
            1,
            "<#feature_args> is 2",
        ),
        (
            "0 8 flakey ram:1M 0 1 1 1 explode",
            1,
            "unrecognised flakey feature",
        ),
        ("0 8 delay ram:1M 0", 1, "wrong number of arguments"),
    ];
    for (text, line, needle) in cases {
        let (l, msg) = table_err(&reg, text);
        assert_eq!(l, *line, "{text:?}: {msg}");
        assert!(
            msg.contains(needle),
            "{text:?}: message {msg:?} lacks {needle:?}"
        );
    }
    // Keys never appear in error messages.
    let bad_key = format!("{}zz", &KEY64[..62]);
    let (_, msg) = table_err(
        &reg,
        &format!("0 8 crypt aes-xts-plain64 {bad_key} 0 ram:1M 0"),
    );
    assert!(!msg.contains(&KEY64[..20]), "key leaked: {msg}");
    assert!(matches!(
        reg.load_table("\n# nothing\n"),
        Err(DmError::TableShape(_))
    ));
}

#[test]
fn format_round_trips_like_dmsetup() {
    let reg = Registry::new();
    let text = format!(
        "0 2048 crypt aes-xts-plain64 {KEY64} 16 ram:4M 8 3 no_write_workqueue   allow_discards same_cpu_crypt\n\
         2048 2048 linear ram:4M 4096\n\
         4096 8 zero\n\
         4104 8 error\n\
         4112 16 delay ram:4M 0 0 ram:4M 16 1\n\
         4128 16 flakey ram:4M 0 1 0 6 drop_writes corrupt_bio_byte 1 r 7 0\n"
    );
    let t = reg.load_table(&text).unwrap();
    let shown = t.format(true);
    // Options come back in the kernel's order, whitespace normalised.
    let expected = format!(
        "0 2048 crypt aes-xts-plain64 {KEY64} 16 ram:4M 8 3 allow_discards same_cpu_crypt no_write_workqueue\n\
         2048 2048 linear ram:4M 4096\n\
         4096 8 zero\n\
         4104 8 error\n\
         4112 16 delay ram:4M 0 0 ram:4M 16 1\n\
         4128 16 flakey ram:4M 0 1 0 6 drop_writes corrupt_bio_byte 1 r 7 0\n"
    );
    assert_eq!(shown, expected);
    // Reparsing the output gives the same output.
    assert_eq!(reg.load_table(&shown).unwrap().format(true), expected);
    // Without --showkeys the key is zeros of the same length.
    let masked = t.format(false);
    assert!(masked.contains(&format!("aes-xts-plain64 {} 16", "0".repeat(128))));
    assert!(!masked.contains(&KEY64[2..40]));
    // Null cipher keys print as '-'; sector_size and iv_large_sectors are kept.
    let t = reg
        .load_table(
            "0 64 crypt capi:ecb(cipher_null) - 0 ram:1M 0 2 sector_size:4096 iv_large_sectors",
        )
        .unwrap();
    assert_eq!(
        t.format(false),
        "0 64 crypt capi:ecb(cipher_null) - 0 ram:1M 0 2 sector_size:4096 iv_large_sectors\n"
    );
    assert_eq!(t.logical_block_size(), 4096);
}

#[test]
fn linear_zero_error_semantics_across_targets() {
    let reg = Registry::new();
    let base = reg.create("base", "0 2048 linear ram:1M 0").unwrap();
    let pattern: Vec<u8> = (0..1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    base.write_at(0, &pattern, WriteFlags::default()).unwrap();
    // linear at an offset, then zero, then error, then linear again.
    let m = reg
        .create(
            "stack",
            "0 16 linear base 100\n16 8 zero\n24 8 error\n32 16 linear /dev/mapper/base 0",
        )
        .unwrap();
    assert_eq!(m.size(), 48 * 512);
    let mut buf = vec![0xaau8; 16 * 512];
    m.read_at(0, &mut buf).unwrap();
    assert_eq!(buf, pattern[100 * 512..116 * 512]);
    // A read spanning linear + zero is split correctly.
    let mut buf = vec![0xaau8; 12 * 512];
    m.read_at(12 * 512, &mut buf).unwrap();
    assert_eq!(buf[..4 * 512], pattern[112 * 512..116 * 512]);
    assert!(buf[4 * 512..].iter().all(|&b| b == 0));
    // Writes to zero vanish; reads stay zero.
    m.write_at(16 * 512, &[0x55u8; 4096], WriteFlags::default())
        .unwrap();
    let mut z = vec![1u8; 4096];
    m.read_at(16 * 512, &mut z).unwrap();
    assert!(z.iter().all(|&b| b == 0));
    // Error target: EIO, for reads, writes and requests touching it.
    let mut e = vec![0u8; 512];
    assert_eq!(errno(&m.read_at(24 * 512, &mut e).unwrap_err()), libc::EIO);
    assert_eq!(
        errno(&m.write_at(24 * 512, &e, WriteFlags::default()).unwrap_err()),
        libc::EIO
    );
    let mut span = vec![0u8; 4096];
    assert_eq!(
        errno(&m.read_at(20 * 512, &mut span).unwrap_err()),
        libc::EIO
    );
    // The last linear reaches the start of base.
    let mut tail = vec![0u8; 512];
    m.read_at(32 * 512, &mut tail).unwrap();
    assert_eq!(tail, pattern[..512]);
    // Writes through the stack land in base.
    m.write_at(0, &[7u8; 512], WriteFlags::default()).unwrap();
    base.read_at(100 * 512, &mut tail).unwrap();
    assert_eq!(tail, [7u8; 512]);
}

#[test]
fn out_of_range_and_misaligned_fail_without_side_effects() {
    let reg = Registry::new();
    let raw = reg.create("raw", "0 2048 linear ram:1M 0").unwrap();
    let m = reg
        .create(
            "c",
            &format!("0 2048 crypt aes-xts-plain64 {KEY64} 0 raw 0 1 sector_size:4096"),
        )
        .unwrap();
    let before = {
        let mut b = vec![0u8; 1 << 20];
        raw.read_at(0, &mut b).unwrap();
        b
    };
    let data = vec![0x11u8; 8192];
    let cases: &[(u64, usize, i32)] = &[
        (1 << 20, 4096, libc::EIO),          // at the end
        ((1 << 20) - 4096, 8192, libc::EIO), // straddles the end
        (512, 4096, libc::EINVAL),           // not 4 KiB aligned (sector_size:4096)
        (0, 1000, libc::EINVAL),             // not a sector multiple
        (u64::MAX - 511, 512, libc::EIO),    // overflow
    ];
    for &(off, len, code) in cases {
        let e = m
            .write_at(off, &data[..len], WriteFlags::default())
            .unwrap_err();
        assert_eq!(errno(&e), code, "write at {off} len {len}");
        let mut rb = vec![0u8; len];
        let e = m.read_at(off, &mut rb).unwrap_err();
        assert_eq!(errno(&e), code, "read at {off} len {len}");
    }
    assert_eq!(errno(&m.discard(0, 4096).unwrap_err()), libc::EOPNOTSUPP);
    let mut after = vec![0u8; 1 << 20];
    raw.read_at(0, &mut after).unwrap();
    assert!(before == after, "a failed request changed the device");
    let reads_before = {
        let mut b = vec![0u8; 4096];
        raw.read_at(0, &mut b).unwrap();
        b
    };
    assert_eq!(reads_before, before[..4096]);
}

#[test]
fn registry_stacking_busy_and_cycles() {
    let reg = Registry::new();
    reg.create("a", "0 64 linear ram:64K 0").unwrap();
    reg.create("b", "0 64 linear a 0").unwrap();
    assert!(matches!(
        reg.create("a", "0 8 zero"),
        Err(DmError::MappingExists(_))
    ));
    assert_eq!(reg.list(), vec!["a".to_string(), "b".to_string()]);
    // a cannot be removed while b stacks on it.
    match reg.remove("a") {
        Err(DmError::Busy(name, why)) => {
            assert_eq!(name, "a");
            assert!(why.contains('b'), "{why}");
        }
        other => panic!("expected busy, got {other:?}"),
    }
    // Making a stack on b would be a cycle.
    let err = reg.reload("a", "0 64 linear b 0").unwrap_err();
    assert!(err.to_string().contains("depend on itself"), "{err}");
    let err = reg.reload("a", "0 64 linear a 0").unwrap_err();
    assert!(err.to_string().contains("depend on itself"), "{err}");
    reg.remove("b").unwrap();
    reg.remove("a").unwrap();
    assert!(reg.list().is_empty());
    assert!(matches!(reg.remove("a"), Err(DmError::NoSuchMapping(_))));
    // Invalid names.
    assert!(reg.create("x/y", "0 8 zero").is_err());
}

#[test]
fn same_ram_spec_is_the_same_device_while_in_use() {
    let reg = Registry::new();
    let m = reg.create("r", "0 64 linear ram:64K 0").unwrap();
    m.write_at(0, &[9u8; 512], WriteFlags::default()).unwrap();
    // A reload naming the same RAM disk keeps its contents; a tagged one is distinct.
    reg.replace_table("r", "0 64 linear ram:64K 0").unwrap();
    let mut b = [0u8; 512];
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, [9u8; 512]);
    reg.replace_table("r", "0 64 linear ram:64K#other 0")
        .unwrap();
    m.read_at(0, &mut b).unwrap();
    assert_eq!(b, [0u8; 512]);
}
