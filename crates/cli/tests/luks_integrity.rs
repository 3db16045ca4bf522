//! LUKS2 with `--integrity` through the CLI, against the real tools:
//! - volumes made by cryptsetup + the kernel (fixtures from the lab, see
//!   fixtures/luks2-integrity/make-fixtures.sh) print the same luksDump in cryptblk and
//!   cryptsetup, open in cryptblk with the exposed size the kernel showed, and read back the
//!   pattern the kernel wrote; a sector the kernel never wrote fails its tag check in both;
//! - volumes cryptblk formats have cryptsetup's exposed sizes and, after the initial wipe,
//!   the sha256 of cryptsetup's freshly formatted device (cryptsetup tests, vectors.md §2B),
//!   and cryptsetup reads their header.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const FAST: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const FIXTURE_KEY: &[u8] = b"cryptblk-integrity-fixture-key";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/luks2-integrity")
}

/// Exposed size in bytes, as an NBD client sees it.
fn nbd_size(sock: &Path) -> u64 {
    let out = run_ok(
        Command::new("nbdinfo").arg("--size").arg(nbd_uri(sock)),
        b"",
    );
    out.trim().parse().unwrap()
}

/// The first `len` bytes of the export, read with `qemu-img dd` over NBD.
fn nbd_head(sock: &Path, len: usize, scratch: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(scratch);
    run_ok(
        Command::new("qemu-img")
            .args(["dd", "-f", "raw", "-O", "raw"])
            .arg(format!("if={}", nbd_uri(sock)))
            .arg(format!("of={}", scratch.display()))
            .arg(format!("bs={len}"))
            .arg("count=1"),
        b"",
    );
    std::fs::read(scratch).unwrap()
}

/// True when a `len`-byte read at `off` succeeds (qemu-io over NBD).
fn nbd_read_ok(sock: &Path, off: u64, len: usize) -> bool {
    let (ok, text) = qemu_io_nbd(sock, &format!("read {off} {len}"));
    assert!(
        text.contains("read failed") || text.contains(&format!("read {len}/{len} bytes")),
        "unexpected qemu-io output: {text}"
    );
    ok && !text.contains("read failed")
}

fn kernel_fact(txt: &str, key: &str) -> String {
    txt.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}: ")))
        .unwrap_or_else(|| panic!("no {key} in kernel facts"))
        .to_string()
}

fn sha256_hex(data: &[u8]) -> String {
    let out = run_ok(&mut Command::new("sha256sum"), data);
    out.split_whitespace().next().unwrap().to_string()
}

#[test]
fn cryptsetup_made_integrity_volumes_open_in_cryptblk() {
    let Some(_) = tool("qemu-img") else { return };
    let Some(_) = tool("qemu-io") else { return };
    let Some(_) = tool("nbdinfo") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, FIXTURE_KEY).unwrap();
    let pattern: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    for name in [
        "xts-plain64-hmac-sha256-512",
        "xts-random-hmac-sha256-4096-legacy",
        "gcm-random-aead-4096",
        "chacha20-random-poly1305-512",
    ] {
        let img = dir.path().join(format!("{name}.img"));
        let xz = fixtures().join(format!("{name}.img.xz"));
        unxz(&xz, &img);
        let facts = std::fs::read_to_string(fixtures().join(format!("{name}.kernel.txt"))).unwrap();

        // luksDump: same text as cryptsetup's.
        let ours = run_ok(cryptblk().arg("luksDump").arg(&img), b"");
        if let Some(mut cs) = cryptsetup() {
            let theirs = run_ok(cs.arg("luksDump").arg(&img), b"");
            assert_eq!(ours, theirs, "{name}");
        }
        assert!(ours.contains("\tintegrity: "), "{name}: {ours}");

        // Open: exposed size and pattern as the kernel showed them.
        let sock = dir.path().join(format!("{name}.sock"));
        let map = format!("cbint-{}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        assert_eq!(
            nbd_size(&sock).to_string(),
            kernel_fact(&facts, "exposed_bytes"),
            "{name}: exposed size"
        );
        let scratch = dir.path().join("read.bin");
        let data = nbd_head(&sock, pattern.len(), &scratch);
        assert_eq!(data, pattern, "{name}: pattern the kernel wrote");
        assert_eq!(sha256_hex(&data), kernel_fact(&facts, "pattern_sha256"));
        // Never written by the kernel (no wipe): the tag check must fail, as in the kernel.
        assert_eq!(kernel_fact(&facts, "unwritten_read"), "error");
        assert!(
            nbd_read_ok(&sock, 0, 4096),
            "{name}: a written sector must read"
        );
        assert!(
            !nbd_read_ok(&sock, 64 * 4096, 4096),
            "{name}: an unwritten sector must not read back"
        );
        // The tables cryptblk loaded are the kernel's (key and device names aside).
        let st: serde_json::Value =
            serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", &map]), b""))
                .unwrap();
        // cryptblk's default performance flags (its inline pipeline) are no kernel facts.
        let mut ours_crypt: Vec<String> = st["table"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .filter(|w| !w.ends_with("_workqueue"))
            .map(str::to_string)
            .collect();
        let n_opts = ours_crypt.len() - 9;
        ours_crypt[8] = n_opts.to_string();
        let kernel_crypt = kernel_fact(&facts, "crypt");
        let kernel_crypt: Vec<&str> = kernel_crypt.split_whitespace().collect();
        assert_eq!(
            ours_crypt.len(),
            kernel_crypt.len(),
            "{name}: {ours_crypt:?}"
        );
        for (i, (a, b)) in ours_crypt.iter().zip(&kernel_crypt).enumerate() {
            if i != 4 && i != 6 {
                assert_eq!(a, b, "{name}: crypt table field {i}");
            }
        }
        let ours_int = st["info"]["lower"][0]["table"]
            .as_str()
            .unwrap()
            .to_string();
        let ours_int: Vec<&str> = ours_int.split_whitespace().collect();
        let kernel_int = kernel_fact(&facts, "integrity");
        let kernel_int: Vec<&str> = kernel_int.split_whitespace().collect();
        for i in [0, 1, 2, 4, 5, 6] {
            assert_eq!(
                ours_int[i], kernel_int[i],
                "{name}: integrity table field {i}"
            );
        }
        for opt in &ours_int[8..] {
            assert!(
                kernel_int[8..].contains(opt),
                "{name}: option {opt} not in the kernel's table"
            );
        }
        let status = run_ok(cryptblk().args(["status", &map]), b"");
        let kind = ours
            .lines()
            .find_map(|l| l.strip_prefix("\tintegrity: "))
            .unwrap();
        assert!(
            status
                .lines()
                .any(|l| l.trim_start().starts_with("integrity:") && l.ends_with(kind)),
            "{name}: {status}"
        );
        drop(served);
    }
}

/// Rows of vectors.md §2B (cryptsetup tests/luks2-integrity-test): cipher, integrity,
/// key bits, sector size, exposed 512-byte sectors, sha256 of the wiped exposed device.
const VECTORS: &[(&str, &str, u32, u32, u64, &str)] = &[
    (
        "aes-xts-plain64",
        "hmac-sha256",
        256,
        512,
        52800,
        "ee501705a084cd0ab6f4a28014bcf62b8bfa3434de00b82743c50b3abf06232c",
    ),
    (
        "aes-xts-random",
        "hmac-sha256",
        256,
        512,
        50680,
        "492c2d1cc9e222a850c399bfef4ed5a86bf5afc59e54f0f0c7ba8e2a64548323",
    ),
    (
        "aes-xts-plain64",
        "hmac-sha256",
        256,
        4096,
        56560,
        "358d6beceddf593aff6b22c31684e0df9c226330aff5812e060950215217d21b",
    ),
    (
        "aes-xts-random",
        "hmac-sha256",
        256,
        4096,
        56048,
        "8c0463f5ac09613674bdf40b0ff6f985edbc3de04e51fdc688873cb333ef3cda",
    ),
    (
        "aes-gcm-random",
        "aead",
        128,
        512,
        53312,
        "5f6f3f6be03c74d9aaaeaf40dd310c99a20e2786045f78a1fc6a0b189d231f57",
    ),
    (
        "aes-gcm-random",
        "aead",
        256,
        4096,
        56560,
        "358d6beceddf593aff6b22c31684e0df9c226330aff5812e060950215217d21b",
    ),
    (
        "chacha20-random",
        "poly1305",
        256,
        512,
        53312,
        "5f6f3f6be03c74d9aaaeaf40dd310c99a20e2786045f78a1fc6a0b189d231f57",
    ),
    (
        "chacha20-random",
        "poly1305",
        256,
        4096,
        56560,
        "358d6beceddf593aff6b22c31684e0df9c226330aff5812e060950215217d21b",
    ),
    (
        "aes-cbc-essiv:sha256",
        "hmac-sha256",
        128,
        512,
        52800,
        "ee501705a084cd0ab6f4a28014bcf62b8bfa3434de00b82743c50b3abf06232c",
    ),
    (
        "aes-xts-plain64",
        "hmac-sha512",
        512,
        4096,
        55912,
        "9873d864fccb866521e79c9f0f75ad0c578d6bd7620399bbf4779e698c6e92fd",
    ),
    (
        "chacha20-plain64",
        "poly1305",
        256,
        512,
        54776,
        "3f82eae753ff52a689ddc559c691bbdff838361bbe9a3ce8c7212e16e51b5dbe",
    ),
    (
        "aes-ccm-random",
        "aead",
        152,
        512,
        53848,
        "288e5e9bc5be6c0bd2a74abbb72c7944da83198b5e3041dcf159e7ae250dafa8",
    ),
    (
        "aegis128-random",
        "aead",
        128,
        512,
        52800,
        "ee501705a084cd0ab6f4a28014bcf62b8bfa3434de00b82743c50b3abf06232c",
    ),
    (
        "aes-xts-plain64",
        "hmac-sha1",
        512,
        4096,
        56496,
        "7370c66a92708fb71b186931468be6aa9b26f4f88373b00b1c57360b9ee1304e",
    ),
    (
        "aes-xts-random",
        "hmac-sha1",
        512,
        4096,
        56048,
        "8c0463f5ac09613674bdf40b0ff6f985edbc3de04e51fdc688873cb333ef3cda",
    ),
    (
        "aes-cbc-essiv:sha256",
        "hmac-sha512",
        256,
        4096,
        55912,
        "9873d864fccb866521e79c9f0f75ad0c578d6bd7620399bbf4779e698c6e92fd",
    ),
    (
        "aes-ccm-random",
        "aead",
        280,
        4096,
        56496,
        "7370c66a92708fb71b186931468be6aa9b26f4f88373b00b1c57360b9ee1304e",
    ),
    (
        "aegis128-random",
        "aead",
        128,
        4096,
        56560,
        "358d6beceddf593aff6b22c31684e0df9c226330aff5812e060950215217d21b",
    ),
    (
        "aes-xts-essiv:sha256",
        "hmac-sha512",
        512,
        4096,
        55912,
        "9873d864fccb866521e79c9f0f75ad0c578d6bd7620399bbf4779e698c6e92fd",
    ),
];

/// `cryptblk luksFormat --type luks2 -c CIPHER --integrity INTEG EXTRA.. FAST -d KEY IMG`
/// (the common builder plus fast keyslots), checked to succeed.
fn format_integrity(cipher: &str, integ: &str, extra: &[&str], key: &Path, img: &Path) {
    run_ok(
        luks_format_integrity(cipher, integ)
            .args(extra)
            .args(FAST)
            .arg("-d")
            .arg(key)
            .arg(img),
        b"",
    );
}

fn format_like_vectors(
    img: &Path,
    key: &Path,
    row: &(&str, &str, u32, u32, u64, &str),
    wipe: bool,
) {
    let (cipher, integ, bits, sector, _, _) = *row;
    std::fs::write(img, vec![0u8; 32 << 20]).unwrap();
    let (sector, bits) = (sector.to_string(), bits.to_string());
    let mut extra = vec![
        "--integrity-legacy-padding",
        "--sector-size",
        &sector,
        "-s",
        &bits,
        "--offset",
        "8192",
    ];
    if !wipe {
        extra.push("--integrity-no-wipe");
    }
    format_integrity(cipher, integ, &extra, key, img);
}

#[test]
fn cryptblk_formats_integrity_volumes_with_cryptsetups_sizes() {
    let Some(_) = tool("nbdinfo") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"vector key").unwrap();
    for (i, row) in VECTORS.iter().enumerate() {
        let what = format!("{} {} {} bits, {}-byte sectors", row.0, row.1, row.2, row.3);
        let img = dir.path().join(format!("{i}.img"));
        format_like_vectors(&img, &key, row, false);
        // cryptsetup reads the header cryptblk wrote, and prints what cryptblk prints.
        if let Some(mut cs) = cryptsetup() {
            let theirs = run_ok(cs.arg("luksDump").arg(&img), b"");
            let ours = run_ok(cryptblk().arg("luksDump").arg(&img), b"");
            assert_eq!(ours, theirs, "{what}");
        }
        let sock = dir.path().join(format!("{i}.sock"));
        let map = format!("cbvec-{}-{i}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        assert_eq!(nbd_size(&sock), row.4 * 512, "{what}: exposed size");
        drop(served);
    }
}

/// Formats (with the initial wipe) every row with `sector` bytes per sector, opens it and
/// checks the exposed device's sha256 against cryptsetup's.
fn check_wiped_rows(sector: u32) {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"vector key").unwrap();
    for (i, row) in VECTORS.iter().enumerate().filter(|(_, r)| r.3 == sector) {
        let what = format!("{} {} {}-byte sectors", row.0, row.1, row.3);
        let img = dir.path().join(format!("w{i}.img"));
        format_like_vectors(&img, &key, row, true);
        let sock = dir.path().join(format!("w{i}.sock"));
        let map = format!("cbwipe-{}-{i}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        let out = dir.path().join(format!("w{i}.out"));
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
        drop(served);
        let data = std::fs::read(&out).unwrap();
        assert_eq!(data.len() as u64, row.4 * 512, "{what}");
        assert_eq!(
            sha256_hex(&data),
            row.5,
            "{what}: sha256 after the initial wipe"
        );
    }
}

#[test]
fn wiped_integrity_volumes_read_as_cryptsetups_zeros_512() {
    check_wiped_rows(512);
}

#[test]
fn wiped_integrity_volumes_read_as_cryptsetups_zeros_4096() {
    check_wiped_rows(4096);
}

#[test]
fn integrity_options_are_checked() {
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"k").unwrap();
    let img = dir.path().join("x.img");
    sparse_file(&img, 32 << 20);
    for (args, msg) in [
        (
            &["--type", "luks1", "--integrity", "hmac-sha256"][..],
            "only for LUKS2",
        ),
        (
            &["-c", "aes-gcm-random", "--integrity", "hmac-sha256"][..],
            "already authenticates",
        ),
        (
            &["-c", "aes-xts-plain64", "--integrity", "aead"][..],
            "AEAD cipher mode",
        ),
        (
            &["-c", "aes-xts-plain64", "--integrity", "crc32c"][..],
            "No known integrity specification",
        ),
        (
            &[
                "-c",
                "aes-gcm-random",
                "--integrity",
                "aead",
                "--integrity-key-size",
                "256",
            ][..],
            "Cannot use specified integrity key size",
        ),
        // Refused while the arguments are parsed, as cryptsetup 2.8 refuses any size in
        // bits that is not a whole number of bytes (crates/cli/src/args_check.rs).
        (
            &["--integrity", "hmac-sha256", "--integrity-key-size", "260"][..],
            "Key size must be a multiple of 8 bits",
        ),
    ] {
        let out = run(
            cryptblk()
                .args(["luksFormat", "-q"])
                .args(args)
                .args(FAST)
                .arg("-d")
                .arg(&key)
                .arg(&img),
            b"",
        );
        assert!(!out.status.success(), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

#[test]
fn integrity_no_journal_opens_direct_mode() {
    let Some(_) = tool("nbdinfo") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"vector key").unwrap();
    let img = dir.path().join("d.img");
    format_like_vectors(&img, &key, &VECTORS[0], false);
    for (extra, mode) in [(&[][..], " J "), (&["--integrity-no-journal"][..], " D ")] {
        let sock = dir.path().join("d.sock");
        let map = format!("cbnoj-{}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, extra);
        let st: serde_json::Value =
            serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", &map]), b""))
                .unwrap();
        let lower = st["info"]["lower"][0]["table"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            lower.contains(" integrity ") && lower.contains(mode),
            "{lower}"
        );
        drop(served);
    }
}

#[test]
fn integrity_key_size_in_bits_like_cryptsetup() {
    let Some(_) = tool("nbdcopy") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"vector key").unwrap();
    // vectors.md 2B rows with --integrity-key-size (aes-xts-plain64, -s 512, 512-byte
    // sectors): hmac-sha256 with a 264-bit key, hmac-sha512 with a 792-bit key.
    for (i, (integ, ikey, sectors, sum)) in [
        (
            "hmac-sha256",
            264,
            52800u64,
            "ee501705a084cd0ab6f4a28014bcf62b8bfa3434de00b82743c50b3abf06232c",
        ),
        (
            "hmac-sha512",
            792,
            48640,
            "9040d276d8bfab30bbc4bf389e152e08c13ac6fa84d49d11c1bee6e1638fd8f1",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let img = dir.path().join(format!("k{i}.img"));
        std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
        format_integrity(
            "aes-xts-plain64",
            integ,
            &[
                "--integrity-key-size",
                &ikey.to_string(),
                "--integrity-legacy-padding",
                "--sector-size",
                "512",
                "-s",
                "512",
                "--offset",
                "8192",
            ],
            &key,
            &img,
        );
        let dump = run_ok(cryptblk().arg("luksDump").arg(&img), b"");
        assert!(
            dump.contains(&format!("\tintegrity key size: {ikey} [bits]\n")),
            "{dump}"
        );
        assert!(
            dump.contains(&format!("\tKey:        {} bits\n", 512 + ikey)),
            "{dump}"
        );
        // cryptsetup 2.6 opens the keyslot (it predates the key_size field: no dump compare).
        if let Some(mut cs) = cryptsetup() {
            run_ok(
                cs.args(["open", "--test-passphrase", "--key-file"])
                    .arg(&key)
                    .arg(&img),
                b"",
            );
        }
        let sock = dir.path().join(format!("k{i}.sock"));
        let map = format!("cbkey-{}-{i}", std::process::id() % 10000);
        let served = open_nbd(&img, &key, &map, &sock, &[]);
        let out = dir.path().join(format!("k{i}.out"));
        run_ok(Command::new("nbdcopy").arg(nbd_uri(&sock)).arg(&out), b"");
        drop(served);
        let data = std::fs::read(&out).unwrap();
        assert_eq!(data.len() as u64, sectors * 512, "{integ}");
        assert_eq!(sha256_hex(&data), sum, "{integ}: sha256 after the wipe");
    }
}

/// cryptblk formats the dm-integrity superblock (and journal geometry) as cryptsetup + the
/// kernel did for the same volume parameters: `integritysetup dump` of the kernel-made
/// fixture equals the dump of cryptblk's superblock (salt aside: it is not printed).
#[test]
fn cryptblk_superblocks_match_the_kernels() {
    use cryptblk_format::integrity::IntegritySuperblock;
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, FIXTURE_KEY).unwrap();
    for (name, cipher, integ, bits, sector, legacy) in [
        (
            "xts-plain64-hmac-sha256-512",
            "aes-xts-plain64",
            "hmac-sha256",
            "256",
            "512",
            false,
        ),
        (
            "xts-random-hmac-sha256-4096-legacy",
            "aes-xts-random",
            "hmac-sha256",
            "256",
            "4096",
            true,
        ),
        (
            "gcm-random-aead-4096",
            "aes-gcm-random",
            "aead",
            "128",
            "4096",
            false,
        ),
        (
            "chacha20-random-poly1305-512",
            "chacha20-random",
            "poly1305",
            "256",
            "512",
            false,
        ),
    ] {
        let img = dir.path().join(format!("{name}.img"));
        std::fs::write(&img, vec![0u8; 4 << 20]).unwrap();
        let mut extra = vec![
            "-s",
            bits,
            "--sector-size",
            sector,
            "--offset",
            "2048",
            "--luks2-keyslots-size",
            "256k",
            "--integrity-no-wipe",
        ];
        if legacy {
            extra.push("--integrity-legacy-padding");
        }
        format_integrity(cipher, integ, &extra, &key, &img);
        let f = std::fs::File::open(&img).unwrap();
        let ours = IntegritySuperblock::read(&f, 2048)
            .unwrap()
            .dump("/dev/loop0");
        let kernel =
            std::fs::read_to_string(fixtures().join(format!("{name}.integritysetup-dump.txt")))
                .unwrap();
        assert_eq!(ours, kernel, "{name}");
    }
}

/// `--dump-volume-key` and key management on a cryptsetup-made integrity volume: the key
/// cryptsetup prints, and a keyslot cryptblk adds that cryptsetup opens (the keyslot stores
/// encryption + integrity key and is encrypted with aes-xts-plain64, as cryptsetup does for
/// integrity segments).
#[test]
fn volume_key_and_new_keyslot_on_cryptsetup_integrity_volume() {
    let Some(mut cs) = cryptsetup() else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, FIXTURE_KEY).unwrap();
    let new_key = dir.path().join("new");
    std::fs::write(&new_key, b"a second passphrase").unwrap();
    let img = dir.path().join("v.img");
    let out = Command::new("xz")
        .arg("-dc")
        .arg(fixtures().join("xts-random-hmac-sha256-4096-legacy.img.xz"))
        .output()
        .unwrap();
    std::fs::write(&img, &out.stdout).unwrap();
    let vk_args = |c: &mut Command| {
        c.args(["luksDump", "--dump-volume-key", "-q", "--key-file"])
            .arg(&key)
            .arg(&img);
    };
    let mut ours = cryptblk();
    vk_args(&mut ours);
    let mut theirs = cryptsetup().unwrap();
    vk_args(&mut theirs);
    let ours = run_ok(&mut ours, b"");
    assert_eq!(ours, run_ok(&mut theirs, b""));
    assert!(ours.contains("MK bits:       \t512\n"), "{ours}");

    // A second keyslot (the fixture's keyslots area holds only one: use a fresh volume).
    let img2 = dir.path().join("v2.img");
    sparse_file(&img2, 32 << 20);
    format_integrity(
        "aes-xts-random",
        "hmac-sha512",
        &["-s", "256", "--integrity-no-wipe"],
        &key,
        &img2,
    );
    run_ok(
        cryptblk()
            .args(["luksAddKey", "-q", "--key-file"])
            .arg(&key)
            .args(FAST)
            .arg(&img2)
            .arg(&new_key),
        b"",
    );
    run_ok(
        cs.args(["open", "--test-passphrase", "--key-file"])
            .arg(&new_key)
            .arg(&img2),
        b"",
    );
    let dump = run_ok(cryptblk().arg("luksDump").arg(&img2), b"");
    assert_eq!(
        dump,
        run_ok(cryptsetup().unwrap().arg("luksDump").arg(&img2), b"")
    );
    let slot1 = dump.split("  1: luks2").nth(1).expect("keyslot 1");
    assert!(slot1.contains("\tKey:        768 bits\n"), "{dump}");
    assert!(slot1.contains("\tCipher:     aes-xts-plain64\n"), "{dump}");
}

/// `refresh` swaps the pipeline flags of a live LUKS2 --integrity volume and keeps its
/// authenticated encryption: data written before reads back (qemu-io checks the pattern)
/// and the crypt line still carries `integrity:` after the swap.
#[test]
fn refresh_keeps_integrity_of_a_live_volume() {
    let Some(_) = tool("qemu-io") else { return };
    let dir = tempdir();
    let key = dir.path().join("key");
    std::fs::write(&key, b"vector key").unwrap();
    let img = dir.path().join("d.img");
    format_like_vectors(&img, &key, &VECTORS[0], false);
    let sock = dir.path().join("d.sock");
    let map = format!("cbref-{}", std::process::id() % 10000);
    let _served = open_nbd(&img, &key, &map, &sock, &[]);
    let io = |cmd: &str| {
        run_ok(
            Command::new("qemu-io")
                .args(["-f", "raw", "-c", cmd])
                .arg(nbd_uri(&sock)),
            b"",
        )
    };
    io("write -P 0x5a 0 64k");
    run_ok(
        cryptblk().args(["refresh", &map, "--perf-same_cpu_crypt"]),
        b"",
    );
    let st: serde_json::Value =
        serde_json::from_str(&run_ok(cryptblk().args(["status", "--json", &map]), b"")).unwrap();
    let table = st["table"].as_str().unwrap_or_default().to_string();
    assert!(
        table.contains("integrity:") && table.contains("same_cpu_crypt"),
        "status --json: {st}"
    );
    let out = io("read -P 0x5a 0 64k");
    assert!(out.contains("read 65536/65536 bytes"), "{out}");
}
