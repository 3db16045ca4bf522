//! Typed table lines: every target config prints what it parses from (property-tested on
//! random valid configs), the kernel's own `dmsetup table` lines in the test fixtures parse
//! and print back unchanged, live targets print exactly their config, and the lines the
//! format crate's volumes map to print as cryptsetup loads them.

use std::path::Path;

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_cipher::SecretBytes;
use cryptblk_dm::targets::config::{CorruptBioByte, DelayClassConfig};
use cryptblk_dm::targets::crypt::{CryptIntegrity, IntegrityKind};
use cryptblk_dm::targets::integrity::{IntegrityAlgorithm, IntegrityMode};
use cryptblk_dm::targets::verity::{CorruptionMode, VerityConfig};
use cryptblk_dm::{
    CryptConfig, CryptFlags, CryptKey, DelayConfig, ErrorConfig, FlakeyConfig,
    IntegrityTableConfig, LinearConfig, Registry, TableSpec, TargetConfig, TargetSpec,
    VerityTableConfig, ZeroConfig,
};
use cryptblk_format::integrity::{IntegrityOpenMode, IntegrityParams};
use proptest::prelude::*;

/// Prints `c`, checks the print parses back to `c` and prints the same again.
fn round_trip<C: TargetConfig + PartialEq + std::fmt::Debug>(c: &C) {
    for show in [true, false] {
        let args = c.args(show);
        let back = C::parse(&args).unwrap_or_else(|e| panic!("{:?}: {e}", *args));
        assert_eq!(*back.args(show), *args, "printing is not stable");
        if show {
            assert_eq!(&back, c);
        }
    }
}

// ---- strategies ----

fn device() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_/:.-]{0,15}"
}

fn secret(min: usize, max: usize) -> impl Strategy<Value = SecretBytes> {
    prop::collection::vec(any::<u8>(), min..=max).prop_map(SecretBytes::from_vec)
}

fn crypt_key() -> impl Strategy<Value = CryptKey> {
    prop_oneof![
        secret(1, 64).prop_map(CryptKey::Hex),
        Just(CryptKey::None),
        (any::<u32>(), "[a-z]{1,8}", "[a-z0-9:-]{1,24}").prop_map(|(size, t, d)| {
            CryptKey::Keyring {
                size,
                key_type: t,
                description: d,
            }
        }),
    ]
}

fn crypt_flags() -> impl Strategy<Value = CryptFlags> {
    (
        prop::array::uniform7(any::<bool>()),
        prop::sample::select(vec![512u32, 1024, 2048, 4096]),
        prop::option::of((1u32..=480, any::<bool>())),
        prop::option::of(1u32..=1024),
    )
        .prop_map(
            |(b, sector_size, integrity, integrity_key_size)| CryptFlags {
                allow_discards: b[0],
                same_cpu_crypt: b[1],
                submit_from_crypt_cpus: b[2],
                no_read_workqueue: b[3],
                no_write_workqueue: b[4],
                high_priority: b[6],
                sector_size,
                iv_large_sectors: b[5],
                integrity: integrity.map(|(tuple_size, aead)| CryptIntegrity {
                    tuple_size,
                    kind: if aead {
                        IntegrityKind::Aead
                    } else {
                        IntegrityKind::None
                    },
                }),
                integrity_key_size,
            },
        )
}

fn crypt() -> impl Strategy<Value = CryptConfig> {
    (
        "[a-z0-9():,-]{1,40}",
        crypt_key(),
        any::<u64>(),
        device(),
        any::<u64>(),
        crypt_flags(),
    )
        .prop_map(
            |(cipher, key, iv_offset, device, offset, flags)| CryptConfig {
                cipher,
                key,
                iv_offset,
                device,
                offset,
                flags,
            },
        )
}

fn linear() -> impl Strategy<Value = LinearConfig> {
    (device(), any::<u64>()).prop_map(|(device, offset)| LinearConfig { device, offset })
}

fn delay_class() -> impl Strategy<Value = DelayClassConfig> {
    (device(), any::<u64>(), any::<u32>()).prop_map(|(device, offset, delay_ms)| DelayClassConfig {
        device,
        offset,
        delay_ms,
    })
}

fn delay() -> impl Strategy<Value = DelayConfig> {
    (
        delay_class(),
        prop::option::of((delay_class(), prop::option::of(delay_class()))),
    )
        .prop_map(|(read, more)| DelayConfig {
            read,
            write: more.as_ref().map(|(w, _)| w.clone()),
            flush: more.and_then(|(_, f)| f),
        })
}

fn flakey() -> impl Strategy<Value = FlakeyConfig> {
    (
        device(),
        any::<u64>(),
        // A zero total interval is refused; a zero up interval with some down one is not.
        (any::<u32>(), 1u32..),
        0u8..3,
        any::<bool>(),
        prop::option::of((1u32.., any::<bool>(), any::<u8>(), any::<u32>())),
    )
        .prop_map(
            |(device, offset, (up, down), writes, error_reads, corrupt)| {
                let mut c = FlakeyConfig::new(&device, offset, up, down);
                c.drop_writes = writes == 1;
                c.error_writes = writes == 2;
                c.error_reads = error_reads;
                c.corrupt = corrupt.map(|(byte, write, value, flags)| CorruptBioByte {
                    byte,
                    write,
                    value,
                    flags,
                });
                c
            },
        )
}

fn verity() -> impl Strategy<Value = VerityTableConfig> {
    let block = prop::sample::select(vec![512u32, 1024, 4096, 65536]);
    (
        (device(), device(), 0u32..=1, block.clone(), block),
        (any::<u64>(), any::<u64>()),
        prop::sample::select(vec!["sha1", "sha256", "sha512"]),
        prop::collection::vec(any::<u8>(), 64),
        prop::collection::vec(any::<u8>(), 0..32),
        (0u8..4, prop::array::uniform3(any::<bool>())),
    )
        .prop_map(
            |((d, h, version, dbs, hbs), (blocks, hash_start), alg, digest, salt, (m, b))| {
                let algorithm = HashAlgorithm::from_name(alg).unwrap();
                VerityTableConfig {
                    data_device: d,
                    hash_device: h,
                    config: VerityConfig {
                        version,
                        data_block_size: dbs,
                        hash_block_size: hbs,
                        num_data_blocks: blocks,
                        hash_start_block: hash_start,
                        root_digest: digest[..algorithm.output_len()].to_vec(),
                        algorithm,
                        salt,
                        mode: [
                            CorruptionMode::Eio,
                            CorruptionMode::Ignore,
                            CorruptionMode::Restart,
                            CorruptionMode::Panic,
                        ][m as usize],
                        restart_on_error: b[0],
                        ignore_zero_blocks: b[1],
                        check_at_most_once: b[2],
                    },
                    fec: None,
                }
            },
        )
}

fn algorithm() -> impl Strategy<Value = Option<IntegrityAlgorithm>> {
    prop::option::of(
        ("[a-z0-9()]{1,16}", prop::option::of(secret(0, 32)))
            .prop_map(|(name, key)| IntegrityAlgorithm { name, key }),
    )
}

fn integrity() -> impl Strategy<Value = IntegrityTableConfig> {
    let n = || prop::option::of(any::<u32>());
    (
        (
            device(),
            any::<u64>(),
            prop::option::of(1u32..),
            0u8..4,
            prop::option::of(device()),
            prop::option::of(prop::sample::select(vec![512u32, 1024, 2048, 4096])),
        ),
        (n(), n(), n(), prop::option::of(0u32..=100), n()),
        (prop::option::of(any::<u64>()), n()),
        prop::array::uniform6(any::<bool>()),
        (algorithm(), algorithm(), algorithm()),
    )
        .prop_map(
            |(
                (device, start, tag_size, m, meta_device, block_size),
                (journal_sectors, interleave_sectors, buffer_sectors, journal_watermark, commit),
                (sectors_per_bit, bitmap_flush_interval),
                b,
                (internal_hash, journal_crypt, journal_mac),
            )| IntegrityTableConfig {
                start,
                tag_size,
                meta_device,
                block_size,
                recalculate: b[0],
                reset_recalculate: b[1],
                allow_discards: b[2],
                journal_sectors,
                interleave_sectors,
                buffer_sectors,
                journal_watermark,
                commit_time: commit,
                sectors_per_bit,
                bitmap_flush_interval,
                fix_padding: b[3],
                fix_hmac: b[4],
                legacy_recalculate: b[5],
                internal_hash,
                journal_crypt,
                journal_mac,
                ..IntegrityTableConfig::new(
                    &device,
                    [
                        IntegrityMode::Journal,
                        IntegrityMode::Direct,
                        IntegrityMode::Bitmap,
                        IntegrityMode::Recovery,
                    ][m as usize],
                )
            },
        )
}

fn target() -> impl Strategy<Value = TargetSpec> {
    prop_oneof![
        linear().prop_map(TargetSpec::from),
        Just(TargetSpec::from(ZeroConfig)),
        Just(TargetSpec::from(ErrorConfig)),
        delay().prop_map(TargetSpec::from),
        flakey().prop_map(TargetSpec::from),
        crypt().prop_map(TargetSpec::from),
        verity().prop_map(TargetSpec::from),
        integrity().prop_map(TargetSpec::from),
    ]
}

proptest! {
    #[test]
    fn linear_round_trips(c in linear()) { round_trip(&c) }

    #[test]
    fn delay_round_trips(c in delay()) { round_trip(&c) }

    #[test]
    fn flakey_round_trips(c in flakey()) { round_trip(&c) }

    #[test]
    fn crypt_round_trips(c in crypt()) { round_trip(&c) }

    #[test]
    fn verity_round_trips(c in verity()) { round_trip(&c) }

    #[test]
    fn integrity_round_trips(c in integrity()) { round_trip(&c) }

    #[test]
    fn tables_round_trip(lines in prop::collection::vec((1u64..1 << 40, target()), 1..6)) {
        let mut t = TableSpec::default();
        for (len, target) in lines {
            t.push(len, target);
        }
        let text = t.to_text(true);
        let back = TableSpec::parse(&text).unwrap();
        prop_assert_eq!(&back, &t);
        prop_assert_eq!(&*back.to_text(true), &*text);
        prop_assert_eq!(&*back.to_text(false), &*t.to_text(false));
    }
}

// ---- the kernel's lines ----

/// Every `<start> <len> crypt|integrity|verity ...` in the fixture files (after any
/// `name: ` prefix), with the `KEY` placeholders of the journal-crypt fixtures filled in.
fn fixture_lines() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = [
        root.join("tests/aead_fixtures"),
        root.join("tests/integrity_fixtures"),
        root.join("tests/integrity_recalc_fixtures"),
        root.join("../cli/tests/fixtures/luks2-integrity"),
    ];
    let mut out = Vec::new();
    for dir in dirs {
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "tables" || e == "table" || e == "txt")
            })
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let mut in_status = false;
            for l in text.lines() {
                if l.starts_with('#') {
                    // `dmsetup status` sections hold status lines, not tables.
                    in_status = l.contains("status");
                    continue;
                }
                let w: Vec<&str> = l.split_whitespace().collect();
                let at = (0..w.len().saturating_sub(2)).find(|&i| {
                    w[i].parse::<u64>().is_ok()
                        && w[i + 1].parse::<u64>().is_ok()
                        && ["crypt", "integrity", "verity"].contains(&w[i + 2])
                });
                if let (Some(i), false) = (at, in_status) {
                    // Log lines may annotate a table: `... (data 7:1, meta 7:0)`.
                    let end = w.iter().position(|t| t.starts_with('(')).unwrap_or(w.len());
                    let line = w[i..end].join(" ").replace(":KEY", ":00112233");
                    out.push((f.display().to_string(), line));
                }
            }
        }
    }
    out
}

#[test]
fn kernel_table_lines_print_back_unchanged() {
    let lines = fixture_lines();
    let mut parsed = 0;
    for (file, line) in &lines {
        let w: Vec<&str> = line.split_whitespace().collect();
        // Status lines in result logs (`<start> <len> integrity <mismatches> <sectors>
        // <recalc_sector|->`, `<start> <len> crypt`) are not tables.
        let status = w.len() <= 3 || (w[2] == "integrity" && w.len() == 6);
        match TableSpec::parse(line) {
            Ok(t) => {
                assert_eq!(*t.to_text(true), format!("{line}\n"), "{file}");
                parsed += 1;
            }
            Err(e) => assert!(status, "{file}: {line}: {e}"),
        }
    }
    // The fixture sets hold dozens of kernel tables; a drop means the scan broke.
    assert!(parsed >= 40, "only {parsed} kernel lines found");
    // Keyring keys stay references, hex keys are masked.
    let keyring = lines
        .iter()
        .find(|(_, l)| l.contains(":logon:"))
        .expect("a keyring line");
    let t = TableSpec::parse(&keyring.1).unwrap();
    assert!(!t.has_inline_keys());
    assert_eq!(*t.to_text(false), format!("{}\n", keyring.1));
}

#[test]
fn test_suite_lines_print_back_unchanged() {
    let key64 = "ab".repeat(64);
    let root = "3f".repeat(32);
    for line in [
        format!("0 2048 crypt aes-xts-plain64 {key64} 16 ram:4M 8 3 allow_discards same_cpu_crypt no_write_workqueue"),
        "0 64 crypt capi:ecb(cipher_null) - 0 ram:1M 0 2 sector_size:4096 iv_large_sectors".into(),
        format!("0 8 crypt capi:gcm(aes)-random {} 0 lin 0 1 integrity:28:aead", "11".repeat(36)),
        "0 8 integrity /p 0 - J 4 block_size:4096 fix_padding fix_hmac internal_hash:sha256".into(),
        "0 8 integrity /p 0 28 J 0".into(),
        format!("0 2048 verity 1 /d /h 4096 4096 256 1 sha256 {root} 0102 1 ignore_zero_blocks"),
        format!("0 4096 verity 1 /d /d 4096 4096 512 513 sha256 {root} aa"),
        "0 8 flakey ram:1M 0 1 1 5 corrupt_bio_byte 32 r 1 0".into(),
        "0 8 delay ram:1M 0 10 ram:2M 8 20".into(),
    ] {
        let t = TableSpec::parse(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(*t.to_text(true), format!("{line}\n"));
    }
}

// ---- live targets print their config ----

#[test]
fn live_tables_print_as_their_spec() {
    let reg = Registry::new();
    let key = SecretBytes::from_slice(&[0x5a; 64]);
    let mut crypt = CryptConfig::new("aes-xts-plain64", CryptKey::Hex(key), 16, "ram:4M", 8);
    crypt.flags = CryptFlags {
        allow_discards: true,
        sector_size: 4096,
        ..CryptFlags::inline()
    };
    let mut spec = TableSpec::single(2048, crypt);
    spec.push(
        8,
        LinearConfig {
            device: "ram:1M".into(),
            offset: 8,
        },
    );
    spec.push(8, ZeroConfig);
    spec.push(8, ErrorConfig);
    let mut flakey = FlakeyConfig::new("ram:1M", 0, 5, 1);
    flakey.error_reads = true;
    spec.push(8, flakey);
    spec.push(
        8,
        DelayConfig {
            read: DelayClassConfig {
                device: "ram:1M".into(),
                offset: 0,
                delay_ms: 0,
            },
            write: None,
            flush: None,
        },
    );
    let m = reg.create("typed", &spec.to_text(true)).unwrap();
    assert_eq!(m.table(true), *spec.to_text(true));
    assert_eq!(m.table(false), *spec.to_text(false));
    assert_eq!(TableSpec::parse(&m.table(true)).unwrap(), spec);
}

#[test]
fn a_spec_loads_as_its_text_does() {
    let reg = Registry::new();
    let spec = TableSpec::single(
        16,
        LinearConfig {
            device: "ram:1M".into(),
            offset: 0,
        },
    );
    let t = cryptblk_dm::Table::load_spec(&spec, &reg).unwrap();
    assert_eq!(t.format(false), *spec.to_text(false));
    let bad = TableSpec::single(1 << 20, ZeroConfig);
    let mut bad_linear = bad.clone();
    bad_linear.lines[0].target = TargetSpec::from(LinearConfig {
        device: "ram:1M".into(),
        offset: 0,
    });
    let e = cryptblk_dm::Table::load_spec(&bad_linear, &reg)
        .err()
        .expect("a linear line past its device is refused")
        .to_string();
    assert!(e.contains("table line 1: linear target:"), "{e}");
}

// ---- the lines of the format crate's volumes ----

#[test]
fn luks2_and_plain_volumes_map_to_cryptsetups_lines() {
    // compatimage2's default segment (format's luks2_images test checks these fields):
    // aes-cbc-essiv:sha256, iv_tweak 0, data at 4 MiB, one sector of a 4_194_816-byte device.
    let vk = SecretBytes::from_vec(hex::decode("d47ee2cdc40f39be9a3e8d72a149cc4d").unwrap());
    let line = |flags: &[&str]| {
        let names: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        let mut c = CryptConfig::new(
            "aes-cbc-essiv:sha256",
            CryptKey::for_cipher("aes-cbc-essiv:sha256", &vk),
            0,
            "/dev/loop0",
            (4 << 20) / 512,
        );
        c.flags = CryptFlags::from_persistent_flags(&names);
        TableSpec::single((4_194_816 - (4 << 20)) / 512, c).to_text(true)
    };
    assert_eq!(
        *line(&[]),
        "0 1 crypt aes-cbc-essiv:sha256 d47ee2cdc40f39be9a3e8d72a149cc4d 0 /dev/loop0 8192\n"
    );
    assert!(line(&["allow-discards", "no-read-workqueue", "no-journal"])
        .ends_with(" 8192 2 allow_discards no_read_workqueue\n"));

    // A plain volume (format's plain tests check its fields).
    let mut c = CryptConfig::new(
        "aes-cbc-essiv:sha256",
        CryptKey::Hex(SecretBytes::from_slice(&[0x11; 32])),
        3,
        "/dev/x",
        8,
    );
    assert_eq!(
        *TableSpec::single(2040, c.clone()).to_text(true),
        format!(
            "0 2040 crypt aes-cbc-essiv:sha256 {} 3 /dev/x 8\n",
            "11".repeat(32)
        )
    );
    c.flags.sector_size = 4096;
    assert!(TableSpec::single(2040, c)
        .to_text(true)
        .ends_with(" 3 /dev/x 8 1 sector_size:4096\n"));
    // The null cipher's key is '-', whatever key bytes it was given.
    assert_eq!(
        CryptKey::for_cipher("cipher_null-ecb", &SecretBytes::from_slice(&[1; 8])),
        CryptKey::None
    );
}

#[test]
fn integritysetup_params_map_to_its_line() {
    let line = |p: &IntegrityParams| {
        IntegrityTableConfig::from_params(p, "/dev/x").map(|c| c.args_text(true).to_string())
    };
    let p = IntegrityParams::new("crc32c");
    assert_eq!(
        line(&p).unwrap(),
        "/dev/x 0 - J 3 fix_padding fix_hmac internal_hash:crc32c"
    );
    let mut h = IntegrityParams::new("hmac-sha256");
    assert!(line(&h).unwrap_err().contains("needs --integrity-key-file"));
    h.key = Some(SecretBytes::from_slice(&[0xab; 2]));
    h.sector_size = 4096;
    h.legacy_padding = true;
    assert_eq!(
        line(&h).unwrap(),
        "/dev/x 0 - J 3 block_size:4096 fix_hmac internal_hash:hmac(sha256):abab"
    );
    let c = IntegrityTableConfig::from_params(&h, "/dev/x").unwrap();
    assert_eq!(
        c.args_text(false).as_str(),
        "/dev/x 0 - J 3 block_size:4096 fix_hmac internal_hash:hmac(sha256):0000"
    );
    let mut d = IntegrityParams::new("sha256");
    d.mode = IntegrityOpenMode::Direct;
    d.journal_size = Some(1 << 20);
    d.interleave_sectors = Some(64);
    d.buffer_sectors = Some(32);
    d.start = 8;
    d.tag_size = Some(32);
    assert_eq!(
        line(&d).unwrap(),
        "/dev/x 8 32 D 6 journal_sectors:2048 interleave_sectors:64 buffer_sectors:32 \
         fix_padding fix_hmac internal_hash:sha256"
    );
    d.sector_size = 1000;
    assert!(line(&d).is_err());
    d.sector_size = 512;
    d.key = Some(SecretBytes::from_slice(&[1]));
    assert!(line(&d).unwrap_err().contains("takes no key"));
}

/// A loop-AES multi-key table as `cryptsetup loopaesOpen` loads it (65 keys: 64 data keys
/// and the lmk seed) builds a live crypt target and prints back unchanged, the key masked
/// with zeros of its length as dmsetup does; lmk refuses sectors other than 512 bytes, as
/// the kernel does.
#[test]
fn loop_aes_multi_key_tables_load_and_print_back() {
    use cryptblk_dm::BlockDevice;
    let reg = Registry::new();
    for (i, keys) in [64usize, 65].into_iter().enumerate() {
        let key: String = (0..keys * 16)
            .map(|b| format!("{:02x}", (b * 7 + 3) as u8))
            .collect();
        let line = format!("0 2048 crypt aes:64-cbc-lmk {key} 8 ram:2M 0");
        let name = format!("la{i}");
        let m = reg
            .create(&name, &line)
            .unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(m.table(true), format!("{line}\n"));
        let masked = format!(
            "0 2048 crypt aes:64-cbc-lmk {} 8 ram:2M 0\n",
            "0".repeat(key.len())
        );
        assert_eq!(m.table(false), masked);
        assert_eq!(
            *TableSpec::parse(&line).unwrap().to_text(true),
            format!("{line}\n")
        );
        let data: Vec<u8> = (0..8192).map(|b| (b % 253) as u8).collect();
        m.write_at(4096, &data, Default::default()).unwrap();
        let mut back = vec![0u8; 8192];
        m.read_at(4096, &mut back).unwrap();
        assert_eq!(back, data);
        drop(m);
        reg.remove(&name).unwrap();
    }
    let key = "ab".repeat(65 * 16);
    let line = format!("0 2048 crypt aes:64-cbc-lmk {key} 0 ram:2M 0 1 sector_size:4096");
    assert!(reg.create("la4k", &line).is_err());
    let line = format!("0 2048 crypt aes:63-cbc-lmk {key} 0 ram:2M 0");
    assert!(reg.create("la63", &line).is_err());
}
