//! cryptblk and the real cryptsetup, both directions: volumes, keyslots and data made by one
//! are used by the other, and data is checked with an independent implementation.

mod common;
use common::*;
use std::path::Path;

const FAST_PBKDF2: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn key_file(dir: &Path, name: &str, contents: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

/// Formats `img` with cryptsetup; returns false when cryptsetup is unavailable and skipped.
fn cryptsetup_format(img: &Path, key: &Path, extra: &[&str]) -> bool {
    let Some(mut c) = cryptsetup() else {
        return false;
    };
    c.arg("luksFormat")
        .args(extra)
        .arg("--key-file")
        .arg(key)
        .arg(img);
    run_ok(&mut c, b"");
    true
}

fn test_passphrase_cryptblk(img: &Path, key: &Path, extra: &[&str]) -> i32 {
    let out = run(
        cryptblk()
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(key)
            .args(extra)
            .arg(img),
        b"",
    );
    out.status.code().unwrap_or(-1)
}

fn test_passphrase_cryptsetup(img: &Path, key: &Path, extra: &[&str]) -> i32 {
    let mut c = cryptsetup().expect("cryptsetup");
    c.args(["open", "--test-passphrase", "--key-file"])
        .arg(key)
        .args(extra)
        .arg(img);
    run(&mut c, b"").status.code().unwrap_or(-1)
}

fn cryptblk_volume_key(img: &Path, key: &Path, extra: &[&str]) -> String {
    let out = run_ok(
        cryptblk()
            .args([
                "luksDump",
                "--dump-volume-key",
                "--batch-mode",
                "--key-file",
            ])
            .arg(key)
            .args(extra)
            .arg(img),
        b"",
    );
    parse_volume_key(&out).expect("cryptblk printed no volume key")
}

#[test]
fn cryptsetup_volumes_unlock_in_cryptblk() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"correct horse battery staple");
    let wrong = key_file(dir.path(), "wrong", b"not the passphrase");
    let cases: &[(&str, &[&str])] = &[
        (
            "luks1-xts",
            &["--type", "luks1", "--pbkdf-force-iterations", "1000"],
        ),
        (
            "luks1-cbc-essiv-sha1",
            &[
                "--type",
                "luks1",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
                "--hash",
                "sha1",
                "--pbkdf-force-iterations",
                "1000",
            ],
        ),
        (
            "luks2-pbkdf2",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
            ],
        ),
        (
            "luks2-argon2id",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "32768",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-parallel",
                "1",
            ],
        ),
        (
            "luks2-argon2i-4k",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "argon2i",
                "--pbkdf-memory",
                "32768",
                "--pbkdf-force-iterations",
                "4",
                "--sector-size",
                "4096",
            ],
        ),
    ];
    for (name, opts) in cases {
        let img = dir.path().join(format!("{name}.img"));
        sparse_file(&img, 20 << 20);
        if !cryptsetup_format(&img, &key, opts) {
            return;
        }
        assert_eq!(
            test_passphrase_cryptblk(&img, &key, &[]),
            0,
            "{name}: right key"
        );
        assert_eq!(
            test_passphrase_cryptblk(&img, &wrong, &[]),
            2,
            "{name}: wrong key must exit 2"
        );
        let expected = cryptsetup_volume_key(&img, &key, &[]).unwrap();
        assert_eq!(
            cryptblk_volume_key(&img, &key, &[]),
            expected,
            "{name}: volume key"
        );
    }
}

#[test]
fn cryptblk_volumes_open_in_cryptsetup() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"s3cret passphrase");
    let wrong = key_file(dir.path(), "wrong", b"other");
    let cases: &[(&str, &[&str])] = &[
        (
            "luks1",
            &["--type", "luks1", "--pbkdf-force-iterations", "1000"],
        ),
        (
            "luks2",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
            ],
        ),
        (
            "luks2-argon2id-4k",
            &[
                "--type",
                "luks2",
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "32768",
                "--pbkdf-force-iterations",
                "4",
                "--sector-size",
                "4096",
                "--label",
                "cryptblk-test",
            ],
        ),
        (
            "luks2-cbc",
            &[
                "--type",
                "luks2",
                "--cipher",
                "aes-cbc-essiv:sha256",
                "--key-size",
                "256",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
            ],
        ),
    ];
    for (name, opts) in cases {
        let img = dir.path().join(format!("{name}.img"));
        sparse_file(&img, 20 << 20);
        run_ok(
            cryptblk()
                .args(["luksFormat", "--batch-mode"])
                .args(*opts)
                .arg("--key-file")
                .arg(&key)
                .arg(&img),
            b"",
        );
        assert!(
            cryptsetup().is_some(),
            "a tool this test needs is missing (scripts/install-deps.sh installs it)"
        );
        assert_eq!(
            test_passphrase_cryptsetup(&img, &key, &[]),
            0,
            "{name}: cryptsetup accepts the key"
        );
        assert_eq!(
            test_passphrase_cryptsetup(&img, &wrong, &[]),
            2,
            "{name}: cryptsetup rejects a wrong key"
        );
        let mut dump = cryptsetup().unwrap();
        dump.arg("luksDump").arg(&img);
        let text = run_ok(&mut dump, b"");
        assert!(
            text.contains("0: luks2") || text.contains("Key Slot 0: ENABLED"),
            "{name}: {text}"
        );
        let expected = cryptsetup_volume_key(&img, &key, &[]).unwrap();
        assert_eq!(
            cryptblk_volume_key(&img, &key, &[]),
            expected,
            "{name}: same volume key"
        );
    }
}

#[test]
fn keyslot_changes_are_seen_by_the_other_tool() {
    let dir = tempdir();
    let k0 = key_file(dir.path(), "k0", b"first key");
    let k1 = key_file(dir.path(), "k1", b"second key");
    let k2 = key_file(dir.path(), "k2", b"third key");
    for ty in ["luks1", "luks2"] {
        let img = dir.path().join(format!("{ty}.img"));
        sparse_file(&img, 20 << 20);
        if !cryptsetup_format(&img, &k0, &[&["--type", ty][..], &FAST_PBKDF2[..]].concat()) {
            return;
        }
        // cryptblk adds a key; cryptsetup must accept it.
        run_ok(
            cryptblk()
                .args(["luksAddKey", "--batch-mode"])
                .args(FAST_PBKDF2)
                .arg("--key-file")
                .arg(&k0)
                .arg(&img)
                .arg(&k1),
            b"",
        );
        assert_eq!(
            test_passphrase_cryptsetup(&img, &k1, &[]),
            0,
            "{ty}: key added by cryptblk"
        );
        // cryptsetup adds a key; cryptblk must accept it.
        let mut add = cryptsetup().unwrap();
        add.arg("luksAddKey")
            .args(FAST_PBKDF2)
            .arg("--key-file")
            .arg(&k1)
            .arg(&img)
            .arg(&k2);
        run_ok(&mut add, b"");
        assert_eq!(
            test_passphrase_cryptblk(&img, &k2, &[]),
            0,
            "{ty}: key added by cryptsetup"
        );
        // cryptblk removes the first key; cryptsetup must reject it, the others still work.
        run_ok(
            cryptblk()
                .args(["luksRemoveKey", "--batch-mode"])
                .arg(&img)
                .arg(&k0),
            b"",
        );
        assert_ne!(
            test_passphrase_cryptsetup(&img, &k0, &[]),
            0,
            "{ty}: removed key"
        );
        assert_eq!(
            test_passphrase_cryptsetup(&img, &k2, &[]),
            0,
            "{ty}: remaining key"
        );
        // cryptsetup kills slot 1 (cryptblk's key); cryptblk must reject that key.
        let mut kill = cryptsetup().unwrap();
        kill.args(["luksKillSlot", "--key-file"])
            .arg(&k2)
            .arg(&img)
            .arg("1");
        run_ok(&mut kill, b"");
        assert_ne!(
            test_passphrase_cryptblk(&img, &k1, &[]),
            0,
            "{ty}: slot killed by cryptsetup"
        );
        assert_eq!(
            test_passphrase_cryptblk(&img, &k2, &[]),
            0,
            "{ty}: surviving slot"
        );
    }
}

#[test]
fn encrypt_and_decrypt_agree_with_an_independent_implementation() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"image pipeline key");
    let plain = dir.path().join("plain.bin");
    let data = write_pattern(&plain, 3 << 20, 7);
    for (ty, cipher, sector) in [
        ("luks2", "aes-xts-plain64", 4096u32),
        ("luks2", "aes-xts-plain64", 512),
        ("luks1", "aes-cbc-essiv:sha256", 512),
    ] {
        let vol = dir.path().join(format!("{ty}-{sector}.img"));
        let mut enc = cryptblk();
        enc.args(["encrypt", "--batch-mode", "--type", ty, "--cipher", cipher])
            .args(FAST_PBKDF2)
            .args(["--key-file"])
            .arg(&key);
        if ty == "luks2" {
            enc.args(["--sector-size", &sector.to_string()]);
        }
        run_ok(enc.arg(&plain).arg(&vol), b"");
        let Some(vk) = cryptsetup_volume_key(&vol, &key, &[]) else {
            return;
        };
        let mut dump = cryptsetup().unwrap();
        let text = run_ok(dump.arg("luksDump").arg(&vol), b"");
        let offset = data_offset_bytes(&text);
        let volume = std::fs::read(&vol).unwrap();
        let ciphertext = &volume[offset as usize..offset as usize + data.len()];
        let decrypted = independent("decrypt", cipher, &vk, sector, ciphertext);
        assert!(
            decrypted == data,
            "{ty}/{cipher}/{sector}: independent decryption differs"
        );

        // And back: cryptblk decrypt yields the input again.
        let out = dir.path().join("out.bin");
        run_ok(
            cryptblk()
                .args(["decrypt", "--key-file"])
                .arg(&key)
                .arg(&vol)
                .arg(&out),
            b"",
        );
        let back = std::fs::read(&out).unwrap();
        assert!(
            back[..data.len()] == data[..],
            "{ty}: cryptblk decrypt round trip"
        );
    }
}

/// The data segment offset from cryptsetup's luksDump (LUKS1 "Payload offset" in sectors,
/// LUKS2 segment "offset: N [bytes]").
fn data_offset_bytes(dump: &str) -> u64 {
    for line in dump.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Payload offset:") {
            return v.trim().parse::<u64>().unwrap() * 512;
        }
        if let Some(v) = t.strip_prefix("offset:") {
            return v.split_whitespace().next().unwrap().parse().unwrap();
        }
    }
    panic!("no data offset in luksDump output:\n{dump}");
}

#[test]
fn detached_header_and_key_file_slices_work_both_ways() {
    let dir = tempdir();
    // A key file whose middle 64 bytes are the passphrase (--keyfile-offset/--keyfile-size).
    let big = dir.path().join("big.key");
    let bytes = write_pattern(&big, 4096, 21);
    let hdr = dir.path().join("hdr.img");
    let data = dir.path().join("data.img");
    sparse_file(&data, 8 << 20);
    let Some(mut c) = cryptsetup() else { return };
    run_ok(
        c.args([
            "luksFormat",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ])
        .args([
            "--keyfile-offset",
            "100",
            "--keyfile-size",
            "64",
            "--key-file",
        ])
        .arg(&big)
        .arg("--header")
        .arg(&hdr)
        .arg(&data),
        b"",
    );
    let slice = ["--keyfile-offset", "100", "--keyfile-size", "64"];
    let hdr_s = hdr.to_str().unwrap();
    assert_eq!(
        test_passphrase_cryptblk(&data, &big, &[&slice[..], &["--header", hdr_s]].concat()),
        0
    );
    // Off by one byte: a different passphrase.
    assert_eq!(
        test_passphrase_cryptblk(
            &data,
            &big,
            &[
                "--keyfile-offset",
                "101",
                "--keyfile-size",
                "64",
                "--header",
                hdr_s
            ]
        ),
        2
    );
    // The same slice as a file of its own opens it too.
    let exact = key_file(dir.path(), "exact", &bytes[100..164]);
    assert_eq!(
        test_passphrase_cryptblk(&data, &exact, &["--header", hdr_s]),
        0
    );

    // Data: the independent model encrypts with cryptsetup's key; cryptblk decrypt reads it
    // through the detached header (data offset 0).
    let vk = cryptsetup_volume_key(&hdr, &exact, &[]).unwrap();
    let plain_path = dir.path().join("plain");
    let plain = write_pattern(&plain_path, 1 << 20, 22);
    let (_, sector) = cryptsetup_luks2_segment(&hdr).unwrap();
    let ct = independent("encrypt", "aes-xts-plain64", &vk, sector, &plain);
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &ct, 0).unwrap();
    let out = dir.path().join("out");
    run_ok(
        cryptblk()
            .args(["decrypt", "--header"])
            .arg(&hdr)
            .arg("--key-file")
            .arg(&exact)
            .arg(&data)
            .arg(&out),
        b"",
    );
    assert!(
        std::fs::read(&out).unwrap()[..plain.len()] == plain[..],
        "detached-header decrypt differs"
    );

    // cryptblk adds a key through the detached header; cryptsetup sees it.
    let k2 = key_file(dir.path(), "k2", b"second");
    run_ok(
        cryptblk()
            .args([
                "luksAddKey",
                "--batch-mode",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--header",
            ])
            .arg(&hdr)
            .arg("--key-file")
            .arg(&exact)
            .arg(&data)
            .arg(&k2),
        b"",
    );
    assert_eq!(
        test_passphrase_cryptsetup(&data, &k2, &["--header", hdr_s]),
        0
    );
}

#[test]
fn convert_between_luks1_and_luks2_keeps_keys_and_data() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"convert me");
    let img = dir.path().join("c.img");
    sparse_file(&img, 20 << 20);
    if !cryptsetup_format(
        &img,
        &key,
        &["--type", "luks1", "--pbkdf-force-iterations", "1000"],
    ) {
        return;
    }
    let vk = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    run_ok(
        cryptblk()
            .args(["convert", "--batch-mode", "--type", "luks2"])
            .arg(&img),
        b"",
    );
    let mut dump = cryptsetup().unwrap();
    let text = run_ok(dump.arg("luksDump").arg(&img), b"");
    assert!(text.contains("Version:       \t2"), "{text}");
    assert_eq!(test_passphrase_cryptsetup(&img, &key, &[]), 0);
    assert_eq!(cryptsetup_volume_key(&img, &key, &[]).unwrap(), vk);
    run_ok(
        cryptblk()
            .args(["convert", "--batch-mode", "--type", "luks1"])
            .arg(&img),
        b"",
    );
    let mut dump = cryptsetup().unwrap();
    let text = run_ok(dump.arg("luksDump").arg(&img), b"");
    assert!(text.contains("Version:       \t1"), "{text}");
    assert_eq!(cryptsetup_volume_key(&img, &key, &[]).unwrap(), vk);
    // Converting to the type it already has is refused with exit 1.
    let out = run(
        cryptblk()
            .args(["convert", "--batch-mode", "--type", "luks1"])
            .arg(&img),
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn damaged_primary_header_opens_and_is_repaired_on_write() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"survivor");
    let k2 = key_file(dir.path(), "k2", b"after repair");
    let img = dir.path().join("d.img");
    sparse_file(&img, 20 << 20);
    if !cryptsetup_format(
        &img,
        &key,
        &[&["--type", "luks2"][..], &FAST_PBKDF2[..]].concat(),
    ) {
        return;
    }
    let vk = cryptsetup_volume_key(&img, &key, &[]).unwrap();
    // Wipe the primary binary header (magic included): only the secondary copy is left.
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 4096], 0).unwrap();
    drop(f);
    assert_eq!(
        test_passphrase_cryptblk(&img, &key, &[]),
        0,
        "opens from the secondary header"
    );
    assert_eq!(cryptblk_volume_key(&img, &key, &[]), vk);
    run_ok(
        cryptblk()
            .args(["luksAddKey", "--batch-mode"])
            .args(FAST_PBKDF2)
            .arg("--key-file")
            .arg(&key)
            .arg(&img)
            .arg(&k2),
        b"",
    );
    let head = std::fs::read(&img).unwrap();
    assert_eq!(&head[..6], b"LUKS\xba\xbe", "primary header rewritten");
    assert_eq!(test_passphrase_cryptsetup(&img, &k2, &[]), 0);
    assert_eq!(test_passphrase_cryptsetup(&img, &key, &[]), 0);
}

#[test]
fn ambiguous_luks2_and_lvm2_signature_needs_repair() {
    let dir = std::env::var_os("CRYPTBLK_CRYPTSETUP_TESTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cryptsetup-tests")
        });
    let archive = dir.join("blkid-luks2-pv.img.xz");
    assert!(archive.exists(), "{} is missing", archive.display());
    let tmp = tempdir();
    let img = tmp.path().join("pv.img");
    let out = std::process::Command::new("xz")
        .arg("-dc")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(&img, out.stdout).unwrap();
    let is_luks = |extra: &[&str]| {
        run(cryptblk().arg("isLuks").args(extra).arg(&img), b"")
            .status
            .code()
    };
    assert_eq!(
        is_luks(&[]),
        Some(1),
        "ambiguous signatures must fail isLuks"
    );
    assert_eq!(is_luks(&["--type", "luks2"]), Some(1));
    run_ok(cryptblk().args(["repair", "--batch-mode"]).arg(&img), b"");
    assert_eq!(is_luks(&[]), Some(0));
    assert_eq!(is_luks(&["--type", "luks2"]), Some(0));
    assert_eq!(is_luks(&["--type", "luks1"]), Some(1));
    if let Some(mut c) = cryptsetup() {
        assert!(
            run(c.args(["isLuks", "--type", "luks2"]).arg(&img), b"")
                .status
                .success(),
            "cryptsetup after our repair"
        );
    }
}

#[test]
fn volume_key_dumps_are_identical_to_cryptsetups() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"dump me");
    for ty in ["luks1", "luks2"] {
        let img = dir.path().join(format!("{ty}.img"));
        sparse_file(&img, 20 << 20);
        if !cryptsetup_format(
            &img,
            &key,
            &[&["--type", ty][..], &FAST_PBKDF2[..]].concat(),
        ) {
            return;
        }
        let ours = run_ok(
            cryptblk()
                .args([
                    "luksDump",
                    "--dump-volume-key",
                    "--batch-mode",
                    "--key-file",
                ])
                .arg(&key)
                .arg(&img),
            b"",
        );
        let mut c = cryptsetup().unwrap();
        let theirs = run_ok(
            c.args(["luksDump", "--dump-volume-key", "--key-file"])
                .arg(&key)
                .arg(&img),
            b"",
        );
        assert_eq!(
            ours, theirs,
            "{ty}: luksDump --dump-volume-key differs from cryptsetup"
        );
    }
}

/// Without `--sector-size`, luksFormat picks the encryption sector size cryptsetup 2.6 picks
/// for the same image file and options (4096 for an image, 512 where cryptsetup falls back),
/// and `encrypt` writes a default volume's 4096-byte sectors that cryptsetup opens.
#[test]
fn default_sector_size_is_cryptsetups() {
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"sector size passphrase");
    // (name, image size, extra luksFormat options)
    let cases: &[(&str, u64, &[&str])] = &[
        ("image", 32 << 20, &[]),
        ("size-not-4k-aligned", (32 << 20) + 512, &[]),
        ("offset-4096-sectors", 64 << 20, &["--offset", "36864"]),
        // 4 KiB aligned, but cryptsetup counts the offset's sectors against 4096.
        ("offset-32776", 64 << 20, &["--offset", "32776"]),
        ("explicit-512", 32 << 20, &["--sector-size", "512"]),
        ("luks1", 32 << 20, &["--type", "luks1"]),
    ];
    for (name, size, extra) in cases {
        let theirs = dir.path().join(format!("{name}-cryptsetup.img"));
        let ours = dir.path().join(format!("{name}-cryptblk.img"));
        sparse_file(&theirs, *size);
        sparse_file(&ours, *size);
        if !cryptsetup_format(&theirs, &key, &[&FAST_PBKDF2[..], extra].concat()) {
            return;
        }
        run_ok(
            cryptblk()
                .args(["luksFormat", "--batch-mode", "--key-file"])
                .arg(&key)
                .args(FAST_PBKDF2)
                .args(*extra)
                .arg(&ours),
            b"",
        );
        let dump = |img: &Path| {
            let out = run_ok(cryptsetup().unwrap().arg("luksDump").arg(img), b"");
            out.lines()
                .map(str::trim)
                .find(|l| l.starts_with("sector:") || l.starts_with("Payload offset:"))
                .map(str::to_string)
                .unwrap_or_else(|| panic!("{name}: no sector or payload line in {out}"))
        };
        assert_eq!(dump(&ours), dump(&theirs), "{name}");
    }
    assert_eq!(
        cryptsetup_luks2_segment(&dir.path().join("image-cryptblk.img")).map(|s| s.1),
        Some(4096)
    );

    // encrypt: the default volume has 4096-byte sectors and cryptsetup reads its data.
    let plain = dir.path().join("plain.bin");
    let data = write_pattern(&plain, 3 << 20, 7);
    let vol = dir.path().join("encrypted.img");
    run_ok(
        cryptblk()
            .args(["encrypt", "--batch-mode", "--key-file"])
            .arg(&key)
            .args(FAST_PBKDF2)
            .arg(&plain)
            .arg(&vol),
        b"",
    );
    let (offset, sector) = cryptsetup_luks2_segment(&vol).unwrap();
    assert_eq!(sector, 4096);
    let vk = cryptsetup_volume_key(&vol, &key, &[]).unwrap();
    let image = std::fs::read(&vol).unwrap();
    let decrypted = independent(
        "decrypt",
        "aes-xts-plain64",
        &vk,
        4096,
        &image[offset..offset + data.len()],
    );
    assert_eq!(decrypted, data);
}

/// cryptsetup asks "Are you sure?" only on a terminal: with stdin a pipe it formats without
/// asking and reads the passphrase (up to the newline) from that pipe, so
/// `echo pw | luksFormat IMG` works. Both tools are fed the same pipe; each volume opens in
/// the other tool with that passphrase and not with a wrong one.
#[test]
fn piped_passphrase_formats_without_a_question_as_in_cryptsetup() {
    let Some(_) = cryptsetup() else { return };
    let dir = tempdir();
    let pass = key_file(dir.path(), "pass", b"piped passphrase");
    let wrong = key_file(dir.path(), "wrong", b"piped passphrasf");
    for (maker, other) in [("cryptblk", "cryptsetup"), ("cryptsetup", "cryptblk")] {
        let img = dir.path().join(format!("{maker}.img"));
        sparse_file(&img, 32 << 20);
        let mut cmd = if maker == "cryptblk" {
            cryptblk()
        } else {
            cryptsetup().unwrap()
        };
        let out = run(
            cmd.args(["luksFormat", "--type", "luks2"])
                .args(FAST)
                .arg(&img),
            b"piped passphrase\n",
        );
        assert!(
            out.status.success(),
            "{maker} luksFormat with a piped passphrase: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let test = |key: &Path| {
            if other == "cryptblk" {
                test_passphrase_cryptblk(&img, key, &[])
            } else {
                test_passphrase_cryptsetup(&img, key, &[])
            }
        };
        assert_eq!(test(&pass), 0, "{other} opens {maker}'s volume");
        assert_eq!(test(&wrong), 2, "{other} refuses a wrong passphrase");
    }
}

/// `luksDump --dump-volume-key --volume-key-file F` stores the key in F, as cryptsetup 2.6
/// does (it is an output there, not the key to unlock with): the same text as cryptsetup's
/// (with "Key stored to file F." for the hex dump), the same 0400 file, and an existing F
/// refused with exit 1 and left as it was. LUKS1, LUKS2 and LUKS2 `--unbound`.
#[test]
fn dump_volume_key_file_stores_the_key_as_cryptsetup() {
    use std::os::unix::fs::PermissionsExt;
    let Some(_) = cryptsetup() else { return };
    let dir = tempdir();
    let key = key_file(dir.path(), "key", b"dump key");
    for (name, extra) in [
        ("luks1", &["--type", "luks1"][..]),
        ("luks2", &["--type", "luks2"][..]),
    ] {
        let img = dir.path().join(format!("{name}.img"));
        sparse_file(&img, 32 << 20);
        let mut fmt: Vec<&str> = extra.to_vec();
        fmt.extend(FAST_PBKDF2);
        assert!(cryptsetup_format(&img, &key, &fmt));
        let mut dumps = vec![vec!["--dump-volume-key"]];
        if name == "luks2" {
            let mut add = cryptsetup().unwrap();
            add.args(["luksAddKey", "-q", "--unbound", "-s", "256", "--key-file"])
                .arg(&key)
                .args(FAST_PBKDF2)
                .arg(&img)
                .arg(&key);
            run_ok(&mut add, b"");
            dumps.push(vec!["--unbound", "-S", "1"]);
        }
        for args in dumps {
            let dump = |tool: &mut std::process::Command, out: &Path| {
                tool.arg("luksDump")
                    .args(&args)
                    .args(["-q", "--key-file"])
                    .arg(&key)
                    .arg("--volume-key-file")
                    .arg(out)
                    .arg(&img);
                run(tool, b"")
            };
            let theirs_file = dir.path().join(format!("{name}-cs.key"));
            let ours_file = dir.path().join(format!("{name}-cb.key"));
            let theirs = dump(&mut cryptsetup().unwrap(), &theirs_file);
            let ours = dump(&mut cryptblk(), &ours_file);
            assert!(theirs.status.success() && ours.status.success(), "{args:?}");
            let text = |o: &std::process::Output, f: &Path| {
                String::from_utf8_lossy(&o.stdout).replace(&f.display().to_string(), "F")
            };
            assert_eq!(
                text(&ours, &ours_file),
                text(&theirs, &theirs_file),
                "{args:?}"
            );
            assert!(text(&ours, &ours_file).contains("Key stored to file F."));
            assert_eq!(
                std::fs::read(&ours_file).unwrap(),
                std::fs::read(&theirs_file).unwrap()
            );
            let mode = std::fs::metadata(&ours_file).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o400, "{args:?}");
            // An existing file is refused and kept.
            std::fs::remove_file(&ours_file).unwrap();
            std::fs::write(&ours_file, b"keep me").unwrap();
            let again = dump(&mut cryptblk(), &ours_file);
            assert_eq!(again.status.code(), Some(1), "{args:?}");
            let err = String::from_utf8_lossy(&again.stderr);
            assert!(
                err.contains(&format!(
                    "Cannot open keyfile {} for write.",
                    ours_file.display()
                )),
                "{err}"
            );
            assert!(again.stdout.is_empty(), "printed before refusing");
            assert_eq!(std::fs::read(&ours_file).unwrap(), b"keep me");
            std::fs::remove_file(&ours_file).unwrap();
            std::fs::remove_file(&theirs_file).unwrap();
        }
    }
}
